"""notebooks/ckptlab_tour.ipynb runs top to bottom (short sequences, one timed step), and is committed without outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "ckptlab_tour.ipynb"


def test_the_committed_notebook_has_no_outputs():
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    assert code, "the tour has code cells"
    assert [cell["execution_count"] for cell in code] == [None] * len(code)
    assert [cell["outputs"] for cell in code] == [[]] * len(code)


def test_the_notebook_runs_top_to_bottom(monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="pip install nbformat (requirements.txt, ckptlab[test])")
    nbclient = pytest.importorskip("nbclient", reason="pip install nbclient (requirements.txt, ckptlab[test])")
    pytest.importorskip("ipykernel", reason="pip install ipykernel (requirements.txt, ckptlab[test])")
    # The kernel inherits the environment: short sequences and one timed step keep the tour to seconds.
    monkeypatch.setenv("CKPTLAB_TOUR_SEQ_LEN", "64")
    monkeypatch.setenv("CKPTLAB_TOUR_REPEATS", "1")
    # The kernel runs in the repository root, so `import ckptlab` finds this checkout (its first cell installs nothing).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    text = "\n".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    assert "every_n_layers=2 (observed)" in text and "rerun" in text
    assert "qwen3-8b" in text and "simulated" in text
    assert "points)" in text
    figures = [output for output in outputs if "application/vnd.plotly.v1+json" in output.get("data", {})]
    assert len(figures) == 3


def test_the_first_cell_installs_the_checkout_the_notebook_sits_in(monkeypatch):
    """Opened from notebooks/ in a kernel without ckptlab, the install cell pip-installs this checkout (no placeholder)."""
    import importlib.util
    import subprocess

    source = "".join(json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"][1]["source"])
    calls: list[list[str]] = []
    monkeypatch.chdir(NOTEBOOK.parent)  # where Jupyter starts the notebook's kernel
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # as if ckptlab were not installed
    monkeypatch.setattr(subprocess, "check_call", calls.append)
    exec(compile(source, "install cell", "exec"), {})
    assert len(calls) == 1 and calls[0][-1] == str(ROOT) and calls[0][1:4] == ["-m", "pip", "install"]
