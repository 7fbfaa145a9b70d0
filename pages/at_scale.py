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

from typing import get_args

import streamlit as st

import ckptlab
from ckptlab.explore.budget import GPUS
from ckptlab.explore.gpu_search import GPU_COUNTS, GpuSearch
from ckptlab.explore.scale import SIMULATION_DTYPES, EveryN, OffloadFor, ScaleTable
from ckptlab.lab import scalepage
from ckptlab.lab.query import BATCH_MAX
from ckptlab.lab.scalepage import CUSTOM, DEFAULT, LOCAL, SEQ_LIMIT
from ckptlab.lab.targets import spec_targets
from ckptlab.show import i18n
from ckptlab.show.labels import experts_caption
from ckptlab.show.wording import app_message
from pages._common import (
    failure,
    language,
    lora_boxes,
    lora_choices,
    optimizer_box,
    preset_infos,
    settle_lora_targets,
    step_boxes,
)
from pages._deep_link import run_through_app
from pages._scale_answers import draw_search, draw_table
from pages._scale_parts import draw_buttons, load_widgets, poll, simulation_cache
from pages._server import server_policy

run_through_app()

lang = language()
# Every word the page shows is in ckptlab/locales/<lang>.json under "at_scale." (and "scale_figures." for the charts).
policy, _ = server_policy()  # the lab page shows a bad setting; here the safe default applies quietly
WIDGETS = ("at_scale_tiny", "at_scale_model", "at_scale_local_dir", "at_scale_seq", "at_scale_batch", "at_scale_dtype",
           "at_scale_every", "at_scale_offload", "at_scale_gpu", "at_scale_gpus", "at_scale_budget_gib", "at_scale_optimizer", "at_scale_accumulation", "at_scale_mixed_precision", "at_scale_max_grad_norm",
           "at_scale_lora", "at_scale_lora_rank", "at_scale_lora_targets", "at_scale_selective")  # fmt: skip
state = st.session_state

if any(key not in state for key in WIDGETS):
    # First run of this session, or back from another page (Streamlit drops widget state then).
    state.at_scale_warnings = load_widgets(policy, lang)
folders = policy.model_folders()  # what the instructor offers under CKPTLAB_MODELS_ROOT; none when unset
if state.at_scale_model == LOCAL and state.at_scale_local_dir not in folders:  # the folder went away since
    state.at_scale_model, state.at_scale_local_dir = DEFAULT.model, ""

with st.sidebar:
    st.header(i18n.t("at_scale.sidebar_model", lang), anchor=False)
    st.toggle(i18n.t("at_scale.tiny", lang), key="at_scale_tiny", help=i18n.t("at_scale.tiny_help", lang))
    names = [name for name, info in preset_infos().items() if state.at_scale_tiny or not info.cpu_ok]
    if state.at_scale_model not in names and state.at_scale_model != LOCAL:
        state.at_scale_model = DEFAULT.model  # tiny presets hidden again
    st.selectbox(
        i18n.t("at_scale.model", lang),
        [*names, *([LOCAL] if folders else [])],
        key="at_scale_model",
        format_func=lambda name: (
            i18n.t("at_scale.local_label", lang)
            if name == LOCAL
            else scalepage.model_label(name, preset_infos()[name], lang)
        ),
    )
    if state.at_scale_model == LOCAL:
        st.selectbox(
            i18n.t("at_scale.local_dir", lang), folders, key="at_scale_local_dir", help=i18n.t("lab.folder_help", lang)
        )
    model_caption = st.empty()
    st.number_input(i18n.t("at_scale.seq", lang), min_value=1, max_value=SEQ_LIMIT, step=1024, key="at_scale_seq")
    st.number_input(i18n.t("at_scale.batch", lang), min_value=1, max_value=BATCH_MAX, step=1, key="at_scale_batch")
    st.selectbox(i18n.t("at_scale.dtype", lang), SIMULATION_DTYPES, key="at_scale_dtype")
    optimizer_box("at_scale_optimizer", lang)
    step_boxes("at_scale", lang)
    lora_box = st.container()  # filled once the model is read: its projections are the LoRA targets
    st.radio(
        i18n.t("at_scale.every", lang),
        get_args(EveryN),
        format_func=lambda option: i18n.t(f"at_scale.every_options.{option}", lang),
        key="at_scale_every",
        help=i18n.t("at_scale.every_help", lang),
    )
    st.radio(
        i18n.t("at_scale.offload", lang),
        get_args(OffloadFor),
        format_func=lambda option: i18n.t(f"at_scale.offload_options.{option}", lang),
        key="at_scale_offload",
        help=i18n.t("at_scale.offload_help", lang),
    )
    st.multiselect(
        i18n.t("selective.scale_label", lang),
        scalepage.OFFERED_POLICIES,
        key="at_scale_selective",
        format_func=lambda policy: i18n.t(f"selective.policy_{policy}", lang),
        placeholder=i18n.t("selective.scale_placeholder", lang),
        help=i18n.t("selective.scale_help", lang),
        disabled=state.get("at_scale_gpus", 1) > 1,  # not simulated under FSDP2 (spec.selective_with_fsdp)
    )
    st.header(i18n.t("at_scale.sidebar_gpu", lang), anchor=False)
    st.selectbox(
        i18n.t("at_scale.gpu", lang),
        [*GPUS, CUSTOM],
        key="at_scale_gpu",
        format_func=lambda name: i18n.t("at_scale.custom", lang) if name == CUSTOM else name,
        help=i18n.t("at_scale.gpu_help", lang),
    )
    if state.at_scale_gpu == CUSTOM:
        st.number_input(
            i18n.t("at_scale.budget_gib", lang),
            min_value=0.01,
            max_value=4096.0,
            step=1.0,
            format="%g",
            key="at_scale_budget_gib",
        )
    st.selectbox(
        i18n.t("at_scale.gpus", lang), GPU_COUNTS, key="at_scale_gpus", help=i18n.t("at_scale.gpus_help", lang)
    )

