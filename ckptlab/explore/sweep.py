"""Many settings of one model, measured in one go: one table row per configuration.

``sweep(SweepSpec(...))`` measures checkpointing off and each distinct ``every_n_layers``
(1 .. the layer count by default), with and without offload where offload applies (CUDA
only), at one or more sequence lengths. The model is built once for the whole sweep and
handed to :func:`ckptlab.measure` (``model=``, ``info=``); a cancel callback is checked
between rows, and the rows measured so far are kept.

Warm-up: a single run warms up ``warmup`` steps before timing because the first
backwards are slow (lazy initialisation, allocator growth, caches). In a sweep those costs
are paid by the first row of each sequence length: later rows run the same model on the
same shapes, so by default they get no warm-up of their own
(``SweepSpec.warmup_each_row=False``). ``benchmarks/sweep.py`` measures the rows both ways
side by side: the later rows' median steps came out within 0.95-1.08 of single runs either
way, and the sweep took 0.77 of the single runs' time. Memory is unaffected: it is read on
its own observed step.
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from transformers import PreTrainedModel

from ..errors import SpecError
from ..model import catalog
from ..model.catalog import DEFAULT_PRESET, ModelInfo
from ..results import RunResult, compare
from ..spec import RunSpec
from ..step.measure import Progress, load_model, measure, resolve_device, validate_for_model
from .predict import settings_for

OffloadChoice = Literal["no", "yes", "both"]
OFFLOAD_CHOICES = ("no", "yes", "both")
Cancel = Callable[[], bool] | threading.Event
Loader = Callable[[RunSpec], tuple[PreTrainedModel, ModelInfo]]
Turn = Callable[[str], AbstractContextManager]  # label of the row -> a context that holds the device

OFFLOAD_SKIPPED_NOTE = (
    "offload rows skipped: offload applies only on CUDA (transformers' offload keeps the checkpointed "
    "inputs in pinned host memory, which needs an accelerator, and on the CPU the activations are in "
    "host memory already). Each row says what offload would move off a GPU (offload_bytes)."
)


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep: one model, its shapes and the settings to try."""

    model: str = DEFAULT_PRESET  # preset name or local directory with config.json
    seq_lens: tuple[int, ...] = (512,)  # one row group per sequence length, in this order
    every_n_layers: tuple[int, ...] | None = None  # settings to try; None: every distinct one, 1 .. layers
    offload: OffloadChoice = "no"  # "no", "yes" (offload rows only) or "both"; offload rows need CUDA
    batch_size: int = 1  # sequences per step
    dtype: str = "auto"  # as RunSpec.dtype
    device: str = "auto"  # as RunSpec.device
    repeats: int = 4  # timed steps per row, as a single run
    warmup: int = 2  # untimed steps before the first row of each sequence length
    warmup_each_row: bool = False  # True: every row warms up as a single run does (slower, see the module doc)
    include_off: bool = True  # measure checkpointing off first: the reference of every ratio
    seed: int = 0  # seeds the random weights and tokens
    optimizer: str = "adamw"  # as RunSpec.optimizer: every row is the whole training step
    lora_rank: int | None = None  # as RunSpec.lora_rank; None: full fine-tune
    lora_targets: tuple[str, ...] | None = None  # as RunSpec.lora_targets; None: every projection

    def validate(self) -> None:
        """Raise :class:`SpecError` naming the first bad value and its fix."""
        if not self.seq_lens:
            raise SpecError("seq_lens is empty: give at least one sequence length, e.g. 512.")
        for seq_len in self.seq_lens:
            if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
                raise SpecError(f"seq_len={seq_len!r} is not valid: every sequence length must be a whole number >= 1.")
        if self.offload not in OFFLOAD_CHOICES:
            raise SpecError(f"offload={self.offload!r} is not one of {', '.join(OFFLOAD_CHOICES)}.")
        if self.every_n_layers is not None and not self.every_n_layers:
            raise SpecError("every_n_layers is empty: give at least one value (e.g. 1,2,4), or None for all.")
        for value in self.every_n_layers or ():
            self.run_spec(self.seq_lens[0], value, False).validate()
        self.run_spec(self.seq_lens[0], None, False).validate()

    def run_spec(self, seq_len: int, every_n_layers: int | None, offload: bool, warmup: int | None = None) -> RunSpec:
        """The single run of one row."""
        return RunSpec(
            model=self.model,
            seq_len=seq_len,
            batch_size=self.batch_size,
            dtype=self.dtype,
            device=self.device,
            every_n_layers=every_n_layers,
            offload=offload,
            repeats=self.repeats,
            warmup=self.warmup if warmup is None else warmup,
            seed=self.seed,
            optimizer=self.optimizer,
            lora_rank=self.lora_rank,
            lora_targets=self.lora_targets,
        )

    @classmethod
    def from_run_spec(cls, spec: RunSpec, **axes: Any) -> SweepSpec:
        """A sweep around ``spec``: its model, batch, dtype, device, repeats, warm-up, seed and training; ``axes`` set the rest."""
        axes.setdefault("seq_lens", (spec.seq_len,))
        return cls(
            model=spec.model,
            batch_size=spec.batch_size,
            dtype=spec.dtype,
            device=spec.device,
            repeats=spec.repeats,
            warmup=spec.warmup,
            seed=spec.seed,
            optimizer=spec.optimizer,
            lora_rank=spec.lora_rank,
            lora_targets=spec.lora_targets,
            **axes,
        )


