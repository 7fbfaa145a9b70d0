"""At scale: a real model size on a GPU you do not have, every checkpointing setting simulated.

A flat page: read the widgets, start a :class:`ckptlab.lab.scalejob.ScaleJob` (the simulations on
a thread, one after another, so the page stays responsive and Stop keeps what is done),
poll it in a fragment with a progress bar, then draw the core's figures from the table
kept in the session. Changing the GPU or the budget only redraws. The shape lives in the
URL, so a link restores it; nothing heavy runs before **Simulate**.
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

import ckptlab
from ckptlab.explore.recommend import GPUS, budget_bytes
from ckptlab.explore.scale import (
    SIMULATION_DTYPES,
    ScaleRequest,
    ScaleTable,
    Setting,
    every_n_choices,
    fits,
    least_recompute_that_fits,
    scale_settings,
)
from ckptlab.lab.query import BATCH_MAX, LORA_RANK_MAX, spec_from_query
from ckptlab.lab.run import lora_target_choices
from ckptlab.lab.scalejob import ScaleJob, remember
from ckptlab.results import RunResult
from ckptlab.show import figures, i18n
from ckptlab.show.breakdown_figures import training_label
from ckptlab.show.experts_words import experts_caption
from ckptlab.show.scale_figures import peak_figure, resident_figure
from ckptlab.show.timeline_figures import event_label, provenance_label
from ckptlab.spec import OPTIMIZERS, RunSpec
from ckptlab.units import GIB
from pages._deep_link import run_through_app

run_through_app()

lang = i18n.normalize(st.session_state.get("app_lang"))
# Every word the page shows, in one place: ckptlab/locales/<lang>.json under "at_scale." (and "scale_figures." for the charts).
TEXT = i18n.section("at_scale", lang)
FIGURE_WORDS = i18n.section("scale_figures", lang)
tr = i18n.translator(lang)  # the training controls' words, shared with the lab page ("training.")

THIN_MARGIN = 0.05  # of the budget: below it, the verdict warns
SEQ_LIMIT = 131_072  # the longest context of the presets (Llama 3.x)
LOCAL = "local"
CUSTOM = "custom"
DEFAULT = RunSpec(model="qwen3-8b", seq_len=8192, batch_size=1, dtype="bfloat16")
DEFAULT_GPU = "H100 80 GB"
WIDGETS = ("at_scale_tiny", "at_scale_model", "at_scale_local_dir", "at_scale_seq", "at_scale_batch", "at_scale_dtype",
           "at_scale_every", "at_scale_offload", "at_scale_gpu", "at_scale_budget_gib", "at_scale_optimizer",
           "at_scale_lora", "at_scale_lora_rank", "at_scale_lora_targets")  # fmt: skip
LORA_RANK_DEFAULT = 16
state = st.session_state


# -- cached core calls --------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def preset_infos() -> dict[str, ckptlab.ModelInfo]:
    """Every preset, described once per process (meta device: nothing allocated)."""
    return {preset.name: ckptlab.describe(preset.name) for preset in ckptlab.list_presets()}


@st.cache_resource(show_spinner=False)
def simulation_cache() -> dict[RunSpec, RunResult]:
    """Simulations by spec, shared by every session: a workshop that asks for the same 8B shape simulates it once."""
    return {}


@st.cache_resource(show_spinner=False, max_entries=64)
def target_choices(model: str) -> list[str]:
    """The projections LoRA can adapt in ``model``, read once per process (meta device)."""
    return lora_target_choices(model)


# -- settings: URL -> session state -> widgets -> request -> URL --------------------------


def _load_into_widgets() -> list[str]:
    """Fill the widgets from the link, or from this session's last settings; returns warnings."""
    saved = state.get("at_scale_saved")
    if saved and not st.query_params:
        for key, value in saved.items():
            state[key] = value
        return []
    params = st.query_params.to_dict()
    spec, warnings = spec_from_query(
        {k: v for k, v in params.items() if k in ("model", "seq", "batch", "dtype", "opt", "lora", "targets")},
        default=DEFAULT,
    )
    state.at_scale_optimizer = spec.optimizer
    state.at_scale_lora = spec.lora_rank is not None
    state.at_scale_lora_rank = spec.lora_rank or LORA_RANK_DEFAULT
    state.at_scale_lora_targets = list(spec.lora_targets or ())
    state.at_scale_targets_for = None if spec.lora_targets is None else spec.model  # None: all, once the model is read
    if spec.seq_len > SEQ_LIMIT:
        warnings.append(TEXT["seq_clamped"].format(seq=spec.seq_len, limit=SEQ_LIMIT))
        spec = replace(spec, seq_len=SEQ_LIMIT)
    infos = preset_infos()
    is_preset = spec.model in infos
    state.at_scale_tiny = is_preset and infos[spec.model].cpu_ok
    state.at_scale_model = spec.model if is_preset else LOCAL
    state.at_scale_local_dir = "" if is_preset else spec.model
    state.at_scale_seq, state.at_scale_batch = spec.seq_len, spec.batch_size
    state.at_scale_dtype = (
        spec.dtype if spec.dtype in SIMULATION_DTYPES else DEFAULT.dtype
    )  # "auto" is bf16, as on a GPU
    state.at_scale_every, state.at_scale_offload = "distinct", "n=1"
    state.at_scale_gpu, state.at_scale_budget_gib = DEFAULT_GPU, 40.0
    gpu = params.get("gpu", "").strip()
    if gpu:
        try:
            state.at_scale_gpu = budget_bytes(gpu)[1]
        except ckptlab.CkptlabError:
            try:
                state.at_scale_gpu, state.at_scale_budget_gib = (
                    CUSTOM,
                    max(float(gpu.lower().removesuffix("gib")), 0.01),
                )
            except ValueError:
                warnings.append(TEXT["gpu_unknown"].format(gpu=gpu, default=DEFAULT_GPU))
    return warnings