state.at_scale_saved = {key: state[key] for key in WIDGETS}
model = policy.local_folder(state.at_scale_local_dir) if state.at_scale_model == LOCAL else state.at_scale_model
budget, budget_label = scalepage.budget(state.at_scale_gpu, state.at_scale_budget_gib)

st.title(i18n.t("at_scale.title", lang), anchor=False)
st.markdown(i18n.t("at_scale.intro", lang))
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
        st.error(i18n.t("at_scale.model_failed", lang, model=model, error=f"{type(error).__name__}: {error}"))
        st.stop()
model_caption.caption(scalepage.model_caption(info, lang))
if experts_caption(info, lang):
    st.caption(experts_caption(info, lang))

choices = lora_choices(model)  # the model's projections: all of them unless the link or the person chose some
settle_lora_targets("at_scale", model, choices)
with lora_box:
    lora_boxes("at_scale", choices, lang)
lora_targets = spec_targets(state.at_scale_lora_targets, choices, state.at_scale_lora)
if model:
    # Only this page's keys: others in the link (the language, say) stay as they are.
    for name, value in scalepage.query(state, model, lora_targets).items():
        if st.query_params.get(name) != value:
            st.query_params[name] = value
    if "targets" in st.query_params and not lora_targets:
        del st.query_params["targets"]
state.at_scale_saved = {key: state[key] for key in WIDGETS}

request = scalepage.request_from_widgets(state, model, info.num_layers, lora_targets)
if request.mixed_precision_via == "fsdp2":  # past one GPU the mixed-precision box means FSDP2's policy
    param_dtype = "bfloat16" if request.mixed_precision == "bf16" else "float16"
    st.sidebar.caption(
        i18n.t("fsdp.mixed_precision_policy", lang, gpus=request.world_size, dtype=request.mixed_precision,
               param_dtype=param_dtype)
    )  # fmt: skip
if state.at_scale_lora and not state.at_scale_lora_targets:
    problem = i18n.t("training.lora_targets_needed", lang)
else:
    problem = scalepage.request_problem(request, info, lang)

if problem:
    st.error(problem)
else:
    known = sum(request.spec(setting) in simulation_cache() for setting in request.settings)
    st.markdown(scalepage.plan_line(request, state.at_scale_every, info.num_layers, known, lang))


running = draw_buttons(request, budget, info, bool(problem), policy, lang)
poll(running, lang)

found: GpuSearch | None = state.get("at_scale_found")
if found is not None:
    draw_search(found, request, budget, budget_label, lang)

table: ScaleTable | None = state.get("at_scale_table")
if table is None:
    if not running and not problem and found is None:  # with a problem the error above says what to change
        st.info(i18n.t("at_scale.press", lang))
    st.stop()

# -- the result: everything below only draws ----------------------------------------------

shown = table.request
if shown != request:
    st.info(scalepage.changed_line(shown, lang))
if table.cancelled:
    st.warning(i18n.t("at_scale.stopped", lang, done=len(table.results), total=len(shown.settings)))
if not table.results:
    st.stop()
st.caption(scalepage.summary(table, lang))
try:
    draw_table(table, budget, budget_label, lang)
except Exception as error:  # drawing must never take the page down
    failure(i18n.t("at_scale.draw_failed", lang), f"{type(error).__name__}: {error}", i18n.t("at_scale.details", lang))
