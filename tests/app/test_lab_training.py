"""The lab page's whole training step: optimizer and LoRA controls, where the memory goes, the gradient check.

In every language, driven headless with AppTest. Runs go through the process-wide result
cache: the first language measures, the others reuse (the gradient check runs each time).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.lab.run import lora_target_choices
from ckptlab.show import i18n

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300  # real measured steps on 2 shared cores; AppTest's default 3 s is far too short
LANGS = list(i18n.LANGUAGES)
LORA = {"model": "tiny-llama", "seq": "64", "repeats": "1", "warmup": "0", "n": "1", "opt": "adamw", "lora": "4"}


def _app(lang: str, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"lang": lang, **query})
    return at.run()


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def _assert_alive(at: AppTest) -> None:
    assert not at.exception, _texts(at.exception)
    assert not at.error, _texts(at.error)


@pytest.mark.parametrize("lang", LANGS)
def test_a_lora_run_shows_where_the_memory_goes_and_checks_the_gradients(lang):
    at = _app(lang, **LORA)
    _assert_alive(at)
    assert at.selectbox(key="lab_optimizer").value == "adamw"
    assert at.toggle(key="lab_lora").value is True and at.number_input(key="lab_lora_rank").value == 4
    assert at.multiselect(key="lab_lora_targets").value == lora_target_choices("tiny-llama")  # all by default
    assert i18n.t("breakdown.training_lora", lang, optimizer="AdamW", rank=4) in _texts(at.markdown)

    at.checkbox(key="lab_check_grads").check().run()
    at.button(key="lab_run").click().run()
    _assert_alive(at)
    # The CP / keep / rerun diagram, where the memory goes (beside it), and the comparison with checkpointing off.
    assert len(at.get("plotly_chart")) == 3
    assert i18n.t("lab.breakdown_caption", lang) in _texts(at.caption)
    check = at.session_state["lab_grads"][1]
    assert check.equal
    assert [element.value for element in at.success] == [
        i18n.t("lab.grads_equal", lang, count=check.gradients_compared)
    ]


@pytest.mark.parametrize("lang", LANGS)
def test_optimizer_and_lora_widgets_write_the_link(lang):
    at = _app(lang, model="tiny-llama", seq="64", repeats="1", warmup="0")
    _assert_alive(at)
    assert at.query_params["opt"] == "adamw" and at.query_params["lora"] == "off"
    assert at.number_input(key="lab_lora_rank").disabled and at.multiselect(key="lab_lora_targets").disabled
    at.selectbox(key="lab_optimizer").set_value("sgd").run()
    at.toggle(key="lab_lora").set_value(True).run()
    at.multiselect(key="lab_lora_targets").set_value(["q_proj", "v_proj"]).run()
    _assert_alive(at)
    assert at.query_params["opt"] == "sgd" and at.query_params["lora"] == "8"
    assert at.query_params["targets"] == "q_proj,v_proj"
    at.multiselect(key="lab_lora_targets").set_value([]).run()
    assert i18n.t("training.lora_targets_needed", lang) in _texts(at.error)
    assert at.button(key="lab_run").disabled


def test_unknown_targets_in_the_link_are_left_out_with_a_warning():
    at = _app("en", model="tiny-llama", lora="8", targets="q_proj,c_attn")
    assert not at.exception, _texts(at.exception)
    assert "targets=c\\_attn in the link" in _texts(at.warning)  # the link's name as text: Markdown's _ escaped
    assert at.multiselect(key="lab_lora_targets").value == ["q_proj"]
    assert at.query_params["targets"] == "q_proj"
