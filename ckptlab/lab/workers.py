"""Jobs of a shared server in worker processes: nothing process-wide is shared, and a job can be ended.

torch keeps some state per process (the default dtype that transformers sets while it builds a
model, the module tracker's global hooks that MemTracker installs): two participants' jobs in
the threads of one server process saw each other's, and a simulation made another tab's
measured run fail. So every job the app starts runs in a worker process of its own
(``multiprocessing`` with the ``spawn`` method: a fresh interpreter, no inherited locks or CUDA
state):

    result = device_workers().run("ckptlab.lab.workerjobs:measure_spec", spec, progress=show, limit_s=40)

:meth:`WorkerPool.run` blocks the caller's thread (a page's script thread or a job's own) and
drives the worker from it: progress and results the worker sends come back through a pipe and
are handed to the caller's callbacks on that thread, so a page draws them as before; the
worker asks the parent for device turns (:mod:`.runqueue` lives in the server process, where
every session's requests meet). The parent watches the clock and the worker's resident
memory: past the time limit or the instructor's memory cap, or when the caller's
``should_stop`` answers True for longer than a grace period, the worker is killed (its memory
goes back to the system at once) and a fresh one is started in its place. Resident memory,
not ``RLIMIT_AS``: CUDA reserves far more address space than it uses, and an address-space
limit makes its initialisation fail.

Workers start warm (torch, transformers and ckptlab imported once, before the first job) and
are reused from job to job. Each sets ``torch.set_num_threads`` to its share of the cores
(:func:`ckptlab.torchstate.thread_plan`, the rule ``run`` and ``measure`` follow too), so the pools together never run more compute threads than there are
cores. Errors cross the boundary pickled with their key and params
(:meth:`ckptlab.errors.CkptlabError.__reduce__`); a bug that does not pickle arrives as its
type and message.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import pickle
import sys
import threading
import time
import traceback
import types
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from multiprocessing.connection import Connection
from typing import Any

from ..errors import CkptlabError, RunStoppedError, SpecError
from ..fact import Fact
from ..model import folder_files, hub
from ..results import RunResult
from ..step.stopping import Progress, ShouldStop
from ..torchstate import ThreadPlan, freeze_what_is_loaded, pause_collection, thread_plan

LOG = logging.getLogger(__name__)

POLL_S = 0.1  # how often the parent looks at its worker's pipe, clock and memory
SWEEPS_AT_ONCE = 2  # sweeps in flight at once; a third waits for a worker (each holds one model)
GRACE_S = 5.0  # after a Stop, how long a worker may take to stop on its own before it is killed
_CONTEXT = multiprocessing.get_context("spawn")

Turn = Callable[[str], AbstractContextManager[object]]  # turn(label): a device turn held in the parent
OnLimit = Callable[[], CkptlabError]  # the error a job past its time limit ends with


class WorkerLostError(CkptlabError):
    """A worker process ended in the middle of a job (killed from outside, or out of memory)."""


# -- the worker's side ----------------------------------------------------------------------


class JobContext:
    """What a job function is handed in its worker: progress, results, Stop and device turns, all via the pipe."""

    def __init__(self, conn: Connection, cancel: Any) -> None:
        self._conn = conn
        self._cancel = cancel

    def progress(self, message: Fact, fraction: float) -> None:
        self._conn.send(("progress", message, fraction))

    def collect(self, result: RunResult) -> None:
        self._conn.send(("result", result))

    def cancelled(self) -> bool:
        """Stop was asked for (the parent's ``should_stop``); checked by the job between and inside steps."""
        return bool(self._cancel.is_set())

    def wait_cancelled(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for Stop; True once it was asked for."""
        return bool(self._cancel.wait(timeout))

    @contextmanager
    def turn(self, label: str) -> Iterator[None]:
        """A turn of the server's device queue, held by the parent for as long as the ``with`` block runs."""
        self._conn.send(("turn", label))
        answer = self._conn.recv()
        if answer[0] == "refused":
            raise answer[1]
        try:
            yield
        finally:
            self._conn.send(("turn_end",))


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling (the lab's own errors do), else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _worker_main(conn: Connection, cancel: Any, threads: int, warm: tuple[str, ...]) -> None:
    """A worker's life: set its threads, import what jobs need, then run jobs until the pipe closes."""
    pause_collection()  # no collection while torch and transformers load (ckptlab.torchstate); frozen, then on again
    import torch

    torch.set_num_threads(threads)
    for module in warm:  # the imports a job would otherwise pay for (torch, transformers: seconds)
        importlib.import_module(module)
    freeze_what_is_loaded()  # each step's full collection then walks only what the jobs made
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        _, target, args, kwargs, models_root, hub_access = message
        folder_files.confine(models_root)  # the server's models root, as the parent has it now
        hub.configure(hub_access)  # and its way to the Hub: on or off, its cache, its token
        context = JobContext(conn, cancel)
        try:
            value = _resolve(target)(context, *args, **kwargs)
        except BaseException as error:  # every failure goes back to the parent, which decides what it means
            if not isinstance(error, CkptlabError):
                LOG.warning("job %s failed in its worker:\n%s", target, traceback.format_exc())
            conn.send(("error", _portable(error)))
        else:
            conn.send(("done", value))


# -- the parent's side ----------------------------------------------------------------------


def resident_bytes(pid: int | None) -> int:
    """Resident memory of process ``pid`` (Linux's /proc, where a workshop server runs); 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError):
        pass
    return 0


_START_LOCK = threading.Lock()


@contextmanager
def _plain_main() -> Iterator[None]:
    """Start a process with a blank ``__main__``, so the spawned child does not run the parent's main script again.

    spawn re-imports the parent's ``__main__`` in the child (by its file) before the target runs. Under
    Streamlit the ``__main__`` of a script thread is the page being run (AppTest's, a page's own
    script): the child would run the page. The target lives in this module, so the child needs nothing of
    ``__main__``; the blank one is in place only while the process starts.
    """
    with _START_LOCK:
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__: nothing to re-run
        try:
            yield
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved


class _Worker:
    """One worker process and its end of the pipe; started at once, warm by the time it reads its first job."""

    def __init__(self, threads: int, warm: tuple[str, ...]) -> None:
        self.conn, child = _CONTEXT.Pipe()
        self.cancel = _CONTEXT.Event()
        self.process = _CONTEXT.Process(
            target=_worker_main, args=(child, self.cancel, threads, warm), name="ckptlab-worker", daemon=True
        )
        with _plain_main():
            self.process.start()
        child.close()

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        """End the process now: its memory goes back to the system; the job it ran ends unfinished."""
        self.process.kill()
        self.process.join(10)
        self.conn.close()


WARM = ("torch", "transformers", "ckptlab", "ckptlab.lab.workerjobs")


class WorkerPool:
    """At most ``size`` jobs at once, each in a worker process of its own, reused from job to job.

    Args:
        size: how many jobs may run at once; one more waits for a free worker (and can be abandoned
            meanwhile through ``should_stop``).
        threads: torch threads of each worker.
        warm: modules each worker imports before its first job.
        poll_s: how often the parent looks at the pipe, the clock and the worker's memory.
        grace_s: how long a stopped job may take to end on its own before its worker is killed.
    """

    def __init__(
        self,
        size: int,
        threads: int,
        *,
        warm: tuple[str, ...] = WARM,
        poll_s: float = POLL_S,
        grace_s: float = GRACE_S,
    ) -> None:
        if size < 1 or threads < 1:
            raise SpecError(key="api.pool_size", size=size, threads=threads)
        self.size, self.threads, self.warm = size, threads, warm
        self.poll_s, self.grace_s = poll_s, grace_s
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: deque[_Worker] = deque()
        self._running = 0
        self._spans: deque[tuple[float, float]] = deque(maxlen=256)  # (start, end) of the last jobs that ran
        self.killed = 0  # workers ended by a limit, a Stop or a lost session (for tests and the instructor)

    # -- what a caller uses ---------------------------------------------------------------

    def start(self) -> WorkerPool:
        """Start the workers now, so the first jobs do not wait for torch's import."""
        with self._lock:
            while len(self._idle) < self.size:
                self._idle.append(_Worker(self.threads, self.warm))
        return self

    def run(
        self,
        target: str,
        *args: Any,
        progress: Progress | None = None,
        on_result: Callable[[RunResult], None] | None = None,
        should_stop: ShouldStop | None = None,
        turn: Turn | None = None,
        limit_s: float | None = None,
        turn_limit_s: float | None = None,
        on_limit: OnLimit | None = None,
        memory_cap_bytes: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``target(context, *args, **kwargs)`` (``"module:function"``) in a worker and return what it returns.

        Args:
            target: a module-level function taking a :class:`JobContext` first.
            progress, on_result: called on this thread with what the job reports.
            should_stop: asked every ``poll_s``; True asks the job to stop (``context.cancelled()``), and a
                job that has not ended ``grace_s`` later is killed. An exception it raises (Streamlit's,
                for a session rerun or gone) kills the worker at once and propagates.
            turn: ``turn(label)`` for the job's device turns (:meth:`JobContext.turn`); None: it has none.
            limit_s: seconds the whole job may take; turn_limit_s: seconds each of its turns may hold
                the device. Past either the worker is killed and ``on_limit()`` is raised.
            memory_cap_bytes: resident memory the worker may reach; past it the worker is killed.

        Raises:
            whatever the job raised (the lab's errors with their key and params), RunStoppedError past a
            limit or the memory cap, WorkerLostError when the worker ended by itself.
        """
        with self._lease(should_stop) as worker, ExitStack() as held:  # held: the device turn the worker holds now
            worker.cancel.clear()
            worker.conn.send(("job", target, args, kwargs, folder_files.confined_root(), hub.access()))
            deadline = None if limit_s is None else time.monotonic() + limit_s
            turn_deadline: float | None = None
            stop_asked_at: float | None = None
            answered = False  # the worker said the job ended ("done" or "error"): it is free for the next one
            try:
                while True:
                    if worker.conn.poll(self.poll_s):
                        try:
                            kind, *body = worker.conn.recv()
                        except (EOFError, OSError):
                            raise self._lost(worker) from None
                        answered = kind in ("done", "error")
                        if kind == "done":
                            return body[0]
                        if kind == "error":
                            raise body[0]
                        if kind == "progress" and progress is not None:
                            progress(*body)
                        elif kind == "result" and on_result is not None:
                            on_result(*body)
                        elif kind == "turn":
                            turn_deadline = self._grant(worker, held, turn, body[0], turn_limit_s)
                        elif kind == "turn_end":
                            held.close()
                            turn_deadline = None
                        continue  # drain what is there before looking at the clock again
                    if not worker.alive():
                        raise self._lost(worker)
                    now = time.monotonic()
                    if any(end is not None and now >= end for end in (deadline, turn_deadline)):
                        worker.kill()
                        raise on_limit() if on_limit is not None else _time_limit(limit_s or turn_limit_s)
                    if memory_cap_bytes is not None:
                        resident = resident_bytes(worker.process.pid)
                        if resident > memory_cap_bytes:
                            worker.kill()
                            raise _memory_cap(resident, memory_cap_bytes)
                    if should_stop is not None and should_stop():
                        if stop_asked_at is None:
                            stop_asked_at = now
                            worker.cancel.set()
                        elif now - stop_asked_at >= self.grace_s:
                            worker.kill()
                            raise RunStoppedError(key="job.stopped")
            except BaseException:
                if not answered and worker.alive() and not worker.conn.closed:
                    worker.kill()  # a job left running would hold the worker (and its turn's memory) for nobody
                raise

    def ran_between(self, start: float, end: float) -> bool:
        """A job of this pool ran during part of [start, end] (``time.monotonic()``): the cores were shared."""
        with self._lock:
            return bool(self._running) or any(begun < end and ended > start for begun, ended in self._spans)

    def close(self) -> None:
        """Stop the idle workers (a test's clean-up; a server's pools live as long as it does).

        Killed, not asked to quit: an idle worker holds no job, and a fresh one (the replacement of a killed worker)
        would only read the request after importing torch and transformers, seconds of a core for nothing."""
        with self._lock:
            idle, self._idle = list(self._idle), deque()
        for worker in idle:
            worker.kill()

    # -- inside ---------------------------------------------------------------------------

    @contextmanager
    def _lease(self, should_stop: ShouldStop | None) -> Iterator[_Worker]:
        """A worker for one job, once a slot is free (a Stop meanwhile abandons the wait); back to the pool after it,
        or replaced by a fresh one if it was killed."""
        while not self._slots.acquire(timeout=self.poll_s):
            if should_stop is not None and should_stop():
                raise RunStoppedError(key="job.stopped")
        worker = self._take()
        started = time.monotonic()
        with self._lock:
            self._running += 1
        try:
            yield worker
        finally:
            with self._lock:
                self._running -= 1
                self._spans.append((started, time.monotonic()))
                if worker.alive() and not worker.conn.closed:
                    self._idle.append(worker)
                else:
                    self.killed += 1
                    self._idle.append(_Worker(self.threads, self.warm))  # warm again by the next job
            self._slots.release()

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.popleft()
                if worker.alive():
                    return worker
        return _Worker(self.threads, self.warm)

    def _grant(
        self, worker: _Worker, held: ExitStack, turn: Turn | None, label: str, turn_limit_s: float | None
    ) -> float | None:
        """Take a device turn for the worker (in this thread, where the queue's callbacks run) and tell it.

        Anything else the turn raises (Streamlit stopping this session while it waited) ends the job: :meth:`run`
        kills the worker on its way out."""
        try:
            if turn is not None:
                held.enter_context(turn(label))
        except CkptlabError as error:  # the queue's own refusals (busy, superseded): the job decides
            worker.conn.send(("refused", _portable(error)))
            return None
        worker.conn.send(("granted",))
        return None if turn is None or turn_limit_s is None else time.monotonic() + turn_limit_s

    def _lost(self, worker: _Worker) -> WorkerLostError:
        worker.kill()
        code = worker.process.exitcode
        return WorkerLostError(key="job.worker_lost", code=code)


def _time_limit(seconds: float | None) -> RunStoppedError:
    return RunStoppedError(key="job.time_limit", seconds=seconds)


def _memory_cap(resident: int, cap: int) -> RunStoppedError:
    return RunStoppedError(key="job.memory_cap", used=resident, cap=cap)


# -- the server's pools ---------------------------------------------------------------------

_POOLS: dict[str, WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def device_workers() -> WorkerPool:
    """The server's one measuring worker (the device queue lets one run at a time anyway)."""
    return _pool("device", lambda plan: WorkerPool(1, plan.device_threads))


def sweep_workers() -> WorkerPool:
    """The server's sweep workers: apart from the measuring one, which a Run waits for while it holds the device
    turn (a sweep between two of its rows would then wait for that turn: neither could go on). Only the holder of
    the device turn computes, so each gets the measuring worker's threads."""
    return _pool("sweep", lambda plan: WorkerPool(SWEEPS_AT_ONCE, plan.device_threads))


def describe_workers() -> WorkerPool:
    """The server's one worker that describes the models participants name (a folder, a Hub name): each
    description builds the model on the meta device, which a hostile config can make heavy, so it runs apart from
    the pages' threads and from the measuring and simulating workers (a page waits on it, never on a run)."""
    return _pool("describe", lambda plan: WorkerPool(1, 1))


def simulation_workers() -> WorkerPool:
    """The server's bounded pool for CPU-heavy jobs (simulations, the GPU search), sized to the cores."""
    return _pool("simulation", lambda plan: WorkerPool(plan.simulation_workers, plan.simulation_threads))


def started_pool(name: str) -> WorkerPool | None:
    """The server's pool ``name`` ("device", "sweep", "simulation", "describe") if it was started, without starting it."""
    with _POOLS_LOCK:
        return _POOLS.get(name)


def _pool(name: str, make: Callable[[ThreadPlan], WorkerPool]) -> WorkerPool:
    with _POOLS_LOCK:
        if name not in _POOLS:
            _POOLS[name] = make(thread_plan()).start()
        return _POOLS[name]
