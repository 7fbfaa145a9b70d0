"""The simulation's fast path: a deep model folded into two shallow copies, extrapolated exactly.

Layers repeat, in kind (:func:`ckptlab.model.experts.layer_kind`) and role, and the plan repeats every ``every_n_layers``
layers, so memory at any event of the step is an affine function of how many repeating
units lie before and after it. :class:`Reduction` says which shallow copies to simulate and
extrapolates every event of their timelines to the full depth
(``tests/step/test_simulate.py`` compares it with simulating every layer). A model whose
layers differ is folded by whole repeats of its layers' kinds (``ModelInfo.layer_period``: Gemma 3's five
sliding layers and one full), and simulated layer by layer where they do not repeat.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..results import LayerResult, MemoryResult, TimelinePoint
from ..results.allocations import AllocationTrace
from .opcount import NotCombinable, StretchWork, combine
from .probe import region_for


class NotDerivable(Exception):
    """Shallow steps that do not give a deeper step as a derivation needs (:mod:`.table`, :mod:`.replay`): the
    setting is simulated another way."""


@dataclass(frozen=True)
class SimulatedStep:
    """What one simulated step of a given depth gave."""

    depth: int  # layers simulated
    memory: MemoryResult
    layers: list[LayerResult]
    host_bytes: int  # bytes offload held in host memory at the end of the forward
    allocations: AllocationTrace | None = None  # the step's births and frees in order, where they were recorded
    # The ops each stretch ran (:mod:`.opcount`): before the first event, then one per point of memory.timeline;
    # None where they were not counted, or did not fold.
    work: tuple[StretchWork, ...] | None = None


@dataclass(frozen=True)
class Reduction:
    """How a deep model is folded into shallow copies with the same plan at both ends.

    The layers split into a head (the first repeating unit, which holds layer 0), a middle of
    ``middle_units`` whole units, and a tail (the last unit plus the remainder). Removing
    whole units from the middle keeps every other layer's role.
    """

    unit: int  # layers per repeating unit of the plan
    head: int  # layers before the middle
    tail: int  # layers after the middle
    middle_units: int  # units in the middle of the full model

    @classmethod
    def for_plan(cls, num_layers: int, every_n_layers: int | None, period: int = 1) -> Reduction | None:
        """The fold of ``num_layers`` layers whose kinds repeat every ``period`` layers (``ModelInfo.layer_period``).

        A unit spans whole repeats of both the plan and the layers' kinds (Gemma 3's five sliding layers and one
        full at every_n_layers=2: 6 layers), so a shallow copy's layers, kept from the head and the tail, are of
        the kind and role of the layers they stand for.
        """
        # Off, or only L1 checkpointed: every layer after the first is the same (keep).
        plan_unit = 1 if every_n_layers is None or every_n_layers >= num_layers else every_n_layers
        unit = math.lcm(plan_unit, max(period, 1))
        head, tail = unit, unit + num_layers % unit
        middle_units = (num_layers - head - tail) // unit
        reduction = cls(unit, head, tail, middle_units)
        # Worth it only when the two shallow copies together are shallower than the model.
        return None if middle_units < 2 or reduction.depth(1) + reduction.depth(2) >= num_layers else reduction

    @property
    def num_layers(self) -> int:
        return self.depth(self.middle_units)

    def depth(self, middle_units: int) -> int:
        return self.head + middle_units * self.unit + self.tail

    def _place(self, layer: int | None, depth: int) -> tuple[Any, ...]:
        """Where a layer of a model of ``depth`` layers sits: head, middle unit and offset, or tail."""
        if layer is None:
            return ("outside",)
        if layer < self.head:
            return ("head", layer)
        if layer >= depth - self.tail:
            return ("tail", layer - (depth - self.tail))
        unit, offset = divmod(layer - self.head, self.unit)
        return ("middle", unit, offset)

    def _layer_index(self, place: tuple[Any, ...], unit: int = 0) -> int | None:
        if place[0] == "outside":
            return None
        if place[0] == "head":
            return place[1]
        if place[0] == "tail":
            return self.num_layers - self.tail + place[1]
        return self.head + unit * self.unit + place[2]

    def extrapolate(self, one: SimulatedStep, two: SimulatedStep) -> SimulatedStep:
        """The full-depth step from steps with one and two middle units.

        A value at an event is ``c + a * (units before it) + b * (units after it)``: for events
        outside the middle, ``two - one`` is the change per middle unit; for an event of middle
        unit ``j`` of ``M``, ``one`` gives ``c`` (unit 0 of 1), ``two``'s unit 0 adds ``b`` and
        its unit 1 adds ``a``.
        """
        full_units = self.middle_units
        timeline_one, timeline_two = one.memory.timeline, two.memory.timeline
        keys_one = [self._key(point, one.depth) for point in timeline_one]
        by_key_two = {self._key(point, two.depth): point for point in timeline_two}
        timeline: list[TimelinePoint] = []
        block: list[tuple[TimelinePoint, tuple[Any, ...]]] = []  # consecutive events of the middle unit
        # A stretch's ops fold as its bytes do: the same affine steps, count by count (opcount.combine).
        work_one = _stretch_work(one)
        work_two = {self._key(point, two.depth): work for point, work in zip(timeline_two, _stretch_work(two)[1:])}
        works: list[StretchWork] = []

        def flush_block() -> None:
            # The shallow copy has one middle unit; the full model walks all of them, each
            # unit's events in the same order.
            if not block:
                return
            for unit in self._units_in_step_order(block[0][0].phase):
                for point, key in block:
                    after = by_key_two[key]  # unit 0 of two: one more unit after it
                    before = by_key_two[(key[0], ("middle", 1, key[1][2]), key[2], key[3])]  # unit 1: one more before
                    value = _combine(point, before, after, unit, full_units - 1 - unit)
                    timeline.append(self._relabel(value, key, unit=unit))
                    # A stretch's ops are its own, not a sum over the units before it as its bytes are: they depend on
                    # whether the layers next to it are the head's and the tail's or middle units' (FSDP2 gathers the
                    # next layer's parameters ahead, in the forward the one above, in the backward the one below).
                    # Unit 0 of the two-unit copy has the head below, unit 1 the tail above.
                    works.append(
                        _combined_work(
                            _grown_by(min(unit, 1), min(full_units - 1 - unit, 1)),
                            work_one[1 + point.order],
                            work_two[(key[0], ("middle", 1, key[1][2]), key[2], key[3])],
                            work_two[key],
                        )
                    )
            block.clear()

        works.append(_combined_work(_grown_by(full_units - 1, 0), work_one[0], _stretch_work(two)[0], work_one[0]))
        for point, key in zip(timeline_one, keys_one):
            if key[1][0] == "middle":
                block.append((point, key))
                continue
            flush_block()
            timeline.append(self._relabel(_affine(point, by_key_two[key], full_units - 1), key, unit=0))
            works.append(
                _combined_work(
                    _grown_by(full_units - 1, 0), work_one[1 + point.order], work_two[key], work_one[1 + point.order]
                )
            )
        flush_block()
        timeline = [replace(point, order=order) for order, point in enumerate(timeline)]
        peak_point = max(timeline, key=lambda point: point.region_peak_bytes)
        memory = replace(
            one.memory,
            baseline_bytes=timeline[0].current_bytes,
            after_forward_bytes=affine_in_depth(
                one.memory.after_forward_bytes, two.memory.after_forward_bytes, full_units - 1
            ),
            peak_bytes=peak_point.region_peak_bytes,
            peak_where=peak_point.region,
            breakdown_after_forward=_grow_dict(
                one.memory.breakdown_after_forward, two.memory.breakdown_after_forward, full_units - 1
            ),
            breakdown_baseline=_grow_dict(one.memory.breakdown_baseline, two.memory.breakdown_baseline, full_units - 1),
            breakdown_at_peak=peak_point.region_peak_breakdown,
            logits_bytes_at_peak=peak_point.region_peak_logits_bytes,  # the loss's: the same at any depth
            offload_bytes=affine_in_depth(one.memory.offload_bytes, two.memory.offload_bytes, full_units - 1),
            optimizer_state_bytes=affine_in_depth(
                one.memory.optimizer_state_bytes, two.memory.optimizer_state_bytes, full_units - 1
            ),
            timeline=timeline,
        )
        layers = [self._layer_row(one, two, index) for index in range(self.num_layers)]
        return SimulatedStep(
            depth=self.num_layers,
            memory=memory,
            layers=layers,
            host_bytes=affine_in_depth(one.host_bytes, two.host_bytes, full_units - 1),
            work=None if one.work is None or two.work is None or any(w is None for w in works) else tuple(works),
        )

    def stretch_keys(self, step: SimulatedStep) -> list[tuple[Any, int | None]]:
        """What each stretch an ``AllocationRecorder`` recorded of a shallow ``step`` is (before the step, watching's
        start, each timeline event, after the last), without its middle unit, beside the unit (None outside the
        middle): the stretches :func:`ckptlab.step.allocations.repeated` lines up between copies."""
        keys: list[tuple[Any, int | None]] = [(("before the step",), None), (("watching",), None)]
        for point in step.memory.timeline:
            kind, place, phase, micro_batch = self._key(point, step.depth)
            unit = place[1] if place[0] == "middle" else None
            where = (place[0], place[2]) if place[0] == "middle" else place
            keys.append(((kind, where, phase, micro_batch), unit))
        keys.append((("after the step",), None))
        return keys

    def _units_in_step_order(self, phase: str) -> range:
        # The forward meets the middle units first to last, the backward last to first.
        return range(self.middle_units) if phase != "backward" else range(self.middle_units - 1, -1, -1)

    def _key(self, point: TimelinePoint, depth: int) -> tuple[Any, ...]:
        # The micro-batch tells apart the events that gradient accumulation repeats: without it the last
        # micro-batch's event of a kind, place and phase stood for every earlier one's, whose gradients are fewer.
        return (point.kind, self._place(point.layer, depth), point.phase, point.micro_batch)

    def _relabel(self, point: TimelinePoint, key: tuple[Any, ...], unit: int) -> TimelinePoint:
        layer = self._layer_index(key[1], unit)
        return replace(point, layer=layer, event=region_for(point.kind, layer).description)

    def _layer_row(self, one: SimulatedStep, two: SimulatedStep, index: int) -> LayerResult:
        place = self._place(index, self.num_layers)
        if place[0] == "head":
            row = one.layers[place[1]]
        elif place[0] == "tail":
            row = one.layers[one.depth - self.tail + place[1]]
        elif place[1] == 0:
            row = one.layers[self.head + place[2]]
        else:
            # Not the first middle unit: shared tensors (the rotary tables) were already saved
            # by an earlier layer, as in unit 1 of the two-unit copy.
            row = two.layers[self.head + self.unit + place[2]]
        return replace(row, index=index, name=f"L{index + 1}")


def _stretch_work(step: SimulatedStep) -> tuple[StretchWork, ...]:
    """A shallow step's stretches of work (none counted: empty ones, and the fold's result has no work)."""
    return step.work if step.work is not None else ({},) * (len(step.memory.timeline) + 1)


def affine_in_depth(low: int, high: int, steps: int, span: int = 1) -> int:
    """A figure that grows affinely with the depth, ``steps`` layers (or middle units) past the depth where it is
    ``low``, from ``high``, its value ``span`` past that depth: ``low + (high - low) * steps / span``.

    The one rule of the depth's growth: the fold's (one middle unit more, ``span`` 1), the allocation order's
    (:mod:`.allocations`) and the replay's (any two recorded depths, :mod:`.replay`) call it.

    Raises:
        NotCombinable: the figure does not grow by a whole number at that depth (never with ``span`` 1);
            :func:`.opcount.combine` reads it as a call whose cost moves with the depth.
    """
    change = (high - low) * steps
    if change % span:
        raise NotCombinable("a figure does not grow by a whole number with the depth")
    return low + change // span


def _grown_by(units_before: int, units_after: int) -> Callable[..., int]:
    """``base`` grown by ``units_before`` steps of ``before - base`` and ``units_after`` of ``after - base``."""
    # Each side its own slope: what the units before an event add, plus what the units after it add.
    return lambda base, before, after: (
        affine_in_depth(base, before, units_before) + affine_in_depth(base, after, units_after) - base
    )


def _combined_work(op: Callable[..., int], base: StretchWork, before: StretchWork, after: StretchWork) -> Any:
    """Stretches of work combined as :func:`_combine` combines a point's bytes; None where they do not combine."""
    try:
        return combine(op, base, before, after)
    except NotCombinable:
        return None


