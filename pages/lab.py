"""The lab: pick a model and a checkpointing setting, press Run, see what each layer kept and what it cost.

A flat page: read the widgets, call ``ckptlab.lab.run.run_queued`` once, render. The
settings live in the URL, so a link restores them; nothing heavy runs before Run.
"""

from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st
import torch

import ckptlab
from ckptlab.lab.query import (
    BATCH_MAX,
    LORA_RANK_MAX,
    REPEATS_MAX,
    SEQ_MAX,
    WARMUP_MAX,
    spec_from_query,
    spec_to_query,
)
from ckptlab.lab.run import (
    LabRun,
    Measured,
    build_for_key,
    check,
    check_gradients_queued,
    cpu_estimate,
    lora_target_choices,
    phase_significant,
    run_queued,
)
from ckptlab.model import snippets
from ckptlab.results import MIN_SAMPLES_TO_JUDGE
from ckptlab.show import i18n
from ckptlab.show.experts_words import experts_caption
from ckptlab.show.export import layer_rows, result_csv
from ckptlab.show.figures.breakdown import breakdown_figure
from ckptlab.show.figures.diagram import diagram_figure, plan_figure
from ckptlab.show.figures.run import comparison_figure
from ckptlab.show.labels import event_label, method_label, provenance_label, setting_label, training_label
from ckptlab.show.noise import timing_busy_message
from ckptlab.show.report import setting_name
from ckptlab.show.wording import app_message
from ckptlab.spec import DTYPES, OPTIMIZERS, RunSpec
from ckptlab.step.measure import resolve_device
from ckptlab.units import GIB, MIB, mib
from pages._deep_link import run_through_app
from pages._server import offered_folder, server_policy, session_owner

run_through_app()

LOCAL = "local directory"
DEVICES = ("auto", "cpu", "cuda") if torch.cuda.is_available() else ("auto", "cpu")
lang = i18n.normalize(st.session_state.get("app_lang"))
tr = i18n.translator(lang)
policy, policy_problem = server_policy()
STOP_CHECK_S = 0.3  # how often a run in flight looks for a Cancel (each look is one Streamlit message)
WIDGETS = (
    "lab_model",
    "lab_local_dir",
    "lab_seq",
    "lab_batch",
    "lab_dtype",
    "lab_device",
    "lab_ckpt",
    "lab_n",
    "lab_offload",
    "lab_repeats",
    "lab_warmup",
    "lab_optimizer",
    "lab_lora",
    "lab_lora_rank",
    "lab_lora_targets",
)
LORA_RANK_DEFAULT = 8


# -- cached core calls --------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def preset_infos() -> dict[str, ckptlab.ModelInfo]:
    """Every preset, described once per process (meta device: no weights allocated)."""
    return {preset.name: ckptlab.describe(preset.name) for preset in ckptlab.list_presets()}


@st.cache_resource(show_spinner=False, max_entries=64)
def target_choices(model: str) -> list[str]:
    """The projections LoRA can adapt in ``model``, read once per process (meta device)."""
    return lora_target_choices(model)


@st.cache_resource(show_spinner=False, max_entries=1)
def cached_model(key: tuple[str, str, str, int]):
    """The built model for (model, dtype, device, seed), shared by all sessions.

    One at a time: on a GPU every model kept alive counts in the memory a run starts from
    (CUDA's allocator sees the whole device), so a second cached model would show up in
    another session's baseline. Runs of one model back to back, the workshop case, reuse it.
    """
    return build_for_key(key)


# -- settings: URL -> session state -> widgets -> spec -> URL ------------------------------


def _initial_spec() -> tuple[RunSpec, list[str]]:
    if st.query_params:
        return spec_from_query(st.query_params.to_dict(), devices=DEVICES)
    return st.session_state.get("lab_saved", RunSpec()), []


