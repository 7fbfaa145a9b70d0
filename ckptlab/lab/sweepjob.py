"""A sweep running in the background, for a page that must stay responsive: progress, live rows, Stop.

A Streamlit script that ran a sweep itself could not be stopped between rows: a click
reruns the script and interrupts the step in flight. So the page starts a
:class:`SweepJob`, which runs :func:`ckptlab.explore.sweep.sweep` on its own thread, one device
turn per row (:mod:`ckptlab.lab.runqueue`, so that one measured run uses the device at a
time across sessions), and the page polls it. ``stop()`` sets the sweep's cancel event:
the row in flight finishes, no other starts, and the rows measured are kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from transformers import PreTrainedModel

from ..errors import RunStoppedError
from ..explore.sweep import SweepResult, SweepRow, SweepSpec, plan_sweep, rows_from_results, sweep
from ..fact import Fact
from ..model.catalog import ModelInfo
from ..spec import RunSpec
from ..step.stopping import DONE, prefixed
from .jobs import BackgroundJob
from .run import TurnStopper, time_limit_error
from .runqueue import DEFAULT_TIMEOUT_S, DEVICE_QUEUE, DeviceQueue
from .workers import WorkerPool

Loader = Callable[[RunSpec], tuple[PreTrainedModel, ModelInfo]]


class _Stopped(Exception):
    """Raised from a device-queue wait to abandon it when Stop was pressed."""


def _rows_kept(detail: str) -> Fact:
    """A sweep's bug: what failed, and that the rows measured before it are kept."""
    return Fact("sweep.failed_rows_kept", {"error": detail})


@dataclass(frozen=True)
class JobState:
    """A snapshot of the job for one render of the page."""

    running: bool  # the thread is still working
    message: Fact  # what is happening now
    fraction: float  # of the sweep done, in [0, 1]
    rows: list[SweepRow]  # the rows measured so far (ratios against the off row of each length, once it exists)
    result: SweepResult | None  # when finished (complete or stopped)
    error: str | Fact  # why the sweep could not run: the lab's error's English, or a bug's fact; "" otherwise
    failure: Exception | None  # the lab's error behind ``error`` (a page translates it); None otherwise
    stop_requested: bool  # Stop was pressed


