"""Work on a background thread that a page polls: progress, results so far, Stop that keeps them.

A Streamlit script cannot be stopped between two steps of its own work: a click reruns the
script and interrupts what is in flight. So a page starts a job, which works on its own
thread and collects its results as they come, and polls it on each rerun.
:class:`~ckptlab.lab.sweepjob.SweepJob` (measured sweeps) and :class:`~ckptlab.lab.scalejob.ScaleJob`
(simulations) share this mechanism and differ only in their work. Given a
:class:`~ckptlab.lab.workers.WorkerPool`, the work itself runs in a worker process and this
thread only drives it: the job's callbacks still run here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..errors import CkptlabError
from ..fact import Fact
from ..results import RunResult

STARTING = Fact("progress.starting")  # a job's progress line before its work reports


class BackgroundJob:
    """The thread, the Stop event, the progress and the results collected so far.

    A subclass implements :meth:`_run` (called on the thread), passing :meth:`_progress`,
    :meth:`_collect` and ``self._stop`` to the work, and reports from :meth:`state`.
    """

    def __init__(self, thread_name: str, message: Fact = STARTING, alive: Callable[[], bool] | None = None) -> None:
        self._alive = alive  # False once the session that started the job is gone: the job then ends
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._message, self._fraction = message, 0.0
        self._results: list[RunResult] = []
        self._error: str | Fact = ""  # the lab's error's English, or a bug's words (a fact, with ``bug_words``)
        self._failure: Exception | None = None  # the error behind ``_error``, for a page to say in its language
        self._finished = False
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> BackgroundJob:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the piece of work in flight; the results so far are kept."""
        self._stop.set()

    def left_s(self) -> float | None:
        """Seconds left at the pace so far (the time since the start over the fraction done); None before any."""
        with self._lock:
            fraction = self._fraction
        if not 0 < fraction < 1:
            return None
        return (time.monotonic() - self._started) * (1 - fraction) / fraction

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _gone(self) -> bool:
        """The session that started the job is gone (a closed tab): nobody will read what it makes."""
        return self._alive is not None and not self._alive()

    def _stopping(self) -> bool:
        """Stop pressed or the session gone: the job ends, keeping what it made."""
        return self._stop.is_set() or self._gone()

    def _run(self) -> None:
        raise NotImplementedError

    def _progress(self, message: Fact, fraction: float) -> None:
        """Keep the work's progress line (a fact: a page says it in its language)."""
        with self._lock:
            self._message, self._fraction = message, fraction

    def _collect(self, result: RunResult) -> None:
        """Keep ``result``; one for a spec already kept replaces it (a sweep reports a row's memory, then its time)."""
        with self._lock:
            for index, kept in enumerate(self._results):
                if kept.spec == result.spec:
                    self._results[index] = result
                    return
            self._results.append(result)

    def _results_so_far(self) -> list[RunResult]:
        with self._lock:
            return list(self._results)

    def _fail(self, error: Exception, bug_words: Callable[[str], Fact] | None = None) -> None:
        """Keep why the work failed: the lab's own error as it is (a page says it in its language), a bug briefly.

        The one home of "a job failed". ``bug_words``: for a bug, the job's own sentence around its
        type and message (a sweep's says the rows measured are kept), a :class:`Fact` a page
        says in its language; without it a bug is its type and message alone, for the page's words
        around it.
        """
        with self._lock:
            if isinstance(error, CkptlabError):
                self._error, self._failure = str(error), error
                return
            detail = f"{type(error).__name__}: {error}"  # a bug, not bad input: say it briefly
            self._error, self._failure = (detail if bug_words is None else bug_words(detail)), None
