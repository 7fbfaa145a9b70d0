"""At scale on a thread, for a page: :func:`~ckptlab.explore.scale.scale_table` as a background job,
:func:`~ckptlab.explore.gpu_search.cheapest_that_fits` (the GPU search) as another, and
:func:`~ckptlab.explore.longest.longest_table` (the longest sequence per setting) as a third.

A click on a page reruns its script and would interrupt a simulation made inside it; a
:class:`ScaleJob` is polled instead, and Stop keeps what was simulated. :func:`remember`
keeps a page's cache of results, shared by the jobs of several sessions, bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..errors import CkptlabError, RunStoppedError
from ..explore.gpu_search import GPU_COUNTS, GpuSearch, searched_counts
from ..explore.longest import LongestTable, check_budget
from ..explore.scale import ScaleRequest, ScaleTable
from ..fact import Fact
from ..model.catalog import ModelInfo
from ..results import RunResult
from ..spec import RunSpec, Setting
from .jobs import BackgroundJob
from .store import ResultStore
from .workers import WorkerPool


@dataclass(frozen=True)
class ScaleJobState:
    """A snapshot of a :class:`ScaleJob` or :class:`SearchJob` for one render of a page."""

    running: bool  # the thread is still working
    message: Fact  # what is being simulated now
    fraction: float  # of the table done, in [0, 1]
    results: list[RunResult]  # simulated so far
    table: ScaleTable | None  # when finished (complete or stopped)
    error: str | Fact  # the message of a failure ("" if none)
    stop_requested: bool  # Stop was pressed
    search: GpuSearch | None = None  # a SearchJob's answer, when finished
    failure: CkptlabError | None = None  # the lab's error behind ``error`` (a page says it in its language)
    longest: LongestTable | None = None  # a LongestJob's answer, when finished (stopped: the settings searched)


class _SimulationJob(BackgroundJob):
    """What the two simulation jobs share: the request checked up front, a page's cache fed, the snapshot,
    and the server's time limit: past ``limit_s`` seconds the job ends as Stop ends it (after the
    simulation in flight, the ones done kept) and says why.
    """

    _THREAD = ""  # the thread's name
    _JOB = ""  # the :mod:`.workerjobs` function that simulates, here or in a worker process

    def __init__(
        self,
        request: ScaleRequest,
        *,
        known: Mapping[RunSpec, RunResult] | None = None,
        on_result: Callable[[RunResult], None] | None = None,
        info: ModelInfo | None = None,
        limit_s: float | None = None,
        workers: WorkerPool | None = None,
        alive: Callable[[], bool] | None = None,
        memory_cap_bytes: int | None = None,
    ) -> None:
        self.info = request.check(info)
        self._workers, self._memory_cap_bytes = workers, memory_cap_bytes
        self.request = request
        self._known = known
        self._on_result_outer = on_result
        self._answer: ScaleTable | GpuSearch | LongestTable | None = None
        self.limit_s = limit_s
        super().__init__(self._THREAD, alive=alive)

    def _over_limit(self) -> bool:
        return self.limit_s is not None and time.monotonic() - self._started >= self.limit_s

    def _should_stop(self) -> bool:
        """Asked between simulations: Stop pressed, the session gone, or the time limit passed."""
        return self._stopping() or self._over_limit()

    def _time_limit_error(self) -> RunStoppedError:
        seconds = f"{self.limit_s:g}"
        return RunStoppedError(key="simulation.time_limit", seconds=seconds)

    def _args(self) -> tuple[Any, ...]:
        """What :attr:`_JOB` is given after its context, before the known results and the model's description."""
        return (self.request,)

    def _partial(self) -> ScaleTable | GpuSearch | LongestTable | None:
        """What a failed job leaves: nothing, unless a subclass keeps what was simulated."""
        return None

    def _run(self) -> None:
        try:
            answer = self._simulate()
        except Exception as error:  # bad input or a bug: keep what was simulated, and say why it ended
            self._fail(error)
            answer = self._partial()
        if self._over_limit() and not self._stop.is_set() and not self._error:
            self._fail(self._time_limit_error())
        with self._lock:
            self._answer, self._finished = answer, True

    def _simulate(self) -> Any:
        """:attr:`_JOB` on this thread, or in a worker process, killed at the time limit."""
        if self._workers is None:
            from . import workerjobs  # the worker's own job, with this job standing in for its context

            here = SimpleNamespace(progress=self._progress, cancelled=self._should_stop, collect=self._collect)
            return getattr(workerjobs, self._JOB)(here, *self._args(), self._known, self.info)
        known = {spec: result for spec, result in (self._known or {}).items() if spec.model == self.request.model}
        return self._workers.run(
            f"ckptlab.lab.workerjobs:{self._JOB}", *self._args(), known, self.info,
            progress=self._progress, on_result=self._collect, should_stop=self._stopping,
            limit_s=self.limit_s, on_limit=self._time_limit_error, memory_cap_bytes=self._memory_cap_bytes,
        )  # fmt: skip

    def state(self) -> ScaleJobState:
        with self._lock:
            answer = self._answer
            return ScaleJobState(
                not self._finished,
                self._message,
                self._fraction,
                list(self._results),
                answer if isinstance(answer, ScaleTable) else None,
                self._error,
                self._stop.is_set(),
                answer if isinstance(answer, GpuSearch) else None,
                self._failure if isinstance(self._failure, CkptlabError) else None,
                answer if isinstance(answer, LongestTable) else None,
            )

    def _collect(self, result: RunResult) -> None:
        super()._collect(result)
        if self._on_result_outer is not None:
            self._on_result_outer(result)


