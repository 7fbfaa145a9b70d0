"""The trade-off explorer: every every_n_layers of one model, measured, predicted, and the fastest that fits.

A flat page: read the widgets, start a :class:`ckptlab.lab.sweepjob.SweepJob` (a background
sweep, one device-queue turn per row), poll it in a fragment with a progress bar and a
Stop button, then render the core's figures from the result kept in the session.
"""

from __future__ import annotations

import streamlit as st
import torch

import ckptlab
from ckptlab.explore.accuracy import check_predictions
from ckptlab.explore.recommend import GPUS, recommend
from ckptlab.explore.sweep import OFFLOAD_CHOICES, SweepResult, SweepSpec
from ckptlab.lab.query import LORA_RANK_MAX
from ckptlab.lab.run import build_for_key, lora_target_choices, model_key
from ckptlab.lab.sweepjob import SweepJob
from ckptlab.show import i18n
from ckptlab.show.figures.prediction import sweep_prediction_figure
from ckptlab.show.figures.tradeoff import peak_sentence, seq_len_figure, sweep_peak_figure, sweep_tradeoff_figure
from ckptlab.show.labels import provenance_label, training_label
from ckptlab.show.noise import sweep_busy_message, sweep_table
from ckptlab.show.wording import app_message
from ckptlab.spec import DTYPES, OPTIMIZERS, RunSpec
from ckptlab.step.measure import resolve_device
from ckptlab.units import MIB, mib, milliseconds
from pages._deep_link import run_through_app
from pages._server import server_policy, session_owner

run_through_app()

SEQ_CHOICES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
CUSTOM = "custom budget"
HAS_CUDA = torch.cuda.is_available()
lang = i18n.normalize(st.session_state.get("app_lang"))
policy, _ = server_policy()  # the instructor's limits (ckptlab.lab.server); the lab page shows a bad setting
tr = i18n.translator(lang)


@st.cache_resource(show_spinner=False)
def preset_names() -> list[str]:
    """Presets, the CPU-sized ones first (the catalog's order)."""
    return [preset.name for preset in ckptlab.list_presets()]


@st.cache_resource(show_spinner=False, max_entries=64)
def target_choices(model: str) -> list[str]:
    """The projections LoRA can adapt in ``model``, read once per process (meta device)."""
    try:
        return lora_target_choices(model)
    except Exception:  # a model peft cannot adapt: LoRA is offered only where it applies
        return []


st.title(tr("tradeoffs.title"), anchor=False)
st.markdown(tr("tradeoffs.intro"))

# -- settings -----------------------------------------------------------------------------

state = st.session_state
with st.sidebar:
    st.header(tr("tradeoffs.sweep"), anchor=False)
    model = st.selectbox(tr("common.model"), preset_names(), key="tradeoffs_model")
    seq_lens = st.multiselect(tr("tradeoffs.seq_lens"), SEQ_CHOICES, default=[256], key="tradeoffs_seq")
    custom_n = st.toggle(tr("tradeoffs.choose_n"), value=False, key="tradeoffs_choose_n")
    every_n = st.multiselect(
        "every_n_layers", list(range(1, 65)), default=[1, 2, 4], key="tradeoffs_n", disabled=not custom_n
    )
    offload = st.radio(
        tr("tradeoffs.offload"),
        OFFLOAD_CHOICES,
        horizontal=True,
        key="tradeoffs_offload",
        format_func=lambda choice: tr(f"tradeoffs.offload_{choice}"),
        help=tr("tradeoffs.offload_help"),
    )
    batch = st.number_input(tr("tradeoffs.batch"), 1, 64, 1, key="tradeoffs_batch")
    dtype = st.selectbox("dtype", DTYPES, key="tradeoffs_dtype")
    optimizer = st.selectbox(
        tr("training.optimizer"),
        OPTIMIZERS,
        key="tradeoffs_optimizer",
        format_func=lambda name: tr(f"training.optimizer_{name}"),
        help=tr("training.optimizer_help"),
    )
    lora_choices = target_choices(model)
    lora = st.toggle(
        tr("training.lora"), value=False, key="tradeoffs_lora", disabled=not lora_choices, help=tr("training.lora_help")
    )
    lora_rank = st.number_input(
        tr("training.lora_rank"), 1, LORA_RANK_MAX, 8, key="tradeoffs_lora_rank", disabled=not lora
    )
    if state.get("tradeoffs_targets_for") != model:  # a new model: all its projections
        state.tradeoffs_lora_targets = list(lora_choices)
        state.tradeoffs_targets_for = model
    targets = st.multiselect(
        tr("training.lora_targets"),
        lora_choices,
        key="tradeoffs_lora_targets",
        disabled=not lora,
        placeholder=tr("training.lora_targets_none"),
        help=tr("training.lora_targets_help"),
    )
    repeats = st.number_input(tr("tradeoffs.repeats"), 1, 20, 4, key="tradeoffs_repeats")
    warmup = st.number_input(tr("tradeoffs.warmup"), 0, 10, 2, key="tradeoffs_warmup")

