"""The order of a simulated step's allocations, recorded from its memory tracker and extended as the fold extends.

:class:`AllocationRecorder` is a ``TraceSink`` (:mod:`.torch_workarounds`): the tracker tells it every change of every storage
on the device, and it keeps the births and frees in order, stretch by stretch (the same stretches as the timeline's
events), with the stream each came from (offload's host copies apart; under FSDP2 its collectives' buffers on its own
streams: :meth:`AllocationRecorder.follow_streams`). :func:`repeated` builds the whole step's order
from shallow copies as :class:`~.fold.Reduction` builds its bytes: the middle units' events repeated, each free
pointing at the storage it frees in the full step (the allocator needs the whole order, not byte totals).
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

from ..results import TimelinePoint
from ..results.allocations import (
    ALL_GATHER,
    COMPUTE,
    HOST_COPIES,
    LAYERS_REPEATED,
    REDUCE_SCATTER,
    WHOLE_STEP,
    AllocationTrace,
    Stream,
)
from .fold import NotDerivable, affine_in_depth
from .memory_meters import HOST
from .torch_workarounds import LOGITS

# FSDP2's streams (``torch_workarounds.FSDP_STREAMS``) that allocate in a step, as the trace names them. In torch 2.13
# nothing is born on ``all_gather_stream`` (NCCL's all-gather writes into the output made on the copy-in stream) nor
# on ``all_reduce_stream`` (HSDP's, which the lab does not run): a birth there is refused by name, not put in a pool
# it does not belong to.
FSDP_STREAM_NAMES: dict[str, Stream] = {
    "all_gather_copy_in_stream": ALL_GATHER,
    "reduce_scatter_stream": REDUCE_SCATTER,
}


class AllocationRecorder:
    """A ``TraceSink`` that keeps the order of births and frees, by stretch.

    Stretch 0 of :attr:`stretches` is what was tracked before the step (parameters, optimizer state), 1 the start of
    watching to the first event, ``k + 2`` the stretch of the timeline's point ``k`` (as ``replay.StepTrace``).
    """

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.streams: list[Stream] = []
        self.stretches: list[list[int]] = [[]]
        # storage -> [its ordinal or -1 while resized to nothing, its bytes, the stream of its last change]
        self._live: dict[int, list] = {}
        self._pending: int | None = None  # a storage whose bytes changed: settled at the next other change
        self._stream_now: Callable[[], str | None] = lambda: None  # the default stream: COMPUTE

    def follow_streams(self, now: Callable[[], str | None]) -> None:
        """Tag each device storage born (or resized) from now on with the stream current then, as ``now()`` names
        it (``torch_workarounds.fsdp_stream_now``): the caching allocator takes its block from that stream's pool."""
        self._stream_now = now

    def _device_stream(self) -> Stream:
        name = self._stream_now()
        if name is None:
            return COMPUTE
        if name not in FSDP_STREAM_NAMES:
            raise RuntimeError(f"a storage born on FSDP2's {name}, which torch 2.13 allocates nothing on")
        return FSDP_STREAM_NAMES[name]

    # -- TraceSink --

    def boundary(self) -> None:
        self._settle()
        self.stretches.append([])

    def sample(self) -> None:
        if self._pending is not None:
            self._settle()

    def after_forward(self) -> None:
        self._settle()

    def hand_over(self, storages: list[int], layer: int) -> None:
        """Whose input a storage is does not change the allocator's view."""

    def change(self, storage: int, category: str, delta: int, *, gone: bool = False) -> None:
        """A birth, a free, or a storage's bytes changed (a resize; a move between categories changes nothing)."""
        if category == LOGITS:  # the logits' own bookkeeping: the same storage's bytes, told again
            return
        if self._pending is not None and self._pending != storage:
            self._settle()
        entry = self._live.get(storage)
        if gone:
            self._pending = None
            if entry is not None:
                del self._live[storage]
                if entry[0] >= 0:
                    self.stretches[-1].append(~entry[0])
            return
        if entry is None:
            stream = HOST_COPIES if category == HOST else self._device_stream()
            self._live[storage] = [self._born(delta, stream), delta, stream]
            return
        # MemTracker moves a storage between categories as -bytes then +bytes: only the settled sum counts.
        entry[1] += delta
        if entry[2] != HOST_COPIES:
            entry[2] = self._device_stream()  # a resize allocates on the stream current at it (FSDP2's resize_)
        self._pending = storage

    def ordinal_of(self, storage: int) -> int | None:
        """The ordinal of ``storage``'s current block, or None where it is not live (or resized to nothing)."""
        entry = self._live.get(storage)
        return entry[0] if entry is not None and entry[0] >= 0 else None

    def _born(self, nbytes: int, stream: Stream) -> int:
        ordinal = len(self.sizes)
        self.sizes.append(nbytes)
        self.streams.append(stream)
        self.stretches[-1].append(ordinal)
        return ordinal

    def _settle(self) -> None:
        storage, self._pending = self._pending, None
        if storage is None or storage not in self._live:
            return
        entry = self._live[storage]
        old = entry[0]
        if old >= 0 and self.sizes[old] == entry[1]:
            return
        # A resize: the new block comes before the old one is given back (THCStorage's resize copies across).
        entry[0] = self._born(entry[1], entry[2]) if entry[1] > 0 else -1
        if old >= 0:
            self.stretches[-1].append(~old)

    def trace(self, phases: Sequence[str | None] = ()) -> AllocationTrace:
        """The whole recorded step; ``phases``, each stretch's phase (:func:`stretch_phases`), place the threads'
        first matmuls."""
        self._settle()
        events: list[int] = []
        starts: list[int] = []
        for stretch, phase in itertools.zip_longest(self.stretches, phases[: len(self.stretches)]):
            note_thread_start(starts, phase, len(events))
            events += stretch
        return AllocationTrace(tuple(self.sizes), tuple(self.streams), tuple(events), WHOLE_STEP, tuple(starts))

    def step_trace(self, timeline: Sequence[TimelinePoint]) -> AllocationTrace:
        """The recorded step of ``timeline``'s events, to its last event's stretch: what follows the recorder's finish
        is the tracker letting go of everything (the model, the optimizer's state), which a training loop does not
        do, and a composed order (``replay_order``) cannot say at every depth."""
        trace = self.trace(stretch_phases(timeline))
        kept = {event for stretch in self.stretches[: len(timeline) + 2] for event in stretch}
        return replace(trace, events=tuple(event for event in trace.events if event in kept))


