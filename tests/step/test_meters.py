"""The CPU meter: the lean MemTracker agrees with torch's own, and the timeline's peak is the step's."""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from ckptlab import RunSpec, load_model
from ckptlab.step.meters import TRACKER_CATEGORIES, TrackerMeter
from ckptlab.step.trainstep import random_batch, train_step


def _peak_with(tracker_meter_or_stock, model, batch):
    model.activation_checkpointing_enable(every_n_layers=2)
    if isinstance(tracker_meter_or_stock, MemTracker):
        tracker = tracker_meter_or_stock
        tracker.track_external(model)
        with tracker:
            train_step(model, batch, None)
        snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
        return {str(getattr(k, "value", k)): v for k, v in snap.items() if v}
    meter = tracker_meter_or_stock
    with meter.watching():
        train_step(model, batch, None)
        peak = meter.take_peak()
        breakdown = meter.peak_breakdown()
    return {**breakdown, "Total": peak}


def test_lean_tracker_finds_the_same_peak_as_torchs_memtracker():
    """The lean tracker overrides a private method of MemTracker: this catches a torch upgrade that breaks it."""
    spec = RunSpec(seq_len=128)
    model, _ = load_model(spec)
    batch = random_batch(model, spec, torch.device("cpu"))
    stock = _peak_with(MemTracker(), model, batch)
    lean = _peak_with(TrackerMeter(model, torch.device("cpu")), model, batch)
    assert lean == {TRACKER_CATEGORIES.get(key, key): value for key, value in stock.items()}
    assert stock["Total"] > stock["Parameter"] > 0


def test_timeline_peak_is_the_runs_peak(measured):
    for n in (None, 1, 2):
        memory = measured(every_n_layers=n).memory
        assert max(point.region_peak_bytes for point in memory.timeline) == memory.peak_bytes
        assert memory.timeline[0].current_bytes == memory.baseline_bytes
        assert all(point.region_peak_bytes >= point.current_bytes for point in memory.timeline)
