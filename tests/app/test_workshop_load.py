"""Browser sessions press Run within one second on a real server: benchmarks/workshop_load.py, small.

The benchmark's own figures (eight sessions, thirty presses, the mixed round of eight) are in docs/workshop.md; the
suite runs the same checks with three sessions (one of them with bad input) and a mixed round of two.
"""

from __future__ import annotations

import os

import pytest

from tests.benchmarks import load_benchmark

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists("/usr/bin/chromium"), reason="chromium is missing (apt-get install chromium)"
    ),
]


def _benchmark():
    return load_benchmark("workshop_load")


def test_sessions_at_once_each_get_an_answer_one_run_at_a_time():
    benchmark = _benchmark()
    report = benchmark.load_test(sessions=3, runs=3)
    assert report.outcomes["nothing"] == 0
    assert report.outcomes["message"] == 1  # session 0 typed a sequence too long for its model
    assert report.outcomes["result"] == 2
    assert report.turns == 2 and report.overlaps == 0 and report.open_turns == 0
    assert report.rss_change < benchmark.RSS_GROWTH_LIMIT, (report.rss_before_mib, report.rss_after_mib)


# A run of the mixed round must end within the server's 40 s limit: another test's worker beside it broke that. The
# sessions' test has no time limit, so it runs beside the others.
@pytest.mark.alone
def test_simulations_beside_runs_break_no_run_and_no_turn_outlasts_the_limit():
    """The mixed round: one session Simulates qwen3-8b at 8192 tokens beside one that Runs, run limit 40 s."""
    benchmark = _benchmark()
    report = benchmark.mixed_round(sessions=2)
    assert report.outcomes["nothing"] == 0 and report.outcomes["result"] == 1, report
    assert all("stopped after" in message for message in report.messages), report.messages  # only the limit's words
    assert report.overlaps == 0 and report.open_turns == 0
    assert report.longest_turn_s <= benchmark.MIXED_TURN_BOUND_S
    assert report.bytes_checked == 1 and not report.bytes_differ
