"""One real training step, run and measured: the core of the lab.

``measure(spec)`` builds (or takes) the model, enables checkpointing through transformers'
own ``activation_checkpointing_enable``, wraps it in LoRA adapters when the spec asks
(``ckptlab.model.lora``), and runs real training steps on random tokens: forward, backward,
``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)`` (``ckptlab.step.training``;
``optimizer="none"`` stops after the backward):

1. ``spec.warmup`` untimed steps (the first backward is slow everywhere, and the first
   ``optimizer.step()`` allocates the optimizer's state, so later steps start from the
   steady state a real run is in);
2. ``spec.repeats`` timed steps with the light :class:`~ckptlab.step.probe.LayerProbe` attached,
   whose per-layer counts must repeat the plan on every step;
3. one observed step for memory: baseline before the forward, resident after it, the
   peak and the stretch of the step where it was reached, and the bytes autograd saved
   per layer. On the CPU it runs under MemTracker, which is too slow to time (see
   ``ckptlab.step.memory_meters``), hence a step of its own.

What is checked and built before (the device, the dtype, the spec against its model) is
``ckptlab.step.preflight``; one training step and its timing, shared with the sweep's
rounds, is ``ckptlab.step.trainstep``.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from transformers import PreTrainedModel

from ..errors import SpecError, expect_type
from ..fact import Fact
from ..model.attention import attention_notes, use_attention
from ..model.catalog import ModelInfo
from ..model.lora import adapted
from ..model.plan import (
    Role,
    checkpointable_layers,
    nested_in,
    observed_roles,
    only_first_layer_notes,
    planned_roles,
    rerun_inside,
    rerun_roles,
)
from ..model.quantize import quantization_notes
from ..model.selective import enable_checkpointing
from ..results import LayerResult, MemoryResult, Region, RunResult, Status
from ..spec import RunSpec
from ..torchstate import exclusive, measuring_threads
from .clocks import clock_for
from .machine_load import machine_load
from .memory_meters import TrackerMeter, meter_for
from .modelstate import ModelState
from .opcount import WorkCounter
from .preflight import check_spec, load_model
from .probe import LayerCounts, LayerProbe, StepRecorder
from .provenance import model_summary, provenance_for
from .selective import selective_notes
from .stopping import DONE, Progress, ShouldStop, checked, logged, stoppable
from .torch_workarounds import LogitsShape, TraceSink
from .training import Recipe, check_optimizer_runs, optimizer_state_bytes
from .trainstep import Batch, check_repeatable, random_batch, timing_result, train_step

OFFLOAD_ON_CPU_NOTE = Fact("note.offload_on_cpu")


@exclusive  # process-wide torch state: ckptlab.torchstate
def measure(
    spec: RunSpec,
    *,
    model: PreTrainedModel | None = None,
    info: ModelInfo | None = None,
    progress: Progress | None = None,
    should_stop: ShouldStop | None = None,
    timed: bool = True,
) -> RunResult:
    """Run ``spec`` for real and measure it.

    Args:
        spec: what to run.
        model: an already built model for ``spec.model`` on the spec's device and dtype,
            from :func:`load_model` (the app caches them); built here when ``None``. It is
            given back as it came: training flags, checkpointing flags and hooks restored,
            its gradients set to None.
        info: the catalog's description of that model (required with ``model``).
        progress: called with a message and the fraction done as the run moves on; each message is also
            logged at INFO on the ``ckptlab.progress`` logger (silent unless logging shows INFO).
        should_stop: asked between steps and at every checkpointable layer's forward and
            rerun; when it answers True the run ends with :class:`RunStoppedError`
            (``ckptlab.step.stopping``), the model given back as it came.
        timed: False skips the timed steps (``timing`` is None): the sweep times its settings
            interleaved, round by round (:mod:`ckptlab.step.rounds`), and fills it in. At least
            one untimed step still runs first, so the memory step starts from the steady state.

    Returns:
        A :class:`RunResult`; ``status == "does_not_fit"`` when the step ran out of memory
        (the memory is released and the process can run the next spec).

    Raises:
        SpecError, ModelLoadError, DoesNotFitError: for bad input, before anything heavy runs.
        RunStoppedError: ``should_stop`` answered True.
    """
    expect_type("ckptlab.measure", "spec", spec, RunSpec, "ckptlab.measure(ckptlab.RunSpec(model='tiny-llama'))")
    report = checked(logged(progress), should_stop)
    if model is None:
        ready = check_spec(spec)
        model, info = load_model(ready, progress=report)
    elif info is None:
        raise SpecError(key="api.measure_model_without_info")
    else:
        ready = check_spec(spec, info)
    spec, device, dtype = ready.spec, ready.device, ready.dtype  # the spec with its folder's quantization
    bits = (
        8 if getattr(model, "is_loaded_in_8bit", False) else 4 if getattr(model, "is_loaded_in_4bit", False) else None
    )
    if (spec.quantization and spec.quantization.bits) != bits:
        raise SpecError(key="api.measure_model_quantization")
    check_optimizer_runs(spec, device_type=device.type)
    state = ModelState.capture(model)  # a model passed in goes back as it came (ckptlab.step.modelstate)
    try:
        # The threads the app's device worker measures with (torchstate.thread_plan), put back after; the result says them.
        with stoppable(model, should_stop), measuring_threads():
            return _measure_built(spec, model, info, device, dtype, report, timed)
    except RuntimeError as error:  # torch.OutOfMemoryError is one
        if not isinstance(error, torch.OutOfMemoryError) and "can't allocate memory" not in str(error):
            raise  # not the CPU allocator's out-of-memory either
        return _release_after_oom(spec, model, info, device, dtype, error)
    finally:
        state.restore()


def _measure_built(
    spec: RunSpec,
    model: PreTrainedModel,
    info: ModelInfo,
    device: torch.device,
    dtype: torch.dtype,
    report: Progress,
    timed: bool = True,
) -> RunResult:
    notes: list[Fact] = []
    offload_applies = spec.offload and device.type == "cuda"

    model.train()
    apply_setting(model, spec, device)
    notes += quantization_notes(spec.quantization, spec.checkpointing)
    notes += attention_notes(type(model), model.config, spec.attn_implementation)
    notes += only_first_layer_notes(info.num_layers, spec.every_n_layers)
    planned = planned_roles(info.num_layers, spec.every_n_layers)
    nested = nested_in(model)
    enabled = observed_roles(model)
    batch = random_batch(model, spec, device)
    with adapted(model, spec.lora_rank, spec.lora_targets) as trained:
        recipe = Recipe.for_spec(spec, trained)
        reruns = rerun_roles(planned, nested)  # what a timed step must rerun, nested layers with their parents
        samples, layer_counts, memory = _run_steps(spec, trained, recipe, batch, device, reruns, notes, report, timed)
        del recipe  # the optimizer's state is the caller's memory no longer

    layers = layer_results(checkpointable_layers(model), planned, enabled, layer_counts, nested)
    notes += reruns_inside_notes(layers)
    memory = _with_offload(memory, layers, offload_applies)
    notes[:0] = offload_notes(spec, memory, layers)
    if not all(layer.as_planned for layer in layers):
        notes.append(plan_mismatch_note(layers))
    notes += selective_notes(spec, layers, offload_applies)
    if spec.alloc_conf:  # the process's allocator measured the step: the setting is what a simulation replays
        notes.append(Fact("note.alloc_conf_not_applied", {"alloc_conf": spec.alloc_conf}))
    report(DONE, 1.0)
    timing = timing_result(clock_for(device).method, samples, spec.optimizer, samples["load"]) if timed else None
    return _result(spec, info, device, dtype, "ok", layers=layers, memory=memory, timing=timing, notes=notes)


def _result(
    spec: RunSpec, info: ModelInfo, device: torch.device, dtype: torch.dtype, status: Status, **fields: Any
) -> RunResult:
    """A measured run's result: what ran, where, and ``fields`` (how it went)."""
    return RunResult(
        spec=spec,
        model=model_summary(info),
        status=status,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        provenance=provenance_for(device),
        **fields,
    )


