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

import streamlit as st

import ckptlab
from ckptlab.explore.budget import GPUS
from ckptlab.explore.gpu_search import GPU_COUNTS, GpuSearch
from ckptlab.explore.scale import SIMULATION_DTYPES, ScaleTable
from ckptlab.lab import scalepage
from ckptlab.lab.query import BATCH_MAX
from ckptlab.lab.scalepage import CUSTOM, DEFAULT, LOCAL, SEQ_LIMIT
from ckptlab.lab.targets import spec_targets
from ckptlab.model.selective import CHOICES as SELECTIVE_CHOICES
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

lang, tr = language()  # tr: the training controls' words, shared with the lab page ("training.")
# Every word the page shows, in one place: ckptlab/locales/<lang>.json under "at_scale." (and "scale_figures." for the charts).
TEXT = i18n.section("at_scale", lang)
policy, _ = server_policy()  # the lab page shows a bad setting; here the safe default applies quietly
WIDGETS = ("at_scale_tiny", "at_scale_model", "at_scale_local_dir", "at_scale_seq", "at_scale_batch", "at_scale_dtype",
           "at_scale_every", "at_scale_offload", "at_scale_gpu", "at_scale_gpus", "at_scale_budget_gib", "at_scale_optimizer", "at_scale_accumulation", "at_scale_mixed_precision", "at_scale_max_grad_norm",
           "at_scale_lora", "at_scale_lora_rank", "at_scale_lora_targets", "at_scale_selective")  # fmt: skip
state = st.session_state

if any(key not in state for key in WIDGETS):
    # First run of this session, or back from another page (Streamlit drops widget state then).
    state.at_scale_warnings = load_widgets(policy, lang, TEXT)
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
            TEXT["local_label"] if name == LOCAL else scalepage.model_label(name, preset_infos()[name], TEXT)
        ),
    )
    if state.at_scale_model == LOCAL:
        st.selectbox(TEXT["local_dir"], folders, key="at_scale_local_dir", help=i18n.t("lab.folder_help", lang))
    model_caption = st.empty()
    st.number_input(TEXT["seq"], min_value=1, max_value=SEQ_LIMIT, step=1024, key="at_scale_seq")
    st.number_input(TEXT["batch"], min_value=1, max_value=BATCH_MAX, step=1, key="at_scale_batch")
    st.selectbox(TEXT["dtype"], SIMULATION_DTYPES, key="at_scale_dtype")
    optimizer_box("at_scale_optimizer", tr)
    step_boxes("at_scale", tr)
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
    st.multiselect(
        tr("selective.scale_label"),
        [policy for policy in SELECTIVE_CHOICES if policy != "none"],
        key="at_scale_selective",
        format_func=lambda policy: tr(f"selective.policy_{policy}"),
        placeholder=tr("selective.scale_placeholder"),
        help=tr("selective.scale_help"),
        disabled=state.get("at_scale_gpus", 1) > 1,  # not simulated under FSDP2 (spec.selective_with_fsdp)
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
budget, budget_label = scalepage.budget(state.at_scale_gpu, state.at_scale_budget_gib)

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
model_caption.caption(scalepage.model_caption(info, TEXT))
if experts_caption(info, lang):
    st.caption(experts_caption(info, lang))

choices = lora_choices(model)  # the model's projections: all of them unless the link or the person chose some
settle_lora_targets("at_scale", model, choices)
with lora_box:
    lora_boxes("at_scale", choices, tr)
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
    problem = tr("training.lora_targets_needed")
else:
    problem = scalepage.request_problem(request, info, lang)

if problem:
    st.error(problem)
else:
    known = sum(request.spec(setting) in simulation_cache() for setting in request.settings)
    st.markdown(scalepage.plan_line(request, state.at_scale_every, info.num_layers, known, TEXT))


running = draw_buttons(request, budget, info, bool(problem), policy, lang, TEXT)
poll(running, lang, TEXT)

found: GpuSearch | None = state.get("at_scale_found")
if found is not None:
    draw_search(found, request, budget, budget_label, TEXT)

table: ScaleTable | None = state.get("at_scale_table")
if table is None:
    if not running and not problem and found is None:  # with a problem the error above says what to change
        st.info(TEXT["press"])
    st.stop()

# -- the result: everything below only draws ----------------------------------------------

shown = table.request
if shown != request:
    st.info(scalepage.changed_line(shown, TEXT))
if table.cancelled:
    st.warning(TEXT["stopped"].format(done=len(table.results), total=len(shown.settings)))
if not table.results:
    st.stop()
st.caption(scalepage.summary(table, TEXT, lang))
try:
    draw_table(table, budget, budget_label, TEXT, lang)
except Exception as error:  # drawing must never take the page down
    failure(TEXT["draw_failed"], f"{type(error).__name__}: {error}", TEXT["details"])
