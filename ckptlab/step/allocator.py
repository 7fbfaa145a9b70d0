"""A model of torch's CUDA caching allocator: a trace of allocations and frees replayed into reserved bytes.

What it is for: the lab's memory figures are the bytes of live tensors, but a run dies when the caching allocator
cannot get one more segment, and nvidia-smi shows reserved memory, not allocated (issue 60). This module answers,
for one trace of ``(alloc size, stream, free)`` events and one device capacity, the reserved peak, the largest
cached free block at that peak, the allocated peak, and the event at which the device would run out of memory
even though the live bytes fit.

Checked line by line against torch's source (issue 60). The source read is ``c10/cuda/CUDACachingAllocator.cpp``
of ``pytorch/pytorch`` as the lab's search index stores it (file id 79076714, 168,130 characters; the index does
not name its commit). It is the version of torch 2.13's era: it reads its settings from
``AcceleratorAllocatorConfig`` (``large_segment_size``, ``max_non_split_rounding_size``) and
``CUDAAllocatorConfig::per_process_memory_fraction``, as the headers torch 2.13.0 installs declare
(``torch/include/c10/core/AllocatorConfig.h`` and ``c10/cuda/CUDAAllocatorConfig.h``, whose line numbers are cited
below as ``AllocatorConfig.h:N``). The index returns a file by character offset, not by line, and a torch wheel
carries no ``.cpp``: each rule below cites the function and the character range of the stored text that holds it
(``[112000, 128000)``: ``read_file(id=79076714, offset=112000)`` shows it). The settings parser follows
``c10/core/AllocatorConfig.cpp`` (index file id 10131072) and ``c10/cuda/CUDAAllocatorConfig.cpp`` (id 57445915950).

- ``round_size`` [86000, 102000): under 512 B (``kMinBlockSize``, AllocatorConfig.h:19) a request takes 512 B;
  else, where ``roundup_power2_divisions`` gives its size interval ``d > 1`` divisions and the size is above
  ``512 * d``, ``roundup_power2_next_division``; else the next multiple of 512 B.
- ``AcceleratorAllocatorConfig::roundup_power2_divisions(size)`` (AllocatorConfig.cpp): the interval of a size is
  ``floor(log2(size)) - 20`` (1 MiB is the first), clamped to 0..15.
- ``get_pool`` [112000, 128000): up to 1 MiB (``kSmallSize``, AllocatorConfig.h:21) goes to the small pool.
- ``get_allocation_size`` [112000, 128000): a new segment is 2 MiB (``kSmallBuffer``) for the small pool, 20 MiB
  (``large_segment_size``, AllocatorConfig.h:340) for requests under 10 MiB (``kMinLargeAlloc``), else the
  request rounded up to 2 MiB (``kRoundLarge``).
- ``get_free_block`` [112000, 128000): ``pool.blocks.lower_bound`` under ``BlockComparatorSize`` [32000, 48000),
  which orders by stream, then size, then address: best fit among the cached blocks of the request's own stream
  only. An expandable block counts as the size it can grow to. With ``max_split_size`` set, a block of at least
  that size never serves a smaller request, and serves a larger one only when it is under request +
  ``max_non_split_rounding_size`` (20 MiB unless ``max_non_split_rounding_mb`` says otherwise).
- ``should_split`` / ``alloc_found_block`` [112000, 128000) / [48000, 64000): a small block (or any block with
  expandable segments) splits when at least 512 B would remain, a large one when the request is under
  ``max_split_size`` and more than 1 MiB remains.
- ``free_block`` / ``try_merge_blocks`` [96000, 128000): a freed block merges with its free neighbours of the same
  segment (mapped alike) only, and goes back to its pool with a fresh garbage-collection age.
- ``malloc`` [48000, 64000): ``get_free_block``; when none fits, ``garbage_collect_cached_blocks`` (only with a
  memory fraction below 1 and ``garbage_collection_threshold`` set), then ``alloc_block``; failing that
  ``release_available_cached_blocks`` and ``alloc_block``, then ``release_cached_blocks`` and ``alloc_block`` as
  the retry (``num_alloc_retries``); then out of memory.
- ``alloc_block`` [112000, 128000): refused without asking the device when the reserved bytes plus the new
  segment's size (``get_allocation_size``, also with expandable segments) would pass ``allowed_memory_maximum``
  (``setMemoryFraction`` [64000, 80000): the fraction times the device's memory, when the fraction is below 1);
  else ``cudaMalloc`` (here: the device capacity) or ``try_allocate_expandable_block``.
- ``garbage_collect_cached_blocks`` [112000, 128000): when reserved passes ``threshold * allowed_memory_maximum``,
  release whole non-expandable cached blocks of the large pool whose age (``get_free_block`` calls on the pool
  since the block was cached, counted only while garbage collection is on) is at least the average age of the
  pool's whole cached blocks, round after round, until the excess is reclaimed or nothing more is released.
- ``release_available_cached_blocks`` [112000, 128000): with ``max_split_size`` set, the smallest cached block of
  the stream at least ``max(request, max_split_size)``; else the oversize ones largest first until they add up to
  it.
- ``release_cached_blocks`` / ``release_blocks`` / ``release_block`` [112000, 144000): every whole cached segment
  of both pools, large first; expandable blocks give back their whole pages (``unmap_block``,
  ``ExpandableSegment::unmap`` rounds inwards [16000, 32000)).
- ``try_allocate_expandable_block`` / ``find_expandable_block`` / ``map_block`` [96000, 112000): the lowest
  address, among the pool's unmapped ranges of the stream (``unmapped`` is ordered by
  ``BlockComparatorAddress``), where the range and the free block just before it hold the request; else a new
  segment for the stream. Pages are 2 MiB (small) and ``large_segment_size`` (large, 20 MiB by default);
  ``ExpandableSegment::map`` rounds outwards and maps all of them or none [16000, 32000).

Not modelled: CUDA graphs and private pools (``try_mempool_fallback`` included), ``recordStream`` (a block used
on another stream is cached only once that stream's events complete: here a free is immediate),
``trigger_free_memory_callbacks`` (torch registers one, which collects blocks shared with other processes over
CUDA IPC), ``PYTORCH_NO_CUDA_MEMORY_CACHING``, and ``backend:cudaMallocAsync`` (refused by
:func:`parse_alloc_conf`: it is another allocator). The device capacity is the bytes the allocator may reserve
(what ``cudaMalloc`` / ``cuMemCreate`` can still get).

Checked against a published trace as well: pytorch PR #193400's allocated and reserved MiB under
``max_split_size_mb:128,expandable_segments:True`` are replayed exactly (tests/step/test_allocator.py,
docs/allocator-published.md).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..alloc_conf import (
    LARGE_BUFFER,
    MIN_LARGE_ALLOC,
    AllocatorConfig,
    is_power_of_two,
)
from ..errors import Option, SpecError
from ..units import MIB

DEFAULTS = AllocatorConfig()  # torch's defaults: PYTORCH_CUDA_ALLOC_CONF unset
MIN_BLOCK_SIZE = 512  # kMinBlockSize
SMALL_SIZE = 1 * MIB  # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: a small segment, and a small expandable page
ROUND_LARGE = 2 * MIB  # kRoundLarge


@dataclass(frozen=True)
class Alloc:
    """One allocation of ``nbytes`` (as a tensor's storage asks: before the allocator's rounding) on ``stream``
    (0: the compute stream; another number: another stream, whose cached blocks this one never reuses)."""

    nbytes: int
    stream: int = 0


@dataclass(frozen=True)
class Free:
    """The free of the trace's allocation number ``alloc`` (its 0-based place among the trace's ``Alloc`` events)."""

    alloc: int


Event = Alloc | Free


@dataclass(frozen=True)
class AllocatorReplay:
    """What the replay of one trace answers, in bytes.

    Attributes:
        reserved_peak: the most the allocator held from the device (``max_memory_reserved``).
        largest_free_at_peak: the largest cached free block when reserved first reached its peak.
        allocated_peak: the most its live blocks held (``max_memory_allocated``: block sizes, after rounding and
            a block left whole when it does not split).
        requested_peak: the most the live requests asked for (the tensors' own bytes).
        out_of_memory_at: the event (0-based place in the trace) at which the device had no room even after
            releasing the cache, or ``None`` when the trace ran to its end.
        retries: how often the whole cache was released and a segment asked for again (``num_alloc_retries``).
    """

    reserved_peak: int
    largest_free_at_peak: int
    allocated_peak: int
    requested_peak: int
    out_of_memory_at: int | None
    retries: int


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division`` [86000, 102000): ``size`` rounded up to the next of ``divisions`` equal
    steps between the powers of two around it (1,200 in 4 divisions of 1,024..2,048: 1,280); a power of two
    stays."""
    if is_power_of_two(size):
        return size
    floor = 1 << (size.bit_length() - 1)  # llvm::PowerOf2Floor
    step = floor >> (divisions.bit_length() - 1)  # power2_floor >> (63 - countLeadingZeros(divisions))
    if step == 0:
        return floor << 1
    below = size & ~(step - 1)
    return size if below == size else below + step


def round_size(nbytes: int, config: AllocatorConfig | None = None) -> int:
    """``round_size`` [86000, 102000): the request rounded up to a multiple of 512 B (at least 512), or to its
    interval's power-of-two division where ``roundup_power2_divisions`` gives it more than one."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    divisions = config.divisions(nbytes) if config is not None else 0
    if divisions > 1 and nbytes > MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(nbytes, divisions)
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def allocation_size(size: int, config: AllocatorConfig | None = None) -> int:
    """``get_allocation_size``: the bytes of a new segment for a rounded request ``size``."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER if config is None else config.large_segment_size
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Block:
    """A block of a segment (``Block``): its address range, stream, whether it is live and whether it is mapped,
    and ``gc_base``, its pool's ``get_free_blocks_call_count`` when it was last cached (``insert_into_blocks``)."""

    __slots__ = ("addr", "allocated", "expandable", "gc_base", "mapped", "next", "prev", "size", "small", "stream")

    def __init__(
        self, addr: int, size: int, small: bool, stream: int = 0, *, mapped: bool = True, expandable: bool = False
    ) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.stream = stream
        self.allocated = False
        self.mapped = mapped
        self.expandable = expandable
        self.gc_base = 0
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def is_split(self) -> bool:
        """``Block::is_split``: a neighbour in its segment on either side."""
        return self.prev is not None or self.next is not None


class _Pool:
    """A ``BlockPool``: its cached free mapped blocks (``entries``, kept in ``BlockComparatorSize``'s order: stream,
    size, address), with expandable segments its unmapped ranges (``unmapped``), and ``calls``, its
    ``get_free_blocks_call_count``.

    A block's stream, size and address do not change while it is cached (torch erases a block from the set before
    it changes), so each entry's key stays its block's.
    """

    def __init__(self, small: bool, page: int) -> None:
        self.small = small
        self.entries: list[tuple[int, int, int, _Block]] = []
        self.unmapped: list[_Block] = []
        self.page = page  # find_expandable_block: kSmallBuffer, or large_segment_size
        self.calls = 0

    @property
    def blocks(self) -> list[_Block]:
        """The cached free blocks in ``BlockComparatorSize``'s order."""
        return [entry[3] for entry in self.entries]

    def insert(self, block: _Block) -> None:
        """``BlockPool::insert_into_blocks``: cached, its age counted from now."""
        block.gc_base = self.calls
        insort(self.entries, (block.stream, block.size, block.addr, block))

    def lower_bound(self, stream: int, size: int) -> int:
        """``blocks.lower_bound``: the place of the first cached block at or after ``(stream, size)``."""
        return bisect_left(self.entries, (stream, size, -1))

    def remove(self, block: _Block) -> None:
        """``blocks.erase``."""
        index = bisect_left(self.entries, (block.stream, block.size, block.addr))
        assert self.entries[index][3] is block  # a cached block's key does not change
        del self.entries[index]


class CachingAllocator:
    """One device's caching allocator, as ``DeviceCachingAllocator`` runs it.

    Args:
        config: the ``PYTORCH_CUDA_ALLOC_CONF`` settings.
        capacity: the bytes the allocator may reserve from the device; ``None``: without limit.
        total_memory: the device's memory (``totalGlobalMem``), of which ``per_process_memory_fraction`` is
            taken; ``None``: ``capacity``.

    Raises:
        SpecError: a setting torch refuses, or a memory fraction below 1 with no device memory to take it of.
    """

    def __init__(
        self, config: AllocatorConfig = DEFAULTS, capacity: int | None = None, total_memory: int | None = None
    ) -> None:
        config.validate()
        self.config = config
        self.capacity = capacity
        total = capacity if total_memory is None else total_memory
        # setMemoryFraction: allowed_memory_maximum is set only for a fraction below 1.
        self.allowed: int | None = None
        if config.per_process_memory_fraction < 1:
            if total is None:
                raise SpecError(
                    key="allocator.memory_fraction_without_memory",
                    option=Option("per_process_memory_fraction", config.per_process_memory_fraction),
                    value=config.per_process_memory_fraction,
                )
            self.allowed = int(config.per_process_memory_fraction * total)
        # garbage_collect_cached_blocks runs, and get_free_block counts ages, only with both set.
        self.gc = self.allowed is not None and config.garbage_collection_threshold > 0
        self.small = _Pool(small=True, page=SMALL_BUFFER)
        self.large = _Pool(small=False, page=config.large_segment_size)
        self.reserved = 0  # total_allocated_memory
        self.allocated = 0
        self.retries = 0
        self._next_addr = 0
        # One address range per pool and stream with expandable segments, as large as anything a trace asks (torch
        # reserves 1.125 x the GPU's memory of address space; the capacity, not the address space, runs out).
        self._space = 1 << 60

    # --- malloc -----------------------------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> _Block | None:
        """``malloc``: a live block for a request of ``nbytes`` on ``stream``, or ``None`` when the device is out
        of memory."""
        size = round_size(nbytes, self.config)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = self._get_free_block(pool, size, stream)
        if block is None:
            if self.gc:
                self._garbage_collect_cached_blocks()
            block = (
                self._alloc_block(pool, size, stream)
                # torch counts only the retry after releasing everything in num_alloc_retries.
                or (self._release_available_cached_blocks(pool, size, stream) and self._alloc_block(pool, size, stream))
                or (self._release_cached_blocks() and self._alloc_block(pool, size, stream, retry=True))
                or None
            )
            if block is None:
                return None
        return self._alloc_found_block(pool, block, size)

    def _get_free_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """``get_free_block``: best fit among the pool's cached blocks of ``stream``, with ``max_split_size``'s two
        refusals."""
        if self.gc:
            pool.calls += 1  # ++pool.get_free_blocks_call_count, only while garbage collection is on
        entries = pool.entries
        index = pool.lower_bound(stream, size)
        if index == len(entries) or entries[index][0] != stream:
            return None

        # An expandable block counts as the size it can grow to (its unmapped neighbour included).
        def grows_to(b: _Block) -> int:
            return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

        if entries[index][3].expandable:
            if self.config.expandable_segments:
                while (
                    entries[index][3].expandable
                    and index + 1 < len(entries)
                    and entries[index + 1][0] == stream
                    and grows_to(entries[index + 1][3]) < grows_to(entries[index][3])
                ):
                    index += 1
            else:
                # Expandable segments turned off after some were made: torch skips their blocks.
                while index < len(entries) and entries[index][3].expandable and entries[index][0] == stream:
                    index += 1
                if index == len(entries) or entries[index][0] != stream:
                    return None
        block = entries[index][3]
        limit = self.config.max_split_size
        if limit is not None:
            if size < limit and block.size >= limit:
                return None  # an oversize block never serves a request below max_split_size
            if size >= limit and block.size >= size + self.config.max_non_split_rounding_size:
                return None  # nor a larger request, beyond request + max_non_split_rounding_size
        del entries[index]
        return block

    def _room(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: _Pool, size: int, stream: int, retry: bool = False) -> _Block | None:
        """``alloc_block``: within ``allowed_memory_maximum``, a new segment (``cudaMalloc``), or the pool's
        expandable range grown."""
        if retry:
            self.retries += 1
        nbytes = allocation_size(size, self.config)
        if self.allowed is not None and self.reserved + nbytes > self.allowed:
            return None  # refused before asking the device, with expandable segments too
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        if not self._room(nbytes):
            return None
        self.reserved += nbytes
        block = _Block(self._next_addr, nbytes, pool.small, stream)
        self._next_addr += nbytes
        return block

    def _should_split(self, pool: _Pool, block: _Block, size: int) -> bool:
        """``should_split``."""
        remaining = block.size - size
        if pool.small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        limit = self.config.max_split_size
        return (limit is None or size < limit) and remaining > SMALL_SIZE

    def _alloc_found_block(self, pool: _Pool, block: _Block, size: int) -> _Block:
        """``alloc_found_block``: split off the remainder when ``should_split`` says so, and mark the block live."""
        if self._should_split(pool, block, size):
            remaining = _Block(
                block.addr + size, block.size - size, pool.small, block.stream, expandable=block.expandable
            )
            remaining.prev, remaining.next = block, block.next
            if block.next is not None:
                block.next.prev = remaining
            block.next = remaining
            block.size = size
            pool.insert(remaining)
        block.allocated = True
        self.allocated += block.size
        return block

    # --- free ------------------------------------------------------------------------------------------------

    def free(self, block: _Block) -> None:
        """``free_block``: the block is cached, merged with its free neighbours of the same segment."""
        block.allocated = False
        self.allocated -= block.size
        pool = self.small if block.small else self.large
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)

    def _try_merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> None:
        """``try_merge_blocks``: ``src`` (a neighbour in the segment) joins ``dst`` when it is free and mapped alike."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            pool.remove(src)
        else:
            pool.unmapped.remove(src)

    # --- releasing the cache -----------------------------------------------------------------------------------

    def _release_block(self, block: _Block, pool: _Pool) -> None:
        """``release_block``: a whole cached segment given back (``cudaFree``)."""
        pool.remove(block)
        self.reserved -= block.size

    def _garbage_collect_cached_blocks(self) -> None:
        """``garbage_collect_cached_blocks``: above ``threshold * allowed_memory_maximum`` reserved, the large
        pool's whole cached blocks at least as old as their average age are released, round after round, until the
        excess is reclaimed (a round does not stop at it) or a round releases nothing."""
        assert self.allowed is not None  # self.gc implies it
        threshold = int(self.config.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        pool = self.large
        # The average counts every whole cached block, expandable ones too, though only the others are released.
        ages = [pool.calls - b.gc_base for b in pool.blocks if not b.is_split()]
        total_age, count = sum(ages), len(ages)
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for block in pool.blocks:  # in BlockComparatorSize's order
                age = pool.calls - block.gc_base
                if not block.is_split() and not block.expandable and age >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release_block(block, pool)

    def _release_available_cached_blocks(self, pool: _Pool, size: int, stream: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, the smallest oversize cached block of
        the stream that covers the request, else the stream's oversize ones largest first until they add up to it."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        entries = pool.entries
        index = pool.lower_bound(stream, key)
        if index < len(entries) and entries[index][0] == stream and not entries[index][3].expandable:
            self._release_block(entries[index][3], pool)
            return True
        # No single block is large enough: from the one before, the stream's oversize blocks, largest first.
        released = 0
        index -= 1
        while index >= 0 and released < key and entries[index][1] >= limit and entries[index][0] == stream:
            block = entries[index][3]
            if not block.expandable:
                released += block.size
                self._release_block(block, pool)  # at this index: the ones below keep their places
            index -= 1
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks`` / ``release_blocks``: every whole cached segment of both pools (large first),
        and with expandable segments the whole pages inside each cached block."""
        for pool in (self.large, self.small):
            for block in list(pool.blocks):
                if block.expandable:
                    self._unmap_block(block, pool)
                elif not block.is_split():
                    self._release_block(block, pool)
        return True

    # --- expandable segments -----------------------------------------------------------------------------------

    def _try_allocate_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        """``try_allocate_expandable_block``: map pages at the free end of the pool's range until ``size`` fits."""
        candidate = self._find_expandable_block(pool, size, stream)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size), pool):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None and not following.mapped  # find_expandable_block's invariant
            if not self._map_block(following, min(size - candidate.size, following.size), pool):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block:
        """``find_expandable_block``: the lowest-addressed unmapped range of the stream (``unmapped`` is ordered by
        ``BlockComparatorAddress``) that, with the free block just before it, holds ``size`` bytes; else a new
        range for the stream."""
        for block in sorted((b for b in pool.unmapped if b.stream == stream), key=lambda b: b.addr):
            start = block.prev if block.prev is not None and not block.prev.allocated else block
            room = 0
            walk: _Block | None = start
            while walk is not None and room < size and not walk.allocated:
                room += walk.size
                walk = walk.next
            if room >= size:
                return start
        # The range starts on a page, as ExpandableSegment's pages are counted from its base.
        base = -(-self._next_addr // pool.page) * pool.page
        block = _Block(base, self._space, pool.small, stream, mapped=False, expandable=True)
        self._next_addr = base + self._space
        pool.unmapped.append(block)
        return block

    def _map_block(self, block: _Block, size: int, pool: _Pool) -> bool:
        """``map_block``: the pages covering the first ``size`` bytes of an unmapped block, mapped
        (``ExpandableSegment::map``: all of them or none), merged with the free neighbours."""
        start = block.addr // pool.page * pool.page
        end = -(-(block.addr + size) // pool.page) * pool.page
        mapped = end - start
        if not self._room(mapped):
            return False
        self.reserved += mapped
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = _Block(
                block.addr + mapped, block.size - mapped, pool.small, block.stream, mapped=False, expandable=True
            )
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            pool.unmapped.append(rest)
            block.size = mapped
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)
        return True

    def _unmap_block(self, block: _Block, pool: _Pool) -> None:
        """``unmap_block``: the whole pages inside a cached block given back (``ExpandableSegment::unmap``)."""
        begin = -(-block.addr // pool.page) * pool.page
        end = (block.addr + block.size) // pool.page * pool.page
        if begin >= end:
            return
        pool.remove(block)
        for addr, size, before in ((block.addr, begin - block.addr, True), (end, block.addr + block.size - end, False)):
            if size > 0:
                part = _Block(addr, size, pool.small, block.stream, expandable=True)
                if before:
                    part.prev, part.next = block.prev, block
                    if block.prev is not None:
                        block.prev.next = part
                    block.prev = part
                else:
                    part.prev, part.next = block, block.next
                    if block.next is not None:
                        block.next.prev = part
                    block.next = part
                pool.insert(part)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self.reserved -= end - begin
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.unmapped.append(block)

    def largest_free_block(self) -> int:
        """The largest cached free (mapped) block of either pool, in bytes."""
        return max((entry[1] for pool in (self.small, self.large) for entry in pool.entries), default=0)


def replay(
    trace: Iterable[Event],
    config: AllocatorConfig = DEFAULTS,
    capacity: int | None = None,
    observe: Callable[[int, int], None] | None = None,
) -> AllocatorReplay:
    """Replay ``trace`` through :class:`CachingAllocator` on a device of ``capacity`` bytes.

    Args:
        trace: allocations (each on its stream) and frees in the order the step makes them; a zero-byte
            allocation takes nothing, as ``NativeCachingAllocator::allocate`` [144000, 160000) skips ``malloc``
            for it.
        config: the ``PYTORCH_CUDA_ALLOC_CONF`` settings (:func:`parse_alloc_conf` reads the string).
        capacity: the bytes the allocator may reserve, and the memory ``per_process_memory_fraction`` takes its
            share of; ``None``: without limit (no cache is ever released).
        observe: called after each event with the allocated and the reserved bytes then (``memory_allocated``,
            ``memory_reserved``): the segments over time (``ckptlab.explore.device.segments_over_time``).

    Returns:
        The peaks, the largest free block at the reserved peak, and the event at which it ran out of memory.

    Raises:
        SpecError: a setting torch refuses, or a memory fraction below 1 with no ``capacity`` to take it of.
    """
    allocator = CachingAllocator(config, capacity)
    live: dict[int, tuple[_Block | None, int]] = {}
    count = requested = 0
    reserved_peak = largest_at_peak = allocated_peak = requested_peak = 0
    for index, event in enumerate(trace):
        if isinstance(event, Alloc):
            if event.nbytes < 0:
                raise RuntimeError(f"a trace's allocation of {event.nbytes} bytes: the trace is broken")
            block = allocator.malloc(event.nbytes, event.stream) if event.nbytes else None
            if event.nbytes and block is None:
                return AllocatorReplay(
                    reserved_peak, largest_at_peak, allocated_peak, requested_peak, index, allocator.retries
                )
            live[count] = (block, event.nbytes)
            count += 1
            requested += event.nbytes
        else:
            if event.alloc not in live:
                raise RuntimeError(f"free of allocation {event.alloc}, not live: the trace is broken")
            block, nbytes = live.pop(event.alloc)
            if block is not None:
                allocator.free(block)
            requested -= nbytes
        if allocator.reserved > reserved_peak:
            reserved_peak, largest_at_peak = allocator.reserved, allocator.largest_free_block()
        allocated_peak = max(allocated_peak, allocator.allocated)
        requested_peak = max(requested_peak, requested)
        if observe is not None:
            observe(allocator.allocated, allocator.reserved)
    return AllocatorReplay(reserved_peak, largest_at_peak, allocated_peak, requested_peak, None, allocator.retries)