def keys_of(*parts: dict[str, int]) -> list[str]:
    """The keys of breakdowns, each once, in the order they come: a set's order would change from process to
    process (string hashing is salted), and so would the key order of the JSON."""
    return list(dict.fromkeys(key for part in parts for key in part))


def _grow_dict(one: dict[str, int], two: dict[str, int], extra_units: int) -> dict[str, int]:
    grown = {key: affine_in_depth(one.get(key, 0), two.get(key, 0), extra_units) for key in keys_of(one, two)}
    return {key: value for key, value in grown.items() if value}


def _affine(one: TimelinePoint, two: TimelinePoint, extra_units: int) -> TimelinePoint:
    return _combine(one, two, one, extra_units, 0)


def _combine(
    base: TimelinePoint, before: TimelinePoint, after: TimelinePoint, units_before: int, units_after: int
) -> TimelinePoint:
    """``base`` grown by ``units_before`` steps of ``before - base`` and ``units_after`` of ``after - base``."""
    return map_figures(_grown_by(units_before, units_after), base, before, after)


def map_figures(op: Callable[..., int], first: TimelinePoint, *others: TimelinePoint) -> TimelinePoint:
    """``first`` with each of its byte figures (current, region peak, each breakdown key) ``op`` of the same figure of
    every point, ``first``'s and then the others'; the one place the fold and :mod:`.table` combine events.

    The float32 logits (``region_peak_logits_bytes``) live in the loss, outside the layers: ``first``'s, at any depth.
    """
    points = (first, *others)
    parts = [point.region_peak_breakdown for point in points]
    breakdown = {key: op(*(part.get(key, 0) for part in parts)) for key in keys_of(*parts)}
    return replace(
        first,
        current_bytes=op(*(point.current_bytes for point in points)),
        region_peak_bytes=op(*(point.region_peak_bytes for point in points)),
        region_peak_breakdown={key: amount for key, amount in breakdown.items() if amount},
    )