def _query(model: str, targets: tuple[str, ...] | None) -> dict[str, str]:
    gpu = f"{state.at_scale_budget_gib:g}GiB" if state.at_scale_gpu == CUSTOM else state.at_scale_gpu
    return {
        "model": model,
        "seq": str(state.at_scale_seq),
        "batch": str(state.at_scale_batch),
        "dtype": state.at_scale_dtype,
        "gpu": gpu,
        "opt": state.at_scale_optimizer,
        "lora": str(state.at_scale_lora_rank) if state.at_scale_lora else "off",
        **({"targets": ",".join(targets)} if state.at_scale_lora and targets else {}),
    }


def _model_label(name: str) -> str:
    if name == LOCAL:
        return TEXT["local_label"]
    info = preset_infos()[name]
    size = f"{info.num_params / 1e9:.1f}B" if info.num_params >= 1e9 else f"{info.num_params / 1e6:.0f}M"
    return f"{name} · {info.num_layers} layers · {size}"


def _duration(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.1f} min"


if any(key not in state for key in WIDGETS):
    # First run of this session, or back from another page (Streamlit drops widget state then).
    state.at_scale_warnings = _load_into_widgets()

with st.sidebar:
    st.header(TEXT["sidebar_model"], anchor=False)
    st.toggle(TEXT["tiny"], key="at_scale_tiny", help=TEXT["tiny_help"])
    names = [name for name, info in preset_infos().items() if state.at_scale_tiny or not info.cpu_ok]
    if state.at_scale_model not in names and state.at_scale_model != LOCAL:
        state.at_scale_model = DEFAULT.model  # tiny presets hidden again
    st.selectbox(TEXT["model"], [*names, LOCAL], key="at_scale_model", format_func=_model_label)
    if state.at_scale_model == LOCAL:
        st.text_input(TEXT["local_dir"], key="at_scale_local_dir", placeholder=TEXT["local_placeholder"])
    model_caption = st.empty()
    st.number_input(TEXT["seq"], min_value=1, max_value=SEQ_LIMIT, step=1024, key="at_scale_seq")
    st.number_input(TEXT["batch"], min_value=1, max_value=BATCH_MAX, step=1, key="at_scale_batch")
    st.selectbox(TEXT["dtype"], SIMULATION_DTYPES, key="at_scale_dtype")
    st.selectbox(
        tr("training.optimizer"),
        OPTIMIZERS,
        key="at_scale_optimizer",
        format_func=lambda name: tr(f"training.optimizer_{name}"),
        help=tr("training.optimizer_help"),
    )
    lora_box = st.container()  # filled once the model is read: its projections are the LoRA targets
    st.radio(
        TEXT["every"],
        tuple(TEXT["every_options"]),
        format_func=TEXT["every_options"].get,
        key="at_scale_every",
        help=TEXT["every_help"],
    )
    st.radio(
        TEXT["offload"],
        tuple(TEXT["offload_options"]),
        format_func=TEXT["offload_options"].get,
        key="at_scale_offload",
        help=TEXT["offload_help"],
    )
    st.header(TEXT["sidebar_gpu"], anchor=False)
    st.selectbox(
        TEXT["gpu"],
        [*GPUS, CUSTOM],
        key="at_scale_gpu",
        format_func=lambda name: TEXT["custom"] if name == CUSTOM else name,
        help=TEXT["gpu_help"],
    )
    if state.at_scale_gpu == CUSTOM:
        st.number_input(
            TEXT["budget_gib"], min_value=0.01, max_value=4096.0, step=1.0, format="%g", key="at_scale_budget_gib"
        )

