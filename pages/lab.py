"""The lab: pick a model and a checkpointing setting, press Run, see what each layer kept and what it cost.

A flat page: read the widgets, call ``ckptlab.labrun.run_queued`` once, render. The
settings live in the URL, so a link restores them; nothing heavy runs before Run.
"""

from __future__ import annotations

import streamlit as st
import torch

import ckptlab
from ckptlab import figures, snippets
from ckptlab.export import layer_rows, result_csv
from ckptlab.labquery import BATCH_MAX, REPEATS_MAX, SEQ_MAX, WARMUP_MAX, spec_from_query, spec_to_query
from ckptlab.labrun import LabRun, Measured, build_for_key, check, cpu_estimate, phase_significant, run_queued
from ckptlab.measure import resolve_device
from ckptlab.report import MIB, mib, setting_name
from ckptlab.results import DTYPES, MIN_SAMPLES_TO_JUDGE, RunSpec

LOCAL = "local directory"
DEVICES = ("auto", "cpu", "cuda") if torch.cuda.is_available() else ("auto", "cpu")
WIDGETS = ("lab_model", "lab_local_dir", "lab_seq", "lab_batch", "lab_dtype", "lab_device", "lab_ckpt", "lab_n", "lab_offload", "lab_repeats", "lab_warmup")


# -- cached core calls --------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def preset_infos() -> dict[str, ckptlab.ModelInfo]:
    """Every preset, described once per process (meta device: no weights allocated)."""
    return {preset.name: ckptlab.describe(preset.name) for preset in ckptlab.list_presets()}


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
    state.lab_model = spec.model if is_preset else LOCAL
    state.lab_local_dir = "" if is_preset else spec.model
    state.lab_seq, state.lab_batch = spec.seq_len, spec.batch_size
    state.lab_dtype, state.lab_device = spec.dtype, spec.device
    state.lab_ckpt = spec.every_n_layers is not None
    state.lab_n = spec.every_n_layers or 1
    state.lab_offload = spec.offload
    state.lab_repeats, state.lab_warmup = spec.repeats, spec.warmup


def _model_label(name: str) -> str:
    if name == LOCAL:
        return "Local directory…"
    info = preset_infos()[name]
    group = "tiny" if info.cpu_ok else "real shape"
    size = f"{info.num_params / 1e9:.1f}B" if info.num_params >= 1e9 else f"{info.num_params / 1e6:.0f}M"
    return f"{group} · {name} · {info.num_layers} layers · {size}"


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
    with st.status("Waiting for the device…", expanded=True) as status:
        bar = st.progress(0.0, text="queued")

        def progress(message: str, fraction: float) -> None:
            fraction = min(max(fraction, 0.0), 1.0)
            status.update(label=f"Running ({fraction:.0%}): {message}")
            bar.progress(fraction, text=message)

        def on_wait(ahead: int) -> None:
            status.update(label=f"Waiting for the device: {ahead} run{'s' if ahead != 1 else ''} ahead of yours")

        try:
            lab = run_queued(spec, load=cached_model, progress=progress, on_wait=on_wait)
        except ckptlab.CkptlabError as error:
            status.update(label="Could not run", state="error", expanded=False)
            state.lab_error = (spec, str(error), None)
            return
        except Exception as error:  # a bug, not bad input: say so briefly, keep the page alive
            status.update(label="The run failed", state="error", expanded=False)
            state.lab_error = (spec, "The run failed unexpectedly. The lab keeps working; other settings may run.", f"{type(error).__name__}: {error}")
            return
        if lab.run.reused and (lab.baseline is None or lab.baseline.reused):
            label = f"Reused from a run at {_clock(lab.run)}: same settings, no new measurement"
        else:
            waited = f" (waited {lab.wait_s:.1f} s for the device)" if lab.wait_s >= 0.5 else ""
            label = f"Measured in {lab.elapsed_s:.1f} s{waited}"
        status.update(label=label, state="complete", expanded=False)
        state.lab_last = lab


def _render_code(spec: RunSpec) -> None:
    """The transformers lines for the current settings (not the last run's)."""
    st.subheader("The code", anchor=False)
    st.caption("On a model")
    st.code(snippets.model_snippet(spec.every_n_layers, spec.offload), language="python")
    st.caption("With the Trainer")
    st.code(snippets.trainer_snippet(spec.every_n_layers, spec.offload), language="python")


