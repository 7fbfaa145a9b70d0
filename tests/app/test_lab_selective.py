"""The Lab page with a selective policy: from the link, what the CP layers kept (the core's bytes), beside plain
checkpointing and off; a bad policy in the link falls back with the page's usual warning."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab import measure

pytestmark = pytest.mark.slow  # the app's pages, real steps

APP = str(Path(__file__).resolve().parents[2] / "app.py")
FAST = {"seq": "128", "repeats": "1", "warmup": "1", "opt": "none"}
TIMEOUT = 180  # three measured runs: the policy, plain checkpointing, off


def _texts(elements) -> str:
    return "\n".join(str(element.value) for element in elements)


def test_selective_attention_from_the_link_shows_the_bytes_the_core_kept():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({**FAST, "selective": "attention"})
    at.run()
    assert not at.exception, _texts(at.exception)
    assert not at.warning, _texts(at.warning)
    assert at.selectbox(key="lab_selective").value == "attention"
    assert at.query_params["selective"] == "attention"
    code = _texts(at.code)
    assert "create_selective_checkpoint_contexts" in code and '"context_fn": context_fn' in code

    at.button(key="lab_run").click().run()
    assert not at.exception and not at.error, _texts(at.exception) + _texts(at.error)
    spec = at.session_state["lab_saved"]
    assert spec.selective == "attention"
    core = measure(spec, timed=False)  # the core's own result for the same spec
    kept = sum(layer.kept_bytes for layer in core.layers if layer.enabled == "CP")
    assert kept > 0
    assert f"**{kept:,} bytes**" in _texts(at.markdown)
    table = next(frame.value for frame in at.dataframe if "kept (bytes)" in frame.value.columns)
    assert list(table["kept (bytes)"]) == [0, 0, kept]
    # The settings' short names: spelled out, the table ran past the page's edge at 1280x720 (issue 58).
    assert list(table["setting"]) == ["off", "full checkpointing (n=1)", "selective: attention"]
    assert list(table["reruns"]) == [0, 6, 6]  # tiny-llama's six layers, each rerun once with n=1


def test_a_bad_policy_in_the_link_falls_back_with_the_usual_warning():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({**FAST, "selective": "keep-everything"})
    at.run()
    assert not at.exception, _texts(at.exception)
    assert "selective='keep-everything' in the link is not one of none, attention, matmuls, torchtitan" in _texts(
        at.warning
    )
    assert at.selectbox(key="lab_selective").value == "none"
    assert "selective" not in at.query_params
