"""The policy axis: a sweep's rows for each selective policy, and a recommendation that names the policy it chose."""

from __future__ import annotations

import json

import pytest
import torch

from ckptlab import build_model, observed_roles, planned_roles
from ckptlab.cli import main
from ckptlab.errors import SpecError
from ckptlab.explore.recommend import recommend
from ckptlab.explore.sweep import SweepRow, SweepSpec, plan_sweep, sweep
from ckptlab.spec import RunSpec, Setting
from ckptlab.units import MIB

TWO = SweepSpec(
    model="tiny-llama", seq_lens=(64,), every_n_layers=(1, 3), repeats=1, warmup=0, optimizer="none",
    policies=("none", "attention"),
)  # fmt: skip


def test_plain_keys_stay_and_a_policy_is_added_to_its_key():
    assert [Setting(None).key, Setting(2).key, Setting(1, True).key] == ["off", "n=2", "n=1+offload"]
    assert Setting(1, False, "attention").key == "n=1+attention"
    assert Setting(2, True, "matmuls").key == "n=2+offload+matmuls"
    assert Setting.of(RunSpec(every_n_layers=2, selective="attention")) == Setting(2, False, "attention")


def test_the_plan_has_each_setting_once_per_policy_and_a_plain_off_row():
    rows = plan_sweep(TWO).rows
    assert rows == [
        (64, None, False, "none", "sdpa"),
        (64, 1, False, "none", "sdpa"),
        (64, 1, False, "attention", "sdpa"),
        (64, 3, False, "none", "sdpa"),
        (64, 3, False, "attention", "sdpa"),
    ]
    assert plan_sweep(SweepSpec(model="tiny-llama", every_n_layers=(2,), selective="attention")).rows[1:] == [
        (512, 2, False, "attention", "sdpa")
    ]


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"policies": ()}, "sweep.no_policies"),
        ({"policies": ("attention", "attention")}, "sweep.policy_twice"),
        ({"policies": ("none", "attention"), "selective": "matmuls"}, "sweep.selective_and_policies"),
        ({"policies": ("none", "keep-it-all")}, "spec.not_one_of"),
    ],
)
def test_a_bad_policy_axis_is_refused_by_name(changes, key):
    spec = SweepSpec(model="tiny-llama", every_n_layers=(1,), **changes)
    with pytest.raises(SpecError) as raised:
        spec.validate()
    assert raised.value.key == key


@pytest.mark.slow
def test_a_sweep_with_two_policies_measures_rows_for_both():
    result = sweep(TWO)
    assert [row.setting for row in result.rows] == ["off", "n=1", "n=1+attention", "n=3", "n=3+attention"]
    assert [row.selective for row in result.rows] == ["none", "none", "attention", "none", "attention"]
    by_setting = {row.setting: row for row in result.rows}
    for n in (1, 3):
        plain, kept = by_setting[f"n={n}"], by_setting[f"n={n}+attention"]
        assert plain.result.spec.selective == "none" and kept.result.spec.selective == "attention"
        kept_bytes = sum(layer.kept_bytes for layer in kept.result.layers)
        assert kept_bytes > 0 and sum(layer.kept_bytes for layer in plain.result.layers) == 0
        # What the policy kept is resident after the forward, on top of plain checkpointing's.
        assert kept.after_forward_bytes - plain.after_forward_bytes == kept_bytes
        assert kept.cp_layers == plain.cp_layers


