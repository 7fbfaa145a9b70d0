"""--selective on the command line: a policy or op names, one line and status 2 for a bad one, and its result."""

from __future__ import annotations

import json

import pytest

from ckptlab import RunSpec
from ckptlab.cli import main
from ckptlab.cli.args import Parser, add_run_arguments, argv_from_spec, spec_from_args
from ckptlab.explore.sweep_spec import SweepSpec

QUICK = ["--seq-len", "64", "--repeats", "1", "--warmup", "0", "--optimizer", "none"]
CPU_ATTENTION = "aten._scaled_dot_product_flash_attention_for_cpu"


@pytest.mark.parametrize("command", ["run", "simulate", "sweep"])
@pytest.mark.parametrize("value, named", [("attentoin", "'attentoin'"), ("aten.no_such_op", "aten.no_such_op")])
def test_an_unknown_policy_or_op_is_one_line_naming_it_and_status_2(command, value, named, capsys):
    try:
        status = main([command, "--selective", value, "--seq-len", "64"])
    except SystemExit as exited:  # argparse's refusal of a value outside the choices
        status = exited.code
    assert status == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_the_options_give_back_the_spec_and_the_launched_ranks_their_argv():
    parser = Parser()
    add_run_arguments(parser)
    parser.add_argument("--repeats", type=int)  # run's own options, which argv_from_spec gives too
    parser.add_argument("--warmup", type=int)
    for selective in ("none", "attention", "matmuls", "torchtitan", ("aten.mm", "aten.bmm.default")):
        spec = RunSpec(selective=selective)
        again = spec_from_args(parser.parse_args(argv_from_spec(spec)), repeats=spec.repeats, warmup=spec.warmup)
        assert again.selective == selective


def test_a_sweep_keeps_its_off_row_plain_and_its_checkpointed_rows_selective():
    sweep = SweepSpec.from_run_spec(RunSpec(selective="attention"), every_n_layers=(1, 2))
    sweep.validate()
    assert sweep.run_spec(512, None, False).selective == "none"
    assert sweep.run_spec(512, 2, False).selective == "attention"


@pytest.mark.slow
def test_run_json_has_what_each_layer_kept_and_reran(capsys):
    assert main(["run", "--json", "--selective", "attention", *QUICK]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec"]["selective"] == "attention" and data["plan_matches"]
    for layer in data["layers"]:
        assert layer["selective"] == "attention" and layer["kept_bytes"] > 0
        assert layer["kept_ops"] == {CPU_ATTENTION: 1} and layer["reused_ops"] == {CPU_ATTENTION: 1}
        assert CPU_ATTENTION not in layer["rerun_ops"] and layer["rerun_ops"]["aten.mm"] > 0


@pytest.mark.slow
def test_run_prints_what_the_cp_layers_kept_and_simulate_too(capsys):
    assert main(["run", "--no-compare", "--selective", "attention", "--every-n-layers", "2", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "selective=attention" in out
    assert "L1, L3, L5: CP + attention kept" in out and "rerun without attention" in out
    assert main(["simulate", "--model", "qwen3-0.6b", "--seq-len", "1024", "--selective", "matmuls"]) == 0
    out = capsys.readouterr().out
    assert "L1-L28: CP + matmuls kept" in out


def test_run_with_a_policy_compares_against_checkpointing_off_with_no_policy(capsys):
    """The reference drops the policy with the checkpointing (a policy needs checkpointing: it once refused itself)."""
    assert main(["run", "--selective", "attention", "--compare", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "Against checkpointing off" in out
    spec = RunSpec(selective="attention", every_n_layers=2, offload=True)
    assert spec.checkpointing_off() == RunSpec(selective="none", every_n_layers=None, offload=False)
