"""Mixture-of-experts: the simulation runs the measured step's experts path and lands on its bytes.

Tiny Mixtral- and Qwen2-MoE-shaped folders are written here (config.json only, random
weights); tiny-qwen3-moe is the catalog's CPU preset. Short sequences keep every real run
around a second.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
import torch
from transformers import JetMoeConfig, MixtralConfig, Qwen2MoeConfig

from ckptlab import RunResult, RunSpec, UnsupportedModelError, describe, measure, simulate
from ckptlab.cli import main
from ckptlab.model.experts import EXPERTS_IMPLEMENTATION, ROUTING_NOTE
from ckptlab.step.fake_experts import grouped_mm_output_shape
from ckptlab.step.preflight import load_model
from ckptlab.step.routing import collapse_routing, expert_load
from ckptlab.step.trainstep import random_batch
from tests.cases import covering

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SEQ = 48
CATEGORIES = ("parameter", "buffer", "gradient", "optimizer_state", "activation", "temp")
SMALL = {"vocab_size": 512, "max_position_embeddings": 256, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Mixtral, Qwen2-MoE (shared expert; one with dense layers between sparse ones) and JetMoE folders."""
    root = tmp_path_factory.mktemp("moe")
    configs = {
        "mixtral": MixtralConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_local_experts=4,
            num_experts_per_tok=2,
            architectures=["MixtralForCausalLM"],
            **SMALL,
        ),
        "qwen2_moe": Qwen2MoeConfig(
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_hidden_layers=3,
            num_experts=6,
            num_experts_per_tok=2,
            architectures=["Qwen2MoeForCausalLM"],
            **SMALL,
        ),
        "qwen2_moe_sparse_step_2": Qwen2MoeConfig(
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_hidden_layers=6,
            num_experts=6,
            num_experts_per_tok=2,
            decoder_sparse_step=2,
            architectures=["Qwen2MoeForCausalLM"],
            **SMALL,
        ),
        # JetMoE's experts route in Python (no @use_experts_implementation) and it cannot be checkpointed.
        "jetmoe": JetMoeConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_key_value_heads=2,
            kv_channels=16,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            vocab_size=512,
            max_position_embeddings=256,
            architectures=["JetMoeForCausalLM"],
        ),
    }
    paths = {}
    for name, config in configs.items():
        config.save_pretrained(root / name)
        paths[name] = str(root / name)
    return paths


def _spec(model: str, every_n_layers: int | None, **changes) -> RunSpec:
    base = RunSpec(model=model, seq_len=SEQ, every_n_layers=every_n_layers, repeats=1, warmup=0, optimizer="none")
    return replace(base, dtype="float32", **changes)


def _assert_simulation_lands_on_the_run(run: RunResult, sim: RunResult) -> None:
    """Every memory category after the forward and at the peak within 3% (they agree to the byte)."""
    for name in ("baseline_bytes", "after_forward_bytes", "peak_bytes"):
        assert getattr(sim.memory, name) == pytest.approx(getattr(run.memory, name), rel=0.03), name
    for part in ("breakdown_after_forward", "breakdown_at_peak"):
        measured, simulated = getattr(run.memory, part), getattr(sim.memory, part)
        assert measured.keys() == simulated.keys(), part
        for category in measured:
            assert category in CATEGORIES
            assert simulated[category] == pytest.approx(measured[category], rel=0.03), (part, category)
    assert sim.memory.peak_where.description == run.memory.peak_where.description
    # The observed reruns (router and experts included) follow the plan in both.
    assert [layer.observed for layer in sim.layers] == [layer.planned for layer in run.layers]
    assert run.plan_matches and sim.plan_matches
    # A CP MoE layer's rerun runs its router and its experts again, seen on those modules themselves.
    for result in (run, sim):
        for layer in result.layers:
            if layer.moe:
                reruns = 1 if layer.planned == "CP" else 0
                assert layer.router_recompute_calls == layer.experts_recompute_calls == reruns, layer


# Each MoE model with CP and kept layers both (every_n_layers=2); off and every layer once each (tests/cases.py).
@pytest.mark.parametrize(
    ("model", "every_n_layers"), covering(["tiny-qwen3-moe", "mixtral", "qwen2_moe"], [2, None, 1])
)
def test_simulation_matches_a_measured_moe_run(model, every_n_layers, folders):
    path = folders.get(model, model)
    run = measure(_spec(path, every_n_layers))
    sim = simulate(_spec(path, every_n_layers))
    _assert_simulation_lands_on_the_run(run, sim)
    for result in (run, sim):
        assert result.model.experts_implementation == EXPERTS_IMPLEMENTATION == "grouped_mm"
        assert result.model.num_experts in (4, 6, 8) and result.model.experts_per_token == 2
    assert ROUTING_NOTE in sim.notes
    # The experts path survives a JSON round trip, typed.
    again = RunResult.from_dict(RunResult.from_dict(sim.to_dict()).to_dict())
    assert again.model == sim.model and again.model.experts_implementation == "grouped_mm"