state.at_scale_saved = {key: state[key] for key in WIDGETS}
model = state.at_scale_local_dir.strip() if state.at_scale_model == LOCAL else state.at_scale_model
if state.at_scale_gpu == CUSTOM:
    budget, budget_label = int(state.at_scale_budget_gib * GIB), f"{state.at_scale_budget_gib:g} GiB"
else:
    budget, budget_label = GPUS[state.at_scale_gpu], state.at_scale_gpu

st.title(TEXT["title"], anchor=False)
st.markdown(TEXT["intro"])
for warning in state.get("at_scale_warnings", []):
    st.warning(warning)

# -- the model and what to simulate -------------------------------------------------------

if not model:
    st.info(TEXT["local_needed"])
    st.stop()
info: ckptlab.ModelInfo | None = preset_infos().get(model)
if info is None:
    try:
        info = ckptlab.describe(model)
    except ckptlab.CkptlabError as error:
        st.error(str(error))
        st.stop()
    except Exception as error:  # a folder transformers chokes on must not take the page down
        st.error(TEXT["model_failed"].format(model=model, error=f"{type(error).__name__}: {error}"))
        st.stop()
positions = f"{info.max_positions:,}" if info.max_positions else "∞"
model_caption.caption(
    TEXT["model_caption"].format(
        family=info.family, layers=info.num_layers, hidden=info.hidden_size, positions=positions
    )
)
if experts_caption(info, lang):
    st.caption(experts_caption(info, lang))

lora_choices: list[str] = []
try:
    lora_choices = target_choices(model)
except Exception:  # a model peft cannot adapt: LoRA is offered only where it applies
    lora_choices = []
kept = [name for name in state.at_scale_lora_targets if name in lora_choices]
if state.get("at_scale_targets_for") != model:  # another model, or "all" from the link
    state.at_scale_lora_targets = kept if kept and state.get("at_scale_targets_for") is not None else lora_choices
    state.at_scale_targets_for = model
elif len(kept) < len(state.at_scale_lora_targets):
    state.at_scale_lora_targets = kept or lora_choices  # names this model does not have
if not lora_choices:
    state.at_scale_lora = False
with lora_box:
    st.toggle(tr("training.lora"), key="at_scale_lora", disabled=not lora_choices, help=tr("training.lora_help"))
    st.number_input(
        tr("training.lora_rank"),
        min_value=1,
        max_value=LORA_RANK_MAX,
        step=1,
        key="at_scale_lora_rank",
        disabled=not state.at_scale_lora,
    )
    st.multiselect(
        tr("training.lora_targets"),
        lora_choices,
        key="at_scale_lora_targets",
        disabled=not state.at_scale_lora,
        placeholder=tr("training.lora_targets_none"),
        help=tr("training.lora_targets_help"),
    )
lora_targets = (
    tuple(name for name in lora_choices if name in state.at_scale_lora_targets)
    if state.at_scale_lora and set(state.at_scale_lora_targets) != set(lora_choices)
    else None
)
if model:
    # Only this page's keys: others in the link (the language, say) stay as they are.
    for name, value in _query(model, lora_targets).items():
        if st.query_params.get(name) != value:
            st.query_params[name] = value
    if "targets" in st.query_params and not lora_targets:
        del st.query_params["targets"]
state.at_scale_saved = {key: state[key] for key in WIDGETS}

