"""Participants answering the room's round together are all counted, once (benchmarks/classroom_load.py, small).

The benchmark's figure with forty participants is in the workshop docs; here three sessions press at once, which is
what proves the room's lock: more sessions only make the same race more likely.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("websockets.sync.client", reason="websockets (a dependency of streamlit) is missing")

pytestmark = pytest.mark.slow  # a server, its sessions and a measured run

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "classroom_load.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("classroom_load_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_sessions_answering_together_are_all_counted():
    _benchmark().answer_together(participants=3)
