"""What every page sets up the same way: its language, the presets described once, LoRA's boxes. Not a page.

app.py's navigation lists the pages; this file only serves them (``from pages._common import ...``).
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

import ckptlab
from ckptlab.lab.query import LORA_RANK_MAX
from ckptlab.lab.run import lora_target_choices
from ckptlab.lab.stepboxes import step_widget_values
from ckptlab.lab.targets import settle
from ckptlab.show import i18n
from ckptlab.show.i18n import Translator
from ckptlab.spec import MAX_ACCUMULATION_STEPS, MIXED_PRECISIONS, OPTIMIZERS, RunSpec


def language() -> tuple[str, Translator]:
    """The session's language (app.py's selector keeps it in ``app_lang``) and a translator bound to it."""
    lang = i18n.normalize(st.session_state.get("app_lang"))
    return lang, i18n.translator(lang)


def estimate_text(seconds: float, basis: str, tr: Translator, left: bool = True) -> str:
    """A wait's estimate in words (the seconds ``left``, or the whole wait's), saying what it comes from.

    ``basis``: "measured" (the FLOP count scaled by this server's measured runs, :data:`ckptlab.lab.run.PACE`),
    "predicted" (the FLOP count alone) or "so_far" (the job's own pace so far; seconds left only).
    """
    return tr(f"wait.{'left' if left else 'total'}_{basis}", seconds=f"{max(seconds, 1):,.0f}")


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


def optimizer_box(key: str, tr: Translator) -> None:
    """The optimizer's select box, as every page with training controls draws it."""
    st.selectbox(
        tr("training.optimizer"),
        OPTIMIZERS,
        key=key,
        format_func=lambda name: tr(f"training.optimizer_{name}"),
        help=tr("training.optimizer_help"),
    )


def step_boxes(prefix: str, tr: Translator) -> None:
    """Trainer's side of the step (accumulation, mixed precision, clipping), in ``<prefix>_accumulation``,
    ``_mixed_precision`` and ``_max_grad_norm`` (``ckptlab.lab.stepboxes`` reads them back)."""
    state = st.session_state
    for key, value in step_widget_values(prefix, RunSpec()).items():
        state.setdefault(key, value)  # the lab's defaults where neither a link nor the session set one
    with st.expander(tr("training.step")):
        st.number_input(
            tr("training.accumulation"),
            min_value=1,
            max_value=MAX_ACCUMULATION_STEPS,
            step=1,
            key=f"{prefix}_accumulation",
            help=tr("training.accumulation_help"),
        )
        st.selectbox(
            tr("training.mixed_precision"),
            MIXED_PRECISIONS,
            key=f"{prefix}_mixed_precision",
            format_func=lambda name: tr(f"training.mixed_precision_{name}"),
            help=tr("training.mixed_precision_help"),
        )
        st.number_input(
            tr("training.max_grad_norm"),
            min_value=0.0,
            step=0.1,
            format="%g",
            key=f"{prefix}_max_grad_norm",
            help=tr("training.max_grad_norm_help"),
        )


def lora_boxes(prefix: str, choices: Sequence[str], tr: Translator) -> None:
    """LoRA's toggle, rank and targets, kept in ``<prefix>_lora``, ``_lora_rank`` and ``_lora_targets``."""
    state = st.session_state
    st.toggle(tr("training.lora"), key=f"{prefix}_lora", disabled=not choices, help=tr("training.lora_help"))
    st.number_input(
        tr("training.lora_rank"),
        min_value=1,
        max_value=LORA_RANK_MAX,
        step=1,
        key=f"{prefix}_lora_rank",
        disabled=not state[f"{prefix}_lora"],
    )
    st.multiselect(
        tr("training.lora_targets"),
        choices,
        key=f"{prefix}_lora_targets",
        disabled=not state[f"{prefix}_lora"],
        placeholder=tr("training.lora_targets_none"),
        help=tr("training.lora_targets_help"),
    )


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