def test_bfloat16_and_an_optimizer_step_match_too(folders):
    """bf16 goes through torch's own grouped-matmul meta function; AdamW adds the experts' state."""
    spec = replace(_spec(folders["mixtral"], 1), dtype="bfloat16", optimizer="adamw")
    run, sim = measure(spec), simulate(spec)
    assert sim.dtype == run.dtype == "bfloat16"
    _assert_simulation_lands_on_the_run(run, sim)
    assert sim.memory.optimizer_state_bytes == run.memory.optimizer_state_bytes > 0


def test_layers_that_differ_are_simulated_one_by_one(folders):
    """decoder_sparse_step=2: dense and MoE layers alternate, so the fast path cannot fold them."""
    path = folders["qwen2_moe_sparse_step_2"]
    info = describe(path)
    assert not info.layers_alike and info.moe_layers == 3 and info.num_layers == 6
    spec = _spec(path, 2)
    sim, run = simulate(spec), measure(spec)
    assert not any(note.key == "note.extrapolated" for note in sim.notes)
    _assert_simulation_lands_on_the_run(run, sim)
    assert [layer.moe for layer in sim.layers] == [False, True] * 3  # (index + 1) % 2 == 0 holds experts


def test_the_experts_path_is_chosen_explicitly_and_dense_models_have_none(folders):
    for path in (folders["mixtral"], folders["qwen2_moe"], "tiny-qwen3-moe"):
        info = describe(path)
        assert info.experts_implementation == "grouped_mm" and info.moe_layers == info.num_layers
    dense = describe("tiny-llama")
    assert dense.experts_implementation is None and dense.num_experts == 0 and dense.layers_alike


def test_real_shape_moe_presets_simulate_quickly():
    """Qwen3-30B-A3B at 1024 tokens: every expert's weights and state, only top-8 of 128 experts' activations."""
    sim = simulate(RunSpec(model="qwen3-30b-a3b", seq_len=1024, every_n_layers=1, optimizer="none"))
    assert sim.model.num_experts == 128 and sim.model.experts_per_token == 8
    assert sim.memory.breakdown_baseline["parameter"] == 2 * sim.model.num_params  # bfloat16, all experts
    assert any(note.key == "note.extrapolated" for note in sim.notes) and sim.plan_matches


def test_an_moe_the_simulation_cannot_route_gets_one_message(folders, capsys):
    """JetMoE routes in Python from tensor values: no traceback, one UnsupportedModelError, exit 2."""
    with pytest.raises(UnsupportedModelError, match="cannot be simulated"):
        simulate(_spec(folders["jetmoe"], None))
    with pytest.raises(UnsupportedModelError, match="does not support activation checkpointing"):
        simulate(_spec(folders["jetmoe"], 1))
    for argv in (["--no-checkpointing"], ["--every-n-layers", "2"]):
        assert main(["simulate", "--model", folders["jetmoe"], "--seq-len", "32", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "a, b",
    [((10, 16), (4, 16, 8)), ((16, 10), (10, 8)), ((10, 8), (4, 8, 16))],
)
def test_the_fake_grouped_mm_shape_is_the_kernels(a, b):
    """The forward and both gradients' layouts, against torch's CPU kernel in float32."""
    # The weights' gradient multiplies the transposed input, as autograd passes it.
    mat_a = torch.randn(a[::-1]).t() if len(a) == len(b) == 2 else torch.randn(a)
    mat_b = torch.randn(b)
    ends = torch.tensor([2, 5, 5, 10], dtype=torch.int32)
    out = torch._grouped_mm(mat_a, mat_b, offs=ends)
    assert list(out.shape) == grouped_mm_output_shape(mat_a, mat_b, ends)


def test_the_routing_changes_no_byte_and_the_simulation_lands_on_the_median():
    """Seeds 0 and 1 and a collapsed router (every token on the same 2 experts): same bytes, simulation within 3%."""
    spec = _spec("tiny-qwen3-moe", 1, seq_len=32)
    runs, loads = [], []
    for seed, collapse in ((0, False), (1, False), (0, True)):
        model, info = load_model(replace(spec, seed=seed))
        if collapse:
            assert collapse_routing(model) == info.moe_layers
        loads.append(expert_load(model, random_batch(model, replace(spec, seed=seed), torch.device("cpu"))))
        runs.append(measure(replace(spec, seed=seed), model=model, info=info))
    assert all(sum(load) == 32 * 2 for load in loads)  # tokens x top_k, whatever the split
    assert len({tuple(load) for load in loads}) == 3 and max(loads[2]) == 32  # three different splits
    sim = simulate(spec)
    for part in ("breakdown_after_forward", "breakdown_at_peak"):
        for category in getattr(sim.memory, part):
            measured = [getattr(run.memory, part)[category] for run in runs]
            middle = statistics.median(measured)
            assert getattr(sim.memory, part)[category] == pytest.approx(middle, rel=0.03), (part, category)
    assert len({run.memory.peak_bytes for run in runs}) == 1  # the spread of the peak: zero bytes
