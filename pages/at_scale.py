"""At scale: a real model size on a GPU you do not have, every checkpointing setting simulated.

A flat page: read the widgets, start a :class:`ckptlab.lab.scalejob.ScaleJob` (the simulations on
a thread, one after another, so the page stays responsive and Stop keeps what is done) or a
:class:`~ckptlab.lab.scalejob.SearchJob` (the fewest GPUs that fit), poll it in a fragment with a
progress bar, then draw the core's figures from what is kept in the session. Past one GPU each
setting is simulated under FSDP2 (rank 0's memory). Changing the GPU or the budget only redraws.
The shape lives in the URL, so a link restores it; nothing heavy runs before a button.
Words, rows and verdicts come from :mod:`ckptlab.lab.scalepage`.
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

import ckptlab
from ckptlab.explore.gpu_search import GPU_COUNTS, GpuSearch
from ckptlab.explore.recommend import GPUS, budget_bytes
from ckptlab.explore.scale import SIMULATION_DTYPES, ScaleRequest, ScaleTable, Setting, every_n_choices, scale_settings
from ckptlab.lab import scalepage
from ckptlab.lab.query import BATCH_MAX, LORA_RANK_MAX, gpus_from_query, spec_from_query
from ckptlab.lab.run import lora_target_choices
from ckptlab.lab.scalejob import ScaleJob, SearchJob, remember
from ckptlab.results import RunResult
from ckptlab.show import i18n
from ckptlab.show.experts_words import experts_caption
from ckptlab.show.figures.diagram import diagram_figure
from ckptlab.show.figures.scale import resident_figure, scale_peak_figure
from ckptlab.show.labels import training_label
from ckptlab.show.wording import app_message
from ckptlab.spec import OPTIMIZERS, RunSpec
from ckptlab.units import GIB
from pages._deep_link import run_through_app
from pages._server import offered_folder, server_policy

run_through_app()

lang = i18n.normalize(st.session_state.get("app_lang"))
# Every word the page shows, in one place: ckptlab/locales/<lang>.json under "at_scale." (and "scale_figures." for the charts).
TEXT = i18n.section("at_scale", lang)
policy, _ = server_policy()  # the lab page shows a bad setting; here the safe default applies quietly
tr = i18n.translator(lang)  # the training controls' words, shared with the lab page ("training.")

SEQ_LIMIT = 131_072  # the longest context of the presets (Llama 3.x)
LOCAL = "local"
CUSTOM = "custom"
DEFAULT = RunSpec(model="qwen3-8b", seq_len=8192, batch_size=1, dtype="bfloat16")
DEFAULT_GPU = "H100 80 GB"
WIDGETS = ("at_scale_tiny", "at_scale_model", "at_scale_local_dir", "at_scale_seq", "at_scale_batch", "at_scale_dtype",
           "at_scale_every", "at_scale_offload", "at_scale_gpu", "at_scale_gpus", "at_scale_budget_gib", "at_scale_optimizer",
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
    state.at_scale_gpus, gpu_warnings = gpus_from_query(params.get("gpus", "1"), GPU_COUNTS)
    warnings += gpu_warnings
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
    folder, why_not = ("", "") if is_preset else offered_folder(policy, spec.model, lang)
    if why_not:  # a link to a folder this server does not offer: the default preset
        warnings.append(why_not)
        spec, is_preset = replace(spec, model=DEFAULT.model), True
    state.at_scale_tiny = is_preset and infos[spec.model].cpu_ok
    state.at_scale_model = spec.model if is_preset else LOCAL
    state.at_scale_local_dir = folder
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
        "gpus": str(state.at_scale_gpus),
        "opt": state.at_scale_optimizer,
        "lora": str(state.at_scale_lora_rank) if state.at_scale_lora else "off",
        **({"targets": ",".join(targets)} if state.at_scale_lora and targets else {}),
    }


if any(key not in state for key in WIDGETS):
    # First run of this session, or back from another page (Streamlit drops widget state then).
    state.at_scale_warnings = _load_into_widgets()
folders = policy.model_folders()  # what the instructor offers under CKPTLAB_MODELS_ROOT; none when unset
if state.at_scale_model == LOCAL and state.at_scale_local_dir not in folders:  # the folder went away since
    state.at_scale_model, state.at_scale_local_dir = DEFAULT.model, ""

with st.sidebar:
    st.header(TEXT["sidebar_model"], anchor=False)
    st.toggle(TEXT["tiny"], key="at_scale_tiny", help=TEXT["tiny_help"])
    names = [name for name, info in preset_infos().items() if state.at_scale_tiny or not info.cpu_ok]
    if state.at_scale_model not in names and state.at_scale_model != LOCAL:
        state.at_scale_model = DEFAULT.model  # tiny presets hidden again
    st.selectbox(
        TEXT["model"],
        [*names, *([LOCAL] if folders else [])],
        key="at_scale_model",
        format_func=lambda name: (
            TEXT["local_label"] if name == LOCAL else scalepage.model_label(name, preset_infos()[name])
        ),
    )
    if state.at_scale_model == LOCAL:
        st.selectbox(TEXT["local_dir"], folders, key="at_scale_local_dir", help=i18n.t("lab.folder_help", lang))
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
    st.selectbox(TEXT["gpus"], GPU_COUNTS, key="at_scale_gpus", help=TEXT["gpus_help"])

state.at_scale_saved = {key: state[key] for key in WIDGETS}
model = policy.local_folder(state.at_scale_local_dir) if state.at_scale_model == LOCAL else state.at_scale_model
if state.at_scale_gpu == CUSTOM:
    budget, budget_label = int(state.at_scale_budget_gib * GIB), f"{state.at_scale_budget_gib:g} GiB"
else:
    budget, budget_label = GPUS[state.at_scale_gpu], state.at_scale_gpu

st.title(TEXT["title"], anchor=False)
st.markdown(TEXT["intro"])
for warning in state.get("at_scale_warnings", []):
    st.warning(warning)

# -- the model and what to simulate -------------------------------------------------------

info: ckptlab.ModelInfo | None = preset_infos().get(model)
if info is None:
    try:
        info = ckptlab.describe(model)
    except ckptlab.CkptlabError as error:
        st.error(app_message(error, lang))
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
    world_size=int(state.at_scale_gpus),
)
problem = ""
if state.at_scale_lora and not state.at_scale_lora_targets:
    problem = tr("training.lora_targets_needed")
try:
    if not problem:
        request.check(info)
except ckptlab.CkptlabError as error:
    problem = app_message(error, lang)

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
        job = ScaleJob(
            request, known=cache, on_result=lambda r: remember(cache, r), info=info, limit_s=policy.run_limit_s
        )
    except ckptlab.CkptlabError as error:
        state.at_scale_error = app_message(error, lang)
        return
    state.at_scale_error = ""
    state.at_scale_job = job.start()


def _search() -> None:
    cache = simulation_cache()
    try:
        job = SearchJob(
            replace(request, world_size=1),
            budget,
            known=cache,
            on_result=lambda r: remember(cache, r),
            info=info,
            limit_s=policy.run_limit_s,
        )
    except ckptlab.CkptlabError as error:
        state.at_scale_error = app_message(error, lang)
        return
    state.at_scale_error = ""
    state.at_scale_job = job.start()


def _stop() -> None:
    job = state.get("at_scale_job")
    if job is not None:
        job.stop()


job: ScaleJob | None = state.get("at_scale_job")
running = job is not None and job.state().running
start, search, stop, _ = st.columns([1, 1, 1, 3])
start.button(
    TEXT["simulate"],
    type="primary",
    key="at_scale_run",
    on_click=_start,
    disabled=running or bool(problem),
    width="stretch",
)
search.button(
    TEXT["search"],
    key="at_scale_search",
    on_click=_search,
    disabled=running or bool(problem),
    help=TEXT["search_help"],
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
        if snapshot.stop_requested:
            words = TEXT["stopping"]
        elif isinstance(job, SearchJob):
            words = TEXT["searching"].format(done=len(snapshot.results), message=snapshot.message)
        else:
            total = len(job.request.settings)
            words = TEXT["progress"].format(done=len(snapshot.results), total=total, message=snapshot.message)
        st.progress(min(max(snapshot.fraction, 0.0), 1.0), text=words)
        return
    if state.get("at_scale_shown") is not job:
        state.at_scale_shown = job
        if snapshot.table is not None:
            state.at_scale_table = snapshot.table
        if snapshot.search is not None:
            state.at_scale_found = snapshot.search
        if snapshot.error:
            state.at_scale_error = app_message(snapshot.failure, lang) if snapshot.failure else snapshot.error
        st.rerun()


_progress()

found: GpuSearch | None = state.get("at_scale_found")
if found is not None:
    st.subheader(TEXT["search_header"], anchor=False)
    if not scalepage.search_is_for(found, request, budget):
        st.info(TEXT["search_changed"])
    answer = scalepage.search_verdict(found, budget_label, TEXT)
    getattr(st, answer.kind)(answer.text)
    code = found.code()
    if code is not None:
        launch, setup = st.columns(2)
        launch.caption(TEXT["code_launch"])
        launch.code(
            f"{code.launch}\n\n# {TEXT['code_ckptlab']}\n{code.ckptlab_launch}", language="bash", wrap_lines=True
        )
        launch.caption(TEXT["code_trainer"])
        launch.code(code.trainer_code, language="python", wrap_lines=True)
        setup.caption(TEXT["code_model"] if found.gpus == 1 else TEXT["code_fsdp"])
        setup.code(code.model_code, language="python", wrap_lines=True)

table: ScaleTable | None = state.get("at_scale_table")
if table is None:
    if not running and not problem and found is None:  # with a problem the error above says what to change
        st.info(TEXT["press"])
    st.stop()

# -- the result: everything below only draws ----------------------------------------------


shown = table.request
if shown != request:
    st.info(
        TEXT["changed"].format(
            model=shown.model,
            seq=shown.seq_len,
            batch=shown.batch_size,
            dtype=shown.dtype,
            gpus=scalepage.gpus_label(shown.world_size, TEXT),
        )
    )
if table.cancelled:
    st.warning(TEXT["stopped"].format(done=len(table.results), total=len(shown.settings)))
if not table.results:
    st.stop()
st.caption(scalepage.summary(table, TEXT, lang))

try:
    verdict = scalepage.verdict(table, budget, budget_label, TEXT)
    getattr(st, verdict.kind)(verdict.text)
    pick = verdict.result
    st.caption(TEXT["optimizer"].format(training=training_label(table.results[0].spec, lang)))
    # The drawn setting follows the verdict whenever the table or the budget changes; the person may pick another.
    keys = [setting.key for setting in table.settings]
    if state.get("at_scale_show_for") != (id(table), budget) or state.get("at_scale_show") not in keys:
        state.at_scale_show_for = (id(table), budget)
        state.at_scale_show = Setting.of(pick.spec).key
    selected = next(setting for setting in table.settings if setting.key == state.at_scale_show)

    gpus = table.request.world_size
    st.subheader(TEXT["peak_header"] if gpus == 1 else TEXT["peak_header_gpus"].format(gpus=gpus), anchor=False)
    st.plotly_chart(
        scale_peak_figure(table, budget, budget_label, selected=selected, lang=lang), key="at_scale_peak", theme=None
    )
    st.subheader(TEXT["resident_header"], anchor=False)
    st.plotly_chart(resident_figure(table, selected=selected, lang=lang), key="at_scale_resident", theme=None)
    st.caption(TEXT["resident_caption"])

    st.subheader(TEXT["diagram_header"], anchor=False)
    st.selectbox(TEXT["show"], keys, key="at_scale_show")
    st.plotly_chart(diagram_figure(table.result_for(selected), lang=lang), key="at_scale_diagram", theme=None)

    st.subheader(TEXT["table_header"], anchor=False)
    rows = scalepage.rows(table, budget, budget_label, TEXT, lang)
    st.dataframe(
        rows, hide_index=True, key="at_scale_table_view", height=min(36 * (len(rows) + 1) + 4, 720)
    )  # all rows, no inner scroll
except Exception as error:  # drawing must never take the page down
    st.error(TEXT["draw_failed"])
    with st.expander(TEXT["details"]):
        st.code(f"{type(error).__name__}: {error}", language=None)
