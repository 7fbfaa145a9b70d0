"""The lab: pick a model and a checkpointing setting, press Run, see what each layer kept and what it cost.

A flat page: read the widgets, call ``ckptlab.lab.run.run_queued`` once (``pages/_lab_parts.py``), render
(``pages/_lab_result.py``).
The settings live in the URL, so a link restores them; nothing heavy runs before Run. Words and
numbers come from ``ckptlab.lab.labpage``.
"""

from __future__ import annotations

import streamlit as st
import torch

import ckptlab
from ckptlab.lab import labpage
from ckptlab.lab.labpage import LOCAL
from ckptlab.lab.query import BATCH_MAX, REPEATS_MAX, SEQ_MAX, WARMUP_MAX, spec_to_query
from ckptlab.lab.run import LabRun, build_for_key
from ckptlab.lab.targets import spec_targets
from ckptlab.model.selective import CHOICES as SELECTIVE_CHOICES
from ckptlab.show.figures.diagram import plan_figure
from ckptlab.show.i18n import t
from ckptlab.show.labels import experts_caption
from ckptlab.show.wording import app_message
from ckptlab.spec import DTYPES, RunSpec
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
from pages._lab_parts import draw_code, load_widgets, run_and_keep
from pages._lab_result import draw_result
from pages._server import server_policy

run_through_app()

DEVICES = ("auto", "cpu", "cuda") if torch.cuda.is_available() else ("auto", "cpu")
lang = language()
policy, policy_problem = server_policy()
WIDGETS = ("lab_model", "lab_local_dir", "lab_seq", "lab_batch", "lab_dtype", "lab_device", "lab_ckpt", "lab_n",
           "lab_offload", "lab_repeats", "lab_warmup", "lab_optimizer", "lab_lora", "lab_lora_rank", "lab_lora_targets",
           "lab_accumulation", "lab_mixed_precision", "lab_max_grad_norm", "lab_selective")  # fmt: skip


@st.cache_resource(show_spinner=False, max_entries=1)
def cached_model(key: tuple[str, str, str, int]):
    """The built model for (model, dtype, device, seed), shared by all sessions.

    One at a time: on a GPU every model kept alive counts in the memory a run starts from
    (CUDA's allocator sees the whole device), so a second cached model would show up in
    another session's baseline. Runs of one model back to back, the workshop case, reuse it.
    """
    return build_for_key(key)


# -- the page: settings -> spec -> URL, then Run, then the result -------------------------

state = st.session_state
if any(key not in state for key in WIDGETS):
    load_widgets(DEVICES, policy, lang)  # first run of this session, or back from another page (widgets dropped)

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
    info, model_problem = labpage.folder_info(model_name, lang)
num_layers = info.num_layers if info else max(2, state.lab_n)
if state.lab_n > num_layers:
    warning = t("lab.n_lowered", lang, layers=num_layers, model=model_name)
    state.lab_query_warnings, state.lab_n = [*state.get("lab_query_warnings", []), warning], num_layers

# LoRA's targets are the model's projections: all of them unless the link or the person chose some.
choices = lora_choices(model_name) if info is not None else []
unknown = settle_lora_targets("lab", model_name, choices)
if unknown:  # names from the link this model does not have
    warning = t(
        "training.lora_targets_unknown", lang, unknown=", ".join(unknown), model=model_name, choices=", ".join(choices)
    )
    state.lab_query_warnings = [*state.get("lab_query_warnings", []), warning]

with st.sidebar:
    st.header(t("common.settings", lang))
    st.selectbox(
        t("common.model", lang),
        [*preset_infos(), *([LOCAL] if folders else [])],
        key="lab_model",
        format_func=lambda name: labpage.model_label(name, preset_infos().get(name), lang),
        help=t("lab.model_help", lang),
    )
    if state.lab_model == LOCAL:
        st.selectbox(t("lab.folder", lang), folders, key="lab_local_dir", help=t("lab.folder_help", lang))
    elif info:
        st.caption(labpage.model_caption(info, lang))
    st.number_input(t("common.seq_len", lang), min_value=1, max_value=SEQ_MAX, step=128, key="lab_seq")
    st.number_input(t("lab.batch", lang), min_value=1, max_value=BATCH_MAX, step=1, key="lab_batch")
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
        format_func=lambda policy: labpage.policy_label(policy, lang),
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
        st.number_input(t("lab.repeats", lang), min_value=1, max_value=REPEATS_MAX, key="lab_repeats")
        st.number_input(t("lab.warmup", lang), min_value=0, max_value=WARMUP_MAX, key="lab_warmup")

spec = labpage.spec_from_widgets(state, model_name or "", spec_targets(state.lab_lora_targets, choices, state.lab_lora))
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

problem, on_cpu = labpage.problem_with(spec, info, policy, lang)
if problem:
    st.error(problem)
elif on_cpu and not info.cpu_ok:
    st.warning(labpage.cpu_warning(spec, info, lang))

head, button = st.columns([5, 1], vertical_alignment="center")
head.markdown(labpage.head_line(spec, lang))
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
            plan = plan_figure(info.num_layers, spec.every_n_layers, lang=lang)
            st.plotly_chart(plan, key="lab_plan", theme=None)
    else:
        draw_result(lab, spec, lang)
    draw_code(spec, lang)
except Exception as error:  # drawing must never take the page down
    failure(t("lab.draw_failed", lang), f"{type(error).__name__}: {error}", t("lab.details", lang))
