"""One home for "does this peak fit that budget" (issue 42): ``ckptlab.explore.budget.fit`` and nothing else.

The rule had six homes (scale, recommend, advice twice, the At-scale page's thin margin, the CLI's sentence,
the GPU search), each with its own comparison and margin. A cheap source scan (``ast``, no import, no run) keeps
a second one from coming back: outside ``explore/budget.py`` no code compares a budget with ``<``/``<=``/``>``/
``>=`` or subtracts one (a margin), and ``THIN_MARGIN`` is named nowhere else.
"""

import ast
from pathlib import Path

import pytest

from ckptlab.explore.budget import THIN_MARGIN, fit

ROOT = Path(__file__).resolve().parents[2]
HOME = Path("ckptlab/explore/budget.py")
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)

# Comparisons with a budget that are not a fit, each with why.
NOT_A_FIT = {
    ("ckptlab/cli/simulate.py", "0 < args.budget_gib <= MAX_BUDGET_GIB"): "the bounds of the flag's value",
    ("ckptlab/show/figures/scale.py", "budget_bytes <= OFF_SCALE * max(tallest, 1)"): "where the figure's axis ends",
}


def _sources() -> list[Path]:
    files = [*sorted((ROOT / "ckptlab").rglob("*.py")), *sorted((ROOT / "pages").glob("*.py")), ROOT / "app.py"]
    return [path for path in files if path.relative_to(ROOT) != HOME]


def _names_a_budget(node: ast.AST) -> bool:
    return "budget" in ast.unparse(node).lower()


def _is_a_literal(node: ast.AST) -> bool:
    """A number written out: ``budget <= 0`` checks the input, it decides no fit."""
    return isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant))


def fit_decisions(path: Path) -> list[str]:
    """``file:line: source`` of each budget comparison, margin or THIN_MARGIN in one file."""
    where = path.relative_to(ROOT).as_posix()
    found = []
    text = path.read_text(encoding="utf-8")
    if "budget" not in text.lower() and "THIN_MARGIN" not in text:
        return found  # most files: nothing to parse
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare) and any(isinstance(op, ORDER) for op in node.ops):
            operands = [node.left, *node.comparators]
            budgets = [operand for operand in operands if _names_a_budget(operand)]
            others = [operand for operand in operands if not _names_a_budget(operand)]
            decides = budgets and not all(_is_a_literal(other) for other in others)
            if decides and (where, ast.unparse(node)) not in NOT_A_FIT:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            if _names_a_budget(node.left) or _names_a_budget(node.right):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Name) and node.id == "THIN_MARGIN") or (
            isinstance(node, ast.Attribute) and node.attr == "THIN_MARGIN"
        ):
            found.append(f"{where}:{node.lineno}: THIN_MARGIN")
    return found


def test_no_code_outside_the_budget_module_decides_a_fit_on_its_own():
    found = [line for path in _sources() for line in fit_decisions(path)]
    assert not found, "ask ckptlab.explore.budget.fit (or fits) instead:\n" + "\n".join(found)


def test_the_scan_sees_the_comparisons_it_is_there_to_refuse(tmp_path, monkeypatch):
    """The scan itself, on the forms the six homes had: a comparison, a margin, the thin-margin constant."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    source = tmp_path / "example.py"
    source.write_text(
        "fitting = [row for row in rows if known_peak(row) <= budget]\n"
        "margin = (budget - best_peak) / GIB\n"
        "thin = margin < THIN_MARGIN * budget\n"
        "ok = budget_bytes <= 0\n"
    )
    found = fit_decisions(source)
    assert sorted(line.split(":")[1] for line in found) == ["1", "2", "3", "3"], found


@pytest.mark.parametrize(
    ("peak", "budget", "fits", "margin", "thin"),
    [
        (80, 100, True, 20, False),
        (100, 100, True, 0, True),  # equal fits, with nothing to spare
        (96, 100, True, 4, True),  # under 5% to spare
        (95, 100, True, 5, False),  # exactly 5%: not thin
        (101, 100, False, -1, False),  # short: never thin
    ],
)
def test_the_one_rule(peak, budget, fits, margin, thin):
    answer = fit(peak, budget)
    assert (answer.fits, answer.margin_bytes, answer.thin, answer.short_bytes) == (fits, margin, thin, -margin)
    assert THIN_MARGIN == 0.05


def _total(reserved: int, out_of_memory_at: int | None = None):
    from ckptlab.results.allocations import WHOLE_STEP, DeviceTotal

    return DeviceTotal(
        gpu="H100 80 GB",
        allocated_bytes=60,
        reserved_bytes=reserved,
        cublas_bytes=2,
        context_bytes=5,
        context_measured=False,
        context_source="",
        nccl_bytes=0,
        largest_free_at_peak=0,
        out_of_memory_at=out_of_memory_at,
        trace_how=WHOLE_STEP,
        trace_events=10,
    )


def test_with_a_device_total_the_rule_decides_on_what_nvidia_smi_shows():
    """The tensors' 60 B fit 70 B; the allocator's 68 B reserved and the 5 B context do not (73 B): the rule compares
    the device total and says its terms. A total within the budget that ran out of segments (fragmentation) fails."""
    assert fit(60, 70).fits
    answer = fit(60, 70, _total(68))
    assert (answer.fits, answer.peak_bytes, answer.margin_bytes, answer.device) == (False, 73, -3, _total(68))
    assert (answer.device.cached_bytes, answer.device.total_bytes) == (6, 73)
    assert fit(60, 80, _total(68)).fits
    assert not fit(60, 80, _total(68, out_of_memory_at=7)).fits
