"""Every language has every key, and the pages show no hard-coded words.

The scan reads pages/*.py and app.py as Python syntax trees: a Streamlit call that shows
text (a title, a label, a message, a help text...) may not get a string literal with
letters in it, except the technical tokens in ALLOWED. Text must come from ``t(...)``
lookups of keys that exist in every locale file (``test_one_translation.py`` checks it is the only way).
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from pathlib import Path

import pytest

from ckptlab.fact import Fact
from ckptlab.show import i18n

ROOT = Path(__file__).resolve().parents[2]
LOCALES = {lang: json.loads((i18n.LOCALES_DIR / f"{lang}.json").read_text(encoding="utf-8")) for lang in i18n.LANGUAGES}
# Every page and its parts (pages/_*.py), and the app's navigation.
TRANSLATED_PAGES = ["app.py", *(str(path.relative_to(ROOT)) for path in sorted((ROOT / "pages").glob("*.py")))]

# Streamlit calls that put words on the screen: positional args and these keywords are checked.
TEXT_CALLS = {
    "title",
    "header",
    "subheader",
    "markdown",
    "caption",
    "write",
    "text",
    "info",
    "warning",
    "error",
    "success",
    "toast",
    "button",
    "download_button",
    "link_button",
    "selectbox",
    "radio",
    "slider",
    "select_slider",
    "number_input",
    "text_input",
    "text_area",
    "toggle",
    "checkbox",
    "metric",
    "expander",
    "status",
    "tabs",
    "segmented_control",
    "pills",
    "multiselect",
    "progress",
    "spinner",
    "update",
    "Page",
    "set_page_config",
    "form_submit_button",
}
TEXT_KEYWORDS = {"label", "help", "placeholder", "text", "body", "title", "page_title", "value", "delta", "caption"}
# Technical tokens practitioners read in English, and layout glue between translated parts.
ALLOWED = {"every_n_layers", "offload", "dtype", "/path/to/saved/model", "Language · Idioma · 言語"}
GLUE = re.compile(r"^[\s·:/,.()%✓★*\-–|]*(MiB|GiB|ms)?\s*$")  # punctuation, and a unit after a number
NO_TEXT_POSITIONALS = {"Page"}  # st.Page's first argument is a file path


def _literal_words(node: ast.AST) -> list[str]:
    """String constants with letters that ``node`` puts on screen as they are."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [] if node.value in ALLOWED or GLUE.match(node.value) else [node.value]
    if isinstance(node, ast.JoinedStr):
        return [part for value in node.values for part in _literal_words(value)]
    if isinstance(node, ast.FormattedValue):
        return []
    if isinstance(node, ast.BinOp):
        return _literal_words(node.left) + _literal_words(node.right)
    if isinstance(node, ast.IfExp):
        return _literal_words(node.body) + _literal_words(node.orelse)
    return []


