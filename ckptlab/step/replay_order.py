"""The order of a replayed step's allocations (issue 60), composed stretch by stretch as :mod:`.replay` composes bytes.

A recorded shallow step's births and frees (:class:`~.allocations.AllocationRecorder`) are written as tokens that
name no storage by its number in that step, so that a stretch's tokens mean the same in any plan that has the stretch:

- a birth: its bytes, its stream, and whether a later stretch frees it (an *escape* of its stretch);
- a free of a storage its own stretch made: how far from the top it lies among that stretch's live births (the
  gradient norm frees its per-parameter norms this way, however many the depth makes);
- a free of a layer's storage: the layer (by its distance from the freeing layer; in a stretch outside the layers,
  the first, the last, or every layer in turn), its phase group (a layer's forward, or its backward with its rerun: a
  checkpointed layer's backward births are its rerun's) and the escape counted from the group's last (the layer's
  output is its forward's last escape, checkpointed or not);
- a free of a storage of a stretch outside the layers: that stretch and its escape, from its last;
- a free of a storage made before the step (parameters, optimizer state): its rank among those still live, from the
  oldest (the embeddings' come first at any depth).

A plan's order is its stretches' tokens in the plan's order (:func:`.replay._events`), each free resolved to the birth
it names. A layer's and an end's stretch come from a recorded step with the same kind of stretch (and, for a layer,
whether it is the last); the stretches that grow with the depth (before the step, the gradient norm, the
optimizer) from steps of three depths, the block that the deepest adds repeated (the third checks it).

Where a premise fails (two steps give one kind of stretch different tokens, a free names no birth of the bytes it
frees, a depth's stretch is not the other's with blocks added), :class:`~.fold.NotDerivable` is raised for the order
alone: the bytes are replayed all the same, and the device total simulates that setting for its order.
``tests/step/test_replay.py`` compares the composed order with simulating every layer's, event for event.
"""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..model.plan import Role
from ..results import TimelinePoint
from ..results.allocations import STRETCHES_REPLAYED, AllocationTrace, Stream
from .allocations import AllocationRecorder, check_frees, note_thread_start, stretch_phases
from .fold import NotDerivable, affine_in_depth
from .opcount import NotCombinable

GROWING = ("grad_norm", "optimizer")  # stretches that follow every parameter (replay.AFFINE_KINDS)
HEAD = ("loss", "backward")  # stretches above the last layer (replay.HEAD_KINDS)
BEFORE, AFTER = ("before",), ("after",)  # the stretches before the step's first event and after its last

Token = tuple[Any, ...]


def _stretch_id(point: TimelinePoint) -> tuple[Any, ...]:
    """A recorded stretch of a point, as the frees of later stretches name it."""
    if point.layer is None:
        return ("ends", point.kind, point.micro_batch)
    return ("layer", point.layer, point.phase, point.micro_batch)


