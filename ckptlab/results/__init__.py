"""The typed result of a run (:mod:`.run`: what a run found, its parts and its JSON) and the lab's one
verdict on time (:mod:`.verdict`: ``judge_time``, ``compare``).

Numbers are bytes and seconds; units are made at the edge (``ckptlab.units``). Every
result carries its :class:`Provenance`, so a figure can always say whether it was
measured on CUDA, measured on the CPU, simulated or predicted.
"""

from .run import (
    AS_ON_CPU,
    BUSY_SPREAD,
    CPU_MEMORY_METHOD,
    CPU_TIME_METHOD,
    CUDA_MEMORY_METHOD,
    CUDA_TIME_METHOD,
    METHOD_FACTS,
    MIN_SAMPLES_TO_JUDGE,
    NO_GPU,
    OBSERVED_MEMORY_METHOD,
    SIMULATED_MEMORY_METHOD,
    BusyReason,
    Kind,
    LayerResult,
    MemoryResult,
    ModelSummary,
    Provenance,
    RankResult,
    Region,
    RunResult,
    Status,
    TimelinePoint,
    TimingResult,
    measurements,
    memory_of,
    timing_of,
)
from .verdict import Comparison, Judgement, TimeVerdict, compare, judge_time, median

__all__ = [
    "AS_ON_CPU",
    "BUSY_SPREAD",
    "CPU_MEMORY_METHOD",
    "CPU_TIME_METHOD",
    "CUDA_MEMORY_METHOD",
    "CUDA_TIME_METHOD",
    "METHOD_FACTS",
    "MIN_SAMPLES_TO_JUDGE",
    "NO_GPU",
    "OBSERVED_MEMORY_METHOD",
    "SIMULATED_MEMORY_METHOD",
    "BusyReason",
    "Comparison",
    "Judgement",
    "Kind",
    "LayerResult",
    "MemoryResult",
    "ModelSummary",
    "Provenance",
    "RankResult",
    "Region",
    "RunResult",
    "Status",
    "TimeVerdict",
    "TimelinePoint",
    "TimingResult",
    "compare",
    "judge_time",
    "measurements",
    "median",
    "memory_of",
    "timing_of",
]