_THREADS = ("forward", "backward")  # the forward runs on the caller's thread, the backward on autograd's


def note_thread_start(starts: list[int], phase: str | None, place: int) -> None:
    """``place`` is where the first stretch of a thread's phase begins: its first matmul is taken to come there."""
    if phase in _THREADS and len(starts) == _THREADS.index(phase):
        starts.append(place)


def stretch_phases(timeline: Sequence[TimelinePoint]) -> list[str | None]:
    """Each recorded stretch's phase: none before the step and at watching's start, each timeline event's, none
    after the last."""
    return [None, None, *(point.phase for point in timeline), None]


# -- the whole step from shallow copies ----------------------------------------------------------------------------

StretchKey = tuple[Hashable, int | None]  # what a stretch is, without its middle unit; and the unit (None: outside)
Token = tuple[bool, int, Stream]  # a birth or a free, its bytes and its stream: what two copies must agree on


@dataclass(frozen=True)
class ShallowTrace:
    """One shallow copy's recorded step: its ``middle_units`` and each stretch's key beside its events."""

    middle_units: int
    sizes: Sequence[int]
    streams: Sequence[Stream]
    stretches: Sequence[tuple[StretchKey, Sequence[int]]]

    @classmethod
    def of(cls, middle_units: int, recorder: AllocationRecorder, keys: Sequence[StretchKey]) -> ShallowTrace:
        """``recorder``'s stretches with ``keys``: one per stretch (before the step, watching's start, each timeline
        event, after the last), or :class:`~.fold.NotDerivable`."""
        recorder.trace()  # settles a pending resize
        if len(keys) != len(recorder.stretches):
            raise NotDerivable(f"{len(recorder.stretches)} stretches recorded for {len(keys)} events")
        # The last stretch follows the recorder's finish: the tracker letting go of everything (step_trace).
        return cls(
            middle_units, recorder.sizes, recorder.streams, list(zip(keys[:-1], recorder.stretches[:-1], strict=True))
        )

    def token(self, event: int) -> Token:
        ordinal = event if event >= 0 else ~event
        return (event >= 0, self.sizes[ordinal], self.streams[ordinal])


