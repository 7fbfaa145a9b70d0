"""How the lab reads time on each device: ``time.perf_counter`` on the CPU, and on CUDA events
read after a synchronize, so that time means kernel time and not launch time."""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from ..results import CPU_TIME_METHOD, CUDA_TIME_METHOD


class Clock(Protocol):
    """Marks points in a step and tells the seconds between two marks.

    A mark is the clock's own token (a float, a CUDA event): only the clock that made it reads it.
    """

    method: str

    def mark(self) -> Any: ...

    def seconds(self, start: Any, end: Any) -> float: ...


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


def clock_for(device: torch.device) -> CudaClock | CpuClock:
    """The clock the lab trusts on ``device``."""
    return CudaClock(device) if device.type == "cuda" else CpuClock()
