"""A deep plan's step replayed from the stretches of a few shallow steps, change by change.

A simulated step is a sequence of stretches, one per event of the probe (a layer's forward, its backward, its
rerun, the model's ends), and in each the memory tracker sees storages made, freed and moved between operators.
:class:`StepTrace` records those changes, each with the stretch that made its storage (or the layer whose input
it is). The stretch of a layer
in a deep plan is the stretch of a layer of a shallow step with the same :class:`LayerKey`, plus what its
neighbours leave it: so a plan's whole timeline (every event's memory, the peak of each stretch and its
breakdown, what stays after the forward, offload's host copies) is replayed from a few shallow steps that
hold every kind of stretch once (:func:`derive`), without simulating the plan's layers.

The premise, and where it is checked:

- A layer's stretch depends on its role, on whether it is the first layer, on whether an earlier layer has
  its role (the lowest layer of a role frees what the layers of that role keep in common, as the position ids
  that only checkpointed layers hold) and on its micro-batch, not on the depth or the roles further away. Where
  the shallow steps hold a kind of stretch twice, the two must be the same.
- A layer's input is its own, whoever made it (:meth:`StepTrace.hand_over`): a checkpoint keeps it, a keep layer
  may drop it when the model's forward returns. Besides its own storages, a layer's stretch frees or moves only
  what the layer below and the layer above leave it, or for the last layer what the head leaves it (the
  gradient it receives). What layers further away leave it must be nothing wherever the steps show it.
- A stretch outside the layers depends on the roles of the first and the last layer and on the roles present;
  what it frees of the layers' storages is counted layer by layer, by key, the adjacent layer (the last for the
  loss and the head's backward, the first for the others) apart.
- The gradient norm's and the optimizer's stretches, the memory before the step and the optimizer's state grow
  with the depth, as in the fold (:mod:`.fold`): from steps of two depths (checked on a third where there is one).

A premise that does not hold raises :class:`~.fold.NotDerivable`, and the caller derives the setting another way.
``tests/step/test_replay.py`` compares every replayed figure with simulating every layer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..model.plan import CP, Role
from ..results import LayerResult, MemoryResult, TimelinePoint
from ..spec import RunSpec
from .allocations import AllocationRecorder
from .fold import NotDerivable, SimulatedStep, affine_in_depth
from .memory_meters import HOST, tracker_breakdown
from .opcount import NotCombinable, StretchWork, combine
from .probe import region_for
from .replay_order import OrderSources, StepOrder
from .simulate import offload_fields, simulate_depth
from .torch_workarounds import LOGITS

AFFINE_KINDS = ("grad_norm", "optimizer")  # stretches that follow every parameter: they grow with the depth
HEAD_KINDS = ("loss", "backward")  # stretches above the last layer (the head's forward and backward)
_UNCOUNTED = (LOGITS, HOST)  # a trace's categories that are not device bytes of the total

# How a segment of a stretch ends: at an operator (a candidate for the stretch's peak), where the step reads
# what stays after the forward, or with the stretch.
_SAMPLE, _AFTER_FORWARD, _END = "sample", "after_forward", "end"


@dataclass(frozen=True)
class LayerKey:
    """What a layer's stretches depend on (the module's premise)."""

    first: bool  # the first layer: its input is the embeddings' output
    role: Role
    role_below: bool  # an earlier layer has the same role

    @classmethod
    def of(cls, roles: Sequence[Role], index: int) -> LayerKey:
        return cls(index == 0, roles[index], roles[index] in roles[:index])


# -- recording ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _InputOf:
    """The maker a trace names for a layer's input (:meth:`StepTrace.hand_over`)."""

    layer: int


