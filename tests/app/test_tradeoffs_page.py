"""The trade-off explorer page, driven headless with AppTest: a sweep completes, charts and the recommendation appear, Stop keeps rows.

One real sweep, at the page's defaults (``default_sweep``); the other tests drive the page with its sweep stubbed
and answering with that sweep's rows (tests/app/given_sweep.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.explore.budget import BUDGET_BOX_GIB
from ckptlab.explore.sweep import SweepResult
from ckptlab.units import GIB, MIB
from tests.app.given_sweep import give_sweep
from tests.app.polling import rerun_until

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "pages" / "tradeoffs.py")
TIMEOUT = 120  # real measured steps; AppTest's default 3 s is far too short


def _page(model: str = "tiny-gpt2", seq_len: int = 64) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    at.selectbox(key="tradeoffs_model").set_value(model)
    at.multiselect(key="tradeoffs_seq").set_value([seq_len])
    at.number_input(key="tradeoffs_repeats").set_value(1)
    at.number_input(key="tradeoffs_warmup").set_value(0)
    return at.run()


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def _poll(at: AppTest, until) -> AppTest:
    """Rerun the page (as its fragment's timer would) until ``until(at)``, waiting on its job between reruns."""
    return rerun_until(at, until, "tradeoffs_job")


def _finished(at: AppTest) -> bool:
    return "tradeoffs_result" in at.session_state


def _defaults() -> AppTest:
    """The page at its defaults, one timed step a row (as every sweep of these tests)."""
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    at.number_input(key="tradeoffs_repeats").set_value(1)
    at.number_input(key="tradeoffs_warmup").set_value(0)
    return at.run()


@pytest.fixture(scope="module")
def default_sweep() -> SweepResult:
    """The page's one real sweep: its defaults (tiny-llama at 512 tokens, every every_n_layers), run from its button
    on the job's thread (a sweep in a worker process is tests/lab/test_jobs_in_workers.py's; here it cost a worker's
    start too, 25 s against 15 s idle). The other tests drive the page with the sweep stubbed
    (tests/app/given_sweep.py) and these rows given."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CKPTLAB_WORKERS", "thread")
        at = _defaults()
        at.button(key="tradeoffs_run").click().run()
        _poll(at, _finished)
    assert not at.exception, _texts(at.exception)
    assert not at.error, _texts(at.error)
    return at.session_state["tradeoffs_result"]


def test_the_page_is_in_the_app_navigation():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    at.switch_page("pages/tradeoffs.py").run()
    assert not at.exception, _texts(at.exception)
    assert at.title[0].value == "Trade-off explorer"


def test_a_sweep_completes_and_shows_the_charts_and_the_recommendation(default_sweep, monkeypatch):
    given = give_sweep(monkeypatch, default_sweep)  # the page's one real sweep, its rows reported as they came
    at = _defaults()
    assert not at.exception and not at.get("plotly_chart")
    assert "Run the sweep" in _texts(at.info)

    at.button(key="tradeoffs_run").click().run()
    _poll(at, _finished)
    assert given.asked == [default_sweep.spec]  # the page asked for the sweep whose rows it draws
    assert not at.exception, _texts(at.exception)
    assert not at.error, _texts(at.error)
    result = at.session_state["tradeoffs_result"]
    assert [row.setting for row in result.rows] == ["off"] + [f"n={n}" for n in range(1, 7)]
    charts = at.get("plotly_chart")
    assert len(charts) == 4  # memory against time, predicted beside measured, against length, the peak
    assert "to spare" in _texts(at.success)  # the recommendation for the default budget (the median peak)
    assert any("activation_checkpointing" in code.value for code in at.code)
    assert "the peak" in _texts(at.markdown)
    assert {button.label for button in at.get("download_button")} == {"Sweep as CSV", "Sweep as JSON"}
    assert any(
        "offload" in caption.value or "warm-up" in caption.value or "measured on the CPU" in caption.value
        for caption in at.caption
    )

    # A GPU budget: everything fits, checkpointing off is the answer.
    at.selectbox(key="tradeoffs_gpu").set_value("L4 24 GB").run()
    assert "checkpointing off" in _texts(at.markdown) or "leave it off" in _texts(at.markdown)
    # A budget below the parameters (the box's least, explore.budget's): nothing fits, and the page says what would.
    at.selectbox(key="tradeoffs_gpu").set_value("custom budget").run()
    budget_box = at.number_input(key="tradeoffs_budget_mib")
    assert (budget_box.min, budget_box.max) == tuple(gib * GIB / MIB for gib in BUDGET_BOX_GIB)
    budget_box.set_value(budget_box.min).run()
    assert "Nothing measured fits" in _texts(at.error)
    assert "parameters and their gradients alone" in _texts(at.markdown)


def test_stop_keeps_the_rows_measured(default_sweep, monkeypatch):
    given = give_sweep(monkeypatch, default_sweep, stop_after=2)  # two rows reported, then it waits for Stop
    at = _defaults()
    at.button(key="tradeoffs_run").click().run()
    _poll(at, lambda at: len(at.session_state["tradeoffs_job"].state().rows) >= 2 or _finished(at))
    at.button(key="tradeoffs_stop").click().run()
    given.pressed.set()
    _poll(at, _finished)
    assert not at.exception, _texts(at.exception)
    result = at.session_state["tradeoffs_result"]
    assert result.cancelled and 2 <= len(result.rows) < 7
    assert "Stopped" in _texts(at.warning)
    assert at.get("plotly_chart")  # the rows kept are drawn


def test_a_sweep_longer_than_the_server_allows_is_refused_before_it_starts(monkeypatch):
    monkeypatch.setenv("CKPTLAB_MAX_TOKENS", "tiny-gpt2=32")
    at = _page()
    at.button(key="tradeoffs_run").click().run()
    assert not at.exception, _texts(at.exception)
    assert "64 tokens x batch 1 = 64 tokens is more than this server allows for tiny-gpt2 (32)" in _texts(at.error)
    assert "tradeoffs_job" not in at.session_state or at.session_state["tradeoffs_job"] is None


def test_the_default_sweep_shows_checkpointing_lowering_the_peak(default_sweep):
    """The page's defaults teach its lesson: the settings' peaks spread (at 256 tokens they were one flat line, the
    gradients and the optimizer holding every setting's peak). One timed step a row, as the other tests."""
    rows = [row for row in default_sweep.rows if row.status == "ok"]
    peaks = {row.setting: row.peak_bytes for row in rows}
    assert len(peaks) == 7 and min(peaks.values()) < 0.9 * peaks["off"], peaks
