"""The trade-off explorer sweeps the whole training step: optimizer and LoRA from the sidebar, in every language."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.show import i18n

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300  # real measured steps on 2 shared cores; AppTest's default 3 s is far too short
LANGS = list(i18n.LANGUAGES)


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


@pytest.mark.parametrize("lang", LANGS)
def test_a_lora_sweep_measures_lora_rows(lang):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["lang"] = lang
    at.run()
    at.switch_page("pages/tradeoffs.py").run()
    at.selectbox(key="tradeoffs_model").set_value("tiny-llama")
    at.multiselect(key="tradeoffs_seq").set_value([64])
    at.toggle(key="tradeoffs_choose_n").set_value(True).run()
    at.multiselect(key="tradeoffs_n").set_value([1])
    at.number_input(key="tradeoffs_repeats").set_value(1)
    at.number_input(key="tradeoffs_warmup").set_value(0)
    at.selectbox(key="tradeoffs_optimizer").set_value("sgd").run()
    at.toggle(key="tradeoffs_lora").set_value(True).run()
    at.multiselect(key="tradeoffs_lora_targets").set_value(["q_proj"]).run()
    assert not at.exception, _texts(at.exception)
    at.button(key="tradeoffs_run").click().run()
    at.session_state["tradeoffs_job"].join()  # the sweep's thread: wait on it, not on a clock
    at.run()  # the progress fragment sees the end and reruns the page once to draw
    at.run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    rows = at.session_state["tradeoffs_result"].rows
    assert rows and all(row.status == "ok" for row in rows)
    assert {(row.result.spec.optimizer, row.result.spec.lora_rank, row.result.spec.lora_targets) for row in rows} == {
        ("sgd", 8, ("q_proj",))
    }
    assert i18n.t("breakdown.training_lora", lang, optimizer="SGD", rank=8) in _texts(at.caption)
