"""Pages, ``lab/`` and ``show/`` get their words one way: ``t(key, lang, **values)`` (``ckptlab.show.i18n``).

The scan reads the sources as Python syntax trees and names, as ``file:line``, every other way:
a bound translator (``translator(lang)``, a ``tr(...)`` call, a ``tr`` parameter), a dict of
words (``section(prefix, lang)``, a ``words[...]`` / ``TEXT[...]`` lookup, a ``words`` parameter),
and a string literal handed straight to a Streamlit writer. What a writer may show as it is (markdown
glue between translated parts) is listed in ``WRITER_LITERALS``, each with its reason; a sentence
that reaches a writer through a variable is beyond a static scan (``test_i18n.py`` checks the keys
it comes from exist).
"""

from __future__ import annotations

import ast
from pathlib import Path

from ckptlab.show import i18n

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    [ROOT / "app.py", *(ROOT / "pages").glob("*.py"), *(ROOT / "ckptlab/lab").rglob("*.py")]
    + list((ROOT / "ckptlab/show").rglob("*.py"))
)
OTHER_CONVENTIONS = {"translator", "section", "tr"}  # calls that are not the one function
WORD_DICTS = {"words", "WORDS", "TEXT"}  # names the section() dicts went by
WRITERS = {
    "markdown",
    "write",
    "caption",
    "header",
    "subheader",
    "title",
    "button",
    "info",
    "warning",
    "error",
    "success",
}
WRITER_KEYWORDS = {"body", "label", "help"}
WRITER_LITERALS = {
    "**": "markdown bold around a translated sentence (f'**{t(...)}**')",
    "- ": "the bullet of a markdown list whose items are translated",
    " · ": "the separator the pages put between two translated parts",
}


def _literal_parts(node: ast.AST) -> list[str]:
    """The string literals ``node`` shows as they are: a constant, an f-string's text, both sides of a +,
    both arms of an ``if``, and a ``"sep".join(...)``'s separator (a call's own result is not a literal)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [value.value for value in node.values if isinstance(value, ast.Constant)]
    if isinstance(node, ast.BinOp):
        return _literal_parts(node.left) + _literal_parts(node.right)
    if isinstance(node, ast.IfExp):
        return _literal_parts(node.body) + _literal_parts(node.orelse)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        return _literal_parts(node.func.value)
    return []


def _call_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def offences(path: Path, writers: bool) -> list[str]:
    """Every place in ``path`` that gets words another way than ``t(...)``, as ``file:line what``.

    Args:
        writers: whether to check Streamlit writers' literals (the pages and app.py call Streamlit;
            ``lab/`` and ``show/`` never do).
    """
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and _call_name(node) in OTHER_CONVENTIONS:
            found.append(f"{where}:{node.lineno} a {_call_name(node)}(...) call: use t(key, lang)")
        elif isinstance(node, ast.Subscript) and getattr(node.value, "id", "") in WORD_DICTS:
            found.append(f"{where}:{node.lineno} a {node.value.id}[...] lookup: use t(key, lang)")  # type: ignore[attr-defined]
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)):
            arguments = node.args
            for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if argument.arg == "tr" or argument.arg in WORD_DICTS:
                    found.append(f"{where}:{argument.lineno} a {argument.arg!r} parameter: take lang")
        if writers and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr not in WRITERS:
                continue
            shown = node.args[:1] + [keyword.value for keyword in node.keywords if keyword.arg in WRITER_KEYWORDS]
            for argument in shown:
                for text in _literal_parts(argument):
                    if text not in WRITER_LITERALS:
                        found.append(f"{where}:{node.lineno} st.{node.func.attr}({text!r}): a literal, not t(...)")
    return found


def _is_page(path: Path) -> bool:
    return path.name == "app.py" or path.parent.name == "pages"


def test_every_page_and_the_lab_and_show_get_their_words_from_t_alone():
    assert len([path for path in SOURCES if _is_page(path)]) > 10  # app.py and every page and part, found
    found = [line for path in SOURCES for line in offences(path, writers=_is_page(path))]
    assert found == [], "\n".join(found)


def test_the_one_translation_function_is_the_only_one_i18n_offers():
    assert callable(i18n.t)
    assert not hasattr(i18n, "translator") and not hasattr(i18n, "section") and not hasattr(i18n, "Translator")


def test_the_scan_names_each_other_convention_by_file_and_line(tmp_path):
    page = tmp_path / "page.py"
    page.write_text(
        "import streamlit as st\n"
        "tr = i18n.translator(lang)\n"  # 2
        "TEXT = i18n.section('at_scale', lang)\n"  # 3
        "st.title(tr('lab.title'))\n"  # 4
        "st.header(TEXT['title'])\n"  # 5
        "def draw(lang, tr):\n"  # 6
        "    st.markdown('Peak memory')\n"  # 7
        "    st.caption(f'{value} MiB')\n"  # 8: ' MiB' is not on the list
        "    st.success(' · '.join(parts))\n"  # allowed glue
        "    st.markdown(f'**{t(\"a.b\", lang)}**')\n"  # allowed glue around a translation
        "    st.button(label='Run')\n"  # 11
        "    st.info(t('a.b', lang))\n",
        encoding="utf-8",
    )
    lines = [line.split(" ")[0].rsplit(":", 1)[1] for line in offences(page, writers=True)]
    assert sorted(lines, key=int) == ["2", "3", "4", "5", "6", "7", "8", "11"]
    assert offences(page, writers=False) and all("st." not in line for line in offences(page, writers=False))


def test_each_allowed_literal_says_why_and_is_glue_not_a_sentence():
    for text, reason in WRITER_LITERALS.items():
        assert reason and not any(character.isalpha() for character in text), text