def _load_into_widgets(spec: RunSpec) -> None:
    state = st.session_state
    is_preset = spec.model in preset_infos()
    folder = "" if is_preset else _offered_folder(spec.model)
    if not is_preset and not folder:  # a link to a folder this server does not offer: the default preset
        spec = replace(spec, model=RunSpec().model)
        is_preset = True
    state.lab_model = spec.model if is_preset else LOCAL
    state.lab_local_dir = folder
    state.lab_seq, state.lab_batch = spec.seq_len, spec.batch_size
    state.lab_dtype, state.lab_device = spec.dtype, spec.device
    state.lab_ckpt = spec.every_n_layers is not None
    state.lab_n = spec.every_n_layers or 1
    state.lab_offload = spec.offload
    state.lab_repeats, state.lab_warmup = spec.repeats, spec.warmup
    state.lab_optimizer = spec.optimizer
    state.lab_lora = spec.lora_rank is not None
    state.lab_lora_rank = spec.lora_rank or LORA_RANK_DEFAULT
    state.lab_lora_targets = list(spec.lora_targets or ())
    state.lab_targets_for = None if spec.lora_targets is None else spec.model  # None: all, once the model is read


def _offered_folder(path: str) -> str:
    """``path`` as one of the folders the policy offers, or "" with a warning why not."""
    folder, why_not = offered_folder(policy, path, lang)
    if why_not:
        st.session_state.lab_query_warnings = [*st.session_state.get("lab_query_warnings", []), why_not]
    return folder


def _said(error: Exception) -> str:
    """A core error in the page's language and the page's words."""
    return app_message(error, lang)


def _model_label(name: str) -> str:
    if name == LOCAL:
        return tr("lab.local_dir")
    info = preset_infos()[name]
    group = tr("lab.group_tiny") if info.cpu_ok else tr("lab.group_real")
    size = f"{info.num_params / 1e9:.1f}B" if info.num_params >= 1e9 else f"{info.num_params / 1e6:.0f}M"
    return tr("lab.model_label", group=group, name=name, layers=info.num_layers, size=size)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds / 3600:,.0f} h"


def _clock(measured: Measured) -> str:
    return measured.measured_at.astimezone().strftime("%H:%M")


# -- running and drawing ------------------------------------------------------------------


def _run(spec: RunSpec) -> None:
    """Run through the device queue with progress; keep the outcome in the session."""
    state = st.session_state
    state.lab_query_warnings = []
    state.lab_error = None
    # A click reruns the page, and Streamlit interrupts this run at its next message: the stop
    # check below sends one every STOP_CHECK_S, from inside the step (ckptlab.step.stopping).
    # Outside the status box, which folds its contents away as it updates.
    cancel = st.empty()  # emptied once the run ends: a Cancel after the end would cancel nothing
    cancel.button(tr("lab.cancel"), key="lab_cancel", help=tr("lab.cancel_help"))
    with st.status(tr("lab.status_waiting"), expanded=True) as status:
        bar = st.progress(0.0, text=tr("lab.queued"))
        looked = [time.monotonic()]

        def should_stop() -> bool:
            if time.monotonic() - looked[0] >= STOP_CHECK_S:
                looked[0] = time.monotonic()
                status.update()  # a message to the browser: where a pending Cancel interrupts the run
            return False

        def progress(message: str, fraction: float) -> None:
            fraction = min(max(fraction, 0.0), 1.0)
            status.update(label=tr("lab.status_running", pct=f"{fraction:.0%}", message=message))
            bar.progress(fraction, text=message)

        def on_wait(ahead: int) -> None:
            status.update(
                label=tr("lab.status_ahead", ahead=ahead, runs=tr("lab.runs_one" if ahead == 1 else "lab.runs_many"))
            )

        try:
            lab = run_queued(
                spec,
                load=cached_model,
                progress=progress,
                on_wait=on_wait,
                should_stop=should_stop,
                owner=session_owner(),
                limit_s=policy.run_limit_s,
            )
            cancel.empty()
        except ckptlab.CkptlabError as error:
            cancel.empty()
            status.update(label=tr("lab.could_not_run"), state="error", expanded=False)
            state.lab_error = (spec, _said(error), None)
            return
        except Exception as error:  # a bug, not bad input: say so briefly, keep the page alive
            cancel.empty()
            status.update(label=tr("lab.run_failed"), state="error", expanded=False)
            state.lab_error = (spec, tr("lab.run_failed_long"), f"{type(error).__name__}: {error}")
            return
        if lab.run.reused and (lab.baseline is None or lab.baseline.reused):
            label = tr("lab.reused_label", clock=_clock(lab.run))
        else:
            waited = tr("lab.waited", seconds=f"{lab.wait_s:.1f}") if lab.wait_s >= 0.5 else ""
            label = tr("lab.measured_in", seconds=f"{lab.elapsed_s:.1f}", waited=waited)
        status.update(label=label, state="complete", expanded=False)
        state.lab_last = lab
    if state.get("lab_check_grads") and spec.checkpointing and lab.result.status == "ok":
        _check_gradients(spec)


