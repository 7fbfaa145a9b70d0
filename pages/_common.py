"""What every page sets up the same way: app.py around it, its language, the presets described once, LoRA's
boxes. Not a page.

app.py's navigation lists the pages; this file only serves them (``from pages._common import ...``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx
from streamlit.runtime.state.common import is_array_value_field_name
from streamlit.runtime.state.session_state import Serialized, Value, WStates

import ckptlab
from ckptlab.fact import Fact
from ckptlab.lab import forged
from ckptlab.lab.jobs import Countdown
from ckptlab.lab.modelbox import HUB, LOCAL, model_label
from ckptlab.lab.run import lora_target_choices
from ckptlab.lab.stepboxes import step_widget_values
from ckptlab.lab.targets import settle
from ckptlab.model import hub
from ckptlab.model.attention import available_attentions
from ckptlab.show import i18n
from ckptlab.show.wording import app_message
from ckptlab.spec import MIXED_PRECISIONS, OPTIMIZERS, RunSpec
from ckptlab.spec_fields import FIELD


def run_through_app() -> None:
    """Every page's first line of work: make sure app.py runs around it.

    Opened by its URL before app.py ever ran on this server, Streamlit falls back to its older
    pages/ folder mode and runs a page file alone (no app navigation, no language selector).
    On a session's first run in that mode, leave it and rerun: app.py then runs first and routes here.

    Only on the first run: a rerun would drop a button press, and later runs find the mode
    already left.
    """
    if PagesManager.uses_pages_directory and not st.session_state:
        PagesManager.uses_pages_directory = False
        st.rerun()


# Widget values Streamlit could not read back, by session: (widget key, the value as it came), said by the page.
_UNREADABLE: dict[str, list[tuple[str, object]]] = {}
_UNREADABLE_LOCK = threading.Lock()


def _read_or_default(read: Callable[[WStates, str], Any]) -> Callable[[WStates, str], Any]:
    """``WStates.__getitem__`` that gives a widget's default for a value its deserializer cannot read.

    Streamlit reads every widget's value back before the page runs (to find the changed ones), and a number box's
    deserializer raises on what no box sends (``int(nan)``, a string): the session then shows that exception, its
    trace and the server's paths, and the page never runs. Here the box keeps its default and the page says, in one
    line, that the value was refused (:func:`refuse_forged`).
    """

    def read_or_default(self: WStates, widget_id: str) -> Any:
        metadata = self.widget_metadata.get(widget_id)
        sent = self.states.get(widget_id)
        proto = sent.value if isinstance(sent, Serialized) else None
        field = proto.WhichOneof("value") if proto is not None else None
        # A list where the box holds one value, or one value where it holds a list, is no box's: read as it came, it
        # would also change the field Streamlit writes the box back in, and fail there on the page's next run.
        forged_kind = field is not None and is_array_value_field_name(field) != is_array_value_field_name(
            getattr(metadata, "value_type", field)
        )
        try:
            if not forged_kind:
                return read(self, widget_id)
        except (TypeError, ValueError, OverflowError):
            pass
        if metadata is None:
            return read(self, widget_id)  # Streamlit's own answer (a KeyError) for a widget it does not know
        came = getattr(proto, field) if proto is not None and field else None
        if came is not None and not isinstance(came, (str, int, float, bool)):
            came = list(getattr(came, "data", ())) or type(came).__name__
        default = metadata.deserializer(None)
        self.states[widget_id] = Value(default)
        context = get_script_run_ctx()
        with _UNREADABLE_LOCK:
            unreadable = _UNREADABLE.setdefault(context.session_id if context else "", [])
            unreadable.append((widget_id.rsplit("-", 1)[-1], came))  # "$$ID-<hash>-<key>": the page's key
        return default

    read_or_default.guarded = True  # type: ignore[attr-defined]
    return read_or_default


if not getattr(WStates.__getitem__, "guarded", False):  # once per process, whichever page imports this first
    WStates.__getitem__ = _read_or_default(WStates.__getitem__)  # type: ignore[method-assign]


def refuse_forged(checks: Mapping[str, forged.Check], lang: str) -> list[str]:
    """Each widget value of ``checks`` that its box could not have sent (a forged websocket message: a NaN, a number
    for a select box, a string for a list) removed from the session, so the page fills the box again as on its first
    run; returns the one-line refusals to show, naming the widget and the value (as text)."""
    state = st.session_state
    context = get_script_run_ctx()
    with _UNREADABLE_LOCK:
        unreadable = _UNREADABLE.pop(context.session_id if context else "", [])
    bad: dict[str, object] = dict(unreadable)
    for key in checks:
        try:
            if key in state and not checks[key](state[key]):
                bad.setdefault(key, state[key])
        except (TypeError, ValueError, OverflowError):  # unreadable, as above: refused all the same
            bad.setdefault(key, None)
    for key in bad:
        if key in state:
            del state[key]
    return [
        i18n.t("common.widget_refused", lang, widget=key, value=i18n.Literal(forged.shown_value(value)))
        for key, value in bad.items()
    ]


def language() -> str:
    """The session's language (app.py's selector keeps it in ``app_lang``): every page passes it to ``i18n.t``."""
    return i18n.normalize(st.session_state.get("app_lang"))


def estimate_text(seconds: float, basis: str, lang: str, left: bool = True) -> str:
    """A wait's estimate in words (the seconds ``left``, or the whole wait's), saying what it comes from.

    ``basis``: "measured" (the estimate scaled by this server's measured runs, :data:`ckptlab.lab.run.PACE`),
    "predicted" (the roofline over the step's simulated work at this device's speed, :mod:`ckptlab.explore.step_time`) or "so_far" (the
    job's own pace so far; seconds left only).
    """
    return i18n.t(
        f"wait.{'left' if left else 'total'}_{basis}", lang, seconds=i18n.number(max(seconds, 1), ",.0f", lang)
    )


def countdown_text(countdown: Countdown, lang: str, now: float | None = None) -> str:
    """A countdown (:func:`ckptlab.lab.jobs.count_down`) in words: the seconds left now and where they come from,
    and why it holds, runs over or rose when it does; "" when there is nothing to count from yet."""
    left = countdown.left(time.monotonic() if now is None else now)
    if left is None:
        return ""
    if countdown.why == "overdue":
        return i18n.t("wait.why_overdue", lang)
    words = estimate_text(left, countdown.basis, lang)
    return words + (f" · {i18n.t(f'wait.why_{countdown.why}', lang)}" if countdown.why else "")


@st.cache_resource(show_spinner=False)
def preset_infos() -> dict[str, ckptlab.ModelInfo]:
    """Every preset, described once per process for all pages (meta device: no weights allocated)."""
    return {preset.name: ckptlab.describe(preset.name) for preset in ckptlab.list_presets()}


@st.cache_resource(show_spinner=False, max_entries=64)
def target_choices(model: str) -> list[str]:
    """The projections LoRA can adapt in ``model``, read once per process (meta device); raises as peft does."""
    return lora_target_choices(model)


def lora_choices(model: str) -> list[str]:
    """``target_choices``, or none for a model peft cannot adapt: LoRA is offered only where it applies."""
    try:
        return list(target_choices(model))
    except Exception:
        return []


def settle_lora_targets(prefix: str, model: str, choices: Sequence[str]) -> list[str]:
    """Fit ``<prefix>_lora_targets`` to ``model`` before its box is drawn; returns the names it does not have.

    LoRA is switched off (``<prefix>_lora``) where the model offers no target.
    """
    state = st.session_state
    key = f"{prefix}_lora_targets"
    settled = settle(state[key], choices, state.get(f"{prefix}_targets_for"), model)
    if state.get(f"{prefix}_targets_for") != model or settled.unknown:
        state[key] = settled.chosen
        state[f"{prefix}_targets_for"] = model
    if not choices:
        state[f"{prefix}_lora"] = False
    return settled.unknown


def model_box(
    prefix: str,
    names: Sequence[str],
    lang: str,
    *,
    folders: Sequence[str],
    hub_allowed: bool,
    hub_token: bool,
    label: str,
    folder_label: str,
    grouped: bool,
    help: str | None = None,
) -> None:
    """The model box as the Lab and At-scale pages draw it (``<prefix>_model``, and below it ``<prefix>_local_dir`` or
    ``<prefix>_hub_name`` where that entry is picked): ``names`` (presets), then the folder entry where the server
    offers ``folders``, then the Hub entry where it allows names (``hub_allowed``); each entry labelled by
    :func:`ckptlab.lab.modelbox.model_label`. The words of the box's label and its folder box's are the page's."""
    state = st.session_state
    st.selectbox(
        label,
        [*names, *([LOCAL] if folders else []), *([HUB] if hub_allowed else [])],
        key=f"{prefix}_model",
        format_func=lambda name: model_label(name, preset_infos().get(name), lang, grouped=grouped),
        help=help,
    )
    if state[f"{prefix}_model"] == LOCAL:
        st.selectbox(folder_label, folders, key=f"{prefix}_local_dir", help=i18n.t("lab.folder_help", lang))
    elif state[f"{prefix}_model"] == HUB:
        hub_help = i18n.t("lab.hub_help", lang) + ("" if hub_token else " " + i18n.t("lab.hub_no_token", lang))
        st.text_input(
            i18n.t("lab.hub_name", lang), key=f"{prefix}_hub_name", placeholder=hub.EXAMPLE_REPO, help=hub_help
        )


def offered(name: str) -> dict[str, Any]:
    """A number box's limits for a RunSpec field, as declared with it (``ckptlab.spec_fields``; a link offers the same)."""
    field = FIELD[name]
    return {"min_value": field.low, "max_value": field.offered}


def optimizer_box(key: str, lang: str) -> None:
    """The optimizer's select box, as every page with training controls draws it."""
    st.selectbox(
        i18n.t("training.optimizer", lang),
        OPTIMIZERS,
        key=key,
        format_func=lambda name: i18n.t(f"training.optimizer_{name}", lang),
        help=i18n.t("training.optimizer_help", lang),
    )


def step_boxes(prefix: str, lang: str) -> None:
    """Trainer's side of the step (accumulation, mixed precision, clipping) and the attention, in
    ``<prefix>_accumulation``, ``_mixed_precision``, ``_max_grad_norm`` and ``_attention`` (``ckptlab.lab.stepboxes``
    reads them back)."""
    state = st.session_state
    for key, value in step_widget_values(prefix, RunSpec()).items():
        state.setdefault(key, value)  # the lab's defaults where neither a link nor the session set one
    with st.expander(i18n.t("training.step", lang)):
        st.number_input(
            i18n.t("training.accumulation", lang),
            **offered("gradient_accumulation_steps"),
            step=1,
            key=f"{prefix}_accumulation",
            help=i18n.t("training.accumulation_help", lang),
        )
        st.selectbox(
            i18n.t("training.mixed_precision", lang),
            MIXED_PRECISIONS,
            key=f"{prefix}_mixed_precision",
            format_func=lambda name: i18n.t(f"training.mixed_precision_{name}", lang),
            help=i18n.t("training.mixed_precision_help", lang),
        )
        st.number_input(
            i18n.t("training.max_grad_norm", lang),
            **offered("max_grad_norm"),  # the link's clamp (ckptlab.lab.query), said there
            step=0.1,
            format="%g",
            key=f"{prefix}_max_grad_norm",
            help=i18n.t("training.max_grad_norm_help", lang),
        )
        st.selectbox(  # a model keyword, not Trainer's: from_pretrained(..., attn_implementation=...)
            i18n.t("training.attention", lang),
            available_attentions(),
            key=f"{prefix}_attention",
            format_func=lambda name: i18n.t(f"training.attention_{name}", lang),
            help=i18n.t("training.attention_help", lang),
        )


def lora_boxes(prefix: str, choices: Sequence[str], lang: str) -> None:
    """LoRA's toggle, rank and targets, kept in ``<prefix>_lora``, ``_lora_rank`` and ``_lora_targets``."""
    state = st.session_state
    st.toggle(
        i18n.t("training.lora", lang),
        key=f"{prefix}_lora",
        disabled=not choices,
        help=i18n.t("training.lora_help", lang),
    )
    st.number_input(
        i18n.t("training.lora_rank", lang),
        **offered("lora_rank"),
        step=1,
        key=f"{prefix}_lora_rank",
        disabled=not state[f"{prefix}_lora"],
    )
    st.multiselect(
        i18n.t("training.lora_targets", lang),
        choices,
        key=f"{prefix}_lora_targets",
        disabled=not state[f"{prefix}_lora"],
        placeholder=i18n.t("training.lora_targets_none", lang),
        help=i18n.t("training.lora_targets_help", lang),
    )
    state.setdefault(f"{prefix}_qlora", False)
    st.toggle(
        i18n.t("training.qlora", lang),
        key=f"{prefix}_qlora",
        disabled=not state[f"{prefix}_lora"],
        help=i18n.t("training.qlora_help", lang),
    )


def job_buttons(
    prefix: str,
    starts: Sequence[tuple[str, str, Callable[[], Any], str | None]],
    stop_label: str,
    lang: str,
    blocked: bool = False,
) -> bool:
    """The buttons that start the background job in ``<prefix>_job``, then Stop, in a row left of an empty column;
    returns whether the job runs.

    ``starts``: (label, widget key, a function that makes the job, help) each, the first the primary one; none
    while the job runs or while ``blocked``. A job that cannot be made keeps its message in ``<prefix>_error``
    (emptied by the next start that works).
    """
    state = st.session_state

    def start(make: Callable[[], Any]) -> None:
        try:
            job = make()
        except ckptlab.CkptlabError as error:
            state[f"{prefix}_error"] = app_message(error, lang)
            return
        state[f"{prefix}_error"] = ""
        state[f"{prefix}_job"] = job.start()

    def stop() -> None:
        job = state.get(f"{prefix}_job")
        if job is not None:
            job.stop()

    job = state.get(f"{prefix}_job")
    running = job is not None and job.state().running
    # One or two starts share two parts left of Stop and an empty column; three or more fill the row with Stop, each
    # half as wide again as it, so that no label is cut to an ellipsis ("Sequência mais longa" at 1280 pixels).
    few = len(starts) <= 2
    widths = [2 / len(starts)] * len(starts) + [1, 3] if few else [1.5] * len(starts) + [1]
    *columns, stop_column = st.columns(widths)[: len(starts) + 1]
    for index, (column, (label, key, make, help)) in enumerate(zip(columns, starts)):
        column.button(
            label,
            type="primary" if index == 0 else "secondary",
            key=key,
            on_click=start,
            args=(make,),
            disabled=running or blocked,
            help=help,
            width="stretch",
        )
    stop_column.button(stop_label, key=f"{prefix}_stop", on_click=stop, disabled=not running, width="stretch")
    return running


POLL_S = 0.5  # how often the progress bar looks at a running job


def poll_job(
    prefix: str,
    running: bool,
    lang: str,
    progress_text: Callable[[Any, Any], str],
    keep: Callable[[Any], None],
    live: Callable[[Any], None] = lambda snapshot: None,
) -> None:
    """The background job in ``<prefix>_job``, polled in a fragment: while it runs, a bar with ``progress_text(job,
    snapshot)`` and the time left, then ``live(snapshot)`` (the rows so far); once it ends, ``keep(snapshot)``
    (what it produced, into the session), its error in ``<prefix>_error``, and one full rerun to draw."""

    @st.fragment(run_every=POLL_S if running else None)
    def progress() -> None:
        state = st.session_state
        job = state.get(f"{prefix}_job")
        if job is None:
            return
        snapshot = job.state()
        if snapshot.running:
            text, left = progress_text(job, snapshot), countdown_text(job.countdown(), lang)
            if left and not snapshot.stop_requested:
                text += " · " + left
            st.progress(min(max(snapshot.fraction, 0.0), 1.0), text=text)
            live(snapshot)
            return
        if state.get(f"{prefix}_shown") is not job:
            state[f"{prefix}_shown"] = job
            keep(snapshot)
            error = snapshot.error
            if error:  # the lab's own error in the page's language; a bug's words (a fact) said in it too
                failure = snapshot.failure
                said = i18n.say(error, lang) if isinstance(error, Fact) else error
                state[f"{prefix}_error"] = app_message(failure, lang) if failure else said
            st.rerun()

    progress()


def download_buttons(stem: str, files: Sequence[tuple[str, str, str, str]]) -> None:
    """Download buttons side by side, left of an empty column: (label, content, "csv" or "json", widget key) each."""
    mimes = {"csv": "text/csv", "json": "application/json"}
    columns = st.columns([1] * len(files) + [3])
    for column, (label, content, extension, key) in zip(columns, files):
        column.download_button(
            label,
            content,
            file_name=f"{stem}.{extension}",
            mime=mimes[extension],
            key=key,
            on_click="ignore",
            width="stretch",
        )


def failure(message: str, details: str | None, details_label: str) -> None:
    """An error, and its details (a traceback's last line) folded away under ``details_label`` when there are some."""
    st.error(message)
    if details:
        with st.expander(details_label):
            st.code(details, language=None)
