"""Predicted beside measured: each sweep row next to its two predictions, with their errors.

The prediction (:mod:`ckptlab.predict`) is the lab's lesson in numbers; checking it against
the rows of a sweep is what makes it teachable. A row's measured numbers and its predicted
ones sit in separate, named fields, so a prediction never passes for a measurement.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .formula import COUNTED_POLICIES
from .predict import Prediction, predict
from .sweep import SweepResult, SweepRow


@dataclass(frozen=True)
class PredictionCheck:
    """One configuration: what was measured, what each prediction said, and how far off it was."""

    seq_len: int  # tokens per sequence
    every_n_layers: int | None  # None: checkpointing off
    offload: bool  # offload ran
    setting: str  # "off", "n=2", "n=2+offload", "n=1+attention" (Setting.key)
    measured_provenance: str  # e.g. "measured-cpu"
    measured_after_forward_bytes: int | None  # measured resident activations after the forward
    formula_after_forward_bytes: int  # predicted from the config (Korthikanti et al. 2022, adapted)
    calibrated_after_forward_bytes: int | None  # predicted from the measured off run; None without one
    formula_error: float | None  # (formula - measured) / measured
    calibrated_error: float | None  # (calibrated - measured) / measured
    measured_step_s: float | None  # measured median step
    formula_step_s: float | None  # off's measured step x the formula's ratio 1 + rerun share / 3
    calibrated_step_s: float | None  # off's measured step + rerun share x off's measured forward
    formula_step_error: float | None
    calibrated_step_error: float | None
    recompute_fraction: float  # the rerun's predicted share of the forward's FLOPs
    rerun_extra_bytes: int  # predicted: added while the backward reruns one CP layer (formula)
    measured_peak_bytes: int | None = None  # measured peak of the step, total
    formula_peak_bytes: int | None = None  # predicted peak (parameters, gradients, optimizer state, activations)
    formula_peak_phase: str | None = None  # "optimizer" (exact arithmetic) or "backward" (an estimate)
    formula_peak_error: float | None = None  # (predicted - measured) / measured
    measured_optimizer_state_bytes: int | None = None  # the optimizer's state, measured
    predicted_optimizer_state_bytes: int | None = None  # the same, arithmetic on the meta model
    formula_experts_counted: bool | None = None  # MoE: True counted, False left out by the formula; None: dense

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_predictions(result: SweepResult) -> list[PredictionCheck]:
    """Predict every row of ``result`` (formula, and calibrated on its length's off row) and compare.

    Args:
        result: a sweep; rows that did not fit get predictions but no errors.

    Returns:
        One :class:`PredictionCheck` per row, in the sweep's order.
    """
    checks: list[PredictionCheck] = []
    # Each attention's rows against its own off row and its own formula (a sweep's attention axis).
    groups = dict.fromkeys((row.seq_len, row.attn_implementation) for row in result.rows)
    for seq_len, attention in groups:
        rows = [row for row in result.rows_at(seq_len) if row.attn_implementation == attention]
        off = result.off_row(seq_len, attention)
        # A stopped sweep can keep an off row whose memory was measured but whose rounds were never timed.
        calibration = off.result if off is not None and off.status == "ok" and off.step_s is not None else None
        settings = [row.every_n_layers for row in rows if row.every_n_layers is not None]
        spec = result.spec
        by_key: dict[tuple[str, int | None, bool, str], Prediction] = {}
        # One prediction per policy the formula counts; a row of another policy (torchtitan's, op names) has
        # no formula to check (simulate it), and gets no check rather than plain checkpointing's.
        policies = [key for key in dict.fromkeys(row.selective for row in rows) if key in COUNTED_POLICIES]
        for policy in policies or ["none"]:
            for p in predict(
                result.spec.model,
                seq_len=seq_len,
                batch_size=spec.batch_size,
                dtype=rows[0].result.dtype if rows[0].result is not None else spec.dtype,
                device=result.device.split(":")[0],
                every_n_layers=settings or [1],
                offload=sorted({row.offload for row in rows}),
                calibration=calibration,
                optimizer=spec.optimizer,
                lora_rank=spec.lora_rank,
                lora_targets=spec.lora_targets,
                selective=policy,
                mixed_precision=spec.mixed_precision,
                attn_implementation=attention,
                quantization=spec.quantization,  # a 4-bit base counted as bitsandbytes stores it
            ):
                by_key[(p.method, p.every_n_layers, p.offload, policy)] = p
        for row in rows:
            formula = by_key.get(("formula", row.every_n_layers, row.offload, row.selective))
            if formula is None:
                continue
            calibrated = by_key.get(("calibrated", row.every_n_layers, row.offload, row.selective))
            checks.append(_check(row, formula, calibrated))
    return checks


def _check(row: SweepRow, formula: Prediction, calibrated: Prediction | None) -> PredictionCheck:
    measured = row.after_forward_bytes
    return PredictionCheck(
        seq_len=row.seq_len,
        every_n_layers=row.every_n_layers,
        offload=row.offload,
        setting=row.setting,
        measured_provenance=row.provenance,
        measured_after_forward_bytes=measured,
        formula_after_forward_bytes=formula.resident_bytes,
        calibrated_after_forward_bytes=None if calibrated is None else calibrated.resident_bytes,
        formula_error=_error(formula.resident_bytes, measured),
        calibrated_error=None if calibrated is None else _error(calibrated.resident_bytes, measured),
        measured_step_s=row.step_s,
        formula_step_s=formula.step_s,
        calibrated_step_s=None if calibrated is None else calibrated.step_s,
        formula_step_error=_error(formula.step_s, row.step_s),
        calibrated_step_error=None if calibrated is None else _error(calibrated.step_s, row.step_s),
        recompute_fraction=formula.recompute_fraction,
        rerun_extra_bytes=formula.rerun_extra_bytes,
        measured_peak_bytes=row.peak_bytes,
        formula_peak_bytes=formula.peak_bytes,
        formula_peak_phase=formula.peak_phase,
        formula_peak_error=_error(formula.peak_bytes, row.peak_bytes),
        measured_optimizer_state_bytes=row.optimizer_state_bytes,
        formula_experts_counted=formula.experts_counted if formula.experts else None,
        predicted_optimizer_state_bytes=formula.optimizer_state_bytes,
    )


def _error(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else (predicted - measured) / measured