def _check_gradients(spec: RunSpec) -> None:
    """Two more steps, checkpointing off and on (dropout on): are the gradients the same bits?"""
    state = st.session_state
    with st.spinner(tr("lab.grads_checking")):
        try:
            state.lab_grads = (spec, check_gradients_queued(spec), "")
        except Exception as error:  # the run itself succeeded: say the check failed, keep its result
            state.lab_grads = (spec, None, f"{type(error).__name__}: {error}")


def _render_gradients(spec: RunSpec) -> None:
    """One line when the check agrees; loud when it does not (checkpointing changed what is learned)."""
    found = st.session_state.get("lab_grads")
    if not found or found[0] != spec:
        return
    _, outcome, problem = found
    if outcome is None:
        st.warning(tr("lab.grads_failed", error=problem))
    elif outcome.equal:
        st.success(tr("lab.grads_equal", count=outcome.gradients_compared, dropout=outcome.dropout))
    else:
        st.error(
            tr(
                "lab.grads_differ",
                diff=f"{outcome.max_abs_difference:.3g}",
                loss=tr("lab.grads_loss_same" if outcome.loss_equal else "lab.grads_loss_differs"),
                count=outcome.gradients_compared,
            )
        )


def _render_code(spec: RunSpec) -> None:
    """The transformers lines for the current settings (not the last run's)."""
    st.subheader(tr("lab.code_title"), anchor=False)
    st.caption(tr("lab.on_a_model"))
    st.code(snippets.model_snippet(spec.every_n_layers, spec.offload), language="python")
    st.caption(tr("lab.with_trainer"))
    st.code(snippets.trainer_snippet(spec.every_n_layers, spec.offload), language="python")


