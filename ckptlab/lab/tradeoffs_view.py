"""What the Trade-offs page shows in words and numbers, worked out here so the page only reads widgets and draws.

Nothing here imports streamlit: the functions take the page's widget values (session-state keys
``tradeoffs_*``), a :class:`~ckptlab.explore.sweep.SweepResult` and the page's language ``lang``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..explore.recommend import Recommendation
from ..explore.sweep import SweepResult, SweepSpec, plan_sweep
from ..fact import Fact
from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..model.selective import NONE
from ..show.i18n import number, say, t
from ..show.labels import provenance_label, training_label
from ..spec import RunSpec
from ..units import MIB, mib, milliseconds
from . import run as labrun
from .run import PACE, PoolSource, run_parts, step_prediction
from .server import ServerPolicy
from .targets import spec_targets
from .widgets import PageWidgets

DEFAULT_BUDGET_MIB = 1024.0  # the custom budget's first value when no row has a peak
BUDGET_HEADROOM = 0.05  # the first budget's room above the median peak: allocator fragmentation and such


# The page's widgets as spec fields (the one codec, ckptlab.lab.widgets): the model (the presets alone), batch, dtype,
# steps and optimizer as they are, and LoRA; the step box's besides. Its own: the sweep's axes (several lengths, a
# list of every_n_layers or all, offload no/yes/both, several policies).
PAGE = PageWidgets("tradeoffs", ("model", "batch_size", "dtype", "repeats", "warmup", "optimizer"), lora=True)


def spec_from_widgets(values: Mapping[str, Any], lora_choices: Sequence[str]) -> SweepSpec:
    """The sweep the page's widgets say: every_n_layers only when chosen, LoRA only where the model offers targets."""
    every_n = values["tradeoffs_n"]
    lora = values["tradeoffs_lora"]
    targets = spec_targets(values["tradeoffs_lora_targets"], lora_choices, lora)
    return SweepSpec(
        **PAGE.fields(values, targets, lora_offered=bool(lora_choices)),
        seq_lens=tuple(sorted(values["tradeoffs_seq"])),
        every_n_layers=tuple(sorted(every_n)) if values["tradeoffs_choose_n"] and every_n else None,
        offload=values["tradeoffs_offload"],
        **policy_axis(values.get("tradeoffs_selective") or [NONE]),
    )


def policy_axis(chosen: Sequence[str]) -> dict[str, Any]:
    """The sweep's policy fields for the chosen policies: one is ``selective`` (the sweep it always was), more
    are ``policies``, in the box's order (plain checkpointing first)."""
    ordered = tuple(policy for policy in SELECTIVE_CHOICES if policy in chosen)
    return {"selective": ordered[0]} if len(ordered) == 1 else {"policies": ordered}


def longest(spec: SweepSpec) -> RunSpec:
    """The sweep's longest run: the one the server's limits are checked against before it starts."""
    return RunSpec(model=spec.model, seq_len=max(spec.seq_lens), batch_size=spec.batch_size, device=spec.device)


def sweep_rows(spec: SweepSpec) -> list[RunSpec]:
    """Each row of the sweep as the one run it is (its own device turn).

    Raises:
        SpecError, ModelLoadError: a sweep that cannot be planned.
    """
    return [
        spec.run_spec(seq_len, every_n, offload, selective=policy, attn_implementation=attention)
        for seq_len, every_n, offload, policy, attention in plan_sweep(spec).rows
    ]


def simulate_rows(spec: SweepSpec, workers: PoolSource | None = None) -> None:
    """Every simulation the sweep's estimate reads (each row, and the Run each row is sized by), made at once as one
    table where the shared store lacks them (:func:`ckptlab.lab.run.counted_works`), in ``workers()`` if given.

    Raises:
        SpecError, ModelLoadError: a sweep that cannot be planned.
    """
    # Looked up on the module: tests replace the count (tests/conftest.py), and this must read what they put there.
    labrun.counted_works([part for row in sweep_rows(spec) for part in run_parts(row)], workers=workers)


