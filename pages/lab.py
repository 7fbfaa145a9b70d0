"""The lab: pick a model and a checkpointing setting, press Run, see what each layer kept and what it cost.

A flat page: read the widgets, call ``ckptlab.lab.run.run_queued`` once on Run (a status box, Cancel, the
gradient check), then draw the last run (diagram, breakdown, metrics, comparison, notes, downloads) and the code.
The outcome is kept in the session (``lab_last``, ``lab_error``, ``lab_grads``) for each rerun to draw. The
settings live in the URL, so a link restores them; nothing heavy runs before Run. Words and numbers come from
``ckptlab.lab.lab_view``; here they are drawn.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import streamlit as st

import ckptlab
from ckptlab.fact import Fact
from ckptlab.lab import lab_view
from ckptlab.lab import run as labrun
from ckptlab.lab.jobs import Countdown, count_down
from ckptlab.lab.modelbox import HUB, LOCAL, hub_name_problem, model_caption
from ckptlab.lab.query import spec_from_query, spec_to_query
from ckptlab.lab.run import LabRun, Loader, build_for_key, check_gradients_queued
from ckptlab.lab.server import ServerPolicy
from ckptlab.lab.targets import spec_targets
from ckptlab.lab.workers import WorkerPool, started_pool
from ckptlab.model import hub
from ckptlab.model.selective import CHOICES as SELECTIVE_CHOICES
from ckptlab.model.selective import selective_key
from ckptlab.results import MIN_SAMPLES_TO_JUDGE
from ckptlab.show.export import layer_rows, result_csv
from ckptlab.show.figures._style import PAGE_PX, column_px
from ckptlab.show.figures.breakdown import breakdown_figure
from ckptlab.show.figures.diagram import diagram_figure, plan_figure
from ckptlab.show.figures.run import comparison_figure
from ckptlab.show.i18n import as_text, number, say, t
from ckptlab.show.labels import experts_caption, method_label, provenance_label, run_label, short_setting_label
from ckptlab.show.noise import timing_busy_message
from ckptlab.show.peak_words import logits_sentence
from ckptlab.show.wording import app_message, run_message
from ckptlab.spec import DTYPES, RunSpec
from ckptlab.spec_fields import FIELD
from ckptlab.step.code import training_code
from ckptlab.units import MIB
from pages._common import (
    countdown_text,
    download_buttons,
    failure,
    language,
    lora_boxes,
    lora_choices,
    model_box,
    offered,
    optimizer_box,
    preset_infos,
    refuse_forged,
    run_through_app,
    settle_lora_targets,
    step_boxes,
)
from pages._server import job_workers, offered_folder, server_policy, session_owner

run_through_app()

DEVICES = FIELD["device"].offered_choices()
lang = language()
policy, policy_problem = server_policy()


def simulating() -> WorkerPool | None:
    """Where the Run's estimate simulates what the shared store lacks: the server's simulation workers."""
    return job_workers(policy, "simulation")


WIDGETS = lab_view.WIDGETS


@st.cache_resource(show_spinner=False, max_entries=1)
def cached_model(key: tuple[str, str, str, int]):
    """The built model for (model, dtype, device, seed), shared by all sessions.

    One at a time: on a GPU every model kept alive counts in the memory a run starts from
    (CUDA's allocator sees the whole device), so a second cached model would show up in
    another session's baseline. Runs of one model back to back, the workshop case, reuse it.
    """
    return build_for_key(key)


STOP_CHECK_S = 0.3  # how often a run in flight looks for a Cancel (each look is one Streamlit message)


def load_widgets(devices: tuple[str, ...], policy: ServerPolicy, lang: str) -> None:
    """Fill the widgets from the link, or from this session's last settings; warnings go to ``lab_query_warnings``.

    A link to a folder this server does not offer opens the default preset, and says why.
    """
    state = st.session_state
    if st.query_params:
        spec, ignored = spec_from_query(st.query_params.to_dict(), devices=devices)
        state.lab_query_warnings = [say(as_text(fact), lang) for fact in ignored]  # the link's values as text
    else:
        spec, state.lab_query_warnings = state.get("lab_saved", RunSpec()), []
    # A link's owner/name is a Hub repository where the server fetches them (the folder entry otherwise).
    hub_name = spec.model if policy.hub and spec.model not in preset_infos() and hub.is_repo_name(spec.model) else ""
    offered = spec.model in preset_infos() or hub_name
    folder, why_not = ("", "") if offered else offered_folder(policy, spec.model, lang)
    if why_not:  # a link to a folder this server does not offer: the default preset
        state.lab_query_warnings = [*state.lab_query_warnings, why_not]
        spec = replace(spec, model=RunSpec().model)
    state.update(lab_view.widget_values(spec, folder, hub_name))


def run_and_keep(spec: RunSpec, load: Loader, policy: ServerPolicy, lang: str) -> None:
    """Run through the device queue with progress; keep the outcome in the session."""
    state = st.session_state
    state.lab_query_warnings = []
    state.lab_error = None
    # A click reruns the page, and Streamlit interrupts this run at its next message: the stop
    # check below sends one every STOP_CHECK_S, from inside the step (ckptlab.step.stopping).
    # Outside the status box, which folds its contents away as it updates.
    cancel = st.empty()  # emptied once the run ends: a Cancel after the end would cancel nothing
    cancel.button(t("lab.cancel", lang), key="lab_cancel", help=t("lab.cancel_help", lang))
    with st.status(t("lab.status_waiting", lang), expanded=True) as status:
        bar = st.progress(0.0, text=t("lab.queued", lang))
        looked = [time.monotonic()]

        try:  # the Run's parts not measured yet, predicted: the countdown's start until its own steps say more
            total_s, measured_pace = labrun.PACE.estimate(spec, labrun.RESULTS, workers=simulating)
        except ckptlab.CkptlabError:  # a model that cannot be described: run_queued's own check says why
            total_s, measured_pace = None, False
        # The countdown from the steps done and their measured seconds (ckptlab.lab.jobs.count_down), redrawn at each
        # step and between them; the time in the device queue is not work.
        working_since: list[float] = []  # when the turn began its work
        shown: list[Countdown | None] = [None]
        line = [0.0, ""]  # the last fraction and words

        def draw(now: float) -> None:
            working = now - working_since[0] if working_since else 0.0
            basis = "measured" if measured_pace else "predicted"
            shown[0] = countdown = count_down(line[0], working, now, shown[0], False, total_s, basis)
            left = countdown_text(countdown, lang, now)
            bar.progress(line[0], text=str(line[1]) + (" · " + left if left else ""))

        def should_stop() -> bool:
            if time.monotonic() - looked[0] >= STOP_CHECK_S:
                looked[0] = time.monotonic()
                status.update()  # a message to the browser: where a pending Cancel interrupts the run
                if working_since:
                    draw(looked[0])  # the seconds left count down between steps too
            return False

        def progress(message: Fact, fraction: float) -> None:
            now = time.monotonic()
            if not working_since and message.key != "progress.waiting":
                working_since.append(now)
            line[:] = [min(max(fraction, 0.0), 1.0), say(message, lang)]
            status.update(label=t("lab.status_running", lang, pct=number(line[0], ".0%", lang), message=line[1]))
            draw(now)

        def on_wait(ahead: int) -> None:
            runs = t("lab.runs_one" if ahead == 1 else "lab.runs_many", lang)
            status.update(label=t("lab.status_ahead", lang, ahead=ahead, runs=runs))

        try:
            lab = labrun.run_queued(  # looked up on each Run: tests replace it
                spec,
                load=load,
                progress=progress,
                on_wait=on_wait,
                should_stop=should_stop,
                owner=session_owner(),
                limit_s=policy.run_limit_s,
                workers=job_workers(policy, "device"),
                sharing=started_pool("simulation"),  # if started: a CPU run timed beside its jobs says so
                memory_cap_bytes=policy.memory_cap_bytes,
            )
            cancel.empty()
        except ckptlab.CkptlabError as error:
            cancel.empty()
            status.update(label=t("lab.could_not_run", lang), state="error", expanded=False)
            state.lab_error = (spec, app_message(error, lang), None)
            return
        except Exception as error:  # a bug, not bad input: say so briefly, keep the page alive
            cancel.empty()
            status.update(label=t("lab.run_failed", lang), state="error", expanded=False)
            state.lab_error = (spec, t("lab.run_failed_long", lang), f"{type(error).__name__}: {error}")
            return
        status.update(label=lab_view.status_label(lab, lang), state="complete", expanded=False)
        state.lab_last = lab
    if state.get("lab_check_grads") and spec.checkpointing and lab.result.status == "ok":
        _check_gradients(spec, lang)


def _check_gradients(spec: RunSpec, lang: str) -> None:
    """Two more steps, checkpointing off and on (dropout on): are the gradients the same bits?"""
    state = st.session_state
    with st.spinner(t("lab.grads_checking", lang)):
        try:
            policy = server_policy()[0]
            checked = check_gradients_queued(spec, workers=job_workers(policy, "device"), limit_s=policy.run_limit_s)
            state.lab_grads = (spec, checked, "")
        except Exception as error:  # the run itself succeeded: say the check failed, keep its result
            state.lab_grads = (spec, None, f"{type(error).__name__}: {error}")


def draw_code(spec: RunSpec, targets: list[str], lang: str) -> None:
    """The code for the current settings (not the last run's): one box, written from the spec by the core
    (``targets``: the model's projections, read once for the LoRA boxes, which "all" of the spec means)."""
    st.subheader(t("lab.code_title", lang), anchor=False)
    st.caption(t("lab.code_caption", lang))
    st.code(training_code(spec, targets=spec.lora_targets or targets), language="python")


def draw_result(lab: LabRun, spec: RunSpec, lang: str) -> None:
    """The last run: diagram, measurements against checkpointing off, notes, downloads."""
    result = lab.result
    if not draw_measurements(lab, spec, lang):
        return

    said = lab_view.offload_box(spec, result, lang)
    if said is not None:
        getattr(st, said[0])(said[1])
    if not result.plan_matches:  # decided on the layers' fields; the diagram shows where, the notes the details
        st.error(t("lab.plan_mismatch", lang))
    for note in lab_view.notes_to_show(result):  # what the box above says is left out, in the page's words
        st.caption(say(note, lang))

    with st.expander(t("lab.per_layer", lang)):
        rows, columns = layer_table(result, lang)
        st.dataframe(rows, column_config=columns, hide_index=True)
        st.caption(
            t(
                "lab.methods",
                lang,
                memory=method_label(result.memory.method, lang),
                time=method_label(result.timing.method, lang),
            )
        )

    download_buttons(
        lab_view.file_stem(result),
        [
            (t("lab.download_json", lang), result.to_json(), "json", "lab_download_json"),
            (t("lab.download_csv", lang), result_csv(result), "csv", "lab_download_csv"),
        ],
    )


# The per-layer table's widths in pixels, summing to 780: the expander inside the page's 820 px at 1280x720 holds them
# all (784 px), where columns sized to their headers ("recompute_calls", raw byte counts) ran past its right edge.
LAYER_COLUMN_PX = {
    "layer": 60,
    "module": 125,
    "planned": 75,
    "flag": 45,
    "observed": 80,
    "forward_calls": 70,
    "recompute_calls": 65,
    "saved_bytes": 80,
    "attention_bytes": 95,
    "input_bytes": 85,
}


def layer_table(result: ckptlab.RunResult, lang: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The per-layer rows with bytes as MiB, and st.dataframe's column_config: short headers in the page's language
    (the CSV's name in each header's help), widths that fit the page."""
    rows = [
        {name: value / MIB if name.endswith("_bytes") else value for name, value in row.items()}
        for row in layer_rows(result)
    ]
    config = {
        name: (st.column_config.NumberColumn if name.endswith(("_bytes", "_calls")) else st.column_config.TextColumn)(
            t(f"lab.layer_column.{name}", lang),
            help=name,
            width=width,
            **({"format": "%.2f"} if name.endswith("_bytes") else {}),
        )
        for name, width in LAYER_COLUMN_PX.items()
    }
    return rows, config


def draw_gradients(spec: RunSpec, lang: str) -> None:
    """One line when the check agrees; loud when it does not (checkpointing changed what is learned)."""
    found = st.session_state.get("lab_grads")
    if not found or found[0] != spec:
        return
    _, outcome, problem = found
    kind, text = lab_view.gradients_message(outcome, problem, lang)
    getattr(st, kind)(text)


def draw_metrics(lab: LabRun, lang: str) -> None:
    """st.metric figures with deltas against checkpointing off, and what they mean."""
    result, comparison = lab.result, lab.comparison
    base = lab_view.reference_run(lab)
    columns = st.columns(2)
    for index, metric in enumerate(lab_view.metrics(lab, lang)):  # left, right, left, ...
        columns[index % 2].metric(metric.label, metric.value, **metric.delta, help=metric.help)
    st.markdown(lab_view.peak_line(result.memory, lang))
    if logits_sentence(result.memory, lang):
        st.caption(logits_sentence(result.memory, lang))
    if comparison is not None and base is not None:
        st.markdown(lab_view.time_sentence(comparison, MIN_SAMPLES_TO_JUDGE, lang))
        freed = lab_view.freed_sentence(result.memory, base.memory, comparison, lang)
        if freed:
            st.markdown(freed)
    if lab.reference is not None and lab.reference.result.status != "ok":
        st.warning(t("lab.baseline_no_fit", lang, message=run_message(lab.reference.result, lang)))
    st.caption(lab_view.medians_caption(result, lang))


def draw_measurements(lab: LabRun, spec: RunSpec, lang: str) -> bool:
    """The last run's diagram, breakdown, metrics and comparison; False when it did not run (its error shown)."""
    result = lab.result
    base = lab.reference.result if lab.reference else None
    if result.spec != spec:
        st.info(lab_view.settings_changed(result, lang))
    when = t("lab.reused_at" if lab.run.reused else "lab.measured_at", lang, clock=lab_view.clock(lab.run))
    st.caption(f"{provenance_label(result.provenance, lang)} · {when}")
    busy = timing_busy_message(result.timing, lang) or (base is not None and timing_busy_message(base.timing, lang))
    if busy:
        st.warning(busy)
    if result.status != "ok":
        st.error(run_message(result, lang))
        st.plotly_chart(diagram_figure(result, lang=lang), key="lab_diagram", theme=None)
        return False
    diagram, where = st.columns([3, 2])
    diagram.plotly_chart(diagram_figure(result, lang=lang), key="lab_diagram", theme=None)
    label = run_label(result, lang)  # says so when offload did not happen (the CPU)
    bars = [(label, result)]
    if lab.plain is not None and lab.plain.result.status == "ok":  # a selective policy beside plain checkpointing
        policy = selective_key(result.spec.selective)  # its name: the box's description is a sentence
        # Three bars in a 2/5 column: the settings' short names, or a label wider than its bar is cut ("checkpoin").
        bars = [
            (short_setting_label(lab.plain.result.spec.every_n_layers, lang), lab.plain.result),
            (t("selective.bar_policy", lang, policy=policy), result),
        ]
    if base is not None and base is not result and base.status == "ok":
        bars.insert(0, (t("setting.short_off" if len(bars) > 1 else "setting.off", lang), base))
    breakdown = breakdown_figure(bars, lang=lang, height=380, width=column_px(0.4))
    where.plotly_chart(breakdown, key="lab_breakdown", theme=None)
    where.caption(t("lab.breakdown_caption", lang))
    draw_gradients(result.spec, lang)
    draw_selective(lab, lang)

    numbers, chart = st.columns([2, 3])
    with numbers:
        draw_metrics(lab, lang)
    with chart:
        st.plotly_chart(comparison_figure(result, base, lang=lang), key="lab_comparison", theme=None)
        st.caption(t("lab.comparison_caption", lang, provenance=provenance_label(result.provenance, lang)))
    return True


def draw_selective(lab: LabRun, lang: str) -> None:
    """With a selective policy: what it kept (observed), and the run beside plain checkpointing and off."""
    line = lab_view.kept_line(lab.result, lang)
    if not line:
        return
    st.subheader(t("selective.title", lang), anchor=False)
    st.markdown(line)
    rows = lab_view.selective_rows(lab, lang)
    if rows:
        st.dataframe(rows, hide_index=True, key="lab_selective_table")
        st.caption(t("selective.table_caption", lang, provenance=provenance_label(lab.result.provenance, lang)))


# -- the page: settings -> spec -> URL, then Run, then the result -------------------------

state = st.session_state
# A value no box of this page could send (forged over the websocket) is dropped before anything reads it: the box is
# filled again from the link, and the page says so in one line.
refused = refuse_forged(lab_view.widget_checks(list(preset_infos())), lang)
if any(key not in state for key in WIDGETS):
    load_widgets(DEVICES, policy, lang)  # first run of this session, or back from another page (widgets dropped)
if refused:
    state.lab_query_warnings = [*state.get("lab_query_warnings", []), *refused]

# The model decides the every_n_layers range, so describe it before drawing the controls.
folders = policy.model_folders()  # what the instructor offers under CKPTLAB_MODELS_ROOT; none when unset
if state.lab_model == LOCAL and state.lab_local_dir not in folders:  # the folder went away since
    state.lab_model, state.lab_local_dir = RunSpec().model, ""
if state.lab_model == HUB and not policy.hub:  # the instructor turned Hub names off since
    state.lab_model = RunSpec().model
if state.lab_model == LOCAL:
    model_name = policy.local_folder(state.lab_local_dir)
elif state.lab_model == HUB:
    model_name = state.lab_hub_name.strip()  # described below, through the one place a name is resolved
else:
    model_name = state.lab_model
info: ckptlab.ModelInfo | None = None
model_problem = ""
if state.lab_model not in (LOCAL, HUB):
    info = preset_infos()[model_name]
elif state.lab_model == HUB and not model_name:
    model_problem = t("lab.hub_empty", lang)
elif state.lab_model == HUB and hub_name_problem(model_name, lang):
    model_problem = hub_name_problem(model_name, lang)
elif model_name:
    info, model_problem = lab_view.folder_info(model_name, lang, policy)  # described in a worker, under its cap
num_layers = info.num_layers if info else max(2, state.lab_n)
if state.lab_n > num_layers:
    warning = t("lab.n_lowered", lang, layers=num_layers, model=model_name)
    state.lab_query_warnings, state.lab_n = [*state.get("lab_query_warnings", []), warning], num_layers

# LoRA's targets are the model's projections: all of them unless the link or the person chose some.
choices = lora_choices(model_name) if info is not None else []
unknown = settle_lora_targets("lab", model_name, choices)
if unknown:  # names from the link this model does not have
    warning = lab_view.unknown_targets_warning(unknown, model_name, choices, lang)
    state.lab_query_warnings = [*state.get("lab_query_warnings", []), warning]

with st.sidebar:
    st.header(t("common.settings", lang))
    model_box(
        "lab",
        list(preset_infos()),
        lang,
        folders=folders,
        hub_allowed=policy.hub,
        hub_token=bool(policy.hub_token),
        label=t("common.model", lang),
        folder_label=t("lab.folder", lang),
        grouped=True,
        help=t("lab.model_help", lang),
    )
    if state.lab_model not in (LOCAL, HUB) and info:
        st.caption(model_caption(info, lang))
    st.number_input(t("common.seq_len", lang), **offered("seq_len"), step=128, key="lab_seq")
    st.number_input(t("lab.batch", lang), **offered("batch_size"), step=1, key="lab_batch")
    left, right = st.columns(2)
    left.selectbox("dtype", DTYPES, key="lab_dtype", help=t("lab.dtype_help", lang))
    right.selectbox(t("lab.device", lang), DEVICES, key="lab_device", help=t("lab.device_help", lang))
    st.toggle(t("lab.checkpointing", lang), key="lab_ckpt")
    if num_layers > 1:
        st.slider(
            "every_n_layers",
            min_value=1,
            max_value=num_layers,
            key="lab_n",
            disabled=not state.lab_ckpt,
            help=t("lab.every_n_help", lang),
        )
    else:
        state.lab_n = 1
        st.caption(t("lab.one_layer", lang))
    st.toggle("offload", key="lab_offload", disabled=not state.lab_ckpt, help=t("lab.offload_help", lang))
    st.selectbox(
        t("selective.label", lang),
        SELECTIVE_CHOICES,
        key="lab_selective",
        format_func=lambda policy: lab_view.policy_label(policy, lang),
        disabled=not state.lab_ckpt,
        help=t("selective.help", lang),
    )
    st.checkbox(
        t("lab.check_grads", lang),
        key="lab_check_grads",
        disabled=not state.lab_ckpt,
        help=t("lab.check_grads_help", lang),
    )
    optimizer_box("lab_optimizer", lang)
    step_boxes("lab", lang)
    lora_boxes("lab", choices, lang)
    with st.expander(t("lab.timing", lang)):
        st.number_input(t("lab.repeats", lang), **offered("repeats"), key="lab_repeats")
        st.number_input(t("lab.warmup", lang), **offered("warmup"), key="lab_warmup")

spec = lab_view.spec_from_widgets(
    state, model_name or "", spec_targets(state.lab_lora_targets, choices, state.lab_lora)
)
state.lab_saved = spec
# The page owns its settings' keys in the URL; app.py owns ?lang=, which stays.
wanted = {**spec_to_query(spec), **({"lang": st.query_params["lang"]} if "lang" in st.query_params else {})}
if model_name and st.query_params.to_dict() != wanted:
    st.query_params.from_dict(wanted)

st.header(t("lab.title", lang), anchor=False)
st.caption(t("lab.intro", lang))
if policy_problem is not None:  # the instructor's setting, shown to all: presets and default limits meanwhile
    st.error(t("lab.policy_problem", lang, problem=app_message(policy_problem, lang)))
for warning in state.get("lab_query_warnings", []):
    st.warning(warning)
if model_problem:
    st.error(model_problem)
    st.stop()
if experts_caption(info, lang):
    st.caption(experts_caption(info, lang))

problem, on_cpu = lab_view.problem_with(spec, info, policy, lang, simulating)
if problem:
    st.error(problem)
elif on_cpu and not info.cpu_ok:
    st.warning(lab_view.cpu_warning(spec, info, lang, simulating))
if not problem and (slow := lab_view.autocast_warning(spec, on_cpu, lang)):
    st.warning(slow)

head, button = st.columns([5, 1], vertical_alignment="center")
head.markdown(lab_view.head_line(spec, lang))
pressed = button.button(t("lab.run", lang), type="primary", key="lab_run", disabled=bool(problem), width="stretch")
if pressed and not problem:  # a disabled button is the browser's word; the server checks again
    run_and_keep(spec, cached_model, policy, lang)
elif state.get("lab_cancel"):
    st.info(t("lab.cancelled", lang))

error = state.get("lab_error")
if error and error[0] == spec:  # an error belongs to the settings that caused it
    failure(error[1], error[2], t("lab.details", lang))

lab: LabRun | None = state.get("lab_last")
if spec.offload and on_cpu and not problem and (lab is None or lab.result.spec != spec):
    st.info(t("lab.offload_cpu", lang))

try:
    if lab is None:
        if not problem:
            plan = plan_figure(info.num_layers, spec.every_n_layers, lang=lang, nested=info.nested_in, width=PAGE_PX)
            st.plotly_chart(plan, key="lab_plan", theme=None)
    else:
        draw_result(lab, spec, lang)
    draw_code(spec, choices, lang)
except Exception as error:  # drawing must never take the page down
    failure(t("lab.draw_failed", lang), f"{type(error).__name__}: {error}", t("lab.details", lang))