def _render_result(lab: LabRun, spec: RunSpec) -> None:
    """The last run: diagram, measurements against checkpointing off, notes, downloads."""
    result = lab.result
    base = lab.baseline.result if lab.baseline else None
    if result.spec != spec:
        st.info(
            tr(
                "lab.settings_changed",
                model=result.model.name,
                seq=f"{result.spec.seq_len:,}",
                batch=result.spec.batch_size,
                setting=setting_label(result.spec.every_n_layers, result.spec.offload, lang),
            )
        )
    when = (
        tr("lab.reused_at", clock=_clock(lab.run)) if lab.run.reused else tr("lab.measured_at", clock=_clock(lab.run))
    )
    st.caption(f"{provenance_label(result.provenance, lang)} · {when}")
    busy = timing_busy_message(result.timing, lang) or (base is not None and timing_busy_message(base.timing, lang))
    if busy:
        st.warning(busy)
    if result.status != "ok":
        st.error(result.message)
        st.plotly_chart(diagram_figure(result, lang=lang), key="lab_diagram", theme=None)
        return
    diagram, where = st.columns([3, 2])
    diagram.plotly_chart(diagram_figure(result, lang=lang), key="lab_diagram", theme=None)
    bars = [(setting_label(result.spec.every_n_layers, result.spec.offload, lang), result)]
    if base is not None and base is not result and base.status == "ok":
        bars.insert(0, (tr("setting.off"), base))
    where.plotly_chart(breakdown_figure(bars, lang=lang, height=380), key="lab_breakdown", theme=None)
    where.caption(tr("lab.breakdown_caption"))
    _render_gradients(result.spec)

    numbers, chart = st.columns([2, 3])
    with numbers:
        _render_metrics(lab)
    with chart:
        st.plotly_chart(comparison_figure(result, base, lang=lang), key="lab_comparison", theme=None)
        st.caption(tr("lab.comparison_caption", provenance=provenance_label(result.provenance, lang)))

    if spec.offload or result.spec.offload:
        memory = result.memory
        if result.spec.offload and not memory.offload_applied:
            st.info(
                tr(
                    "lab.offload_not_applied",
                    device=result.device,
                    mib=mib(memory.offload_bytes),
                    layers=sum(layer.planned == "CP" for layer in result.layers),
                )
            )
        elif memory.offload_applied:
            st.success(tr("lab.offload_moved", mib=mib(memory.offload_bytes)))
    for note in result.notes:
        if note.startswith("PLAN MISMATCH"):
            st.error(note)
        elif "offload" not in note:
            st.caption(note)

    with st.expander(tr("lab.per_layer")):
        st.dataframe(layer_rows(result), hide_index=True)
        st.caption(
            tr(
                "lab.methods",
                memory=method_label(result.memory.method, lang),
                time=method_label(result.timing.method, lang),
            )
        )
    download_json, download_csv, _ = st.columns([1, 1, 3])
    stem = f"ckptlab-{result.model.name.strip('/').replace('/', '_')}-seq{result.spec.seq_len}-{setting_name(result.spec.every_n_layers, result.spec.offload).replace(', ', '-').replace('=', '')}".replace(
        " ", "-"
    )
    download_json.download_button(
        tr("lab.download_json"),
        result.to_json(),
        file_name=f"{stem}.json",
        mime="application/json",
        key="lab_download_json",
        on_click="ignore",
        width="stretch",
    )
    download_csv.download_button(
        tr("lab.download_csv"),
        result_csv(result),
        file_name=f"{stem}.csv",
        mime="text/csv",
        key="lab_download_csv",
        on_click="ignore",
        width="stretch",
    )


def _memory_delta(value: int, reference: int | None) -> dict:
    if reference is None:
        return {}
    diff = value - reference
    if abs(diff) < MIB / 20:
        return {"delta": tr("lab.same_as_off"), "delta_color": "off", "delta_arrow": "off"}
    return {"delta": tr("lab.mib_vs_off", diff=f"{diff / MIB:+,.1f}"), "delta_color": "inverse"}


def _time_delta(value: float, reference: float | None, significant: bool | None) -> dict:
    if reference is None:
        return {}
    diff = f"{(value - reference) * 1000:+,.0f} ms"
    if significant is None:
        return {"delta": tr("lab.too_few_steps", diff=diff), "delta_color": "off", "delta_arrow": "off"}
    if not significant:
        return {"delta": tr("lab.noise", diff=diff), "delta_color": "off", "delta_arrow": "off"}
    return {"delta": tr("lab.vs_off", diff=diff), "delta_color": "inverse"}


