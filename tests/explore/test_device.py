"""What nvidia-smi will show under a RunSpec's allocator setting (``RunSpec.alloc_conf``), and the side by side with
expandable segments: hand-made orders of allocations, no simulation."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from ckptlab.errors import SpecError
from ckptlab.explore.device import device_total, expandable_beside
from ckptlab.explore.gpus import GPU_SPECS
from ckptlab.results.allocations import ALL_GATHER, COMPUTE, REDUCE_SCATTER, WHOLE_STEP, AllocationTrace
from ckptlab.spec import RunSpec, Setting

MIB = 2**20
GPU = "H100 80 GB"
# 12 MiB born and freed, then 14 MiB: torch's defaults cache the 12 MiB segment (get_allocation_size: a request of
# 10 MiB or more is its own segment, rounded to 2 MiB), which cannot serve 14 MiB, so a 14 MiB segment is added:
# 26 MiB reserved. With expandable_segments:True the large pool maps 20 MiB pages: one page serves both, 20 MiB.
TRACE = AllocationTrace(sizes=(12 * MIB, 14 * MIB), streams=(COMPUTE, COMPUTE), events=(0, ~0, 1, ~1), how=WHOLE_STEP)


def _step(alloc_conf: str, trace: AllocationTrace = TRACE, world_size: int = 1) -> SimpleNamespace:
    """A simulated step as the device total reads it: its spec, its tensors' peak and its order of allocations."""
    return SimpleNamespace(
        spec=RunSpec(alloc_conf=alloc_conf, world_size=world_size, fsdp=world_size > 1),
        memory=SimpleNamespace(peak_bytes=14 * MIB),
        allocations=trace,
        device_total=None,
    )


def test_fsdp2s_collective_buffers_come_from_their_own_streams_pools():
    """get_free_block (BlockComparatorSize orders by stream first): 12 MiB of the compute stream born and freed
    leaves a cached 12 MiB segment that a 12 MiB all-gather buffer (FSDP2's all_gather_copy_in_stream) cannot take:
    a second segment, 24 MiB reserved, where the same order on one stream reserves 12; a reduce-scatter output
    (reduce_scatter_stream) after them takes neither: 36."""
    one_stream = AllocationTrace((12 * MIB, 12 * MIB), (COMPUTE, COMPUTE), (0, ~0, 1, ~1), WHOLE_STEP)
    gathered = replace(one_stream, streams=(COMPUTE, ALL_GATHER))
    reduced = AllocationTrace((12 * MIB,) * 3, (COMPUTE, ALL_GATHER, REDUCE_SCATTER), (0, ~0, 1, ~1, 2, ~2), WHOLE_STEP)
    steps = [_step("", trace) for trace in (one_stream, gathered, reduced)]
    reserved = [device_total(step, GPU).reserved_bytes for step in steps]  # type: ignore[arg-type]
    assert reserved == [12 * MIB, 24 * MIB, 36 * MIB]


def test_nccls_buffers_are_estimated_across_ranks_and_none_on_one_gpu():
    """32 channels of one ring connection (4 MiB Simple + 512 KiB LL + 4,915,200 B LL128, in 2 MiB granules: 10 MiB,
    and 2 MiB beside): 384 MiB on each GPU of 8, said as an estimate in the total; 0 on one GPU."""
    from ckptlab.cli.simulate import device_line

    eight = device_total(_step("", world_size=8), GPU)  # type: ignore[arg-type]
    one = device_total(_step(""), GPU)  # type: ignore[arg-type]
    assert (eight.nccl_bytes, one.nccl_bytes, one.nccl_source) == (384 * MIB, 0, "")
    assert eight.total_bytes == one.total_bytes + 384 * MIB
    assert "0.38 GiB are NCCL's buffers" in device_line(eight) and "estimated: NCCL's defaults" in device_line(eight)
    assert "NCCL" not in device_line(one)


def test_the_specs_alloc_conf_is_what_the_replay_runs_under():
    context = GPU_SPECS[GPU].context_bytes
    default = device_total(_step(""), GPU)  # type: ignore[arg-type]
    expandable = device_total(_step("expandable_segments:True"), GPU)  # type: ignore[arg-type]
    assert (default.reserved_bytes, default.alloc_conf) == (26 * MIB, "")
    assert (expandable.reserved_bytes, expandable.alloc_conf) == (20 * MIB, "expandable_segments:True")
    assert expandable.total_bytes == 20 * MIB + context


def test_expandable_segments_beside_torchs_defaults_replays_the_same_order():
    step = _step("")
    step.device_total = device_total(step, GPU)  # type: ignore[arg-type]
    beside = expandable_beside(step, GPU)  # type: ignore[arg-type]
    assert beside is not None and (beside.reserved_bytes, beside.alloc_conf) == (20 * MIB, "expandable_segments:True")
    named = _step("max_split_size_mb:128")
    named.device_total = device_total(named, GPU)  # type: ignore[arg-type]
    assert expandable_beside(named, GPU) is None  # a setting named is the one asked for: nothing beside it