class StepTrace:
    """A step's memory changes as its tracker saw them (a ``ckptlab.step.torch_workarounds.TraceSink``).

    Stretch -1 is the tracking of the model and the optimizer before the step, 0 the start of watching to the
    first event, ``k`` the stretch of the timeline's point ``k - 1``.
    """

    def __init__(self) -> None:
        self.stretch = -1
        self.entries: list[Any] = []  # a separator, or (stretch that made the storage, category, delta)
        self._makers: dict[int, int | _InputOf] = {}  # storage -> the stretch that made it, or the layer it feeds

    def boundary(self) -> None:
        self.entries.append(None)
        self.stretch += 1

    def sample(self) -> None:
        self.entries.append(_SAMPLE)

    def after_forward(self) -> None:
        self.entries.append(_AFTER_FORWARD)

    def change(self, storage: int, category: str, delta: int, *, gone: bool = False) -> None:
        maker = self._makers.pop(storage, self.stretch) if gone else self._makers.setdefault(storage, self.stretch)
        self.entries.append((maker, category, delta))

    def hand_over(self, storages: list[int], layer: int) -> None:
        # A layer's input is its own, not its maker's: the layer below (or the embeddings) made it, but what
        # becomes of it (kept by a checkpoint, freed when the model's forward returns) is this layer's doing.
        for storage in storages:
            self._makers[storage] = _InputOf(layer)

    def follow_streams(self, now: Callable[[], str | None]) -> None:
        """Bytes are bytes on any stream: the stretches' totals do not ask which."""

    def stretches(self) -> list[list[tuple[str, dict[int | _InputOf, Counter]]]]:
        """Each stretch (-1 first) as its segments: (how it ends, maker -> category -> delta)."""
        stretches: list[list[tuple[str, dict[int | _InputOf, Counter]]]] = [[]]
        parts: dict[int | _InputOf, Counter] = {}
        for entry in self.entries:
            if isinstance(entry, tuple):
                maker, category, delta = entry
                parts.setdefault(maker, Counter())[category] += delta
                continue
            stretches[-1].append((_END if entry is None else entry, parts))
            parts = {}
            if entry is None:
                stretches.append([])
        stretches[-1].append((_END, parts))
        return stretches


Parts = dict[Any, dict[str, int]]  # a label (where the changes come from) -> category -> delta
Segment = tuple[str, Parts]


@dataclass(frozen=True)
class RecordedStep:
    """A simulated shallow step with its stretches, each change labelled by where its storage comes from."""

    roles: tuple[Role, ...]
    step: SimulatedStep
    baseline: dict[str, int]  # MemTracker's categories when watching begins
    prelude: tuple[Segment, ...]  # watching's start to the first event
    stretches: tuple[tuple[Segment, ...], ...]  # one per timeline point
    # Its births and frees, stretch by stretch (:mod:`.replay_order`); None where the tokens cannot say them.
    order: StepOrder | None = None

    @property
    def depth(self) -> int:
        return len(self.roles)


def record(config, task: str, spec: RunSpec, dtype: torch.dtype, roles: Sequence[Role]) -> RecordedStep:
    """Simulate ``spec``'s step with ``roles`` (all keep and no checkpointing where ``spec.every_n_layers`` is None)
    and record its stretches."""
    trace, recorder = StepTrace(), AllocationRecorder()
    both = _Both(trace, recorder)
    step = simulate_depth(
        config, task, len(roles), spec, dtype, roles=None if spec.every_n_layers is None else roles, trace=both
    )
    points = step.memory.timeline
    before, prelude, *stretches = trace.stretches()
    if len(stretches) != len(points) + 1:  # the last: after the recorder's finish
        raise NotDerivable(f"the trace has {len(stretches)} stretches for {len(points)} events")
    baseline = Counter[str]()
    for _, parts in before:
        for deltas in parts.values():
            baseline.update(deltas)
    labelled = tuple(
        tuple((end, _labelled(parts, points, tuple(roles), index)) for end, parts in segments)
        for index, segments in enumerate(stretches[:-1])
    )
    recorded = RecordedStep(
        tuple(roles),
        step,
        _nonzero(baseline),
        tuple((end, _local(_merged(parts.values()))) for end, parts in prelude),
        labelled,
    )
    _check_events(recorded)
    try:
        keys = [LayerKey.of(roles, at) for at in range(len(roles))]
        return replace(recorded, order=StepOrder.of(recorder, points, keys, both.inputs))
    except NotDerivable:
        return recorded  # the bytes replay all the same; the order is then simulated where it is asked for


