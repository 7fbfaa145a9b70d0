"""Results: JSON round trip and the judgement of a time difference against the spread."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ckptlab import RunResult, TimingResult, compare
from ckptlab.results import Region, TimelinePoint
from ckptlab.show.i18n import say


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


def test_the_json_keeps_the_notes_english_and_the_facts_beside_them(measured):
    result = measured(every_n_layers=2, offload=True)  # on the CPU: the two offload notes
    data = json.loads(result.to_json())
    assert [fact["key"] for fact in data["facts"]] == ["note.offload_on_cpu", "note.offload_would_move"]
    assert data["notes"][0].startswith("offload does not apply on the CPU")  # the English, as JSON always had
    assert data["notes"] == [say(note) for note in result.notes]
    assert RunResult.from_dict(data).notes == result.notes


def test_the_peaks_region_is_typed_and_its_json_keeps_the_dicts_keys(measured):
    where = measured(every_n_layers=2).memory.peak_where
    assert isinstance(where, Region) and where.phase in {"forward", "loss", "backward", "optimizer"}
    # The dict's keys, and the micro-batch added after them (JSON adds keys, never renames them).
    assert list(where.to_dict()) == ["kind", "phase", "layer", "rerun", "description", "micro_batch"]
    assert Region.from_dict(where.to_dict()) == where
    # A result saved before the kind existed still loads; an unknown kind is "".
    assert (
        Region.from_dict({"phase": "backward", "layer": 2, "rerun": True, "description": "backward of L3"}).kind == ""
    )


def test_the_timeline_is_typed_and_its_json_keeps_the_dicts_keys(measured):
    result = measured(every_n_layers=2)
    points = result.memory.timeline
    assert points and all(isinstance(point, TimelinePoint) for point in points)
    keys = ["order", "kind", "phase", "layer", "rerun", "event", "current_bytes", "region_peak_bytes"]
    assert list(result.to_dict()["memory"]["timeline"][0]) == [
        *keys,
        "region_peak_breakdown",
        "micro_batch",
        "region_peak_logits_bytes",
    ]
    # Read back from JSON, every point is typed again and equal to the one recorded.
    assert RunResult.from_dict(result.to_dict()).memory.timeline == points
    peak = max(points, key=lambda point: point.region_peak_bytes)
    assert peak.region == result.memory.peak_where and peak.rise_bytes >= 0


# -- the verdict on time, and a machine too busy to time (constructed timings: no clock, no load) ----------


def _timing(samples, **machine):
    return TimingResult(
        method="test",
        forward_s=0.0,
        backward_s=0.0,
        step_s=sorted(samples)[len(samples) // 2],
        step_samples=samples,
        **machine,
    )


def test_judge_time_measurable_noise_and_too_few():
    from ckptlab.results import Judgement, judge_time

    measurable = judge_time([1.30, 1.32, 1.35], [1.00, 1.02, 1.05])
    assert measurable.judgement is Judgement.MEASURABLE and measurable.measurable and not measurable.noise
    assert measurable.ratio == pytest.approx(1.32 / 1.02) and measurable.samples == 3
    assert measurable.spread == pytest.approx(0.05 / 1.02)  # the wider of the two relative spreads
    # x0.67 of the reference, as the busy machine printed: inside the reference's spread, so noise.
    noise = judge_time([0.70, 0.68, 0.80], [0.60, 1.05, 1.40])
    assert noise.judgement is Judgement.NOISE and not noise.measurable and noise.noise
    assert "not a measurable difference" in noise.describe()
    too_few = judge_time([0.5], [1.0, 1.0, 1.0])
    assert too_few.judgement is Judgement.TOO_FEW and too_few.noise and "too few" in too_few.describe()
    assert judge_time([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]).change == "0%"


def test_compare_takes_its_verdict_from_judge_time(measured):
    from ckptlab.results import judge_time

    base = measured()
    run, ref = _with_steps(base, [1.30, 1.32, 1.35]), _with_steps(base, [1.00, 1.02, 1.05])
    assert compare(run, ref).step == judge_time(run.timing.step_samples, ref.timing.step_samples)


def test_a_busy_machine_is_told_from_the_load_or_the_spread():
    calm = _timing([1.00, 1.02, 1.05], load_average=1.0, cores=2)
    assert calm.busy_reasons == () and not calm.too_busy
    loaded = _timing([1.00, 1.02, 1.05], load_average=3.5, cores=2)
    assert loaded.busy_reasons == ("load",) and loaded.too_busy
    jumpy = _timing([1.00, 1.60, 2.90], load_average=None, cores=None)  # load unknown: the spread alone decides
    assert jumpy.busy_reasons == ("spread",)
    assert _timing([1.0, 1.5, 3.0], load_average=9.0, cores=4).busy_reasons == ("load", "spread")
    # Two steps have no spread worth judging.
    assert _timing([1.0, 3.0], load_average=0.1, cores=2).busy_reasons == ()


def test_the_load_figure_is_read_through_an_injected_function():
    from ckptlab.step.machine_load import machine_load

    assert machine_load(lambda: (5.25, 1.0, 1.0), cores=2) == (5.25, 2)

    def no_load():
        raise OSError("no load average here")

    assert machine_load(no_load, cores=8) == (None, 8)


def test_a_layer_the_step_never_ran_contradicts_no_plan():
    """Gemma 3's vision layers: transformers flags them by its rule, a text batch never runs them (no rerun)."""
    from ckptlab.results import LayerResult

    layer = LayerResult(0, "L1", "SiglipEncoderLayer", "CP", "CP", forward_calls=0, recompute_calls=0, saved_bytes=0,
                        input_bytes=0)  # fmt: skip
    assert layer.as_planned
    assert not replace(layer, forward_calls=1).as_planned  # one that ran and did not rerun does
    assert not replace(layer, enabled="keep").as_planned  # and the flags must still follow the rule