request = ScaleRequest(
    model=model,
    seq_len=int(state.at_scale_seq),
    batch_size=int(state.at_scale_batch),
    dtype=state.at_scale_dtype,
    settings=tuple(scale_settings(info.num_layers, state.at_scale_every, state.at_scale_offload)),
    optimizer=state.at_scale_optimizer,
    lora_rank=int(state.at_scale_lora_rank) if state.at_scale_lora else None,
    lora_targets=lora_targets,
)
problem = ""
if state.at_scale_lora and not state.at_scale_lora_targets:
    problem = tr("training.lora_targets_needed")
try:
    if not problem:
        request.check(info)
except ckptlab.CkptlabError as error:
    problem = str(error)

if problem:
    st.error(problem)
else:
    cache = simulation_cache()
    known = sum(request.spec(setting) in cache for setting in request.settings)
    chosen = len(every_n_choices(info.num_layers, state.at_scale_every))
    which = (
        TEXT["plan_all"].format(layers=info.num_layers)
        if state.at_scale_every == "all"
        else TEXT["plan_distinct"].format(chosen=chosen, layers=info.num_layers)
    )
    keys = [setting.key for setting in request.settings]
    keys = ", ".join(keys if len(keys) <= 14 else [*keys[:4], "…", *keys[-2:]])
    st.markdown(
        TEXT["plan"].format(count=len(request.settings), keys=keys, which=which)
        + (TEXT["plan_known"].format(known=known) if known else "")
    )


def _start() -> None:
    cache = simulation_cache()
    try:
        job = ScaleJob(request, known=cache, on_result=lambda result: remember(cache, result), info=info)
    except ckptlab.CkptlabError as error:
        state.at_scale_error = str(error)
        return
    state.at_scale_error = ""
    state.at_scale_job = job.start()


def _stop() -> None:
    job = state.get("at_scale_job")
    if job is not None:
        job.stop()


job: ScaleJob | None = state.get("at_scale_job")
running = job is not None and job.state().running
start, stop, _ = st.columns([1, 1, 4])
start.button(
    TEXT["simulate"],
    type="primary",
    key="at_scale_run",
    on_click=_start,
    disabled=running or bool(problem),
    width="stretch",
)
stop.button(TEXT["stop"], key="at_scale_stop", on_click=_stop, disabled=not running, width="stretch")
if state.get("at_scale_error"):
    st.error(TEXT["failed"].format(error=state.at_scale_error))


@st.fragment(run_every=0.5 if running else None)
def _progress() -> None:
    """While the job runs: a bar that moves with each simulation; when it ends, one full rerun to draw."""
    job = state.get("at_scale_job")
    if job is None:
        return
    snapshot = job.state()
    if snapshot.running:
        total = len(job.request.settings)
        words = (
            TEXT["stopping"]
            if snapshot.stop_requested
            else TEXT["progress"].format(done=len(snapshot.results), total=total, message=snapshot.message)
        )
        st.progress(min(max(snapshot.fraction, 0.0), 1.0), text=words)
        return
    if state.get("at_scale_shown") is not job:
        state.at_scale_shown = job
        if snapshot.table is not None:
            state.at_scale_table = snapshot.table
        if snapshot.error:
            state.at_scale_error = snapshot.error
        st.rerun()


_progress()

table: ScaleTable | None = state.get("at_scale_table")
if table is None:
    if not running and not problem:  # with a problem the error above says what to change
        st.info(TEXT["press"])
    st.stop()

# -- the result: everything below only draws ----------------------------------------------


def _summary(table: ScaleTable) -> str:
    seconds = list(table.seconds.values())
    each = TEXT["each"].format(low=min(seconds), high=max(seconds)) if seconds else ""
    reused = len(table.results) - len(seconds)
    return (
        TEXT["summary"]
        .format(
            provenance=provenance_label(table.results[0], lang) if table.results else TEXT["simulated"],
            model=table.request.model,
            layers=table.num_layers,
            count=len(table.results),
            elapsed=_duration(table.elapsed_s),
            each=each,
            reused=TEXT["reused"].format(count=reused) if reused else "",
        )
        .replace(" ()", "")
    )


