"""A sweep's table rows: one measured configuration each, with its ratios to checkpointing off and the
verdict on its time (:func:`ckptlab.results.judge_time`), flat for CSV and JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from ..errors import Option, SpecError
from ..fact import Fact
from ..model.selective import selective_key
from ..results import RunResult, TimeVerdict, compare
from ..spec import Setting


@dataclass(frozen=True)
class SweepRow:
    """One configuration, measured: raw bytes and seconds, and ratios to checkpointing off at the same length."""

    seq_len: int  # tokens per sequence
    every_n_layers: int | None  # None: checkpointing off
    offload: bool  # transformers' offload ran (CUDA only)
    status: str  # "ok" or "does_not_fit"
    provenance: str  # kind: "measured-cpu" or "measured-cuda"
    cp_layers: int = 0  # layers checkpointed
    baseline_bytes: int | None = None  # before the forward: parameters, buffers and the optimizer's state
    after_forward_bytes: int | None = None  # resident above the baseline after the forward
    peak_bytes: int | None = None  # highest total over the step, baseline included
    peak_where: str = ""  # the stretch of the step where the peak was reached
    peak_phase: str = ""  # "forward", "loss", "backward" or "optimizer"
    peak_rerun: bool = False  # the peak came while the backward reran a checkpointed layer
    peak_kind: str = ""  # the probe event that starts that stretch (probe.EVENTS), e.g. "backward_end"
    optimizer_state_bytes: int | None = None  # the optimizer's state, in the baseline and the peak (0: sgd, none)
    offload_bytes: int = 0  # inputs of the CP layers: moved to host with offload on CUDA, else what it would move
    forward_s: float | None = None  # median forward (with the loss)
    backward_s: float | None = None  # median backward
    step_s: float | None = None  # median step
    step_min_s: float | None = None  # fastest timed step
    step_max_s: float | None = None  # slowest timed step
    after_forward_ratio: float | None = None  # resident after the forward over checkpointing off's
    peak_ratio: float | None = None  # peak above the baseline over checkpointing off's
    step_ratio: float | None = None  # median step over checkpointing off's
    step_significant: bool | None = None  # the step-time ranges of this row and off's do not overlap
    step_spread: float | None = None  # this row's fastest-to-slowest step over its median
    step_verdict: str = ""  # against off: "measurable", "noise" or "too_few" (Judgement); "" for off itself
    message: str = ""  # for does_not_fit: what did not fit
    selective: str = "none"  # the CP layers' selective policy (its key, ckptlab.model.selective); "none": plain
    attn_implementation: str = "sdpa"  # the attention the row ran (RunSpec.attn_implementation)
    result: RunResult | None = field(default=None, compare=False, repr=False)  # the full run (timeline, layers, notes)
    time_verdict: TimeVerdict | None = field(default=None, compare=False, repr=False)  # the verdict behind step_verdict

    @property
    def setting(self) -> str:
        """``"off"``, ``"n=2"``, ``"n=2+offload"`` or ``"n=1+attention"``: the setting's :attr:`~ckptlab.spec.Setting.key`
        (``"n=2+eager"``, ``"off+eager"`` for a row of another attention than SDPA: :func:`row_key`)."""
        return row_key(Setting(self.every_n_layers, self.offload, self.selective), self.attn_implementation)

    @property
    def peak_above_baseline_bytes(self) -> int | None:
        return None if self.peak_bytes is None or self.baseline_bytes is None else self.peak_bytes - self.baseline_bytes

    @property
    def time_is_noise(self) -> bool:
        """True when this row's step time is not measurably different from off's (within the spread, or too few
        steps): a table says so in the row, a figure greys it, a recommendation does not rank by it."""
        return self.time_verdict is not None and self.time_verdict.noise

    def to_dict(self) -> dict[str, Any]:
        """The flat row, without the full result."""
        data = {key: value for key, value in asdict(self).items() if key not in ("result", "time_verdict")}
        data["setting"] = self.setting
        return data


def row_key(setting: Setting, attn_implementation: str) -> str:
    """A sweep row's id: the setting's key, and its attention where it is not SDPA (the default): ``"n=2+eager"``."""
    return setting.key + ("" if attn_implementation == "sdpa" else f"+{attn_implementation}")


COLUMNS = tuple(name for name in SweepRow.__dataclass_fields__ if name not in ("result", "time_verdict")) + ("setting",)


def rows_from_results(results: Sequence[RunResult]) -> list[SweepRow]:
    """Table rows from measured runs, each compared with the run with checkpointing off at its length (if any)."""
    off = {
        (r.spec.seq_len, r.spec.attn_implementation): r
        for r in results
        if r.spec.every_n_layers is None and r.status == "ok"
    }
    return [_row(result, off.get((result.spec.seq_len, result.spec.attn_implementation))) for result in results]


def _row(result: RunResult, off: RunResult | None) -> SweepRow:
    spec = result.spec
    cp_layers = sum(layer.planned == "CP" for layer in result.layers)
    base: dict[str, Any] = {  # SweepRow's fields shared by every row
        "seq_len": spec.seq_len,
        "every_n_layers": spec.every_n_layers,
        "offload": spec.offload,
        "status": result.status,
        "provenance": result.provenance.kind,
        "cp_layers": cp_layers,
        "message": result.message,
        "selective": selective_key(spec.selective),
        "attn_implementation": spec.attn_implementation,
        "result": result,
    }
    if result.memory is None:
        return SweepRow(**base)
    memory, timing = result.memory, result.timing
    times: dict[str, Any] = {}
    if timing is not None:
        times = {
            "forward_s": timing.forward_s,
            "backward_s": timing.backward_s,
            "step_s": timing.step_s,
            "step_min_s": min(timing.step_samples),
            "step_max_s": max(timing.step_samples),
            "step_spread": timing.relative_spread,
        }
    ratios: dict[str, Any] = {}
    if off is not None and off.timing is not None and off.memory is not None:
        verdict = None
        if timing is not None:
            comparison = compare(result, off)
            verdict = comparison.step
            ratios = {"step_ratio": verdict.ratio, "step_significant": comparison.step_significant}
        ratios |= {
            "after_forward_ratio": _safe_ratio(memory.after_forward_bytes, off.memory.after_forward_bytes),
            "peak_ratio": _safe_ratio(memory.peak_above_baseline_bytes, off.memory.peak_above_baseline_bytes),
        }
        if verdict is not None and result is not off:
            ratios |= {"step_verdict": verdict.judgement.value, "time_verdict": verdict}
    return SweepRow(
        **base,
        baseline_bytes=memory.baseline_bytes,
        after_forward_bytes=memory.after_forward_bytes,
        peak_bytes=memory.peak_bytes,
        peak_where=memory.peak_where.description,
        peak_phase=memory.peak_where.phase,
        peak_rerun=memory.peak_where.rerun,
        peak_kind=memory.peak_where.kind,
        optimizer_state_bytes=memory.optimizer_state_bytes,
        offload_bytes=memory.offload_bytes,
        **times,
        **ratios,
    )


def _safe_ratio(value: int, reference: int) -> float:
    return value / reference if reference else float("nan")


_Value = TypeVar("_Value")


def known(value: _Value | None, row: SweepRow, what: Fact) -> _Value:
    """A figure of ``row`` that its status promises (a measured row has its peak, a timed one its steps).

    Raises:
        SpecError: the row does not have it (a row a sweep did not measure, or did not time).
    """
    if value is None:
        raise SpecError(
            key="api.row_without",
            setting=row.setting,
            option=Option("seq_len", row.seq_len),
            status=repr(row.status),
            what=what,
        )
    return value


def known_peak(row: SweepRow) -> int:
    return known(row.peak_bytes, row, Fact("row_figure.measured_peak"))


def known_step(row: SweepRow) -> float:
    return known(row.step_s, row, Fact("row_figure.timed_step"))


def pareto_rows(rows: Sequence[SweepRow]) -> list[SweepRow]:
    """The rows no other row beats on both step time and peak memory, fastest first."""
    measured = sorted(
        (row for row in rows if row.step_s is not None and row.peak_bytes is not None),
        key=lambda r: (known_step(r), known_peak(r)),
    )
    frontier: list[SweepRow] = []
    for row in measured:
        if not frontier or known_peak(row) < known_peak(frontier[-1]):
            frontier.append(row)
    return frontier


def row_name(row: SweepRow) -> str:
    """A row's setting in words: "checkpointing off", "every_n_layers=2 with offload"."""
    attention = "" if row.attn_implementation == "sdpa" else f", {row.attn_implementation} attention"
    if row.every_n_layers is None:
        return "checkpointing off" + attention
    policy = "" if row.selective == "none" else f", selective={row.selective}"
    return f"every_n_layers={row.every_n_layers}" + (" with offload" if row.offload else "") + policy + attention
