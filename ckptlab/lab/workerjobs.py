"""What a worker process runs (:mod:`.workers`): the app's jobs as functions of a :class:`JobContext` and plain data.

Each function is named to :meth:`WorkerPool.run` as ``"ckptlab.lab.workerjobs:<name>"`` and
takes only what pickles (specs, requests, results), so nothing of the server process (its
threads, its caches, its torch state) reaches the job. The measuring worker keeps the last
model it built, as the app's loader did in the server process: a second run of the same model
and dtype does not rebuild it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from transformers import PreTrainedModel

from ..explore.gpu_search import GpuSearch, cheapest_that_fits
from ..explore.longest import LongestTable, longest_table
from ..explore.scale import ScaleRequest, ScaleTable, scale_table
from ..explore.sweep import SweepResult, SweepSpec, sweep
from ..model.catalog import ModelInfo, describe
from ..results import RunResult
from ..spec import RunSpec, Setting
from ..step.equivalence import GradientCheck, check_gradients
from ..step.measure import measure
from ..step.simulate import simulate
from ..step.table import simulate_table
from .run import ModelKey, build_for_key, give_back_memory, model_key
from .workers import JobContext

_MODEL: dict[ModelKey, tuple[PreTrainedModel, ModelInfo]] = {}  # the worker's last model (one: bounded memory)
_MODEL_LOCK = threading.Lock()


def _load(spec: RunSpec) -> tuple[PreTrainedModel, ModelInfo]:
    key = model_key(spec)
    with _MODEL_LOCK:
        if key not in _MODEL:
            _MODEL.clear()  # the previous model goes before the next is built
            give_back_memory()
            _MODEL[key] = build_for_key(key)
        model, info = _MODEL[key]
    model.zero_grad(set_to_none=True)  # a stopped run can leave gradients that would count as baseline
    return model, info


def measure_spec(context: JobContext, spec: RunSpec) -> RunResult:
    """:func:`ckptlab.measure` of ``spec`` on the worker's (cached) model, stoppable, reporting progress."""
    model, info = _load(spec)
    try:
        return measure(spec, model=model, info=info, progress=context.progress, should_stop=context.cancelled)
    finally:
        give_back_memory()


def sweep_spec(
    context: JobContext, spec: SweepSpec, step_seconds: Mapping[RunSpec, float] | None = None
) -> SweepResult:
    """:func:`ckptlab.explore.sweep.sweep`, one device turn per row asked of the parent, rows sent as measured (the
    rows' predicted steps, ``step_seconds``, made in the parent: the worker simulates nothing first)."""
    try:
        return sweep(
            spec,
            step_seconds=step_seconds,
            progress=context.progress,
            cancel=context.cancelled,  # between rows and timed steps; a row in flight ends by the parent's kill
            turn=context.turn,
            on_result=context.collect,
        )
    finally:
        give_back_memory()


def scale_request(
    context: JobContext,
    request: ScaleRequest,
    budget_bytes: int | None,
    gpu: str | None,
    known: Mapping[RunSpec, RunResult] | None,
    info: ModelInfo | None,
) -> ScaleTable:
    """:func:`ckptlab.explore.scale.scale_table` of ``request``, each simulation sent as it is made; with
    ``budget_bytes``, the rows decided on the device total on ``gpu`` (None: a card of the budget's bytes)."""
    return scale_table(
        request.model, request.seq_len, request.batch_size, request.dtype, request.settings,
        progress=context.progress, cancel=context.cancelled, known=known, on_result=context.collect, info=info,
        optimizer=request.optimizer, lora_rank=request.lora_rank, lora_targets=request.lora_targets,
        world_size=request.world_size, gradient_accumulation_steps=request.gradient_accumulation_steps,
        max_grad_norm=request.max_grad_norm, mixed_precision=request.mixed_precision,
        quantization=request.quantization, alloc_conf=request.alloc_conf, budget_bytes=budget_bytes, gpu=gpu,
    )  # fmt: skip


def search_request(
    context: JobContext,
    request: ScaleRequest,
    budget_bytes: int,
    counts: tuple[int, ...],
    gpu: str | None,
    known: Mapping[RunSpec, RunResult] | None,
    info: ModelInfo | None,
) -> GpuSearch:
    """:func:`ckptlab.explore.gpu_search.cheapest_that_fits`, each simulation sent as it is made, decided on what
    nvidia-smi will show on ``gpu`` (None: a card of the budget's bytes)."""
    return cheapest_that_fits(
        request, budget_bytes, counts=counts, known=known, on_result=context.collect,
        progress=context.progress, cancel=context.cancelled, info=info, gpu=gpu,
    )  # fmt: skip


def longest_request(
    context: JobContext,
    request: ScaleRequest,
    budget_bytes: int,
    settings: tuple[Setting, ...],
    gpu: str | None,
    known: Mapping[RunSpec, RunResult] | None,
    info: ModelInfo | None,
) -> LongestTable:
    """:func:`ckptlab.explore.longest.longest_table`, each simulation sent as it is made, decided on what nvidia-smi
    will show on ``gpu`` (None: a card of the budget's bytes)."""
    return longest_table(
        request, budget_bytes, settings, known=known, on_result=context.collect,
        progress=context.progress, cancel=context.cancelled, info=info, gpu=gpu,
    )  # fmt: skip


def describe_model(context: JobContext, name: str) -> ModelInfo:
    """:func:`ckptlab.describe` of a folder or Hub name: the page's description, built (on the meta device) here,
    under the worker's memory cap and time limit, never on the page's own thread."""
    return describe(name)


def simulate_specs(context: JobContext, specs: list[RunSpec]) -> list[RunResult]:
    """:func:`ckptlab.step.table.simulate_table` of ``specs`` (one computation where they share a model and shape),
    reporting progress."""
    return simulate_table(specs, progress=context.progress)


def simulate_allocations(context: JobContext, spec: RunSpec) -> RunResult:
    """:func:`ckptlab.simulate` of ``spec`` with its order of allocations (the caching allocator's replay reads it)."""
    return simulate(spec, progress=context.progress, allocations=True)


def gradients_spec(context: JobContext, spec: RunSpec) -> GradientCheck:
    """:func:`ckptlab.step.equivalence.check_gradients` of ``spec`` (it builds its own two models)."""
    try:
        return check_gradients(spec)
    finally:
        give_back_memory()
