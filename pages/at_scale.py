"""At scale: a real model size on a GPU you do not have, every checkpointing setting simulated.

A flat page: read the widgets, start a :class:`ckptlab.lab.scalejob.ScaleJob` (the simulations on
a thread, one after another, so the page stays responsive and Stop keeps what is done), a
:class:`~ckptlab.lab.scalejob.SearchJob` (the fewest GPUs that fit) or a
:class:`~ckptlab.lab.scalejob.LongestJob` (the longest sequence that fits, per setting), poll it in a fragment with a
progress bar, then draw the core's figures from what is kept in the session (``at_scale_job``,
``at_scale_table``, ``at_scale_found``, ``at_scale_longest``, ``at_scale_error``; the diagram drawn is ``at_scale_show``'s setting:
the verdict's, until the person picks another). Past one GPU each
setting is simulated under FSDP2 (rank 0's memory). Changing the GPU or the budget only redraws.
The shape lives in the URL, so a link restores it; nothing heavy runs before a button.
Words, rows and verdicts come from :mod:`ckptlab.lab.at_scale_view`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import streamlit as st

from ckptlab.explore.budget import BUDGET_BOX_GIB, GPUS
from ckptlab.explore.gpu_search import GPU_COUNTS, GpuSearch
from ckptlab.explore.longest import LongestTable
from ckptlab.explore.scale import (
    SIMULATION_DTYPES,
    EveryN,
    OffloadFor,
    ScaleRequest,
    ScaleTable,
    Setting,
    table_times,
)
from ckptlab.lab import at_scale_view
from ckptlab.lab.at_scale_view import CUSTOM, DEFAULT
from ckptlab.lab.lab_view import folder_info
from ckptlab.lab.modelbox import HUB, LOCAL, hub_name_problem, model_caption
from ckptlab.lab.query import gpus_from_query, spec_from_query
from ckptlab.lab.scalejob import LongestJob, ScaleJob, ScaleJobState, SearchJob, remember
from ckptlab.lab.server import ServerPolicy
from ckptlab.lab.store import SIMULATIONS, ResultStore
from ckptlab.lab.targets import spec_targets
from ckptlab.model import hub
from ckptlab.model.catalog import ModelInfo
from ckptlab.results import RunResult
from ckptlab.show.figures._style import PAGE_PX
from ckptlab.show.figures.diagram import diagram_figure
from ckptlab.show.figures.scale import resident_figure, scale_peak_figure, scale_time_figure
from ckptlab.show.i18n import Literal, as_text, say, t
from ckptlab.show.labels import experts_caption, training_label
from ckptlab.show.peak_words import logits_sentence
from ckptlab.spec import RunSpec
from ckptlab.spec_fields import FIELD, SEQ_MAX
from pages._common import (
    failure,
    job_buttons,
    language,
    lora_boxes,
    lora_choices,
    model_box,
    offered,
    optimizer_box,
    poll_job,
    preset_infos,
    run_through_app,
    settle_lora_targets,
    step_boxes,
)
from pages._server import job_workers, offered_folder, server_policy, session_alive

run_through_app()

lang = language()
# Every word the page shows is in ckptlab/locales/<lang>.json under "at_scale." (and "scale_figures." for the charts).
policy, _ = server_policy()  # the lab page shows a bad setting; here the safe default applies quietly
WIDGETS = at_scale_view.WIDGETS


# The shape's keys in a link (gpu= aside): those of the fields the page shows (ckptlab.lab.widgets), the step box's
# among them.
LINK_KEYS = at_scale_view.LINK_KEYS


def load_widgets(policy: ServerPolicy, lang: str) -> list[str]:
    """Fill the widgets from the link, or from this session's last settings; returns warnings."""
    state = st.session_state
    saved = state.get("at_scale_saved")
    if saved and not st.query_params:
        state.update(saved)
        return []
    params = st.query_params.to_dict()
    spec, ignored = spec_from_query({k: v for k, v in params.items() if k in LINK_KEYS}, default=DEFAULT)
    state.at_scale_gpus, ignored_gpus = gpus_from_query(params.get("gpus", "1"), GPU_COUNTS)
    warnings = [say(as_text(fact), lang) for fact in ignored + ignored_gpus]  # the link's values as text
    if spec.seq_len > SEQ_MAX:  # the link's reader already clamps to it (spec_fields' seq_len offers SEQ_MAX)
        warnings.append(t("at_scale.seq_clamped", lang, seq=spec.seq_len, limit=SEQ_MAX))
        spec = replace(spec, seq_len=SEQ_MAX)
    infos = preset_infos()
    # A link's owner/name is a Hub repository where the server fetches them (the folder entry otherwise).
    hub_name = spec.model if policy.hub and spec.model not in infos and hub.is_repo_name(spec.model) else ""
    folder, why_not = ("", "") if spec.model in infos or hub_name else offered_folder(policy, spec.model, lang)
    if why_not:  # a link to a folder this server does not offer: the default preset
        warnings.append(why_not)
        spec = replace(spec, model=DEFAULT.model)
    tiny = spec.model in infos and infos[spec.model].cpu_ok
    state.update(at_scale_view.widget_values(spec, folder, tiny, hub_name))
    state.at_scale_selective, unknown = at_scale_view.policies_from_link(params.get("selective", ""))
    if unknown:
        warnings.append(t("at_scale.selective_unknown", lang, names=Literal(", ".join(unknown))))
    gpu = params.get("gpu", "").strip()
    if gpu:
        chosen = at_scale_view.gpu_from_link(gpu)
        if chosen is None:
            warnings.append(t("at_scale.gpu_unknown", lang, gpu=Literal(gpu), default=at_scale_view.DEFAULT_GPU))
        else:
            state.at_scale_gpu, state.at_scale_budget_gib, clamped = chosen
            warnings += [say(as_text(fact), lang) for fact in clamped]
    return warnings


