"""Mixture-of-experts presets on the lab, trade-off and at-scale pages (AppTest smoke tests).

Each page opens with an MoE preset, says which experts path runs and what the simulation
assumes about routing, and completes a run without an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app.polling import rerun_until

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # real measured steps; AppTest's default 3 s is far too short


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def _poll(at: AppTest, until) -> AppTest:
    """Rerun the page (as its fragment's timer would) until ``until(at)``, waiting on its job between reruns."""
    job = next((key for key in ("at_scale_job", "tradeoffs_job") if key in at.session_state), None)
    return rerun_until(at, until, job)


def test_the_lab_runs_the_tiny_moe_and_its_diagram_shows_router_and_experts_rerun():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    at.query_params.update({"model": "tiny-qwen3-moe", "seq": "64", "repeats": "1", "warmup": "0", "n": "2"})
    at.run()
    assert not at.exception, _texts(at.exception)
    assert 'experts_implementation="grouped_mm"' in _texts(at.caption)
    at.button(key="lab_run").click().run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    diagram = at.get("plotly_chart")[0].proto.spec.replace("\\u003cbr\\u003e", " ")  # titles wrap at <br>
    assert "router + experts" in diagram and "MoE: 2 reruns" in diagram


def test_the_at_scale_page_simulates_qwen3_30b_a3b():
    at = AppTest.from_file(str(ROOT / "pages" / "at_scale.py"), default_timeout=TIMEOUT)
    at.query_params.update({"model": "qwen3-30b-a3b", "seq": "256", "gpu": "H100 80 GB"})
    at.run()
    assert not at.exception, _texts(at.exception)
    assert "Routing" in _texts(at.caption) and "128 experts, 8 per token" in _texts(at.caption)
    at.button(key="at_scale_run").click().run()
    # Twelve settings of a 48-layer model take minutes here: two are enough for a smoke test.
    _poll(
        at,
        lambda at: len(at.session_state["at_scale_job"].state().results) >= 2 or "at_scale_table" in at.session_state,
    )
    at.button(key="at_scale_stop").click().run()
    _poll(at, lambda at: "at_scale_table" in at.session_state)
    assert not at.exception, _texts(at.exception)
    # A full fine-tune of 30.5B parameters with AdamW needs about 284 GiB: the page's verdict, not a failure.
    assert all("Nothing simulated fits H100 80 GB" in error.value for error in at.error)
    table = at.session_state["at_scale_table"]
    assert table.results and all(result.model.experts_implementation == "grouped_mm" for result in table.results)
    assert at.get("plotly_chart")


def test_the_trade_off_explorer_sweeps_the_tiny_moe_and_flags_the_formula():
    at = AppTest.from_file(str(ROOT / "pages" / "tradeoffs.py"), default_timeout=TIMEOUT)
    at.run()
    assert any(" · mixtral-8x7b · " in option for option in at.selectbox(key="tradeoffs_model").options)  # labelled
    at.selectbox(key="tradeoffs_model").set_value("tiny-qwen3-moe")
    at.multiselect(key="tradeoffs_seq").set_value([64])
    at.number_input(key="tradeoffs_repeats").set_value(1)
    at.number_input(key="tradeoffs_warmup").set_value(0)
    at.run()
    at.button(key="tradeoffs_run").click().run()
    _poll(at, lambda at: "tradeoffs_result" in at.session_state)
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    assert len(at.session_state["tradeoffs_result"].rows) == 5  # off and n = 1..4
    charts = [chart.proto.spec.replace("\\u003cbr\\u003e", " ") for chart in at.get("plotly_chart")]  # titles wrap
    predicted = [spec for spec in charts if "predicted" in spec]
    assert any("MoE: the formula counts the router" in spec for spec in predicted)