@dataclass
class _Segment:
    """A run of events of the full step: a fixed run (each copy holds it once), or a block every middle unit beyond
    the first repeats (``copies`` units hold it ``copies - 1`` times)."""

    repeated: bool
    events: dict[int, list[int]]  # middle units of the copy (1, 2, 3) -> its events here (all its repeats in order)
    phase: str | None = None  # the phase of the stretch it belongs to (None: outside the step, or later units)


def repeated(one: ShallowTrace, two: ShallowTrace, three: ShallowTrace, middle_units: int) -> AllocationTrace:
    """The order of a step with ``middle_units`` middle units, from copies with one, two and three.

    Each copy's step is split into runs: a stretch outside the middle units, a stretch of the first middle unit, the
    runs of stretches of the later middle units (a block), and inside a stretch outside the layers (the parameters,
    the gradient norm, the optimizer: every layer in turn) the events a deeper copy adds (a block too, found by
    ``difflib``). The full step has each fixed run once and each block ``middle_units - 1`` times. A free names the
    storage it frees by its birth's ordinal, which is affine in the number of units and in the repeat it sits in: one
    and two give it for a fixed run (three checks it), two and three for a block.

    Raises:
        NotDerivable: the copies do not repeat as the fold says (a run differs, a free misses its storage).
    """
    copies = {1: one, 2: two, 3: three}
    sizes: list[int] = []
    streams: list[Stream] = []
    events: list[int] = []
    starts: list[int] = []
    for segment in _segments(copies):
        note_thread_start(starts, segment.phase, len(events))
        template = segment.events[2]
        width = len(template)
        widths = {units: len(segment.events[units]) for units in copies}
        if widths != {units: width * ((units - 1) if segment.repeated else 1) for units in copies}:
            raise NotDerivable("a run of events differs in length between the shallow copies")
        tokens: list[tuple[bool, int, Stream]] = []
        for offset in range(width):
            # Each copy's token at this offset (every repeat of a block): births and frees alike, on one stream, and
            # bytes that are the same in every repeat and affine in the depth (the gradient norm's stacked norms).
            seen = [
                copies[units].token(segment.events[units][at])
                for units in copies
                for at in range(offset, widths[units], width)
            ]
            if len({(born, stream) for born, _, stream in seen}) != 1:
                raise NotDerivable("a run of events differs between the shallow copies")
            if segment.repeated and len({nbytes for _, nbytes, _ in seen}) != 1:
                raise NotDerivable("a repeated block's bytes differ between its repeats")
            nbytes = seen[0][1] if segment.repeated else _affine(seen[0][1], seen[1][1], seen[2][1], middle_units)
            tokens.append((seen[0][0], nbytes, seen[0][2]))
        for repeat in range(middle_units - 1 if segment.repeated else 1):
            for offset, (born, nbytes, stream) in enumerate(tokens):
                if born:
                    sizes.append(nbytes)
                    streams.append(stream)
                    events.append(len(sizes) - 1)
                    continue
                target = _target(segment, offset, width, repeat, middle_units)
                if not 0 <= target < len(sizes) or sizes[target] != nbytes:
                    raise NotDerivable("a free of the repeated step misses the storage it frees")
                events.append(~target)
    check_frees(events)
    return AllocationTrace(tuple(sizes), tuple(streams), tuple(events), LAYERS_REPEATED, tuple(starts))