def _hard_coded(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name not in TEXT_CALLS:
            continue
        args = [] if name in NO_TEXT_POSITIONALS else list(node.args)
        args += [kw.value for kw in node.keywords if kw.arg in TEXT_KEYWORDS]
        for arg in args:
            found += [f"{path.name}:{node.lineno} {name}({text!r})" for text in _literal_words(arg)]
    return found


def _is_t(func: ast.expr) -> bool:
    """``t(...)`` or ``i18n.t(...)``: the one translation function."""
    return getattr(func, "id", "") == "t" or (isinstance(func, ast.Attribute) and func.attr == "t")


def _used_keys(path: Path) -> tuple[set[str], set[str]]:
    """Keys looked up with a literal (exact) and with an f-string (prefixes to check against the files)."""
    exact, prefixes = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and _is_t(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                exact.add(first.value)
            elif isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                prefixes.add(first.values[0].value)
            elif isinstance(first, ast.BinOp) and isinstance(first.left, ast.Constant):
                prefixes.add(first.left.value)
    return exact, prefixes


def test_the_at_scale_figures_name_each_segment_in_every_language():
    from ckptlab.show.figures.breakdown import PARTS

    # The At-scale figures name each drawn segment by its own key (f"scale_figures.{part}").
    for lang in LOCALES:
        assert {f"scale_figures.{part}" for part in (*PARTS, "other", "host", "resident")} <= set(LOCALES[lang])


# Facts whose English says more than the translations: the setting in English words ({name}, {names}) and
# the time verdict ({verdict}); a page shows both in its own words in the table beside the sentence.
ENGLISH_SAYS_MORE = {
    f"said.{key}"
    for key in (
        "recommend.fastest",
        "recommend.least_recompute",
        "recommend.unranked_noise",
        "recommend.nothing_fits",
        "advice.shorter_measured",
        "advice.shorter_estimate",
        "advice.smaller_batch",
        "advice.offload_would_fit",
        "advice.offload_still_over",
    )
}


def test_every_language_has_the_same_keys():
    english = set(LOCALES["en"])
    assert any(key.startswith(i18n.SAID) for key in english)  # the core's facts are worded here, English too
    assert any(key.startswith(i18n.ERRORS) for key in english)  # and the core's errors
    for lang, table in LOCALES.items():
        own = set(table)
        assert own == english, f"{lang}: missing {sorted(english - own)}, extra {sorted(own - english)}"


def test_every_translation_keeps_the_placeholders_and_has_words():
    for key, text in LOCALES["en"].items():
        for lang, table in LOCALES.items():
            assert table[key].strip(), f"{lang}:{key} is empty"
            if key in ENGLISH_SAYS_MORE:  # every placeholder is a param of the fact: tests/test_errors.py
                assert i18n.placeholders(LOCALES["pt-BR"][key]) == i18n.placeholders(LOCALES["ja"][key]), key
                assert i18n.placeholders(LOCALES["ja"][key]) != i18n.placeholders(text), key  # or leave the list
            else:
                assert i18n.placeholders(table[key]) == i18n.placeholders(text), f"{lang}:{key}"


@pytest.mark.parametrize(
    "source",
    TRANSLATED_PAGES
    + [str(path.relative_to(ROOT)) for path in sorted((ROOT / "ckptlab/lab").glob("*.py"))]
    + ["ckptlab/show/labels.py", "ckptlab/show/report.py"]
    + [str(path.relative_to(ROOT)) for path in sorted((ROOT / "ckptlab/cli").glob("*.py"))]
    + [str(path.relative_to(ROOT)) for path in sorted((ROOT / "ckptlab/show/figures").glob("*.py"))],
)
def test_every_key_the_code_uses_exists(source):
    exact, prefixes = _used_keys(ROOT / source)
    missing = sorted(key for key in exact if key not in LOCALES["en"])
    assert not missing, f"{source} uses keys missing in ckptlab/locales/en.json: {missing}"
    for prefix in prefixes:
        assert any(key.startswith(prefix) for key in LOCALES["en"]), f"{source}: no key starts with {prefix!r}"


@pytest.mark.parametrize("page", TRANSLATED_PAGES)
def test_no_page_shows_a_hard_coded_string(page):
    assert _hard_coded(ROOT / page) == []


def test_the_scan_catches_a_hard_coded_label(tmp_path):
    page = tmp_path / "page.py"
    page.write_text(
        'import streamlit as st\nst.button("Run", key="x")\nst.markdown(f"**Peak:** {value}")\nst.caption(t("a.b", lang))\n'
    )
    assert len(_hard_coded(page)) == 2


def test_dynamic_keys_exist_for_every_value_they_take():
    from ckptlab.lab.exercises import EXERCISES
    from ckptlab.step.probe import EVENTS
    from ckptlab.step.timeline import BANDS, STATES

    keys = set(LOCALES["en"])
    needed = (
        {f"event.{kind}" for kind in EVENTS} | {f"state.{s}" for s in STATES} | {f"state.short_{s}" for s in STATES}
    )
    needed |= {f"band.{band}" for band in BANDS} | {
        f"provenance.{kind}" for kind in ("measured-cuda", "measured-cpu", "simulated", "predicted")
    }
    needed |= {f"exercise.{e.id}.{part}" for e in EXERCISES for part in ("name", "question", "hint")}
    needed |= {
        f"lesson.{part}.{what}"
        for part in ("activation", "trade", "every_n", "offload", "peak", "shrink", "step")
        for what in ("tab", "title")
    }
    from ckptlab.spec import OPTIMIZERS

    needed |= {f"optimizer.{name}" for name in OPTIMIZERS} | {f"training.optimizer_{name}" for name in OPTIMIZERS}
    assert sorted(needed - keys) == []


def test_t_fills_values_falls_back_and_raises_on_unknown_keys():
    assert i18n.t("setting.on", "ja", n=2) == "every_n_layers=2"
    assert i18n.t("lesson.next", "pt-BR") == "Próxima"
    assert (
        i18n.normalize("PT_br") == "pt-BR"
        and i18n.normalize(["xx", "ja"]) == "ja"
        and i18n.normalize("klingon") == "en"
    )
    with pytest.raises(i18n.MissingKeyError):
        i18n.t("no.such.key", "en")


def test_numbers_shown_to_people_take_the_languages_decimal_mark():
    """pt-BR writes 1.234,5 (issue 43: "pico 75.3 MiB"); English and Japanese 1,234.5. A number formatted by a
    template and one a caller formats (``number``) alike; a version or a name passed as text stays as it is."""
    assert i18n.number(1234.5, ",.1f", "pt-BR") == "1.234,5" and i18n.number(1234.5, ",.1f", "ja") == "1,234.5"
    assert i18n.number(0.22, "+.1%", "pt-BR") == "+22,0%"
    assert i18n.t("scale_figures.budget", "pt-BR", budget="H100", gib=1234.5) == "H100: 1.234,5 GiB"
    assert i18n.t("scale_figures.budget", "en", budget="H100", gib=1234.5) == "H100: 1,234.5 GiB"
    assert i18n.t("at_scale.code_trainer", "pt-BR", transformers="5.24", accelerate="1.16").count("1.16") == 1
    kept = Fact("trainer.selective_no_op", {"policies": "attention", "bytes": 12345, "rerun": 1234, "reused": 0})
    assert "12.345" in i18n.say(kept, "pt-BR") and "12,345" in i18n.say(kept, "en")


def test_the_lessons_part_labels_fit_its_selector_on_a_projector():
    """The Lesson's nine parts share one row beside Next (pages/lesson.py): at 1280x720 a label longer than 14
    columns (a CJK character two) was cut ("7. What it canno…", issue 43)."""
    for lang, table in LOCALES.items():
        for key in [key for key in table if key.startswith("lesson.") and key.endswith(".tab")]:
            columns = sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in table[key])
            assert columns <= 14, f"{lang}:{key} {table[key]!r} is {columns} columns"


def test_technical_terms_stay_in_english():
    for lang, table in LOCALES.items():
        for key in (
            "setting.on",
            "diagram.legend_CP",
            "diagram.legend_keep",
            "diagram.legend_rerun",
            "lesson.every_n.tab",
            "lesson.offload.tab",
        ):
            word = {
                "setting.on": "every_n_layers",
                "diagram.legend_CP": "CP",
                "diagram.legend_keep": "keep",
                "diagram.legend_rerun": "rerun",
                "lesson.every_n.tab": "every_n_layers",
                "lesson.offload.tab": "offload",
            }[key]
            assert word in table[key], f"{lang}:{key}"


def test_metric_deltas_start_with_their_number_in_every_language():
    """st.metric draws the arrow from the delta's leading sign: a word first would turn -57 MiB into a red up arrow."""
    for lang, table in LOCALES.items():
        for key in ("lab.mib_vs_off", "lab.vs_off", "lab.too_few_steps", "lab.noise"):
            assert table[key].startswith("{diff}"), f"{lang}:{key}"


def test_the_command_lines_legends_and_busy_warning_are_words_of_the_locale_files():
    from ckptlab.results import BUSY_SPREAD, MIN_SAMPLES_TO_JUDGE
    from ckptlab.show import report

    assert i18n.t("cli.verdict_legend", "en", min_samples=MIN_SAMPLES_TO_JUDGE) == report.VERDICT_LEGEND
    assert i18n.t("cli.rerun_share", "en") == report.RERUN_SHARE_NOTE
    # The sweep table's time column: one word per judgement, in the words it printed before they moved to en.json.
    assert report.VERDICT_WORDS == {"measurable": "measurable", "noise": "noise", "too_few": "too few"}
    assert all(i18n.t(f"cli.verdict_{judgement}", "en") == word for judgement, word in report.VERDICT_WORDS.items())
    why = [
        i18n.t("cli.busy_load", "en", load=3.25, cores=2),
        i18n.t("cli.busy_spread", "en", spread=0.5, limit=BUSY_SPREAD),
        i18n.t("cli.busy_shared", "en"),
    ]
    note = report.busy_note(("load", "spread", "shared"), 3.25, 2, 0.5)
    assert note == i18n.t("cli.busy", "en", why="; ".join(why))
    assert note.startswith("WARNING: this machine is too busy to time: load average 3.2 on 2 cores")  # as it printed
    assert report.busy_note((), 3.25, 2, 0.5) == ""
