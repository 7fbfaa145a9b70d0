"""The sweep's text report says the formula's error from the rows it shows, not a range measured elsewhere."""

from __future__ import annotations

from types import SimpleNamespace

from ckptlab.cli.sweep import backward_range


def test_the_backward_estimates_error_is_the_range_of_the_rows_shown():
    """Issue 43: the footnote said "-9% to +20%" above a table showing +22.0%."""
    rows = [
        SimpleNamespace(formula_peak_phase="backward", formula_peak_error=-0.05),
        SimpleNamespace(formula_peak_phase="backward", formula_peak_error=0.22),
        SimpleNamespace(formula_peak_phase="optimizer", formula_peak_error=0.5),  # exact arithmetic: not an estimate
        SimpleNamespace(formula_peak_phase="backward", formula_peak_error=None),  # a row that did not fit
    ]
    assert backward_range(rows) == " (-5.0% to +22.0% above)"  # type: ignore[arg-type]
    assert backward_range(rows[1:2]) == " (+22.0% above)"  # type: ignore[arg-type]
    assert backward_range(rows[2:]) == ""  # type: ignore[arg-type]