@pytest.mark.parametrize(
    ("text", "key"),
    [("expandable_segments:true", "allocator.conf_not_a_bool"), ("max_split_size:128", "allocator.conf_unknown_key")],
)
def test_runspec_validates_alloc_conf_as_torch_reads_it(text, key):
    with pytest.raises(SpecError) as caught:
        RunSpec(alloc_conf=text).validate()
    assert caught.value.key == key and caught.value.params["option"].field == "alloc_conf"
    RunSpec(alloc_conf="expandable_segments:True,max_split_size_mb:128").validate()


class _Steps:
    """Stands for TableSimulation: checkpointing off holds 160 B on one GPU, every layer checkpointed 80 B, a rank
    under FSDP2 its share."""

    def __init__(self, specs=()):
        pass

    def result(self, spec: RunSpec, progress=None):
        peak = (160 if spec.every_n_layers is None else 80) // spec.world_size
        return SimpleNamespace(spec=spec, memory=SimpleNamespace(peak_bytes=peak), device_total=None)


def test_the_fewest_gpus_search_decides_on_the_device_total_its_device_step_attaches(monkeypatch):
    """On the tensors alone n=1 fits one GPU of 100 B (80 B); with 30 B outside them (a stubbed device total: the
    allocator's and the context's share), it needs two (40 + 30 B)."""
    from ckptlab.explore import gpu_search
    from ckptlab.explore.scale import ScaleRequest
    from ckptlab.results.allocations import DeviceTotal

    monkeypatch.setattr(gpu_search, "TableSimulation", _Steps)
    monkeypatch.setattr(gpu_search, "parameter_floor", lambda spec: (0, "bfloat16"))

    def with_overhead(result, budget):
        peak = result.memory.peak_bytes
        total = DeviceTotal(GPU, peak, peak, 0, 30, False, "", 0, 0, None, WHOLE_STEP, 0)
        return SimpleNamespace(spec=result.spec, memory=result.memory, device_total=total)

    request = ScaleRequest("tiny-llama", 64, 1, "bfloat16", (Setting(None), Setting(1)))
    tensors = gpu_search.cheapest_that_fits(request, 100, counts=(1, 2), device=lambda result, budget: result)
    device = gpu_search.cheapest_that_fits(request, 100, counts=(1, 2), device=with_overhead)
    assert (tensors.gpus, tensors.setting) == (1, Setting(1))
    assert (device.gpus, device.setting, device.result.device_total.total_bytes) == (2, Setting(1), 70)


def test_the_at_scale_table_decides_on_the_device_total_with_expandable_segments_beside(monkeypatch):
    """A row whose tensors fit is given its device total under the request's setting, and the same order replayed
    with expandable segments beside it: the page's four columns (reserved and nvidia-smi, each setting)."""
    from ckptlab.explore import scale
    from ckptlab.lab import at_scale_view

    class _Table:
        def __init__(self, specs=()):
            pass

        def result(self, spec, progress=None):
            return SimpleNamespace(spec=spec, memory=SimpleNamespace(peak_bytes=14 * MIB), allocations=TRACE)

    def attach(result, budget):
        return SimpleNamespace(**{**vars(result), "device_total": device_total(result, GPU)})  # type: ignore[arg-type]

    monkeypatch.setattr(scale, "TableSimulation", _Table)
    args = ("tiny-llama", 64, 1, "bfloat16", [Setting(1)])
    table = scale.scale_table(*args, budget_bytes=GPU_SPECS[GPU].memory_bytes, gpu=GPU, device=attach)
    row, beside = table.results[0], table.beside["n=1"]
    assert (row.device_total.reserved_bytes, beside.reserved_bytes) == (26 * MIB, 20 * MIB)
    context = GPU_SPECS[GPU].context_bytes
    columns = list(at_scale_view.device_columns(row, beside, "en").values())
    assert columns == [round(size / 2**30, 2) for size in (26 * MIB, 26 * MIB + context, 20 * MIB, 20 * MIB + context)]
    assert scale.scale_table(*args).beside == {}  # without a budget: no device totals, as before


def test_the_at_scale_link_carries_the_allocator_setting_to_the_request():
    from ckptlab.lab import at_scale_view

    spec = RunSpec(alloc_conf="expandable_segments:True")
    values = {**at_scale_view.widget_values(spec, "", tiny=True), "at_scale_gpus": 1}
    assert at_scale_view.query(values, spec.model, None)["alloc"] == "expandable_segments:True"
    request = at_scale_view.request_from_widgets(values, spec.model, 2, None)
    assert request.spec(Setting(1)).alloc_conf == "expandable_segments:True"


