"""Every sentence a person reads comes from the locale files: the scan of ``ckptlab/`` for sentences built elsewhere.

It reads the package as Python syntax trees and names, as ``file:line``, each string literal with words (letters
and a space) handed to an exception that is raised, to ``print``, or to ``argparse.ArgumentTypeError``: those are
sentences a person reads, and they belong in ``ckptlab/locales/<lang>.json`` (an error as ``errors.<key>``, a
fact as ``said.<key>``, a line of the command line as ``cli.<key>``). Out of its scope: argparse's help (an
``add_argument``'s ``help=``, a parser's ``description=``), the code snippets' comments (``model/snippets.py``
writes code, not sentences), and the exceptions in ``INTERNAL``: a bug's message, read by whoever fixes it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ckptlab"
SENTENCE = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]")  # two words: a sentence, not a key, a flag nor glue

# Exceptions whose message is for the lab's developer, never for its reader: each with why.
INTERNAL = {
    "RuntimeError": "a broken invariant (a meter read outside its step, a nested device turn): a bug",
    "NotImplementedError": "a branch the lab never takes (a reduce-scatter op gloo's ranks do not run)",
    "AssertionError": "a broken invariant",
    "NotDerivable": "step.replay's signal to fall back to the fold, caught there and never shown",
    "NotCombinable": "step.opcount's signal that counted ops do not combine across depths, caught by the fold and the "
    "replay and never shown",
    "AttributeError": "Python's own protocol of a module's __getattr__",
    "MissingKeyError": "a key the code asks for is missing from en.json: a bug the locale tests catch",
    "IndexError": "an event index outside a timeline: a caller's bug",
}
# Raises of ValueError that guard a private contract inside the lab (a caller in the lab passing what it never
# passes), by file and the function they are in: each with why no reader meets them.
PRIVATE_CONTRACTS = {
    ("step/fake_experts.py", "grouped_mm_output_shape"): "the fake grouped_mm's own argument check, called by torch",
    ("step/timeline.py", "position"): "an event kind the probe never records",
    ("step/training.py", "trainer_optimizer_class"): "called only with an optimizer the spec already checked",
}


def _literal_words(node: ast.AST) -> list[str]:
    """The string literals ``node`` puts in a message as they are: a constant, an f-string's text, both sides of
    a ``+``, both arms of an ``if``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["".join(value.value for value in node.values if isinstance(value, ast.Constant))]
    if isinstance(node, ast.BinOp):
        return _literal_words(node.left) + _literal_words(node.right)
    if isinstance(node, ast.IfExp):
        return _literal_words(node.body) + _literal_words(node.orelse)
    return []


def _name(call: ast.Call) -> str:
    return call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node -> the name of the function it is in."""
    inside: dict[ast.AST, str] = {}
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                inside.setdefault(node, function.name) if node is not function else None
    return inside


def sentences_outside_the_locale_files(path: Path, where: str) -> list[str]:
    """Every sentence ``path`` builds outside the locale files, as ``file:line what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = _functions(tree)
    raised = {id(node.exc) for node in ast.walk(tree) if isinstance(node, ast.Raise)}
    found = []
    for node in ast.walk(tree):
        call, what = None, ""
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            call, what = node.exc, f"raise {_name(node.exc)}"
            if _name(call) in INTERNAL:
                continue
            if (where, functions.get(node, "")) in PRIVATE_CONTRACTS:
                continue
        elif isinstance(node, ast.Call) and _name(node) in ("print", "ArgumentTypeError") and id(node) not in raised:
            call, what = node, _name(node)
        if call is None:
            continue
        for argument in [*call.args, *(keyword.value for keyword in call.keywords if keyword.arg != "file")]:
            for text in _literal_words(argument):
                if SENTENCE.search(text):
                    found.append(f"{where}:{node.lineno} {what}({text[:60]!r})")
    return found


# The edge (the command line and ckptlab/show) puts what it builds in front of people: there a literal with two
# words is a sentence wherever it goes (a report's line, a table's header, a figure's label), not only when it is
# raised or printed. Out of scope as above, and: docstrings, argparse's help (``help=``, ``description=``, an
# argument group's title, a ``*_help`` variable or what a ``*_help(s)`` function returns, handed to ``help=``), dict keys, and plotly's text positions.
EDGE = ("cli", "show")
PLOTLY_POSITIONS = {f"{v} {h}" for v in ("top", "middle", "bottom") for h in ("left", "center", "right")}


def _help_and_keys(tree: ast.AST) -> set[int]:
    """The ids of the nodes whose literals are no sentence for the edge's reader: docstrings, argparse's help,
    dict keys, the messages of the exceptions in INTERNAL."""
    nodes: list[ast.AST] = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        documented = isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
        if documented and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            nodes.append(body[0].value)
        if isinstance(node, ast.Call):
            nodes += [keyword.value for keyword in node.keywords if keyword.arg in ("help", "description")]
            if _name(node) == "add_argument_group" or _name(node) in INTERNAL:
                nodes += node.args
        elif isinstance(node, ast.Assign) and any(
            getattr(target, "id", "").endswith("_help") for target in node.targets
        ):
            nodes.append(node.value)
        elif isinstance(node, ast.Dict):
            nodes += [key for key in node.keys if key is not None]
        if isinstance(node, ast.FunctionDef) and node.name.rstrip("s").endswith("_help"):  # args._helps: help= texts
            nodes += [inner.value for inner in ast.walk(node) if isinstance(inner, ast.Return) and inner.value]
    return {id(inner) for node in nodes for inner in ast.walk(node)}


