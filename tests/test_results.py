"""Results: JSON round trip and the judgement of a time difference against the spread."""

from __future__ import annotations

from dataclasses import replace

from ckptlab import RunResult, TimingResult, compare


def _with_steps(result: RunResult, samples: list[float]) -> RunResult:
    timing = TimingResult(
        method="test", forward_s=0.0, backward_s=0.0, step_s=sorted(samples)[len(samples) // 2], step_samples=samples
    )
    return replace(result, timing=timing)


def test_a_difference_counts_only_outside_the_spread(measured):
    base = measured()
    slow = _with_steps(base, [1.30, 1.32, 1.35])
    fast = _with_steps(base, [1.00, 1.02, 1.05])
    noisy = _with_steps(base, [0.98, 1.20, 1.40])
    assert compare(slow, fast).step_significant is True
    assert "outside the spread" in compare(slow, fast).describe_step()
    assert compare(noisy, fast).step_significant is False
    assert "not a measurable difference" in compare(noisy, fast).describe_step()


def test_too_few_repeats_are_not_judged(measured):
    base = measured()
    one, other = _with_steps(base, [2.0]), _with_steps(base, [1.0, 1.0, 1.0])
    assert compare(one, other).step_significant is None
    assert "too few" in compare(one, other).describe_step()


def test_json_round_trip(measured):
    result = measured(every_n_layers=2)
    assert RunResult.from_dict(result.to_dict()) == result
    data = result.to_dict()
    assert data["plan_matches"] is True and data["provenance"]["label"].startswith("measured on the CPU")