class _Both:
    """A ``TraceSink`` that tells two: the bytes' trace and the allocations' order, both from one simulation."""

    def __init__(self, trace: StepTrace, recorder: AllocationRecorder) -> None:
        self._sinks = (trace, recorder)
        self._recorder = recorder
        self.inputs: dict[int, tuple[int, int]] = {}  # ordinal -> (the layer it is an input of, its place there)

    def boundary(self) -> None:
        for sink in self._sinks:
            sink.boundary()

    def sample(self) -> None:
        for sink in self._sinks:
            sink.sample()

    def after_forward(self) -> None:
        for sink in self._sinks:
            sink.after_forward()

    def change(self, storage: int, category: str, delta: int, *, gone: bool = False) -> None:
        for sink in self._sinks:
            sink.change(storage, category, delta, gone=gone)

    def follow_streams(self, now: Callable[[], str | None]) -> None:
        for sink in self._sinks:
            sink.follow_streams(now)

    def hand_over(self, storages: list[int], layer: int) -> None:
        for sink in self._sinks:
            sink.hand_over(storages, layer)
        # A layer's input is its own (StepTrace.hand_over): its order names it so too.
        for place, storage in enumerate(storages):
            ordinal = self._recorder.ordinal_of(storage)
            if ordinal is not None:
                self.inputs[ordinal] = (layer, place)


def _labelled(
    parts: dict[int | _InputOf, Counter], points: Sequence[TimelinePoint], roles: tuple[Role, ...], index: int
) -> Parts:
    """A segment's changes of stretch ``index`` by label: local, or the relation of the layer that made them."""
    labelled: dict[Any, Counter] = {}
    for maker, deltas in parts.items():
        at = maker if isinstance(maker, _InputOf) else maker - 1  # a point's stretch is numbered from 1
        labelled.setdefault(_label(points, roles, index, at), Counter()).update(deltas)
    return {label: _nonzero(deltas) for label, deltas in labelled.items()}


def _label(points: Sequence[TimelinePoint], roles: tuple[Role, ...], index: int, maker: int | _InputOf) -> Any:
    """Where a storage of stretch ``index`` comes from: ("local",) for the stretch itself and the model's ends
    (the head excepted), else its maker's relation to it (the module's premise)."""
    point, last = points[index], len(roles) - 1
    layer: int | None
    if isinstance(maker, _InputOf):
        layer, head = maker.layer, False
    elif maker == index or maker < 0:
        return ("local",)
    else:
        layer, head = (
            points[maker].layer,
            points[maker].kind in HEAD_KINDS and points[maker].micro_batch == point.micro_batch,
        )
    if point.layer is None:  # a stretch outside the layers: its layers' storages, layer by layer
        return ("local",) if layer is None else (*_layer_label(roles, point, layer), layer)
    if layer is not None:
        return ("near", _relation(layer - point.layer))
    if head and point.layer == last:
        return ("near", "head")  # the head sits above the last layer
    if head and point.layer:
        return ("near", "far")
    # The first layer's, as its key says: in a micro-batch with no event at the backward's end (the second, or a
    # frozen embedding's) its stretch ends the backward and frees what the head left.
    return ("local",)


def _relation(offset: int) -> int | str:
    return offset if abs(offset) <= 1 else "far"


# -- what a group's steps hold ------------------------------------------------------------------


def _stretch_key(point: TimelinePoint, roles: Sequence[Role]) -> tuple[Any, ...]:
    if point.layer is None:
        return ("ends", point.kind, point.micro_batch, _signature(roles))
    return ("layer", point.kind, point.rerun, point.micro_batch, LayerKey.of(roles, point.layer))


def _near_name(key: tuple[Any, ...], label: Any) -> tuple[Any, ...]:
    """Where what ``label`` leaves a stretch ``key`` is kept: a layer's leaving a stretch outside the layers does
    not depend on that stretch's signature (the roles of the ends and the roles present)."""
    return (key[:3] if label[0] == "layer" else key, label)


