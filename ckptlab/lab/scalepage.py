"""What the At-scale page shows in words and tables, worked out here so the page only draws.

Every function takes the page's words (``i18n.section("at_scale", lang)``) and returns text,
rows or a :class:`Verdict`; nothing here imports streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from ..explore.gpu_search import GpuSearch
from ..explore.scale import ScaleRequest, ScaleTable, Setting, fits, least_recompute_that_fits
from ..model.catalog import ModelInfo
from ..results import RunResult, memory_of
from ..show.figures.breakdown import part_bytes
from ..show.labels import event_label, provenance_label
from ..units import GIB

THIN_MARGIN = 0.05  # of the budget: below it, the verdict warns
CATEGORY_COLUMNS = ("parameter", "gradient", "optimizer_state", "activation", "temp")  # per GPU at the peak


@dataclass(frozen=True)
class Verdict:
    """A sentence for the page, how to show it, and the result it is about."""

    kind: Literal["success", "error", "info"]  # st.success, st.error or st.info
    text: str
    result: RunResult | None  # the setting to draw (the one that fits, or the closest)


def duration(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.1f} min"


def model_label(name: str, info: ModelInfo) -> str:
    """A preset in the model box: name, layers and size."""
    size = f"{info.num_params / 1e9:.1f}B" if info.num_params >= 1e9 else f"{info.num_params / 1e6:.0f}M"
    return f"{name} · {info.num_layers} layers · {size}"


def gpus_label(gpus: int, words: Mapping[str, str]) -> str:
    return words["gpus_one"] if gpus == 1 else words["gpus_many"].format(gpus=gpus)


def summary(table: ScaleTable, words: Mapping[str, str], lang: str) -> str:
    """One line: provenance, model, GPUs, how many settings and how long they took."""
    seconds = list(table.seconds.values())
    each = words["each"].format(low=min(seconds), high=max(seconds)) if seconds else ""
    reused = len(table.results) - len(seconds)
    line = (
        words["summary"]
        .format(
            provenance=provenance_label(table.results[0].provenance, lang) if table.results else words["simulated"],
            model=table.request.model,
            layers=table.num_layers,
            count=len(table.results),
            elapsed=duration(table.elapsed_s),
            each=each,
            reused=words["reused"].format(count=reused) if reused else "",
        )
        .replace(" ()", "")
    )
    return line + " · " + gpus_label(table.request.world_size, words)


def verdict(table: ScaleTable, budget: int, budget_label: str, words: Mapping[str, str]) -> Verdict:
    """Which setting fits with the least recompute on each GPU of the table, or by how much nothing does."""
    best = least_recompute_that_fits(table, budget)
    gpus = gpus_label(table.request.world_size, words)
    if best is not None:
        setting = Setting.of(best.spec)
        best_peak = memory_of(best).peak_bytes
        peak, margin = best_peak / GIB, (budget - best_peak) / GIB
        if setting.every_n_layers is None:
            text = words["fits_off"].format(budget=budget_label, peak=peak, margin=margin)
        else:
            text = words["fits"].format(
                setting=setting.key,
                budget=budget_label,
                peak=peak,
                margin=margin,
                cp=setting.cp_layers(table.num_layers),
                layers=table.num_layers,
            )
        thin = words["thin"] if margin * GIB < THIN_MARGIN * budget else ""
        return Verdict("success", f"{gpus}: {text}{thin}", best)
    lowest = min(table.results, key=lambda result: memory_of(result).peak_bytes)
    lowest_peak = memory_of(lowest).peak_bytes
    text = words["no_fit"].format(
        budget=budget_label,
        peak=lowest_peak / GIB,
        setting=Setting.of(lowest.spec).key,
        short=(lowest_peak - budget) / GIB,
    )
    return Verdict("error", f"{gpus}: {text}", lowest)


def rows(table: ScaleTable, budget: int, budget_label: str, words: Mapping[str, str], lang: str) -> list[dict]:
    """The table under the figures: one row per setting, per GPU, GiB; the seconds column only when something ran."""
    category_words = {part: words[f"col_{part}"] for part in CATEGORY_COLUMNS}
    out = []
    for result in table.results:
        setting = Setting.of(result.spec)
        memory = memory_of(result)
        row = {
            words["col_setting"]: setting.key,
            words["col_cp"]: setting.cp_layers(table.num_layers),
            words["col_peak"]: round(memory.peak_bytes / GIB, 2),
            words["col_fits"].format(budget=budget_label): words["yes"] if fits(result, budget) else words["no"],
            words["col_margin"]: round((budget - memory.peak_bytes) / GIB, 2),
            **{
                label: round(part_bytes(memory.breakdown_at_peak, part) / GIB, 2)
                for part, label in category_words.items()
            },
            words["col_resident"]: round(memory.after_forward_bytes / GIB, 3),
            words["col_host"]: round(memory.host_offload_bytes / GIB, 3),
            words["col_where"]: event_label(memory.peak_where, lang) if "kind" in memory.peak_where else "",
            words["col_seconds"]: round(table.seconds[setting.key], 1) if setting.key in table.seconds else None,
        }
        if not table.seconds:  # every result reused: no times to show
            del row[words["col_seconds"]]
        out.append(row)
    return out


def search_verdict(search: GpuSearch, budget_label: str, words: Mapping[str, str]) -> Verdict:
    """The GPU search's answer in words: how many GPUs and which setting, or what comes closest."""
    counted = words["search_counted"].format(
        tried=len(search.tried), simulated=search.simulated, elapsed=duration(search.elapsed_s)
    )
    if search.cancelled and not search.fits:
        return Verdict("info", words["search_stopped"] + " " + counted, None)
    if search.result is None:
        lowest = search.lowest()
        if lowest is None:
            return Verdict("error", words["search_none"].format(budget=budget_label, gpus=search.counts[-1]), None)
        text = words["search_no_fit"].format(
            budget=budget_label,
            gpus=search.counts[-1],
            peak=memory_of(lowest).peak_bytes / GIB,
            setting=Setting.of(lowest.spec).key,
        )
        return Verdict("error", text + " " + counted, lowest)
    # search.setting and search.gpus, read from the result itself: it is there.
    setting, peak = Setting.of(search.result.spec), memory_of(search.result).peak_bytes
    text = words["search_fits"].format(
        gpus=gpus_label(search.result.spec.world_size, words),
        setting=setting.key,
        budget=budget_label,
        peak=peak / GIB,
        margin=(search.budget_bytes - peak) / GIB,
        cp=setting.cp_layers(search.num_layers),
        layers=search.num_layers,
    )
    stopped = " " + words["search_stopped_early"] if search.cancelled else ""
    return Verdict("success", text + stopped + " " + counted, search.result)


def search_is_for(search: GpuSearch, request: ScaleRequest, budget: int) -> bool:
    """True when ``search`` answered this shape, these settings and this budget (the GPUs chosen aside)."""
    return search.budget_bytes == budget and replace(search.request, world_size=1) == replace(request, world_size=1)
