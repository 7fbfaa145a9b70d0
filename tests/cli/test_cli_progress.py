"""`run` on standard error when it is not a terminal: a warning before a CPU autocast run, progress as lines, and
`--quiet` saying nothing (in-process, one tiny step each)."""

from __future__ import annotations

import json

import pytest

from ckptlab.cli import main

pytestmark = pytest.mark.slow  # real steps

TINY = ["run", "--model", "tiny-llama", "--seq-len", "16", "--repeats", "1", "--warmup", "0", "--device", "cpu"]


def test_a_cpu_autocast_run_warns_first_and_says_its_progress_in_a_log(capsys):
    assert main([*TINY, "--mixed-precision", "bf16", "--no-compare", "--json"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[0].startswith("warning: Mixed precision bf16 on the CPU runs the forward under CPU autocast")
    assert len(lines) > 2 and all(line.startswith("[") and "\r" not in line for line in lines[1:])  # one a message
    assert json.loads(captured.out)["spec"]["mixed_precision"] == "bf16"  # standard output stays the result alone


def test_quiet_says_nothing_on_standard_error(capsys):
    assert main([*TINY, "--mixed-precision", "bf16", "--no-compare", "--json", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
