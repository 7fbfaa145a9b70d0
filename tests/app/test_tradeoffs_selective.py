"""The Trade-offs page over two selective policies: rows for both, and a budget where a policy is the answer."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.explore.recommend import recommend
from ckptlab.units import MIB
from tests.app.polling import rerun_until

pytestmark = pytest.mark.slow  # the app's pages, real steps

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "tradeoffs.py")
TIMEOUT = 180
# Long enough that keeping the attention is the cheapest that fits at some budget (at 128 tokens it is at none); at
# 512 the sweep took twice as long (22 s against 11 s) for the same assertions.
SEQ = 256


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def test_a_sweep_over_two_policies_has_rows_for_both_and_recommends_a_policy_where_it_is_cheapest():
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    at.selectbox(key="tradeoffs_model").set_value("tiny-llama")
    at.multiselect(key="tradeoffs_seq").set_value([SEQ])
    at.toggle(key="tradeoffs_choose_n").set_value(True).run()
    at.multiselect(key="tradeoffs_n").set_value([1, 3])
    at.multiselect(key="tradeoffs_selective").set_value(["none", "attention"])
    at.selectbox(key="tradeoffs_optimizer").set_value("none")
    at.number_input(key="tradeoffs_repeats").set_value(1)
    at.number_input(key="tradeoffs_warmup").set_value(0)
    at.run()
    at.button(key="tradeoffs_run").click().run()
    rerun_until(at, lambda at: "tradeoffs_result" in at.session_state, "tradeoffs_job")
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)

    result = at.session_state["tradeoffs_result"]
    assert [row.setting for row in result.rows] == ["off", "n=1", "n=1+attention", "n=3", "n=3+attention"]
    assert all(row.status == "ok" for row in result.rows)
    table = next(frame.value for frame in at.dataframe if "setting" in frame.value.columns)
    assert {"n=1+attention", "n=3+attention", "n=1", "n=3"} <= set(table["setting"])

    # A budget made here, where keeping the attention is the cheapest that fits: the core's answer for it.
    budgets = [math.ceil(row.peak_bytes / MIB * 10) / 10 for row in result.rows if row.selective == "attention"]
    chosen = [mib for mib in budgets if recommend(result.rows, int(mib * MIB), seq_len=SEQ).row.selective != "none"]
    assert chosen, [(row.setting, row.peak_bytes) for row in result.rows]
    at.selectbox(key="tradeoffs_gpu").set_value("custom budget").run()
    at.number_input(key="tradeoffs_budget_mib").set_value(chosen[0]).run()
    assert not at.exception, _texts(at.exception)
    best = recommend(result.rows, int(chosen[0] * MIB), seq_len=SEQ).row
    assert best.selective == "attention"
    assert best.setting in _texts(at.success)
    code = _texts(at.code)
    assert "create_selective_checkpoint_contexts" in code and '"context_fn": context_fn' in code
    assert f"every_n_layers={best.every_n_layers}," in code
