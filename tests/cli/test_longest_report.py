"""``simulate --longest-seq``'s table (ckptlab.cli.simulate.longest_report), worded from rows without a simulation."""

from __future__ import annotations

from ckptlab.cli.simulate import longest_report
from ckptlab.explore.longest import LongestSeq
from ckptlab.spec import RunSpec
from ckptlab.units import GIB

BUDGET = 24 * GIB


def test_the_table_shows_the_bytes_that_make_the_next_token_not_fit():
    """Issue 58: 8,392 tokens fit and 8,393 do not, yet both peaks read "24.00" GiB; the bytes to spare and over
    (the fit rule's margin) say why."""
    rows = [
        LongestSeq("n=1", 8392, BUDGET - 1_500_000, 8393, BUDGET + 700_000, BUDGET, 4, 40960),
        LongestSeq("off", 0, None, 16, BUDGET + 5, BUDGET, 6, 40960),
    ]
    lines = longest_report(RunSpec(model="qwen3-8b"), rows, (BUDGET, "24 GiB")).splitlines()
    assert lines[1].split() == ["setting", "longest", "seq", "peak", "GiB", "spare", "bytes", "next", "length"]
    assert lines[2].split()[:5] == ["n=1", "8,392", "24.00", "1,500,000", "8,393"]
    assert lines[2].endswith("8,393 tokens: 24.00 GiB, 700,000 bytes over: does not fit")
    assert lines[3].split()[:4] == ["off", "0", "-", "-"] and lines[3].endswith("5 bytes over: does not fit")
