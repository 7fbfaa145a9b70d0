"""The At-scale page simulates the whole training step: optimizer and LoRA from the sidebar or the link, in every language."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.show import i18n
from ckptlab.show.labels import training_label

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 120  # the first run describes every preset, then tiny simulations; AppTest's default 3 s is too short
LANGS = list(i18n.LANGUAGES)


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def _open(lang: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"lang": lang, **query})
    at.run()
    at.switch_page("pages/at_scale.py").run()
    assert not at.exception, _texts(at.exception)
    return at


@pytest.mark.parametrize("lang", LANGS)
def test_lora_and_the_optimizer_reach_the_simulations_and_the_link(lang):
    at = _open(lang, model="tiny-llama", seq="128", opt="sgd", lora="8", targets="q_proj,v_proj")
    assert at.selectbox(key="at_scale_optimizer").value == "sgd"
    assert at.toggle(key="at_scale_lora").value is True and at.number_input(key="at_scale_lora_rank").value == 8
    assert at.multiselect(key="at_scale_lora_targets").value == ["q_proj", "v_proj"]
    at.button(key="at_scale_run").click().run()
    at.session_state["at_scale_job"].join()  # the simulations' thread: wait on it, not on a clock
    at.run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    table = at.session_state["at_scale_table"]
    assert {(r.spec.optimizer, r.spec.lora_rank, r.spec.lora_targets) for r in table.results} == {
        ("sgd", 8, ("q_proj", "v_proj"))
    }
    assert training_label(table.results[0].spec, lang) in _texts(at.caption)
    assert len(at.get("plotly_chart")) == 4  # the peak, memory against time, resident, diagram

    at.toggle(key="at_scale_lora").set_value(False).run()
    at.selectbox(key="at_scale_optimizer").set_value("adamw").run()
    assert at.query_params["lora"] == "off" and at.query_params["opt"] == "adamw"
    assert "targets" not in at.query_params
