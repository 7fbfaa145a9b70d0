"""Many settings of one model, measured in one go: one table row per configuration.

``sweep(SweepSpec(...))`` measures checkpointing off and each distinct ``every_n_layers``
(1 .. the layer count by default), with and without offload where offload applies (CUDA
only), at one or more sequence lengths. The model is built once for the whole sweep and
handed to :func:`ckptlab.measure` (``model=``, ``info=``); a cancel callback is checked
between rows, and the rows measured so far are kept.

Memory, then time. At each sequence length every setting first runs its memory step
(``measure(..., timed=False)``: one or more untimed steps, then the observed one). Then the
settings' timed steps run interleaved, round by round (off, n=1, n=2, off, n=1, n=2, ...;
:mod:`ckptlab.step.rounds`), so a burst of load on a shared machine hits every setting
alike, and each row quotes the ratio of medians over those rounds with the verdict of
:func:`ckptlab.results.judge_time` (measurable, or within the noise). ``SweepSpec.timing_order
= "blocks"`` times each setting's steps together instead, as single runs do;
``benchmarks/timing_order.py`` measures both orders side by side (the figures are in docs/measuring.md).

Warm-up: a single run warms up ``warmup`` steps before timing because the first
backwards are slow (lazy initialisation, allocator growth, caches). In a sweep those costs
are paid by the first row of each sequence length: later rows run the same model on the
same shapes, so by default they get one untimed step (which creates the optimizer's state
before their memory step) and no more (``SweepSpec.warmup_each_row=False``; True: every row
warms up ``warmup`` steps, and ``warmup`` untimed rounds precede the timed ones).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from transformers import PreTrainedModel

from ..errors import expect_type
from ..fact import Fact, worded
from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.selective import Selective
from ..results import BusyReason, RunResult
from ..spec import RunSpec, Setting
from ..step.measure import measure
from ..step.preflight import load_model, resolve_device, validate_for_model
from ..step.rounds import OnStep, time_settings
from ..step.stopping import Cancel, Progress, ShouldStop, spanned, stopper
from .predict import settings_for
from .step_time import MEMORY_STEP_COST
from .sweep_rows import COLUMNS, SweepRow, row_key, rows_from_results
from .sweep_spec import OFFLOAD_CHOICES, OffloadChoice, SweepSpec

__all__ = [
    "COLUMNS",
    "OFFLOAD_CHOICES",
    "OffloadChoice",
    "SweepResult",
    "SweepRow",
    "SweepSpec",
    "plan_sweep",
    "rows_from_results",
    "sweep",
]

Loader = Callable[[RunSpec], tuple[PreTrainedModel, ModelInfo]]
Turn = Callable[[str], AbstractContextManager]  # label of the row -> a context that holds the device


@dataclass(frozen=True)
class SweepResult:
    """The rows of a sweep, in the order measured, and what a reader must know."""

    spec: SweepSpec  # what was asked
    model: str  # the model's name
    num_layers: int  # checkpointable layers
    device: str  # where it ran, e.g. "cpu"
    rows: list[SweepRow]  # one per configuration measured
    notes: list[Fact] = field(default_factory=list)  # offload skipped, duplicates dropped, warm-up policy, ...
    cancelled: bool = False  # True when stopped before the last row; the rows measured are kept
    elapsed_s: float = 0.0  # wall time of the whole sweep, model building included

    @property
    def busy_reasons(self) -> tuple[BusyReason, ...]:
        """Why the machine was too busy to time any row ("load", "spread"), from the rows' timings; () if not."""
        reasons = {
            reason
            for row in self.rows
            if row.result is not None and row.result.timing is not None
            for reason in row.result.timing.busy_reasons
        }
        return tuple(reason for reason in ("load", "spread") if reason in reasons)

    def rows_at(self, seq_len: int) -> list[SweepRow]:
        return [row for row in self.rows if row.seq_len == seq_len]

    def off_row(self, seq_len: int, attn_implementation: str | None = None) -> SweepRow | None:
        """The off reference at ``seq_len``: of ``attn_implementation``'s rows, or the first attention's (None)."""
        return next(
            (
                row
                for row in self.rows_at(seq_len)
                if row.every_n_layers is None and attn_implementation in (None, row.attn_implementation)
            ),
            None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": asdict(self.spec),
            "model": self.model,
            "num_layers": self.num_layers,
            "device": self.device,
            "cancelled": self.cancelled,
            "elapsed_s": self.elapsed_s,
            "notes": [worded(note) for note in self.notes],  # English, as JSON always had them
            "facts": [note.to_dict() for note in self.notes],
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
    # (seq_len, every_n_layers, offload, policy, attention) in order
    rows: list[tuple[int, int | None, bool, Selective, str]]
    notes: list[Fact]


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
    notes: list[Fact] = []
    settings = settings_for(info.num_layers, spec.every_n_layers)
    if spec.every_n_layers is not None and len(settings) < len(dict.fromkeys(spec.every_n_layers)):
        dropped = ", ".join(str(value) for value in dict.fromkeys(spec.every_n_layers) if value not in settings)
        kept = min(v for v in settings if v >= info.num_layers)
        notes.append(Fact("note.same_plan", {"dropped": dropped, "kept": kept, "layers": info.num_layers}))
    offloads = {"no": [False], "yes": [True], "both": [False, True]}[spec.offload]
    if spec.offload != "no" and device.type != "cuda":
        notes.append(Fact("note.offload_skipped_instead" if spec.offload == "yes" else "note.offload_skipped"))
        offloads = [False]
    if not spec.warmup_each_row and spec.warmup:
        notes.append(Fact("note.warmup", {"warmup": spec.warmup}))
    if spec.timing_order == "interleaved":
        notes.append(Fact("note.interleaved", {"repeats": spec.repeats}))
    rows: list[tuple[int, int | None, bool, Selective, str]] = []
    for seq_len in spec.seq_lens:
        for attention in spec.attention_axis:  # each attention its own off reference, then its settings
            if spec.include_off:
                rows.append((seq_len, None, False, "none", attention))
            rows += [
                (seq_len, n, flag, policy, attention)
                for n in settings
                for flag in offloads
                for policy in spec.policy_axis
            ]
    return _Plan(info=info, rows=rows, notes=notes)


def _row_label(index: int, rows: int, seq_len: int, setting: str) -> Fact:
    """A row's name in the progress line and (in English) the device queue: "row 2 of 6: seq 512, n=2"."""
    return Fact("progress.row", {"row": index + 1, "rows": rows, "seq_len": seq_len, "setting": setting})


def sweep_shares(
    spec: SweepSpec, plan: _Plan, step_seconds: Mapping[RunSpec, float] | None = None
) -> dict[tuple[str, int], float]:
    """Each part of the sweep as its share of the whole's predicted time: a row's memory run (its warm-up, at least
    one step, and the observed step) by row index, and a length's timed rounds (each row's repeats, and its warm-up
    when every row warms up) by sequence length.

    ``step_seconds``: one step of each row (its spec as :meth:`SweepSpec.run_spec` writes it), predicted by the
    roofline (the app's ``lab.tradeoffs_view.row_step_seconds``); a row it does not name weighs one second a step,
    so that without predictions the fraction counts steps."""
    weights: dict[tuple[str, int], float] = {}
    seen: set[int] = set()
    for index, (seq_len, n, offload, policy, attention) in enumerate(plan.rows):
        first = seq_len not in seen or spec.warmup_each_row
        seen.add(seq_len)
        row = spec.run_spec(seq_len, n, offload, selective=policy, attn_implementation=attention)
        step = (step_seconds or {}).get(row, 1.0)
        warmup = max(spec.warmup if first else 0, 1)
        weights[("memory", index)] = step * (warmup + MEMORY_STEP_COST)
        timed = spec.repeats + (spec.warmup if spec.warmup_each_row else 0)
        weights[("timing", seq_len)] = weights.get(("timing", seq_len), 0.0) + step * timed
    total = sum(weights.values()) or 1.0
    return {part: weight / total for part, weight in weights.items()}


def sweep(
    spec: SweepSpec,
    *,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
    load: Loader | None = None,
    turn: Turn | None = None,
    on_result: Callable[[RunResult], None] | None = None,
    on_timed_step: Callable[[RunSpec], None] | None = None,
    should_stop: ShouldStop | None = None,
    step_seconds: Mapping[RunSpec, float] | None = None,
) -> SweepResult:
    """Measure every configuration of ``spec``, building the model once.

    Args:
        spec: what to sweep.
        progress: called with a message and the fraction of the sweep done.
        cancel: a ``threading.Event`` or a function returning True to stop; checked between
            rows and timed steps. A stopped sweep returns the rows measured so far with
            ``cancelled=True``.
        should_stop: asked inside each row's memory step too (a server's time limit per
            turn); when it answers True the sweep ends with :class:`~ckptlab.errors.RunStoppedError`.
        load: builds the model for a :class:`RunSpec` (default :func:`ckptlab.load_model`;
            the app passes its cached loader).
        turn: ``turn(label)`` returns a context manager held while one row runs (the app's
            device queue, so that one measured run uses the device at a time).
        on_result: called with each row's :class:`RunResult` as soon as its memory is measured
            (``timing`` None), and again with the same spec once its length's rounds are timed
            (a page shows the rows live, replaces them when timed, and keeps them if the sweep is stopped).
        on_timed_step: called with a row's spec just before each of its timed steps, in the
            order they run (tests observe the interleaving through it).
        step_seconds: each row's predicted step (:func:`sweep_shares`): the fraction done moves as the time does.

    Returns:
        A :class:`SweepResult`.

    Raises:
        SpecError, ModelLoadError, DoesNotFitError: for bad input, before anything runs.
    """
    expect_type(
        "ckptlab.sweep", "spec", spec, SweepSpec, "ckptlab.sweep(SweepSpec(model='tiny-llama', seq_lens=(256,)))"
    )
    started = time.monotonic()
    report = progress or (lambda message, fraction: None)
    stopped = stopper(cancel)
    plan = plan_sweep(spec)
    load = load or load_model
    hold = turn or (lambda label: nullcontext())
    device = resolve_device(spec.device)
    measured: list[RunResult] = []
    model = info = None
    cancelled = False
    groups = list(dict.fromkeys(seq_len for seq_len, *_ in plan.rows))
    # Every row's memory step, and one timing unit per length, each as its share of the sweep's predicted time: the
    # fraction done moves as the time does, and a countdown from it holds (issue 58: 13 s left with 85 s to go).
    shares = sweep_shares(spec, plan, step_seconds)
    done = 0.0
    for seq_len in groups:
        pending: list[RunResult] = []
        for index, (length, n, offload, policy, attention) in enumerate(plan.rows):
            if length != seq_len:
                continue
            if stopped():
                cancelled = True
                break
            first = not pending or spec.warmup_each_row
            run_spec = spec.run_spec(
                seq_len,
                n,
                offload,
                warmup=spec.warmup if first else 0,
                selective=policy,
                attn_implementation=attention,
            )
            label = _row_label(index, len(plan.rows), seq_len, row_key(Setting(n, offload, policy), attention))
            with hold(worded(label)):
                if model is None:
                    report(Fact("progress.building_row", {"label": label}), done)
                    # One model for every row: the sequence length is checked per run by measure.
                    model, info = load(replace(run_spec, seq_len=min(spec.seq_lens)))
                model.zero_grad(set_to_none=True)
                share = shares[("memory", index)]
                progress_here = spanned(report, done, share, Fact("progress.row_memory", {"label": label}))
                # should_stop is asked inside the step (ckptlab.step.stopping): a server's time limit ends a
                # long row. cancel (Stop) is not: the row in flight finishes and is kept.
                pending.append(
                    measure(
                        run_spec, model=model, info=info, progress=progress_here, timed=False, should_stop=should_stop
                    )
                )
            if on_result is not None:
                on_result(pending[-1])
            done += share
        ok = [result for result in pending if result.status == "ok"]
        timed_here = bool(ok) and not cancelled
        if timed_here:
            label = Fact(
                "progress.timing_interleaved" if spec.timing_order == "interleaved" else "progress.timing_blocks",
                {"seq_len": seq_len, "count": len(ok)},
            )
            step_hook: OnStep | None = None
            if on_timed_step is not None:
                specs = [result.spec for result in ok]

                def step_hook(round_: int, index: int, specs: list[RunSpec] = specs) -> None:
                    on_timed_step(specs[index])

            assert model is not None and info is not None  # built by the rows that ran ("ok")
            prefix = Fact("progress.label", {"label": label})
            with hold(worded(label)):
                rounds = time_settings(
                    [result.spec for result in ok],
                    model,
                    info,
                    order=spec.timing_order,
                    warmup_rounds=spec.warmup if spec.warmup_each_row else 0,
                    on_step=step_hook,
                    stopped=stopped,
                    progress=spanned(report, done, shares[("timing", seq_len)], prefix),
                )
            timed = {id(result): (timing, notes) for result, timing, notes in zip(ok, rounds.timings, rounds.notes)}
            pending = [
                replace(result, timing=timed[id(result)][0], notes=result.notes + timed[id(result)][1])
                if id(result) in timed
                else result
                for result in pending
            ]
            cancelled = cancelled or stopped()
        done += shares[("timing", seq_len)]
        measured += pending
        if on_result is not None and timed_here:
            for result in pending:
                on_result(result)
        if cancelled:
            break
    if plan.rows and not cancelled:
        report(Fact("progress.sweep_done"), 1.0)
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
