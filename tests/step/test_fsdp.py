"""FSDP2 across ranks: 2 gloo ranks measured on the CPU, the fake process group simulated, and the two compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import debug as dtensor_debug
from torch.distributed.tensor._sharding_prop import ShardingPropagator

from ckptlab import RunResult, RunSpec, SpecError, list_presets, simulate
from ckptlab.model.catalog import build_model
from ckptlab.model.plan import checkpointable_layers, planned_roles
from ckptlab.spec import MAX_WORLD_SIZE
from ckptlab.step.fsdp import mixed_precision_policy
from ckptlab.step.training import Recipe
from tests.cases import covering
from tests.gloo import relaunched_once_on_abort

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
TINY = [preset.name for preset in list_presets() if preset.cpu_ok]
# Short, one timed step, no warm-up: the whole launch (two ranks, four presets) takes about 30 s on 2 cores.
RANKED = RunSpec(seq_len=128, every_n_layers=2, repeats=1, warmup=0, world_size=2, fsdp=True)
# The ranks are measured on the CPU in float32: their simulation is the CPU's (its kernels, its gradient norm), as
# `simulate --device cpu --dtype float32` gives it.
SIMULATED_AS_MEASURED = {"device": "cpu", "dtype": "float32"}
# Plain float32, and FSDP2's mixed precision over float32 master weights (bf16 all-gathers, float32 reductions).
PRECISIONS = ("none", "bf16")
# Each preset once in float32 and mixed precision on one of them (tests/cases.py): the policy acts the same on
# every model, and every model's sharding shows in float32.
CASES = covering(TINY, PRECISIONS)
MIXED = [model for model, precision in CASES if precision == "bf16"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[tuple[str, str], RunResult]:
    """The tiny presets measured on 2 gloo ranks (CASES: each in float32, one under mixed precision too), in one
    torchrun launch."""
    out = tmp_path_factory.mktemp("fsdp") / "ranks.json"
    specs = [json.dumps(replace(RANKED, model=name, mixed_precision=mp).to_dict()) for name, mp in CASES]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["--max-restarts", "0", str(ROOT / "tests" / "step" / "fsdp_ranks.py"), str(out), *specs]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCH_SHOW_CPP_STACKTRACES": "1"}

    def launch() -> subprocess.CompletedProcess:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)

    done = relaunched_once_on_abort(launch, lambda done: done.stderr if done.returncode else "")
    assert done.returncode == 0, done.stderr[-3000:]
    results = [RunResult.from_dict(row) for row in json.loads(out.read_text())]
    return {(result.model.name, result.spec.mixed_precision): result for result in results}


@pytest.mark.parametrize("model, precision", CASES)
def test_two_gloo_ranks_shard_the_parameters_and_keep_the_plan(two_ranks, model, precision):
    result = two_ranks[model, precision]
    assert result.status == "ok" and result.spec.world_size == 2 and result.spec.fsdp
    assert result.to_dict()["mixed_precision_via"] == ("fsdp2" if precision == "bf16" else "none")
    # Float32 master weights either way: the shards before the forward are float32, half the total on each rank.
    assert [row.rank for row in result.ranks] == [0, 1]
    total = result.model.num_params * 4  # float32
    layer = total / result.model.num_layers  # FSDP pads each parameter to a multiple of the world size
    planned = planned_roles(result.model.num_layers, 2)
    for row in result.ranks:
        assert abs(row.memory.breakdown_baseline["parameter"] - total / 2) <= layer
        assert [layer.observed for layer in row.layers] == planned
        assert row.plan_matches and row.timing.step_s > 0
    assert result.plan_matches
    assert RunResult.from_dict(json.loads(result.to_json())) == result


def _as_a_process_first_fsdp2_step() -> None:
    """Empty DTensor's caches of its shape propagation, as in a new process (a CLI's ``simulate``): a simulation
    here then meets every op's propagation for the first time, where its global-shape placeholders were once
    counted as memory (ckptlab.step.simulate), whatever simulated these shapes earlier in this test process."""
    dtensor_debug._clear_sharding_prop_cache()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()


def _largest_unit_bytes(model: str) -> int:
    """The unsharded float32 parameters of the model's largest FSDP unit: a decoder layer, or the root's rest."""
    built, _ = build_model(model)
    total = sum(parameter.numel() for parameter in built.parameters())
    layers = [sum(parameter.numel() for parameter in layer.parameters()) for layer in checkpointable_layers(built)]
    return 4 * max(*layers, total - sum(layers))


def test_fsdp2_mixed_precision_computes_in_bf16_on_float32_shards(two_ranks):
    """The policy took effect: what the forward keeps shrinks, the float32 shards and their AdamW state do not."""
    for model in MIXED:
        plain, mixed = two_ranks[model, "none"].memory, two_ranks[model, "bf16"].memory
        assert mixed.breakdown_baseline == plain.breakdown_baseline, model
        assert mixed.after_forward_bytes < 0.8 * plain.after_forward_bytes, model


@pytest.mark.parametrize("model, precision", CASES)
def test_the_simulation_matches_two_measured_ranks_within_3_percent_or_one_unit_share(two_ranks, model, precision):
    """Every figure and every category of the split, at the start, after the forward and at the peak, simulated for
    the CPU as the ranks ran, and as a process's first FSDP2 step (issue 62: DTensor's shape propagation counted as
    55 MB of activation at tiny-llama's gradient norm, a 13.1% higher peak, in a cold process only).

    The gloo ranks reduce-scatter in place as NCCL does (``ckptlab.step.fsdp.InPlaceReduceScatter``): gloo's
    own reduce-scatter clones its input, and that clone was the measured peak's only difference from the
    simulation. With it gone, 5 launches here gave every rank's peak and split equal to the simulated ones
    to the byte, in plain float32 and under FSDP2's mixed precision. Yet gloo's worker thread lets go of a
    collective's tensors on its own time, and CI runs of 2026-12-02 (a loaded 2-core machine) caught it
    under bf16 only: tiny-qwen3, rank 1, 2,097,664 B fewer gradient bytes at the same event; tiny-qwen3-moe,
    a rank's peak at the backward's end (0.44 MB below the simulated peak at the loss there); and in one run
    rank 0's peak 3,935,232 B above the simulation on tiny-llama and 3,148,288 B on tiny-qwen3 (3.0% and
    3.9%). A rank's peak and each category at it may therefore differ by 3% or by one rank's float32 share
    of the largest FSDP unit (6.3 MB on tiny-llama, 4.2 MB on tiny-qwen3), and the peak may be reached in
    another stretch only where the simulation's own high point in that stretch is within that share of its
    peak; there, the split is compared with the simulation's at that stretch. Every figure before the peak
    stays within 3%.
    """
    unit_share = _largest_unit_bytes(model) // 2
    measured = two_ranks[model, precision]
    _as_a_process_first_fsdp2_step()
    simulated = simulate(replace(measured.spec, **SIMULATED_AS_MEASURED))
    assert simulated.ranks[0].rank == 0 and simulated.spec.world_size == 2
    assert simulated.device == "cpu (simulated)"
    sim = simulated.ranks[0].memory
    assert sim.baseline_bytes == measured.ranks[0].memory.baseline_bytes  # rank 0's, before any collective
    for rank in measured.ranks:
        real = rank.memory
        for name in ("baseline_bytes", "after_forward_bytes", "optimizer_state_bytes"):
            assert getattr(sim, name) == pytest.approx(getattr(real, name), rel=0.03), (rank.rank, name)
        peak_gap = abs(sim.peak_bytes - real.peak_bytes)
        assert peak_gap <= max(0.03 * real.peak_bytes, unit_share), (rank.rank, "peak_bytes", peak_gap)
        where, sim_at_peak = real.peak_where, sim.breakdown_at_peak
        if where.kind != sim.peak_where.kind:  # two high points within one unit share: gloo's timing picks one
            stretch = (where.kind, where.layer, where.micro_batch)
            there = [point for point in sim.timeline if (point.kind, point.layer, point.micro_batch) == stretch]
            assert there, (rank.rank, where)
            highest = max(there, key=lambda point: point.region_peak_bytes)
            gap = sim.peak_bytes - highest.region_peak_bytes
            assert gap <= unit_share, (rank.rank, where, sim.peak_where, gap)
            sim_at_peak = highest.region_peak_breakdown
        for stage in ("breakdown_baseline", "breakdown_after_forward", "breakdown_at_peak"):
            sim_parts = sim_at_peak if stage == "breakdown_at_peak" else getattr(sim, stage)
            real_parts = getattr(real, stage)
            big = {key for key, value in real_parts.items() if value > 0.01 * real.peak_bytes}
            assert big, (rank.rank, stage)
            for key in big:
                moved = unit_share if stage == "breakdown_at_peak" else 0
                gap = abs(sim_parts.get(key, 0) - real_parts[key])
                assert gap <= max(0.03 * real_parts[key], moved), (rank.rank, stage, key, gap)


def test_mixed_precision_across_ranks_is_fsdp2s_policy_not_autocast():
    one, ranks = RunSpec(mixed_precision="bf16"), replace(RANKED, mixed_precision="bf16")
    assert (one.mixed_precision_via, ranks.mixed_precision_via, RANKED.mixed_precision_via) == (
        "autocast",
        "fsdp2",
        "none",
    )
    policy = mixed_precision_policy(ranks)
    assert policy is not None and (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy(one) is None
    model, _ = build_model("tiny-llama")
    assert Recipe.for_spec(ranks, model).autocast_dtype is None
    assert Recipe.for_spec(one, model).autocast_dtype == torch.bfloat16


def test_qwen3_8b_on_8_simulated_ranks_holds_an_eighth_of_the_parameters():
    result = simulate(RunSpec(model="qwen3-8b", seq_len=512, world_size=8, fsdp=True))
    total = result.model.num_params * 2  # bfloat16
    assert result.memory.breakdown_baseline["parameter"] == pytest.approx(total / 8, rel=0.01)
    assert result.plan_matches and not dist.is_initialized()  # the fake process group is gone


def test_the_fast_path_is_exact_under_fsdp():
    """tiny-qwen3 has 8 layers: simulated as 3 and 4 and extrapolated, against all 8."""
    spec = RunSpec(model="tiny-qwen3", seq_len=64, every_n_layers=1, world_size=4, fsdp=True)
    fast, full = simulate(spec), simulate(spec, fast=False)
    assert any(note.key == "note.extrapolated" for note in fast.notes)
    for name in ("baseline_bytes", "after_forward_bytes", "peak_bytes", "optimizer_state_bytes"):
        assert getattr(fast.memory, name) == getattr(full.memory, name), name
    assert fast.memory.breakdown_baseline == full.memory.breakdown_baseline
    assert fast.work == full.work and full.work.kernels("collective") > 0  # FSDP2's all-gathers and reduce-scatters


def test_a_simulation_refuses_to_run_beside_a_real_process_group():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        with pytest.raises(SpecError, match="already belongs to a process group"):
            simulate(replace(RANKED, model="tiny-gpt2"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"world_size": 0}, "whole number from 1 to"),
        ({"world_size": MAX_WORLD_SIZE + 1}, "is more than the lab runs"),  # the declared bound's one refusal
        ({"world_size": 1, "fsdp": True}, "one rank holds everything"),
        ({"world_size": 4, "fsdp": False}, "without fsdp"),
        ({"lora_rank": 8}, "LoRA under FSDP2"),
    ],
)
def test_bad_rank_settings_are_refused(changes, words):
    with pytest.raises(SpecError, match=words):
        replace(RANKED, **changes).validate()
