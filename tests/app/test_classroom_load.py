"""Participants answering the room's round together are all counted, once (benchmarks/classroom_load.py, small).

The benchmark's figure with forty participants is in the workshop docs; here three sessions press at once, which is
what proves the room's lock: more sessions only make the same race more likely.
"""

from __future__ import annotations

import pytest

from tests.benchmarks import load_benchmark

pytest.importorskip("websockets.sync.client", reason="websockets (a dependency of streamlit) is missing")

pytestmark = pytest.mark.slow  # a server, its sessions and a measured run


def _benchmark():
    return load_benchmark("classroom_load")


def test_sessions_answering_together_are_all_counted():
    _benchmark().answer_together(participants=3)