class Sources:
    """Every kind of stretch a group's recorded steps hold, checked where they hold one twice.

    Args:
        steps: recorded steps of one group (the same spec but the plan).
        sized: recorded steps of every group whose parameters and optimizer are the same (any plan,
            offload or policy): the figures that grow with the depth come from them.

    Raises:
        NotDerivable: two steps disagree where the premise says they must not.
    """

    def __init__(self, steps: Sequence[RecordedStep], sized: Sequence[RecordedStep]) -> None:
        self.steps, self.sized = list(steps), list(sized)
        self.local: dict[tuple[Any, ...], tuple[Segment, ...]] = {}
        self.near: dict[tuple[tuple[Any, ...], Any], tuple[dict[str, int], ...]] = {}
        # The ops of each kind of stretch (opcount): a stretch's own, whatever its neighbours; None: not counted.
        self.work: dict[tuple[Any, ...], StretchWork] | None = {}
        for step in self.steps:
            self._put(self.local, ("prelude", *_signature(step.roles)), step.prelude)
            for point, segments in zip(step.step.memory.timeline, step.stretches):
                if point.kind not in AFFINE_KINDS:
                    self._take(step, point, segments)
            self._take_work(step)
        self._grown = _DepthFit(sized)
        self._effects: dict[tuple[Any, ...], _Effect] = {}  # a table's many alike stretches replay one effect
        self._orders: OrderSources | NotDerivable | None = None  # made on the first order asked for

    def order(self, roles: Sequence[Role], timeline: Sequence[TimelinePoint]) -> Any:
        """The order of allocations of the plan ``roles`` whose replayed events are ``timeline``
        (:mod:`.replay_order`).

        Raises:
            NotDerivable: the recorded steps' orders do not give it (the bytes may all the same).
        """
        if self._orders is None:
            try:
                self._orders = OrderSources(self.steps, self.sized, _stretch_key)
            except NotDerivable as exc:
                self._orders = exc
        if isinstance(self._orders, NotDerivable):
            raise self._orders
        keys = [LayerKey.of(roles, at) for at in range(len(roles))]
        return self._orders.compose(roles, timeline, _stretch_key, keys)

    def _take(self, step: RecordedStep, point: TimelinePoint, segments: tuple[Segment, ...]) -> None:
        key = _stretch_key(point, step.roles)
        local = tuple((end, _local(parts.get(("local",), {}))) for end, parts in segments)
        self._put(self.local, key, local)
        # What each relation left this stretch, nothing included, wherever the step has that relation.
        for label in _labels_of(step.roles, point):
            if label[0] == "layer":  # outside the layers: what each layer of a key left, the same for all
                left = [
                    tuple(parts.get((*label, at), {}) for _, parts in segments)
                    for at in range(step.depth)
                    if _layer_label(step.roles, point, at) == label
                ]
                if any(other != left[0] for other in left):
                    raise NotDerivable(f"the layers of {label} leave {key} unequal amounts")
                self._put(self.near, _near_name(key, label), left[0])
                continue
            found = tuple(parts.get(label, {}) for _, parts in segments)
            if label[1] == "far":
                if any(found):
                    raise NotDerivable(f"a layer two or more away changes {key}'s memory")
                continue
            self._put(self.near, _near_name(key, label), found)

    def _take_work(self, step: RecordedStep) -> None:
        if step.step.work is None or self.work is None:
            self.work = None
            return
        prelude, *stretches = step.step.work
        self._put(self.work, ("prelude", *_signature(step.roles)), prelude)
        for point, work in zip(step.step.memory.timeline, stretches):
            if point.kind not in AFFINE_KINDS:
                self._put(self.work, _stretch_key(point, step.roles), work)

    def work_of(self, roles: Sequence[Role], points: Sequence[TimelinePoint]) -> tuple[StretchWork, ...] | None:
        """The ops of each stretch of a plan ``roles`` whose events are ``points``, before the first one first;
        None where the recorded steps were not counted.

        Raises:
            NotDerivable: no recorded step has a kind of stretch the plan has.
        """
        if self.work is None:
            return None
        prelude = ("prelude", *_signature(roles))
        if prelude not in self.work:
            raise NotDerivable(f"no recorded step counted the start {prelude}")
        works = [self.work[prelude]]
        for point in points:
            if point.kind in AFFINE_KINDS:
                works.append(self._grown.work(point.kind, point.micro_batch, len(roles)))
                continue
            key = _stretch_key(point, roles)
            if key not in self.work:
                raise NotDerivable(f"no recorded step counted a stretch {key}")
            works.append(self.work[key])
        return tuple(works)

    @staticmethod
    def _put(table: dict, key: Any, value: Any) -> None:
        if table.setdefault(key, value) != value:
            raise NotDerivable(f"two steps differ in {key}")

    def effect(self, point: TimelinePoint, roles: Sequence[Role]) -> _Effect:
        """What ``point``'s stretch does to the memory in the plan ``roles``."""
        labels = _labels_of(roles, point)
        context = (
            _stretch_key(point, roles),
            len(roles) if point.kind in AFFINE_KINDS else None,
            tuple((label, _count(roles, point, label) if label[0] == "layer" else 1) for label in labels),
        )
        if context not in self._effects:
            self._effects[context] = _effect(self.stretch(point, roles, len(roles)))
        return self._effects[context]

    def stretch(self, point: TimelinePoint, roles: Sequence[Role], depth: int) -> tuple[Segment, ...]:
        """The segments of ``point``'s stretch in the plan ``roles``: its own changes and what its neighbours leave."""
        key = _stretch_key(point, roles)
        if point.kind in AFFINE_KINDS:
            return self._grown.stretch(point.kind, point.micro_batch, depth)
        if key not in self.local:
            raise NotDerivable(f"no recorded step has a stretch {key}")
        segments = [(end, Counter(parts.get(("local",), {}))) for end, parts in self.local[key]]
        for label in _labels_of(roles, point):
            if label[0] == "near" and label[1] == "far":
                continue  # nothing, wherever a step showed it
            name = _near_name(key, label)
            if name not in self.near:
                raise NotDerivable(f"no recorded step shows what {label} leaves {key}")
            count = _count(roles, point, label) if label[0] == "layer" else 1
            for (_, total), part in zip(segments, self.near[name], strict=True):
                total.update({category: value * count for category, value in part.items()})
        return tuple((end, _local(total)) for end, total in segments)

    def prelude(self, roles: Sequence[Role]) -> tuple[Segment, ...]:
        """Watching's start to the first event, in a plan ``roles``."""
        key = ("prelude", *_signature(roles))
        if key not in self.local:
            raise NotDerivable(f"no recorded step has the start {key}")
        return self.local[key]

    def grown(self, depth: int) -> _Grown:
        """The figures that grow with the depth, at ``depth`` layers."""
        return self._grown.at(depth)

    def row(self, roles: Sequence[Role], index: int) -> LayerResult:
        """Layer ``index``'s row: from a step where a layer has its role and the same roles before it.

        What a row counts in the forward is deduplicated by storage (``LayerProbe``): the first keep layer
        counts the rotary tables it saves, the later ones do not.
        """
        wanted = (roles[index], frozenset(roles[:index]))
        for step in self.steps:
            for at, row in enumerate(step.step.layers):
                if (step.roles[at], frozenset(step.roles[:at])) == wanted:
                    return replace(row, index=index, name=f"L{index + 1}")
        raise NotDerivable(f"no recorded step has L{index + 1}'s role with the same roles before it")


