"""LoRA's targets box (ckptlab.lab.targets): what it holds when the model changes, and what a spec gets."""

from __future__ import annotations

from ckptlab.lab.targets import settle, spec_targets

CHOICES = ["q_proj", "k_proj", "v_proj"]


def test_a_new_model_gets_all_its_targets_unless_chosen_names_carry_over():
    assert settle([], CHOICES, None, "m").chosen == CHOICES  # a link's "all"
    assert settle(["v_proj", "gate"], CHOICES, "other", "m").chosen == ["v_proj"]  # carried over
    assert settle(["gate"], CHOICES, "other", "m").chosen == CHOICES  # nothing carries over: all
    assert settle(["v_proj"], CHOICES, None, "m").chosen == CHOICES  # "all" from the link wins
    assert settle(["gate"], CHOICES, "other", "m").unknown == []


def test_the_same_model_keeps_its_names_and_reports_unknown_ones():
    assert settle(["k_proj"], CHOICES, "m", "m").chosen == ["k_proj"]
    settled = settle(["k_proj", "gate"], CHOICES, "m", "m")
    assert settled.chosen == ["k_proj"] and settled.unknown == ["gate"]
    assert settle(["gate"], CHOICES, "m", "m").chosen == CHOICES  # none known: all


def test_a_spec_gets_none_for_all_targets_or_no_lora_else_the_models_order():
    assert spec_targets(CHOICES, CHOICES, True) is None
    assert spec_targets(["v_proj", "q_proj"], CHOICES, True) == ("q_proj", "v_proj")
    assert spec_targets(["v_proj"], CHOICES, False) is None
    assert spec_targets([], CHOICES, True) == ()
