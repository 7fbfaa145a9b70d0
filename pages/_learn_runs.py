"""The Learn pages' one way to get their runs: the server's shared runs, drawn as they come (the sharding idea: simulate).

Not a page (app.py's navigation lists the pages); the Timeline, Lesson and Exercises pages
import it as ``pages._learn_runs``. A page asks for its runs and draws its words at once; the
runs are measured once for the whole server in the background (``ckptlab.lab.learnruns``) while
a fragment shows their progress and estimate, and reruns the page when they are there.
"""

from __future__ import annotations

from typing import TypeVar

import streamlit as st

import ckptlab
from ckptlab.lab import learn as learnrun
from ckptlab.lab.learnruns import (
    LEARN_RUNS,
    How,
    IdeaJob,
    RunsState,
    allocator_job,
    qlora_job,
    rerun_job,
    sharding_job,
)
from ckptlab.results import RunResult
from ckptlab.show.i18n import t
from ckptlab.show.wording import app_message
from ckptlab.spec import RunSpec
from pages._common import countdown_text, estimate_text, language
from pages._server import job_workers, server_policy

T = TypeVar("T")
POLL_S = 1.0  # how often a waiting page looks at the shared runs: each look is a cheap read of the store


def learn_how() -> How:
    """How the server measures the shared runs: its limit per run and its device pool."""
    policy = server_policy()[0]
    return How(limit_s=policy.run_limit_s, workers=job_workers(policy, "device"))


def measured(specs: list[RunSpec], lang: str, wait: bool = False) -> dict[RunSpec, RunResult] | None:
    """Results for ``specs`` (and their checkpointing-off references), from the server's shared runs.

    Args:
        specs: the settings a page shows.
        lang: the page's language, for the progress and the messages.
        wait: block until they are measured, with progress (the instructor's Open, which needs them to open a
            round); else return at once.

    Returns:
        The session's results by spec; None while they are measured (a fragment shows the progress and reruns
        the page when they are there) or when one could not be measured (the message and a Retry are shown).
    """
    cache = st.session_state.setdefault("learn_results", {})
    missing = [spec for spec in specs if spec not in cache]
    if not missing:
        return cache
    how = learn_how()
    LEARN_RUNS.ask(missing, how)
    if wait:
        with st.status(t("run.measuring", lang), expanded=True) as status:
            bar = st.progress(0.0)
            now = LEARN_RUNS.wait(missing, lambda state: bar.progress(state.fraction, text=wait_words(state, lang)))
            if now.failures:
                status.update(label=t("run.failed", lang), state="error")
            else:
                status.update(label=t("run.measured", lang, count=len(missing)), state="complete")
    else:
        now = LEARN_RUNS.state(missing)
        if not now.settled:
            follow(missing, lang)
            return None
    if now.failures:
        lang = language()
        error = next(iter(now.failures.values()))
        st.error(t("run.failed", lang))
        st.code(app_message(error, lang) if isinstance(error, ckptlab.CkptlabError) else repr(error), language=None)
        st.button(t("wait.learn_retry", lang), key="learn_retry", on_click=LEARN_RUNS.ask, args=(missing, how, True))
        return None
    cache.update(now.results)
    return cache


def follow(specs: list[RunSpec], lang: str) -> None:
    """The shared runs' progress, refreshed by a fragment; once they are all there, one full rerun to draw."""

    @st.fragment(run_every=POLL_S)
    def progress() -> None:
        now = LEARN_RUNS.state(specs)
        if now.settled:
            st.rerun(scope="app")
        st.progress(min(max(now.fraction, 0.0), 1.0), text=wait_words(now, lang))

    progress()


def wait_words(state: RunsState, lang: str) -> str:
    """The progress bar's text: how many measured, the estimate left, and the device line when it waits."""
    words = t(
        "wait.learn_progress",
        lang,
        done=state.asked - len(state.missing),
        total=state.asked,
        left=t("wait.unknown", lang)
        if state.left_s is None
        else estimate_text(state.left_s, "measured" if state.measured_pace else "predicted", lang),
    )
    if state.ahead:
        words += " · " + t("run.waiting", lang, ahead=state.ahead)
    return words


def simulated_sharding(lang: str) -> learnrun.ShardingIdea | None:
    """The lesson's sharding idea, simulated once for the server in the background (``ckptlab.lab.learnruns``)."""
    return simulated_idea(sharding_job(job_workers(server_policy()[0], "simulation")), "lesson.shard.simulating", lang)


def simulated_qlora(lang: str) -> learnrun.QloraIdea | None:
    """The lesson's 4-bit idea, simulated once for the server in the background (``ckptlab.lab.learnruns``)."""
    return simulated_idea(qlora_job(job_workers(server_policy()[0], "simulation")), "lesson.qlora.simulating", lang)


def simulated_allocator(lang: str) -> learnrun.AllocatorIdea | None:
    """The lesson's allocator idea, simulated once for the server in the background (``ckptlab.lab.learnruns``)."""
    job = allocator_job(job_workers(server_policy()[0], "simulation"))
    return simulated_idea(job, "lesson.allocator.simulating", lang)


def simulated_rerun(lang: str) -> learnrun.RerunIdea | None:
    """The lesson's time idea, simulated once for the server in the background (``ckptlab.lab.learnruns``)."""
    return simulated_idea(rerun_job(job_workers(server_policy()[0], "simulation")), "lesson.rerun.simulating", lang)


def simulated_idea(job: IdeaJob[T], simulating: str, lang: str) -> T | None:
    """A simulated idea's job drawn: its idea, or its progress (``simulating``: the bar's words' key) or failure.

    Returns:
        The idea; None while it is simulated (a fragment shows the progress and reruns the page when it is there)
        or when it could not be (the message is shown).
    """
    finished, _, idea, failure = job.outcome()
    if idea is not None:
        return idea
    if finished:
        st.error(t("run.failed", lang))
        lang = language()
        st.code(
            app_message(failure, lang) if isinstance(failure, ckptlab.CkptlabError) else str(failure), language=None
        )
        return None

    @st.fragment(run_every=POLL_S)
    def progress() -> None:
        finished, fraction, _, _ = job.outcome()
        if finished:
            st.rerun(scope="app")
        left = countdown_text(job.countdown(), lang)
        text = t(simulating, lang) + (" · " + left if left else "")
        st.progress(min(max(fraction, 0.0), 1.0), text=text)

    progress()
    return None
