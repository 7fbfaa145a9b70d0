"""Layers that differ (Gemma 3's sliding and full attention): shallow copies keep the real layers' kinds, the fold
repeats whole patterns, and a simulation asked for the CPU stands for the CPU."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from ckptlab import RunSpec, describe, measure, simulate
from ckptlab.model import catalog
from ckptlab.model.configs import config_with
from ckptlab.step.fold import Reduction

SLIDING, FULL = "sliding_attention", "full_attention"


def gemma3(folder, layer_types: list[str]) -> str:
    """A tiny gemma3_text with its own ``layer_types`` (transformers' default pattern is five sliding, one full)."""
    config = AutoConfig.for_model(
        "gemma3_text",
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=128,
        sliding_window=16,
        max_position_embeddings=256,
    )
    config.save_pretrained(folder)
    return str(folder)


def test_a_shallower_copy_keeps_the_layer_types_of_the_layers_it_keeps(tmp_path):
    config, _, _ = catalog.load_config(gemma3(tmp_path, [SLIDING, SLIDING, SLIDING, FULL]))
    assert config_with(config, {"num_hidden_layers": 4}).layer_types == [SLIDING, SLIDING, SLIDING, FULL]
    assert config_with(config, {"num_hidden_layers": 2}).layer_types == [SLIDING, SLIDING]
    # Deeper: the pattern continues where the list repeats, else transformers' default as before.
    assert config_with(config, {"num_hidden_layers": 5}).layer_types != [SLIDING, SLIDING, SLIDING, FULL, SLIDING]
    repeating = config_with(config, {"layer_types": [SLIDING, FULL] * 2})
    assert config_with(repeating, {"num_hidden_layers": 5}).layer_types == [SLIDING, FULL, SLIDING, FULL, SLIDING]


def test_zamba2s_layer_types_alias_is_kept_in_step():
    """Zamba2 stores ``layer_types`` as ``layers_block_type`` (its attribute_map): the override of the depth must
    follow that name, and ``hybrid_layer_ids`` (indices, not one entry per layer) is rebuilt by the config."""
    config = AutoConfig.for_model("zamba2", num_hidden_layers=4, layers_block_type=["linear_attention", "hybrid"] * 2)
    shallow = config_with(config, {"num_hidden_layers": 2})
    assert shallow.layers_block_type == ["linear_attention", "hybrid"] and shallow.hybrid_layer_ids == [1]


def test_a_wrappers_depth_is_its_text_configs():
    """Gemma3Config and Llama4Config wrap a text config: the depth a simulation's copy overrides is its language
    model's (the wrapper has no num_hidden_layers of its own), its per-layer lists kept in step; the rest stays."""
    config = AutoConfig.for_model("gemma3", text_config={"num_hidden_layers": 4, "layer_types": [SLIDING] * 3 + [FULL]})
    shallow = config_with(config, {"num_hidden_layers": 2, "image_token_id": 7})
    assert type(shallow) is type(config) and shallow.image_token_id == 7
    assert shallow.text_config.num_hidden_layers == 2 and shallow.text_config.layer_types == [SLIDING, SLIDING]
    assert shallow.vision_config.num_hidden_layers == config.vision_config.num_hidden_layers


def test_layers_of_other_settings_are_not_alike(tmp_path):
    info = describe(gemma3(tmp_path / "a", [SLIDING, FULL] * 3))
    assert not info.layers_alike and info.layer_period == 2
    assert describe(gemma3(tmp_path / "b", [SLIDING] * 4)).layers_alike
    assert describe(gemma3(tmp_path / "c", [SLIDING, SLIDING, SLIDING, FULL])).layer_period == 4


def test_the_fold_unit_spans_whole_repeats_of_the_plan_and_the_kinds():
    assert Reduction.for_plan(17, 1, period=2) == Reduction(unit=2, head=2, tail=3, middle_units=6)
    assert Reduction.for_plan(24, 2, period=3) is None  # a 6-layer unit: two copies would be as deep as the model


@pytest.mark.slow  # real steps
@pytest.mark.parametrize("every_n_layers", [None, 2])
def test_measured_equals_a_cpu_simulation_with_the_models_own_layer_types(tmp_path, every_n_layers):
    """Before, the simulation built transformers' default pattern (four sliding layers): +3.8% after the forward."""
    spec = RunSpec(
        model=gemma3(tmp_path, [SLIDING, SLIDING, SLIDING, FULL]),
        seq_len=64,
        every_n_layers=every_n_layers,
        device="cpu",
        optimizer="none",
        repeats=1,
        warmup=0,
    )
    run, sim = measure(spec), simulate(spec)
    assert sim.device == "cpu (simulated)" and sim.dtype == "float32"
    assert sim.memory.after_forward_bytes == pytest.approx(run.memory.after_forward_bytes, rel=0.005)
    assert sim.memory.peak_bytes == pytest.approx(run.memory.peak_bytes, rel=0.005)
    assert [layer.observed for layer in sim.layers] == [layer.observed for layer in run.layers]


def test_a_simulation_stands_for_cuda_unless_asked_for_the_cpu():
    spec = RunSpec(model="tiny-llama", seq_len=32, optimizer="none")
    on_cuda = simulate(spec)
    assert on_cuda.device == "cuda (simulated)" and on_cuda.dtype == "bfloat16"
    assert "CUDA" in on_cuda.provenance.device_name


@pytest.mark.slow
@pytest.mark.parametrize("every_n_layers", [None, 1])
def test_the_fold_of_layers_that_differ_equals_simulating_every_layer(tmp_path, every_n_layers):
    """17 layers, sliding and full in turn (8 full): the fold simulates 7 and 9 layers and extrapolates."""
    spec = RunSpec(
        model=gemma3(tmp_path, [SLIDING, FULL] * 8 + [SLIDING]),
        seq_len=16,
        every_n_layers=every_n_layers,
        optimizer="none",
    )
    fast, exact = simulate(spec), simulate(spec, fast=False)
    assert any(note.key == "note.extrapolated" for note in fast.notes)
    assert fast.memory == exact.memory and fast.layers == exact.layers
    assert fast.work == exact.work is not None