def check_rows_time(spec: SweepSpec, policy: ServerPolicy, workers: PoolSource | None = None) -> None:
    """Refuse a sweep one of whose rows the server's run limit (each row's turn) would stop, before it starts.

    Raises:
        NotAllowedError: that row's estimate, the limit, and the command line that runs it in a terminal.
    """
    simulate_rows(spec, workers)
    for row in sweep_rows(spec):
        policy.check_run_time(row, cache=None, alone=True)


def row_step_seconds(spec: SweepSpec, workers: PoolSource | None = None) -> dict[RunSpec, float]:
    """Each row's one step, predicted by the roofline on this device (:func:`ckptlab.lab.run.step_prediction`, the
    simulations the estimate already made); a row without a prediction is left out (it then weighs one second a
    step in the sweep's fraction done).

    Raises:
        SpecError, ModelLoadError: a sweep that cannot be planned.
    """
    simulate_rows(spec, workers)
    predicted = {row: step_prediction(row) for row in sweep_rows(spec)}
    return {row: step.seconds for row, step in predicted.items() if step is not None}


def sweep_estimate(spec: SweepSpec, workers: PoolSource | None = None) -> tuple[float | None, bool]:
    """``(seconds, measured)``: the whole sweep's time, each row one run (:func:`ckptlab.lab.run.run_estimate` of
    the row alone, scaled as :data:`ckptlab.lab.run.PACE` scales a Run); None seconds where the device's speed is
    unknown.

    Raises:
        SpecError, ModelLoadError: a sweep that cannot be planned.
    """
    simulate_rows(spec, workers)
    total, measured = 0.0, False
    for row in sweep_rows(spec):
        seconds, measured = PACE.estimate(row, alone=True)  # a sweep's row is one run, without a Run's reference
        if seconds is None:
            return None, False
        total += seconds
    return total, measured


def summary(result: SweepResult, lang: str) -> str:
    """One line: model and training, layers, batch, where the numbers came from, rows and seconds."""
    provenance = next(
        (provenance_label(row.result.provenance, lang) for row in result.rows if row.result is not None),
        t("tradeoffs.measured", lang),
    )
    training = training_label(result.spec.run_spec(result.spec.seq_lens[0], None, False), lang)
    return t(
        "tradeoffs.summary",
        lang,
        model=f"{result.model} · {training}",
        layers=result.num_layers,
        batch=result.spec.batch_size,
        provenance=provenance,
        rows=len(result.rows),
        seconds=number(result.elapsed_s, ".0f", lang),
    )


def default_budget_mib(result: SweepResult, seq_len: int) -> float:
    """The custom budget's first value: the median peak at ``seq_len`` and :data:`BUDGET_HEADROOM` more, rounded up
    to a whole MiB, so the median row fits with room a person would leave (the bare peak rounded up left "0.1 MiB
    to spare", and rounded to the nearest, equal peaks, as fused AdamW gives, fitted nowhere)."""
    peaks = [row.peak_bytes for row in result.rows_at(seq_len) if row.peak_bytes is not None]
    if not peaks:
        return DEFAULT_BUDGET_MIB
    return float(math.ceil(sorted(peaks)[len(peaks) // 2] * (1 + BUDGET_HEADROOM) / MIB))


def recommended(recommendation: Recommendation, seq_len: int, lang: str) -> str:
    """The setting that fits, in words: its step time, peak and what it leaves of the budget."""
    row = recommendation.row
    assert row is not None and row.step_s is not None and row.peak_bytes is not None, "only for a fitting row"
    return t(
        "tradeoffs.recommended",
        lang,
        setting=row.setting,
        seq=seq_len,
        ms=milliseconds(row.step_s, lang),
        peak=mib(row.peak_bytes, lang),
        spare=mib(recommendation.margin_bytes or 0, lang),
        budget=recommendation.budget_label,
    )


def file_stem(result: SweepResult) -> str:
    """The downloads' file name without extension."""
    return f"ckptlab-sweep-{result.model.strip('/').replace('/', '_')}"


def progress_words(message: Fact, stop_requested: bool, lang: str) -> str:
    """The running sweep's progress bar text: stopping after the row in flight, or the sweep's progress line in ``lang``."""
    return t("tradeoffs.stopping", lang) if stop_requested else say(message, lang)