@dataclass(frozen=True)
class StepOrder:
    """A recorded step's tokens, stretch by stretch: before the step (what was tracked before, and watching's start),
    then each timeline point's (the recorder's finish and after: not the step's, ``AllocationRecorder.step_trace``)."""

    before: tuple[Token, ...]  # what was tracked before the step: it grows with the depth
    prelude: tuple[Token, ...]  # watching's start to the first event: it depends on the plan's ends (as its bytes)
    points: tuple[tuple[Token, ...], ...]

    @classmethod
    def of(
        cls,
        recorder: AllocationRecorder,
        timeline: Sequence[TimelinePoint],
        keys: Sequence[Hashable],
        inputs: dict[int, tuple[int, int]],
    ) -> StepOrder:
        """``recorder``'s stretches (before, watching's start, one per point of ``timeline``, after) as tokens, in a
        step whose layers have ``keys`` (``replay.LayerKey``) and whose ``inputs`` are the storages handed to a layer
        as its input (ordinal -> the layer, the place among its inputs).

        Raises:
            NotDerivable: the recorder's stretches do not match the timeline, or a layer's storage is freed outside
                the layers in an order the tokens cannot say.
        """
        recorder.trace()  # settles a pending resize
        stretches = recorder.stretches
        if len(stretches) != len(timeline) + 3:
            raise NotDerivable(f"{len(stretches)} stretches recorded for {len(timeline)} events")
        ids: list[tuple[Any, ...]] = [BEFORE, BEFORE, *(_stretch_id(p) for p in timeline), AFTER]
        made_in: dict[int, int] = {}
        freed_in: dict[int, int] = {}
        for index, events in enumerate(stretches):
            for event in events:
                (made_in if event >= 0 else freed_in)[event if event >= 0 else ~event] = index
        # Watching's start is before the step too: its storages are ranked with the tracked ones.
        home = [0 if index == 1 else index for index in range(len(stretches))]
        escapes: dict[tuple[Any, ...], list[int]] = {}
        for index, events in enumerate(stretches):
            for event in events:
                freed = freed_in.get(event)
                if event >= 0 and (freed is None or home[freed] != home[index]):
                    escapes.setdefault(ids[index], []).append(event)
        live_before: list[int] = []
        tokens: list[list[Token]] = []
        for index, events in enumerate(stretches[:-1]):  # the last is the tracker's letting go: not the step's
            local: list[int] = []
            out: list[Token] = []
            point = timeline[index - 2] if 2 <= index < len(timeline) + 2 else None
            for event in events:
                if event >= 0:
                    escaping = event in escapes.get(ids[index], ())
                    out.append(
                        ("b", recorder.sizes[event], recorder.streams[event], escaping, _handed(inputs, event, point))
                    )
                    (live_before if ids[index] == BEFORE else local).append(event)
                    continue
                ordinal = ~event
                maker = made_in[ordinal]
                if ids[maker] == BEFORE:
                    if ids[index] == BEFORE:
                        out.append(("fs", len(live_before) - 1 - live_before.index(ordinal)))
                    else:
                        out.append(("fp", live_before.index(ordinal)))
                    live_before.remove(ordinal)
                elif maker == index:
                    out.append(("fs", len(local) - 1 - local.index(ordinal)))
                    local.remove(ordinal)
                elif ordinal in inputs:  # a layer's input: that layer's, whoever made it (as the bytes' labels say)
                    layer, place = inputs[ordinal]
                    mb = timeline[maker - 2].micro_batch
                    if point is not None and point.layer is not None:
                        out.append(("fl", layer - point.layer, "input", mb, place))
                    else:
                        out.append(("fo", layer, "input", mb, place))
                else:
                    group = escapes[ids[maker]]
                    from_last = len(group) - 1 - group.index(ordinal)
                    made = ids[maker]
                    if made[0] == "ends":
                        out.append(("fe", made[1], made[2], from_last))
                    elif point is not None and point.layer is not None:
                        out.append(("fl", made[1] - point.layer, made[2], made[3], from_last))
                    else:
                        out.append(("fo", made[1], made[2], made[3], from_last))
            head = point is not None and point.kind in HEAD
            tokens.append(_outside_layers(out, keys, head) if ids[index][0] != "layer" else out)
        return cls(tuple(tokens[0]), tuple(tokens[1]), tuple(tuple(t) for t in tokens[2:]))


def _handed(inputs: dict[int, tuple[int, int]], ordinal: int, point: TimelinePoint | None) -> tuple[Any, ...] | None:
    """Where a birth goes as a layer's input: the layer (from the making layer, or outside the layers the layer
    itself) and its place among that layer's inputs; None where it is no layer's input."""
    if ordinal not in inputs:
        return None
    layer, place = inputs[ordinal]
    if point is not None and point.layer is not None:
        return ("near", layer - point.layer, place)
    if layer:
        raise NotDerivable(f"a stretch outside the layers makes layer {layer}'s input")
    return ("first", 0, place)


def _labels(keys: Sequence[Hashable], head: bool) -> list[tuple[bool, Hashable]]:
    """Each layer's label for a stretch outside the layers, as the bytes' replay labels what it leaves that stretch:
    its key, and whether it is the layer next to the stretch (the last for the head's, ``head``; else the first)."""
    return [(at == (len(keys) - 1 if head else 0), key) for at, key in enumerate(keys)]