@dataclass(frozen=True)
class SweepRow:
    """One configuration, measured: raw bytes and seconds, and ratios to checkpointing off at the same length."""

    seq_len: int  # tokens per sequence
    every_n_layers: int | None  # None: checkpointing off
    offload: bool  # transformers' offload ran (CUDA only)
    status: str  # "ok" or "does_not_fit"
    provenance: str  # kind: "measured-cpu" or "measured-cuda"
    cp_layers: int = 0  # layers checkpointed
    baseline_bytes: int | None = None  # before the forward: parameters and buffers
    after_forward_bytes: int | None = None  # resident above the baseline after the forward
    peak_bytes: int | None = None  # highest total over the step, baseline included
    peak_where: str = ""  # the stretch of the step where the peak was reached
    peak_phase: str = ""  # "forward", "loss", "backward" or "optimizer"
    peak_rerun: bool = False  # the peak came while the backward reran a checkpointed layer
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
    message: str = ""  # for does_not_fit: what did not fit
    result: RunResult | None = field(default=None, compare=False, repr=False)  # the full run (timeline, layers, notes)

    @property
    def setting(self) -> str:
        """``"off"``, ``"n=2"`` or ``"n=2 offload"``: a short name for tables and figures."""
        if self.every_n_layers is None:
            return "off"
        return f"n={self.every_n_layers}" + (" offload" if self.offload else "")

    @property
    def peak_above_baseline_bytes(self) -> int | None:
        if self.peak_bytes is None or self.baseline_bytes is None:
            return None
        return self.peak_bytes - self.baseline_bytes

    def to_dict(self) -> dict[str, Any]:
        """The flat row, without the full result."""
        data = {key: value for key, value in asdict(self).items() if key != "result"}
        data["setting"] = self.setting
        return data


COLUMNS = tuple(name for name in SweepRow.__dataclass_fields__ if name != "result") + ("setting",)


