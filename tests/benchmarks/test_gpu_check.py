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
