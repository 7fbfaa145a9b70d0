"""Eight browser sessions press Run within one second on a real server (benchmarks/workshop_load.py, one round)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "workshop_load.py"

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists("/usr/bin/chromium"), reason="chromium is missing (apt-get install chromium)"
    ),
]


def _benchmark():
    spec = importlib.util.spec_from_file_location("workshop_load_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_eight_sessions_at_once_each_get_an_answer_one_run_at_a_time():
    report = _benchmark().load_test(sessions=8, runs=8)
    assert report.outcomes["nothing"] == 0
    assert report.outcomes["message"] == 2  # sessions 0 and 4 typed a sequence too long for their model
    assert report.outcomes["result"] == 6
    assert report.turns == 6 and report.overlaps == 0 and report.open_turns == 0
    assert report.rss_change < 0.10, (report.rss_before_mib, report.rss_after_mib)


def test_simulations_beside_runs_break_no_run_and_no_turn_outlasts_the_limit():
    """The issue's mixed round: half the sessions Simulate qwen3-8b at 8192 tokens, half Run, run limit 40 s."""
    benchmark = _benchmark()
    report = benchmark.mixed_round(sessions=8)
    assert report.outcomes["nothing"] == 0 and report.outcomes["result"] == 4, report
    assert all("stopped after" in message for message in report.messages), report.messages  # only the limit's words
    assert report.overlaps == 0 and report.open_turns == 0
    assert report.longest_turn_s <= benchmark.MIXED_TURN_BOUND_S
    assert report.bytes_checked == 4 and not report.bytes_differ
