"""One training step and the loop that times it: what a measured run and the sweep's rounds share.

:func:`train_step` runs forward (with the loss), backward and the optimizer's step on a
:func:`random_batch`, timed by a clock when one is given; :func:`timing_result` turns the
timed steps into a :class:`~ckptlab.results.TimingResult`, and :func:`check_repeatable` says
when a timed step did not rerun exactly the planned layers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import overload

import torch
from transformers import PreTrainedModel

from ..message import Message
from ..results import TimingResult, median
from ..spec import RunSpec
from .meters import Clock, machine_load
from .probe import LayerProbe

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
    optimizer: torch.optim.Optimizer | None = None,
) -> tuple[float, float, float]: ...


@overload
def train_step(
    model: torch.nn.Module,
    batch: Batch,
    probe: LayerProbe | None,
    *,
    clock: None = None,
    after_forward: Callable[[], None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> None: ...


def train_step(
    model: torch.nn.Module,
    batch: Batch,
    probe: LayerProbe | None,
    *,
    clock: Clock | None = None,
    after_forward: Callable[[], None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> tuple[float, float, float] | None:
    """One training step: forward (with the loss), backward, and the optimizer's step when there is one.

    Leaves no gradients behind (``zero_grad(set_to_none=True)``, as a training loop does).

    Returns:
        (forward, backward, optimizer) seconds when a clock is given (optimizer 0.0 without one), else None.
    """
    if probe is not None:
        probe.begin_step()
    start = clock.mark() if clock else None
    loss = model(**batch).loss  # only the loss outlives the forward, as in a training loop
    forward_end = clock.mark() if clock else None
    if after_forward is not None:
        after_forward()
    if probe is not None:
        probe.set_phase("backward")
    loss.backward()
    backward_end = clock.mark() if clock else None
    del loss
    if optimizer is not None:
        if probe is not None:
            probe.set_phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    optimizer_end = clock.mark() if clock else None
    if probe is not None:
        probe.end_step()
    model.zero_grad(set_to_none=True)
    if clock is None:
        return None
    optimizer_s = clock.seconds(backward_end, optimizer_end) if optimizer is not None else 0.0
    return clock.seconds(start, forward_end), clock.seconds(forward_end, backward_end), optimizer_s


def timing_result(
    method: str, samples: dict[str, list[float]], optimizer: str, loads: list[float | None]
) -> TimingResult:
    """A :class:`TimingResult` from the per-phase samples (``forward``, ``backward``, ``optimizer``, ``step``)
    and the load averages read around the timed steps."""
    known = [load for load in loads if load is not None]
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
        load_average=max(known) if known else None,
        cores=machine_load()[1],
    )


def check_repeatable(probe: LayerProbe, planned: Sequence[str], notes: list[str]) -> None:
    """Every timed step must rerun exactly the planned layers; say so loudly when one does not."""
    reran = ["CP" if counts.recompute_calls else "keep" for counts in probe.counts]
    if reran != list(planned):
        note = Message(
            f"PLAN MISMATCH in a timed step: reruns observed {reran}, planned {planned}",
            key="note.plan_mismatch_timed",
            params={"reran": str(reran), "planned": str(list(planned))},
        )
        if note not in notes:
            notes.append(note)
