"""A model of torch's CUDA caching allocator: a trace of allocations and frees replayed into reserved bytes.

What it is for: the lab's memory figures are the bytes of live tensors, but a run dies when the caching allocator
cannot get one more segment, and nvidia-smi shows reserved memory, not allocated (issue 60). This module answers,
for one trace of ``(alloc size, free)`` events on one stream and one device capacity, the reserved peak, the
largest cached free block at that peak, the allocated peak, and the event at which the device would run out of
memory even though the live bytes fit. It is not wired into ``simulate``, the fit rule or the pages yet: a later
session records the simulated step's trace and replays it here.

Written after ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``): its header comment's rules and
constants (``kMinBlockSize`` ... ``kRoundLarge``, as DESIGN.md quotes them), and each rule below names the function it
follows. It was not yet checked line by line against torch 2.13's file (no line numbers cited): the session that
wires it in checks it there, and against a GPU's ``max_memory_reserved``.

- ``round_size``: a request is rounded up to a multiple of 512 B (``kMinBlockSize``).
- ``get_pool``: up to 1 MiB (``kSmallSize``) goes to the small pool, the rest to the large pool.
- ``get_allocation_size``: a new segment is 2 MiB (``kSmallBuffer``) for the small pool, 20 MiB (``kLargeBuffer``)
  for requests under 10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``).
- ``get_free_block``: best fit, the smallest cached block of the pool at least as large (ties: the lowest address,
  ``BlockComparatorSize``); with ``max_split_size`` set, a block of at least that size never serves a smaller
  request, and serves a larger one only when it is under request + 20 MiB.
- ``should_split`` / ``alloc_found_block``: a small block (or any block with expandable segments) splits when at
  least 512 B would remain, a large one when the request is under ``max_split_size`` and more than 1 MiB remains.
- ``free_block`` / ``try_merge_blocks``: a freed block merges with its free neighbours of the same segment only.
- ``malloc``: when no cached block fits, ``alloc_block`` asks for a new segment; when the device has no room,
  ``release_available_cached_blocks`` (only with ``max_split_size`` set: the oversize cached blocks, largest
  first) and a retry, then ``release_cached_blocks`` (every whole cached segment of both pools) and a retry; then
  out of memory.
- ``expandable_segments:True``: ``try_allocate_expandable_block`` / ``find_expandable_block`` / ``map_block`` grow
  one mapped range per pool in pages (2 MiB small, 20 MiB large, ``ExpandableSegment::map`` rounds outwards), and
  ``release_blocks`` / ``unmap_block`` give back the whole pages inside cached free blocks
  (``ExpandableSegment::unmap`` rounds inwards).

Not modelled yet: several streams, ``garbage_collection_threshold``, ``roundup_power2_divisions``, CUDA graphs.
The device capacity is the bytes the allocator may reserve (what ``cudaMalloc`` / ``cuMemCreate`` can still get).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import Option, SpecError
from ..units import MIB

MIN_BLOCK_SIZE = 512  # kMinBlockSize
SMALL_SIZE = 1 * MIB  # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: a small segment, and a small expandable page
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: a large segment for requests under kMinLargeAlloc, and a large page
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc
ROUND_LARGE = 2 * MIB  # kRoundLarge


@dataclass(frozen=True)
class Alloc:
    """One allocation of ``nbytes`` (as a tensor's storage asks: before the allocator's rounding)."""

    nbytes: int


@dataclass(frozen=True)
class Free:
    """The free of the trace's allocation number ``alloc`` (its 0-based place among the trace's ``Alloc`` events)."""

    alloc: int


Event = Alloc | Free


@dataclass(frozen=True)
class AllocatorConfig:
    """The parts of ``PYTORCH_CUDA_ALLOC_CONF`` the model follows.

    Args:
        max_split_size_mb: ``max_split_size_mb``, in MiB as torch reads it; ``None`` is torch's default (no limit).
        expandable_segments: ``expandable_segments:True``.
    """

    max_split_size_mb: int | None = None
    expandable_segments: bool = False

    def validate(self) -> None:
        """Refuse a ``max_split_size_mb`` torch refuses: under 20 MiB (``kLargeBuffer``), the size of a large segment.

        Raises:
            SpecError: naming the value and the least it may be.
        """
        value = self.max_split_size_mb
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < LARGE_BUFFER // MIB):
            raise SpecError(
                key="allocator.max_split_size_too_small",
                option=Option("max_split_size_mb", value),
                value=value,
                minimum=LARGE_BUFFER // MIB,
            )

    @property
    def max_split_size(self) -> int | None:
        """``max_split_size`` in bytes, or ``None`` when unset (torch's ``SIZE_MAX``)."""
        return None if self.max_split_size_mb is None else self.max_split_size_mb * MIB


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


def round_size(nbytes: int) -> int:
    """``round_size``: the request rounded up to a multiple of 512 B (at least 512)."""
    return max(MIN_BLOCK_SIZE, -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the bytes of a new segment for a rounded request ``size``."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Block:
    """A block of a segment (``Block``): its address range, whether it is live and whether it is mapped."""

    __slots__ = ("addr", "allocated", "expandable", "mapped", "next", "prev", "size", "small")

    def __init__(self, addr: int, size: int, small: bool, *, mapped: bool = True, expandable: bool = False) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.allocated = False
        self.mapped = mapped
        self.expandable = expandable
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """A ``BlockPool``: its cached free mapped blocks (``blocks``) and, with expandable segments, its unmapped
    ranges (``unmapped``)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.blocks: list[_Block] = []
        self.unmapped: list[_Block] = []
        self.page = SMALL_BUFFER if small else LARGE_BUFFER


class CachingAllocator:
    """One device's caching allocator on one stream, as ``DeviceCachingAllocator`` runs it.

    Args:
        config: the ``PYTORCH_CUDA_ALLOC_CONF`` settings.
        capacity: the bytes the allocator may reserve from the device; ``None``: without limit.
    """

    def __init__(self, config: AllocatorConfig = AllocatorConfig(), capacity: int | None = None) -> None:
        config.validate()
        self.config = config
        self.capacity = capacity
        self.small = _Pool(small=True)
        self.large = _Pool(small=False)
        self.reserved = 0  # total_allocated_memory
        self.allocated = 0
        self.retries = 0
        self._next_addr = 0
        # One address range per pool with expandable segments, as large as anything a trace asks (torch reserves
        # 1.125 x the GPU's memory of address space; the capacity, not the address space, is what runs out).
        self._space = 1 << 60

    # --- malloc -----------------------------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> _Block | None:
        """``malloc``: a live block for a request of ``nbytes``, or ``None`` when the device is out of memory."""
        size = round_size(nbytes)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = self._get_free_block(pool, size)
        if block is None:
            block = (
                self._alloc_block(pool, size)
                # torch counts only the retry after releasing everything in num_alloc_retries.
                or (self._release_available_cached_blocks(pool, size) and self._alloc_block(pool, size))
                or (self._release_cached_blocks() and self._alloc_block(pool, size, retry=True))
                or None
            )
            if block is None:
                return None
        return self._alloc_found_block(pool, block, size)

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        """``get_free_block``: best fit among the pool's cached blocks, with ``max_split_size``'s two refusals."""
        candidates = sorted((b for b in pool.blocks if b.size >= size), key=lambda b: (b.size, b.addr))
        if not candidates:
            return None
        index = 0
        if candidates[0].expandable:
            # An expandable block counts as the size it can grow to (its unmapped neighbour included).
            def grows_to(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while index + 1 < len(candidates) and grows_to(candidates[index + 1]) < grows_to(candidates[index]):
                index += 1
        block = candidates[index]
        limit = self.config.max_split_size
        if limit is not None:
            if size < limit and block.size >= limit:
                return None  # an oversize block never serves a request below max_split_size
            if size >= limit and block.size >= size + LARGE_BUFFER:
                return None  # nor a larger request, beyond request + 20 MiB
        pool.blocks.remove(block)
        return block

    def _room(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: _Pool, size: int, retry: bool = False) -> _Block | None:
        """``alloc_block``: a new segment (``cudaMalloc``), or the pool's expandable range grown."""
        if retry:
            self.retries += 1
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, size)
        nbytes = allocation_size(size)
        if not self._room(nbytes):
            return None
        self.reserved += nbytes
        block = _Block(self._next_addr, nbytes, pool.small)
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
            remaining = _Block(block.addr + size, block.size - size, pool.small, expandable=block.expandable)
            remaining.prev, remaining.next = block, block.next
            if block.next is not None:
                block.next.prev = remaining
            block.next = remaining
            block.size = size
            pool.blocks.append(remaining)
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
        pool.blocks.append(block)

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
        (pool.blocks if src.mapped else pool.unmapped).remove(src)

    # --- releasing the cache -----------------------------------------------------------------------------------

    def _release_block(self, block: _Block, pool: _Pool) -> None:
        """``release_block``: a whole cached segment given back (``cudaFree``)."""
        pool.blocks.remove(block)
        self.reserved -= block.size

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, the smallest oversize cached block
        that covers the request, else the oversize ones largest first until they add up to it."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        ordered = sorted(pool.blocks, key=lambda b: (b.size, b.addr))
        above = [b for b in ordered if b.size >= key]
        if above and not above[0].expandable:
            self._release_block(above[0], pool)
            return True
        released = 0
        for block in reversed([b for b in ordered if b.size < key]):
            if released >= key or block.size < limit:
                break
            if not block.expandable and block.prev is None and block.next is None:
                self._release_block(block, pool)
                released += block.size
        return released >= key

    def _release_cached_blocks(self) -> bool:
        """``release_cached_blocks`` / ``release_blocks``: every whole cached segment of both pools, and with
        expandable segments the whole pages inside each cached block."""
        for pool in (self.large, self.small):
            for block in list(pool.blocks):
                if block.expandable:
                    self._unmap_block(block, pool)
                elif block.prev is None and block.next is None:
                    self._release_block(block, pool)
        return True

    # --- expandable segments -----------------------------------------------------------------------------------

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block | None:
        """``try_allocate_expandable_block``: map pages at the free end of the pool's range until ``size`` fits."""
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size), pool):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None and not following.mapped  # find_expandable_block's invariant
            if not self._map_block(following, min(size - candidate.size, following.size), pool):
                return None
            candidate = following
        pool.blocks.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        """``find_expandable_block``: an unmapped range (with the free block just before it) of ``size`` bytes,
        or the pool's range made."""
        for block in sorted(pool.unmapped, key=lambda b: (b.size, b.addr)):
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
        block = _Block(base, self._space, pool.small, mapped=False, expandable=True)
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
            rest = _Block(block.addr + mapped, block.size - mapped, pool.small, mapped=False, expandable=True)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            pool.unmapped.append(rest)
            block.size = mapped
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.blocks.append(block)
        return True

    def _unmap_block(self, block: _Block, pool: _Pool) -> None:
        """``unmap_block``: the whole pages inside a cached block given back (``ExpandableSegment::unmap``)."""
        begin = -(-block.addr // pool.page) * pool.page
        end = (block.addr + block.size) // pool.page * pool.page
        if begin >= end:
            return
        pool.blocks.remove(block)
        for addr, size, before in ((block.addr, begin - block.addr, True), (end, block.addr + block.size - end, False)):
            if size > 0:
                part = _Block(addr, size, pool.small, expandable=True)
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
                pool.blocks.append(part)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self.reserved -= end - begin
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.unmapped.append(block)

    def largest_free_block(self) -> int:
        """The largest cached free (mapped) block of either pool, in bytes."""
        return max((b.size for pool in (self.small, self.large) for b in pool.blocks), default=0)


def replay(
    trace: Iterable[Event], config: AllocatorConfig = AllocatorConfig(), capacity: int | None = None
) -> AllocatorReplay:
    """Replay ``trace`` through :class:`CachingAllocator` on a device of ``capacity`` bytes.

    Args:
        trace: allocations and frees in the order the step makes them; a zero-byte allocation takes nothing, as
            ``CUDACachingAllocator::allocate`` skips ``malloc`` for it.
        config: the ``PYTORCH_CUDA_ALLOC_CONF`` settings.
        capacity: the bytes the allocator may reserve; ``None``: without limit (no cache is ever released).

    Returns:
        The peaks, the largest free block at the reserved peak, and the event at which it ran out of memory.

    Raises:
        SpecError: a ``max_split_size_mb`` torch refuses.
    """
    allocator = CachingAllocator(config, capacity)
    live: dict[int, tuple[_Block | None, int]] = {}
    count = requested = 0
    reserved_peak = largest_at_peak = allocated_peak = requested_peak = 0
    for index, event in enumerate(trace):
        if isinstance(event, Alloc):
            if event.nbytes < 0:
                raise RuntimeError(f"a trace's allocation of {event.nbytes} bytes: the trace is broken")
            block = allocator.malloc(event.nbytes) if event.nbytes else None
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
    return AllocatorReplay(reserved_peak, largest_at_peak, allocated_peak, requested_peak, None, allocator.retries)
