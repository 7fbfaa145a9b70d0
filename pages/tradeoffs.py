"""The trade-off explorer: every every_n_layers of one model, measured, predicted, and the fastest that fits.

A flat page: read the widgets, start a :class:`ckptlab.lab.sweepjob.SweepJob` (a background
sweep, one device-queue turn per row), poll it in a fragment with a progress bar and a
Stop button, then render the core's figures from what is kept in the session (``tradeoffs_job``,
``tradeoffs_result``, ``tradeoffs_error``).
"""

from __future__ import annotations

import streamlit as st

import ckptlab
from ckptlab.explore.accuracy import check_predictions
from ckptlab.explore.budget import BUDGET_BOX_GIB, GPUS
from ckptlab.explore.recommend import recommend
from ckptlab.explore.sweep import OFFLOAD_CHOICES, SweepResult, SweepSpec
from ckptlab.lab import tradeoffs_view
from ckptlab.lab.modelbox import model_caption, model_label
from ckptlab.lab.query import LORA_RANK_DEFAULT
from ckptlab.lab.run import build_for_key, model_key
from ckptlab.lab.server import ServerPolicy
from ckptlab.lab.sweepjob import JobState, SweepJob
from ckptlab.lab.workers import WorkerPool
from ckptlab.model.selective import CHOICES as SELECTIVE_CHOICES
from ckptlab.model.selective import NONE
from ckptlab.show import i18n
from ckptlab.show.figures.prediction import sweep_prediction_figure
from ckptlab.show.figures.tradeoff import seq_len_figure, sweep_peak_figure, sweep_tradeoff_figure
from ckptlab.show.noise import sweep_busy_message, sweep_table
from ckptlab.show.peak_words import peak_sentence
from ckptlab.spec import DTYPES, RunSpec
from ckptlab.units import GIB, MIB
from pages._common import (
    download_buttons,
    estimate_text,
    job_buttons,
    language,
    lora_boxes,
    lora_choices,
    offered,
    optimizer_box,
    poll_job,
    preset_infos,
    run_through_app,
    step_boxes,
)
from pages._server import job_workers, server_policy, session_alive, session_owner

run_through_app()

SEQ_CHOICES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
CUSTOM = "custom budget"
# The number boxes' first values are RunSpec's defaults, as the one codec writes them (their limits: offered()).
NUMBER_DEFAULTS = {
    key: value
    for key, value in tradeoffs_view.PAGE.values(RunSpec()).items()
    if key in ("tradeoffs_batch", "tradeoffs_repeats", "tradeoffs_warmup")
}
# The custom budget's box in MiB, within the bounds a page's budget box offers (explore.budget, declared in GiB).
BUDGET_BOX_MIB = tuple(gib * GIB / MIB for gib in BUDGET_BOX_GIB)


def draw_buttons(spec: SweepSpec, policy: ServerPolicy, lang: str) -> bool:
    """Run and Stop, and the last start's error; returns whether a sweep is running."""

    def job() -> SweepJob:
        # The model is built once for the sweep, inside its first device turn, and dropped when the sweep
        # ends: no second cached model outlives it (on a GPU it would count in other sessions' baselines).
        policy.check(tradeoffs_view.longest(spec), preset_infos()[spec.model])
        tradeoffs_view.check_rows_time(spec, policy, simulating)  # a row its turn's limit would stop: refused
        job = SweepJob(
            spec,
            load=lambda run_spec: build_for_key(model_key(run_spec)),
            owner=session_owner(),
            limit_s=policy.run_limit_s,
            workers=job_workers(policy, "sweep"),
            alive=session_alive(),
            memory_cap_bytes=policy.memory_cap_bytes,
            step_seconds=tradeoffs_view.row_step_seconds(spec, simulating),
        )
        # The countdown's start until the sweep's own rows say more: the estimate the page showed before Run.
        job.predicted_s, measured_pace = tradeoffs_view.sweep_estimate(spec, simulating)
        job.predicted_basis = "measured" if measured_pace else "predicted"
        return job

    start = (i18n.t("tradeoffs.run", lang), "tradeoffs_run", job, None)
    running = job_buttons("tradeoffs", [start], i18n.t("tradeoffs.stop", lang), lang)
    if st.session_state.get("tradeoffs_error"):
        st.error(st.session_state.tradeoffs_error)
    return running


lang = language()
policy, _ = server_policy()  # the instructor's limits (ckptlab.lab.server); the lab page shows a bad setting


def simulating() -> WorkerPool | None:
    """Where the sweep's estimate simulates what the shared store lacks: the server's simulation workers."""
    return job_workers(policy, "simulation")


st.title(i18n.t("tradeoffs.title", lang), anchor=False)
st.markdown(i18n.t("tradeoffs.intro", lang))

