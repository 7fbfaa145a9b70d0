"""What the lab's Run button does: a measured run and its checkpointing-off baseline, queued and reused.

:func:`run_queued` is the one core call behind the page. It validates the spec before
queueing (bad input never waits), takes a turn on the device (:mod:`ckptlab.lab.runqueue`),
measures the spec and, once per shape, the same run with checkpointing off, and keeps
both in a process-wide :class:`ResultCache`, so a second participant asking for the same
settings gets the first one's numbers at once, labelled as reused.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import torch
from transformers import PreTrainedModel

from ..errors import DoesNotFitError
from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.lora import linear_module_names
from ..results import Comparison, Judgement, RunResult, compare, judge_time
from ..spec import RunSpec
from ..step.equivalence import GradientCheck, check_gradients
from ..step.measure import Progress, load_model, measure, resolve_device, resolve_dtype, validate_for_model
from .runqueue import DEFAULT_TIMEOUT_S, DEVICE_QUEUE, DeviceQueue, OnWait

ModelKey = tuple[str, str, str, int]  # (model, resolved dtype, resolved device, seed)
Loader = Callable[[ModelKey], tuple[PreTrainedModel, ModelInfo]]

CACHE_SIZE = 512  # results are a few KiB each

# For the warning before a real-shape model runs on the CPU: qwen3-0.6b (596M parameters),
# seq 128, fp32, 2 CPU cores took 39 s a step, about 6 x parameters x tokens / 12e9.
CPU_FLOP_PER_S = 12e9
MEMORY_STEP_COST = 3  # the MemTracker step costs about this many plain steps


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
    baseline: Measured | None  # same model and shape with checkpointing off; None if the run itself did not fit
    comparison: Comparison | None  # run against baseline, when both have measurements
    wait_s: float  # seconds spent waiting for the device
    elapsed_s: float  # seconds from the call to the answer, waiting included

    @property
    def result(self) -> RunResult:
        return self.run.result


class ResultCache:
    """Results by :class:`RunSpec`, shared by all sessions, least recently used dropped first."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[RunSpec, Measured] = OrderedDict()

    def get(self, spec: RunSpec) -> Measured | None:
        with self._lock:
            found = self._items.get(spec)
            if found is not None:
                self._items.move_to_end(spec)
            return found

    def put(self, result: RunResult) -> Measured:
        measured = Measured(result, datetime.now(timezone.utc), reused=False)
        with self._lock:
            self._items[result.spec] = measured
            self._items.move_to_end(result.spec)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return measured

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


RESULTS = ResultCache()


def baseline_spec(spec: RunSpec) -> RunSpec:
    """The same run with checkpointing off: the reference every run is compared with."""
    return replace(spec, every_n_layers=None, offload=False)


def model_key(spec: RunSpec) -> ModelKey:
    """What identifies a built model: "auto" resolved, so "auto" and "cpu" share one model on a CPU machine."""
    device = resolve_device(spec.device)
    return spec.model, str(resolve_dtype(spec.dtype, device)).removeprefix("torch."), device.type, spec.seed


def build_for_key(key: ModelKey) -> tuple[PreTrainedModel, ModelInfo]:
    """Build the model for a :func:`model_key` (the default loader; the app wraps it in a cache)."""
    name, dtype, device, seed = key
    # seq_len=1: the model is shared by every sequence length; each run's length is checked by measure.
    return load_model(RunSpec(model=name, dtype=dtype, device=device, seed=seed, seq_len=1))


def check(spec: RunSpec) -> ModelInfo:
    """Validate ``spec`` against itself and its model without building anything.

    Raises:
        SpecError, ModelLoadError: naming the bad value and the fix.
    """
    spec.validate()
    resolve_device(spec.device)
    info = catalog.describe(spec.model)
    validate_for_model(spec, info)
    return info


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
) -> GradientCheck:
    """:func:`ckptlab.step.equivalence.check_gradients` in a turn of the device queue (two more steps).

    It builds its own two models (dropout on), so the app's cached model is not touched.

    Raises:
        SpecError, ModelLoadError: for bad input, before anything waits.
        DeviceBusyError: the device stayed busy for ``timeout`` seconds.
    """
    check(spec)
    with queue.turn(on_wait=on_wait, timeout=timeout, label=f"gradient check {_label(spec)}"):
        return check_gradients(spec)


