"""What the lab's Run button does: a measured run and its checkpointing-off reference, queued and reused.

:func:`run_queued` is the one core call behind the page. It validates the spec before
queueing (bad input never waits), takes a turn on the device (:mod:`ckptlab.lab.runqueue`),
measures the spec and, once per shape, the same run with checkpointing off (and, for a
selective policy, the same setting with plain checkpointing), and keeps them in a process-wide :class:`ResultCache`, so a second participant asking for the same
settings gets the first one's numbers at once, labelled as reused.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import torch
from transformers import PreTrainedModel

from ..errors import DoesNotFitError, RunStoppedError
from ..explore.roofline import TimePrediction, step_work
from ..explore.step_time import device_speed, predict_step, run_steps, simulated_spec
from ..fact import Fact
from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.lora import linear_module_names
from ..results import Comparison, Judgement, RunResult, compare, judge_time
from ..spec import RunSpec, Setting
from ..step.equivalence import GradientCheck, check_gradients
from ..step.measure import measure
from ..step.preflight import (
    building_fact,
    check_spec,
    load_model,
    refuse_beyond_machine,
    resolve_device,
    resolve_dtype,
    with_folder_quantization,
)
from ..step.stopping import DONE, Progress, ShouldStop, scaled
from ..step.work import StepWork
from .runqueue import DEFAULT_TIMEOUT_S, DEVICE_QUEUE, DeviceQueue, OnWait
from .store import MAX_BYTES, MAX_ENTRIES, SIMULATIONS, ResultStore, json_bytes, simulated
from .workers import WorkerPool

# (model, resolved dtype, resolved device, seed), and a 4-bit base's Quantization last where the spec has one.
ModelKey = tuple[Any, ...]
Loader = Callable[[ModelKey], tuple[PreTrainedModel, ModelInfo]]


@dataclass(frozen=True)
class Measured:
    """A result and when it was measured."""

    result: RunResult
    measured_at: datetime  # UTC
    reused: bool  # True when this request took it from the cache instead of running it


@dataclass(frozen=True)
class LabRun:
    """What one press of Run produced."""

    run: Measured  # the settings asked for
    reference: Measured | None  # same model and shape with checkpointing off; None if the run itself did not fit
    comparison: Comparison | None  # run against its reference, when both have measurements
    wait_s: float  # seconds spent waiting for the device
    elapsed_s: float  # seconds from the call to the answer, waiting included
    # With a selective policy: the same setting as plain (full) checkpointing, what the policy is weighed
    # against beside checkpointing off; None without a policy, or when the run did not fit.
    plain: Measured | None = None

    @property
    def result(self) -> RunResult:
        return self.run.result


class ResultCache:
    """The Lab's measured runs by :class:`RunSpec`, shared by all sessions: the one bounded store (:mod:`.store`)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self._store: ResultStore[RunSpec, Measured] = ResultStore(
            lambda measured: json_bytes(measured.result), max_entries, max_bytes
        )

    def get(self, spec: RunSpec) -> Measured | None:
        return self._store.get(spec)

    def put(self, result: RunResult) -> Measured:
        return self._store.put(result.spec, Measured(result, datetime.now(timezone.utc), reused=False))

    def clear(self) -> None:
        self._store.clear()


RESULTS = ResultCache()
# Where an estimate's missing simulations run: the server's simulation workers (the app's), asked for when needed.
PoolSource = Callable[[], WorkerPool | None]


def reference_spec(spec: RunSpec) -> RunSpec:
    """The same run with checkpointing off: the reference every run is compared with."""
    return spec.checkpointing_off()


def plain_spec(spec: RunSpec) -> RunSpec | None:
    """The same setting with plain checkpointing, for a run with a selective policy (None without one)."""
    return None if spec.selective == "none" else replace(spec, selective="none")