def _outside_layers(tokens: list[Token], keys: Sequence[Hashable], head: bool) -> list[Token]:
    """A stretch outside the layers with each free of a layer's storage saying which layer as a plan of any depth
    would: the next in a sweep (from the first, or from the last) over every layer, or over the layers of some
    labels (:func:`_labels`: the bytes' premise, each such layer leaving the stretch alike)."""
    labels = _labels(keys, head)
    layers: dict[tuple[Any, ...], list[int]] = {}
    for token in tokens:
        if token[0] == "fo":
            layers.setdefault(token[2:], []).append(token[1])
    where: dict[tuple[Any, ...], tuple[str, Any]] = {}
    for pattern, seen in layers.items():
        chosen = frozenset(labels[at] for at in seen)
        among = [at for at in range(len(keys)) if labels[at] in chosen]
        every = "every" if len(among) == len(keys) else chosen  # every layer: whatever labels the plan has
        if seen == among:
            where[pattern] = ("up", every)
        elif seen == among[::-1]:
            where[pattern] = ("down", every)
        else:
            raise NotDerivable(f"a stretch outside the layers frees the layers {seen}'s storages")
    return [("fo", where[token[2:]], *token[2:]) if token[0] == "fo" else token for token in tokens]


class OrderSources:
    """The tokens of every kind of stretch a group's recorded steps hold (checked where two hold one), and those
    that grow with the depth from the steps of every group of the same parameters.

    Raises:
        NotDerivable: two steps give one kind of stretch different tokens, or a step has no recorded order.
    """

    def __init__(self, steps: Sequence[Any], sized: Sequence[Any], key_of: Any) -> None:
        self.stretches: dict[tuple[Any, ...], tuple[Token, ...]] = {}
        for step in steps:
            order = _order_of(step)
            roles = step.roles
            self._put(_prelude(roles), order.prelude)
            for point, tokens in zip(step.step.memory.timeline, order.points, strict=True):
                if point.kind not in GROWING:
                    self._put(_key(point, roles, key_of), tokens)
        by_depth: dict[int, dict[tuple[Any, ...], tuple[Token, ...]]] = {}
        for step in sized:
            order = _order_of(step)
            grown: dict[tuple[Any, ...], tuple[Token, ...]] = {BEFORE: order.before}
            for point, tokens in zip(step.step.memory.timeline, order.points, strict=True):
                if point.kind in GROWING:
                    grown[(point.kind, point.micro_batch)] = tokens
            if by_depth.setdefault(step.depth, grown) != grown:
                raise NotDerivable(f"two steps of {step.depth} layers differ in the order that grows with the depth")
        # Two depths may not tell where a layer's block starts in a run of alike events (the optimizer's state,
        # group by group): a third checks it, as the fold's third copy does.
        if len(by_depth) < 3:
            raise NotDerivable("the order that grows with the depth needs steps of three depths")
        self._by_depth = by_depth

    def _put(self, key: tuple[Any, ...], tokens: tuple[Token, ...]) -> None:
        if self.stretches.setdefault(key, tokens) != tokens:
            raise NotDerivable(f"two steps differ in the order of {key}")

    def grown(self, name: tuple[Any, ...], depth: int) -> tuple[Token, ...]:
        """The tokens of a stretch that grows with the depth, at ``depth`` layers (checked on a third depth)."""
        depths = sorted(self._by_depth)
        if any(name not in self._by_depth[at] for at in depths):
            raise NotDerivable(f"no recorded depths hold the stretch {name}")
        # The nearest depths line the blocks up best (difflib sees one layer added), the farthest where they do not;
        # either is taken only where every other recorded depth checks it.
        for low, high in dict.fromkeys([(depths[0], depths[1]), (depths[0], depths[-1])]):
            try:
                made = _grow(self._by_depth[low][name], self._by_depth[high][name], low, high)
            except NotDerivable:
                continue
            if all(made(other) == self._by_depth[other][name] for other in depths):
                break
        else:
            raise NotDerivable(f"the order of {name} does not grow evenly with the depth")
        return made(depth)

    def compose(
        self, roles: Sequence[Role], timeline: Sequence[TimelinePoint], key_of: Any, keys: Sequence[Hashable]
    ) -> AllocationTrace:
        """The order of the plan ``roles`` whose events are ``timeline`` (the replayed step's), its layers' keys
        ``keys``.

        Raises:
            NotDerivable: a kind of stretch no step recorded, or a free that names no birth of its bytes.
        """
        depth = len(roles)
        if any(point.micro_batch for point in timeline):
            # A free names its maker's micro-batch, but accumulation's micro-batches have not been checked to compose.
            raise NotDerivable("the order of a step of several micro-batches is not composed")
        if _prelude(roles) not in self.stretches:
            raise NotDerivable(f"no recorded step has the order of the start {_prelude(roles)}")
        stretches: list[tuple[tuple[Any, ...], TimelinePoint | None, tuple[Token, ...]]] = [
            (BEFORE, None, self.grown(BEFORE, depth)),
            (BEFORE, None, self.stretches[_prelude(roles)]),
        ]
        for point in timeline:
            if point.kind in GROWING:
                tokens = self.grown((point.kind, point.micro_batch), depth)
            else:
                key = _key(point, roles, key_of)
                if key not in self.stretches:
                    raise NotDerivable(f"no recorded step has the order of a stretch {key}")
                tokens = self.stretches[key]
            stretches.append((_stretch_id(point), point, tokens))
        return _resolve(stretches, keys, stretch_phases(timeline))