def _render_result(lab: LabRun, spec: RunSpec) -> None:
    """The last run: diagram, measurements against checkpointing off, notes, downloads."""
    result = lab.result
    base = lab.baseline.result if lab.baseline else None
    if result.spec != spec:
        st.info(f"The settings changed since this run. Shown: {result.model.name} · seq {result.spec.seq_len:,} · batch {result.spec.batch_size} · {setting_name(result.spec.every_n_layers, result.spec.offload)}. Press **Run** to measure the new ones.")
    when = f"reused from a run at {_clock(lab.run)}" if lab.run.reused else f"measured at {_clock(lab.run)}"
    st.caption(f"{result.provenance.label} · {when}")
    if result.status != "ok":
        st.error(result.message)
        st.plotly_chart(figures.diagram_figure(result), key="lab_diagram", theme=None)
        return
    st.plotly_chart(figures.diagram_figure(result), key="lab_diagram", theme=None)

    numbers, chart = st.columns([2, 3])
    with numbers:
        _render_metrics(lab)
    with chart:
        st.plotly_chart(figures.comparison_figure(result, base), key="lab_comparison", theme=None)
        st.caption(f"{result.provenance.label} · same model, shape and inputs with checkpointing off")

    if spec.offload or result.spec.offload:
        memory = result.memory
        if result.spec.offload and not memory.offload_applied:
            st.info(
                f"**offload did not apply here ({result.device}).** On a GPU it would move **{mib(memory.offload_bytes)} MiB** "
                f"off the device: the inputs the {sum(layer.planned == 'CP' for layer in result.layers)} checkpointed "
                "layers keep, copied to pinned host memory in the forward and back in the backward (a slower step). "
                "On the CPU those inputs already live in host memory, so there is nothing to move."
            )
        elif memory.offload_applied:
            st.success(f"offload moved {mib(memory.offload_bytes)} MiB of checkpointed inputs to pinned host memory.")
    for note in result.notes:
        if note.startswith("PLAN MISMATCH"):
            st.error(note)
        elif "offload" not in note:
            st.caption(note)

    with st.expander("Per layer, and how it was measured"):
        st.dataframe(layer_rows(result), hide_index=True)
        st.caption(f"Memory: {result.memory.method}. Time: {result.timing.method}.")
    download_json, download_csv, _ = st.columns([1, 1, 3])
    stem = f"ckptlab-{result.model.name.strip('/').replace('/', '_')}-seq{result.spec.seq_len}-{setting_name(result.spec.every_n_layers, result.spec.offload).replace(', ', '-').replace('=', '')}".replace(" ", "-")
    download_json.download_button("Result as JSON", result.to_json(), file_name=f"{stem}.json", mime="application/json", key="lab_download_json", on_click="ignore", width="stretch")
    download_csv.download_button("Result as CSV", result_csv(result), file_name=f"{stem}.csv", mime="text/csv", key="lab_download_csv", on_click="ignore", width="stretch")


def _memory_delta(value: int, reference: int | None) -> dict:
    if reference is None:
        return {}
    diff = value - reference
    if abs(diff) < MIB / 20:
        return {"delta": "same as off", "delta_color": "off", "delta_arrow": "off"}
    return {"delta": f"{diff / MIB:+,.1f} MiB vs off", "delta_color": "inverse"}