def cpu_estimate(spec: RunSpec, info: ModelInfo) -> tuple[float, float]:
    """Predicted seconds of one step and of the whole Run on a CPU (a formula, not a measurement).

    Args:
        spec: the settings.
        info: the model's description.

    Returns:
        ``(step_s, run_s)``: one training step at about ``6 x parameters x tokens`` FLOP
        (a third more with checkpointing's rerun), and the Run's warm-up, timed and memory
        steps, with its checkpointing-off baseline.
    """
    tokens = spec.seq_len * spec.batch_size
    step_s = 6 * info.num_params * tokens / CPU_FLOP_PER_S
    if spec.checkpointing:
        step_s *= 4 / 3
    steps = spec.warmup + spec.repeats + MEMORY_STEP_COST
    run_s = step_s * steps
    if spec.checkpointing:
        run_s += step_s * 3 / 4 * steps
    return step_s, run_s


def run_queued(
    spec: RunSpec,
    *,
    load: Loader = build_for_key,
    progress: Progress | None = None,
    on_wait: OnWait | None = None,
    queue: DeviceQueue = DEVICE_QUEUE,
    cache: ResultCache = RESULTS,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> LabRun:
    """Measure ``spec`` and its checkpointing-off baseline, one run on the device at a time.

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

    Returns:
        A :class:`LabRun`; ``run.result.status == "does_not_fit"`` when the step ran out of memory.

    Raises:
        SpecError, ModelLoadError, DoesNotFitError: for bad input, before anything runs.
        DeviceBusyError: the device stayed busy for ``timeout`` seconds.
    """
    started = time.monotonic()
    report = progress or (lambda message, fraction: None)
    check(spec)
    reference = baseline_spec(spec)
    run, base = _cached(cache, spec), _cached(cache, reference)
    wait_s = 0.0
    if run is None or (base is None and _wants_baseline(spec, run)):
        report("waiting for the device", 0.0)
        queued_at = time.monotonic()
        with queue.turn(on_wait=on_wait, timeout=timeout, label=_label(spec)):
            wait_s = time.monotonic() - queued_at
            # Look again: another session may have measured these while this one waited.
            run, base = _cached(cache, spec), _cached(cache, reference)
            count = (run is None) + (base is None and spec.checkpointing)
            done = 0
            if run is None:
                run = cache.put(_measure_one(spec, load, _scaled(report, done, count, "")))
                done += 1
            if base is None and _wants_baseline(spec, run):
                prefix = "checkpointing off (baseline): "
                base = cache.put(_measure_one(reference, load, _scaled(report, done, count, prefix)))
    if not spec.checkpointing:
        base = run  # the run is its own baseline
    comparison = None
    if base is not None and run.result.status == "ok" and base.result.status == "ok":
        comparison = compare(run.result, base.result)
    report("done", 1.0)
    return LabRun(run=run, baseline=base, comparison=comparison, wait_s=wait_s, elapsed_s=time.monotonic() - started)


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


def _cached(cache: ResultCache, spec: RunSpec) -> Measured | None:
    found = cache.get(spec)
    return None if found is None else replace(found, reused=True)


def _wants_baseline(spec: RunSpec, run: Measured) -> bool:
    return spec.checkpointing and run.result.status == "ok"


def _measure_one(spec: RunSpec, load: Loader, report: Progress) -> RunResult:
    try:
        model, info = load(model_key(spec))
    except torch.OutOfMemoryError as error:
        raise DoesNotFitError(
            f"{spec.model} does not fit on {spec.device}: building it ran out of memory ({error}). "
            "Pick a smaller model, or free the device."
        ) from None
    # A session stopped mid-step can leave gradients on the shared model; they would count as baseline.
    model.zero_grad(set_to_none=True)
    return measure(spec, model=model, info=info, progress=report)


def _scaled(report: Progress, index: int, count: int, prefix: str) -> Progress:
    def scaled(message: str, fraction: float) -> None:
        report(prefix + message, (index + fraction) / count)

    return scaled


def _label(spec: RunSpec) -> str:
    setting = "off" if spec.every_n_layers is None else f"n={spec.every_n_layers}"
    lora = f" lora={spec.lora_rank}" if spec.lora_rank else ""
    return f"{spec.model} seq {spec.seq_len} x{spec.batch_size} {setting}{' offload' if spec.offload else ''} {spec.optimizer}{lora}"