class ScaleJob(_SimulationJob):
    """:func:`scale_table` on a background thread: a click on a page reruns its script and would
    interrupt a simulation made inside it; a job is polled instead, and ``stop()`` keeps the results.

    Args:
        request: what to simulate; checked in the constructor, so bad input never reaches the thread.
        known, on_result: as in :func:`scale_table` (a page passes its cache of results).
        info: the model's description if the caller has it.
        limit_s: seconds after which the job stops as Stop does (a shared server's limit per run), or None.
        workers: simulate in a worker process of this pool (the app's bounded simulation pool): nothing
            process-wide is shared with other sessions, and at ``limit_s`` the worker is killed, not asked.
        alive: False once the session that started the job is gone; the job then ends.
        memory_cap_bytes: with ``workers``, the resident memory the worker may reach before it is killed.
        budget_bytes, gpu: the GPU the rows' device totals are decided on (``scale_table``'s); None: no device totals.

    Raises:
        SpecError, ModelLoadError: bad input.
    """

    _THREAD, _JOB = "ckptlab-scale", "scale_request"

    def __init__(
        self, request: ScaleRequest, *, budget_bytes: int | None = None, gpu: str | None = None, **options: Any
    ) -> None:
        super().__init__(request, **options)
        self.budget_bytes, self.gpu = budget_bytes, gpu

    def _args(self) -> tuple[Any, ...]:
        return (self.request, self.budget_bytes, self.gpu)

    def _partial(self) -> ScaleTable | None:
        results = self._results_so_far()
        if not results:
            return None
        return ScaleTable(self.request, self.info.num_layers, results, True, time.monotonic() - self._started)


class SearchJob(_SimulationJob):
    """:func:`cheapest_that_fits` on a background thread, polled like a :class:`ScaleJob`; ``stop()`` ends the search.

    Args:
        request: the shape and the settings to search (its world_size is not used); checked in the constructor.
        budget_bytes: one GPU's memory.
        counts: the GPU counts to consider.
        gpu: the GPU's name (its CUDA context and cuBLAS workspaces in the device total the search decides on), or
            None for a card of ``budget_bytes`` (the context estimated).
        options: ``known``, ``on_result``, ``info``, ``limit_s``, ``workers``, ``alive``, ``memory_cap_bytes``, as
            in :class:`ScaleJob`.

    Raises:
        SpecError, ModelLoadError: bad input.
    """

    _THREAD, _JOB = "ckptlab-gpu-search", "search_request"

    def __init__(
        self,
        request: ScaleRequest,
        budget_bytes: int,
        *,
        counts: tuple[int, ...] = GPU_COUNTS,
        gpu: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(request, **options)
        for count in searched_counts(request, counts):  # LoRA past one GPU, say, is refused here, not on the thread
            request.spec(request.settings[0], count).validate()
        self.budget_bytes, self.counts, self.gpu = budget_bytes, counts, gpu

    def _args(self) -> tuple[Any, ...]:
        return (self.request, self.budget_bytes, self.counts, self.gpu)


class LongestJob(_SimulationJob):
    """:func:`~ckptlab.explore.longest.longest_table` on a background thread, polled like a :class:`ScaleJob`;
    ``stop()`` ends it before its next simulation, keeping the settings searched to their end.

    Args:
        request: the shape and the recipe (its settings aside); checked in the constructor.
        budget_bytes: one GPU's memory; none (0, None) is refused here, not on the thread.
        settings: the settings to search, in order.
        gpu: the GPU's name (the device totals' CUDA context), or None for a card of ``budget_bytes``.
        options: ``known``, ``on_result``, ``info``, ``limit_s``, ``workers``, ``alive``, ``memory_cap_bytes``, as
            in :class:`ScaleJob`.

    Raises:
        SpecError, ModelLoadError: bad input.
    """

    _THREAD, _JOB = "ckptlab-longest", "longest_request"

    def __init__(
        self,
        request: ScaleRequest,
        budget_bytes: int,
        *,
        settings: tuple[Setting, ...],
        gpu: str | None = None,
        **options: Any,
    ) -> None:
        self.budget_bytes = check_budget(budget_bytes)
        super().__init__(request, **options)
        self.settings, self.gpu = settings, gpu

    def _args(self) -> tuple[Any, ...]:
        return (self.request, self.budget_bytes, self.settings, self.gpu)


def remember(store: ResultStore[RunSpec, RunResult], result: RunResult) -> None:
    """Keep ``result`` in ``store`` by its spec (the store drops the least recently used past its bounds)."""
    store.put(result.spec, result)
