"""The plan: which layers transformers checkpoints, predicted and read back."""

from __future__ import annotations

import pytest
import torch

from ckptlab import SpecError, describe_plan, observed_roles, planned_roles
from ckptlab.model.catalog import build_on_meta, load_config


@pytest.mark.parametrize("num_layers", [1, 2, 3, 5, 6, 7, 12])
def test_plan_matches_the_flags_transformers_sets(num_layers):
    config, _, task = load_config("tiny-llama")
    config.num_hidden_layers = num_layers
    model = build_on_meta(config, task)  # flags only: no memory needed
    for every_n_layers in range(1, num_layers + 3):
        model.activation_checkpointing_enable(every_n_layers=every_n_layers)
        assert observed_roles(model) == planned_roles(num_layers, every_n_layers), (num_layers, every_n_layers)
    model.activation_checkpointing_disable()
    assert observed_roles(model) == planned_roles(num_layers, None) == ["keep"] * num_layers


def test_plan_examples_from_design():
    assert planned_roles(6, 1) == ["CP"] * 6
    assert planned_roles(6, 2) == ["CP", "keep"] * 3  # layers 1, 3, 5 (1-based)
    assert planned_roles(5, 3) == ["CP", "keep", "keep", "CP", "keep"]
    assert planned_roles(4, 9) == ["CP", "keep", "keep", "keep"]  # larger than the layer count: only the first


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_every_n_layers_names_the_value(bad):
    with pytest.raises(SpecError, match=f"every_n_layers={bad!r}"):
        planned_roles(6, bad)


def test_describe_plan_says_when_only_the_first_layer_is_checkpointed():
    assert "only the first layer is checkpointed" in describe_plan(6, 8)
    assert "all of them" in describe_plan(6, 1)
    assert describe_plan(6, None).startswith("checkpointing off")
    assert "L1, L3, L5" in describe_plan(6, 2)


def test_other_modules_with_a_flag_stay_enabled():
    """Only GradientCheckpointingLayer modules are counted; others with a flag are switched on as they are."""
    config, _, task = load_config("tiny-llama")
    model = build_on_meta(config, task)
    model.model.gradient_checkpointing = False  # LlamaModel carries a flag of its own
    model.activation_checkpointing_enable(every_n_layers=2)
    assert model.model.gradient_checkpointing is True
    assert observed_roles(model) == planned_roles(6, 2)
    assert torch.is_grad_enabled()


def test_the_only_first_layer_note_is_one_note_for_runs_and_simulations():
    from ckptlab.model.plan import only_first_layer_notes
    from ckptlab.show.i18n import say

    (note,) = only_first_layer_notes(6, 9)
    assert note.key == "note.only_first_layer" and note.params == {"n": 9, "layers": 6}
    assert "only the first layer is checkpointed" in say(note)
    assert only_first_layer_notes(6, 5) == only_first_layer_notes(6, None) == only_first_layer_notes(1, 1) == []
