"""The Learn pages' one way to get their runs: measure what the session lacks (the sharding idea: simulate), with progress.

Not a page (app.py's navigation lists the pages); the Timeline, Lesson and Exercises pages
import it as ``pages._learn_runs``. It shows a status box while it measures, so it lives
with the pages and not in the core, which never imports streamlit.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

import ckptlab
from ckptlab.lab import learn as learnrun
from ckptlab.results import RunResult
from ckptlab.show.wording import app_message
from ckptlab.spec import RunSpec
from pages._common import language
from pages._server import job_workers, server_policy, session_owner


def measured(specs: list[RunSpec], tr: Callable[..., str]) -> dict[RunSpec, RunResult] | None:
    """Results for ``specs`` (and their checkpointing-off references) from this session, measuring what is missing.

    Args:
        specs: the settings a page shows.
        tr: the page's translator, for the status messages.

    Returns:
        The session's results by spec, or None when a run could not be made (the message is shown).
    """
    cache = st.session_state.setdefault("learn_results", {})
    missing = [spec for spec in specs if spec not in cache]
    if not missing:
        return cache
    with st.status(tr("run.measuring"), expanded=False) as status:
        bar = st.progress(0.0)

        def progress(message: str, fraction: float) -> None:
            bar.progress(min(max(fraction, 0.0), 1.0))

        def on_wait(ahead: int) -> None:
            status.update(label=tr("run.waiting", ahead=ahead))

        try:
            policy = server_policy()[0]
            cache.update(
                learnrun.measure_all(
                    missing,
                    progress=progress,
                    on_wait=on_wait,
                    owner=session_owner(),
                    limit_s=policy.run_limit_s,
                    workers=job_workers(policy, "device"),
                )
            )
        except ckptlab.CkptlabError as error:
            status.update(label=tr("run.failed"), state="error", expanded=True)
            st.code(app_message(error, language()[0]), language=None)
            return None
        status.update(label=tr("run.measured", count=len(missing)), state="complete")
    return cache


def simulated_sharding(tr: Callable[..., str]) -> learnrun.ShardingIdea:
    """The lesson's sharding idea, simulated once per session with a status box (kept in ``lesson_shard``).

    Stops the page with the error shown when the simulation cannot run.
    """
    state = st.session_state
    if "lesson_shard" not in state:
        with st.status(tr("lesson.shard.simulating"), expanded=False) as status:
            bar = st.progress(0.0)
            try:
                state.lesson_shard = learnrun.sharding_idea(
                    progress=lambda m, f: bar.progress(min(max(f, 0.0), 1.0)),
                    workers=job_workers(server_policy()[0], "simulation"),
                )
            except ckptlab.CkptlabError as error:
                status.update(label=tr("run.failed"), state="error", expanded=True)
                st.code(str(error), language=None)
                st.stop()
            status.update(label=tr("lesson.shard.simulated"), state="complete")
    return state.lesson_shard