@pytest.mark.slow
def test_cli_sweep_takes_a_list_of_policies_and_one_policy_keeps_the_old_json(capsys):
    quick = ["--model", "tiny-llama", "--seq-len", "64", "--repeats", "1", "--warmup", "0", "--every-n-layers", "1"]
    assert main(["sweep", "--json", *quick, "--selective", "none", "attention"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [row["setting"] for row in data["rows"]] == ["off", "n=1", "n=1+attention"]
    assert data["spec"]["policies"] == ["none", "attention"] and data["spec"]["selective"] == "none"
    assert [check["setting"] for check in data["predictions"]] == ["off", "n=1", "n=1+attention"]
    assert main(["sweep", "--json", *quick]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert [row["setting"] for row in plain["rows"]] == ["off", "n=1"]
    assert plain["spec"]["policies"] is None and plain["spec"]["selective"] == "none"


def _row(n, peak_mib, step_ms, selective="none"):
    step = step_ms / 1000
    return SweepRow(
        seq_len=1024, every_n_layers=n, offload=False, status="ok", provenance="measured-cuda",
        cp_layers=0 if n is None else max(1, 8 // n), baseline_bytes=100 * MIB, after_forward_bytes=peak_mib * MIB // 2,
        peak_bytes=peak_mib * MIB, forward_s=step / 3, backward_s=2 * step / 3, step_s=step,
        step_min_s=step * 0.99, step_max_s=step * 1.01, selective=selective,
    )  # fmt: skip


# Keeping the attention costs memory and saves its rerun: n=1+attention fits 700 MiB and is faster than n=1.
POLICY_TABLE = [
    _row(None, 1000, 100),
    _row(2, 760, 112),
    _row(2, 800, 105, "attention"),
    _row(1, 600, 130),
    _row(1, 650, 118, "attention"),
]


def test_the_recommendation_names_the_policy_when_it_is_the_fastest_that_fits():
    rec = recommend(POLICY_TABLE, 700 * MIB)
    assert rec.row.setting == "n=1+attention" and rec.row.selective == "attention"
    assert [row.setting for row in rec.fitting] == ["n=1+attention", "n=1"]
    assert "every_n_layers=1, selective=attention is the fastest" in rec.reason
    assert "create_selective_checkpoint_contexts" in rec.model_code and "context_fn" in rec.model_code
    assert '"context_fn": context_fn' in rec.trainer_code
    # A budget where the policy does not fit: plain checkpointing's own line, as before policies existed.
    plain = recommend(POLICY_TABLE, 620 * MIB)
    assert plain.row.setting == "n=1"
    assert plain.model_code == "model.activation_checkpointing_enable(every_n_layers=1, offload=False)"


def test_the_recommended_policy_lines_run_on_a_tiny_model():
    """The model lines set the plan and torch's SAC context_fn; a training step runs through them."""
    rec = recommend(POLICY_TABLE, 700 * MIB)
    model, info = build_model("tiny-qwen3")
    namespace = {"model": model}
    exec(rec.model_code, namespace)
    assert observed_roles(model) == planned_roles(info.num_layers, 1)
    layer = next(module for module in model.modules() if getattr(module, "gradient_checkpointing", False))
    assert layer._gradient_checkpointing_func.keywords["context_fn"] is namespace["context_fn"]
    model.train()
    ids = torch.arange(16).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_the_attention_axis_gives_each_attention_its_off_row_and_settings_and_the_flag_reads_it():
    """``sweep --attn-implementation sdpa eager``: rows for both, each with its own off reference."""
    from ckptlab.cli import build_parser
    from ckptlab.cli.sweep import sweep_spec_from_args

    args = build_parser().parse_args(
        [
            "sweep",
            "--model",
            "tiny-llama",
            "--seq-len",
            "64",
            "--every-n-layers",
            "1",
            "--attn-implementation",
            "sdpa",
            "eager",
        ]
    )
    spec = sweep_spec_from_args(args)
    assert spec.attention_axis == ("sdpa", "eager")
    assert plan_sweep(spec).rows == [
        (64, None, False, "none", "sdpa"),
        (64, 1, False, "none", "sdpa"),
        (64, None, False, "none", "eager"),
        (64, 1, False, "none", "eager"),
    ]
    assert spec.run_spec(64, 1, False, attn_implementation="eager").attn_implementation == "eager"
    with pytest.raises(SpecError, match="eager"):  # the attention policy has no op to keep in eager attention
        SweepSpec(
            model="tiny-llama", every_n_layers=(1,), policies=("attention",), attn_implementations=("eager",)
        ).validate()