class SweepJob(BackgroundJob):
    """One sweep on a background thread.

    Args:
        spec: the sweep.
        load: builds or returns the (cached) model for a spec; called on the job's thread.
        queue: the device queue each row takes a turn on.
        timeout: seconds a row waits for the device at most.
        owner: who asks (the browser session): it holds one place in the device queue at a
            time, so its lab Run waits for the sweep rather than stacking beside it.
        limit_s: seconds each row's turn may hold the device.
        workers: sweep in a worker process of this pool (``load`` is then not used: the worker builds
            the model); its rows still take their turns here, and a turn past ``limit_s`` kills the worker.
        alive: False once the session that started the sweep is gone; the sweep then ends.
        memory_cap_bytes: with ``workers``, the resident memory the worker may reach before it is killed.
        step_seconds: each row's predicted step (``tradeoffs_view.row_step_seconds``): the fraction done moves as
            the predicted time does (:func:`ckptlab.explore.sweep.sweep_shares`).

    Raises:
        SpecError, ModelLoadError: bad input, from the constructor, before any thread starts.
    """

    def __init__(
        self,
        spec: SweepSpec,
        load: Loader | None = None,
        queue: DeviceQueue = DEVICE_QUEUE,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        owner: str | None = None,
        limit_s: float | None = None,
        workers: WorkerPool | None = None,
        alive: Callable[[], bool] | None = None,
        memory_cap_bytes: int | None = None,
        step_seconds: Mapping[RunSpec, float] | None = None,
    ) -> None:
        self.plan = plan_sweep(spec)  # validates: bad input never reaches the thread
        self.spec = spec
        self._load = load
        self._queue = queue
        self._timeout = timeout
        self._owner = owner
        self._limit_s = limit_s
        self._held: TurnStopper | None = None  # the turn held now, with its time limit
        self._timed_out: TurnStopper | None = None  # the turn the time limit stopped
        self._result: SweepResult | None = None
        self._workers, self._memory_cap_bytes = workers, memory_cap_bytes
        self._step_seconds = dict(step_seconds or {})
        super().__init__("ckptlab-sweep", message=Fact("progress.waiting_to_start"), alive=alive)

    def state(self) -> JobState:
        with self._lock:
            return JobState(
                running=not self._finished,
                message=self._message,
                fraction=self._fraction,
                rows=rows_from_results(self._results),
                result=self._result,
                error=self._error,
                failure=self._failure,
                stop_requested=self._stop.is_set(),
            )

    # -- the thread ------------------------------------------------------------------------

    def _turn(self, label: str) -> AbstractContextManager[None]:
        def on_wait(ahead: int) -> None:
            if self._stopping():
                raise _Stopped
            waiting = Fact(
                "progress.waiting_ahead_one" if ahead == 1 else "progress.waiting_ahead_many", {"ahead": ahead}
            )
            self._waiting(prefixed(Fact("progress.label", {"label": label}), waiting))  # the countdown holds

        turn = self._queue.turn(
            on_wait=on_wait, timeout=self._timeout, label=f"sweep {self.spec.model}: {label}", owner=self._owner
        )
        return self._limited(turn)

    @contextmanager
    def _limited(self, turn: AbstractContextManager[object]) -> Iterator[None]:
        """Hold ``turn`` with the server's time limit running (``limit_s``): each turn is one run of the sweep."""
        with turn:
            self._held = TurnStopper(None, self._limit_s)
            try:
                yield
            finally:
                self._held = None

    def _over_limit(self) -> bool:
        """The turn held now ran past the server's time limit (remembered, to say so); asked inside a row's step."""
        held = self._held
        if held is not None and held.timed_out():
            self._timed_out = held
        return self._timed_out is not None

    def _should_stop(self) -> bool:
        """Stop pressed (the row in flight finishes), the session gone, or the time limit reached; asked between
        rows and steps."""
        return self._stopping() or self._over_limit()

    def _sweep(self) -> SweepResult:
        if self._workers is None:
            return sweep(  # the module's, looked up on each sweep: a page's tests replace it (tests/app/given_sweep.py)
                self.spec,
                progress=self._progress,
                cancel=self._should_stop,
                should_stop=self._over_limit,
                load=self._load,
                turn=self._turn,
                on_result=self._collect,
                step_seconds=self._step_seconds,
            )

        def past_limit() -> RunStoppedError:
            assert self._limit_s is not None
            self._timed_out = TurnStopper(None, self._limit_s)
            return time_limit_error(self._limit_s)

        try:
            return self._workers.run(
                "ckptlab.lab.workerjobs:sweep_spec",
                self.spec,
                self._step_seconds,
                progress=self._progress,
                on_result=self._collect,
                should_stop=self._stopping,
                turn=self._turn,
                turn_limit_s=self._limit_s,
                on_limit=past_limit,
                memory_cap_bytes=self._memory_cap_bytes,
            )
        except RunStoppedError as error:
            if error.key == "job.stopped":  # Stop, or the session gone: the rows measured are kept
                raise _Stopped from None
            raise

    def _run(self) -> None:
        result: SweepResult | None
        try:
            result = self._sweep()
        except _Stopped:
            result = self._partial()
        except Exception as error:  # bad input or a bug: keep what was measured, and say why it ended
            if isinstance(error, RunStoppedError) and self._timed_out is not None and error.key != "run.time_limit":
                error = self._timed_out.reason()
            self._fail(error, bug_words=_rows_kept)
            result = self._partial() if self._results else None
        if self._timed_out is not None and not self._error:  # stopped between steps by the limit, not inside one
            self._fail(self._timed_out.reason())
        with self._lock:
            self._result = result
            self._message = (
                Fact("progress.stopped")
                if result is not None and result.cancelled
                else (DONE if result is not None else Fact("progress.failed"))
            )
            self._finished = True

    def _partial(self) -> SweepResult:
        results = self._results_so_far()
        return SweepResult(
            spec=self.spec,
            model=self.plan.info.name,
            num_layers=self.plan.info.num_layers,
            device=results[0].device if results else "",
            rows=rows_from_results(results),
            notes=self.plan.notes,
            cancelled=True,
            elapsed_s=time.monotonic() - self._started,
        )