def model_key(spec: RunSpec) -> ModelKey:
    """What identifies a built model: "auto" resolved, so "auto" and "cpu" share one model on a CPU machine; the
    quantization the spec names, or else the one its folder's (or Hub config's) ``quantization_config`` asks for.

    Raises:
        SpecError: a bitsandbytes quantization_config the lab does not take.
    """
    # The folder's quantization belongs to the key: build_for_key then builds the 4-bit base with adapters, as the
    # CLI's check_spec does. Without it the key named a plain base, and its build, finding the folder's
    # quantization_config and no LoRA rank, refused a run that had one.
    spec = with_folder_quantization(spec)
    device = resolve_device(spec.device)
    return (
        spec.model,
        str(resolve_dtype(spec.dtype, device, spec.mixed_precision)).removeprefix("torch."),
        device.type,
        spec.seed,
    ) + ((spec.quantization,) if spec.quantization is not None else ())


def build_for_key(key: ModelKey) -> tuple[PreTrainedModel, ModelInfo]:
    """Build the model for a :func:`model_key` (the default loader; the app wraps it in a cache)."""
    name, dtype, device, seed, *quantized = key
    # seq_len=1: the model is shared by every sequence length; each run's length is checked by measure. A 4-bit
    # base is built quantized (and trains adapters: any rank stands for the runs' own).
    lora = {"quantization": quantized[0], "lora_rank": 1} if quantized else {}
    return load_model(RunSpec(model=name, dtype=dtype, device=device, seed=seed, seq_len=1, **lora))


def lora_target_choices(model: str) -> list[str]:
    """The projections LoRA can adapt in ``model`` (``q_proj``, ``c_attn``, ...), read on the ``meta`` device.

    Raises:
        ModelLoadError: the model cannot be read.
    """
    config, _, task = catalog.load_config(model)
    return linear_module_names(catalog.build_on_meta(config, task))


def check_gradients_queued(
    spec: RunSpec,
    *,
    on_wait: OnWait | None = None,
    queue: DeviceQueue = DEVICE_QUEUE,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    workers: WorkerPool | None = None,
    limit_s: float | None = None,
) -> GradientCheck:
    """:func:`ckptlab.step.equivalence.check_gradients` in a turn of the device queue (two more steps).

    It builds its own two models (dropout on), so the app's cached model is not touched. With
    ``workers`` it runs in that pool's worker process, killed past ``limit_s`` seconds.

    Raises:
        SpecError, ModelLoadError: for bad input, before anything waits.
        DeviceBusyError: the device stayed busy for ``timeout`` seconds.
    """
    refuse_beyond_machine(check_spec(spec))
    with queue.turn(on_wait=on_wait, timeout=timeout, label=f"gradient check {_label(spec)}"):
        if workers is None:
            return check_gradients(spec)
        return workers.run(
            "ckptlab.lab.workerjobs:gradients_spec",
            spec,
            limit_s=limit_s,
            on_limit=lambda: time_limit_error(limit_s or 0),
        )


def run_parts(spec: RunSpec) -> list[RunSpec]:
    """What a Run of ``spec`` measures: the spec, its checkpointing-off reference, a policy's plain run."""
    full = plain_spec(spec)
    return [spec, *([reference_spec(spec)] if spec.checkpointing else []), *([full] if full is not None else [])]


