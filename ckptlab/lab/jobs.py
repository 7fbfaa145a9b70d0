"""Work on a background thread that a page polls: progress, results so far, Stop that keeps them.

A Streamlit script cannot be stopped between two steps of its own work: a click reruns the
script and interrupts what is in flight. So a page starts a job, which works on its own
thread and collects its results as they come, and polls it on each rerun.
:class:`~ckptlab.lab.sweepjob.SweepJob` (measured sweeps) and :class:`~ckptlab.lab.scalejob.ScaleJob`
(simulations) share this mechanism and differ only in their work.
"""

from __future__ import annotations

import threading
import time

from ..errors import CkptlabError
from ..message import Message
from ..results import RunResult

STARTING = Message("starting", key="progress.starting")  # a job's progress line before its work reports


class BackgroundJob:
    """The thread, the Stop event, the progress and the results collected so far.

    A subclass implements :meth:`_run` (called on the thread), passing :meth:`_progress`,
    :meth:`_collect` and ``self._stop`` to the work, and reports from :meth:`state`.
    """

    def __init__(self, thread_name: str, message: str = STARTING) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._message, self._fraction = message, 0.0
        self._results: list[RunResult] = []
        self._error = ""
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

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError

    def _progress(self, message: str, fraction: float) -> None:
        """Keep the work's progress line (a :class:`Message` where the core says it: a page says it in its language)."""
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

    def _fail(self, error: Exception) -> None:
        """Keep why the work failed: the lab's own error as it is (a page says it in its language), a bug briefly."""
        with self._lock:
            if isinstance(error, CkptlabError):
                self._error, self._failure = str(error), error
            else:  # a bug, not bad input: say it briefly, the page's words around it
                self._error, self._failure = f"{type(error).__name__}: {error}", None
