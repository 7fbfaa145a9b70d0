"""The order of a simulated step's allocations: recorded from the tracker, and repeated as the fold repeats bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab import RunSpec, simulate
from ckptlab.explore.device import device_total
from ckptlab.explore.gpus import HOPPER_CUBLAS_WORKSPACE
from ckptlab.results.allocations import COMPUTE, HOST_COPIES, LAYERS_REPEATED, WHOLE_STEP, AllocationTrace
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
    # The device's allocator sees the compute stream only, its frees numbered among its own allocations.
    assert trace.on(COMPUTE) == [(True, 1024), (True, 4096), (False, 1), (True, 8192), (False, 0)]


def test_cublas_workspaces_come_at_each_threads_first_matmul_and_stay():
    trace = AllocationTrace(sizes=(100, 200), streams=(COMPUTE, COMPUTE), events=(0, ~0, 1, ~1), how=WHOLE_STEP)
    started = replace(trace, thread_starts=(0, 2))  # the forward's first stretch, the backward's first
    assert trace.on(COMPUTE, at_thread_starts=32) == trace.on(COMPUTE)  # no thread named: nothing added
    assert started.on(COMPUTE, at_thread_starts=32) == [
        (True, 32),
        (True, 100),
        (False, 1),
        (True, 32),
        (True, 200),
        (False, 3),
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
