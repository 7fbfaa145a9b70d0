"""The caching allocator model (ckptlab/step/allocator.py), one rule a test, on hand-made traces whose reserved
bytes are worked out by hand from c10/cuda/CUDACachingAllocator.cpp; each test names the rule and its function."""

from __future__ import annotations

import random

import pytest

from ckptlab.alloc_conf import AllocatorConfig, parse_alloc_conf
from ckptlab.errors import SpecError
from ckptlab.show import i18n
from ckptlab.step.allocator import (
    Alloc,
    CachingAllocator,
    Free,
    replay,
    roundup_power2_next_division,
)

MIB = 1024 * 1024
SPLIT_40 = AllocatorConfig(max_split_size_mb=40)
EXPANDABLE = AllocatorConfig(expandable_segments=True)
GC = AllocatorConfig(garbage_collection_threshold=0.5, per_process_memory_fraction=0.5)


def test_round_size_rounds_each_request_up_to_512_bytes():
    """round_size: 1 B and 513 B take 512 B and 1,024 B of one 2 MiB small segment."""
    result = replay([Alloc(1), Alloc(513)])
    assert (result.allocated_peak, result.requested_peak, result.reserved_peak) == (1536, 514, 2 * MIB)


def test_get_pool_and_get_allocation_size_pick_the_pool_and_the_segment():
    """get_pool / get_allocation_size: 1 MiB is small (two share a 2 MiB segment); 1 MiB + 1 is large (20 MiB, under
    10 MiB); 10 MiB and 11 MiB are rounded up to 2 MiB (10 and 12 MiB segments)."""
    assert replay([Alloc(MIB), Alloc(MIB)]).reserved_peak == 2 * MIB  # the small pool splits off 1 MiB
    assert replay([Alloc(MIB + 1)]).reserved_peak == 20 * MIB
    assert replay([Alloc(10 * MIB)]).reserved_peak == 10 * MIB
    assert replay([Alloc(11 * MIB)]).reserved_peak == 12 * MIB


def test_should_split_a_small_block_when_512_bytes_would_remain():
    """should_split (small pool): two 1,000 B requests share one 2 MiB segment."""
    assert replay([Alloc(1000), Alloc(1000)]).reserved_peak == 2 * MIB


