"""Timed steps of several settings on one model, round by round: A B C A B C ... (or in blocks, A A B B C C).

On a shared machine the load comes and goes in bursts. Timed in blocks, a burst that lands on
one setting's block makes that setting look slower (or faster) than the others, and a ratio of
two blocks can even say that recomputing made the step faster. Timed round by round, every
setting takes one step in each round, so a burst hits all of them alike, and the ratio of
medians over the rounds compares like with like. ``benchmarks/timing_order.py`` times the same
settings both ways in one process and prints the spreads side by side; the sweep
(:func:`ckptlab.sweep`) uses the interleaved order.

The settings share one model, one batch and one optimizer (the optimizer's step costs the same
under every checkpointing setting); between steps only transformers' checkpointing flags change
(:func:`ckptlab.step.measure.apply_setting`). Memory is not measured here: each setting's
memory comes from its own observed step (``measure(..., timed=False)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..errors import Option, SpecError, not_one_of
from ..fact import Fact
from ..model.catalog import ModelInfo
from ..model.lora import adapted
from ..model.plan import planned_roles, rerun_roles
from ..results import TimingResult
from ..spec import ORDERS, RECIPE_FIELDS, Order, RunSpec
from ..torchstate import exclusive
from .clocks import Clock, clock_for
from .machine_load import machine_load
from .measure import apply_setting
from .modelstate import ModelState
from .preflight import resolve_device
from .probe import LayerProbe
from .stopping import Progress
from .training import Recipe
from .trainstep import check_repeatable, random_batch, timing_result, train_step

OnStep = Callable[[int, int], None]  # (round, index of the setting) just before each timed step


@dataclass(frozen=True)
class RoundsTiming:
    """The timing of each setting, in the order given, and what a reader must know about each."""

    timings: list[TimingResult | None]  # None for a setting that got no timed step (stopped before its first)
    notes: list[list[Fact]] = field(default_factory=list)  # per setting: plan mismatches seen in a timed step
    rounds_done: int = 0  # complete rounds (every setting timed once) before the end or a stop
    order: Order = "interleaved"


def step_order(settings: int, rounds: int, order: Order = "interleaved") -> list[tuple[int, int]]:
    """``(round, setting)`` of every timed step in the order they run.

    Interleaved: ``(0,0) (0,1) (0,2) (1,0) ...``; blocks: ``(0,0) (1,0) (2,0) (0,1) ...``.
    """
    if order == "interleaved":
        return [(round_, index) for round_ in range(rounds) for index in range(settings)]
    if order == "blocks":
        return [(round_, index) for index in range(settings) for round_ in range(rounds)]
    raise not_one_of("order", order, ORDERS)


@exclusive  # process-wide torch state: ckptlab.torchstate
def time_settings(
    specs: Sequence[RunSpec],
    model: PreTrainedModel,
    info: ModelInfo,
    *,
    order: Order = "interleaved",
    warmup_rounds: int = 0,
    clock: Clock | None = None,
    on_step: OnStep | None = None,
    stopped: Callable[[], bool] | None = None,
    progress: Progress | None = None,
) -> RoundsTiming:
    """Time ``spec.repeats`` steps of each spec on ``model``, in ``order``.

    Args:
        specs: the settings; they must differ only in ``every_n_layers``, ``offload`` and ``selective``
            (same model, shape, dtype, device, optimizer, LoRA and repeats).
        model, info: the built model (given back as it came) and its catalog entry.
        order: "interleaved" (round by round) or "blocks" (each setting's steps together).
        warmup_rounds: untimed rounds of every setting first, in the same order.
        clock: the clock to time with (default: the device's; tests pass a fake one).
        on_step: called with ``(round, setting)`` before each timed step.
        stopped: checked before each timed step; True ends the timing with what was timed.
        progress: ``(message, fraction)``.

    Raises:
        SpecError: settings that differ in more than checkpointing, or none.
    """
    if not specs:
        raise SpecError(key="api.no_settings_to_time")
    first = specs[0]
    for spec in specs:
        spec.validate()
        if _shared(spec) != _shared(first):
            raise SpecError(
                key="api.settings_differ",
                every_n_layers=Option("every_n_layers"),
                offload=Option("offload"),
                selective=Option("selective"),
                spec=spec,
                first=first,
            )
    report = progress or (lambda message, fraction: None)
    device = resolve_device(first.device)
    clock = clock or clock_for(device)
    # What each timed step must rerun: a keep layer nested in a checkpointed one reruns with it (as measure's).
    planned = [rerun_roles(planned_roles(info.num_layers, spec.every_n_layers), info.nested_in) for spec in specs]
    samples: list[dict[str, list[float]]] = [{"forward": [], "backward": [], "optimizer": []} for _ in specs]
    notes: list[list[Fact]] = [[] for _ in specs]
    steps = step_order(len(specs), first.repeats, order)
    state = ModelState.capture(model)
    loads: list[float | None] = []
    try:
        model.train()
        apply_setting(model, first, device)
        batch = random_batch(model, first, device)
        with adapted(model, first.lora_rank, first.lora_targets) as trained:
            recipe = Recipe.for_spec(first, trained)
            for round_, index in step_order(len(specs), warmup_rounds, order):
                said = Fact("progress.warmup_round", {"round": round_ + 1, "rounds": warmup_rounds})
                report(said, 0.0)
                apply_setting(model, specs[index], device)
                train_step(trained, batch, None, recipe=recipe)
            probe = LayerProbe(trained, track_saved=False)
            loads.append(machine_load()[0])
            with probe.attached():
                for done, (round_, index) in enumerate(steps):
                    if stopped is not None and stopped():
                        break
                    said = Fact("progress.timed_round", {"round": round_ + 1, "rounds": first.repeats})
                    report(said, done / len(steps))
                    apply_setting(model, specs[index], device)
                    if on_step is not None:
                        on_step(round_, index)
                    phases = train_step(trained, batch, probe, clock=clock, recipe=recipe)
                    for phase, seconds in zip(samples[index], phases):
                        samples[index][phase].append(seconds)
                    check_repeatable(probe, planned[index], notes[index])
            loads.append(machine_load()[0])
            del recipe
    finally:
        state.restore()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    timings: list[TimingResult | None] = []
    for spec, timed in zip(specs, samples):
        if not timed["forward"]:
            timings.append(None)
            continue
        timed["step"] = [sum(parts) for parts in zip(timed["forward"], timed["backward"], timed["optimizer"])]
        timings.append(timing_result(clock.method, timed, spec.optimizer, loads))
    rounds_done = min(len(timed["forward"]) for timed in samples)
    return RoundsTiming(timings=timings, notes=notes, rounds_done=rounds_done, order=order)


def _shared(spec: RunSpec) -> tuple:
    """What settings timed together must share."""
    return (
        spec.model,
        spec.seq_len,
        spec.batch_size,
        spec.dtype,
        spec.device,
        spec.seed,
        spec.optimizer,
        spec.lora_rank,
        spec.lora_targets,
        spec.repeats,
        spec.world_size,
        *(getattr(spec, name) for name in RECIPE_FIELDS),
    )