def counted_works(
    specs: Sequence[RunSpec], simulate_missing: bool = True, workers: PoolSource | None = None
) -> dict[RunSpec, StepWork | None]:
    """The counted work of one step of each of ``specs`` here: its simulation's
    (:func:`ckptlab.explore.step_time.simulated_spec`), from the shared bounded store
    (:func:`ckptlab.lab.store.simulated`), so that a page pays for a spec once for every session; None where the
    simulation counted none, or, with ``simulate_missing`` False, where the store does not hold it yet.

    Why a whole simulation, not a cheaper count: the roofline times the ops a step runs, and only the fake step
    knows them (transformers' Python, the loss's float32 logits, the rerun that stops at the last saved tensor, the
    optimizer's ops). One costs 1.7-4.1 s on this busy 2-core machine for the Lab's presets from tiny-llama to
    qwen3-0.6b at 256-4,096 tokens (benchmarks/estimate_cost.py): the fold keeps a deep model at two shallow
    copies, so the length and depth hardly matter, and no allocation order is recorded. That is more than the 2 s
    a Run should wait before it starts, so: each spec once per server (the store); a Run's parts that the results
    cache holds are not simulated (:func:`run_estimate`); the parts a Run or a sweep lacks are simulated as one
    table (``step.table``), whose settings of one model and shape share their shallow steps (each setting keeps
    its own work: the rerun, what a policy keeps); and in the app they run in the simulation workers
    (``workers()``, asked for only when something is missing), whose time on the cores a measured CPU run beside
    them is told of.

    Raises:
        SpecError, ModelLoadError: a spec the simulation refuses.
    """
    keys = {spec: simulated_spec(spec) for spec in specs}
    wanted = list(dict.fromkeys(keys.values()))
    results = {key: known for key in wanted if (known := SIMULATIONS.get(key)) is not None}
    if simulate_missing and len(results) < len(wanted):
        # The pool is asked for only now: a page whose estimates are all kept starts no worker.
        results = simulated(wanted, workers=None if workers is None else workers())
    return {spec: step_work(results[key]) if key in results else None for spec, key in keys.items()}


def step_prediction(
    spec: RunSpec, simulate_missing: bool = True, workers: PoolSource | None = None
) -> TimePrediction | None:
    """One step of ``spec`` on this device, predicted by the roofline over its simulation's counted work
    (:func:`counted_works`); None where the device's speed is unknown (a GPU the lab has no datasheet for) or there
    is no counted work.

    Raises:
        SpecError, ModelLoadError: a spec the simulation refuses.
    """
    speed = device_speed(spec)
    if speed is None:
        return None
    work = counted_works([spec], simulate_missing, workers)[spec]
    return None if work is None else predict_step(spec, work, speed)


def run_estimate(
    spec: RunSpec,
    cache: ResultCache | None = None,
    alone: bool = False,
    simulate_missing: bool = True,
    workers: PoolSource | None = None,
) -> float | None:
    """Predicted seconds of a Run of ``spec`` here: each of its measurements (:func:`run_parts`, or ``spec`` alone:
    a sweep's row; those ``cache`` holds are reused, not run) at its warm-up, timed and memory steps, each step
    the roofline's over its simulated work (:func:`counted_works`, the parts simulated together). None where the
    device's speed is unknown or a part has no counted work (with ``simulate_missing`` False: is not simulated yet).

    Raises:
        SpecError, ModelLoadError, UnsupportedModelError: a spec the simulation refuses.
    """
    parts = [part for part in ([spec] if alone else run_parts(spec)) if cache is None or cache.get(part) is None]
    speed = device_speed(spec)
    if speed is None:
        return None
    works = counted_works(parts, simulate_missing, workers)
    total = 0.0
    for part in parts:
        work = works[part]
        if work is None:
            return None
        total += predict_step(part, work, speed).seconds * run_steps(part)
    return total


PACE_ALIKE = 10.0  # runs predicted within this factor of each other scale alike; beyond it, fixed costs differ
PACE_KEPT = 64  # the most recent Runs a pace remembers


