"""Pure helpers over a run's memory timeline (``MemoryResult.timeline``): order, positions, layer states.

A timeline is one :class:`~ckptlab.results.TimelinePoint` per probe event of the observed memory
step: ``kind``, ``phase``, ``layer`` (0-based or None), ``rerun``, ``current_bytes`` (memory in
use at the event) and ``region_peak_bytes`` (the highest memory before the next event). From it
and the per-layer roles (CP / keep) these functions say:

- whether the events came in a valid order (:func:`check_order`);
- where each event sits on a common axis, so that two settings overlay layer by layer even
  though only one of them has reruns (:func:`positions`);
- the stretches to shade by phase (:func:`phase_spans`);
- what every layer holds at one event: not reached yet, running, holding its activations,
  holding only its input, being recomputed, in its backward, or freed (:func:`layer_states`).

Nothing here measures; everything comes from a recorded run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..results import LayerResult, TimelinePoint

PHASE_RANK = {"forward": 0, "loss": 1, "backward": 2, "optimizer": 3}
# What a layer is doing / holding at one event of the step.
STATES = ("pending", "running", "held", "input_only", "recomputing", "backward", "freed")
BANDS = ("forward", "loss", "backward", "rerun", "optimizer")  # what the shading of a stretch says


@dataclass(frozen=True)
class Span:
    """A stretch of the step's axis that belongs to one band (forward, loss, backward or rerun)."""

    band: str
    start: float
    end: float
    layer: int | None = None  # for a rerun span: the layer being recomputed


def check_order(timeline: Sequence[TimelinePoint], roles: Sequence[str]) -> list[str]:
    """Problems with the order of a timeline's events; an empty list means a valid step.

    Valid: the orders count up from 0; all forward events come before the loss, the loss
    before the backward; the forward visits the layers first to last, the backward last to
    first; every rerun is inside the backward, right after its layer's backward starts, and
    only CP layers rerun, each exactly once.

    Args:
        timeline: ``MemoryResult.timeline``.
        roles: per layer, "CP" or "keep" (the plan, or what the run observed).

    Returns:
        One sentence per problem found.
    """
    problems: list[str] = []
    if not timeline:
        return ["the timeline is empty"]
    orders = [point.order for point in timeline]
    if orders != list(range(len(timeline))):
        problems.append(f"orders are not 0..{len(timeline) - 1}: {orders}")
    ranks = [PHASE_RANK.get(point.phase, -1) for point in timeline]
    if -1 in ranks:
        problems.append("an event has an unknown phase")
    if ranks != sorted(ranks):
        first_bad = next(i for i in range(1, len(ranks)) if ranks[i] < ranks[i - 1])
        problems.append(f"event {first_bad} ({timeline[first_bad].phase}) comes after a later phase")
    if sum(point.kind == "loss" for point in timeline) != 1:
        problems.append("the step must have exactly one loss event")

    forward_layers = [point.layer for point in timeline if point.kind == "layer_forward"]
    if forward_layers != list(range(len(roles))):
        problems.append(f"the forward visited layers {forward_layers}, expected 0..{len(roles) - 1} in order")
    backward_layers = [point.layer for point in timeline if point.kind == "layer_backward"]
    if backward_layers != list(range(len(roles) - 1, -1, -1)):
        problems.append(f"the backward visited layers {backward_layers}, expected {len(roles) - 1}..0 in order")

    reruns: dict[int, int] = {}
    for index, point in enumerate(timeline):
        if point.kind != "rerun":
            continue
        layer = point.layer
        if layer is None:
            problems.append(f"the rerun at event {index} names no layer")
            continue
        reruns[layer] = reruns.get(layer, 0) + 1
        if point.phase != "backward" or not point.rerun:
            problems.append(f"the rerun of L{layer + 1} (event {index}) is not marked as a backward rerun")
        previous = timeline[index - 1] if index else None
        if previous is None or previous.kind != "layer_backward" or previous.layer != layer:
            problems.append(
                f"the rerun of L{layer + 1} (event {index}) does not follow the start of L{layer + 1}'s backward"
            )
        if not 0 <= layer < len(roles) or roles[layer] != "CP":
            problems.append(f"L{layer + 1} reran (event {index}) but is not a CP layer")
    for layer, role in enumerate(roles):
        if role == "CP" and reruns.get(layer, 0) != 1:
            problems.append(f"CP layer L{layer + 1} reran {reruns.get(layer, 0)} times, expected once")
    return problems


def peak_index(timeline: Sequence[TimelinePoint]) -> int:
    """The event whose stretch holds the step's highest memory (the first of equal highs)."""
    return max(range(len(timeline)), key=lambda index: timeline[index].region_peak_bytes)


def peak_bytes(timeline: Sequence[TimelinePoint]) -> int:
    """The highest memory over the whole step, as the timeline saw it."""
    return timeline[peak_index(timeline)].region_peak_bytes


def num_layers(timeline: Sequence[TimelinePoint]) -> int:
    """How many layers the step ran (the highest layer index seen, plus one)."""
    return 1 + max((point.layer for point in timeline if point.layer is not None), default=-1)


def micro_batches(timeline: Sequence[TimelinePoint]) -> int:
    """How many micro-batches the step ran (gradient accumulation; 1 without it)."""
    return 1 + max((point.micro_batch for point in timeline), default=0)