def _render_metrics(lab: LabRun) -> None:
    """st.metric figures with deltas against checkpointing off, and what they mean."""
    result, comparison = lab.result, lab.comparison
    memory, timing = result.memory, result.timing
    base = lab.baseline.result if lab.baseline and lab.baseline.result.status == "ok" else None
    if base is result:
        base = None  # checkpointing off: the run is its own baseline, nothing to compare

    def mem(field: str) -> dict:
        return _memory_delta(getattr(memory, field), getattr(base.memory, field) if base else None)

    def time(phase: str) -> dict:
        if base is None:
            return {}
        return _time_delta(
            getattr(timing, f"{phase}_s"), getattr(base.timing, f"{phase}_s"), phase_significant(result, base, phase)
        )

    a, b = st.columns(2)
    a.metric(
        tr("lab.metric_peak"), f"{mib(memory.peak_bytes)} MiB", **mem("peak_bytes"), help=tr("lab.metric_peak_help")
    )
    b.metric(
        tr("lab.metric_resident"),
        f"{mib(memory.after_forward_bytes)} MiB",
        **mem("after_forward_bytes"),
        help=tr("lab.metric_resident_help"),
    )
    a.metric(
        tr("lab.metric_forward"),
        f"{timing.forward_s * 1000:,.0f} ms",
        **time("forward"),
        help=tr("lab.metric_forward_help"),
    )
    b.metric(
        tr("lab.metric_backward"),
        f"{timing.backward_s * 1000:,.0f} ms",
        **time("backward"),
        help=tr("lab.metric_backward_help"),
    )
    a.metric(tr("lab.metric_baseline"), f"{mib(memory.baseline_bytes)} MiB", help=tr("lab.metric_baseline_help"))
    b.metric(tr("lab.metric_step"), f"{timing.step_s * 1000:,.0f} ms", **time("step"), help=tr("lab.metric_step_help"))
    st.markdown(
        tr("lab.peak_reached", where=event_label(memory.peak_where, lang) if "kind" in memory.peak_where else "?")
    )
    if comparison is not None and base is not None:
        if comparison.step_significant is None:
            st.markdown(
                tr("lab.time_too_few", change=f"{(comparison.step_ratio - 1) * 100:+.0f}%", min=MIN_SAMPLES_TO_JUDGE)
            )
        elif comparison.step_significant:
            st.markdown(tr("lab.time_significant", change=f"{(comparison.step_ratio - 1) * 100:+.0f}%"))
        else:
            st.markdown(tr("lab.time_noise", change=f"{(comparison.step_ratio - 1) * 100:+.0f}%"))
        freed = base.memory.after_forward_bytes - memory.after_forward_bytes
        if freed > 0 and comparison.peak_ratio > 0.98:
            st.markdown(tr("lab.freed_not_peak", mib=mib(freed)))
    if lab.baseline is not None and lab.baseline.result.status != "ok":
        st.warning(tr("lab.baseline_no_fit", message=lab.baseline.result.message))
    st.caption(
        tr(
            "lab.medians",
            provenance=provenance_label(result.provenance, lang),
            steps=len(timing.step_samples),
            warmup=result.spec.warmup,
        )
    )


# -- the page: settings -> spec -> URL, then Run, then the result -------------------------

state = st.session_state
if any(key not in state for key in WIDGETS):
    # First run of this session, or back from another page (Streamlit drops widget state then).
    first_spec, state.lab_query_warnings = _initial_spec()
    _load_into_widgets(first_spec)

# The model decides the every_n_layers range, so describe it before drawing the controls.
folders = policy.model_folders()  # what the instructor offers under CKPTLAB_MODELS_ROOT; none when unset
if state.lab_model == LOCAL and state.lab_local_dir not in folders:  # the folder went away since
    state.lab_model, state.lab_local_dir = RunSpec().model, ""
model_name = policy.local_folder(state.lab_local_dir) if state.lab_model == LOCAL else state.lab_model
info: ckptlab.ModelInfo | None = None
model_problem = ""
if state.lab_model != LOCAL:
    info = preset_infos()[model_name]
elif model_name:
    try:
        info = ckptlab.describe(model_name)
    except ckptlab.CkptlabError as error:
        model_problem = _said(error)
    except Exception as error:  # a folder transformers chokes on must not take the page down
        model_problem = tr("lab.cannot_read", model=repr(model_name), error=f"{type(error).__name__}: {error}")
num_layers = info.num_layers if info else max(2, state.lab_n)
if state.lab_n > num_layers:
    state.lab_query_warnings = [
        *state.get("lab_query_warnings", []),
        tr("lab.n_lowered", layers=num_layers, model=model_name),
    ]
    state.lab_n = num_layers

# LoRA's targets are the model's projections: all of them unless the link or the person chose some.
lora_choices: list[str] = []
if info is not None:
    try:
        lora_choices = target_choices(model_name)
    except Exception:  # a model peft cannot adapt: LoRA is offered only where it applies
        lora_choices = []