def _affine(one: int, two: int, three: int, middle_units: int) -> int:
    """A figure of copies with one, two and three middle units, at ``middle_units`` (three checks the line)."""
    if three - two != two - one:
        raise NotDerivable("a figure does not move with the depth as the fold says")
    return affine_in_depth(one, two, middle_units - 1)


def _target(segment: _Segment, offset: int, width: int, repeat: int, middle_units: int) -> int:
    """The ordinal a free at ``offset`` of ``repeat`` of ``segment`` frees in the step of ``middle_units`` units."""
    if not segment.repeated:
        t1, t2, t3 = (~segment.events[units][offset] for units in (1, 2, 3))
        return _affine(t1, t2, t3, middle_units)
    first, again = ~segment.events[3][offset], ~segment.events[3][width + offset]
    base = ~segment.events[2][offset]
    return affine_in_depth(base, first, middle_units - 2) + (again - first) * repeat


def check_frees(events: Sequence[int], why: str = "the repeated step frees a storage twice") -> None:
    """An order of births (``n``) and frees (``~n``) a caching allocator could see: each free of a live storage; else
    :class:`~.fold.NotDerivable` saying ``why`` (the fold's and the replay's composed orders are checked alike)."""
    live: set[int] = set()
    for event in events:
        if event >= 0:
            live.add(event)
        elif ~event in live:
            live.remove(~event)
        else:
            raise NotDerivable(why)


def _segments(copies: dict[int, ShallowTrace]) -> list[_Segment]:
    """The runs of the three copies, aligned: stretches by key, a later middle unit's stretches as a block, and inside
    a stretch met in all three the events two adds to one (its blocks) and three adds twice."""
    walks = {units: _runs(trace) for units, trace in copies.items()}
    # One middle unit has no later ones: an empty block where the deeper copies have theirs.
    shallow = iter(walks[1])
    walks[1] = [(key, []) if key == _LATER_UNITS else next(shallow, (None, [])) for key, _ in walks[2]]
    if next(shallow, None) is not None or len(walks[2]) != len(walks[3]):
        raise NotDerivable("the shallow copies' stretches do not line up")
    segments: list[_Segment] = []
    for (key1, run1), (key2, run2), (key3, run3) in zip(walks[1], walks[2], walks[3], strict=True):
        if key1 != key2 or key2 != key3:
            raise NotDerivable("the shallow copies' stretches do not line up")
        if key1 == _LATER_UNITS:
            segments.append(_Segment(True, {1: [], 2: run2, 3: run3}))
            continue
        what = key1[0] if isinstance(key1, tuple) else ()
        phase = what[2] if isinstance(what, tuple) and len(what) == 4 else None
        for segment in _split_by_insertions(run1, run2, run3, copies):
            segment.phase = phase
            segments.append(segment)
    return segments


_LATER_UNITS = ("later middle units",)


def _runs(trace: ShallowTrace) -> list[tuple[Hashable, list[int]]]:
    """A copy's stretches, those of the middle units after the first merged into one run per place in the step."""
    runs: list[tuple[Hashable, list[int]]] = []
    for (key, unit), events in trace.stretches:
        if unit is not None and unit >= 1:
            if runs and runs[-1][0] == _LATER_UNITS:
                runs[-1][1].extend(events)
            else:
                runs.append((_LATER_UNITS, list(events)))
            continue
        runs.append(((key, unit), list(events)))
    return runs