def simulation_cache() -> ResultStore[RunSpec, RunResult]:
    """Simulations by spec, shared by every session (``store.SIMULATIONS``, bounded)."""
    return SIMULATIONS


def draw_buttons(
    request: ScaleRequest,
    budget: int,
    info: ModelInfo,
    problem: bool,
    policy: ServerPolicy,
    lang: str,
) -> bool:
    """Simulate, Search GPUs, Longest sequence and Stop, and the last start's error; returns whether a job is running.

    ``policy``: the server's; a job past its seconds per run is ended (in a worker process, at once; in
    this process, between two simulations), and so is a job whose session is gone.
    """

    def job(kind: str) -> ScaleJob | SearchJob | LongestJob:
        """Every setting simulated, the fewest GPUs that fit looked for (``kind`` "search") or the longest sequence
        per setting (``kind`` "longest", :func:`at_scale_view.longest_settings`) on a thread; :func:`poll_job` polls."""
        cache = simulation_cache()
        how = {
            "known": cache,
            "on_result": lambda result: remember(cache, result),
            "info": info,
            "limit_s": policy.run_limit_s,
            "workers": job_workers(policy, "simulation"),
            "alive": session_alive(),
            "memory_cap_bytes": policy.memory_cap_bytes,
        }
        named = None if state.at_scale_gpu == CUSTOM else state.at_scale_gpu  # its CUDA context, where measured
        if kind == "search":
            return SearchJob(replace(request, world_size=1), budget, gpu=named, **how)
        if kind == "longest":
            return LongestJob(request, budget, settings=at_scale_view.longest_settings(request), gpu=named, **how)
        return ScaleJob(request, budget_bytes=budget, gpu=named, **how)

    starts = [
        (t("at_scale.simulate", lang), "at_scale_run", lambda: job("table"), None),
        (t("at_scale.search", lang), "at_scale_search", lambda: job("search"), t("at_scale.search_help", lang)),
        (t("at_scale.longest", lang), "at_scale_longest_run", lambda: job("longest"), t("at_scale.longest_help", lang)),
    ]
    running = job_buttons("at_scale", starts, t("at_scale.stop", lang), lang, blocked=problem)
    if st.session_state.get("at_scale_error"):
        st.error(t("at_scale.failed", lang, error=st.session_state.at_scale_error))
    return running


def draw_search(found: GpuSearch, request: ScaleRequest, budget: int, budget_label: str, lang: str) -> None:
    """The GPU search's answer, and the launch and model code for it when something fits."""
    st.subheader(t("at_scale.search_header", lang), anchor=False)
    if not at_scale_view.search_is_for(found, request, budget):
        st.info(t("at_scale.search_changed", lang))
    speed = at_scale_view.time_gpu(st.session_state.at_scale_gpu)
    answer = at_scale_view.search_verdict(found, budget_label, lang, speed)
    getattr(st, answer.kind)(answer.text)
    code = found.code()
    if code is not None:
        launch, setup = st.columns(2)
        launch.caption(t("at_scale.code_launch", lang))
        launch.code(at_scale_view.launch_code(code, lang), language="bash", wrap_lines=True)
        if found.gpus > 1:  # on one GPU the model's box ends with these TrainingArguments (ckptlab.step.code)
            launch.caption(t("at_scale.code_trainer", lang, **at_scale_view.trainer_versions()))
            launch.code(code.trainer_code, language="python", wrap_lines=True)
        setup.caption(t("at_scale.code_model", lang) if found.gpus == 1 else t("at_scale.code_fsdp", lang))
        timed = at_scale_view.timed_code(code.model_code, at_scale_view.search_time(found, speed), lang)
        setup.code(timed, language="python", wrap_lines=True)


