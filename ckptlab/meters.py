"""How the lab reads memory and time on each device.

CUDA: the caching allocator's own statistics (``memory_allocated`` and
``max_memory_allocated`` after ``reset_peak_memory_stats``), and CUDA events read after a
synchronize, so that time means kernel time and not launch time.

CPU: the CPU allocator keeps no statistics, and a process's RSS mixes in the Python
heap, the allocator's cache and the libraries. The lab uses torch's own
``torch.distributed._tools.mem_tracker.MemTracker`` instead of a home-made allocator
hook: it is maintained with torch, counts the bytes of every live tensor storage (the
same quantity the CUDA allocator counts, without its block rounding), understands
activation checkpointing, and breaks the total down into parameters, buffers,
gradients, activations and temporaries. It is a ``TorchDispatchMode`` that looks at every
operator, which slows a step down, so it runs on a separate, untimed step.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
import torch.nn as nn
from torch.distributed._tools.mem_tracker import MemTracker

CUDA_MEMORY_METHOD = (
    "CUDA caching allocator statistics: torch.cuda.memory_allocated and max_memory_allocated "
    "(bytes in live tensors, allocator block rounding included)"
)
CPU_MEMORY_METHOD = (
    "torch.distributed._tools.mem_tracker.MemTracker on a separate untimed step "
    "(bytes of live tensor storages)"
)
CUDA_TIME_METHOD = "CUDA events around forward and backward, read after torch.cuda.synchronize()"
CPU_TIME_METHOD = "time.perf_counter around forward and backward"


class MemoryMeter(Protocol):
    """Reads the memory of one device during one observed step."""

    method: str

    def current(self) -> int:
        """Bytes in use now."""

    def peak(self) -> int:
        """Highest bytes in use since the meter started."""

    def breakdown(self, which: str) -> dict[str, int]:
        """Bytes by category ("current" or "peak"), where the meter can tell; else empty."""


class CudaMeter:
    """The CUDA caching allocator's counters for one device."""

    method = CUDA_MEMORY_METHOD

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextmanager
    def watching(self) -> Iterator[CudaMeter]:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield self
        torch.cuda.synchronize(self.device)

    def current(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def breakdown(self, which: str) -> dict[str, int]:
        return {}


class TrackerMeter:
    """torch's MemTracker, following the model's parameters and everything made in the step."""

    method = CPU_MEMORY_METHOD

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.device = device
        self._model = model
        self._tracker: MemTracker | None = None

    @contextmanager
    def watching(self) -> Iterator[TrackerMeter]:
        # A fresh tracker per step: MemTracker refuses a second iteration of the same root module.
        self._tracker = MemTracker()
        self._tracker.track_external(self._model)
        with warnings.catch_warnings():
            # ModTracker warns when a module is already gone when its backward hook fires (seen
            # with tiny-bert); the device totals the lab reads do not depend on per-module stats.
            warnings.filterwarnings("ignore", message="Module is None. Skipping P", category=UserWarning)
            with self._tracker:
                yield self

    def _snapshot(self, which: str) -> dict[str, int]:
        if self._tracker is None:
            raise RuntimeError("TrackerMeter read outside watching()")
        per_device = self._tracker.get_tracker_snapshot(which)
        return {_category_name(key): value for key, value in per_device.get(self.device, {}).items()}

    def current(self) -> int:
        return self._snapshot("current").get("Total", 0)

    def peak(self) -> int:
        return self._snapshot("peak").get("Total", 0)

    def breakdown(self, which: str) -> dict[str, int]:
        return {key: value for key, value in self._snapshot(which).items() if key != "Total" and value}


def _category_name(key: object) -> str:
    # MemTracker keys are str enums (_MemRefType.ACT == "Activation") plus the plain "Total".
    return str(getattr(key, "value", key))


class Clock(Protocol):
    """Marks points in a step and tells the seconds between two marks."""

    method: str

    def mark(self) -> object: ...

    def seconds(self, start: object, end: object) -> float: ...


class CpuClock:
    method = CPU_TIME_METHOD

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaClock:
    method = CUDA_TIME_METHOD

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / 1000.0


def meter_for(model: nn.Module, device: torch.device) -> CudaMeter | TrackerMeter:
    """The memory meter the lab trusts on ``device``."""
    return CudaMeter(device) if device.type == "cuda" else TrackerMeter(model, device)


def clock_for(device: torch.device) -> CudaClock | CpuClock:
    """The clock the lab trusts on ``device``."""
    return CudaClock(device) if device.type == "cuda" else CpuClock()