spec = SweepSpec(
    model=model,
    seq_lens=tuple(sorted(seq_lens)),
    every_n_layers=tuple(sorted(every_n)) if custom_n and every_n else None,
    offload=offload,
    batch_size=int(batch),
    dtype=dtype,
    repeats=int(repeats),
    warmup=int(warmup),
    optimizer=optimizer,
    lora_rank=int(lora_rank) if lora and lora_choices else None,
    lora_targets=(
        tuple(name for name in lora_choices if name in targets) if lora and set(targets) != set(lora_choices) else None
    ),
)
if not seq_lens:
    st.info(tr("tradeoffs.pick_seq"))
    st.stop()
if spec.lora_rank is not None and not targets:
    st.info(tr("training.lora_targets_needed"))
    st.stop()


def _start() -> None:
    try:
        # The model is built once for the sweep, inside its first device turn, and dropped when the sweep
        # ends: no second cached model outlives it (on a GPU it would count in other sessions' baselines).
        longest = RunSpec(model=spec.model, seq_len=max(spec.seq_lens), batch_size=spec.batch_size, device=spec.device)
        policy.check(longest, ckptlab.describe(spec.model), resolve_device(spec.device).type == "cpu")
        job = SweepJob(
            spec,
            load=lambda run_spec: build_for_key(model_key(run_spec)),
            owner=session_owner(),
            limit_s=policy.run_limit_s,
        )
    except ckptlab.CkptlabError as error:
        state.tradeoffs_error = app_message(error, lang)
        return
    state.tradeoffs_error = ""
    state.tradeoffs_job = job.start()


def _stop() -> None:
    job = state.get("tradeoffs_job")
    if job is not None:
        job.stop()


job: SweepJob | None = state.get("tradeoffs_job")
running = job is not None and job.state().running
start, stop, _ = st.columns([2, 1, 3])
start.button(
    tr("tradeoffs.run"), type="primary", key="tradeoffs_run", on_click=_start, disabled=running, width="stretch"
)
stop.button(tr("tradeoffs.stop"), key="tradeoffs_stop", on_click=_stop, disabled=not running, width="stretch")
if state.get("tradeoffs_error"):
    st.error(state.tradeoffs_error)


@st.fragment(run_every=0.5 if running else None)
def _progress() -> None:
    """While the sweep runs: its progress and the rows so far; when it ends, one full rerun to draw."""
    job = state.get("tradeoffs_job")
    if job is None:
        return
    snapshot = job.state()
    if snapshot.running:
        words = tr("tradeoffs.stopping") if snapshot.stop_requested else snapshot.message
        st.progress(min(snapshot.fraction, 1.0), text=words)
        if snapshot.rows:
            st.dataframe(_table(snapshot.rows), hide_index=True, key="tradeoffs_live")
        return
    if state.get("tradeoffs_shown") is not job:
        state.tradeoffs_shown = job
        if snapshot.result is not None:
            state.tradeoffs_result = snapshot.result
        if snapshot.error:
            state.tradeoffs_error = app_message(snapshot.failure, lang) if snapshot.failure else snapshot.error
        st.rerun()


def _table(rows, checks=()) -> list[dict]:
    return sweep_table(rows, lang, checks)


_progress()

result: SweepResult | None = state.get("tradeoffs_result")
if result is None:
    if running:
        st.stop()  # the fragment above shows the progress
    st.info(tr("tradeoffs.hint"))
    st.stop()

# -- the result ---------------------------------------------------------------------------

provenance = next(
    (provenance_label(row.result.provenance, lang) for row in result.rows if row.result is not None),
    tr("tradeoffs.measured"),
)
st.caption(
    tr(
        "tradeoffs.summary",
        model=f"{result.model} · {training_label(result.spec.run_spec(result.spec.seq_lens[0], None, False), lang)}",
        layers=result.num_layers,
        batch=result.spec.batch_size,
        provenance=provenance,
        rows=len(result.rows),
        seconds=f"{result.elapsed_s:.0f}",
    )
)
busy = sweep_busy_message(result, lang)
if busy:
    st.warning(busy)
