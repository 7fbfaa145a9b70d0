"""The Learn pages' runs, shared by every session of the server: one device turn per distinct run for the workshop.

A page asks for the runs it draws (:meth:`SharedRuns.ask`) and draws at once what is already
known; one thread of the process measures what is missing, in the order asked, through
:func:`ckptlab.lab.run.run_queued` (the device queue, the process-wide result cache). A second
session asking for a run queued or being measured waits for that same measurement; nothing
starts twice. The page polls :meth:`SharedRuns.state` for its runs: done, in flight, failed, and
an estimate of the seconds left (:data:`ckptlab.lab.run.PACE`: the roofline over each run's simulated step,
scaled by what this server's runs took once it measured some).

The runs are the workshop's, not a participant's: they take one place in the device line
(:data:`LEARN_OWNER`) whoever asked, so a participant switching lesson parts never stacks turns.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..errors import CkptlabError
from ..fact import Fact
from ..results import RunResult
from ..spec import RunSpec
from . import exercises
from .jobs import BackgroundJob
from .learn import (
    LESSON_PARTS,
    AllocatorIdea,
    QloraIdea,
    RerunIdea,
    ShardingIdea,
    allocator_idea,
    qlora_idea,
    rerun_idea,
    sharding_idea,
    shared_model,
)
from .run import PACE, LabRun, Pace, reference_spec, run_queued
from .workers import WorkerPool

LEARN_OWNER = "learn pages"  # the shared runs' one place in the device line

Measure = Callable[..., LabRun]  # run_queued's signature: (spec, *, progress, on_wait, owner, limit_s, workers)


@dataclass(frozen=True)
class How:
    """How a run is measured: the server's policy when it was asked for."""

    limit_s: float | None = None
    workers: WorkerPool | None = None


@dataclass(frozen=True)
class RunsState:
    """A page's runs at one moment."""

    results: dict[RunSpec, RunResult]  # the asked runs measured so far, their checkpointing-off references included
    missing: list[RunSpec]  # asked, not measured yet (queued, in flight, or failed)
    failures: dict[RunSpec, Exception] = field(default_factory=dict)  # asked runs whose measurement failed
    fraction: float = 1.0  # of the asked runs measured, the one in flight counted by its own progress
    # Estimated seconds until the last asked run is measured, the runs ahead of it included; None: the device's speed
    # is unknown (a GPU without a datasheet in explore/gpus).
    left_s: float | None = 0.0
    measured_pace: bool = False  # left_s is scaled by runs this server measured (else predicted by the formula)
    ahead: int = 0  # runs of other pages ahead in the device line, while the shared runs wait for a turn
    asked: int = 0  # how many distinct runs were asked for

    @property
    def done(self) -> bool:
        return not self.missing

    @property
    def settled(self) -> bool:
        """Nothing more will come without a new ask: every run measured or failed."""
        return all(spec in self.failures for spec in self.missing)