def _signature(roles: Sequence[Role]) -> tuple[Role, Role, frozenset[Role]]:
    """What the stretches outside the layers depend on (the module's premise)."""
    return roles[0], roles[-1], frozenset(roles)


def _labels_of(roles: Sequence[Role], point: TimelinePoint) -> list[Any]:
    """The relations ``point``'s stretch has in a plan ``roles``: each may leave it changes."""
    last = len(roles) - 1
    if point.layer is None:
        return list(dict.fromkeys(_layer_label(roles, point, at) for at in range(last + 1)))
    relations: list[int | str] = [0, 1 if point.layer < last else "head"]  # itself; the layer or the head above
    if point.layer:
        relations.append(-1)
    if point.layer >= 2 or point.layer <= last - 1:  # a layer two away, or the head above the layer below the last
        relations.append("far")
    return [("near", relation) for relation in relations]


def _layer_label(roles: Sequence[Role], point: TimelinePoint, layer: int) -> tuple[Any, ...]:
    """The label of what layer ``layer`` leaves a stretch outside the layers: by its key, and whether it is the
    layer next to that stretch (the last for the head's stretches, the first for the others)."""
    adjacent = layer == (len(roles) - 1 if point.kind in HEAD_KINDS else 0)
    return ("layer", adjacent, LayerKey.of(roles, layer))


