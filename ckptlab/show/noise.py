"""The verdict on time, in the app's words: a busy machine said up front, a sweep table that says "noise" in the row.

The judgement itself is :func:`ckptlab.results.judge_time` (and ``TimingResult.busy_reasons``);
this module only turns it into the locale's words and the table a page shows. The command
line's words are in :mod:`ckptlab.show.report`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..explore.accuracy import PredictionCheck
from ..explore.sweep import SweepResult, SweepRow
from ..results import BUSY_SPREAD, BusyReason, TimingResult
from ..units import MIB
from .i18n import number, say, t


def busy_message(
    reasons: Sequence[BusyReason], load: float | None, cores: int | None, spread: float | None, lang: str = "en"
) -> str:
    """Why the machine was too busy to time, in ``lang``; "" when it was not."""
    why = []
    if "load" in reasons and load is not None:
        why.append(t("noise.busy_load", lang, load=number(load, ".1f", lang), cores=cores))
    if "spread" in reasons and spread is not None:
        why.append(
            t("noise.busy_spread", lang, spread=number(spread, ".0%", lang), limit=number(BUSY_SPREAD, ".0%", lang))
        )
    if "shared" in reasons:
        why.append(t("noise.busy_shared", lang))
    return t("noise.busy", lang, why=" ".join(why)) if why else ""


def timing_busy_message(timing: TimingResult | None, lang: str = "en") -> str:
    """:func:`busy_message` for one run's timing ("" without one)."""
    if timing is None:
        return ""
    return busy_message(timing.busy_reasons, timing.load_average, timing.cores, timing.relative_spread, lang)


def sweep_busy_message(result: SweepResult, lang: str = "en") -> str:
    """:func:`busy_message` for a sweep: the highest load and spread its rows' timings saw."""
    timings = [row.result.timing for row in result.rows if row.result is not None and row.result.timing is not None]
    return busy_message(
        result.busy_reasons,
        max((timing.load_average for timing in timings if timing.load_average is not None), default=None),
        next((timing.cores for timing in timings if timing.cores), None),
        max((timing.relative_spread for timing in timings if timing.relative_spread is not None), default=None),
        lang,
    )


def verdict_label(row: SweepRow, lang: str = "en") -> str:
    """The row's time against checkpointing off in words: measurable, noise, too few steps ("" for off)."""
    return t(f"noise.verdict_{row.step_verdict}", lang) if row.step_verdict else ""


def sweep_table(rows: Sequence[SweepRow], lang: str = "en", checks: Sequence[PredictionCheck] = ()) -> list[dict]:
    """The rows as a page's table: MiB and ms, the spread, the verdict in the row, the predicted rerun share."""
    rerun = {(check.seq_len, check.setting): check.recompute_fraction for check in checks}
    table = []
    for row in rows:
        line = {
            t("tradeoffs.col_seq", lang): row.seq_len,
            t("tradeoffs.col_setting", lang): row.setting,
            t("tradeoffs.col_cp", lang): row.cp_layers,
            t("tradeoffs.col_resident", lang): None
            if row.after_forward_bytes is None
            else round(row.after_forward_bytes / MIB, 1),
            t("tradeoffs.col_peak", lang): None if row.peak_bytes is None else round(row.peak_bytes / MIB, 1),
            t("tradeoffs.col_step", lang): None if row.step_s is None else round(row.step_s * 1000),
            t("tradeoffs.col_ratio", lang): None if row.step_ratio is None else round(row.step_ratio, 2),
            t("tradeoffs.col_spread", lang): None if row.step_spread is None else round(row.step_spread * 100),
            t("tradeoffs.col_time", lang): verdict_label(row, lang),
        }
        if checks:
            share = rerun.get((row.seq_len, row.setting))
            line[t("tradeoffs.col_rerun", lang)] = None if share is None else round(share * 100 + 0.0)
        reason = None if row.result is None else row.result.reason  # why it did not fit, in the page's language
        line[t("tradeoffs.col_where", lang)] = row.peak_where or (row.message if reason is None else say(reason, lang))
        table.append(line)
    return table