def test_should_split_a_large_block_only_when_more_than_1_mib_would_remain():
    """should_split (large pool): 19 MiB leaves 1 MiB of its 20 MiB segment, not split, so 1.5 MiB needs a new
    20 MiB segment (40 MiB reserved, 21.5 allocated: the 19 MiB block is whole); 18.5 MiB leaves 1.5 MiB, split off, which the 1.5 MiB request reuses (20 MiB)."""
    whole = replay([Alloc(19 * MIB), Alloc(3 * MIB // 2)])
    assert (whole.reserved_peak, whole.allocated_peak) == (40 * MIB, 20 * MIB + 3 * MIB // 2)
    split = replay([Alloc(37 * MIB // 2), Alloc(3 * MIB // 2)])
    assert (split.reserved_peak, split.allocated_peak) == (20 * MIB, 20 * MIB)


def test_get_free_block_takes_the_best_fit():
    """get_free_block: cached 12 and 14 MiB segments; 11 MiB takes the 12 (best fit), so 13 MiB takes the 14 and
    nothing new is reserved (26 MiB). A worst fit would have left 13 MiB a new segment."""
    trace = [Alloc(12 * MIB), Alloc(14 * MIB), Free(0), Free(1), Alloc(11 * MIB), Alloc(13 * MIB)]
    result = replay(trace)
    assert (result.reserved_peak, result.largest_free_at_peak) == (26 * MIB, 0)


def test_free_block_merges_neighbours_of_the_same_segment_only():
    """free_block / try_merge_blocks: two 5 MiB blocks of one 20 MiB segment merge back into it, which then serves
    20 MiB (20 MiB reserved); two freed 12 MiB segments, though side by side, never merge, so 24 MiB needs a new
    segment (48 MiB)."""
    assert replay([Alloc(5 * MIB), Alloc(5 * MIB), Free(0), Free(1), Alloc(20 * MIB)]).reserved_peak == 20 * MIB
    assert replay([Alloc(12 * MIB), Alloc(12 * MIB), Free(0), Free(1), Alloc(24 * MIB)]).reserved_peak == 48 * MIB


def test_max_split_size_keeps_an_oversize_block_from_a_smaller_request():
    """get_free_block with max_split_size: a cached 50 MiB block serves 5 MiB by default (50 MiB reserved);
    with max_split_size_mb=40 it is oversize and 5 MiB gets its own 20 MiB segment (70 MiB)."""
    trace = [Alloc(50 * MIB), Free(0), Alloc(5 * MIB)]
    assert replay(trace).reserved_peak == 50 * MIB
    result = replay(trace, SPLIT_40)
    assert (result.reserved_peak, result.largest_free_at_peak) == (70 * MIB, 50 * MIB)


def test_max_split_size_serves_a_large_request_only_within_20_mib_and_never_splits_it():
    """get_free_block / should_split with max_split_size_mb=40: a cached 100 MiB block serves 82 MiB (under
    82 + 20) whole, so 10 MiB needs a 10 MiB segment of its own (110 MiB; split, the 18 MiB left would have served
    it); it does not serve 60 MiB (a new 60 MiB segment: 160 MiB reserved)."""
    near = replay([Alloc(100 * MIB), Free(0), Alloc(82 * MIB), Alloc(10 * MIB)], SPLIT_40)
    assert (near.reserved_peak, near.allocated_peak) == (110 * MIB, 110 * MIB)
    assert replay([Alloc(100 * MIB), Free(0), Alloc(60 * MIB)], SPLIT_40).reserved_peak == 160 * MIB


def test_release_cached_blocks_only_when_the_device_has_no_room():
    """malloc -> release_cached_blocks and a retry: a cached 12 MiB segment is kept without a limit (42 MiB), and
    released on a 40 MiB device so that 30 MiB fits (30 MiB, one retry)."""
    trace = [Alloc(12 * MIB), Free(0), Alloc(30 * MIB)]
    assert replay(trace).reserved_peak == 42 * MIB
    tight = replay(trace, capacity=40 * MIB)
    assert (tight.reserved_peak, tight.retries, tight.out_of_memory_at) == (30 * MIB, 1, None)


def test_release_available_cached_blocks_releases_the_oversize_block_first():
    """release_available_cached_blocks with max_split_size_mb=40 on a 120 MiB device: cached 50 and 60 MiB
    segments; 5 MiB may take neither, and its 20 MiB segment needs room: the smallest oversize block that covers
    40 MiB (the 50) is released, the 60 stays (80 MiB reserved)."""
    allocator = CachingAllocator(SPLIT_40, capacity=120 * MIB)
    first, second = allocator.malloc(50 * MIB), allocator.malloc(60 * MIB)
    assert first is not None and second is not None
    allocator.free(first)
    allocator.free(second)
    assert allocator.malloc(5 * MIB) is not None
    assert (allocator.reserved, allocator.retries) == (80 * MIB, 0)  # num_alloc_retries counts only a full release


def test_malloc_reports_the_out_of_memory_event_when_fragmentation_leaves_no_segment():
    """malloc: on a 40 MiB device, three 9 MiB requests fill two 20 MiB segments; with the first and third freed,
    21 MiB needs a 22 MiB segment: the whole cached segment is released, the one holding the live 9 MiB cannot be,
    and 20 + 22 > 40: out of memory at event 5 though the live 30 MiB would fit."""
    trace = [Alloc(9 * MIB), Alloc(9 * MIB), Alloc(9 * MIB), Free(0), Free(2), Alloc(21 * MIB)]
    result = replay(trace, capacity=40 * MIB)
    assert (result.out_of_memory_at, result.reserved_peak, result.retries) == (5, 40 * MIB, 1)


def test_expandable_segments_grow_one_range_in_pages():
    """try_allocate_expandable_block / map_block: 50 MiB maps three 20 MiB pages (60 MiB); freed, it merges with
    the 10 MiB left after it and serves 60 MiB with no new segment (60 MiB, against 110 MiB without); a small
    request maps one 2 MiB page."""
    trace = [Alloc(50 * MIB), Free(0), Alloc(60 * MIB)]
    assert replay(trace).reserved_peak == 110 * MIB
    assert replay(trace, EXPANDABLE).reserved_peak == 60 * MIB
    assert replay([Alloc(1000)], EXPANDABLE).reserved_peak == 2 * MIB


def test_expandable_segments_unmap_the_cached_pages_when_the_device_is_full():
    """release_blocks / unmap_block: on a 41 MiB device, a freed 30 MiB (two 20 MiB pages) leaves 40 MiB cached;
    a 1 MiB request's 2 MiB small page does not fit, so the cached pages are unmapped and it is retried (2 MiB)."""
    allocator = CachingAllocator(EXPANDABLE, capacity=41 * MIB)
    block = allocator.malloc(30 * MIB)
    assert block is not None and allocator.reserved == 40 * MIB
    allocator.free(block)
    assert allocator.malloc(MIB) is not None
    assert (allocator.reserved, allocator.retries) == (2 * MIB, 1)


def test_a_max_split_size_torch_refuses_is_refused_by_name():
    """AllocatorConfig.validate: under 20 MiB (kLargeBuffer) is refused, naming the value and the least."""
    with pytest.raises(SpecError) as caught:
        replay([], AllocatorConfig(max_split_size_mb=8))
    assert caught.value.key == "allocator.max_split_size_too_small" and caught.value.params["value"] == 8


def test_reserved_is_never_below_allocated_over_random_traces():
    """Every rule together, over seeded random traces: after each event reserved >= allocated, and the replay's
    peaks keep reserved >= allocated >= requested."""
    rng = random.Random(60)
    sizes = [1, 700, 512 * 1024, MIB, MIB + 1, 3 * MIB, 9 * MIB, 11 * MIB, 25 * MIB, 45 * MIB]
    configs = [
        AllocatorConfig(),
        SPLIT_40,
        EXPANDABLE,
        AllocatorConfig(max_split_size_mb=40, expandable_segments=True),
        AllocatorConfig(roundup_power2_divisions=(4,) * 16),
        GC,
    ]
    for _ in range(150):
        config, capacity = rng.choice(configs), rng.choice([None, 100 * MIB, 200 * MIB])
        capacity = capacity or (200 * MIB if config is GC else None)  # a memory fraction needs the device's memory
        allocator = CachingAllocator(config, capacity)
        live, trace, count = {}, [], 0
        for _ in range(40):
            if live and rng.random() < 0.45:
                index = rng.choice(sorted(live))
                allocator.free(live.pop(index))
                trace.append(Free(index))
            else:
                nbytes, stream = rng.choice(sizes) + rng.randrange(512), rng.choice([0, 0, 1])
                block = allocator.malloc(nbytes, stream)
                if block is None:
                    break
                live[count] = block
                trace.append(Alloc(nbytes, stream))
                count += 1
            assert allocator.reserved >= allocator.allocated >= 0
            assert capacity is None or allocator.reserved <= capacity
        result = replay(trace, config, capacity)
        assert result.reserved_peak >= result.allocated_peak >= result.requested_peak


def test_get_free_block_reuses_only_the_same_streams_blocks():
    """get_free_block (BlockComparatorSize orders by stream first): a freed 12 MiB segment of the compute stream
    serves a 12 MiB request of the same stream (12 MiB reserved), never one of stream 1 (a second segment: 24)."""
    assert replay([Alloc(12 * MIB), Free(0), Alloc(12 * MIB)]).reserved_peak == 12 * MIB
    assert replay([Alloc(12 * MIB), Free(0), Alloc(12 * MIB, stream=1)]).reserved_peak == 24 * MIB


def test_round_size_rounds_to_the_power_of_two_division():
    """round_size / roundup_power2_next_division with 4 divisions in every interval: 5 MiB + 1 B lies between 4 and
    8 MiB, whose quarters are 1 MiB, so it takes 6 MiB (5 MiB + 512 B without); 1 MiB + 1 B takes 1.25 MiB; 1,200 B
    is not above 512 x 4 and keeps the 512 B rounding (1,536 B). The C++ comment's example: 1,200 in 4 divisions
    is 1,280."""
    quarters = AllocatorConfig(roundup_power2_divisions=(4,) * 16)
    assert replay([Alloc(5 * MIB + 1)]).allocated_peak == 5 * MIB + 512
    assert replay([Alloc(5 * MIB + 1)], quarters).allocated_peak == 6 * MIB
    assert replay([Alloc(MIB + 1)], quarters).allocated_peak == 5 * MIB // 4
    assert replay([Alloc(1200)], quarters).allocated_peak == 1536
    assert roundup_power2_next_division(1200, 4) == 1280 and roundup_power2_next_division(4 * MIB, 4) == 4 * MIB


def test_garbage_collect_cached_blocks_releases_the_blocks_older_than_the_average():
    """garbage_collect_cached_blocks, in malloc before alloc_block, with per_process_memory_fraction 0.5 of 200 MiB
    (100 MiB allowed) and a threshold of 0.5 (50 MiB): cached 30 MiB (age 2 get_free_block calls) and 32 MiB (age
    1) segments hold 62 MiB; 40 MiB fits neither, so the 12 MiB above 50 is collected: the 30 MiB block, at least
    the average age 1.5, goes, the 32 stays, and 40 MiB fits (72 MiB, no retry). Without the threshold 62 + 40
    passes the 100 allowed: release_cached_blocks frees both and retries (40 MiB, one retry)."""
    for config, expected in ((GC, (72 * MIB, 0)), (AllocatorConfig(per_process_memory_fraction=0.5), (40 * MIB, 1))):
        allocator = CachingAllocator(config, capacity=200 * MIB)
        first = allocator.malloc(30 * MIB)
        assert first is not None
        allocator.free(first)
        second = allocator.malloc(32 * MIB)
        assert second is not None
        allocator.free(second)
        assert allocator.malloc(40 * MIB) is not None
        assert (allocator.reserved, allocator.retries) == expected


def test_alloc_block_stays_within_the_memory_fraction():
    """alloc_block with allowed_memory_maximum (setMemoryFraction): 0.5 of a 100 MiB device allows 50 MiB, so a
    second 30 MiB segment is refused and, nothing being cached, the trace runs out at event 1; without a fraction
    both fit. A fraction with no device memory to take it of is refused by name."""
    trace = [Alloc(30 * MIB), Alloc(30 * MIB)]
    assert replay(trace, capacity=100 * MIB).out_of_memory_at is None
    half = AllocatorConfig(per_process_memory_fraction=0.5)
    assert replay(trace, half, capacity=100 * MIB).out_of_memory_at == 1
    with pytest.raises(SpecError) as caught:
        replay(trace, half)
    assert caught.value.key == "allocator.memory_fraction_without_memory"


def test_find_expandable_block_maps_the_lowest_address_gap():
    """find_expandable_block walks the unmapped ranges by address (BlockComparatorAddress), not by size: with
    expandable segments on a 101 MiB device, 40, 20, 20 and 20 MiB fill pages 0-4; the 40 and the third are freed;
    a small request's 2 MiB page does not fit (102 MiB), so the cached pages are unmapped, leaving gaps at 0 (40
    MiB) and 60 MiB (20). A 20 MiB request maps the gap at address 0 (62 MiB reserved), not the 20 MiB one that
    fits it best."""
    allocator = CachingAllocator(EXPANDABLE, capacity=101 * MIB)
    blocks = [allocator.malloc(n * MIB) for n in (40, 20, 20, 20)]
    assert all(blocks) and allocator.reserved == 100 * MIB
    allocator.free(blocks[0])  # type: ignore[arg-type]
    allocator.free(blocks[2])  # type: ignore[arg-type]
    assert allocator.malloc(1000) is not None and (allocator.reserved, allocator.retries) == (42 * MIB, 1)
    block = allocator.malloc(20 * MIB)
    assert block is not None and (block.addr, allocator.reserved) == (0, 62 * MIB)


def test_max_non_split_rounding_mb_widens_what_an_oversize_block_serves():
    """get_free_block with max_split_size_mb=40 and max_non_split_rounding_mb=50: a cached 100 MiB block serves 60
    MiB whole (100 < 60 + 50: 100 MiB reserved, 100 allocated); with the default 20 MiB it does not (160 MiB)."""
    trace = [Alloc(100 * MIB), Free(0), Alloc(60 * MIB)]
    wide = replay(trace, AllocatorConfig(max_split_size_mb=40, max_non_split_rounding_mb=50))
    assert (wide.reserved_peak, wide.allocated_peak) == (100 * MIB, 100 * MIB)
    assert replay(trace, SPLIT_40).reserved_peak == 160 * MIB


def test_parse_alloc_conf_reads_torchs_syntax():
    """parse_alloc_conf as AcceleratorAllocatorConfig::parseArgs / CUDAAllocatorConfig::parseArgs read it: spaces
    dropped, a pinned-memory key read past; roundup_power2_divisions [64:8,256:4,>:1] sets the intervals up to 64
    MiB's to 8, 256 MiB's to 4, those after it to 1, and leaves 128 MiB's at 0 as torch does; one count sets all."""
    config = parse_alloc_conf(
        "expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6,"
        "roundup_power2_divisions:[64:8,256:4,>:1],per_process_memory_fraction:0.9,pinned_use_background_threads:True"
    )
    assert config == AllocatorConfig(
        max_split_size_mb=128,
        expandable_segments=True,
        garbage_collection_threshold=0.6,
        roundup_power2_divisions=(8,) * 7 + (0, 4) + (1,) * 7,
        per_process_memory_fraction=0.9,
    )
    assert parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16
    assert parse_alloc_conf("") == AllocatorConfig() == parse_alloc_conf("expandable_segments:False,")


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("max_split_size_mb:8", "allocator.max_split_size_too_small", 8),
        ("max_non_split_rounding_mb:10", "allocator.max_non_split_rounding_too_small", 10),
        ("expandable_segments:true", "allocator.conf_not_a_bool", "true"),
        ("max_split_size_mb:128MB", "allocator.conf_not_a_number", "128MB"),
        ("garbage_collection_threshold:1.5", "allocator.gc_threshold_out_of_range", 1.5),
        ("garbage_collection_threshold:0", "allocator.gc_threshold_out_of_range", 0.0),
        ("per_process_memory_fraction:1.2", "allocator.memory_fraction_out_of_range", 1.2),
        ("roundup_power2_divisions:[100:4]", "allocator.interval_not_power_of_two", 100),
        ("roundup_power2_divisions:3", "allocator.divisions_not_power_of_two", 3),
        ("expandable_segment:True", "allocator.conf_unknown_key", None),
        ("max_split_size_mb:", "allocator.conf_ended", None),
        ("expandable_segments:True:False", "allocator.conf_syntax", None),
        ("large_segment_size_mb:10", "allocator.large_segment_size_too_small", 10),
        ("backend:cudaMallocAsync", "allocator.conf_not_modelled", "cudaMallocAsync"),
        ("backend:fast", "allocator.conf_backend", "fast"),
    ],
)
def test_parse_alloc_conf_refuses_a_bad_string_by_name(text, key, value):
    """parse_alloc_conf: each string torch refuses (or reads otherwise than it says) is refused with its own key,
    the string named, the value among the params, and worded in every language with only those params."""
    with pytest.raises(SpecError) as caught:
        parse_alloc_conf(text)
    error = caught.value
    assert error.key == key and (value is None or error.params["value"] == value)
    for lang in i18n.LANGUAGES:
        words = i18n.messages(lang)[i18n.ERRORS + key]
        assert i18n.placeholders(words) <= set(error.params), (lang, key)


def test_the_published_growth_of_pytorch_123548_is_reproduced_to_the_mib():
    """malloc / get_free_block / find_expandable_block together, against a published trace: pytorch PR #193400
    (issue #123548; torch 2.12 on a 16 GiB RX 9070 XT, ROCm issue #6603 names the 64 MiB buffer allocated first)
    with max_split_size_mb:128,expandable_segments:True: each cycle allocates 91 MiB, 45.5 MiB and a 2 MiB block
    that stays, then frees the first two. The published allocated and reserved MiB at cycles 0, 20, ..., 100 are
    replayed exactly (the freed 136.5 MiB block is oversize for 91 MiB, so each cycle maps new pages). On a device
    where 16,000 MiB can be reserved (the one figure inferred: any capacity from 16,000 to 16,099 MiB gives it),
    the first release and retry comes at cycle 115, leaving 296 allocated and 2,680 reserved, as published."""
    published = {0: (66, 220), 20: (106, 2980), 40: (146, 5760), 60: (186, 8520), 80: (226, 11300), 100: (266, 14060)}
    config = parse_alloc_conf("max_split_size_mb:128,expandable_segments:True")
    for capacity, cycles in ((None, 101), (16000 * MIB, 116)):
        allocator = CachingAllocator(config, capacity)
        assert allocator.malloc(64 * MIB) is not None
        peak, seen = 0, {}
        for cycle in range(cycles):
            first, second = allocator.malloc(91 * MIB), allocator.malloc(91 * MIB // 2)
            assert first is not None and second is not None and allocator.malloc(2 * MIB) is not None
            peak = max(peak, allocator.reserved)
            allocator.free(first)
            allocator.free(second)
            seen[cycle] = (allocator.allocated // MIB, allocator.reserved // MIB, allocator.retries)
        if capacity is None:
            assert {cycle: seen[cycle][:2] for cycle in published} == published
        else:
            assert seen[114][2] == 0 and seen[115] == (296, 2680, 1) and peak == 16000 * MIB


def test_large_segment_size_mb_sets_the_small_large_segment_and_the_expandable_page():
    """get_allocation_size / find_expandable_block with large_segment_size_mb:40 (parsed as torch reads it): a
    5 MiB request gets a 40 MiB segment (20 by default), and with expandable segments 50 MiB maps two 40 MiB
    pages (80 MiB; three 20 MiB pages, 60, by default)."""
    forty = parse_alloc_conf("large_segment_size_mb:40")
    assert (replay([Alloc(5 * MIB)]).reserved_peak, replay([Alloc(5 * MIB)], forty).reserved_peak) == (
        20 * MIB,
        40 * MIB,
    )
    pages = parse_alloc_conf("large_segment_size_mb:40,expandable_segments:True")
    assert (replay([Alloc(50 * MIB)], EXPANDABLE).reserved_peak, replay([Alloc(50 * MIB)], pages).reserved_peak) == (
        60 * MIB,
        80 * MIB,
    )