class Pace:
    """How this server's measured Runs compare with :func:`run_estimate`: a wait's estimate, predicted or measured.

    The estimate knows the step's ops and this machine's idle speed, not its load, nor a Run's
    fixed costs (building the model, the worker, the memory step's bookkeeping). Once Runs of a like size (predicted
    within :data:`PACE_ALIKE` of it) were measured here, a Run's estimate is its prediction scaled by what they took
    over what was predicted for them. Only alike ones: tiny Runs, whose time is mostly fixed costs, took ten times
    their prediction, and would have made a real model's Run look ten times longer than it is.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[tuple[float, float]] = []  # (predicted, measured) seconds, oldest first

    def record(self, spec: RunSpec, seconds: float) -> None:
        """A whole Run of ``spec`` (every part of :func:`run_parts`, none reused) took ``seconds`` on the device."""
        # Learnt only from a Run whose estimate is known (the page asked it before the Run): recording must not
        # simulate after every run.
        predicted = run_estimate(spec, simulate_missing=False)
        if predicted is None or predicted <= 0:
            return
        with self._lock:
            self._runs = [*self._runs, (predicted, seconds)][-PACE_KEPT:]

    def estimate(
        self,
        spec: RunSpec,
        cache: ResultCache | None = None,
        alone: bool = False,
        simulate_missing: bool = True,
        workers: PoolSource | None = None,
    ) -> tuple[float | None, bool]:
        """``(seconds, measured)``: the Run's seconds (:func:`run_estimate`, what ``cache`` holds not run again; its
        one run ``alone``; its simulations made in ``workers`` where missing, or, with ``simulate_missing`` False,
        None seconds), scaled by this server's Runs of a like size when it has measured some; None seconds where the
        device's speed is unknown."""
        predicted = run_estimate(spec, cache, alone, simulate_missing, workers)
        if not predicted:
            return predicted, False
        # The size a Run is compared by: all of it, as recorded.
        whole = run_estimate(spec, simulate_missing=simulate_missing, workers=workers) or predicted
        with self._lock:
            alike = [(p, m) for p, m in self._runs if whole / PACE_ALIKE <= p <= whole * PACE_ALIKE]
        if not alike:
            return predicted, False
        return predicted * sum(m for _, m in alike) / sum(p for p, _ in alike), True

    def clear(self) -> None:
        with self._lock:
            self._runs = []


PACE = Pace()  # process-wide: every session's estimate learns from every run this server measured


