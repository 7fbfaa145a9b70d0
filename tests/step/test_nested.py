"""Checkpointing layers nested in checkpointing layers (Zamba2's hybrid layer holds a ``mamba_decoder``): the plan
follows transformers' rule over the nested list, and a keep layer inside a checkpointed parent reruns with it."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from ckptlab import RunSpec, describe, simulate
from ckptlab.cli import main
from ckptlab.model.plan import CP, KEEP, rerun_inside, rerun_roles


def zamba2(folder) -> str:
    """4 layers, 2 of them hybrid: transformers counts 6 GradientCheckpointingLayers."""
    config = AutoConfig.for_model(
        "zamba2",
        num_hidden_layers=4,
        layers_block_type=["linear_attention", "hybrid"] * 2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=128,
        mamba_d_state=8,
        n_mamba_heads=2,
        chunk_size=32,
        adapter_rank=8,
        max_position_embeddings=256,
    )
    config.save_pretrained(folder)
    return str(folder)


def test_a_keep_layer_inside_a_checkpointed_one_reruns_with_it():
    parents = [None, None, 1, None, None, 4]
    flags = [CP, KEEP, CP, KEEP, CP, KEEP]  # every_n_layers=2 over the six
    assert rerun_roles(flags, parents) == [CP, KEEP, CP, KEEP, CP, CP]
    assert rerun_inside(flags, parents) == [None, None, None, None, None, 4]
    assert rerun_roles(flags, []) == flags


def test_the_plan_before_a_run_says_the_nested_layer_reruns_inside_its_parents_rerun():
    from ckptlab.show.figures.diagram import plan_figure

    assert "reruns inside L5's rerun" in plan_figure(6, 2, nested=(None, None, 1, None, None, 4)).to_json()
    assert "reruns inside" not in plan_figure(6, 2).to_json()


def test_the_nesting_and_the_depth_are_described(tmp_path):
    info = describe(zamba2(tmp_path))
    assert info.num_layers == 6 and info.depth == 4
    assert info.nested_in == (None, None, 1, None, None, 4)
    assert not info.layers_alike and info.layer_period == 6  # no fold over nested layers


@pytest.mark.slow
def test_run_does_what_transformers_plans_and_the_simulation_agrees(tmp_path, capsys):
    model = zamba2(tmp_path / "zamba2")
    quick = ["--model", model, "--seq-len", "32", "--every-n-layers", "2", "--device", "cpu", "--optimizer", "none"]
    assert main(["run", "--json", "--repeats", "1", "--warmup", "0", *quick]) == 0
    run = json.loads(capsys.readouterr().out)
    assert [row["observed"] for row in run["layers"]] == [CP, KEEP, CP, KEEP, CP, CP]
    assert run["plan_matches"]
    assert [row["rerun_inside"] for row in run["layers"]] == [None] * 5 + [4]
    sim = simulate(RunSpec(model=model, seq_len=32, every_n_layers=2, device="cpu", optimizer="none"))
    assert [layer.observed for layer in sim.layers] == [CP, KEEP, CP, KEEP, CP, CP]
    assert not any(note.key == "note.plan_mismatch_simulated" for note in sim.notes)
    assert any(note.key == "note.reruns_inside" for note in sim.notes)
    assert sim.memory.after_forward_bytes == pytest.approx(run["memory"]["after_forward_bytes"], rel=0.01)
    assert sim.memory.peak_bytes == pytest.approx(run["memory"]["peak_bytes"], rel=0.01)
    from ckptlab.show.figures.diagram import diagram_figure

    assert "reruns inside L5's rerun" in diagram_figure(sim).to_json()
