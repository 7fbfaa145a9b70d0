"""When nothing measured fits a budget: what does come closest, and what would fit.

The advice is measured where a measured row backs it (a shorter sequence the sweep ran) and
an estimate otherwise (activations grow about linearly with the tokens; offload moves the
checkpointed inputs), and each sentence says which. Every sentence is a
:class:`~ckptlab.fact.Fact`, so a page says it in its language.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..fact import Fact
from ..units import mib
from .budget import fit
from .sweep_rows import SweepRow, known, known_peak, row_name


def nothing_fits(measured: list[SweepRow], budget: int, label: str, seq_len: int) -> Fact:
    if not measured:
        return Fact("recommend.none_measured", {"seq_len": seq_len, "budget": label})
    smallest = min(measured, key=known_peak)
    closest = fit(known_peak(smallest), budget)
    peak, over = mib(closest.peak_bytes), mib(closest.short_bytes)
    return Fact(
        "recommend.nothing_fits",
        {"budget": label, "seq_len": seq_len, **_named(smallest), "peak_mib": peak, "over_mib": over},
    )


def _named(row: SweepRow) -> dict[str, str]:
    """A row's setting as a fact names it: its key (every language) and its name in English words."""
    return {"setting": row.setting, "name": row_name(row)}


def what_would_fit(rows: Sequence[SweepRow], measured: list[SweepRow], budget: int, seq_len: int) -> list[Fact]:
    advice: list[Fact] = []
    shorter = sorted(
        (
            row
            for row in rows
            if row.seq_len < seq_len
            and row.status == "ok"
            and row.peak_bytes is not None
            and fit(row.peak_bytes, budget).fits
        ),
        # The longest length first, then the fastest; a row the sweep stopped before timing last.
        key=lambda row: (-row.seq_len, row.step_s is None, row.step_s or 0.0),
    )
    if shorter:
        row = shorter[0]
        advice.append(
            Fact("advice.shorter_measured", {"seq_len": row.seq_len, **_named(row), "peak_mib": mib(known_peak(row))})
        )
    if not measured:
        return [
            *advice,
            Fact("advice.shorter_or_smaller"),
        ]
    smallest = min(measured, key=known_peak)
    # Parameters and their gradients do not shrink with the tokens; the activations do, about linearly
    # (SDPA keeps no seq x seq scores). The baseline stands for the parameters, their gradients for as much again.
    fixed = 2 * known(smallest.baseline_bytes, smallest, Fact("row_figure.measured_baseline"))
    scaling = known_peak(smallest) - fixed
    left = fit(fixed, budget).margin_bytes  # what the budget leaves the activations
    if left <= 0 or scaling <= 0:
        advice.append(Fact("advice.fixed_too_big", {"fixed_mib": mib(fixed)}))
    else:
        share = left / scaling
        tokens = int(seq_len * share)
        if not shorter and tokens >= 1:
            advice.append(Fact("advice.shorter_estimate", {"seq_len": tokens, **_named(smallest)}))
        batch = smallest.result.spec.batch_size if smallest.result is not None else 1
        if batch > 1 and int(batch * share) >= 1:
            advice.append(Fact("advice.smaller_batch", {"batch": int(batch * share), **_named(smallest)}))
    cp_rows = [row for row in measured if row.every_n_layers is not None and not row.offload and row.offload_bytes]
    if cp_rows and not any(row.offload for row in measured):
        row = min(cp_rows, key=lambda row: known_peak(row) - row.offload_bytes)
        lower = known_peak(row) - row.offload_bytes
        fits = fit(lower, budget).fits
        advice.append(
            Fact(
                "advice.offload_would_fit" if fits else "advice.offload_still_over",
                {**_named(row), "moved_mib": mib(row.offload_bytes), "peak_mib": mib(lower)},
            )
        )
    return advice