kept = [name for name in state.lab_lora_targets if name in lora_choices]
if state.get("lab_targets_for") != model_name:  # another model, or "all" from the link: all unless some carry over
    state.lab_lora_targets = kept if kept and state.get("lab_targets_for") is not None else list(lora_choices)
    state.lab_targets_for = model_name
elif len(kept) < len(state.lab_lora_targets):  # names from the link this model does not have
    unknown = ", ".join(name for name in state.lab_lora_targets if name not in lora_choices)
    state.lab_query_warnings = [
        *state.get("lab_query_warnings", []),
        tr("training.lora_targets_unknown", unknown=unknown, model=model_name, choices=", ".join(lora_choices)),
    ]
    state.lab_lora_targets = kept or list(lora_choices)
if not lora_choices:
    state.lab_lora = False

with st.sidebar:
    st.header(tr("common.settings"))
    st.selectbox(
        tr("common.model"),
        [*preset_infos(), *([LOCAL] if folders else [])],
        key="lab_model",
        format_func=_model_label,
        help=tr("lab.model_help"),
    )
    if state.lab_model == LOCAL:
        st.selectbox(tr("lab.folder"), folders, key="lab_local_dir", help=tr("lab.folder_help"))
    elif info:
        st.caption(
            tr(
                "lab.model_caption_positions",
                family=info.family,
                hidden=info.hidden_size,
                positions=f"{info.max_positions:,}",
            )
            if info.max_positions
            else tr("lab.model_caption", family=info.family, hidden=info.hidden_size)
        )
    st.number_input(tr("common.seq_len"), min_value=1, max_value=SEQ_MAX, step=128, key="lab_seq")
    st.number_input(tr("lab.batch"), min_value=1, max_value=BATCH_MAX, step=1, key="lab_batch")
    left, right = st.columns(2)
    left.selectbox("dtype", DTYPES, key="lab_dtype", help=tr("lab.dtype_help"))
    right.selectbox(tr("lab.device"), DEVICES, key="lab_device", help=tr("lab.device_help"))
    st.toggle(tr("lab.checkpointing"), key="lab_ckpt")
    if num_layers > 1:
        st.slider(
            "every_n_layers",
            min_value=1,
            max_value=num_layers,
            key="lab_n",
            disabled=not state.lab_ckpt,
            help=tr("lab.every_n_help"),
        )
    else:
        state.lab_n = 1
        st.caption(tr("lab.one_layer"))
    st.toggle("offload", key="lab_offload", disabled=not state.lab_ckpt, help=tr("lab.offload_help"))
    st.checkbox(
        tr("lab.check_grads"), key="lab_check_grads", disabled=not state.lab_ckpt, help=tr("lab.check_grads_help")
    )
    st.selectbox(
        tr("training.optimizer"),
        OPTIMIZERS,
        key="lab_optimizer",
        format_func=lambda name: tr(f"training.optimizer_{name}"),
        help=tr("training.optimizer_help"),
    )
    st.toggle(tr("training.lora"), key="lab_lora", disabled=not lora_choices, help=tr("training.lora_help"))
    st.number_input(
        tr("training.lora_rank"),
        min_value=1,
        max_value=LORA_RANK_MAX,
        step=1,
        key="lab_lora_rank",
        disabled=not state.lab_lora,
    )
    st.multiselect(
        tr("training.lora_targets"),
        lora_choices,
        key="lab_lora_targets",
        disabled=not state.lab_lora,
        placeholder=tr("training.lora_targets_none"),
        help=tr("training.lora_targets_help"),
    )
    with st.expander(tr("lab.timing")):
        st.number_input(tr("lab.repeats"), min_value=1, max_value=REPEATS_MAX, key="lab_repeats")
        st.number_input(tr("lab.warmup"), min_value=0, max_value=WARMUP_MAX, key="lab_warmup")