def words_outside_the_locale_files(path: Path, where: str) -> list[str]:
    """Every literal with two words in an edge module ``path``, outside what :func:`_help_and_keys` leaves out,
    as ``file:line what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _help_and_keys(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, (ast.Constant, ast.JoinedStr)):
            continue
        if isinstance(node, ast.JoinedStr):
            skipped.update(id(value) for value in node.values)  # its parts are read once, as the whole
        for text in _literal_words(node):
            if SENTENCE.search(text) and text not in PLOTLY_POSITIONS:
                found.append(f"{where}:{node.lineno} {text[:60]!r}")
    return found


def test_the_edge_builds_no_words_outside_the_locale_files():
    """The command line's reports and tables (``show/report.py``, ``cli/``) word every line, label and column
    header through ``t``: a sentence left in code is named here. (A one-word label, "Notes:", is beyond a scan that
    must not take a flag, a key or a dtype for a word.)"""
    found = [
        line
        for folder in EDGE
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for line in words_outside_the_locale_files(path, str(path.relative_to(PACKAGE)))
    ]
    assert found == [], "word these through the locale files (t, say, cli.<key>):\n" + "\n".join(found)


def test_the_edge_scan_names_each_literal_with_words(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        '"""A docstring, with words."""\n'
        "def f(x, parser):\n"
        "    lines = [f'Per layer: {x}', t('cli.notes', 'en')]\n"  # 3
        "    parser.add_argument('--x', help='a help text')\n"
        "    group = parser.add_argument_group('across ranks')\n"
        "    device_help = 'default auto: CUDA'\n"
        "    table = {'peak GiB': 1}\n"
        "    figure.update(textposition='top center')\n"
        "    raise RuntimeError('a bug, for the developer')\n"
        "    return _table_row('this run', x, 'steady state') + t('cli.x', 'en', tail=' and more')\n",  # 10
        encoding="utf-8",
    )
    lines = [line.split(" ")[0] for line in words_outside_the_locale_files(source, "m.py")]
    assert lines == ["m.py:3", "m.py:10", "m.py:10", "m.py:10"]


def test_no_sentence_is_built_outside_the_locale_files():
    found = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in sentences_outside_the_locale_files(path, str(path.relative_to(PACKAGE)))
    ]
    assert found == [], "word these through the locale files (t, say, errors.<key>):\n" + "\n".join(found)


def test_the_scan_names_each_sentence_by_file_and_line(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        "def f(x):\n"
        "    raise ValueError(f'{x} is not valid: use 1')\n"  # 2
        "    raise SpecError(key='spec.x', value=x)\n"
        "    print(f'error: {x} did not fit')\n"  # 4
        "    print('\\r' + ' ' * 60 + '\\r', end='')\n"
        "    raise RuntimeError('a bug, for the developer')\n"
        "    raise argparse.ArgumentTypeError('not a number')\n"  # 7
        "    print(t('cli.error', message=x))\n",
        encoding="utf-8",
    )
    lines = [line.split(" ")[0].rsplit(":", 1)[1] for line in sentences_outside_the_locale_files(source, "m.py")]
    assert sorted(lines, key=int) == ["2", "4", "7"]


def test_each_exception_left_in_english_says_why():
    assert all(reason for reason in [*INTERNAL.values(), *PRIVATE_CONTRACTS.values()])


def _formatted_numbers(tree: ast.AST) -> list[int]:
    """Lines where a ``Fact(...)`` or an exception's call (a name ending in ``Error``) gets a param written by an
    f-string with a format spec (``size=f"{n / 2**20:,.1f}"``): a number formatted in the core, in English."""
    lines = []
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or not (_name(call) == "Fact" or _name(call).endswith("Error")):
            continue
        values = [keyword.value for keyword in call.keywords] + [
            value for argument in call.args if isinstance(argument, ast.Dict) for value in argument.values
        ]
        for value in values:
            if isinstance(value, ast.JoinedStr) and any(
                isinstance(part, ast.FormattedValue) and part.format_spec is not None for part in value.values
            ):
                lines.append(value.lineno)
    return lines


def test_facts_and_errors_carry_numbers_not_formatted_text():
    """A fact's or an error's number travels as a number: its template formats it in the reader's language
    (``{needed:gib}``, ``{tokens:,}``: ``ckptlab.fact.UNIT_SPECS``), so a pt-BR message reads "11.175,9 GiB"."""
    found = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in _formatted_numbers(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, (
        "numbers formatted into a fact's or an error's params (pass the number; format it in the template):\n"
        + "\n".join(found)
    )


def test_the_number_scan_names_a_formatted_param(tmp_path):
    source = 'raise SpecError(key="k", size=f"{n / 2**20:,.1f}")\nFact("k", {"gib": f"{x:.1f}", "n": n})\n'
    assert _formatted_numbers(ast.parse(source)) == [1, 2]
