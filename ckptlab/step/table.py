"""Many settings of one model as one computation: what is distinct simulated once, every setting derived.

The settings of an At-scale table differ only in which layers are checkpointed. When the layers are
alike (``ModelInfo.layers_alike``), two derivations give a setting from shallow steps, byte for byte
what simulating every layer gives.

First the replay (:mod:`.replay`): each kind of stretch of a step (a layer's forward, backward or
rerun by its role, the model's ends) recorded once, in a few shallow steps for the whole table, and
every setting's timeline replayed from them. The At-scale page's eleven settings of a 36-layer model
record four steps of 13 layers in all (:func:`_replay_plans`): checkpointing off, n=1 and its offload
twin, and one step of both roles for every other n. Where its premise fails on the recorded steps,
and under FSDP2 (whose first step in a process holds more than the later ones), a group takes the
pairwise derivation that follows.

The pairwise derivation: a layer's events depend on its own role (CP or keep) and
the other layers add to them, each by an amount set by its role and by whether it comes before or
after: what a layer saved in the forward stays until its backward, what its backward left (the
gradients) stays after. The first and the last layer meet the model's ends and keep their own
context. So a plan's step follows from shallow steps with the same first and last layer and one
or two middle layers in each role, ``[first, r, last]`` and ``[first, a, b, last]``:

- an event of a middle layer of role ``r`` is its value in ``[first, r, last]``, plus, for each
  middle layer of role ``a`` before it, what ``[first, a, r, last]`` adds, and for each one of
  role ``b`` after it, what ``[first, r, b, last]`` adds;
- an event outside the middle (the ends, the first and last layer, the figures of the whole step)
  grows by what one middle layer of each role adds.

It is the fold of :mod:`.fold` with two kinds of units instead of one. The shallow steps are
shared by every setting with the same ends and the same other fields (:func:`_group`: the spec but
its plan, so offload, dtype, world size, a selective policy or any field a setting gains later
make groups of their own): the At-scale page's eleven settings of a 36-layer model would cost 12
steps of 3 or 4 layers, 43 layers in all, instead of eleven simulations.

The premise is checked on the shallow steps themselves. With both roles in the middle there are
more steps than unknowns, and every figure outside the middle must add up the same way in all of
them. With one role, the two steps are the fold's (a repeating unit of one layer), exact on the
same premise as ``simulate``'s, so they are not checked, but for one case: a step can hold what
the others do not, and under FSDP2 the first step of a process holds more in its gradient norm
than every later one; there a third, ``[first, r, r, r, last]``, is derived and compared. A failed
check simulates the steps once more; a second failure, like layers that differ or a model of fewer than three layers, makes the
setting simulated instead (layer by layer after a failed check).
``tests/step/test_table.py`` and ``tests/step/test_replay.py`` compare every derived figure with simulating
every layer.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import torch

from ..fact import Fact
from ..model.plan import CP, KEEP, Role, planned_roles
from ..model.selective import NONE
from ..results import LayerResult, MemoryResult, RunResult, TimelinePoint
from ..spec import RunSpec
from ..torchstate import exclusive
from . import replay
from .fold import NotDerivable, SimulatedStep, keys_of, map_figures
from .probe import region_for
from .simulate import prepare, simulate, simulate_depth, simulated_result, simulating_some, simulation_notes
from .stopping import DONE, Progress

# Fields of MemoryResult derived from the timeline, not grown like the others.
# Figures of the peak's moment, read from the derived timeline (not grown): the float32 logits at the peak are the
# loss's, the same at any depth, as in the fold, but only where the derived peak is.
_FROM_TIMELINE = ("timeline", "peak_bytes", "peak_where", "breakdown_at_peak", "logits_bytes_at_peak")


class TableSimulation:
    """Simulates settings of models, sharing the shallow steps between them.

    ``result(spec)`` equals ``simulate(spec)`` and, byte for byte, ``simulate(spec, fast=False)``;
    the shallow steps a spec needs are simulated on its first call that needs them and kept for
    the next. Holds the torch state lock for each call, as ``simulate`` does.

    Args:
        planned: the settings the table will be asked for, where known: a group's recorded steps are chosen
            for all of them at once (a step of both roles serves n=1's middle layer too).
    """

    def __init__(self, planned: Iterable[RunSpec] = ()) -> None:
        self._steps: dict[tuple[RunSpec, tuple[Role, ...]], SimulatedStep] = {}
        self._underivable: set[tuple[RunSpec, Role, Role]] = set()
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
        context = (_group(spec), roles[0], roles[-1])
        if not info.layers_alike or len(roles) < 3:
            self.simulated_layers += info.num_layers
            return simulate(spec, progress=progress)
        if not spec.fsdp and context[0] not in self._unreplayable:
            try:
                replayed, used = self._replayed(spec, roles, config, task, dtype, report)
            except NotDerivable:
                self._unreplayable.add(context[0])  # the pairwise derivation below, on steps of its own
            else:
                notes = simulation_notes(spec, info, fast=True)
                notes.append(Fact("note.replayed", {"depths": _depths(used), "layers": info.num_layers}))
                report(DONE, 1.0)
                return simulated_result(spec, info, dtype, replayed, notes)
        if context in self._underivable:  # its shallow steps are not what a deep model's layers meet
            self.simulated_layers += info.num_layers
            return simulate(spec, fast=False, progress=progress)
        middle = roles[1:-1]
        needed = _shallow_plans(roles[0], sorted(set(middle)), roles[-1], checked=spec.fsdp)
        both = _shallow_plans(roles[0], [CP, KEEP], roles[-1])
        if all((context[0], plan) in self._steps for plan in both):
            needed = both  # simulated for another setting already, and they check each other: no check step
        missing = [plan for plan in needed if (context[0], plan) not in self._steps]
        share = 1 / (len(missing) + 2)  # of this setting's progress: each missing step, then the derivation
        for index, plan in enumerate(missing):
            report(simulating_some(len(plan), info.num_layers), index * share)
            self._simulate_step(config, task, context[0], plan, dtype)
        step = None
        for attempt in range(2):
            try:
                step = derive(roles, {plan: self._steps[(context[0], plan)] for plan in needed})
                break
            except NotDerivable:
                if attempt:
                    break
                # Once more from fresh steps: the first FSDP2 step of a process holds more in its gradient
                # norm than every later one (tiny-llama: 6 MiB, an embedding's size), and disagrees with them.
                for plan in needed:
                    report(simulating_some(len(plan), info.num_layers), (len(missing) + 0.5) * share)
                    self._simulate_step(config, task, context[0], plan, dtype)
        if step is None:
            self._underivable.add(context)
            self.simulated_layers += info.num_layers
            start = (len(missing) + 1) * share
            return simulate(
                spec, fast=False, progress=lambda message, fraction: report(message, start + (1 - start) * fraction)
            )
        notes = simulation_notes(spec, info, fast=True)
        notes.append(Fact("note.derived_from_roles", {"depths": _depths(needed), "layers": info.num_layers}))
        report(DONE, 1.0)
        return simulated_result(spec, info, dtype, step, notes)

    def _simulate_step(self, config, task: str, group: RunSpec, plan: tuple[Role, ...], dtype: torch.dtype) -> None:
        self._steps[(group, plan)] = _simulate_plan(config, task, group, plan, dtype)
        self.simulated_layers += len(plan)

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
        if len(depths) < 2:
            others = dict.fromkeys(_group(planned) for planned in self._planned if _sized(_group(planned)) == sized)
            later = [(other, plan) for other in others for plan in self._plans(other, depth) if len(plan) not in depths]
            missing.append(later[0] if later else (group, plans[0] + plans[0][-1:]))
        for index, (other, plan) in enumerate(missing):
            report(simulating_some(len(plan), depth), index / (len(missing) + 1))
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


def _shallow_plans(
    first: Role, middle_roles: Sequence[Role], last: Role, checked: bool = True
) -> list[tuple[Role, ...]]:
    """The shallow steps a plan with these ends and these middle roles is derived from.

    With both roles in the middle, the six steps check each other (:func:`_check_adds`). With one,
    the two steps are the fold's (:mod:`.fold`, a unit of one layer), which ``simulate`` trusts
    unchecked; ``checked`` adds a third, deeper one as the check, for steps known to differ by
    their order in the process (FSDP2's first step).
    """
    plans: list[tuple[Role, ...]] = [(first, role, last) for role in middle_roles]
    plans += [(first, a, b, last) for a in middle_roles for b in middle_roles]
    if len(middle_roles) == 1 and checked:
        plans.append(_check_plan(first, middle_roles[0], last))
    return plans


def _check_plan(first: Role, role: Role, last: Role) -> tuple[Role, ...]:
    """The check step of a plan whose middle layers all have ``role``: three of them."""
    return (first, role, role, role, last)


def _depths(plans: Sequence[tuple[Role, ...]]) -> str:
    return " + ".join(str(len(plan)) for plan in plans)


def _simulate_plan(config, task: str, group: RunSpec, plan: tuple[Role, ...], dtype: torch.dtype) -> SimulatedStep:
    # Checkpointing off is its own step (transformers' switch off), not layers that merely keep.
    roles = None if group.every_n_layers is None else plan
    return simulate_depth(config, task, len(plan), group, dtype, roles=roles)


# -- the derivation ----------------------------------------------------------------------------


def derive(roles: Sequence[Role], steps: dict[tuple[Role, ...], SimulatedStep]) -> SimulatedStep:
    """The step of the whole plan ``roles`` from its shallow steps (:func:`_shallow_plans`).

    Raises:
        NotDerivable: the shallow steps do not add up (checked on their figures outside the middle).
    """
    try:
        return _derive(roles, steps)
    except KeyError as missing:  # an event of one shallow step that another does not have
        raise NotDerivable(f"the shallow steps have different events: {missing}") from None


def _derive(roles: Sequence[Role], steps: dict[tuple[Role, ...], SimulatedStep]) -> SimulatedStep:
    first, last, middle = roles[0], roles[-1], tuple(roles[1:-1])
    # The roles the steps have a middle layer of: those of the plan, or both (then they check each other).
    kinds = sorted({plan[1] for plan in steps if len(plan) == 3})
    if not set(middle) <= set(kinds):
        raise NotDerivable(f"no shallow step has a middle layer of each role in {sorted(set(middle))}")
    check = _check_plan(first, kinds[0], last)
    if len(kinds) == 1 and check in steps and tuple(roles) != check:
        _expect_same(_derive(check, {plan: step for plan, step in steps.items() if plan != check}), steps[check])
    single = {role: steps[(first, role, last)] for role in kinds}
    double = {(a, b): steps[(first, a, b, last)] for a in kinds for b in kinds}
    events = {plan: _events(step) for plan, step in steps.items()}
    by_step = {id(step): events[plan] for plan, step in steps.items()}
    base_role = kinds[0]
    base = single[base_role]
    counts = Counter(middle)

    def grown_outside(pick: Callable[[SimulatedStep], Any]) -> Any:
        """A figure outside the middle: the base step's, grown by what each middle layer adds."""
        value = pick(base)
        adds = {role: _minus(pick(double[(base_role, role)]), value) for role in kinds}
        _check_adds(pick, single, double, value, adds, base_role)
        total = value
        for role in kinds:
            total = _plus(total, _times(adds[role], counts[role] - (role == base_role)))
        return total

    timeline: list[TimelinePoint] = []
    num_layers = len(roles)
    for block in _blocks(base.memory.timeline, base.depth):
        if block.middle is None:
            point = block.points[0]
            key = _key(point, base.depth)
            value = grown_outside(functools.partial(_event_of, by_step, key))
            layer = None if point.layer is None else (0 if point.layer == 0 else num_layers - 1)
            timeline.append(_relabel(value, point, layer))
            continue
        order = range(len(middle)) if block.phase != "backward" else range(len(middle) - 1, -1, -1)
        for position in order:
            role = middle[position]
            before, after = Counter(middle[:position]), Counter(middle[position + 1 :])
            own = _block_of(single[role], block)
            for point in own:
                key = _key(point, 3)
                value = point
                for other in kinds:
                    value = _plus(
                        value, _times(_minus(events[(first, other, role, last)][_shift(key)], point), before[other])
                    )
                    value = _plus(value, _times(_minus(events[(first, role, other, last)][key], point), after[other]))
                timeline.append(_relabel(value, point, position + 1))
    timeline = [replace(point, order=order) for order, point in enumerate(timeline)]

    peak = max(timeline, key=lambda point: point.region_peak_bytes)  # the first of equal highs
    grown = {
        field.name: grown_outside(attrgetter(f"memory.{field.name}"))
        for field in dataclasses.fields(MemoryResult)
        if field.name not in _FROM_TIMELINE
    }
    memory = replace(
        base.memory,
        **grown,
        timeline=timeline,
        peak_bytes=peak.region_peak_bytes,
        peak_where=peak.region,
        breakdown_at_peak=peak.region_peak_breakdown,
        logits_bytes_at_peak=peak.region_peak_logits_bytes,
    )
    return SimulatedStep(
        depth=num_layers,
        memory=memory,
        layers=_rows(roles, steps),
        host_bytes=grown_outside(attrgetter("host_bytes")),
    )


def _event_of(by_step: dict[int, dict[tuple[Any, ...], TimelinePoint]], key: tuple[Any, ...], step: SimulatedStep):
    return by_step[id(step)][key]


@dataclass(frozen=True)
class _Block:
    """Consecutive events of one layer of the middle (``middle`` its index), or one event outside it."""

    points: list[TimelinePoint]
    middle: int | None
    phase: str
    ordinal: int  # which block of the middle this is, in step order (forward, backward, per micro-batch)


def _blocks(timeline: Sequence[TimelinePoint], depth: int) -> list[_Block]:
    blocks: list[_Block] = []
    ordinal = 0
    for point in timeline:
        inside = point.layer is not None and 0 < point.layer < depth - 1
        if not inside:
            blocks.append(_Block([point], None, point.phase, -1))
            continue
        previous = blocks[-1] if blocks else None
        if previous is not None and previous.middle is not None and previous.phase == point.phase:
            previous.points.append(point)
            continue
        blocks.append(_Block([point], point.layer, point.phase, ordinal))
        ordinal += 1
    return blocks


def _block_of(step: SimulatedStep, block: _Block) -> list[TimelinePoint]:
    """The events of the step's one middle layer in the block at the same place as ``block``."""
    found = [found for found in _blocks(step.memory.timeline, step.depth) if found.middle is not None]
    if len(found) <= block.ordinal or found[block.ordinal].phase != block.phase:
        raise NotDerivable(f"the middle layer's events differ by role in block {block.ordinal}")
    return found[block.ordinal].points


def _key(point: TimelinePoint, depth: int) -> tuple[Any, ...]:
    """An event, named by what it is and where it sits from the model's ends."""
    if point.layer is None:
        place: tuple[Any, ...] = ("outside",)
    elif point.layer == 0:
        place = ("first",)
    elif point.layer == depth - 1:
        place = ("last",)
    else:
        place = ("middle", point.layer - 1)
    return (point.kind, point.phase, point.rerun, point.micro_batch, place)


def _shift(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """The key of the same event one middle layer later (in ``[first, a, r, last]``, the layer ``r``)."""
    return (*key[:4], ("middle", key[4][1] + 1))


def _events(step: SimulatedStep) -> dict[tuple[Any, ...], TimelinePoint]:
    events: dict[tuple[Any, ...], TimelinePoint] = {}
    for point in step.memory.timeline:
        key = _key(point, step.depth)
        if key in events:
            raise NotDerivable(f"two events named {key}")
        events[key] = point
    return events


def _relabel(point: TimelinePoint, like: TimelinePoint, layer: int | None) -> TimelinePoint:
    event = like.event if layer is None else region_for(like.kind, layer, like.micro_batch).description
    return replace(point, layer=layer, event=event)


def _rows(roles: Sequence[Role], steps: dict[tuple[Role, ...], SimulatedStep]) -> list[LayerResult]:
    """Each layer's row, from a shallow step where a layer in its place has its role and the same roles before it.

    What a row counts in the forward is deduplicated by storage (``LayerProbe``): the first keep
    layer counts the rotary tables it saves, the later ones do not. So a row is taken where the
    roles before it are the same kinds as in the plan; the layers after it save later.
    """
    rows = []
    for index in range(len(roles)):
        wanted = _row_signature(roles, index)
        row = next(
            (
                step.layers[at]
                for plan, step in steps.items()
                for at in range(len(plan))
                if _row_signature(plan, at) == wanted
            ),
            None,
        )
        if row is None:
            raise NotDerivable(f"no shallow step has L{index + 1}'s context")
        rows.append(replace(row, index=index, name=f"L{index + 1}"))
    return rows


def _row_signature(roles: Sequence[Role], index: int) -> tuple[Any, ...]:
    place = "first" if index == 0 else "last" if index == len(roles) - 1 else "middle"
    return (place, roles[index], frozenset(roles[:index]))


# -- arithmetic on figures: ints, dicts of ints, timeline points, and values that must not change ---


def _minus(a: Any, b: Any) -> Any:
    if isinstance(a, TimelinePoint):
        return map_figures(lambda x, y: x - y, a, b)
    if isinstance(a, bool) or not isinstance(a, (int, dict)):
        if a != b:
            raise NotDerivable(f"a figure that cannot add up differs: {a!r} and {b!r}")
        return _Same(a)
    if isinstance(a, dict):
        return {key: a.get(key, 0) - b.get(key, 0) for key in keys_of(a, b)}
    return a - b


def _plus(a: Any, add: Any) -> Any:
    if isinstance(a, TimelinePoint):
        return map_figures(lambda x, y: x + y, a, add)
    if isinstance(add, _Same):
        return a
    if isinstance(a, dict):
        return _nonzero({key: a.get(key, 0) + add.get(key, 0) for key in keys_of(a, add)})
    return a + add


def _times(add: Any, count: int) -> Any:
    if isinstance(add, _Same):
        return add
    if isinstance(add, TimelinePoint):
        return map_figures(lambda x: x * count, add)
    if isinstance(add, dict):
        return {key: value * count for key, value in add.items()}
    return add * count


@dataclass(frozen=True)
class _Same:
    """The difference of two equal values that do not add (a method's name, a flag)."""

    value: Any


def _check_adds(pick, single, double, value, adds, base_role) -> None:
    """Every shallow step's figure is the base's plus what its middle layers add: the derivation's premise."""
    no_middle = _plus(value, _times(adds[base_role], -1))
    for (a, b), step in double.items():
        if _differs(pick(step), _plus(_plus(no_middle, adds[a]), adds[b])):
            raise NotDerivable(f"the shallow steps do not add up ({a}, {b})")
    for role, step in single.items():
        if _differs(pick(step), _plus(no_middle, adds[role])):
            raise NotDerivable(f"the shallow steps do not add up ({role})")


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, TimelinePoint):
        names = ("current_bytes", "region_peak_bytes", "region_peak_breakdown")
        return any(_differs(getattr(a, name), getattr(b, name)) for name in names)
    return _nonzero(a) != _nonzero(b) if isinstance(a, dict) else a != b


def _expect_same(derived: SimulatedStep, simulated: SimulatedStep) -> None:
    """Raise :class:`NotDerivable` unless a derived step has every figure of the simulated one."""
    if _differs(derived.host_bytes, simulated.host_bytes) or derived.layers != simulated.layers:
        raise NotDerivable("the check step's rows or host bytes differ from their derivation")
    names = [field.name for field in dataclasses.fields(MemoryResult) if field.name != "timeline"]
    if any(_differs(getattr(derived.memory, name), getattr(simulated.memory, name)) for name in names):
        raise NotDerivable("the check step's memory figures differ from their derivation")
    pairs = zip(derived.memory.timeline, simulated.memory.timeline, strict=False)
    if len(derived.memory.timeline) != len(simulated.memory.timeline) or any(
        _differs(a, b) or a.region != b.region for a, b in pairs
    ):
        raise NotDerivable("the check step's timeline differs from its derivation")


def _nonzero(values: dict[str, int]) -> dict[str, int]:
    return {key: value for key, value in values.items() if value}