def draw_longest(found: LongestTable, request: ScaleRequest, budget: int, budget_label: str, lang: str) -> None:
    """The longest-sequence search's answer: which setting reaches the longest, and its table per setting."""
    st.subheader(t("at_scale.longest_header", lang), anchor=False)
    if not at_scale_view.longest_is_for(found, request, budget):
        st.info(t("at_scale.longest_changed", lang))
    if found.cancelled:
        st.warning(t("at_scale.longest_stopped", lang, done=len(found.rows), total=len(found.settings)))
    if not found.rows:
        return
    speed = at_scale_view.time_gpu(st.session_state.at_scale_gpu)
    answer = at_scale_view.longest_verdict(found, budget, budget_label, lang, speed)
    getattr(st, answer.kind)(answer.text)
    st.caption(at_scale_view.longest_summary(found, lang))
    rows = at_scale_view.longest_rows(found, lang)
    st.dataframe(rows, hide_index=True, key="at_scale_longest_view", height=at_scale_view.table_height(len(rows)))


def float32_under_bf16() -> None:
    """The widgets of Trainer's usual ``bf16=True``: float32 weights, bf16 compute; Simulate then shows its peak."""
    st.session_state.at_scale_dtype = "float32"
    st.session_state.at_scale_mixed_precision = "bf16"


def draw_table(
    table: ScaleTable,
    budget: int,
    budget_label: str,
    lang: str,
) -> None:
    """The verdict, the peak and resident figures, one setting's diagram and the table; raises if drawing fails."""
    state = st.session_state
    speed = at_scale_view.time_gpu(state.at_scale_gpu)  # the chosen GPU's speed (a custom budget: the page says whose)
    verdict = at_scale_view.verdict(table, budget, budget_label, lang, speed)
    getattr(st, verdict.kind)(verdict.text)
    if at_scale_view.time_gpu_caption(state.at_scale_gpu, lang):  # a custom budget: whose speed the times are on
        st.caption(at_scale_view.time_gpu_caption(state.at_scale_gpu, lang))
    if at_scale_view.float32_under_mixed(
        state
    ):  # the verdict assumed half-precision weights: Trainer's usual, a click away
        st.button(t("at_scale.try_float32_mixed", lang), key="at_scale_try_mixed", on_click=float32_under_bf16)
    pick = verdict.result
    st.caption(t("at_scale.optimizer", lang, training=training_label(table.results[0].spec, lang)))
    # The drawn setting follows the verdict whenever the table or the budget changes; the person may pick another.
    keys = [setting.key for setting in table.settings]
    if state.get("at_scale_show_for") != (id(table), budget) or state.get("at_scale_show") not in keys:
        state.at_scale_show_for = (id(table), budget)
        state.at_scale_show = Setting.of(pick.spec).key
    selected = next(setting for setting in table.settings if setting.key == state.at_scale_show)

    st.subheader(at_scale_view.peak_header(table.request.world_size, lang), anchor=False)
    st.plotly_chart(
        scale_peak_figure(table, budget, budget_label, selected=selected, lang=lang), key="at_scale_peak", theme=None
    )
    shown = table.result_for(selected)
    logits = logits_sentence(shown.memory if shown is not None else None, lang)
    if logits:
        st.caption(logits)
    times = table_times(table, speed)
    if any(time.prediction is not None for time in times):  # simulations that carry their counted work
        st.subheader(t("at_scale.time_header", lang), anchor=False)
        st.plotly_chart(
            scale_time_figure(table, times, budget, budget_label, selected=selected, lang=lang),
            key="at_scale_time",
            theme=None,
        )
    st.subheader(t("at_scale.resident_header", lang), anchor=False)
    st.plotly_chart(resident_figure(table, selected=selected, lang=lang), key="at_scale_resident", theme=None)
    st.caption(t("at_scale.resident_caption", lang))

    st.subheader(t("at_scale.diagram_header", lang), anchor=False)
    st.selectbox(t("at_scale.show", lang), keys, key="at_scale_show")
    shown_diagram = diagram_figure(table.result_for(selected), lang=lang, width=PAGE_PX)  # across the page
    st.plotly_chart(shown_diagram, key="at_scale_diagram", theme=None)

    st.subheader(t("at_scale.table_header", lang), anchor=False)
    rows = at_scale_view.rows(table, budget, budget_label, lang, speed)
    st.dataframe(rows, hide_index=True, key="at_scale_table_view", height=at_scale_view.table_height(len(rows)))