def apply_setting(model: PreTrainedModel, spec: RunSpec, device: torch.device) -> None:
    """Turn checkpointing on (``spec.every_n_layers``, offload where it applies) or off on ``model``, with transformers' calls."""
    # enable() registers an input-embeddings hook each call and never removes the last one: on a
    # model reused across runs (the app's cache, a sweep) they would pile up. Start clean.
    model.disable_input_require_grads()
    use_attention(model, spec.attn_implementation)  # a model built once serves either attention (ModelState restores)
    if spec.every_n_layers is not None:  # spec.checkpointing
        offload = spec.offload and device.type == "cuda"
        # transformers' call, with the selective policy's context_fn when the spec has one.
        enable_checkpointing(model, spec.every_n_layers, offload, spec.selective)
    else:
        model.activation_checkpointing_disable()


def _run_steps(
    spec: RunSpec,
    model: torch.nn.Module,
    recipe: Recipe,
    batch: Batch,
    device: torch.device,
    planned: Sequence[str],
    notes: list[Fact],
    report: Progress,
    timed: bool = True,
) -> tuple[dict[str, list], list[LayerCounts], MemoryResult]:
    """The warm-up, the timed steps and the memory step of one run on a ready model."""
    warmup = spec.warmup if timed else max(spec.warmup, 1)  # the memory step starts from the steady state
    repeats = spec.repeats if timed else 0
    total_steps = warmup + repeats + 1
    for index in range(warmup):
        said = Fact("progress.warmup_step", {"step": index + 1, "steps": warmup})
        report(said, (index + 0.5) / total_steps)
        train_step(model, batch, probe=None, recipe=recipe)

    clock = clock_for(device)
    probe = LayerProbe(model, track_saved=False)
    samples: dict[str, list] = {"forward": [], "backward": [], "optimizer": []}
    loads = [machine_load()[0]] if timed else []
    with probe.attached():
        for index in range(repeats):
            said = Fact("progress.timed_step", {"step": index + 1, "steps": repeats})
            report(said, (warmup + index + 0.5) / total_steps)
            for phase, seconds in zip(samples, train_step(model, batch, probe, clock=clock, recipe=recipe)):
                samples[phase].append(seconds)
            check_repeatable(probe, planned, notes)
    samples["step"] = [sum(parts) for parts in zip(*samples.values())]
    if timed:
        loads.append(machine_load()[0])
    samples["load"] = loads

    report(Fact("progress.memory_step"), (total_steps - 0.5) / total_steps)
    memory, layer_counts = observe_memory(model, batch, device, recipe)
    return samples, layer_counts, memory


