"""The lab's one judgement of time: a ratio of medians against the spread of the repeats.

:func:`judge_time` gives a :class:`TimeVerdict`; :func:`compare` sets one run against a
reference run (usually checkpointing off) with it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..errors import SpecError, expect_type
from ..fact import ENGLISH, filled, text
from .run import MIN_SAMPLES_TO_JUDGE, RunResult, measurements


class Judgement(str, Enum):
    """What a time difference between two sets of timed steps is worth."""

    MEASURABLE = "measurable"  # the two ranges (fastest to slowest) do not overlap
    NOISE = "noise"  # they overlap: within the spread of the repeats, not a measurable difference
    TOO_FEW = "too_few"  # fewer than MIN_SAMPLES_TO_JUDGE steps on a side: no spread worth the name


@dataclass(frozen=True)
class TimeVerdict:
    """One timed figure against a reference: the ratio of medians, the spread, and whether it is measurable.

    The one home of the lab's judgement of time: :func:`compare`, the sweep's rows, the
    recommendation, the figures, the lesson and the exercises all take it from :func:`judge_time`.
    """

    ratio: float  # median of the samples over the reference's median
    spread: float  # the wider relative spread (fastest-to-slowest over the median) of the two sides
    samples: int  # timed steps on the side with fewer
    judgement: Judgement

    @property
    def measurable(self) -> bool:
        return self.judgement is Judgement.MEASURABLE

    @property
    def noise(self) -> bool:
        """True when the figure is not to be read as a difference: within the spread, or too few steps."""
        return not self.measurable

    @property
    def change(self) -> str:
        """The difference as a signed percentage, e.g. "+55%"; "0%" rather than "-0%"."""
        percent = round((self.ratio - 1) * 100)
        return f"{percent:+d}%" if percent else "0%"

    def describe(self, lang: str = ENGLISH) -> str:
        """The verdict on the step time in ``lang``'s words (English by default), as the command line says it: the
        one wording is ``cli.step_time_<judgement>`` of the locale files."""
        template = text(f"cli.step_time_{self.judgement.value}", lang)
        return filled(template, lang, {"change": self.change, "min_samples": MIN_SAMPLES_TO_JUDGE})

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "spread": self.spread,
            "samples": self.samples,
            "judgement": self.judgement.value,
            "measurable": self.measurable,
        }


def judge_time(samples: list[float], reference: list[float]) -> TimeVerdict:
    """The lab's rule for a time difference: measurable only when the two ranges of samples do not overlap.

    On a shared 2-core machine a small model's recompute cost can be smaller than the noise;
    then the lab says so instead of reporting it. With fewer than ``MIN_SAMPLES_TO_JUDGE``
    samples on either side there is no judgement (``Judgement.TOO_FEW``).

    Raises:
        SpecError: an empty side (nothing was timed).
    """
    if not samples or not reference:
        raise SpecError(key="api.no_timed_steps")
    middle, ref_middle = statistics.median(samples), statistics.median(reference)
    spread = max(_relative_spread(samples), _relative_spread(reference))
    count = min(len(samples), len(reference))
    if count < MIN_SAMPLES_TO_JUDGE:
        judgement = Judgement.TOO_FEW
    elif max(samples) < min(reference) or max(reference) < min(samples):
        judgement = Judgement.MEASURABLE
    else:
        judgement = Judgement.NOISE
    return TimeVerdict(ratio=_ratio(middle, ref_middle), spread=spread, samples=count, judgement=judgement)


def _relative_spread(samples: list[float]) -> float:
    middle = statistics.median(samples)
    return (max(samples) - min(samples)) / middle if middle > 0 else 0.0


@dataclass(frozen=True)
class Comparison:
    """A run's time and memory against a reference run (usually checkpointing off)."""

    step: TimeVerdict  # the median step of the run over the reference's, judged against the spread
    peak_ratio: float  # peak memory above baseline, run over reference
    after_forward_ratio: float  # resident activations after the forward, run over reference

    @property
    def step_ratio(self) -> float:
        return self.step.ratio

    @property
    def step_significant(self) -> bool | None:
        """True: measurable; False: within the noise; None: too few repeats to tell (``step.judgement``)."""
        return None if self.step.judgement is Judgement.TOO_FEW else self.step.measurable

    def describe_step(self, lang: str = ENGLISH) -> str:
        """The verdict on the step time in ``lang``'s words (:meth:`TimeVerdict.describe`)."""
        return self.step.describe(lang)


def compare(run: RunResult, reference: RunResult) -> Comparison:
    """Ratios of ``run`` to ``reference``, with the step-time difference judged by :func:`judge_time`.

    Raises:
        SpecError: if either run has no measurements (it did not fit), or is not a RunResult.
    """
    example = "ckptlab.compare(ckptlab.measure(spec), ckptlab.measure(reference_spec))"
    expect_type("ckptlab.compare", "run", run, RunResult, example)
    expect_type("ckptlab.compare", "reference", reference, RunResult, example)
    run_memory, run_timing = measurements(run)
    ref_memory, ref_timing = measurements(reference)
    return Comparison(
        step=judge_time(run_timing.step_samples, ref_timing.step_samples),
        peak_ratio=_ratio(run_memory.peak_above_baseline_bytes, ref_memory.peak_above_baseline_bytes),
        after_forward_ratio=_ratio(run_memory.after_forward_bytes, ref_memory.after_forward_bytes),
    )


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")


def median(samples: list[float]) -> float:
    return statistics.median(samples)
