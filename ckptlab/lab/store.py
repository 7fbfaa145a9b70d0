"""The one bounded store of results a shared server keeps: bounded in entries and in bytes, least recently used first out.

A workshop server runs for hours and every participant's run or simulation lands in memory; a store without a bound
grows until the server is killed (issue 57 found two such caches). Every process-wide cache of results in the app is
a :class:`ResultStore`: the Lab's measured runs (``lab.run.RESULTS``), the simulations of the At-scale page and of
the lesson's simulated ideas (:data:`SIMULATIONS`). A result's bytes are counted as its JSON's length (:func:`json_bytes`): a result is
numbers and short texts, so its JSON is within a small factor of what Python holds for it, and it is the same figure
on every machine.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from ..results import RunResult
from ..spec import RunSpec
from ..step.stopping import DONE, Progress
from ..step.table import simulate_table
from ..units import MIB
from .workers import WorkerPool

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_ENTRIES = 512  # a workshop's distinct runs in a day are a few hundred
MAX_BYTES = 64 * MIB  # a simulated result with its timeline is tens of KiB of JSON: well over a thousand fit


def json_bytes(result: Any) -> int:
    """A result's size as the store counts it: the length of its JSON (``to_dict``)."""
    return len(json.dumps(result.to_dict(), default=str))


class ResultStore(Mapping[K, V], Generic[K, V]):
    """Values by key, shared by threads, within ``max_entries`` and ``max_bytes`` (``size_of`` each value): the
    least recently used go first. A value larger than ``max_bytes`` alone is not kept. Reading is a ``Mapping``
    (what a job's ``known`` results are); :meth:`put` is the one way in."""

    def __init__(
        self,
        size_of: Callable[[V], int],
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.size_of, self.max_entries, self.max_bytes = size_of, max_entries, max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0

    def __getitem__(self, key: K) -> V:
        with self._lock:
            value, _ = self._items[key]
            self._items.move_to_end(key)
            return value

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._items))  # a snapshot: another thread may put while the caller iterates

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """The bytes held now (``size_of`` summed)."""
        return self._bytes

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` under ``key`` (the most recent), dropping the least recently used past either bound."""
        size = self.size_of(value)
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key)[1]
            if size > self.max_bytes:
                return value
            self._items[key] = (value, size)
            self._bytes += size
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1]
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


# Every simulation by its spec, shared by every session and page (the At-scale page's, the lesson's ideas): a
# workshop that asks for the same shape simulates it once.
SIMULATIONS: ResultStore[RunSpec, RunResult] = ResultStore(json_bytes)


def simulated(
    specs: Sequence[RunSpec], progress: Progress | None = None, workers: WorkerPool | None = None
) -> dict[RunSpec, RunResult]:
    """Each of ``specs`` simulated, in this thread or ``workers``' process, or reused from the server's bounded
    store of simulations (:data:`ckptlab.lab.store.SIMULATIONS`: every participant of a workshop sees the same).

    Those the store lacks are simulated as one table (:func:`ckptlab.step.table.simulate_table`): the settings of
    one model and shape (checkpointing off and on) share their shallow steps.
    """
    report = progress or (lambda message, fraction: None)
    results = {spec: known for spec in specs if (known := SIMULATIONS.get(spec)) is not None}
    missing = [spec for spec in specs if spec not in results]
    if missing:
        if workers is None:
            made = simulate_table(missing, progress=report)
        else:
            made = workers.run("ckptlab.lab.workerjobs:simulate_specs", missing, progress=report)
        for spec, result in zip(missing, made, strict=True):
            results[spec] = SIMULATIONS.put(spec, result)
    report(DONE, 1.0)
    return results