def _prelude(roles: Sequence[Role]) -> tuple[Any, ...]:
    """What watching's start depends on: the plan's first and last roles and the roles present (``replay``)."""
    return ("prelude", roles[0], roles[-1], frozenset(roles))


def _order_of(step: Any) -> StepOrder:
    if step.order is None:
        raise NotDerivable("a recorded step has no order of allocations")
    return step.order


def _key(point: TimelinePoint, roles: Sequence[Role], key_of: Any) -> tuple[Any, ...]:
    """What a stretch's tokens depend on: its kind of stretch (the bytes' key), and for a layer whether it is the last
    (the head, not a layer, is above it)."""
    return (key_of(point, roles), point.layer == len(roles) - 1)


def _grow(low: tuple[Token, ...], high: tuple[Token, ...], at_low: int, at_high: int) -> Any:
    """A function of the depth giving a stretch's tokens: ``low``'s with each block that ``high`` adds (``at_high -
    at_low`` repeats of one layer's block) repeated once a layer; a birth's bytes that differ (the stacked norms)
    affine in the depth."""
    span = at_high - at_low

    # Bytes that one depth holds and the other does not (the stacked norms) line up as any bytes, checked affine.
    held = [{token[1] for token in tokens if token[0] == "b"} for tokens in (low, high)]
    varying = held[0] ^ held[1]

    def shape(tokens: tuple[Token, ...]) -> list[Token]:
        return [("b", None, *token[2:]) if token[0] == "b" and token[1] in varying else token for token in tokens]

    lows, highs = shape(low), shape(high)
    inserts: list[tuple[int, int, int]] = []  # (place in low, place in high, length)
    for tag, i1, _, j1, j2 in difflib.SequenceMatcher(None, lows, highs, autojunk=False).get_opcodes():
        if tag == "insert" and (j2 - j1) % span == 0:
            inserts.append((i1, j1, j2 - j1))
        elif tag != "equal":
            raise NotDerivable("a deeper step's stretch is not the shallower's with a block a layer added")
    pieces: list[tuple[str, Any]] = []
    done_low = done_high = 0
    number = 0
    while number < len(inserts):
        # difflib may place a block a few events off a layer's start (a rotation of its repeats) or cut it in two
        # around events both depths hold: the block is placed where the events it adds are one layer's repeated and
        # the rest lines up, merged with the next insertions where alone it has no such place.
        for merged in range(1, len(inserts) - number + 1):
            length = sum(n for _, _, n in inserts[number : number + merged])
            ahead = inserts[number + merged] if number + merged < len(inserts) else (len(low), len(high), 0)
            place = _place(
                lows, highs, high, (done_low, done_high), (ahead[0], ahead[1]), inserts[number][1], length, span
            )
            if place is not None:
                break
        else:
            raise NotDerivable("a deeper step's stretch adds blocks that are not one layer's repeated")
        here_low, here_high, blocks = place
        pieces.append(("fixed", list(zip(low[done_low:here_low], high[done_high:here_high], strict=True))))
        pieces.extend(("block", block) for block in blocks)
        done_low, done_high = here_low, here_high + length
        number += merged
    if lows[done_low:] != highs[done_high:]:
        raise NotDerivable("a deeper step's stretch is not the shallower's with a block a layer added")
    pieces.append(("fixed", list(zip(low[done_low:], high[done_high:], strict=True))))

    def at(depth: int) -> tuple[Token, ...]:
        if depth < at_low:
            raise NotDerivable(f"{depth} layers are fewer than a recorded step's")
        out: list[Token] = []
        for kind, piece in pieces:
            if kind == "block":
                out += list(piece) * (depth - at_low)
                continue
            for a, b in piece:
                if a == b:
                    out.append(a)
                    continue
                try:
                    nbytes = affine_in_depth(a[1], b[1], depth - at_low, span)
                except NotCombinable as exc:
                    raise NotDerivable("a birth's bytes do not grow by whole bytes") from exc
                out.append((a[0], nbytes, *a[2:]))
        return tuple(out)

    return at