@dataclass(frozen=True)
class SweepResult:
    """The rows of a sweep, in the order measured, and what a reader must know."""

    spec: SweepSpec  # what was asked
    model: str  # the model's name
    num_layers: int  # checkpointable layers
    device: str  # where it ran, e.g. "cpu"
    rows: list[SweepRow]  # one per configuration measured
    notes: list[str] = field(default_factory=list)  # offload skipped, duplicates dropped, warm-up policy, ...
    cancelled: bool = False  # True when stopped before the last row; the rows measured are kept
    elapsed_s: float = 0.0  # wall time of the whole sweep, model building included

    def rows_at(self, seq_len: int) -> list[SweepRow]:
        return [row for row in self.rows if row.seq_len == seq_len]

    def off_row(self, seq_len: int) -> SweepRow | None:
        return next((row for row in self.rows_at(seq_len) if row.every_n_layers is None), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": asdict(self.spec),
            "model": self.model,
            "num_layers": self.num_layers,
            "device": self.device,
            "cancelled": self.cancelled,
            "elapsed_s": self.elapsed_s,
            "notes": list(self.notes),
            "rows": [row.to_dict() for row in self.rows],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self) -> str:
        """One line per row, raw bytes and seconds; empty cells where a row did not fit."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({key: "" if value is None else value for key, value in row.to_dict().items()})
        return buffer.getvalue()


@dataclass(frozen=True)
class _Plan:
    """The rows a sweep will run, worked out before anything heavy happens."""

    info: ModelInfo
    rows: list[tuple[int, int | None, bool]]  # (seq_len, every_n_layers, offload) in order
    notes: list[str]


def plan_sweep(spec: SweepSpec) -> _Plan:
    """Validate ``spec`` against its model and list the rows, without building the model.

    Raises:
        SpecError, ModelLoadError: naming the bad value and the fix.
    """
    spec.validate()
    device = resolve_device(spec.device)
    info = catalog.describe(spec.model)
    for seq_len in spec.seq_lens:
        validate_for_model(spec.run_spec(seq_len, None, False), info)
    notes: list[str] = []
    settings = settings_for(info.num_layers, spec.every_n_layers)
    if spec.every_n_layers is not None and len(settings) < len(dict.fromkeys(spec.every_n_layers)):
        dropped = [value for value in dict.fromkeys(spec.every_n_layers) if value not in settings]
        notes.append(
            f"every_n_layers={', '.join(map(str, dropped))} give the same plan as every_n_layers="
            f"{min(v for v in settings if v >= info.num_layers)} on {info.num_layers} layers (only L1 checkpointed): measured once."
        )
    offloads = {"no": [False], "yes": [True], "both": [False, True]}[spec.offload]
    if spec.offload != "no" and device.type != "cuda":
        notes.append(
            OFFLOAD_SKIPPED_NOTE + (" The rows without offload are measured instead." if spec.offload == "yes" else "")
        )
        offloads = [False]
    if not spec.warmup_each_row and spec.warmup:
        notes.append(
            f"warm-up: {spec.warmup} untimed steps before the first row of each sequence length, none before "
            "later rows (same model, same shapes: the first-step costs are already paid)."
        )
    rows: list[tuple[int, int | None, bool]] = []
    for seq_len in spec.seq_lens:
        if spec.include_off:
            rows.append((seq_len, None, False))
        rows += [(seq_len, n, flag) for n in settings for flag in offloads]
    return _Plan(info=info, rows=rows, notes=notes)


def sweep(
    spec: SweepSpec,
    *,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
    load: Loader | None = None,
    turn: Turn | None = None,
    on_result: Callable[[RunResult], None] | None = None,
) -> SweepResult:
    """Measure every configuration of ``spec``, building the model once.

    Args:
        spec: what to sweep.
        progress: called with a message and the fraction of the sweep done.
        cancel: a ``threading.Event`` or a function returning True to stop; checked between
            rows. A stopped sweep returns the rows measured so far with ``cancelled=True``.
        load: builds the model for a :class:`RunSpec` (default :func:`ckptlab.load_model`;
            the app passes its cached loader).
        turn: ``turn(label)`` returns a context manager held while one row runs (the app's
            device queue, so that one measured run uses the device at a time).
        on_result: called with each row's :class:`RunResult` as soon as it is measured
            (a page shows the rows live, and keeps them if the sweep is stopped).

    Returns:
        A :class:`SweepResult`.

    Raises:
        SpecError, ModelLoadError, DoesNotFitError: for bad input, before anything runs.
    """
    started = time.monotonic()
    report = progress or (lambda message, fraction: None)
    stopped = _stopper(cancel)
    plan = plan_sweep(spec)
    load = load or load_model
    hold = turn or (lambda label: nullcontext())
    device = resolve_device(spec.device)
    measured: list[RunResult] = []
    model = info = None
    warmed: set[int] = set()
    cancelled = False
    total = len(plan.rows)
    for index, (seq_len, n, offload) in enumerate(plan.rows):
        if stopped():
            cancelled = True
            break
        warmup = spec.warmup if spec.warmup_each_row or seq_len not in warmed else 0
        run_spec = spec.run_spec(seq_len, n, offload, warmup=warmup)
        label = f"row {index + 1} of {total}: seq {seq_len}, {_setting(n, offload)}"
        with hold(label):
            if model is None:
                report(f"{label}: building the model", index / total)
                # One model for every row: the sequence length is checked per run by measure.
                model, info = load(replace(run_spec, seq_len=min(spec.seq_lens)))
            model.zero_grad(set_to_none=True)
            result = measure(run_spec, model=model, info=info, progress=_scaled(report, label, index, total))
        if result.status == "ok":
            warmed.add(seq_len)
        measured.append(result)
        if on_result is not None:
            on_result(result)
    if total and not cancelled:
        report("sweep done", 1.0)
    return SweepResult(
        spec=spec,
        model=plan.info.name,
        num_layers=plan.info.num_layers,
        device=str(device),
        rows=rows_from_results(measured),
        notes=plan.notes,
        cancelled=cancelled,
        elapsed_s=time.monotonic() - started,
    )


def rows_from_results(results: Sequence[RunResult]) -> list[SweepRow]:
    """Table rows from measured runs, each compared with the run with checkpointing off at its length (if any)."""
    off = {r.spec.seq_len: r for r in results if r.spec.every_n_layers is None and r.status == "ok"}
    return [_row(result, off.get(result.spec.seq_len)) for result in results]


def _row(result: RunResult, off: RunResult | None) -> SweepRow:
    spec = result.spec
    cp_layers = sum(layer.planned == "CP" for layer in result.layers)
    base = {
        "seq_len": spec.seq_len,
        "every_n_layers": spec.every_n_layers,
        "offload": spec.offload,
        "status": result.status,
        "provenance": result.provenance.kind,
        "cp_layers": cp_layers,
        "message": result.message,
        "result": result,
    }
    if result.memory is None or result.timing is None:
        return SweepRow(**base)
    memory, timing = result.memory, result.timing
    ratios: dict[str, Any] = {}
    if off is not None:
        comparison = compare(result, off)
        ratios = {
            "after_forward_ratio": comparison.after_forward_ratio,
            "peak_ratio": comparison.peak_ratio,
            "step_ratio": comparison.step_ratio,
            "step_significant": comparison.step_significant,
        }
    return SweepRow(
        **base,
        baseline_bytes=memory.baseline_bytes,
        after_forward_bytes=memory.after_forward_bytes,
        peak_bytes=memory.peak_bytes,
        peak_where=memory.peak_where.get("description", ""),
        peak_phase=memory.peak_where.get("phase") or "",
        peak_rerun=bool(memory.peak_where.get("rerun")),
        offload_bytes=memory.offload_bytes,
        forward_s=timing.forward_s,
        backward_s=timing.backward_s,
        step_s=timing.step_s,
        step_min_s=min(timing.step_samples),
        step_max_s=max(timing.step_samples),
        **ratios,
    )


def _setting(n: int | None, offload: bool) -> str:
    return "checkpointing off" if n is None else f"every_n_layers={n}" + (", offload" if offload else "")


def _stopper(cancel: Cancel | None) -> Callable[[], bool]:
    if cancel is None:
        return lambda: False
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel


def _scaled(report: Progress, label: str, index: int, total: int) -> Progress:
    def scaled(message: str, fraction: float) -> None:
        report(f"{label}: {message}", (index + fraction) / total)

    return scaled