def position(kind: str, layer: int | None, layers: int, micro_batch: int = 0, micro_batches: int = 1) -> float:
    """Where an event sits on the step's common axis (0 at the embeddings, ``4 * layers + 3`` at the end).

    Each layer gets two units in the forward (its forward, then the stretch after it) and two
    in the backward (its backward start, then its rerun), whether or not it reruns: the same
    layer sits at the same place for every every_n_layers. With gradient accumulation each
    micro-batch takes the same span again, one after the other, and the gradient norm and the
    optimizer's step follow the last one.

    Raises:
        ValueError: for an event kind the axis does not know.
    """
    span = 4 * layers + 3  # one micro-batch: embeddings to the end of its backward
    backward_slot = 2 * layers + 2 + 2 * (layers - 1 - (layer or 0))
    table = {
        "embeddings": 0,
        "micro_batch": 0,  # the next micro-batch's forward starts as the first one's does
        "layer_forward": 1 + 2 * (layer or 0),
        "layer_done": 2 + 2 * (layer or 0),
        "loss": 2 * layers,
        "backward": 2 * layers + 1,
        "layer_backward": backward_slot,
        "rerun": backward_slot + 1,
        "backward_end": 4 * layers + 2,
        "grad_norm": 4 * layers + 2.5,
        "optimizer": 4 * layers + 3,
    }
    if kind not in table:
        raise ValueError(f"unknown timeline event kind {kind!r}")
    after_the_last = kind in ("grad_norm", "optimizer")
    return float(table[kind] + span * ((micro_batches - 1) if after_the_last else micro_batch))


def end_position(layers: int, micro_batches: int = 1) -> float:
    """The end of the step on the common axis."""
    return float(4 * layers + 4 + (4 * layers + 3) * (micro_batches - 1))


def positions(timeline: Sequence[TimelinePoint], layers: int | None = None) -> list[float]:
    """Each event's place on the common axis (see :func:`position`)."""
    count = num_layers(timeline) if layers is None else layers
    total = micro_batches(timeline)
    return [position(point.kind, point.layer, count, point.micro_batch, total) for point in timeline]


def stretch_ends(timeline: Sequence[TimelinePoint], layers: int | None = None) -> list[float]:
    """Where each event's stretch ends: the next event's place, and the step's end for the last one."""
    count = num_layers(timeline) if layers is None else layers
    places = positions(timeline, count)
    return [*places[1:], end_position(count, micro_batches(timeline))]


def phase_spans(timeline: Sequence[TimelinePoint], layers: int | None = None) -> list[Span]:
    """The stretches of the step by band: forward, loss, backward, and each rerun on its own."""
    count = num_layers(timeline) if layers is None else layers
    spans: list[Span] = []
    for point, start, end in zip(timeline, positions(timeline, count), stretch_ends(timeline, count)):
        band = "rerun" if point.rerun else point.phase
        layer = point.layer if band == "rerun" else None
        if spans and spans[-1].band == band and band != "rerun" and spans[-1].end == start:
            spans[-1] = Span(band, spans[-1].start, end)
        else:
            spans.append(Span(band, start, end, layer))
    return spans


def layer_states(timeline: Sequence[TimelinePoint], roles: Sequence[str], index: int) -> list[str]:
    """What each layer holds or does during event ``index``'s stretch (one of :data:`STATES`).

    pending: the forward has not reached it; running: its forward is running; held: a keep
    layer holding all its activations; input_only: a CP layer that discarded its activations
    and kept its input; recomputing: its rerun (and then its gradients) in the backward;
    backward: a keep layer computing its gradients; freed: its backward is done.

    Raises:
        IndexError: ``index`` is outside the timeline.
    """
    if not 0 <= index < len(timeline):
        raise IndexError(f"event {index} is outside the timeline (0..{len(timeline) - 1})")
    states = ["pending"] * len(roles)

    def done(layer: int) -> str:
        return "held" if roles[layer] == "keep" else "input_only"

    for point in timeline[: index + 1]:
        kind, layer = point.kind, point.layer
        if kind == "loss" and roles:
            states[-1] = done(len(roles) - 1)
        elif kind == "backward_end":
            states = ["freed" if state != "pending" else state for state in states]
        elif kind == "micro_batch":  # the next micro-batch's forward: no layer has run it yet
            states = ["pending"] * len(roles)
        elif layer is None:  # every other kind of event is a layer's
            continue
        elif kind == "layer_forward":
            states[layer] = "running"
        elif kind == "layer_done":
            states[layer] = done(layer)
        elif kind == "layer_backward":
            states = ["freed" if state in ("backward", "recomputing") else state for state in states]
            states[layer] = "backward" if roles[layer] == "keep" else "input_only"
        elif kind == "rerun":
            states[layer] = "recomputing"
    return states


def layer_bytes(states: Sequence[str], layers: Sequence[LayerResult], point: TimelinePoint) -> list[int]:
    """Bytes each layer accounts for in one stretch, all of them measured by the run.

    held / backward / running: what autograd saved while the layer ran (``saved_bytes``);
    input_only: its input (``input_bytes``); recomputing: its input plus how far memory rose
    during the rerun stretch (``region_peak_bytes - current_bytes``); pending / freed: 0.

    Args:
        states: :func:`layer_states` at the event.
        layers: the run's ``LayerResult`` rows (``saved_bytes``, ``input_bytes``).
        point: the timeline point of the event.
    """
    rise = point.rise_bytes
    values = []
    for state, layer in zip(states, layers):
        if state in ("held", "backward", "running"):
            values.append(layer.saved_bytes)
        elif state == "input_only":
            values.append(layer.input_bytes)
        elif state == "recomputing":
            values.append(layer.input_bytes + rise)
        else:
            values.append(0)
    return values


def rerun_bumps(timeline: Sequence[TimelinePoint]) -> dict[int, int]:
    """For each rerun: how far memory rose above the level at its start (layer -> bytes)."""
    return {point.layer: point.rise_bytes for point in timeline if point.kind == "rerun" and point.layer is not None}