def _place(
    lows: list[Token],
    highs: list[Token],
    high: tuple[Token, ...],
    done: tuple[int, int],
    ahead: tuple[int, int],
    near: int,
    length: int,
    span: int,
) -> tuple[int, int, list[tuple[Token, ...]]] | None:
    """Where (in low, in high) a block of ``length`` events that the deeper adds sits after what is ``done`` and before
    the next insertion ``ahead``, nearest ``near`` first, and the blocks a layer it is made of: the events around it
    lined up with the shallower's, and the added events one or more layer's blocks in a row, each repeated ``span``
    times (:func:`_repeats`); None where there is no such place."""
    (done_low, done_high), (ahead_low, ahead_high) = done, ahead
    found: list[tuple[int, int, list[tuple[Token, ...]]]] = []
    deeper: set[tuple[Token, ...]] = set()  # each place's events with one layer more: they must agree
    for here_high in sorted(range(done_high, ahead_high - length + 1), key=lambda at: abs(at - near)):
        here_low = done_low + (here_high - done_high)
        if highs[done_high:here_high] != lows[done_low:here_low]:
            continue
        if highs[here_high + length : ahead_high] != lows[here_low:ahead_low]:
            continue
        blocks = _repeats(high[here_high : here_high + length], span)
        if blocks is not None:
            found.append((here_low, here_high, blocks))
            once_more = tuple(token for block in blocks for token in block * (span + 1))
            deeper.add(high[done_high:here_high] + once_more + high[here_high + length : ahead_high])
    if len(deeper) > 1:  # two depths do not tell where a layer's block starts (the fold tells it from three)
        raise NotDerivable("two places of a layer's block give other orders at another depth")
    return found[0] if found else None