def _time_delta(value: float, reference: float | None, significant: bool | None) -> dict:
    if reference is None:
        return {}
    diff = f"{(value - reference) * 1000:+,.0f} ms"
    if significant is None:
        return {"delta": f"{diff} · too few steps", "delta_color": "off", "delta_arrow": "off"}
    if not significant:
        return {"delta": f"{diff} · noise", "delta_color": "off", "delta_arrow": "off"}
    return {"delta": f"{diff} vs off", "delta_color": "inverse"}


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
        return _time_delta(getattr(timing, f"{phase}_s"), getattr(base.timing, f"{phase}_s"), phase_significant(result, base, phase))

    a, b = st.columns(2)
    a.metric("Peak memory", f"{mib(memory.peak_bytes)} MiB", **mem("peak_bytes"), help="Highest total over the step, parameters included.")
    b.metric("Resident after forward", f"{mib(memory.after_forward_bytes)} MiB", **mem("after_forward_bytes"), help="Activations held for the backward, above the baseline.")
    a.metric("Forward", f"{timing.forward_s * 1000:,.0f} ms", **time("forward"), help="Median, loss included.")
    b.metric("Backward", f"{timing.backward_s * 1000:,.0f} ms", **time("backward"), help="Median; checkpointed layers rerun their forward here.")
    a.metric("Baseline", f"{mib(memory.baseline_bytes)} MiB", help="Held before the forward: parameters and buffers.")
    b.metric("Step", f"{timing.step_s * 1000:,.0f} ms", **time("step"), help="Median of forward + backward.")
    st.markdown(f"**Peak reached in:** {memory.peak_where.get('description', 'unknown')}")
    if comparison is not None and base is not None:
        if comparison.step_significant is None:
            st.markdown(
                f"**Time:** {(comparison.step_ratio - 1) * 100:+.0f}% from fewer than {MIN_SAMPLES_TO_JUDGE} timed steps "
                "a run: too few to tell an effect from noise. Raise the repeats under Timing."
            )
        elif comparison.step_significant:
            st.markdown(f"**Time:** {comparison.describe_step()}.")
        else:
            st.markdown(
                f"**Time:** the step-time difference ({(comparison.step_ratio - 1) * 100:+.0f}%) is within the spread "
                "of the repeats: not a measurable effect here. More repeats or a longer sequence make it measurable."
            )
        freed = base.memory.after_forward_bytes - memory.after_forward_bytes
        if freed > 0 and comparison.peak_ratio > 0.98:
            st.markdown(
                f"**Freed after the forward, not at the peak:** checkpointing freed {mib(freed)} MiB of activations, "
                "but the peak sits where checkpointing does not reach (see above). A longer sequence moves it."
            )
    if lab.baseline is not None and lab.baseline.result.status != "ok":
        st.warning(f"**Without checkpointing it does not fit:** {lab.baseline.result.message}")
    st.caption(f"{result.provenance.label} · medians of {len(timing.step_samples)} steps after {result.spec.warmup} warm-up")


# -- the page: settings -> spec -> URL, then Run, then the result -------------------------

state = st.session_state
if any(key not in state for key in WIDGETS):
    # First run of this session, or back from another page (Streamlit drops widget state then).
    first_spec, state.lab_query_warnings = _initial_spec()
    _load_into_widgets(first_spec)

# The model decides the every_n_layers range, so describe it before drawing the controls.
model_name = state.lab_local_dir.strip() if state.lab_model == LOCAL else state.lab_model
info: ckptlab.ModelInfo | None = None
model_problem = ""
if state.lab_model != LOCAL:
    info = preset_infos()[model_name]
elif model_name:
    try:
        info = ckptlab.describe(model_name)
    except ckptlab.CkptlabError as error:
        model_problem = str(error)
    except Exception as error:  # a folder transformers chokes on must not take the page down
        model_problem = f"Could not read {model_name!r} as a transformers model: {type(error).__name__}: {error}"
num_layers = info.num_layers if info else max(2, state.lab_n)
if state.lab_n > num_layers:
    state.lab_query_warnings = [*state.get("lab_query_warnings", []), f"every_n_layers lowered to {num_layers}: {model_name} has {num_layers} layers."]
    state.lab_n = num_layers

