"""benchmarks/gpu_check.py on a machine without a GPU: a clear message, status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs for minutes; run it by hand")
def test_gpu_check_says_there_is_no_gpu(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "report.md")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "No CUDA GPU here" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "report.md").exists()


def _load(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem + "_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_selective_section_runs_small_on_the_cpu(tmp_path):
    """The GPU check's selective section, on the CPU and a tiny preset: its table, kept bytes and gradients."""
    gpu_check = _load(SCRIPT)
    report = gpu_check.Report(tmp_path / "report.md")
    gpu_check.selective(report, model="tiny-llama", seq_len=64, device="cpu", dtype="float32", repeats=2)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.lines if line.startswith("| ")}
    assert {"off", "full", "attention", "matmuls"} <= rows.keys()
    cells = rows["attention"].split(" | ")
    assert float(cells[7]) > 0 and cells[7] == cells[8] == cells[9]  # kept MiB: measured, simulated, predicted
    assert cells[10] == "0"  # the attention op never ran again in L1
    assert "PLAN MISMATCH" not in report.text()
    assert all(
        " | True | " in line
        for line in report.lines
        if line.startswith("| attention (") or line.startswith("| matmuls (")
    )


def test_the_selective_benchmark_prints_its_ratios_and_verdicts(capsys):
    benchmark = _load(SCRIPT.parent / "selective.py")
    assert benchmark.main(["--seq-len", "64", "--repeats", "2", "--optimizer", "none"]) == 0
    out = capsys.readouterr().out
    for name in ("off", "full", "attention", "matmuls"):
        assert any(line.startswith(name) for line in out.splitlines()), name
    assert "from the cache: aten._scaled_dot_product_flash_attention_for_cpu x1" in out
    assert "PLAN MISMATCH" not in out
