"""Many settings of one model as one computation: what is distinct simulated once, every setting derived.

The settings of an At-scale table differ only in which layers are checkpointed. When the layers are
alike (``ModelInfo.layers_alike``), the replay (:mod:`.replay`) gives a setting from shallow steps,
byte for byte what simulating every layer gives: each kind of stretch of a step (a layer's forward,
backward or rerun by its role, the model's ends) recorded once, in a few shallow steps for the whole
table, and every setting's timeline replayed from them, with the order of its allocations
(:mod:`.replay_order`: what the device total replays through the caching allocator). The At-scale page's eleven settings of a
36-layer model record four steps of 13 layers in all (:func:`_replay_plans`): checkpointing off,
n=1 and its offload twin, and one step of both roles for every other n.

Where the replay's premise fails on the recorded steps, and under FSDP2, a setting is simulated on its own
by ``simulate``'s fold (:mod:`.fold`, exact on the same premise, two shallow steps per setting).
``tests/step/test_replay.py`` compares every replayed figure with simulating every layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import torch

from ..fact import Fact
from ..model.catalog import ModelInfo
from ..model.plan import CP, KEEP, Role, planned_roles
from ..model.selective import NONE
from ..results import RunResult
from ..spec import RunSpec
from ..torchstate import exclusive
from . import replay
from .fold import NotDerivable, Reduction, SimulatedStep
from .simulate import prepare, simulate, simulated_result, simulating_some, simulation_notes
from .stopping import DONE, Progress


class TableSimulation:
    """Simulates settings of models, sharing the recorded shallow steps between them.

    ``result(spec)`` equals ``simulate(spec)`` and, byte for byte, ``simulate(spec, fast=False)``;
    the shallow steps a spec needs are recorded on its first call that needs them and kept for
    the next. Holds the torch state lock for each call, as ``simulate`` does.

    Args:
        planned: the settings the table will be asked for, where known: a group's recorded steps are chosen
            for all of them at once (a step of both roles serves n=1's middle layer too).
    """

    def __init__(self, planned: Iterable[RunSpec] = ()) -> None:
        self._recorded: dict[tuple[RunSpec, tuple[Role, ...]], replay.RecordedStep] = {}  # replay's steps
        self._sources: dict[RunSpec, replay.Sources] = {}  # by group, for as long as its steps are the same
        self._unreplayable: set[RunSpec] = set()  # groups whose recorded steps the replay's premise failed on
        self._planned = list(planned)  # the settings the table will be asked for: a group's steps serve them all
        self.simulated_layers = 0  # layers simulated so far (shallow steps and whole models)

    @exclusive  # process-wide torch state: ckptlab.torchstate
    def result(self, spec: RunSpec, progress: Progress | None = None) -> RunResult:
        """The simulated result of ``spec``, derived from shared shallow steps where that is exact.

        Raises:
            SpecError, ModelLoadError: for bad input.
        """
        report = progress or (lambda message, fraction: None)
        info, dtype, config, task = prepare(spec)
        roles = tuple(planned_roles(info.num_layers, spec.every_n_layers))
        group = _group(spec)
        if not info.layers_alike or len(roles) < 3:
            return self._simulated(spec, info, progress)
        if not spec.fsdp and group not in self._unreplayable:
            try:
                replayed, used = self._replayed(spec, roles, config, task, dtype, report)
            except NotDerivable:
                self._unreplayable.add(group)  # its settings take the fold, each on its own
            else:
                notes = simulation_notes(spec, info, True, config, task)
                notes.append(Fact("note.replayed", {"depths": _depths(used), "layers": info.num_layers}))
                if replayed.allocations is None:  # the bytes composed, the order did not: said, as the fold says
                    notes.append(Fact("note.allocation_order_not_replayed"))
                report(DONE, 1.0)
                return simulated_result(spec, info, dtype, replayed, notes)
        return self._simulated(spec, info, progress)

    def _simulated(self, spec: RunSpec, info: ModelInfo, progress: Progress | None) -> RunResult:
        """``spec`` simulated on its own: folded from two shallow copies where the plan and the layers' kinds repeat
        (:mod:`.fold`), as ``simulate`` folds it."""
        fold = Reduction.for_plan(info.num_layers, spec.every_n_layers, info.layer_period)
        self.simulated_layers += info.num_layers if fold is None else fold.depth(1) + fold.depth(2)
        return simulate(spec, progress=progress)

    def _plans(self, group: RunSpec, depth: int, spec: RunSpec | None = None) -> list[tuple[Role, ...]]:
        """The shallow steps a group's settings (``spec`` and the table's planned ones) are replayed from."""
        wanted = [other for other in [spec, *self._planned] if other is not None and _group(other) == group]
        mixed = any(other.every_n_layers not in (None, 1) for other in wanted)
        return list(
            dict.fromkeys(
                plan
                for other in wanted
                for plan in _replay_plans(planned_roles(depth, other.every_n_layers), mixed_planned=mixed)
            )
        )

    def _replayed(
        self, spec: RunSpec, roles: Sequence[Role], config, task: str, dtype: torch.dtype, report: Progress
    ) -> tuple[SimulatedStep, list[tuple[Role, ...]]]:
        """``spec``'s step replayed (:mod:`.replay`) from its group's recorded steps, recording the missing ones;
        with the plans it was replayed from.

        Raises:
            NotDerivable: the recorded steps do not give the plan.
        """
        group, depth, sized = _group(spec), len(roles), _sized(_group(spec))
        plans = self._plans(group, depth, spec)
        missing = [(group, plan) for plan in plans if (group, plan) not in self._recorded]
        # What grows with the depth needs steps of two depths, of this group or another of its size: one the
        # table will ask for anyway where there is one, else one layer more.
        depths = {len(plan) for (other, plan) in [*self._recorded, *missing] if _sized(other) == sized}
        others = dict.fromkeys(_group(planned) for planned in self._planned if _sized(_group(planned)) == sized)
        later = [(other, plan) for other in others for plan in self._plans(other, depth) if len(plan) not in depths]
        if len(depths) < 2:
            missing.append(later.pop(0) if later else (group, plans[0] + plans[0][-1:]))
            depths.add(len(missing[-1][1]))
        # The order of allocations checks what grows with the depth on a third (replay_order): a step the table
        # records anyway, recorded now rather than later, where there is one.
        third = [(other, plan) for other, plan in later if len(plan) not in depths and (other, plan) not in missing]
        if len(depths) < 3 and third:
            missing.append(third[0])
        for index, (other, plan) in enumerate(missing):
            report(simulating_some(len(plan), depth, index + 1, len(missing)), index / (len(missing) + 1))
            self._recorded[(other, plan)] = replay.record(config, task, other, dtype, plan)
            self.simulated_layers += len(plan)
        own = [step for (other, _), step in self._recorded.items() if other == group]
        same_size = [step for (other, _), step in self._recorded.items() if _sized(other) == sized]
        made = self._sources.get(group)
        if made is None or made.steps != own or made.sized != same_size:  # what they know, made once for the table
            made = self._sources[group] = replay.Sources(own, same_size)
        return replay.derive(spec, roles, made), list(dict.fromkeys(step.roles for step in same_size))


def simulate_table(
    specs: Iterable[RunSpec],
    progress: Progress | None = None,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """``simulate(spec)`` for each spec, as one computation (see the module's docstring).

    Args:
        specs: the settings to simulate, in order (any models; the shallow steps are shared
            between specs that differ only in ``every_n_layers``).
        progress: called with a message and the fraction of the specs done.
        on_result: called with each result as soon as it exists.
    """
    specs = list(specs)
    table = TableSimulation(specs)
    results = []
    for index, spec in enumerate(specs):
        result = table.result(spec, progress=_scaled(progress, index, len(specs)))
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _scaled(progress: Progress | None, index: int, total: int) -> Progress | None:
    return None if progress is None else lambda message, fraction: progress(message, (index + fraction) / total)


def _group(spec: RunSpec) -> RunSpec:
    """The spec of the shallow steps ``spec`` shares: the same in every field but the plan."""
    return replace(spec, every_n_layers=None if spec.every_n_layers is None else 1)


def _sized(group: RunSpec) -> RunSpec:
    """What a group's parameters and optimizer depend on: the figures that grow with the depth are the same for every
    group with the same (checkpointing, offload and a selective policy aside)."""
    return replace(group, every_n_layers=None, offload=False, selective=NONE)


def _replay_plans(roles: Sequence[Role], *, mixed_planned: bool) -> list[tuple[Role, ...]]:
    """The shallow steps :mod:`.replay` replays the plan ``roles`` from: one with its first and last roles and its
    roles present (what the ends depend on), and a layer of each key it has in the middle (:class:`.replay.LayerKey`).

    A plan of one role: two layers of it, the middle's key from its group's step of both roles when the group has
    one or will (``mixed_planned``), else three. Both roles (the first layer checkpointed): CP keep CP keep keep,
    a layer of each key in the middle (the first keep, a CP after a CP, a keep after a keep), and where the last
    layer is checkpointed, CP keep CP for the ends.
    """
    first, last = roles[0], roles[-1]
    if len(set(roles)) == 1:
        return [(first,) * (2 if mixed_planned and first == CP else 3)]
    if first != CP:
        raise NotDerivable("a plan of both roles whose first layer is not checkpointed")
    middle = (CP, KEEP, CP, KEEP, KEEP)
    return [middle] if last == KEEP else [middle, (CP, KEEP, CP)]


def _depths(plans: Sequence[tuple[Role, ...]]) -> str:
    return " + ".join(str(len(plan)) for plan in plans)