def layer_results(
    modules: Sequence[torch.nn.Module],
    planned: Sequence[Role],
    enabled: Sequence[str],
    counts: list[LayerCounts],
    nested: Sequence[int | None] = (),
) -> list[LayerResult]:
    """One :class:`LayerResult` per checkpointable layer, from the plan, the flags and the probe's counts; ``nested``
    (:func:`~ckptlab.model.plan.nested_in`) marks the keep layers that rerun inside a checkpointed parent's rerun."""
    inside = rerun_inside(planned, nested) if nested else [None] * len(planned)
    return [
        LayerResult(
            index=index,
            name=f"L{index + 1}",
            module=type(module).__name__,
            planned=planned[index],
            enabled=enabled[index],
            forward_calls=count.forward_calls,
            recompute_calls=count.recompute_calls,
            saved_bytes=count.saved_bytes,
            input_bytes=count.input_bytes,
            moe=count.moe,
            router_recompute_calls=count.router_recompute_calls,
            experts_recompute_calls=count.experts_recompute_calls,
            selective=count.selective,
            kept_bytes=count.kept_bytes,
            kept_ops=dict(count.kept_ops),
            rerun_ops=dict(count.rerun_ops),
            reused_ops=dict(count.reused_ops),
            rerun_inside=inside[index],
            attention_bytes=count.attention_bytes,
        )
        for index, (module, count) in enumerate(zip(modules, counts))
    ]


def observe_memory(
    model: torch.nn.Module,
    batch: Batch,
    device: torch.device,
    recipe: Recipe | None = None,
    trace: TraceSink | None = None,
    work: WorkCounter | None = None,
) -> tuple[MemoryResult, list[LayerCounts]]:
    """One step under the device's meter: baseline, resident after the forward, timeline and peak.

    With gradient accumulation, "after the forward" is after the last micro-batch's forward: the
    gradients of the others are held then, as in the rest of the step. A ``trace`` is told every
    change the meter sees (where it follows tensors: ``ckptlab.step.replay``), and ``work`` counts every op
    the meter sees, stretch by stretch of the timeline (``ckptlab.step.opcount``: a simulation's).

    Returns:
        The memory figures, and the probe's per-layer counts (calls, reruns, saved bytes) of that step.
    """
    gc.collect()
    optimizer = recipe.optimizer if recipe is not None else None
    meter = meter_for(model, device, optimizer, logits_shape(model, batch), trace, work)
    with meter.watching():
        baseline = meter.current()
        baseline_breakdown = meter.breakdown()
        recorder = StepRecorder(meter)

        def on_region(region: Region) -> None:
            if work is not None:
                work.enter(region)
            if region.kind == "micro_batch":
                meter.next_micro_batch()
            recorder(region)

        def on_input(index: int, hidden: torch.Tensor) -> None:
            if trace is not None and isinstance(meter, TrackerMeter):  # a trace follows the tracker's storages
                trace.hand_over(meter.storage_names(hidden), index)

        probe = LayerProbe(
            model, on_region=on_region, track_saved=True, on_input=on_input if trace is not None else None
        )
        resident: list[tuple[int, dict[str, int]]] = []  # (bytes, breakdown) after the forward

        def after_forward() -> None:
            if trace is not None:
                trace.after_forward()
            resident.append((meter.current() - baseline, meter.breakdown()))

        with probe.attached():
            train_step(model, batch, probe, after_forward=after_forward, recipe=recipe)
        peak_point = recorder.finish()
    if peak_point is None:  # describe() refuses a model without layers, so a step always has events
        raise RuntimeError("the memory step recorded no event: the probe saw no layer run")
    after_forward_bytes, breakdown_after_forward = resident[-1]
    memory = MemoryResult(
        method=meter.method,
        baseline_bytes=baseline,
        after_forward_bytes=after_forward_bytes,
        peak_bytes=peak_point.region_peak_bytes,
        peak_where=peak_point.region,
        breakdown_after_forward=breakdown_after_forward,
        breakdown_baseline=baseline_breakdown,
        breakdown_at_peak=peak_point.region_peak_breakdown,
        optimizer_state_bytes=optimizer_state_bytes(optimizer, device),
        timeline=list(recorder.timeline),
        logits_bytes_at_peak=peak_point.region_peak_logits_bytes,
    )
    return memory, probe.counts