checkpointing = state.lab_ckpt
spec = RunSpec(
    model=model_name or "",
    seq_len=int(state.lab_seq),
    batch_size=int(state.lab_batch),
    dtype=state.lab_dtype,
    device=state.lab_device,
    every_n_layers=int(state.lab_n) if checkpointing else None,
    offload=bool(state.lab_offload) and checkpointing,
    repeats=int(state.lab_repeats),
    warmup=int(state.lab_warmup),
    optimizer=state.lab_optimizer,
    lora_rank=int(state.lab_lora_rank) if state.lab_lora else None,
    lora_targets=(
        tuple(name for name in lora_choices if name in state.lab_lora_targets)
        if state.lab_lora and set(state.lab_lora_targets) != set(lora_choices)
        else None
    ),
)
state.lab_saved = spec
# The page owns its settings' keys in the URL; app.py owns ?lang=, which stays.
wanted = {**spec_to_query(spec), **({"lang": st.query_params["lang"]} if "lang" in st.query_params else {})}
if model_name and st.query_params.to_dict() != wanted:
    st.query_params.from_dict(wanted)


st.header(tr("lab.title"), anchor=False)
st.caption(tr("lab.intro"))

if policy_problem is not None:  # the instructor's setting, shown to all: presets and default limits meanwhile
    st.error(tr("lab.policy_problem", problem=_said(policy_problem)))
for warning in state.get("lab_query_warnings", []):
    st.warning(warning)

if model_problem:
    st.error(model_problem)
    st.stop()
if experts_caption(info, lang):
    st.caption(experts_caption(info, lang))

problem = ""
try:
    check(spec)
    on_cpu = resolve_device(spec.device).type == "cpu"
    policy.check(spec, info, on_cpu)
except ckptlab.CkptlabError as error:
    problem, on_cpu = _said(error), True
except Exception as error:  # not bad input but a failure: still a message, not a dead page
    problem, on_cpu = tr("lab.cannot_check", error=f"{type(error).__name__}: {error}"), True

if spec.lora_rank is not None and not state.lab_lora_targets:
    problem = problem or tr("training.lora_targets_needed")
if problem:
    st.error(problem)
elif on_cpu and not info.cpu_ok:
    step_s, run_s = cpu_estimate(spec, info)
    weights_gib = 2 * info.num_params * (2 if spec.dtype in ("bfloat16", "float16") else 4) / GIB
    st.warning(
        tr(
            "lab.meant_for_gpu",
            model=info.name,
            step=_duration(step_s),
            run=_duration(run_s),
            gib=f"{weights_gib:,.1f}",
        )
    )

head, button = st.columns([5, 1], vertical_alignment="center")
head.markdown(
    tr(
        "lab.head",
        model=spec.model,
        seq=f"{spec.seq_len:,}",
        batch=spec.batch_size,
        dtype=spec.dtype,
        device=spec.device,
        setting=setting_label(spec.every_n_layers, spec.offload, lang),
    )
    + f" · {training_label(spec, lang)}"
)
pressed = button.button(tr("lab.run"), type="primary", key="lab_run", disabled=bool(problem), width="stretch")

if pressed and not problem:  # a disabled button is the browser's word; the server checks again
    _run(spec)
elif state.get("lab_cancel"):
    st.info(tr("lab.cancelled"))

error = state.get("lab_error")
if error and error[0] == spec:  # an error belongs to the settings that caused it
    _, message, details = error
    st.error(message)
    if details:
        with st.expander(tr("lab.details")):
            st.code(details, language=None)

lab: LabRun | None = state.get("lab_last")
if spec.offload and on_cpu and not problem and (lab is None or lab.result.spec != spec):
    st.info(tr("lab.offload_cpu"))

try:
    if lab is None:
        if not problem:
            st.plotly_chart(plan_figure(info.num_layers, spec.every_n_layers, lang=lang), key="lab_plan", theme=None)
    else:
        _render_result(lab, spec)
    _render_code(spec)
except Exception as error:  # drawing must never take the page down
    st.error(tr("lab.draw_failed"))
    with st.expander(tr("lab.details")):
        st.code(f"{type(error).__name__}: {error}", language=None)