# -- settings -----------------------------------------------------------------------------

state = st.session_state
with st.sidebar:
    st.header(i18n.t("tradeoffs.sweep", lang), anchor=False)
    model = st.selectbox(  # CPU-sized ones first, labelled as on the Lab page (lab.modelbox)
        i18n.t("common.model", lang),
        list(preset_infos()),
        key="tradeoffs_model",
        format_func=lambda name: model_label(name, preset_infos()[name], lang, grouped=True),
    )
    st.caption(model_caption(preset_infos()[model], lang))
    # 512 tokens by default: at 256 the tiny models' peak is the same for every setting (the gradients and the
    # optimizer hold it: 217.4 MiB off, 210.5 for every every_n_layers on tiny-llama), so the page's first figure
    # would teach nothing; at 512 it spreads from 277.2 MiB off to 219.3 at every_n_layers=1 (sweep, 2 CPU cores).
    seq_lens = st.multiselect(i18n.t("tradeoffs.seq_lens", lang), SEQ_CHOICES, default=[512], key="tradeoffs_seq")
    custom_n = st.toggle(i18n.t("tradeoffs.choose_n", lang), value=False, key="tradeoffs_choose_n")
    state.setdefault("tradeoffs_n", [1, 2, 4])
    if custom_n:
        st.multiselect("every_n_layers", list(range(1, 65)), key="tradeoffs_n")
    else:  # not a box of chips saying "1 2 4" beside a sweep of every value
        state.tradeoffs_n = state.tradeoffs_n  # kept for the toggle: a widget's value is dropped while it is not drawn
        st.caption(i18n.t("tradeoffs.every_n_all", lang, layers=preset_infos()[model].num_layers))
    st.radio(
        i18n.t("tradeoffs.offload", lang),
        OFFLOAD_CHOICES,
        horizontal=True,
        key="tradeoffs_offload",
        format_func=lambda choice: i18n.t(f"tradeoffs.offload_{choice}", lang),
        help=i18n.t("tradeoffs.offload_help", lang),
    )
    st.multiselect(
        i18n.t("selective.sweep_label", lang),
        SELECTIVE_CHOICES,
        default=[NONE],
        key="tradeoffs_selective",
        format_func=lambda choice: i18n.t(f"selective.policy_{choice}", lang),
        help=i18n.t("selective.sweep_help", lang),
    )
    for key, value in NUMBER_DEFAULTS.items():
        state.setdefault(key, value)  # RunSpec's defaults where the session has none yet
    st.number_input(i18n.t("tradeoffs.batch", lang), **offered("batch_size"), step=1, key="tradeoffs_batch")
    st.selectbox("dtype", DTYPES, key="tradeoffs_dtype")
    optimizer_box("tradeoffs_optimizer", lang)
    step_boxes("tradeoffs", lang)
    choices = lora_choices(model)
    state.setdefault("tradeoffs_lora", False)
    state.setdefault("tradeoffs_lora_rank", LORA_RANK_DEFAULT)
    if state.get("tradeoffs_targets_for") != model:  # a new model: all its projections
        state.tradeoffs_lora_targets = list(choices)
        state.tradeoffs_targets_for = model
    lora_boxes("tradeoffs", choices, lang)
    st.number_input(i18n.t("tradeoffs.repeats", lang), **offered("repeats"), step=1, key="tradeoffs_repeats")
    st.number_input(i18n.t("tradeoffs.warmup", lang), **offered("warmup"), step=1, key="tradeoffs_warmup")

spec = tradeoffs_view.spec_from_widgets(state, choices)
if not seq_lens:
    st.info(i18n.t("tradeoffs.pick_seq", lang))
    st.stop()
if spec.lora_rank is not None and not state.tradeoffs_lora_targets:
    st.info(i18n.t("training.lora_targets_needed", lang))
    st.stop()


running = draw_buttons(spec, policy, lang)


def keep_sweep(snapshot: JobState) -> None:
    if snapshot.result is not None:
        state.tradeoffs_result = snapshot.result


def live_rows(snapshot: JobState) -> None:
    if snapshot.rows:
        st.dataframe(sweep_table(snapshot.rows, lang, ()), hide_index=True, key="tradeoffs_live")


def sweep_words(job: SweepJob, snapshot: JobState) -> str:
    return tradeoffs_view.progress_words(snapshot.message, snapshot.stop_requested, lang)


poll_job("tradeoffs", running, lang, sweep_words, keep_sweep, live_rows)

