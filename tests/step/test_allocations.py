"""The order of a simulated step's allocations: recorded from the tracker, and repeated as the fold repeats bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab import RunSpec, simulate
from ckptlab.explore.device import device_total
from ckptlab.explore.gpus import HOPPER_CUBLAS_WORKSPACE
from ckptlab.results.allocations import (
    ALL_GATHER,
    COMPUTE,
    HOST_COPIES,
    LAYERS_REPEATED,
    REDUCE_SCATTER,
    WHOLE_STEP,
    AllocationTrace,
)
from ckptlab.step.allocations import AllocationRecorder
from ckptlab.step.memory_meters import HOST
from ckptlab.step.torch_workarounds import LOGITS


def test_the_recorder_keeps_births_frees_and_resizes_not_moves_between_categories():
    recorder = AllocationRecorder()
    recorder.change(1, "Activation", 1024)  # born
    recorder.change(2, HOST, 512)  # offload's host copy
    recorder.change(1, "Activation", -1024)  # MemTracker moves storage 1 to another category: no event
    recorder.change(1, "Gradient", 1024)
    recorder.change(1, LOGITS, 1024)  # the logits' own bookkeeping: no event
    recorder.boundary()
    recorder.change(3, "Parameter", 4096)
    recorder.change(3, "Parameter", -4096)  # FSDP2's resize_(0): the block is given back
    recorder.sample()
    recorder.change(3, "Parameter", 8192)  # resized again: a new block
    recorder.sample()
    recorder.change(2, HOST, -512, gone=True)
    recorder.change(1, "Gradient", -1024, gone=True)
    trace = recorder.trace()
    assert trace.sizes == (1024, 512, 4096, 8192)
    assert trace.streams == (COMPUTE, HOST_COPIES, COMPUTE, COMPUTE)
    assert trace.events == (0, 1, 2, ~2, 3, ~1, ~0)
    assert recorder.stretches == [[0, 1], [2, ~2, 3, ~1, ~0]]
    assert trace.how == WHOLE_STEP
    # The device's allocator does not see the host copies, its frees numbered among its own allocations.
    assert trace.on_device() == [(True, 1024, 0), (True, 4096, 0), (False, 1, 0), (True, 8192, 0), (False, 0, 0)]


def test_the_recorder_tags_what_is_born_on_fsdp2s_streams_with_that_stream():
    """A storage born, or resized, while FSDP2's copy-in or reduce-scatter stream is current is that stream's (the
    allocator's pool is the current stream's); a birth on a stream torch allocates nothing on is refused by name."""
    recorder = AllocationRecorder()
    current: list[str | None] = [None]
    recorder.follow_streams(lambda: current[0])
    recorder.change(1, "Parameter", 100)  # the compute stream
    current[0] = "all_gather_copy_in_stream"
    recorder.change(2, "Temp", 200)  # the all-gather's output
    current[0] = "reduce_scatter_stream"
    recorder.change(3, "Gradient", 300)  # the reduce-scatter's output
    current[0] = None
    recorder.change(1, "Parameter", -100)  # FSDP2's resize_(0) ...
    recorder.sample()
    current[0] = "all_gather_copy_in_stream"
    recorder.change(1, "Parameter", 100)  # ... and back, on the copy-in stream: a new block of its pool
    recorder.sample()
    trace = recorder.trace()
    assert trace.streams == (COMPUTE, ALL_GATHER, REDUCE_SCATTER, ALL_GATHER)
    assert [stream for _, _, stream in trace.on_device()] == [0, 1, 2, 0, 1]
    current[0] = "all_reduce_stream"
    with pytest.raises(RuntimeError, match="all_reduce_stream"):
        recorder.change(4, "Temp", 1)


def test_cublas_workspaces_come_at_each_threads_first_matmul_and_stay():
    trace = AllocationTrace(sizes=(100, 200), streams=(COMPUTE, COMPUTE), events=(0, ~0, 1, ~1), how=WHOLE_STEP)
    started = replace(trace, thread_starts=(0, 2))  # the forward's first stretch, the backward's first
    assert trace.on_device(at_thread_starts=32) == trace.on_device()  # no thread named: nothing added
    assert started.on_device(at_thread_starts=32) == [
        (True, 32, 0),
        (True, 100, 0),
        (False, 1, 0),
        (True, 32, 0),
        (True, 200, 0),
        (False, 3, 0),
    ]


@pytest.mark.slow
def test_the_folded_order_is_the_whole_steps_event_for_event():
    """tiny-qwen3's 8 layers at every_n_layers=1 fold into copies of 3, 4 and 5 layers; with offload, the host copies
    are in the order too. The repeated order equals simulating every layer's, birth for birth and free for free."""
    spec = RunSpec(model="tiny-qwen3", seq_len=64, every_n_layers=1, offload=True)
    result = simulate(spec, allocations=True)
    folded = result.allocations
    exact = simulate(spec, fast=False, allocations=True).allocations
    assert folded is not None and exact is not None
    assert (folded.how, exact.how) == (LAYERS_REPEATED, WHOLE_STEP)
    assert "note.allocation_order_repeated" in [note.key for note in result.notes]  # the third copy, said
    assert set(exact.streams) == {COMPUTE, HOST_COPIES}
    assert len(exact.thread_starts) == 2
    assert (folded.sizes, folded.streams, folded.events, folded.thread_starts) == (
        exact.sizes,
        exact.streams,
        exact.events,
        exact.thread_starts,
    )
    # Replayed on an H100: two 32 MiB cuBLAS workspaces inside reserved, which never falls below the tensors'.
    total = device_total(result, "H100")
    assert total.cublas_bytes == 2 * HOPPER_CUBLAS_WORKSPACE
    assert total.reserved_bytes >= total.allocated_bytes + total.cublas_bytes
    assert total.total_bytes == total.reserved_bytes + total.context_bytes
    assert (total.trace_how, total.out_of_memory_at) == (LAYERS_REPEATED, None)


@pytest.mark.slow
def test_an_fsdp2_simulation_records_its_collectives_buffers_on_their_streams():
    """tiny-llama's 6 layers on 2 fake ranks: each layer is all-gathered in the forward and again in the backward, the
    root once (it stays unsharded), each into a buffer born on FSDP2's all_gather_copy_in_stream; each layer's and the
    root's gradients reduce-scattered into an output born on its reduce_scatter_stream. Replayed, the three pools
    reserve more than the same order on one stream."""
    spec = RunSpec(model="tiny-llama", seq_len=64, every_n_layers=1, world_size=2, fsdp=True)
    result = simulate(spec, fast=False, allocations=True)
    trace = result.allocations
    assert trace is not None
    layers = 6
    assert (trace.streams.count(ALL_GATHER), trace.streams.count(REDUCE_SCATTER)) == (2 * layers + 1, layers + 1)
    one_stream = replace(trace, streams=tuple(COMPUTE if s != HOST_COPIES else s for s in trace.streams))
    pooled = device_total(result, "H100")
    shared = device_total(replace(result, allocations=one_stream), "H100")
    assert pooled.reserved_bytes > shared.reserved_bytes >= shared.allocated_bytes
