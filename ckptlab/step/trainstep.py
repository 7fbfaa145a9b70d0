"""One training step and the loop that times it: what a measured run and the sweep's rounds share.

:func:`train_step` runs Trainer's step (micro-batches of forward with the loss and backward, the
gradient norm, the optimizer's step; ``ckptlab.step.training.Recipe``) on a :func:`random_batch`, timed by a clock when one is given; :func:`timing_result` turns the
timed steps into a :class:`~ckptlab.results.TimingResult`, and :func:`check_repeatable` says
when a timed step did not rerun exactly the planned layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

import torch
from accelerate.utils import convert_to_fp32
from transformers import PreTrainedModel

from ..fact import Fact
from ..results import TimingResult, median
from ..spec import RunSpec
from .clocks import Clock
from .machine_load import machine_load
from .probe import LayerProbe
from .training import Recipe

# A training step's keyword arguments for the model: tokens and labels, and use_cache=False where the config has it.
Batch = dict[str, torch.Tensor | bool]


def random_batch(model: PreTrainedModel, spec: RunSpec, device: torch.device) -> Batch:
    """Random tokens (seeded by ``spec.seed``) as inputs and labels, one unpadded sequence per row."""
    generator = torch.Generator().manual_seed(spec.seed)
    input_ids = torch.randint(
        model.config.get_text_config().vocab_size, (spec.batch_size, spec.seq_len), generator=generator
    )
    input_ids = input_ids.to(device)  # (batch, seq)
    batch: Batch = {"input_ids": input_ids, "labels": input_ids}
    if getattr(model.config, "use_cache", None) is not None:
        # Training keeps no KV cache; without this, a run with checkpointing off would hold one.
        batch["use_cache"] = False
    return batch


@overload
def train_step(
    model: torch.nn.Module,
    batch: Batch,
    probe: LayerProbe | None,
    *,
    clock: Clock,
    after_forward: Callable[[], None] | None = None,
    recipe: Recipe | None = None,
) -> tuple[float, float, float]: ...


@overload
def train_step(
    model: torch.nn.Module,
    batch: Batch,
    probe: LayerProbe | None,
    *,
    clock: None = None,
    after_forward: Callable[[], None] | None = None,
    recipe: Recipe | None = None,
) -> None: ...


def train_step(
    model: torch.nn.Module,
    batch: Batch,
    probe: LayerProbe | None,
    *,
    clock: Clock | None = None,
    after_forward: Callable[[], None] | None = None,
    recipe: Recipe | None = None,
) -> tuple[float, float, float] | None:
    """One training step as Trainer runs it: each micro-batch's forward (with the loss) and backward, then the
    gradient norm, the optimizer's step and ``zero_grad`` (``recipe``; None: one forward and backward alone).

    Every micro-batch takes the same ``batch`` (random tokens: the bytes do not depend on their values), its
    loss divided by the number of micro-batches as Trainer divides it; the gradients of one micro-batch stay
    alive through the next. Leaves no gradients behind (``zero_grad(set_to_none=True)``, as Trainer does).

    Args:
        after_forward: called after each micro-batch's forward (the last call sees the gradients of the others).

    Returns:
        (forward, backward, optimizer) seconds when a clock is given, each summed over the micro-batches
        (the optimizer's includes the gradient norm; 0.0 without an optimizer), else None.
    """
    recipe = recipe or Recipe(optimizer=None)
    forward_s = backward_s = 0.0
    if probe is not None:
        probe.begin_step()
    for micro_batch in range(recipe.accumulation):
        if probe is not None and micro_batch:
            probe.begin_micro_batch(micro_batch)
        start = clock.mark() if clock else None
        loss = _forward_loss(model, batch, recipe) / recipe.accumulation
        forward_end = clock.mark() if clock else None
        if after_forward is not None:
            after_forward()
        if probe is not None:
            probe.set_phase("backward")
        (recipe.scaler.scale(loss) if recipe.scaler is not None else loss).backward()
        backward_end = clock.mark() if clock else None
        del loss
        if clock is not None:
            forward_s += clock.seconds(start, forward_end)
            backward_s += clock.seconds(forward_end, backward_end)
    optimizer_start = clock.mark() if clock else None
    _optimizer_step(model, recipe, probe)
    optimizer_end = clock.mark() if clock else None
    if probe is not None:
        probe.end_step()
    model.zero_grad(set_to_none=True)
    if clock is None:
        return None
    optimizer_s = clock.seconds(optimizer_start, optimizer_end) if recipe.optimizer is not None else 0.0
    return forward_s, backward_s, optimizer_s


def _forward_loss(model: torch.nn.Module, batch: Batch, recipe: Recipe) -> torch.Tensor:
    """The forward and its loss; only the loss outlives it, as in a training loop."""
    if recipe.autocast_dtype is None:
        return model(**batch).loss
    device_type = next(model.parameters()).device.type
    # accelerate's wrapping of a model under mixed precision: the forward under autocast, and its outputs back
    # in float32 (accelerate.utils.convert_to_fp32: the half-precision logits are copied once more).
    with torch.autocast(device_type, dtype=recipe.autocast_dtype):
        output = model(**batch)
    return convert_to_fp32(output).loss


def _optimizer_step(model: torch.nn.Module, recipe: Recipe, probe: LayerProbe | None) -> None:
    """Trainer's end of a step: unscale (fp16), the gradient norm (clipping where bounded), the step, zero_grad."""
    optimizer = recipe.optimizer
    if optimizer is None:
        return
    if probe is not None:
        probe.set_phase("grad_norm")
    if recipe.scaler is not None:
        recipe.scaler.unscale_(optimizer)
    assert recipe.clip_bound is not None  # Recipe.for_spec sets it wherever there is an optimizer
    torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_bound)
    if probe is not None:
        probe.set_phase("optimizer")
    if recipe.scaler is not None:
        recipe.scaler.step(optimizer)
        recipe.scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timing_result(
    method: str, samples: dict[str, list[float]], optimizer: str, loads: list[float | None]
) -> TimingResult:
    """A :class:`TimingResult` from the per-phase samples (``forward``, ``backward``, ``optimizer``, ``step``)
    and the load averages read around the timed steps."""
    return TimingResult(
        method=method,
        forward_s=median(samples["forward"]),
        backward_s=median(samples["backward"]),
        optimizer_s=median(samples["optimizer"]),
        step_s=median(samples["step"]),
        forward_samples=samples["forward"],
        backward_samples=samples["backward"],
        optimizer_samples=samples["optimizer"] if optimizer != "none" else [],
        step_samples=samples["step"],
        load_average=max((load for load in loads if load is not None), default=None),
        cores=machine_load()[1],
        threads=torch.get_num_threads(),
    )


def check_repeatable(probe: LayerProbe, planned: Sequence[str], notes: list[Fact]) -> None:
    """Every timed step must rerun exactly the planned layers; say so loudly when one does not. A layer the step
    never ran (a vision tower's on a text batch) has nothing to rerun."""
    reran = ["CP" if counts.recompute_calls else "keep" for counts in probe.counts]
    if len(reran) != len(planned) or any(
        role != want and counts.forward_calls for role, want, counts in zip(reran, planned, probe.counts)
    ):
        note = Fact("note.plan_mismatch_timed", {"reran": str(reran), "planned": str(list(planned))})
        if note not in notes:
            notes.append(note)