state = st.session_state

if any(key not in state for key in WIDGETS):
    # First run of this session, or back from another page (Streamlit drops widget state then).
    state.at_scale_warnings = load_widgets(policy, lang)
folders = policy.model_folders()  # what the instructor offers under CKPTLAB_MODELS_ROOT; none when unset
if state.at_scale_model == LOCAL and state.at_scale_local_dir not in folders:  # the folder went away since
    state.at_scale_model, state.at_scale_local_dir = DEFAULT.model, ""
if state.at_scale_model == HUB and not policy.hub:  # the instructor turned Hub names off since
    state.at_scale_model = DEFAULT.model

with st.sidebar:
    st.header(t("at_scale.sidebar_model", lang), anchor=False)
    st.toggle(t("at_scale.tiny", lang), key="at_scale_tiny", help=t("at_scale.tiny_help", lang))
    names = [name for name, info in preset_infos().items() if state.at_scale_tiny or not info.cpu_ok]
    if state.at_scale_model not in names and state.at_scale_model not in (LOCAL, HUB):
        state.at_scale_model = DEFAULT.model  # tiny presets hidden again
    model_box(
        "at_scale",
        names,
        lang,
        folders=folders,
        hub_allowed=policy.hub,
        hub_token=bool(policy.hub_token),
        label=t("at_scale.model", lang),
        folder_label=t("at_scale.local_dir", lang),
        grouped=False,
    )
    model_caption_box = st.empty()
    st.number_input(t("at_scale.seq", lang), min_value=1, max_value=SEQ_MAX, step=1024, key="at_scale_seq")
    st.number_input(t("at_scale.batch", lang), **offered("batch_size"), step=1, key="at_scale_batch")
    st.selectbox(t("at_scale.dtype", lang), SIMULATION_DTYPES, key="at_scale_dtype")
    optimizer_box("at_scale_optimizer", lang)
    step_boxes("at_scale", lang)
    lora_box = st.container()  # filled once the model is read: its projections are the LoRA targets
    for box, options in (("every", EveryN), ("offload", OffloadFor)):  # which settings to simulate
        st.radio(
            t(f"at_scale.{box}", lang),
            get_args(options),
            format_func=lambda option, box=box: t(f"at_scale.{box}_options.{option}", lang),
            key=f"at_scale_{box}",
            help=t(f"at_scale.{box}_help", lang),
        )
    st.multiselect(
        t("selective.scale_label", lang),
        at_scale_view.OFFERED_POLICIES,
        key="at_scale_selective",
        format_func=lambda policy: t(f"selective.policy_{policy}", lang),
        placeholder=t("selective.scale_placeholder", lang),
        help=t("selective.scale_help", lang),
        disabled=state.get("at_scale_gpus", 1) > 1,  # not simulated under FSDP2 (spec.selective_with_fsdp)
    )
    st.header(t("at_scale.sidebar_gpu", lang), anchor=False)
    st.selectbox(
        t("at_scale.gpu", lang),
        [*GPUS, CUSTOM],
        key="at_scale_gpu",
        format_func=lambda name: t("at_scale.custom", lang) if name == CUSTOM else name,
        help=t("at_scale.gpu_help", lang),
    )
    if state.at_scale_gpu == CUSTOM:
        st.number_input(
            t("at_scale.budget_gib", lang),
            min_value=BUDGET_BOX_GIB[0],  # the box's bounds, declared with the budget's (explore.budget)
            max_value=BUDGET_BOX_GIB[1],
            step=1.0,
            format="%g",
            key="at_scale_budget_gib",
        )
    st.selectbox(t("at_scale.gpus", lang), GPU_COUNTS, key="at_scale_gpus", help=t("at_scale.gpus_help", lang))
    st.selectbox(  # PYTORCH_CUDA_ALLOC_CONF: the offered settings, and a link's own where it named another
        t("at_scale.alloc_conf", lang),
        list(dict.fromkeys([*FIELD["alloc_conf"].choices, state.get("at_scale_alloc_conf", "")])),
        key="at_scale_alloc_conf",
        format_func=lambda text: text or t("at_scale.alloc_conf_default", lang),
        help=t("at_scale.alloc_conf_help", lang),
    )

state.at_scale_saved = {key: state[key] for key in WIDGETS}
if state.at_scale_model == LOCAL:
    model = policy.local_folder(state.at_scale_local_dir)
elif state.at_scale_model == HUB:
    model = state.at_scale_hub_name.strip()  # fetched below, through the one place a name is resolved
