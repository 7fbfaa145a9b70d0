"""At scale on a thread, for a page: :func:`~ckptlab.explore.scale.scale_table` as a background job,
and :func:`~ckptlab.explore.gpu_search.cheapest_that_fits` (the GPU search) as another.

A click on a page reruns its script and would interrupt a simulation made inside it; a
:class:`ScaleJob` is polled instead, and Stop keeps what was simulated. :func:`remember`
keeps a page's cache of results, shared by the jobs of several sessions, bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from ..errors import CkptlabError
from ..explore.gpu_search import GPU_COUNTS, GpuSearch, cheapest_that_fits
from ..explore.scale import ScaleRequest, ScaleTable, scale_table
from ..model.catalog import ModelInfo
from ..results import RunResult
from ..spec import RunSpec
from .jobs import BackgroundJob


@dataclass(frozen=True)
class ScaleJobState:
    """A snapshot of a :class:`ScaleJob` for one render of a page."""

    running: bool  # the thread is still working
    message: str  # what is being simulated now
    fraction: float  # of the table done, in [0, 1]
    results: list[RunResult]  # simulated so far
    table: ScaleTable | None  # when finished (complete or stopped)
    error: str  # the message of a failure ("" if none)
    stop_requested: bool  # Stop was pressed
    search: GpuSearch | None = None  # a SearchJob's answer, when finished


class ScaleJob(BackgroundJob):
    """:func:`scale_table` on a background thread: a click on a page reruns its script and would
    interrupt a simulation made inside it; a job is polled instead, and ``stop()`` keeps the results.

    Args:
        request: what to simulate; checked in the constructor, so bad input never reaches the thread.
        known, on_result: as in :func:`scale_table` (a page passes its cache of results).
        info: the model's description if the caller has it.

    Raises:
        SpecError, ModelLoadError: bad input.
    """

    def __init__(
        self,
        request: ScaleRequest,
        *,
        known: Mapping[RunSpec, RunResult] | None = None,
        on_result: Callable[[RunResult], None] | None = None,
        info: ModelInfo | None = None,
    ) -> None:
        self.info = request.check(info)
        self.request = request
        self._known = known
        self._on_result_outer = on_result
        self._table: ScaleTable | None = None
        super().__init__("ckptlab-scale")

    def state(self) -> ScaleJobState:
        with self._lock:
            return ScaleJobState(
                not self._finished,
                self._message,
                self._fraction,
                list(self._results),
                self._table,
                self._error,
                self._stop.is_set(),
            )

    def _collect(self, result: RunResult) -> None:
        super()._collect(result)
        if self._on_result_outer is not None:
            self._on_result_outer(result)

    def _run(self) -> None:
        request = self.request
        table: ScaleTable | None
        try:
            table = scale_table(
                request.model, request.seq_len, request.batch_size, request.dtype, request.settings,
                progress=self._progress, cancel=self._stop, known=self._known, on_result=self._collect, info=self.info,
                optimizer=request.optimizer, lora_rank=request.lora_rank, lora_targets=request.lora_targets,
                world_size=request.world_size,
            )  # fmt: skip
        except CkptlabError as error:
            table = self._partial(str(error))
        except Exception as error:  # a bug, not bad input: keep what was simulated, say it briefly
            table = self._partial(f"{type(error).__name__}: {error}")
        with self._lock:
            self._table = table
            self._finished = True

    def _partial(self, error: str) -> ScaleTable | None:
        with self._lock:
            self._error = error
        results = self._results_so_far()
        if not results:
            return None
        return ScaleTable(self.request, self.info.num_layers, results, True, time.monotonic() - self._started)


class SearchJob(BackgroundJob):
    """:func:`cheapest_that_fits` on a background thread, polled like a :class:`ScaleJob`; ``stop()`` ends the search.

    Args:
        request: the shape and the settings to search (its world_size is not used); checked in the constructor.
        budget_bytes: one GPU's memory.
        counts: the GPU counts to consider.
        known, on_result, info: as in :class:`ScaleJob`.

    Raises:
        SpecError, ModelLoadError: bad input.
    """

    def __init__(
        self,
        request: ScaleRequest,
        budget_bytes: int,
        *,
        counts: tuple[int, ...] = GPU_COUNTS,
        known: Mapping[RunSpec, RunResult] | None = None,
        on_result: Callable[[RunResult], None] | None = None,
        info: ModelInfo | None = None,
    ) -> None:
        self.info = request.check(info)
        for count in counts:  # LoRA past one GPU, say, is refused here and not on the thread
            request.spec(request.settings[0], count).validate()
        self.request, self.budget_bytes, self.counts = request, budget_bytes, counts
        self._known = known
        self._on_result_outer = on_result
        self._search: GpuSearch | None = None
        super().__init__("ckptlab-gpu-search")

    def state(self) -> ScaleJobState:
        with self._lock:
            return ScaleJobState(
                not self._finished,
                self._message,
                self._fraction,
                list(self._results),
                None,
                self._error,
                self._stop.is_set(),
                self._search,
            )

    def _collect(self, result: RunResult) -> None:
        super()._collect(result)
        if self._on_result_outer is not None:
            self._on_result_outer(result)

    def _run(self) -> None:
        search = None
        try:
            search = cheapest_that_fits(
                self.request, self.budget_bytes, counts=self.counts, known=self._known, on_result=self._collect,
                progress=self._progress, cancel=self._stop, info=self.info,
            )  # fmt: skip
        except CkptlabError as error:
            self._fail(str(error))
        except Exception as error:  # a bug, not bad input: say it briefly
            self._fail(f"{type(error).__name__}: {error}")
        with self._lock:
            self._search = search
            self._finished = True

    def _fail(self, error: str) -> None:
        with self._lock:
            self._error = error


_REMEMBER_LOCK = threading.Lock()  # jobs of several sessions may share one cache


def remember(cache: MutableMapping[RunSpec, RunResult], result: RunResult, limit: int = 256) -> None:
    """Put ``result`` in ``cache`` by its spec, dropping the oldest entries beyond ``limit``."""
    with _REMEMBER_LOCK:
        cache[result.spec] = result
        while len(cache) > limit:
            cache.pop(next(iter(cache)))