def _repeats(added: tuple[Token, ...], span: int) -> list[tuple[Token, ...]] | None:
    """``added`` as the fewest layer's blocks in a row, each repeated ``span`` times (``[a, a, b, b]``, ``span`` 2:
    ``[a]`` then ``[b]``); None where it is not so made.

    A stretch that follows the parameters group by group adds a block a layer in each group: AdamW's state is born
    for the decayed parameters of every layer, then for the not decayed (``Trainer.get_decay_parameter_names``). Where
    no event outside the layers sits between the groups (tied embeddings: qwen3-0.6b), difflib sees the two groups'
    blocks as one insertion, the first group's layers then the second's: split here, each is one layer's repeated."""
    width = len(added) // span
    if added == added[:width] * span:  # one layer's block (the common case, checked first: the split costs more)
        return [added[:width]]
    # fewest[at]: the fewest blocks that make added[at:], with the first block's width (0 at the end).
    fewest: dict[int, tuple[int, int]] = {len(added): (0, 0)}
    for at in range(len(added) - span, -1, -span):
        ways = [
            (fewest[rest][0] + 1, width)
            for width in range(1, (len(added) - at) // span + 1)
            if (rest := at + width * span) in fewest and added[at:rest] == added[at : at + width] * span
        ]
        if ways:
            fewest[at] = min(ways)  # the fewest blocks, the narrowest first block among them
    if 0 not in fewest:
        return None
    blocks: list[tuple[Token, ...]] = []
    at = 0
    while at < len(added):
        width = fewest[at][1]
        blocks.append(added[at : at + width])
        at += width * span
    return blocks


def _resolve(
    stretches: Sequence[tuple[tuple[Any, ...], TimelinePoint | None, tuple[Token, ...]]],
    keys: Sequence[Hashable],
    phases: Sequence[str | None],
) -> AllocationTrace:
    """The trace of ``stretches``' tokens, each free resolved to the birth it names."""
    sizes: list[int] = []
    streams: list[Stream] = []
    events: list[int] = []
    starts: list[int] = []
    escapes: dict[tuple[Any, ...], list[int]] = {}
    inputs: dict[tuple[Any, ...], int] = {}  # (a layer's input group, its place) -> the ordinal handed to it
    live_before: list[int] = []
    # A free naming a layer's or an end's escape is resolved once every stretch is placed (a group may end later).
    pending: list[tuple[int, tuple[Any, ...], int]] = []  # (place in events, the group, the escape from its last)
    # The recorder's phases: none before the step and at watching's start, then each point's, none after.
    phase_of = phases
    for index, (name, point, tokens) in enumerate(stretches):
        note_thread_start(starts, phase_of[index] if index < len(phase_of) else None, len(events))
        local: list[int] = []
        sweeps: dict[tuple[Any, ...], int] = {}
        for token in tokens:
            if token[0] == "b":
                _, nbytes, stream, escaping, handed = token
                sizes.append(nbytes)
                streams.append(stream)
                ordinal = len(sizes) - 1
                events.append(ordinal)
                if escaping:
                    escapes.setdefault(name, []).append(ordinal)
                if handed is not None:
                    layer = handed[1] if point is None or point.layer is None else point.layer + handed[1]
                    inputs[("layer", layer, "input", point.micro_batch if point else 0, handed[2])] = ordinal
                (live_before if name == BEFORE else local).append(ordinal)
                continue
            kind = token[0]
            if kind == "fs":
                stack = live_before if name == BEFORE else local
                events.append(~_take(stack, len(stack) - 1 - token[1]))
            elif kind == "fp":
                events.append(~_take(live_before, token[1]))
            elif kind == "fe":
                events.append(0)
                pending.append((len(events) - 1, ("ends", token[1], token[2]), token[3]))
            else:
                if kind == "fl":
                    assert point is not None and point.layer is not None
                    layer = point.layer + token[1]
                else:
                    head = point is not None and point.kind in HEAD
                    layer = _layer_outside(token, _labels(keys, head), sweeps)
                events.append(0)
                pending.append((len(events) - 1, ("layer", layer, token[2], token[3]), token[4]))
    for place, group, from_last in pending:
        if group[2] == "input":
            handed = group + (from_last,)
            if handed not in inputs:
                raise NotDerivable(f"a free names an input of layer {group[1]} no stretch of the plan hands it")
            events[place] = ~inputs[handed]
            continue
        held = escapes.get(group, [])
        if not 0 <= from_last < len(held):
            raise NotDerivable(f"a free names an escape of {group} the plan's stretch does not have")
        events[place] = ~held[len(held) - 1 - from_last]
    check_frees(events, "the composed order frees a storage that is not live")
    return AllocationTrace(tuple(sizes), tuple(streams), tuple(events), STRETCHES_REPLAYED, tuple(starts))


def _take(stack: list[int], at: int) -> int:
    if not 0 <= at < len(stack):
        raise NotDerivable("a free names a storage its stretch does not hold")
    return stack.pop(at)


def _layer_outside(token: Token, labels: Sequence[tuple[bool, Hashable]], sweeps: dict[tuple[Any, ...], int]) -> int:
    """The layer a free outside the layers names: the next of its sweep over the layers of its labels."""
    (direction, chosen), pattern = token[1], token[2:]
    among = [at for at, label in enumerate(labels) if chosen == "every" or label in chosen]
    count = sweeps.get(pattern, 0)
    sweeps[pattern] = count + 1
    if count >= len(among):
        raise NotDerivable("a sweep outside the layers runs past the plan's layers of its labels")
    return among[count] if direction == "up" else among[len(among) - 1 - count]