def logits_shape(model: torch.nn.Module, batch: Batch) -> LogitsShape | None:
    """The float32 logits a step of ``model`` on ``batch`` makes, for a model with a vocabulary; else None."""
    config = getattr(model, "config", None)
    vocab = getattr(config.get_text_config(), "vocab_size", None) if config is not None else None
    input_ids = batch.get("input_ids")
    if not isinstance(vocab, int) or not isinstance(input_ids, torch.Tensor):
        return None
    return LogitsShape(tokens=input_ids.numel(), vocab=vocab)


def reruns_inside_notes(layers: Sequence[LayerResult]) -> list[Fact]:
    """One note per keep layer that reruns inside a checkpointed parent's rerun (transformers' rule, nested)."""
    return [
        Fact("note.reruns_inside", {"layer": layer.name, "parent": f"L{layer.rerun_inside + 1}"})
        for layer in layers
        if layer.rerun_inside is not None
    ]


def plan_mismatch_note(layers: list[LayerResult]) -> Fact:
    """The note of a run whose layers did not do what every_n_layers plans: one row fact per such layer."""
    rows = tuple(
        Fact(
            "note.mismatch_row",
            {"layer": layer.name, "planned": layer.planned, "enabled": layer.enabled, "observed": layer.observed},
        )
        for layer in layers
        if not layer.as_planned
    )
    return Fact("note.plan_mismatch", {"rows": rows})


def _with_offload(memory: MemoryResult, layers: list[LayerResult], applied: bool) -> MemoryResult:
    moved = sum(layer.input_bytes for layer in layers if layer.planned == "CP")
    return replace(memory, offload_bytes=moved, offload_applied=applied)


def offload_notes(spec: RunSpec, memory: MemoryResult | None, layers: Sequence[LayerResult]) -> list[Fact]:
    """The notes of a measured run that asked for offload where it does not apply (the CPU); else none.

    Decided on the fields (``spec.offload``, ``memory.offload_applied``), so a front end that says
    the same in its own words can leave exactly these notes out.
    """
    if not spec.offload or memory is None or memory.offload_applied:
        return []
    cp_layers = sum(layer.planned == "CP" for layer in layers)
    return [
        OFFLOAD_ON_CPU_NOTE,
        Fact("note.offload_would_move", {"bytes": memory.offload_bytes, "layers": cp_layers}),
    ]


# -- out of memory ------------------------------------------------------------------------


def _release_after_oom(
    spec: RunSpec, model: PreTrainedModel, info: ModelInfo, device: torch.device, dtype: torch.dtype, error: Exception
) -> RunResult:
    """Free what the failed step held and report "does not fit" as a result."""
    model.zero_grad(set_to_none=True)
    # The traceback holds the failed step's frames and their tensors: drop it before collecting.
    error.__traceback__ = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        capacity = torch.cuda.get_device_properties(device).total_memory
        where = Fact("memory.cuda_total", {"total": capacity, "name": torch.cuda.get_device_name(device)})
    else:
        where = Fact("memory.this_machine")
    setting = Fact(
        "run.setting_off" if spec.every_n_layers is None else "run.setting_every_n", {"n": spec.every_n_layers}
    )
    reason = Fact(
        "run.does_not_fit",
        {
            "model": info.name,
            "seq_len": spec.seq_len,
            "batch": spec.batch_size,
            "setting": setting,
            "offload": Fact("run.with_offload") if spec.offload else "",
            "where": where,
        },
    )
    return _result(spec, info, device, dtype, "does_not_fit", layers=[], memory=None, timing=None, reason=reason)
