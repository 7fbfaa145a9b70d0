"""The README a newcomer reads to the end: short, its two commands in place, every link landing (issue 42).

The depth lives in docs/; a link that no longer resolves there sends the reader nowhere, so every
relative link of README.md and of docs/*.md is checked against the checkout. Text only: no import, no run.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 200

# [text](target) outside code; the target up to a space or the closing parenthesis (a title may follow).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def relative_links(path: Path) -> list[str]:
    """The relative link targets of one Markdown file, fenced code left out (a diagram's brackets are not links)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    targets = [match.group(1) for match in LINK.finditer(text)]
    return [target for target in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


def test_the_readme_is_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; the depth belongs in docs/"


def test_every_relative_link_of_the_readme_and_the_docs_resolves() -> None:
    files = [README, *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for path in files:
        for target in relative_links(path):
            where = (path.parent / target.split("#", 1)[0]).resolve()
            if not where.exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, broken
    # The README leads into docs/: a table of links, not prose without a way in.
    assert any(target.startswith("docs/") for target in relative_links(README))


def test_the_readme_keeps_its_two_commands_and_no_counts_or_dates() -> None:
    """.ci/run runs "README's test command"; test counts and dates went stale in the README (9 commits only updated them)."""
    text = README.read_text(encoding="utf-8")
    fenced = FENCE.findall(text)
    assert any(block.rstrip("`\n").endswith("streamlit run app.py") for block in fenced)
    assert any(block.rstrip("`\n").endswith("python -m pytest -q") for block in fenced)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a date in the README: it belongs beside its figure in docs/"
    assert not re.search(r"\b\d[\d,]* (tests|passed|skipped)\b", text), "a test count in the README"