result: SweepResult | None = state.get("tradeoffs_result")
if result is None:
    if running:
        st.stop()  # the fragment above shows the progress
    try:
        seconds, measured_pace = tradeoffs_view.sweep_estimate(spec, simulating)
        basis = "measured" if measured_pace else "predicted"
        words = i18n.t("wait.unknown", lang) if seconds is None else estimate_text(seconds, basis, lang, left=False)
        estimate = "\n\n" + i18n.t("wait.sweep_estimate", lang, estimate=words)
    except ckptlab.CkptlabError:  # a sweep that cannot be planned: the Run button's check says why
        estimate = ""
    st.info(i18n.t("tradeoffs.hint", lang) + estimate)
    st.stop()

# -- the result ---------------------------------------------------------------------------

st.caption(tradeoffs_view.summary(result, lang))
busy = sweep_busy_message(result, lang)
if busy:
    st.warning(busy)
if result.cancelled:
    st.warning(i18n.t("tradeoffs.stopped", lang, rows=len(result.rows)))
for note in result.notes:
    st.caption(i18n.say(note, lang))
if not any(row.status == "ok" for row in result.rows):
    st.info(i18n.t("tradeoffs.nothing", lang))
    st.stop()

measured_lens = sorted({row.seq_len for row in result.rows if row.status == "ok"})
seq_len = st.selectbox(
    i18n.t("tradeoffs.show_seq", lang), measured_lens, index=len(measured_lens) - 1, key="tradeoffs_show_seq"
)

budget_choice = st.selectbox(
    i18n.t("tradeoffs.budget", lang),
    [CUSTOM, *GPUS],
    key="tradeoffs_gpu",
    format_func=lambda choice: i18n.t("tradeoffs.custom_budget", lang) if choice == CUSTOM else choice,
)
if budget_choice == CUSTOM:
    low_mib, high_mib = BUDGET_BOX_MIB
    # The median peak's budget, inside the box (a box refuses a first value outside its bounds).
    default_mib = min(max(tradeoffs_view.default_budget_mib(result, seq_len), low_mib), high_mib)
    budget_mib = st.number_input(
        i18n.t("tradeoffs.budget_mib", lang),
        min_value=low_mib,
        max_value=high_mib,
        value=default_mib,
        step=1.0,
        key="tradeoffs_budget_mib",
    )
    budget: int | str = int(budget_mib * MIB)
else:
    budget = budget_choice
recommendation = recommend(result.rows, budget, seq_len=seq_len)

st.subheader(i18n.t("tradeoffs.h_tradeoff", lang), anchor=False)
st.plotly_chart(sweep_tradeoff_figure(result, seq_len, recommendation, lang=lang), key="tradeoffs_pareto", theme=None)

st.subheader(i18n.t("tradeoffs.h_recommendation", lang), anchor=False)
if recommendation.row is not None:
    st.success(tradeoffs_view.recommended(recommendation, seq_len, lang))
    st.markdown(i18n.say(recommendation.reasons, lang))
    if recommendation.ranked_by == "predicted":
        st.info(i18n.t("tradeoffs.ranked_by_prediction", lang))
    st.caption(i18n.t("tradeoffs.code_caption", lang))
    st.code(recommendation.model_code, language="python")  # the whole box, TrainingArguments included
else:
    st.error(i18n.say(recommendation.reasons, lang))
    for advice in recommendation.advice:
        st.markdown(f"- {i18n.say(advice, lang)}")

st.subheader(i18n.t("tradeoffs.h_predicted", lang), anchor=False)
checks = check_predictions(result)
st.plotly_chart(sweep_prediction_figure(result, checks, seq_len, lang=lang), key="tradeoffs_predicted", theme=None)
st.caption(i18n.t("tradeoffs.predicted_caption", lang))

st.subheader(i18n.t("tradeoffs.h_seq", lang), anchor=False)
st.plotly_chart(seq_len_figure(result, lang=lang), key="tradeoffs_seq_len", theme=None)
st.caption(i18n.t("tradeoffs.seq_caption", lang))

st.subheader(i18n.t("tradeoffs.h_peak", lang), anchor=False)
st.plotly_chart(sweep_peak_figure(result, seq_len, lang=lang), key="tradeoffs_peak", theme=None)
off = result.off_row(seq_len)
for row in result.rows_at(seq_len):
    st.markdown(f"- {peak_sentence(row, off, lang)}")

st.subheader(i18n.t("tradeoffs.h_table", lang), anchor=False)
st.dataframe(sweep_table(result.rows, lang, checks), hide_index=True, key="tradeoffs_table")
st.caption(i18n.t("tradeoffs.table_caption", lang))
download_buttons(
    tradeoffs_view.file_stem(result),
    [
        (i18n.t("tradeoffs.csv", lang), result.to_csv(), "csv", "tradeoffs_csv"),
        (i18n.t("tradeoffs.json", lang), result.to_json(), "json", "tradeoffs_json"),
    ],
)