if result.cancelled:
    st.warning(tr("tradeoffs.stopped", rows=len(result.rows)))
for note in result.notes:
    st.caption(note)
if not any(row.status == "ok" for row in result.rows):
    st.info(tr("tradeoffs.nothing"))
    st.stop()

measured_lens = sorted({row.seq_len for row in result.rows if row.status == "ok"})
seq_len = st.selectbox(tr("tradeoffs.show_seq"), measured_lens, index=len(measured_lens) - 1, key="tradeoffs_show_seq")

budget_choice = st.selectbox(
    tr("tradeoffs.budget"),
    [CUSTOM, *GPUS],
    key="tradeoffs_gpu",
    format_func=lambda choice: tr("tradeoffs.custom_budget") if choice == CUSTOM else choice,
)
if budget_choice == CUSTOM:
    peaks = [row.peak_bytes for row in result.rows_at(seq_len) if row.peak_bytes is not None]
    default_mib = float(round(sorted(peaks)[len(peaks) // 2] / MIB, 1)) if peaks else 1024.0
    budget_mib = st.number_input(
        tr("tradeoffs.budget_mib"), min_value=1.0, value=default_mib, step=1.0, key="tradeoffs_budget_mib"
    )
    budget: int | str = int(budget_mib * MIB)
else:
    budget = budget_choice
recommendation = recommend(result.rows, budget, seq_len=seq_len)

st.subheader(tr("tradeoffs.h_tradeoff"), anchor=False)
st.plotly_chart(sweep_tradeoff_figure(result, seq_len, recommendation, lang=lang), key="tradeoffs_pareto", theme=None)

st.subheader(tr("tradeoffs.h_recommendation"), anchor=False)
if recommendation.row is not None:
    row = recommendation.row
    st.success(
        tr(
            "tradeoffs.recommended",
            setting=row.setting,
            seq=seq_len,
            ms=milliseconds(row.step_s),
            peak=mib(row.peak_bytes),
            spare=mib(recommendation.margin_bytes),
            budget=recommendation.budget_label,
        )
    )
    st.markdown(i18n.say_all(recommendation.reasons, lang))
    if recommendation.ranked_by == "predicted":
        st.info(tr("tradeoffs.ranked_by_prediction"))
    st.caption(tr("tradeoffs.on_a_model"))
    st.code(recommendation.model_code, language="python")
    st.caption(tr("tradeoffs.with_trainer"))
    st.code(recommendation.trainer_code, language="python")
else:
    st.error(i18n.say_all(recommendation.reasons, lang))
    for advice in recommendation.advice:
        st.markdown(f"- {i18n.say(advice, lang)}")

st.subheader(tr("tradeoffs.h_predicted"), anchor=False)
checks = check_predictions(result)
st.plotly_chart(sweep_prediction_figure(result, checks, seq_len, lang=lang), key="tradeoffs_predicted", theme=None)
st.caption(tr("tradeoffs.predicted_caption"))

st.subheader(tr("tradeoffs.h_seq"), anchor=False)
st.plotly_chart(seq_len_figure(result, lang=lang), key="tradeoffs_seq_len", theme=None)
st.caption(tr("tradeoffs.seq_caption"))

st.subheader(tr("tradeoffs.h_peak"), anchor=False)
st.plotly_chart(sweep_peak_figure(result, seq_len, lang=lang), key="tradeoffs_peak", theme=None)
off = result.off_row(seq_len)
for row in result.rows_at(seq_len):
    st.markdown(f"- {peak_sentence(row, off, lang)}")

st.subheader(tr("tradeoffs.h_table"), anchor=False)
st.dataframe(_table(result.rows, checks), hide_index=True, key="tradeoffs_table")
st.caption(tr("tradeoffs.table_caption"))
stem = f"ckptlab-sweep-{result.model.strip('/').replace('/', '_')}"
csv_button, json_button, _ = st.columns([1, 1, 3])
csv_button.download_button(
    tr("tradeoffs.csv"),
    result.to_csv(),
    file_name=f"{stem}.csv",
    mime="text/csv",
    key="tradeoffs_csv",
    on_click="ignore",
    width="stretch",
)
json_button.download_button(
    tr("tradeoffs.json"),
    result.to_json(),
    file_name=f"{stem}.json",
    mime="application/json",
    key="tradeoffs_json",
    on_click="ignore",
    width="stretch",
)
