"""The CPU meter: the lean MemTracker agrees with torch's own, and the timeline's peak is the step's."""

from __future__ import annotations

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from ckptlab import RunSpec, build_model, load_model, measure
from ckptlab.step.memory_meters import TRACKER_CATEGORIES, TrackerMeter
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


def _allocator_rise(step) -> int:
    """How far the CPU allocator's bytes rose over ``step()``, from torch's profiler's memory events (a meter that
    follows no tensor: what a run without a tracker allocates)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [event for event in prof.profiler.kineto_results.events() if event.name() == "[memory]"]
    now = rise = 0
    for event in sorted(events, key=lambda event: event.start_ns()):
        if event.device_type() == torch.autograd.DeviceType.CPU:
            now += event.nbytes()
            rise = max(rise, now)
    return rise


def test_under_accumulation_the_meter_rises_as_the_allocator_without_a_tracker(shallower):
    """Issue 62: MemTracker's module hooks held each micro-batch's graph, and with a frozen embedding (LoRA) the
    embeddings' output and its .grad (2 x tokens x hidden x 4 B) lived until the step's end; the CPU allocator,
    with no tracker, freed them after each backward. The lab's rise over its baseline is the allocator's."""
    from peft import LoraConfig, get_peft_model

    seq, accumulation = 32, 3
    spec = RunSpec(
        model=shallower("tiny-llama", 2),
        seq_len=seq,
        every_n_layers=1,
        lora_rank=8,
        gradient_accumulation_steps=accumulation,
        dtype="float32",
        device="cpu",
        warmup=1,
    )
    memory = measure(spec, timed=False).memory  # one warm-up step, then the metered one

    torch.manual_seed(0)
    model = get_peft_model(build_model(spec.model)[0], LoraConfig(r=8, target_modules="all-linear"))
    model.get_base_model().activation_checkpointing_enable()
    optimizer = torch.optim.AdamW([param for param in model.parameters() if param.requires_grad])
    batches = [torch.randint(model.config.vocab_size, (1, seq)) for _ in range(accumulation)]

    def step() -> None:
        for ids in batches:
            (model(input_ids=ids, labels=ids).loss / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's state, as the lab's warm-up step makes it
    rise = _allocator_rise(step)
    assert memory.peak_bytes - memory.baseline_bytes == pytest.approx(rise, rel=0.01)
