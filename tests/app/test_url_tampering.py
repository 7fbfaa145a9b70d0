"""A link with a control character in a value (a NUL byte) opens the page with its usual warning, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow  # the app's pages

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", ["app.py", "pages/at_scale.py"])
@pytest.mark.parametrize("key", ["model", "seq"])
def test_a_nul_byte_in_a_link_is_refused_with_the_usual_warning(page, key, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path))  # local folders on: the path a NUL would reach
    at = AppTest.from_file(str(ROOT / page), default_timeout=60)
    at.query_params[key] = "tiny\x00llama"
    at.run()
    assert not at.exception, [str(e.value) for e in at.exception]
    shown = "\n".join(str(w.value) for w in at.warning)
    assert "control character" in shown and "Traceback" not in shown


@pytest.mark.parametrize("page", ["app.py", "pages/at_scale.py"])
def test_link_values_are_shown_as_text_and_nan_or_out_of_range_numbers_fall_back_with_a_warning(
    page, tmp_path, monkeypatch
):
    monkeypatch.setenv("CKPTLAB_MODELS_ROOT", str(tmp_path))  # local folders on: the link's model is looked up
    at = AppTest.from_file(str(ROOT / page), default_timeout=90)
    at.query_params["model"] = "[click me](https://evil.example/login)"
    at.query_params["seq"] = "![p](https://evil.example/p.png)"
    at.query_params["clip"] = "1e308"
    at.query_params["gpu"] = "nan"
    at.query_params["lora"] = "8"  # LoRA's targets: names this model does not have, warned about as typed
    at.query_params["targets"] = "![t](https://evil.example/t.png),[sign in](https://evil.example/login)"
    at.run()
    assert not at.exception, [str(e.value) for e in at.exception]
    shown = "\n".join(str(w.value) for w in [*at.warning, *at.error])
    assert "evil" in shown and "](https" not in shown and "![" not in shown, shown  # escaped: \]\(https\:
    assert "clip='1e308' in the link is outside the range" in shown.replace("\\", "")
    if page == "app.py":  # the Lab page names the link's unknown targets
        assert "targets=![t](https://evil.example/t.png), [sign in]" in shown.replace("\\", "")
    if page.endswith("at_scale.py"):
        assert "gpu='nan' in the link is not a GPU of the list" in shown.replace("\\", "")


def test_a_second_wrong_phrase_from_one_session_waits_and_is_not_checked(monkeypatch):
    from ckptlab.lab import server
    from ckptlab.show import i18n

    monkeypatch.setenv("CKPTLAB_INSTRUCTOR_SECRET", "heron over the lake")
    monkeypatch.setattr(server, "PHRASE_DELAY_FIRST_S", 600.0)  # capped at 300 s: it cannot end within the test
    at = AppTest.from_file(str(ROOT / "pages/instructor.py"), default_timeout=60)
    at.run()
    at.text_input(key="classroom_secret").input("wrong").run()
    assert i18n.t("classroom.wrong_secret", "en") in [e.value for e in at.error]
    at.text_input(key="classroom_secret").input("heron over the lake").run()  # right, but within the wait
    assert not at.exception and not at.button
    assert any("wait 300 s" in e.value for e in at.error), [e.value for e in at.error]
