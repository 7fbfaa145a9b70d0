"""The Trade-offs page with its sweep stubbed: the page and its background job run as they do; the rows are given.

The page's :class:`~ckptlab.lab.sweepjob.SweepJob` runs ``ckptlab.lab.sweepjob.sweep`` on its thread in the server's
threads (``CKPTLAB_WORKERS=thread``); :func:`give_sweep` replaces it with a :class:`GivenSweep`, which keeps the
:class:`~ckptlab.explore.sweep.SweepSpec` the page handed it and reports rows measured elsewhere, as a real sweep
reports them. What a real sweep measures and how Stop ends it are tests/explore/test_sweep.py's and
tests/lab/test_sweepjob.py's; the page's one real sweep is tests/app/test_tradeoffs_page.py's.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from ckptlab.explore.sweep import SweepResult, SweepSpec, plan_sweep, rows_from_results
from ckptlab.lab import sweepjob
from tests.app.polling import HANG_S


class GivenSweep:
    """``sweep`` for a page's job: keeps what it was asked and answers with ``result``'s rows (none without one).

    With ``stop_after``, it reports that many rows and then waits for :attr:`pressed` (set by the test once it
    pressed Stop): if the job's cancel check then says stop, it ends as a stopped sweep ends, the rows reported
    kept; else it reports the rest.
    """

    def __init__(self, result: SweepResult | None = None, stop_after: int | None = None) -> None:
        self.result, self.stop_after = result, stop_after
        self.asked: list[SweepSpec] = []
        self.pressed = threading.Event()

    def __call__(self, spec: SweepSpec, *, cancel, on_result, **_) -> SweepResult:
        self.asked.append(spec)
        if self.result is None:
            info = plan_sweep(spec).info
            return SweepResult(spec=spec, model=info.name, num_layers=info.num_layers, device="cpu", rows=[])
        results = [row.result for row in self.result.rows if row.result is not None]
        for index, result in enumerate(results):
            if index == self.stop_after:
                assert self.pressed.wait(HANG_S), "the test never pressed Stop"
                if cancel():
                    return replace(self.result, rows=rows_from_results(results[:index]), cancelled=True)
            on_result(result)
        return self.result


def give_sweep(monkeypatch: pytest.MonkeyPatch, result: SweepResult | None = None, stop_after: int | None = None):
    """Stub the sweep of every Trade-offs page this test drives; returns the :class:`GivenSweep`."""
    given = GivenSweep(result, stop_after)
    monkeypatch.setenv("CKPTLAB_WORKERS", "thread")  # the job's work on its thread here, where the stub is
    monkeypatch.setattr(sweepjob, "sweep", given)
    return given