def run_queued(
    spec: RunSpec,
    *,
    load: Loader = build_for_key,
    progress: Progress | None = None,
    on_wait: OnWait | None = None,
    queue: DeviceQueue = DEVICE_QUEUE,
    cache: ResultCache = RESULTS,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    should_stop: ShouldStop | None = None,
    owner: str | None = None,
    limit_s: float | None = None,
    workers: WorkerPool | None = None,
    sharing: WorkerPool | None = None,
    memory_cap_bytes: int | None = None,
) -> LabRun:
    """Measure ``spec`` and its checkpointing-off reference, one run on the device at a time.

    Results already measured for the same spec in this process are reused without
    queueing. The model is built inside the turn, so its allocation cannot disturb
    another session's measurement.

    Args:
        spec: what to run.
        load: builds (or returns a cached) model for a :func:`model_key`.
        progress: ``(message, fraction)`` as the runs move on.
        on_wait: called with the number of runs ahead while waiting for the device.
        queue: the device queue (tests pass their own).
        cache: where results are kept and looked up.
        timeout: seconds to wait for the device at most.
        should_stop: asked while waiting and while running (a participant's Cancel).
        owner: who asks, one place in the queue each (:meth:`DeviceQueue.turn`).
        limit_s: seconds the turn may hold the device; then the run is stopped (``None``: no limit).
        workers: measure in this pool's worker process (:mod:`.workers`; the app's), not in this
            thread: ``load`` is then not used (the worker builds and keeps its own model), and at the
            limit the worker is killed rather than asked to stop, so no turn outlasts ``limit_s``.
        sharing: the pool whose jobs (simulations) run on the same cores: a CPU run timed while one of
            them ran says so (``TimingResult.shared_cores``, a busy verdict).
        memory_cap_bytes: with ``workers``, the resident memory the worker may reach before it is killed.

    Returns:
        A :class:`LabRun`; ``run.result.status == "does_not_fit"`` when the step ran out of memory.

    Raises:
        SpecError, ModelLoadError, DoesNotFitError: for bad input, before anything queues or runs.
        DeviceBusyError: the device stayed busy for ``timeout`` seconds.
        SupersededError: a newer request of the same ``owner`` took this one's place in the line.
        RunStoppedError: ``should_stop`` answered True, or the run held the device for ``limit_s``;
            the memory it took is given back first.
    """
    started = time.monotonic()
    report = progress or (lambda message, fraction: None)
    checked = check_spec(spec)
    refuse_beyond_machine(checked)
    reference, full = reference_spec(spec), plain_spec(spec)
    run, base, plain = (_cached(cache, one) for one in (spec, reference, full))
    wait_s = 0.0
    if run is None or (_wants_reference(spec, run) and (base is None or (full is not None and plain is None))):
        report(Fact("progress.waiting"), 0.0)
        queued_at = time.monotonic()
        with queue.turn(on_wait=_asking(on_wait, should_stop), timeout=timeout, label=_label(spec), owner=owner):
            wait_s = time.monotonic() - queued_at
            stop = TurnStopper(should_stop, limit_s)
            # Look again: another session may have measured these while this one waited.
            run, base, plain = (_cached(cache, one) for one in (spec, reference, full))
            count = (run is None) + (spec.checkpointing and ((base is None) + (full is not None and plain is None)))
            done = 0
            if count:  # a worker's first words come after it has started and imported torch: seconds on an idle server
                report(building_fact(checked.info), 0.0)  # said the moment it has the device, not "waiting"
            try:
                if run is None:
                    run = cache.put(
                        _measured(spec, load, scaled(report, done, count), stop, workers, sharing, memory_cap_bytes)
                    )
                    done += 1
                if base is None and _wants_reference(spec, run):
                    report_base = scaled(report, done, count, Fact("progress.reference"))
                    base = cache.put(_measured(reference, load, report_base, stop, workers, sharing, memory_cap_bytes))
                    done += 1
                if full is not None and plain is None and _wants_reference(spec, run):
                    report_plain = scaled(report, done, count, Fact("progress.plain"))
                    plain = cache.put(_measured(full, load, report_plain, stop, workers, sharing, memory_cap_bytes))
                # The whole Run the estimate predicts, none of it reused: what this server's pace is learnt from.
                if count == len(run_parts(spec)):
                    PACE.record(spec, time.monotonic() - queued_at - wait_s)
            except RunStoppedError as error:
                # A worker killed for memory says so (its cap, in the participant's language): only a stop this
                # turn asked for (a cancel, the time limit) is worded as the turn's own reason.
                if error.key == "job.memory_cap" or not stop():
                    raise
                raise stop.reason() from None
            finally:
                give_back_memory()  # before the next turn measures from its baseline
    if not spec.checkpointing:
        base = run  # the run is its own reference
    comparison = None
    if base is not None and run.result.status == "ok" and base.result.status == "ok":
        comparison = compare(run.result, base.result)
    report(DONE, 1.0)
    return LabRun(
        run=run,
        reference=base,
        comparison=comparison,
        wait_s=wait_s,
        elapsed_s=time.monotonic() - started,
        plain=plain,
    )