def _count(roles: Sequence[Role], point: TimelinePoint, label: Any) -> int:
    """How many layers of the plan ``roles`` have ``label`` for ``point``'s stretch outside the layers."""
    return sum(_layer_label(roles, point, at) == label for at in range(len(roles)))


# -- what grows with the depth ------------------------------------------------------------------


@dataclass(frozen=True)
class _Grown:
    """The figures of a depth that follow the parameters: affine in the depth, as in the fold."""

    baseline: dict[str, int]
    optimizer_state: int
    stretches: dict[tuple[str, int], tuple[Segment, ...]]  # (kind, micro-batch) -> two segments: to its peak, the rest


class _DepthFit:
    """:class:`_Grown` at any depth, from recorded steps of at least two depths."""

    def __init__(self, steps: Sequence[RecordedStep]) -> None:
        by_depth: dict[int, _Grown] = {}
        for step in steps:
            grown = _Grown(step.baseline, step.step.memory.optimizer_state_bytes, _affine_stretches(step))
            if by_depth.setdefault(step.depth, grown) != grown:
                raise NotDerivable(f"two steps of {step.depth} layers differ in what grows with the depth")
        if len(by_depth) < 2:
            raise NotDerivable("the figures that grow with the depth need steps of two depths")
        self._low, self._high = min(by_depth), max(by_depth)
        self._by_depth = by_depth
        for depth, grown in by_depth.items():
            if self.at(depth) != grown:
                raise NotDerivable(f"what grows with the depth is not affine at {depth} layers")
        # The ops of the gradient norm's and the optimizer's stretches, by depth (counted steps only).
        self._work: dict[int, dict[tuple[str, int], StretchWork]] = {}
        for step in steps:
            if step.step.work is not None:
                work = {
                    (point.kind, point.micro_batch): stretch
                    for point, stretch in zip(step.step.memory.timeline, step.step.work[1:])
                    if point.kind in AFFINE_KINDS
                }
                if self._work.setdefault(step.depth, work) != work:
                    raise NotDerivable(f"two steps of {step.depth} layers differ in the ops that grow with the depth")

    def work(self, kind: str, micro_batch: int, depth: int) -> StretchWork:
        """The ops of a gradient norm's or an optimizer's stretch at ``depth`` layers, affine in the depth.

        Raises:
            NotDerivable: the steps of two depths do not give it.
        """
        if len(self._work) < 2:
            raise NotDerivable("the ops that grow with the depth need counted steps of two depths")
        low, high = min(self._work), max(self._work)
        stretches = [self._work[at].get((kind, micro_batch), {}) for at in (low, high)]

        try:
            return combine(
                lambda at_low, at_high: affine_in_depth(at_low, at_high, depth - low, high - low), *stretches
            )
        except NotCombinable as exc:
            raise NotDerivable(str(exc)) from exc

    def at(self, depth: int) -> _Grown:
        low, high = self._by_depth[self._low], self._by_depth[self._high]
        return _Grown(
            *(_between(a, b, depth - self._low, self._high - self._low) for a, b in zip(_fields(low), _fields(high)))
        )

    def stretch(self, kind: str, micro_batch: int, depth: int) -> tuple[Segment, ...]:
        stretches = self.at(depth).stretches
        if (kind, micro_batch) not in stretches:
            raise NotDerivable(f"no recorded step has a {kind} stretch in micro-batch {micro_batch}")
        return stretches[(kind, micro_batch)]


def _fields(grown: _Grown) -> tuple[Any, ...]:
    return grown.baseline, grown.optimizer_state, grown.stretches