class SharedRuns:
    """The process-wide store: results by spec, the line of runs to measure, one thread measuring them."""

    def __init__(self, measure: Measure = run_queued, pace: Pace = PACE) -> None:
        self._measure, self._pace = measure, pace
        self._changed = threading.Condition()
        self._results: dict[RunSpec, RunResult] = {}
        self._done: set[RunSpec] = set()
        self._failures: dict[RunSpec, Exception] = {}
        self._line: deque[tuple[RunSpec, How]] = deque()
        self._warming: set[RunSpec] = set()  # queued by the warm-up, not asked by a page yet
        self._in_flight: RunSpec | None = None
        self._fraction = 0.0  # of the run in flight
        self._ahead = 0
        self._thread: threading.Thread | None = None
        self._working = False  # a thread is measuring the line (set and cleared under the lock)
        self._when_idle: list[Callable[[], object]] = []  # called once the line is empty (the warm-up's ideas)
        self._idle_keys: set[str] = set()  # the when_idle keys asked for so far
        self.measurements = 0  # runs this store measured (asked of ``measure``): one per distinct run

    def ask(self, specs: Iterable[RunSpec], how: How = How(), retry: bool = False, warming: bool = False) -> None:
        """Queue what of ``specs`` is not measured, queued or in flight.

        A failed one is queued only with ``retry`` (a page's Try again: every rerun of a page asks, and a failure
        stays said until someone retries it). A page's runs go ahead of the warm-up's (``warming``: queued by
        :func:`warm`), a warm-up run a page asks for included: someone is waiting for those.
        A page's runs are estimated first (their simulations, once per spec for the server), here, outside the lock:
        the state's estimate (:meth:`state`) then only reads them and never simulates while others wait on the lock.
        """
        if not warming:
            with self._changed:
                new = [spec for spec in dict.fromkeys(specs) if spec not in self._done]
            for spec in new:
                with contextlib.suppress(CkptlabError):  # a run the simulation refuses: its measurement says why
                    self._pace.estimate(spec)
        with self._changed:
            queued = {spec for spec, _ in self._line}
            for spec in dict.fromkeys(specs):
                if spec in self._done or spec == self._in_flight:
                    continue
                if spec in queued:
                    if not warming and spec in self._warming:
                        self._line = deque(item for item in self._line if item[0] != spec)
                        self._warming.discard(spec)
                        self._put_ahead(spec, how)
                    continue
                if spec in self._failures and not retry:
                    continue
                self._failures.pop(spec, None)
                if warming:
                    self._line.append((spec, how))
                    self._warming.add(spec)
                else:
                    self._put_ahead(spec, how)
                queued.add(spec)
            if self._line and not self._working:
                # Decided under the lock, not by the thread's liveness: a thread past its last run (calling the
                # when-idle callbacks) is alive but will measure nothing more.
                self._working = True
                self._thread = threading.Thread(target=self._work, name="ckptlab-learn-runs", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def when_idle(self, key: str, then: Callable[[], object]) -> None:
        """Call ``then`` once nothing is queued or measured: now, on this thread, if the store is idle; else on the
        measuring thread when its line empties. Once for each ``key`` in the store's life: the warm-up is asked
        again by every page opened, and must not start its simulations again (nor retry a failed one) each time."""
        with self._changed:
            if key in self._idle_keys:
                return
            self._idle_keys.add(key)
            busy = self._working
            if busy:
                self._when_idle.append(then)
        if not busy:
            then()

    def _put_ahead(self, spec: RunSpec, how: How) -> None:
        """Queue ``spec`` behind the pages' runs, ahead of the warm-up's."""
        position = next((i for i, (queued, _) in enumerate(self._line) if queued in self._warming), len(self._line))
        self._line.insert(position, (spec, how))

    def state(self, specs: Sequence[RunSpec]) -> RunsState:
        with self._changed:
            return self._state(list(dict.fromkeys(specs)))

    def wait(self, specs: Sequence[RunSpec], on_change: Callable[[RunsState], None] | None = None) -> RunsState:
        """Block until every one of ``specs`` is measured or failed, calling ``on_change`` as they move on."""
        asked = list(dict.fromkeys(specs))
        while True:
            with self._changed:
                now = self._state(asked)
            if on_change is not None:  # outside the lock: the measuring thread reports meanwhile
                on_change(now)
            if now.settled:
                return now
            with self._changed:
                self._changed.wait(timeout=1.0)  # a progress report notifies; the timeout covers one made meanwhile

    def clear(self) -> None:
        """Forget every result and failure (tests; the line in flight finishes)."""
        with self._changed:
            self._results.clear()
            self._done.clear()
            self._failures.clear()
            self._line.clear()
            self._warming.clear()

    def _state(self, asked: list[RunSpec]) -> RunsState:
        missing = [spec for spec in asked if spec not in self._done]
        results: dict[RunSpec, RunResult] = {}
        for spec in asked:
            for key in (spec, reference_spec(spec)):
                if key in self._results:
                    results[key] = self._results[key]
        failures = {spec: self._failures[spec] for spec in missing if spec in self._failures}
        waiting = [spec for spec in missing if spec not in failures]
        left_s: float | None = 0.0
        measured_pace = False
        if waiting:
            # Everything measured before the last of the page's runs: the one in flight, then the line up to it.
            order = ([self._in_flight] if self._in_flight is not None else []) + [spec for spec, _ in self._line]
            last = max((order.index(spec) for spec in waiting if spec in order), default=-1)
            for position, spec in enumerate(order[: last + 1]):
                # Not simulated here (under the lock): a run whose simulation is not kept yet has no estimate.
                seconds, measured_pace = self._pace.estimate(spec, simulate_missing=False)
                if seconds is None or left_s is None:
                    left_s = None
                    continue
                left_s += seconds * (1 - self._fraction) if position == 0 and self._in_flight else seconds
        in_flight = self._fraction if self._in_flight in waiting else 0.0
        fraction = (len(asked) - len(missing) + in_flight) / len(asked) if asked else 1.0
        ahead = self._ahead if self._in_flight in waiting else 0
        return RunsState(results, missing, failures, fraction, left_s, measured_pace, ahead, len(asked))

    def _work(self) -> None:
        while True:
            with self._changed:
                if not self._line:
                    self._in_flight = None
                    idle, self._when_idle = self._when_idle, []
                    self._working = False
                    self._changed.notify_all()
                    break
                spec, how = self._line.popleft()
                self._warming.discard(spec)
                self._in_flight, self._fraction, self._ahead = spec, 0.0, 0
                self._changed.notify_all()
            try:
                lab = self._measure(
                    spec,
                    progress=self._progress,
                    on_wait=self._waiting,
                    owner=LEARN_OWNER,
                    limit_s=how.limit_s,
                    workers=how.workers,
                    load=shared_model,  # in the server's threads (CKPTLAB_WORKERS=thread): one model kept
                )
            except Exception as error:  # the lab's error, or a bug (kept for the page to say briefly): the line goes on
                self._settle(spec, failure=error)
            else:
                self._settle(spec, lab=lab)
        for then in idle:  # outside the lock: what it starts may ask this store
            then()

    def _settle(self, spec: RunSpec, lab: LabRun | None = None, failure: Exception | None = None) -> None:
        with self._changed:
            self.measurements += 1
            if lab is not None:
                self._results[spec] = lab.result
                if lab.reference is not None:
                    self._results[reference_spec(spec)] = lab.reference.result
                self._done.add(spec)
            if failure is not None:
                self._failures[spec] = failure
            self._in_flight = None
            self._changed.notify_all()

    def _progress(self, message: Any, fraction: float) -> None:
        with self._changed:
            self._fraction = min(max(fraction, 0.0), 1.0)
            self._changed.notify_all()

    def _waiting(self, ahead: int) -> None:
        with self._changed:
            self._ahead = ahead
            self._changed.notify_all()


LEARN_RUNS = SharedRuns()  # the server's one store: every session of a workshop shares its runs


def workshop_specs() -> list[RunSpec]:
    """The runs the Exercises ask for, then every measured part's of the Lesson (:data:`ckptlab.lab.learn.LESSON_PARTS`,
    what the page asks for; their checkpointing-off references come with each): what a warm-up measures first."""
    asked = [spec for exercise in exercises.EXERCISES for spec in exercise.specs()]
    lesson = [spec for part in LESSON_PARTS for spec in part.asks()]
    return list(dict.fromkeys(asked + lesson))


def workshop_ideas() -> list[str]:
    """The Lesson's simulated ideas (:func:`idea_job`'s names), in the parts' order: what a warm-up simulates once
    the measured runs are done."""
    return list(dict.fromkeys(part.idea for part in LESSON_PARTS if part.idea is not None))


def warm(how: How = How(), runs: SharedRuns | None = None, simulation: WorkerPool | None = None) -> None:
    """Warm every part of the Lesson and every exercise (``CKPTLAB_WARM_LEARN=1``), once for the server.

    Queues :func:`workshop_specs` in ``runs`` (the server's: :data:`LEARN_RUNS`), measured in the background; once
    they are measured, starts :func:`workshop_ideas`' simulations (in ``simulation``, the server's simulation pool),
    after the measurements so that their timed steps do not share the cores with a simulation. A page that asks
    for an idea before then starts it at once; the warm-up's ask then joins that job.
    """
    store = LEARN_RUNS if runs is None else runs
    store.ask(workshop_specs(), how, warming=True)
    store.when_idle("ideas", lambda: [idea_job(name, simulation) for name in workshop_ideas()])


# -- the lesson's simulated ideas (sharding, 4 bits): each simulated once for the server, in the background ----

T = TypeVar("T")


class IdeaJob(BackgroundJob, Generic[T]):
    """One of the lesson's simulated ideas (:func:`ckptlab.lab.learn.sharding_idea`, ``qlora_idea``) on its own
    thread, for every session of the server."""

    def __init__(self, name: str, make: Callable[..., T], workers: WorkerPool | None = None) -> None:
        super().__init__(f"ckptlab-{name}-idea")
        self._make = make
        self._workers = workers
        self.idea: T | None = None

    def _run(self) -> None:
        try:
            idea = self._make(progress=self._progress, workers=self._workers)
        except Exception as error:  # bad input or a bug: the page says why, and the next ask tries again
            self._fail(error)
            idea = None
        with self._lock:
            self.idea, self._finished = idea, True

    def outcome(self) -> tuple[bool, float, T | None, Exception | str | Fact | None]:
        """``(finished, fraction, idea, failure)``: the failure the lab's error, or a bug's words."""
        with self._lock:
            failure = self._failure if self._failure is not None else (self._error or None)
            return self._finished, self._fraction, self.idea, failure


ShardingJob = IdeaJob[ShardingIdea]
_ideas_lock = threading.Lock()
_ideas: dict[str, IdeaJob[Any]] = {}  # the server's one job per idea (the last one asked for)


def _idea_job(name: str, make: Callable[..., T], workers: WorkerPool | None) -> IdeaJob[T]:
    """The server's job for one idea, started on the first ask; one that failed is started again."""
    with _ideas_lock:
        job = _ideas.get(name)
        if job is not None:
            finished, _, idea, _ = job.outcome()
            if not finished or idea is not None:
                return job
        _ideas[name] = IdeaJob(name, make, workers)
        _ideas[name].start()
        return _ideas[name]


IDEAS: dict[str, Callable[..., Any]] = {  # LessonPart.idea -> maker
    "sharding": sharding_idea,
    "qlora": qlora_idea,
    "allocator": allocator_idea,
    "rerun": rerun_idea,
}


def idea_job(name: str, workers: WorkerPool | None = None) -> IdeaJob[Any]:
    """The server's job for the idea ``name`` (a key of :data:`IDEAS`): one for every session, joined while in flight.

    Raises:
        KeyError: ``name`` is not an idea of the lesson.
    """
    return _idea_job(name, IDEAS[name], workers)


def sharding_job(workers: WorkerPool | None = None) -> IdeaJob[ShardingIdea]:
    """The server's sharding-idea job (:func:`ckptlab.lab.learn.sharding_idea`)."""
    return idea_job("sharding", workers)


def qlora_job(workers: WorkerPool | None = None) -> IdeaJob[QloraIdea]:
    """The server's 4-bit idea job (:func:`ckptlab.lab.learn.qlora_idea`)."""
    return idea_job("qlora", workers)


def allocator_job(workers: WorkerPool | None = None) -> IdeaJob[AllocatorIdea]:
    """The server's allocator-idea job (:func:`ckptlab.lab.learn.allocator_idea`)."""
    return idea_job("allocator", workers)


def rerun_job(workers: WorkerPool | None = None) -> IdeaJob[RerunIdea]:
    """The server's time idea job (:func:`ckptlab.lab.learn.rerun_idea`)."""
    return idea_job("rerun", workers)
