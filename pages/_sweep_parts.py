"""The Trade-offs page's sweep: Run and Stop, the background job, its progress and rows so far. Not a page.

The sweep runs on a thread (:class:`ckptlab.lab.sweepjob.SweepJob`, one device-queue turn per row);
the page polls it in a fragment and keeps what it produced in the session (``tradeoffs_job``,
``tradeoffs_result``, ``tradeoffs_error``).
"""

from __future__ import annotations

import streamlit as st

import ckptlab
from ckptlab.explore.sweep import SweepSpec
from ckptlab.lab import tradeoffspage
from ckptlab.lab.run import build_for_key, model_key
from ckptlab.lab.server import ServerPolicy
from ckptlab.lab.sweepjob import SweepJob
from ckptlab.show import i18n
from ckptlab.show.noise import sweep_table
from ckptlab.show.wording import app_message
from ckptlab.step.preflight import resolve_device
from pages._common import estimate_text, preset_infos
from pages._server import job_workers, session_alive, session_owner

POLL_S = 0.5  # how often the progress bar looks at a running sweep


def draw_buttons(spec: SweepSpec, policy: ServerPolicy, lang: str) -> bool:
    """Run and Stop, and the last start's error; returns whether a sweep is running."""
    state = st.session_state

    def start() -> None:
        try:
            # The model is built once for the sweep, inside its first device turn, and dropped when the sweep
            # ends: no second cached model outlives it (on a GPU it would count in other sessions' baselines).
            on_cpu = resolve_device(spec.device).type == "cpu"
            policy.check(tradeoffspage.longest(spec), preset_infos()[spec.model], on_cpu)
            job = SweepJob(
                spec,
                load=lambda run_spec: build_for_key(model_key(run_spec)),
                owner=session_owner(),
                limit_s=policy.run_limit_s,
                workers=job_workers(policy, "sweep"),
                alive=session_alive(),
                memory_cap_bytes=policy.memory_cap_bytes,
            )
        except ckptlab.CkptlabError as error:
            state.tradeoffs_error = app_message(error, lang)
            return
        state.tradeoffs_error = ""
        state.tradeoffs_job = job.start()

    def stop() -> None:
        job = state.get("tradeoffs_job")
        if job is not None:
            job.stop()

    job: SweepJob | None = state.get("tradeoffs_job")
    running = job is not None and job.state().running
    start_column, stop_column, _ = st.columns([2, 1, 3])
    start_column.button(
        i18n.t("tradeoffs.run", lang),
        type="primary",
        key="tradeoffs_run",
        on_click=start,
        disabled=running,
        width="stretch",
    )
    stop_column.button(
        i18n.t("tradeoffs.stop", lang), key="tradeoffs_stop", on_click=stop, disabled=not running, width="stretch"
    )
    if state.get("tradeoffs_error"):
        st.error(state.tradeoffs_error)
    return running


def poll(running: bool, lang: str) -> None:
    """While the sweep runs: its progress and the rows so far; when it ends, one full rerun to draw."""

    @st.fragment(run_every=POLL_S if running else None)
    def progress() -> None:
        state = st.session_state
        job = state.get("tradeoffs_job")
        if job is None:
            return
        snapshot = job.state()
        if snapshot.running:
            words = tradeoffspage.progress_words(snapshot.message, snapshot.stop_requested, lang)
            left = job.left_s()
            if left is not None and not snapshot.stop_requested:
                words += " · " + estimate_text(left, "so_far", lang)
            st.progress(min(snapshot.fraction, 1.0), text=lang)
            if snapshot.rows:
                st.dataframe(sweep_table(snapshot.rows, lang, ()), hide_index=True, key="tradeoffs_live")
            return
        if state.get("tradeoffs_shown") is not job:
            state.tradeoffs_shown = job
            if snapshot.result is not None:
                state.tradeoffs_result = snapshot.result
            if snapshot.error:
                # The lab's own error, or a bug in the sweep's words (a Fact), in the page's language.
                state.tradeoffs_error = (
                    app_message(snapshot.failure, lang) if snapshot.failure else i18n.say(snapshot.error, lang)
                )
            st.rerun()

    progress()