with st.sidebar:
    st.header("Settings")
    st.selectbox("Model", [*preset_infos(), LOCAL], key="lab_model", format_func=_model_label, help="Tiny presets run in seconds on a CPU; real shapes have published dimensions and random weights.")
    if state.lab_model == LOCAL:
        st.text_input("Folder with config.json", key="lab_local_dir", placeholder="/path/to/saved/model")
    elif info:
        st.caption(f"{info.family} · hidden {info.hidden_size} · up to {info.max_positions:,} tokens" if info.max_positions else f"{info.family} · hidden {info.hidden_size}")
    st.number_input("Sequence length (tokens)", min_value=1, max_value=SEQ_MAX, step=128, key="lab_seq")
    st.number_input("Batch size", min_value=1, max_value=BATCH_MAX, step=1, key="lab_batch")
    left, right = st.columns(2)
    left.selectbox("dtype", DTYPES, key="lab_dtype", help="auto: float32 on the CPU, bfloat16 on CUDA")
    right.selectbox("Device", DEVICES, key="lab_device", help="auto: CUDA when there is one")
    st.toggle("Activation checkpointing", key="lab_ckpt")
    if num_layers > 1:
        st.slider("every_n_layers", min_value=1, max_value=num_layers, key="lab_n", disabled=not state.lab_ckpt, help="Layer i (0-based) is checkpointed when i % n == 0: 1 checkpoints all, 2 every other layer.")
    else:
        state.lab_n = 1
        st.caption("every_n_layers = 1 (the model has one layer)")
    st.toggle("offload", key="lab_offload", disabled=not state.lab_ckpt, help="Keep the checkpointed inputs in pinned host memory instead of GPU memory (CUDA only).")
    with st.expander("Timing"):
        st.number_input("Timed repeats", min_value=1, max_value=REPEATS_MAX, key="lab_repeats")
        st.number_input("Warm-up steps", min_value=0, max_value=WARMUP_MAX, key="lab_warmup")

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
)
state.lab_saved = spec
if model_name and st.query_params.to_dict() != spec_to_query(spec):
    st.query_params.from_dict(spec_to_query(spec))


st.header("Activation checkpointing, measured", anchor=False)
st.caption("Pick a model and a setting, press **Run**: the lab runs real training steps and shows what each layer kept, what the backward reran, and what that cost.")

for warning in state.get("lab_query_warnings", []):
    st.warning(warning)

if state.lab_model == LOCAL and not model_name:
    st.info("Enter the path of a folder saved with `save_pretrained()` (it must hold a config.json), or pick a preset.")
    st.stop()
if model_problem:
    st.error(model_problem)
    st.stop()

problem = ""
try:
    check(spec)
    on_cpu = resolve_device(spec.device).type == "cpu"
except ckptlab.CkptlabError as error:
    problem, on_cpu = str(error), True
except Exception as error:  # not bad input but a failure: still a message, not a dead page
    problem, on_cpu = f"These settings cannot be checked: {type(error).__name__}: {error}", True

if problem:
    st.error(problem)
elif on_cpu and not info.cpu_ok:
    step_s, run_s = cpu_estimate(spec, info)
    weights_gib = 2 * info.num_params * (2 if spec.dtype in ("bfloat16", "float16") else 4) / 2**30
    st.warning(
        f"**{info.name} is meant for a GPU.** On this CPU a step takes about {_duration(step_s)} and this Run "
        f"(warm-up, repeats, memory step, checkpointing-off baseline) about {_duration(run_s)}, while every other "
        f"participant's run waits; its parameters and gradients alone need {weights_gib:,.1f} GiB of RAM. "
        "Predicted from 6 × parameters × tokens, not measured. A shorter sequence and fewer repeats make it quicker."
    )

head, button = st.columns([5, 1], vertical_alignment="center")
head.markdown(f"**{spec.model}** · seq {spec.seq_len:,} · batch {spec.batch_size} · {spec.dtype} · {spec.device} · **{setting_name(spec.every_n_layers, spec.offload)}**")
pressed = button.button("Run", type="primary", key="lab_run", disabled=bool(problem), width="stretch")

if pressed:
    _run(spec)

error = state.get("lab_error")
if error and error[0] == spec:  # an error belongs to the settings that caused it
    _, message, details = error
    st.error(message)
    if details:
        with st.expander("Details"):
            st.code(details, language=None)

lab: LabRun | None = state.get("lab_last")
if spec.offload and on_cpu and not problem and (lab is None or lab.result.spec != spec):
    st.info(
        "**offload does not apply on the CPU.** It moves the inputs that checkpointed layers keep from GPU memory "
        "to pinned host memory, and on the CPU they already live in host memory (transformers' "
        "`save_on_cpu(pin_memory=True)` needs an accelerator). The Run checkpoints without offload and tells how many "
        "bytes offload would move off a GPU."
    )

try:
    if lab is None:
        if not problem:
            st.plotly_chart(figures.plan_figure(info.num_layers, spec.every_n_layers), key="lab_plan", theme=None)
    else:
        _render_result(lab, spec)
    _render_code(spec)
except Exception as error:  # drawing must never take the page down
    st.error("Could not draw this result. The lab keeps working; press Run again or change a setting.")
    with st.expander("Details"):
        st.code(f"{type(error).__name__}: {error}", language=None)
