"""The lesson part "what to keep" and the exercise "the bytes of keeping the attention", in every language: the
page's words are the language's own (no English left of them), and the numbers are the measured ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.lab.exercises import by_id
from ckptlab.show import i18n

pytestmark = pytest.mark.slow  # the app's pages, real steps

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300
LANGS = list(i18n.LANGUAGES)
ENGLISH = json.loads((Path(__file__).resolve().parents[2] / "ckptlab/locales/en.json").read_text(encoding="utf-8"))
# The words these two add: every English fragment of their templates (placeholders and markup cut out).
NEW_KEYS = [
    key
    for key in ENGLISH
    if key.startswith(("lesson.keep.", "exercise.keep_attention.", "selective.verdict_", "selective.explain_kept",
                       "selective.prediction_kib", "selective.diagram_"))
]  # fmt: skip
FRAGMENTS = sorted(
    {
        part.strip()
        for key in NEW_KEYS
        for part in re.split(r"\{[^}]*\}|\*\*|`[^`]*`|<br>|\n|[():;,.]", ENGLISH[key])
        if len(part.strip()) >= 12
    }
)


def _open(page: str, lang: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["lang"] = lang
    at.run()
    at.switch_page(page).run()
    _alive(at)
    return at


def _alive(at: AppTest) -> None:
    assert not at.exception, "\n".join(str(e.value) for e in at.exception)
    assert not at.error, "\n".join(str(e.value) for e in at.error)


def _shown(at: AppTest) -> str:
    """Every word the page shows: its texts, widgets' labels and the figures' JSON (titles, boxes, hovers)."""
    texts = [str(element.value) for kind in ("markdown", "caption", "subheader", "title", "success", "info",
                                             "warning") for element in getattr(at, kind)]  # fmt: skip
    texts += [str(widget.label) for widget in [*at.number_input, *at.button, *at.metric, *at.selectbox]]
    texts += [chart.proto.spec for chart in at.get("plotly_chart")]
    return "\n".join(texts)


def _no_english(at: AppTest, lang: str) -> None:
    assert NEW_KEYS and FRAGMENTS
    shown = _shown(at)
    left = [fragment for fragment in FRAGMENTS if fragment in shown]
    if lang == "en":
        assert left  # the check sees the English words where they belong: it can fail
    else:
        assert not left, left


@pytest.mark.parametrize("lang", LANGS)
def test_the_lesson_part_what_to_keep_is_in_the_pages_language(lang):
    at = _open("pages/lesson.py", lang)
    tr = i18n.translator(lang)
    at.segmented_control(key="lesson_part").set_value("keep").run()
    _alive(at)
    assert at.subheader[0].value == tr("lesson.keep.title")
    assert len(at.get("plotly_chart")) == 2  # the diagram of what each CP layer kept, the memory beside plain and off
    results = at.session_state["learn_results"]
    kept = next(r for spec, r in results.items() if spec.selective == "attention" and spec.seq_len == 128)
    kib = sum(layer.kept_bytes for layer in kept.layers if layer.enabled == "CP") / 1024
    assert kib > 0 and f"**{kib:,.1f} KiB**" in "\n".join(str(c.value) for c in at.caption)
    _no_english(at, lang)


@pytest.mark.parametrize("lang", LANGS)
def test_the_exercise_keeping_the_attention_is_in_the_pages_language(lang):
    at = _open("pages/exercises.py", lang)
    tr = i18n.translator(lang)
    at.selectbox(key="exercise_pick").set_value("keep_attention").run()
    assert at.subheader[0].value == tr("exercise.keep_attention.name")
    values = by_id("keep_attention").question_values()
    assert f"**{tr('exercise.keep_attention.question', **values)}**" in [m.value for m in at.markdown]
    at.number_input(key="exercise_pred_keep_attention").set_value(1000).run()
    at.button(key="exercise_submit").click().run()
    _alive(at)
    assert at.session_state["exercise_answers"]["keep_attention"] == 1000.0
    results = at.session_state["learn_results"]
    kept = next(r for spec, r in results.items() if spec.selective == "attention" and spec.seq_len == 128)
    kib = sum(layer.kept_bytes for layer in kept.layers if layer.enabled == "CP") / 1024
    explanation = "\n".join(m.value for m in at.markdown)
    assert f"{kib:,.1f} KiB" in explanation  # the measured bytes, in the explanation
    _no_english(at, lang)
