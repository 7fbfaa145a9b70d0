"""``run --nproc-per-node N --fsdp`` through torch's launcher, and ``simulate --world-size N --fsdp``, from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptlab import RunResult, run_report
from ckptlab.cli import main
from ckptlab.step.fsdp import COLLECTIVE_TIMEOUT_ENV, FAIL_ON_RANK_ENV
from tests.gloo import relaunched_once_on_abort

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--model", "tiny-gpt2", "--seq-len", "32", "--repeats", "1", "--warmup", "0"]


def _start(*extra: str, env: dict[str, str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "ckptlab", "run", "--nproc-per-node", "2", "--fsdp", *QUICK, *extra]
    return subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _processes_marked(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@dataclass
class _TwoRuns:
    marker: str  # in both runs' environment, to find what they left behind
    bad: subprocess.Popen  # the run whose rank 1 fails
    bad_err: str
    good: subprocess.Popen
    good_out: str
    good_err: str


def _two_at_once() -> _TwoRuns:
    marker = f"ckptlab-test-{uuid.uuid4().hex}"
    good = _start("--json", env={"CKPTLAB_TEST_MARKER": marker})
    # The failing run's collective timeout is a day: it ends within the wait below only if the launcher ends rank 0
    # (which waits in a collective for rank 1), never by that backstop.
    bad = _start(env={"CKPTLAB_TEST_MARKER": marker, FAIL_ON_RANK_ENV: "1", COLLECTIVE_TIMEOUT_ENV: "86400"})
    _, bad_err = bad.communicate(timeout=600)
    good_out, good_err = good.communicate(timeout=600)
    return _TwoRuns(marker, bad, bad_err, good, good_out, good_err)


def test_two_runs_at_once_one_of_them_failing_on_a_rank():
    """Free ports: both launch at once. The failing one ends every rank, says one thing, exits 2, leaves nothing behind."""
    runs = relaunched_once_on_abort(_two_at_once, lambda runs: runs.good_err if runs.good.returncode else "")

    assert runs.bad.returncode == 2, runs.bad_err
    assert runs.bad_err.strip() == f"error: rank 1 of 2: failure injected by {FAIL_ON_RANK_ENV} (a test hook)"
    assert _processes_marked(runs.marker) == []

    assert runs.good.returncode == 0, runs.good_err[-3000:]
    result = RunResult.from_dict(json.loads(runs.good_out))
    assert result.spec.world_size == 2 and result.spec.fsdp
    assert [row.rank for row in result.ranks] == [0, 1] and result.plan_matches
    report = run_report(result)
    assert "Per rank (FSDP2, 2 ranks), MiB:" in report
    assert "the same on every rank" in report


def test_bad_input_across_ranks_is_refused_before_any_rank_starts(capsys):
    assert main(["run", "--nproc-per-node", "2", "--fsdp", "--seq-len", "0"]) == 2
    assert "--seq-len 0 is not valid" in capsys.readouterr().err
    assert main(["run", "--nproc-per-node", "2", *QUICK]) == 2
    assert "without fsdp" in capsys.readouterr().err
    assert main(["run", "--nproc-per-node", "2", "--fsdp", "--nnodes", "2", *QUICK]) == 2
    assert "needs --rdzv-endpoint" in capsys.readouterr().err
    assert main(["run", "--fsdp", *QUICK]) == 2
    assert "one rank holds everything" in capsys.readouterr().err


def test_simulate_across_fake_ranks_prints_rank_zero(capsys):
    assert main(["simulate", "--world-size", "4", "--fsdp", *QUICK[:4], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spec"]["world_size"] == 4 and data["spec"]["fsdp"] is True
    assert [row["rank"] for row in data["ranks"]] == [0]
    assert main(["simulate", "--world-size", "4", "--fsdp", *QUICK[:4]]) == 0
    assert "Per rank (FSDP2, 4 ranks, rank 0 simulated), MiB:" in capsys.readouterr().out


def test_simulate_across_fake_ranks_with_mixed_precision_says_it_is_fsdp2s_policy(capsys):
    argv = ["simulate", "--world-size", "2", "--fsdp", "--mixed-precision", "bf16", *QUICK[:4]]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mixed_precision_via"] == "fsdp2" and data["spec"]["mixed_precision"] == "bf16"
    assert main(argv) == 0
    assert "bf16 FSDP2 MixedPrecisionPolicy" in capsys.readouterr().out