else:
    model = state.at_scale_model
budget, budget_label = at_scale_view.budget(state.at_scale_gpu, state.at_scale_budget_gib, lang)

st.title(t("at_scale.title", lang), anchor=False)
st.markdown(t("at_scale.intro", lang))
for warning in state.get("at_scale_warnings", []):
    st.warning(warning)

# -- the model and what to simulate -------------------------------------------------------

if not model:  # the Hub entry, nothing typed yet
    st.info(t("lab.hub_empty", lang))
    st.stop()
if state.at_scale_model == HUB and hub_name_problem(model, lang):
    st.error(hub_name_problem(model, lang))
    st.stop()
info, model_problem = (preset_infos()[model], "") if model in preset_infos() else folder_info(model, lang, policy)
if info is None:
    st.error(model_problem)
    st.stop()
model_caption_box.caption(model_caption(info, lang))
if experts_caption(info, lang):
    st.caption(experts_caption(info, lang))

choices = lora_choices(model)  # the model's projections: all of them unless the link or the person chose some
settle_lora_targets("at_scale", model, choices)
with lora_box:
    lora_boxes("at_scale", choices, lang)
lora_targets = spec_targets(state.at_scale_lora_targets, choices, state.at_scale_lora)
if model:
    # Only this page's keys: others in the link (the language, say) stay as they are.
    for name, value in at_scale_view.query(state, model, lora_targets).items():
        if st.query_params.get(name) != value:
            st.query_params[name] = value
    if "targets" in st.query_params and not lora_targets:
        del st.query_params["targets"]
state.at_scale_saved = {key: state[key] for key in WIDGETS}

request = at_scale_view.request_from_widgets(state, model, info.num_layers, lora_targets)
if request.mixed_precision_via == "fsdp2":  # past one GPU the mixed-precision box means FSDP2's policy
    param_dtype = "bfloat16" if request.mixed_precision == "bf16" else "float16"
    st.sidebar.caption(
        t("fsdp.mixed_precision_policy", lang, gpus=request.world_size, dtype=request.mixed_precision,
               param_dtype=param_dtype)
    )  # fmt: skip
if state.at_scale_lora and not state.at_scale_lora_targets:
    problem = t("training.lora_targets_needed", lang)
else:
    problem = at_scale_view.request_problem(request, info, lang)

if problem:
    st.error(problem)
else:
    known = sum(request.spec(setting) in simulation_cache() for setting in request.settings)
    st.markdown(at_scale_view.plan_line(request, state.at_scale_every, info.num_layers, known, lang))


running = draw_buttons(request, budget, info, bool(problem), policy, lang)


def keep_simulations(snapshot: ScaleJobState) -> None:
    if snapshot.table is not None:
        state.at_scale_table = snapshot.table
    if snapshot.search is not None:
        state.at_scale_found = snapshot.search
    if snapshot.longest is not None:
        state.at_scale_longest = snapshot.longest


def simulation_words(job: ScaleJob | SearchJob | LongestJob, snapshot: ScaleJobState) -> str:
    total = len(job.request.settings) if isinstance(job, ScaleJob) else None  # a search: so many simulated
    return at_scale_view.progress_words(len(snapshot.results), total, snapshot.message, snapshot.stop_requested, lang)


poll_job("at_scale", running, lang, simulation_words, keep_simulations)

found: GpuSearch | None = state.get("at_scale_found")
if found is not None:
    draw_search(found, request, budget, budget_label, lang)

longest: LongestTable | None = state.get("at_scale_longest")
if longest is not None:
    try:
        draw_longest(longest, request, budget, budget_label, lang)
    except Exception as error:  # drawing must never take the page down
        failure(t("at_scale.draw_failed", lang), f"{type(error).__name__}: {error}", t("at_scale.details", lang))

table: ScaleTable | None = state.get("at_scale_table")
if table is None:
    # With a problem the error above says what to change.
    if not running and not problem and found is None and longest is None:
        st.info(t("at_scale.press", lang))
    st.stop()

# -- the result: everything below only draws ----------------------------------------------

shown = table.request
if shown != request:
    st.info(at_scale_view.changed_line(shown, lang))
if table.cancelled:
    st.warning(t("at_scale.stopped", lang, done=len(table.results), total=len(shown.settings)))
if not table.results:
    st.stop()
st.caption(at_scale_view.summary(table, lang))
try:
    draw_table(table, budget, budget_label, lang)
except Exception as error:  # drawing must never take the page down
    failure(t("at_scale.draw_failed", lang), f"{type(error).__name__}: {error}", t("at_scale.details", lang))