def _between(low: Any, high: Any, steps: int, span: int) -> Any:
    """``low`` moved ``steps`` of ``span`` toward ``high``, figure by figure (exact in integers, or NotDerivable)."""
    if isinstance(low, str) or low is None:
        if low != high:
            raise NotDerivable(f"{low!r} and {high!r} differ and do not grow")
        return low
    if isinstance(low, tuple):
        if len(low) != len(high):
            raise NotDerivable("a stretch that grows with the depth has another shape at another depth")
        return tuple(_between(a, b, steps, span) for a, b in zip(low, high))
    if isinstance(low, dict):
        moved = {key: _between(*_pair(low, high, key), steps, span) for key in dict.fromkeys([*low, *high])}
        return {key: value for key, value in moved.items() if value}
    try:
        return affine_in_depth(low, high, steps, span)
    except NotCombinable as exc:
        raise NotDerivable("a figure that grows with the depth does not grow by whole bytes") from exc


def _pair(low: dict, high: dict, key: Any) -> tuple[Any, Any]:
    """``low[key]`` and ``high[key]``, an absent one nothing of the other's kind (a dict or a number)."""
    like = low.get(key, high.get(key))
    nothing: Any = {} if isinstance(like, dict) else 0
    return low.get(key, nothing), high.get(key, nothing)


def _affine_stretches(step: RecordedStep) -> dict[tuple[str, int], tuple[Segment, ...]]:
    """The gradient norm's and the optimizer's stretches as two segments: to their peak (the operators between
    differ in number with the parameters), then to their end."""
    found: dict[tuple[str, int], tuple[Segment, ...]] = {}
    for point, segments in zip(step.step.memory.timeline, step.stretches):
        if point.kind in AFFINE_KINDS:
            effect = _effect(segments)
            at_peak = effect.at_peak or {}
            rest = {key: effect.net.get(key, 0) - at_peak.get(key, 0) for key in dict.fromkeys([*effect.net, *at_peak])}
            found[(point.kind, point.micro_batch)] = ((_SAMPLE, _local(at_peak)), (_END, _local(rest)))
    return found


# -- replaying a plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Effect:
    """What a stretch does to the memory it starts with."""

    net: dict[str, int]  # change over the whole stretch
    at_peak: dict[str, int] | None  # change up to its highest point above the start; None: never above the start
    after_forward: dict[str, int] | None  # change up to where the step reads what stays after the forward
    host_high: int  # the most the host copies rose during it


def _effect(segments: Sequence[Segment]) -> _Effect:
    running: Counter[str] = Counter()
    rise, at_peak, after_forward, host_high = 0, None, None, 0
    for end, parts in segments:
        for deltas in parts.values():
            running.update(deltas)
        host_high = max(host_high, running[HOST])
        if end == _SAMPLE and _total(running) > rise:  # MemTracker's own test: strictly above
            rise, at_peak = _total(running), dict(running)
        elif end == _AFTER_FORWARD:
            after_forward = dict(running)
    return _Effect(_nonzero(running), at_peak, after_forward, host_high)


