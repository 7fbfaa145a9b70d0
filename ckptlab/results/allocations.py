"""The order of a step's device allocations (issue 60): what torch's caching allocator would be asked, in order.

A trace is kept on a simulated result but not written to its JSON in full (a deep model's step is 100k events): the
JSON carries what the allocator's replay answers (``ckptlab.step.allocator``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Stream = Literal["compute", "host", "all_gather", "reduce_scatter"]
COMPUTE: Stream = "compute"  # the step's own stream: the device allocator's pool
HOST_COPIES: Stream = "host"  # offload's copies in pinned host memory: never in the device's allocator
# FSDP2's all-gather buffers, born on its all_gather_copy_in_stream: pools of their own in the device's allocator
ALL_GATHER: Stream = "all_gather"
REDUCE_SCATTER: Stream = "reduce_scatter"  # FSDP2's reduce-scatter output, born on its reduce_scatter_stream
# The streams the device's caching allocator serves, numbered as its replay numbers them (the compute stream 0).
DEVICE_STREAMS: tuple[Stream, ...] = (COMPUTE, ALL_GATHER, REDUCE_SCATTER)

How = Literal["whole_step", "layers_repeated", "stretches_replayed"]
WHOLE_STEP: How = "whole_step"  # every layer of the model was simulated and recorded
LAYERS_REPEATED: How = "layers_repeated"  # the middle layers' events repeated as the fold repeats their bytes
STRETCHES_REPLAYED: How = "stretches_replayed"  # a plan's stretches composed from shallow steps' (step.replay_order)


@dataclass(frozen=True)
class AllocationTrace:
    """A step's storages born and freed, in order.

    Attributes:
        sizes: the bytes each storage asked for (as the tensor's storage asks: before the allocator's rounding), by
            its ordinal (the order of births).
        streams: the stream each storage was made on, by ordinal.
        events: the step in order: ``a >= 0`` is the birth of storage ``a``, ``~a`` (negative) its free. A storage
            resized (FSDP2's ``resize_``) is a new birth and the old one's free, as the allocator sees it.
        how: whether the whole step was recorded or its middle layers repeated as the fold repeats them.
        thread_starts: the places in ``events`` where a thread's first matmul comes: the forward's (the forward's
            first stretch) and autograd's (the backward's first); cuBLAS allocates a workspace there.
    """

    sizes: tuple[int, ...]
    streams: tuple[Stream, ...]
    events: tuple[int, ...]
    how: How
    thread_starts: tuple[int, ...] = ()

    def on_device(self, *, at_thread_starts: int = 0) -> list[tuple[bool, int, int]]:
        """The events the device's caching allocator sees, as ``(is_alloc, value, stream)``: an allocation's bytes, or
        a free's allocation number counted among the device's allocations (what ``ckptlab.step.allocator.replay``
        takes), and the stream's number in :data:`DEVICE_STREAMS` (each its own pool; offload's host copies are not
        the device's); with ``at_thread_starts`` bytes, an allocation of that many bytes on the compute stream, never
        freed, at each of :attr:`thread_starts` (cuBLAS's workspace of each thread that runs a matmul)."""
        renumbered: dict[int, int] = {}
        out: list[tuple[bool, int, int]] = []
        starts = set(self.thread_starts) if at_thread_starts else set()
        extra = 0
        for place, event in enumerate(self.events):
            if place in starts:
                out.append((True, at_thread_starts, 0))
                extra += 1
            ordinal = event if event >= 0 else ~event
            if self.streams[ordinal] not in DEVICE_STREAMS:
                continue
            stream = DEVICE_STREAMS.index(self.streams[ordinal])
            if event >= 0:
                renumbered[ordinal] = len(renumbered) + extra
                out.append((True, self.sizes[ordinal], stream))
            else:
                out.append((False, renumbered[ordinal], stream))
        return out


@dataclass(frozen=True)
class DeviceTotal:
    """What ``torch.cuda.mem_get_info`` (and nvidia-smi) will show at a step's height on one GPU, term by term.

    Attributes:
        gpu: the GPU's name (``ckptlab.explore.gpus``).
        allocated_bytes: the step's peak of live tensors (simulated: the bytes the tracker counts).
        reserved_bytes: the caching allocator's reserved peak (the allocator replayed over the step's order,
            cuBLAS's workspaces included): ``max_memory_reserved``; where the GPU ran out, what the step would
            need on a GPU without a limit.
        cublas_bytes: cuBLAS's workspaces, allocated through the caching allocator (inside ``reserved_bytes``).
        context_bytes: the CUDA context, outside the allocator.
        context_measured: whether ``context_bytes`` was measured on this GPU (else estimated).
        context_source: where ``context_bytes`` comes from.
        nccl_bytes: NCCL's buffers outside torch, estimated from NCCL's defaults (``ckptlab.explore.device``'s
            ``nccl_buffers``; 0 on one GPU).
        nccl_source: where ``nccl_bytes`` comes from (always an estimate; "" on one GPU).
        largest_free_at_peak: the largest cached free block when reserved peaked (fragmentation's measure).
        out_of_memory_at: the event of the step's order at which the allocator found no room on this GPU even
            after releasing its cache, or None.
        trace_how: whether the order replayed was the whole step recorded or its layers repeated as the fold does.
        trace_events: how many events the replay ran.
        alloc_conf: the ``PYTORCH_CUDA_ALLOC_CONF`` the step was replayed under ("": torch's defaults).
    """

    gpu: str
    allocated_bytes: int
    reserved_bytes: int
    cublas_bytes: int
    context_bytes: int
    context_measured: bool
    context_source: str
    nccl_bytes: int
    largest_free_at_peak: int
    out_of_memory_at: int | None
    trace_how: How
    trace_events: int
    alloc_conf: str = ""
    nccl_source: str = ""

    @property
    def cached_bytes(self) -> int:
        """Reserved by the allocator but holding no tensor at the peak (nor a workspace): its cache."""
        return max(0, self.reserved_bytes - self.allocated_bytes - self.cublas_bytes)

    @property
    def total_bytes(self) -> int:
        """The sum: reserved (allocated, cached and cuBLAS's workspaces), the CUDA context and NCCL's buffers."""
        return self.reserved_bytes + self.context_bytes + self.nccl_bytes
