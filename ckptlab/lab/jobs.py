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
from dataclasses import dataclass, replace

from ..errors import CkptlabError
from ..fact import Fact
from ..results import RunResult

STARTING = Fact("progress.starting")  # a job's progress line before its work reports


REVISED_BY = 1.1  # a new reading this much above the count down so far is a revision, said as one
SO_FAR_FROM = 0.05  # of the work measured before the work's own pace is trusted over the prediction


@dataclass(frozen=True)
class Countdown:
    """Seconds left of a piece of work, read at ``at`` (``time.monotonic()``) and counted down from there.

    ``basis``: where the figure comes from, "so_far" (the seconds the work done took), "predicted" or "measured"
    (a prediction before enough work was measured: the FLOP count at the device's speed, or scaled by this server's
    runs). ``why``: "" while it counts down as it should; "waiting" (for the device queue: no work moves, the
    figure is held), "overdue" (the work runs past the figure: it holds at none left and says so), "revised" (a
    new reading above the count down: the work done went slower than it looked).
    """

    seconds: float | None  # None: nothing to count from yet (no prediction, no work measured)
    basis: str = "so_far"
    why: str = ""
    at: float = 0.0  # when ``seconds`` was read
    fraction: float = 0.0  # of the work done at that reading
    # (seconds worked, fraction) at the first reading past none done: the pace is measured from there, so what came
    # before it (building a model, starting a worker) is not scaled up as if it were the work's own pace.
    origin: tuple[float, float] | None = None

    def left(self, now: float) -> float | None:
        """The seconds left at ``now``: counted down from the reading, never below none."""
        return None if self.seconds is None else max(self.seconds - (now - self.at), 0.0)


def count_down(
    fraction: float,
    working_s: float,
    now: float,
    before: Countdown | None = None,
    waiting: bool = False,
    predicted_s: float | None = None,
    basis: str = "predicted",
) -> Countdown:
    """The one rule of a countdown, from measured progress: ``fraction`` of the work done after ``working_s``
    seconds of work (waits for the device left out), read at ``now``, after the reading ``before``.

    A new fraction is a new reading: the seconds the work took since its first reading, over the work done since,
    times the work left, once :data:`SO_FAR_FROM` of it is measured so; before that ``predicted_s`` (the whole
    work's, said with ``basis``) less what is done. Between readings it counts down with the clock; at zero it holds
    there, "overdue"; a reading above the count down so far is "revised"; while ``waiting`` the figure is held.
    """
    fraction = min(max(fraction, 0.0), 1.0)
    origin = before.origin if before is not None else None
    left_before = None if before is None else before.left(now)
    if waiting:  # held at what was left when the wait began
        held = before.seconds if before is not None and before.why == "waiting" else left_before
        kept = before.fraction if before is not None else 0.0
        return Countdown(held, before.basis if before else basis, "waiting", now, kept, origin)
    if before is not None and fraction <= before.fraction:  # no new reading: count down with the clock
        if left_before is None:
            return before
        # A revision stays said until the next reading; at none left the work is overdue.
        return replace(before, why="overdue" if left_before <= 0 else "revised" if before.why == "revised" else "")
    if origin is None and fraction > 0:
        origin = (working_s, fraction)
    if origin is not None and fraction - origin[1] >= SO_FAR_FROM and working_s > origin[0]:
        seconds, basis = (working_s - origin[0]) / (fraction - origin[1]) * (1 - fraction), "so_far"
    elif predicted_s is not None:
        seconds = predicted_s * (1 - fraction)
    else:
        return Countdown(None, basis, "", now, fraction, origin)
    revised = left_before is not None and seconds > left_before * REVISED_BY + 1
    return Countdown(seconds, basis, "revised" if revised else "", now, fraction, origin)


class BackgroundJob:
    """The thread, the Stop event, the progress and the results collected so far.

    A subclass implements :meth:`_run` (called on the thread), passing :meth:`_progress`,
    :meth:`_collect` and ``self._stop`` to the work, and reports from :meth:`state`; :meth:`_waiting` while the
    work waits for the device. :attr:`predicted_s` (the whole work's predicted seconds, when the page has one) is
    the countdown's start until the work's own pace says more.
    """

    predicted_s: float | None = None
    predicted_basis: str = "predicted"

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
        self._waited_s = 0.0  # seconds spent waiting for the device, not working
        self._waiting_since: float | None = None
        self._countdown: Countdown | None = None
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> BackgroundJob:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the piece of work in flight; the results so far are kept."""
        self._stop.set()

    def countdown(self, now: float | None = None) -> Countdown:
        """The seconds left now (:func:`count_down` of the progress so far, after the last reading)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            since = self._waiting_since
            working = now - self._started - self._waited_s - (0.0 if since is None else now - since)
            self._countdown = count_down(
                self._fraction, working, now, self._countdown, since is not None, self.predicted_s, self.predicted_basis
            )
            return self._countdown

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
        """Keep the work's progress line (a fact: a page says it in its language); the work moves again."""
        with self._lock:
            self._message, self._fraction = message, fraction
            self._end_wait()

    def _waiting(self, message: Fact) -> None:
        """The work waits for the device (``message`` says for what): the countdown holds until it moves again."""
        with self._lock:
            self._message = message
            if self._waiting_since is None:
                self._waiting_since = time.monotonic()

    def _end_wait(self) -> None:
        if self._waiting_since is not None:
            self._waited_s += time.monotonic() - self._waiting_since
            self._waiting_since = None

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