def give_back_memory() -> None:
    """Return what the last run freed to the device and the operating system.

    A collection frees what the run's reference cycles still held; CUDA's cache goes back
    to the driver. On the CPU, glibc keeps freed heap pages, so a server's resident memory
    would stay at the largest run's high-water mark; ``malloc_trim(0)`` hands them back
    (30 runs of 8 browser sessions: see benchmarks/workshop_load.py).
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only (not musl, not macOS)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


def phase_significant(run: RunResult, reference: RunResult, phase: str) -> bool | None:
    """The verdict of :func:`ckptlab.results.judge_time` on one phase: True when measurable, False within the noise.

    Args:
        run, reference: measured results.
        phase: "forward", "backward" or "step".

    Returns:
        None, no judgement, when either run has fewer than ``MIN_SAMPLES_TO_JUDGE`` timed steps.
    """
    verdict = judge_time(getattr(run.timing, f"{phase}_samples"), getattr(reference.timing, f"{phase}_samples"))
    return None if verdict.judgement is Judgement.TOO_FEW else verdict.measurable


def _cached(cache: ResultCache, spec: RunSpec | None) -> Measured | None:
    found = None if spec is None else cache.get(spec)
    return None if found is None else replace(found, reused=True)


def _wants_reference(spec: RunSpec, run: Measured) -> bool:
    return spec.checkpointing and run.result.status == "ok"


def _measured(
    spec: RunSpec,
    load: Loader,
    report: Progress,
    stop: TurnStopper,
    workers: WorkerPool | None,
    sharing: WorkerPool | None,
    memory_cap_bytes: int | None,
) -> RunResult:
    """One measurement of a turn: in this thread, or in a worker process killed at the turn's deadline."""
    if workers is None:
        return _measure_one(spec, load, report, stop)
    started = time.monotonic()
    remaining = None if stop.deadline is None else max(0.0, stop.deadline - started)
    result: RunResult = workers.run(
        "ckptlab.lab.workerjobs:measure_spec",
        spec,
        progress=report,
        should_stop=stop.asked,
        limit_s=remaining,
        on_limit=stop.reason,
        memory_cap_bytes=memory_cap_bytes,
    )
    shared = sharing is not None and sharing.ran_between(started, time.monotonic())
    if shared and result.timing is not None and result.device == "cpu":
        result = replace(result, timing=replace(result.timing, shared_cores=True))
    return result


def _measure_one(spec: RunSpec, load: Loader, report: Progress, stop: ShouldStop | None = None) -> RunResult:
    try:
        model, info = load(model_key(spec))
    except torch.OutOfMemoryError as error:
        raise DoesNotFitError(
            key="model.build_out_of_memory", model=spec.model, device=spec.device, error=str(error)
        ) from None
    # A session stopped mid-step can leave gradients on the shared model; they would count as baseline.
    model.zero_grad(set_to_none=True)
    return measure(spec, model=model, info=info, progress=report, should_stop=stop)


class TurnStopper:
    """``should_stop`` for a turn: the caller's own answer, or the time limit reached; and which it was."""

    def __init__(self, asked: ShouldStop | None, limit_s: float | None) -> None:
        self.asked, self.limit_s = asked, limit_s
        self.deadline = None if limit_s is None else time.monotonic() + limit_s

    def __call__(self) -> bool:
        return (self.asked is not None and self.asked()) or self.timed_out()

    def timed_out(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def reason(self) -> RunStoppedError:
        if self.timed_out():
            assert self.limit_s is not None
            return time_limit_error(self.limit_s)
        return RunStoppedError(key="run.cancelled")


def time_limit_error(limit_s: float) -> RunStoppedError:
    """A run (a sweep's row) stopped at the server's limit per run."""
    return RunStoppedError(key="run.time_limit", seconds=limit_s)


def _asking(on_wait: OnWait | None, should_stop: ShouldStop | None) -> OnWait | None:
    """``on_wait`` that first asks ``should_stop``: a Cancel while queued gives the place back."""
    if should_stop is None:
        return on_wait

    def ask_then_report(ahead: int) -> None:
        if should_stop():
            raise RunStoppedError(key="run.cancelled_waiting")
        if on_wait is not None:
            on_wait(ahead)

    return ask_then_report


def _label(spec: RunSpec) -> str:
    lora = f" lora={spec.lora_rank}" if spec.lora_rank else ""
    return f"{spec.model} seq {spec.seq_len} x{spec.batch_size} {Setting.of(spec).key} {spec.optimizer}{lora}"