def _verdict(table: ScaleTable) -> RunResult | None:
    """Say which setting fits with the least recompute, or by how much nothing does; return the one to draw."""
    best = least_recompute_that_fits(table, budget)
    if best is not None:
        setting = Setting.of(best.spec)
        peak, margin = best.memory.peak_bytes / GIB, (budget - best.memory.peak_bytes) / GIB
        if setting.every_n_layers is None:
            words = TEXT["fits_off"].format(budget=budget_label, peak=peak, margin=margin)
        else:
            words = TEXT["fits"].format(
                setting=setting.key,
                budget=budget_label,
                peak=peak,
                margin=margin,
                cp=setting.cp_layers(table.num_layers),
                layers=table.num_layers,
            )
        st.success(words + (TEXT["thin"] if margin * GIB < THIN_MARGIN * budget else ""))
        return best
    lowest = min(table.results, key=lambda result: result.memory.peak_bytes)
    st.error(
        TEXT["no_fit"].format(
            budget=budget_label,
            peak=lowest.memory.peak_bytes / GIB,
            setting=Setting.of(lowest.spec).key,
            short=(lowest.memory.peak_bytes - budget) / GIB,
        )
    )
    return lowest


def _rows(table: ScaleTable) -> list[dict]:
    rows = [
        {
            TEXT["col_setting"]: (setting := Setting.of(result.spec)).key,
            TEXT["col_cp"]: setting.cp_layers(table.num_layers),
            TEXT["col_peak"]: round(result.memory.peak_bytes / GIB, 2),
            TEXT["col_fits"].format(budget=budget_label): TEXT["yes"] if fits(result, budget) else TEXT["no"],
            TEXT["col_margin"]: round((budget - result.memory.peak_bytes) / GIB, 2),
            TEXT["col_resident"]: round(result.memory.after_forward_bytes / GIB, 3),
            TEXT["col_host"]: round(result.memory.host_offload_bytes / GIB, 3),
            TEXT["col_where"]: event_label(result.memory.peak_where, lang)
            if "kind" in result.memory.peak_where
            else "",
            TEXT["col_seconds"]: round(table.seconds[setting.key], 1) if setting.key in table.seconds else None,
        }
        for result in table.results
    ]
    if not table.seconds:  # every result reused: no times to show
        rows = [{key: value for key, value in row.items() if key != TEXT["col_seconds"]} for row in rows]
    return rows


shown = table.request
if shown != request:
    st.info(TEXT["changed"].format(model=shown.model, seq=shown.seq_len, batch=shown.batch_size, dtype=shown.dtype))
if table.cancelled:
    st.warning(TEXT["stopped"].format(done=len(table.results), total=len(shown.settings)))
if not table.results:
    st.stop()
st.caption(_summary(table))

try:
    pick = _verdict(table)
    st.caption(TEXT["optimizer"].format(training=training_label(table.results[0].spec, lang)))
    # The drawn setting follows the verdict whenever the table or the budget changes; the person may pick another.
    keys = [setting.key for setting in table.settings]
    if state.get("at_scale_show_for") != (id(table), budget) or state.get("at_scale_show") not in keys:
        state.at_scale_show_for = (id(table), budget)
        state.at_scale_show = Setting.of(pick.spec).key
    selected = next(setting for setting in table.settings if setting.key == state.at_scale_show)

    st.subheader(TEXT["peak_header"], anchor=False)
    st.plotly_chart(
        peak_figure(table, budget, budget_label, selected=selected, words=FIGURE_WORDS), key="at_scale_peak", theme=None
    )
    st.subheader(TEXT["resident_header"], anchor=False)
    st.plotly_chart(resident_figure(table, selected=selected, words=FIGURE_WORDS), key="at_scale_resident", theme=None)
    st.caption(TEXT["resident_caption"])

    st.subheader(TEXT["diagram_header"], anchor=False)
    st.selectbox(TEXT["show"], keys, key="at_scale_show")
    st.plotly_chart(figures.diagram_figure(table.result_for(selected), lang=lang), key="at_scale_diagram", theme=None)

    st.subheader(TEXT["table_header"], anchor=False)
    rows = _rows(table)
    st.dataframe(
        rows, hide_index=True, key="at_scale_table_view", height=min(36 * (len(rows) + 1) + 4, 720)
    )  # all rows, no inner scroll
except Exception as error:  # drawing must never take the page down
    st.error(TEXT["draw_failed"])
    with st.expander(TEXT["details"]):
        st.code(f"{type(error).__name__}: {error}", language=None)