def derive(spec: RunSpec, roles: Sequence[Role], sources: Sources) -> SimulatedStep:
    """The step of ``spec`` with the plan ``roles``, replayed from ``sources`` (the module's docstring).

    Raises:
        NotDerivable: the sources lack a kind of stretch the plan has, or the premise fails on them.
    """
    like = sources.steps[0].step
    depth = len(roles)
    grown = sources.grown(depth)
    state = grown.optimizer_state if spec.trainer_optimizer is not None else None
    has_logits = any(point.region_peak_logits_bytes is not None for point in like.memory.timeline)
    memory = Counter(grown.baseline)
    baseline = _total(memory)
    memory.update(_effect(sources.prelude(roles)).net)
    timeline: list[TimelinePoint] = []
    resident: dict[str, int] | None = None
    host_high = 0
    for point in _events(roles, like.memory.timeline):
        effect = sources.effect(point, roles)
        current = _total(memory)
        at_peak = memory + Counter(effect.at_peak) if effect.at_peak is not None else memory
        timeline.append(
            replace(
                point,
                order=len(timeline),
                current_bytes=current,
                region_peak_bytes=max(_total(at_peak), current),
                region_peak_breakdown=tracker_breakdown(_device(at_peak), state),
                region_peak_logits_bytes=at_peak[LOGITS] if has_logits else None,
            )
        )
        host_high = max(host_high, memory[HOST] + effect.host_high)
        if effect.after_forward is not None:
            resident = dict(memory + Counter(effect.after_forward))
        memory.update(effect.net)
    if resident is None:
        raise NotDerivable("no recorded stretch holds the end of the forward")
    layers = [sources.row(roles, index) for index in range(depth)]
    work = sources.work_of(roles, timeline)
    peak = max(timeline, key=lambda point: point.region_peak_bytes)  # the first of equal highs
    summary = MemoryResult(
        method=like.memory.method,
        baseline_bytes=baseline,
        after_forward_bytes=_total(resident) - baseline,
        peak_bytes=peak.region_peak_bytes,
        peak_where=peak.region,
        breakdown_after_forward=tracker_breakdown(_device(resident), state),
        breakdown_baseline=tracker_breakdown(_device(grown.baseline), state),
        breakdown_at_peak=peak.region_peak_breakdown,
        optimizer_state_bytes=grown.optimizer_state,
        timeline=timeline,
        logits_bytes_at_peak=peak.region_peak_logits_bytes,
        **offload_fields(spec, layers),
    )
    try:
        allocations = sources.order(roles, timeline)
    except NotDerivable:
        allocations = None  # the bytes stand; the device total simulates this setting for its order
    return SimulatedStep(depth, summary, layers, host_high, allocations=allocations, work=work)


def _events(roles: Sequence[Role], like: Sequence[TimelinePoint]) -> Iterable[TimelinePoint]:
    """The events of a step with the plan ``roles``, in the order of a recorded step's (``like``): its events
    outside the layers as they are, each run of layer events as every layer's, in the run's direction."""
    depth, index = len(roles), 0
    while index < len(like):
        point = like[index]
        if point.layer is None:
            yield point
            index += 1
            continue
        while index < len(like) and like[index].layer is not None and like[index].phase == point.phase:
            index += 1
        forward = point.phase == "forward"
        for layer in range(depth) if forward else range(depth - 1, -1, -1):
            kinds = ["layer_forward", "layer_done"][: 1 + (layer < depth - 1)] if forward else ["layer_backward"]
            if not forward and roles[layer] == CP:
                kinds.append("rerun")
            for kind in kinds:
                region = region_for(kind, layer, point.micro_batch)
                yield replace(
                    point, kind=kind, phase=region.phase, layer=layer, rerun=region.rerun, event=region.description
                )


def _check_events(step: RecordedStep) -> None:
    """Raise NotDerivable unless :func:`_events` gives a recorded step's own events, in order."""
    points = step.step.memory.timeline
    made = [(p.kind, p.layer, p.rerun, p.micro_batch) for p in _events(step.roles, points)]
    if made != [(p.kind, p.layer, p.rerun, p.micro_batch) for p in points]:
        raise NotDerivable("the plan's events do not follow the recorded step's order")


def _local(deltas: dict[str, int]) -> Parts:
    """Changes of a stretch's own, with no empty entry (the figures that grow are compared as they are)."""
    deltas = _nonzero(deltas)
    return {("local",): deltas} if deltas else {}


def _device(memory: dict[str, int]) -> dict[str, int]:
    """The device's categories of a replayed memory (the logits and the host copies are counted apart)."""
    return {category: value for category, value in memory.items() if category not in _UNCOUNTED}


def _total(memory: dict[str, int]) -> int:
    return sum(_device(memory).values())


def _merged(parts: Iterable[Counter]) -> dict[str, int]:
    merged: Counter[str] = Counter()
    for deltas in parts:
        merged.update(deltas)
    return _nonzero(merged)


def _nonzero(values: dict[str, int]) -> dict[str, int]:
    return {key: value for key, value in values.items() if value}