def test_the_longest_sequence_is_decided_on_the_device_total_and_its_lines_aim_below_it():
    """Tensors of 10 MB + 1,000 B a token, and 500,000 B outside them (a stubbed device total: 300,000 cached by the
    allocator, 200,000 of context): in a budget that the tensors reach at 1,734 tokens, the step fits up to 1,234."""
    from ckptlab.explore.longest import longest_seq
    from ckptlab.results.allocations import DeviceTotal

    asked: list[int] = []

    def simulate(spec):
        asked.append(spec.seq_len)
        return SimpleNamespace(memory=SimpleNamespace(peak_bytes=10_000_000 + 1000 * spec.seq_len, timeline=[]))

    def with_overhead(result, budget):
        peak = result.memory.peak_bytes
        total = DeviceTotal(GPU, peak, peak + 300_000, 0, 200_000, False, "", 0, 0, None, WHOLE_STEP, 0)
        return SimpleNamespace(device_total=total)

    budget = 10_000_000 + 1000 * 1734
    spec = RunSpec(model="tiny-llama", seq_len=128)
    tensors = longest_seq(
        spec, budget, simulate=simulate, device=lambda result, budget: SimpleNamespace(device_total=None)
    )
    found = longest_seq(spec, budget, simulate=simulate, device=with_overhead)
    assert (tensors.seq_len, found.seq_len, found.over_seq_len) == (1734, 1234, 1235)
    assert (found.spare_bytes, found.over_bytes, found.device.total_bytes) == (0, 1000, budget)
    assert found.simulations <= 5  # the lines aim at the budget less what the device total adds


def test_segments_over_time_hold_allocated_inside_reserved_and_the_figure_draws_both_settings():
    """The hand-made order replayed event by event: 12 MiB then 14 MiB live, inside 12 then 26 MiB reserved with
    torch's defaults, 20 MiB with expandable segments; the lesson's figure draws the three lines."""
    from ckptlab.explore.device import segments_over_time
    from ckptlab.show.figures.allocator import segments_figure

    step = _step("")
    default = segments_over_time(step, "")  # type: ignore[arg-type]
    expandable = segments_over_time(step, "expandable_segments:True")  # type: ignore[arg-type]
    assert (default.allocated, default.reserved) == (
        (12 * MIB, 0, 14 * MIB, 0),
        (12 * MIB, 12 * MIB, 26 * MIB, 26 * MIB),
    )
    assert expandable.reserved_peak == 20 * MIB and default.events_total == 4
    assert all(allocated <= reserved for allocated, reserved in zip(default.allocated, default.reserved))
    figure = segments_figure(default, expandable, "simulated", lang="ja")
    assert [list(trace.y) for trace in figure.data] == [[12, 12, 26, 26], [12, 0, 14, 0], [20, 20, 20, 20]]


def test_the_lessons_caption_says_the_tensors_the_reserved_and_the_cache_in_numbers():
    from ckptlab.explore.device import segments_over_time
    from ckptlab.lab.learn import AllocatorIdea
    from ckptlab.lab.lesson_view import allocator_caption

    step = _step("")
    idea = AllocatorIdea(step, segments_over_time(step, ""), segments_over_time(step, "expandable_segments:True"))  # type: ignore[arg-type]
    caption = allocator_caption(idea, "en")
    assert "**14.0 MiB**" in caption and "reserves **26.0 MiB**" in caption and "12.0 MiB of cache" in caption
    assert "**20.0 MiB**" in caption and "4 allocations" in caption


def test_simulate_says_both_totals_side_by_side_and_its_json_carries_the_second_typed():
    from ckptlab.cli.simulate import fit_verdict

    step = _step("")
    step.device_total = device_total(step, GPU)  # type: ignore[arg-type]
    step.memory.peak_where, step.memory.optimizer_state_bytes = SimpleNamespace(phase="backward"), 0
    beside = expandable_beside(step, GPU)  # type: ignore[arg-type]
    budget = 26 * MIB + GPU_SPECS[GPU].context_bytes - 1  # the defaults' total is a byte over; expandable fits
    verdict = fit_verdict(step, budget, "a card", beside)  # type: ignore[arg-type]
    lines = verdict["sentence"].splitlines()
    assert lines[1].startswith("That does not fit in a card") and "short by 0.0 GiB" in lines[1]
    assert lines[2].startswith("With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: nvidia-smi will show")
    assert lines[3].startswith("That fits in a card") and "-0.01 GiB" not in lines[3]
    assert (verdict["fits"], verdict["beside"]["fits"], verdict["beside"]["reserved_bytes"]) == (False, True, 20 * MIB)
    assert verdict["beside"]["margin_bytes"] == 6 * MIB - 1


@pytest.mark.slow  # a measured step (tiny-llama, 16 tokens, on the CPU)
def test_a_measured_run_says_it_did_not_apply_alloc_conf():
    """The process's allocator measured the step; the setting is the simulation's: said, not silently dropped."""
    from ckptlab.step.measure import measure

    spec = RunSpec(model="tiny-llama", seq_len=16, device="cpu", repeats=1, warmup=0)
    keys = [note.key for note in measure(replace(spec, alloc_conf="expandable_segments:True")).notes]
    assert "note.alloc_conf_not_applied" in keys
