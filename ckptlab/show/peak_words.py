"""Where a sweep row's peak was reached, and why checkpointing did or did not lower it there, in words.

The trade-off figures hover with :func:`peak_where`; the trade-offs page says :func:`peak_sentence`
under them. Both speak the page's language (``lang``).
"""

from __future__ import annotations

from ..explore.sweep_rows import SweepRow
from ..results import MemoryResult
from ..units import MIB
from .i18n import number, t
from .labels import event_label


def peak_where(row: SweepRow, lang: str = "en") -> str:
    """Where a row's peak was reached, in ``lang``: from its run's typed region; a row without its run
    (a table made by hand, or read back) says its English description, or "an unknown stretch"."""
    region = row.result.memory.peak_where if row.result is not None and row.result.memory is not None else None
    if region is not None and region.kind:
        return event_label(region, lang)
    return row.peak_where or t("tradeoff_fig.unknown_where", lang)


def peak_sentence(row: SweepRow, off: SweepRow | None, lang: str = "en") -> str:
    """Where the row's peak was, and why checkpointing did or did not lower it there.

    Args:
        row: a measured configuration.
        off: checkpointing off at the same length, the reference (``None`` if not measured).
    """
    if row.peak_bytes is None:
        return t("tradeoff_fig.no_fit", lang, setting=row.setting)
    where = peak_where(row, lang)
    if row.peak_rerun:
        why = t("tradeoff_fig.why_rerun", lang)
    elif row.peak_kind == "backward_end":  # the embeddings' and the last layers' gradients
        why = t("tradeoff_fig.why_last", lang)
    elif row.peak_phase == "backward":
        why = t("tradeoff_fig.why_backward", lang)
    elif row.peak_phase == "optimizer":
        why = t("tradeoff_fig.why_optimizer", lang)
    else:
        why = t("tradeoff_fig.why_forward", lang)
    sentence = t(
        "tradeoff_fig.sentence",
        lang,
        setting=row.setting,
        mib=number(row.peak_bytes / MIB, ",.1f", lang),
        where=where,
        why=why,
    )
    if off is None or off.peak_bytes is None or row is off:
        return sentence
    change = off.peak_bytes - row.peak_bytes
    if change > 0.005 * off.peak_bytes:
        return sentence + t(
            "tradeoff_fig.lower",
            lang,
            mib=number(change / MIB, ",.1f", lang),
            ratio=number(row.peak_bytes / off.peak_bytes, ".2f", lang),
        )
    return sentence + t("tradeoff_fig.not_lower", lang)


def logits_sentence(memory: MemoryResult | None, lang: str = "en") -> str:
    """When the float32 logits set a peak (``MemoryResult.logits_set_the_peak``): their share, that checkpointing
    cannot free them, and what avoids them; "" otherwise."""
    if memory is None or not memory.logits_set_the_peak:
        return ""
    share = memory.logits_bytes_at_peak or 0
    return t(
        "scale.logits_peak",
        lang,
        where=event_label(memory.peak_where, lang),
        mib=number(share / MIB, ",.1f", lang),
        peak_mib=number(memory.peak_bytes / MIB, ",.1f", lang),
        share=number(share / memory.peak_bytes, ".0%", lang),
    )