def _split_by_insertions(
    run1: list[int], run2: list[int], run3: list[int], copies: dict[int, ShallowTrace]
) -> list[_Segment]:
    """A stretch met in all three copies as fixed runs and blocks: two's events that one lacks, three's twice.

    The runs are lined up by their tokens; bytes that only one of the two runs holds (a figure that grows with the
    depth, as the gradient norm's stacked norms) line up as any bytes, checked affine by :func:`repeated`."""
    tokens = {units: [copies[units].token(e) for e in run] for units, run in ((1, run1), (2, run2), (3, run3))}
    held = [{nbytes for _, nbytes, _ in run} for run in tokens.values()]
    varying = (held[0] | held[1] | held[2]) - (held[0] & held[1] & held[2])
    aligned = {
        units: [(born, None if nbytes in varying else nbytes, stream) for born, nbytes, stream in run]
        for units, run in tokens.items()
    }
    opcodes = difflib.SequenceMatcher(None, aligned[1], aligned[2], autojunk=False).get_opcodes()
    if any(tag not in ("equal", "insert") for tag, *_ in opcodes):
        raise NotDerivable("a deeper copy's stretch is not the shallower's with events added")
    # Where one's run gains two's events: (place in one's run, how many). difflib's places make two of one, but a
    # block may sit a few events earlier or later (a rotation of a layer's events) or be cut in two around events
    # that one holds (the layers' states, group by group): the place where three holds the block twice is the one
    # that repeats, found from difflib's place on, merging a block with the next ones where alone it has none.
    inserts = [(i1, j2 - j1) for tag, i1, _, j1, j2 in opcodes if tag == "insert"]
    one, two, three = aligned[1], aligned[2], aligned[3]
    runs = (run1, run2, run3)
    segments: list[_Segment] = []
    done1 = done2 = done3 = 0  # where the runs have been taken up to
    number = 0
    while number < len(inserts):
        for merged in range(1, len(inserts) - number + 1):
            width = sum(w for _, w in inserts[number : number + merged])
            high = inserts[number + merged][0] if number + merged < len(inserts) else len(one)
            place = _place(one, two, three, (done1, done2, done3), width, inserts[number][0], high, runs)
            if place is not None:
                break
        else:
            raise NotDerivable("the deepest copy's stretch is not the others' with their blocks twice")
        here1, here2, here3 = place
        segments.append(_Segment(False, {1: run1[done1:here1], 2: run2[done2:here2], 3: run3[done3:here3]}))
        segments.append(_Segment(True, {1: [], 2: run2[here2 : here2 + width], 3: run3[here3 : here3 + 2 * width]}))
        done1, done2, done3 = here1, here2 + width, here3 + 2 * width
        number += merged
    if not one[done1:] == two[done2:] == three[done3:] or not _frees_affine(runs, (done1, done2, done3), None):
        raise NotDerivable("the deepest copy's stretch is not the others' with their blocks twice")
    segments.append(_Segment(False, {1: run1[done1:], 2: run2[done2:], 3: run3[done3:]}))
    return [segment for segment in segments if segment.events[2]]


def _place(
    one: list,
    two: list,
    three: list,
    done: tuple[int, int, int],
    width: int,
    near: int,
    high: int,
    runs: tuple[list[int], list[int], list[int]],
) -> tuple[int, int, int] | None:
    """The place (in one, two and three) of a block of ``width`` events that two holds once and three twice after
    what is ``done``, between ``done`` and ``high`` in one, nearest ``near`` first; None where there is none.

    Alike tokens do not tell two layers' norms apart: the events before the block must also free storages that move
    with the depth as the fold says (a layer's norm's gradient left out of the block would not)."""
    done1, done2, done3 = done
    for here1 in sorted(range(done1, high + 1), key=lambda at: abs(at - near)):
        here2, here3 = done2 + (here1 - done1), done3 + (here1 - done1)
        before = one[done1:here1]
        block = two[here2 : here2 + width]
        lined_up = len(block) == width and two[done2:here2] == before == three[done3:here3]
        if lined_up and three[here3 : here3 + 2 * width] == block * 2 and _frees_affine(runs, done, here1 - done1):
            return here1, here2, here3
    return None


def _frees_affine(runs: tuple[list[int], list[int], list[int]], done: tuple[int, int, int], length: int | None) -> bool:
    """Whether the frees of a fixed run (``length`` events from ``done`` in each copy; None: to the end) free
    storages whose ordinals move with the depth by the same step from one to two as from two to three."""
    first, second, third = (
        run[at : None if length is None else at + length] for run, at in zip(runs, done, strict=True)
    )
    return all(
        (~c) - (~b) == (~b) - (~a) for a, b, c in zip(first, second, third, strict=True) if a < 0 and b < 0 and c < 0
    )
