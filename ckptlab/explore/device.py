"""What nvidia-smi will show for a simulated step on one GPU: the caching allocator replayed, and what lies outside it.

The step's order of allocations (``RunResult.allocations``: ``simulate(..., allocations=True)``) goes through the
model of torch's caching allocator (:mod:`ckptlab.step.allocator`) with cuBLAS's workspace allocated at each thread's
first matmul (the forward's and autograd's: ``AllocationTrace.thread_starts``), on a device of the GPU's memory less
what lies outside the allocator (the CUDA context). The answer is a :class:`~ckptlab.results.allocations.DeviceTotal`:
each term and where it came from; :func:`ckptlab.explore.budget.fit` decides on its sum.

Under FSDP2 the collectives' buffers come from their own streams' pools (the all-gather's copy-in stream, the
reduce-scatter's stream: ``ckptlab.step.allocations`` tags them where FSDP2 allocates them), and NCCL's own buffers,
outside torch, are estimated from NCCL's defaults (:func:`nccl_buffers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..alloc_conf import EXPANDABLE, parse_alloc_conf
from ..results import RunResult
from ..results.allocations import AllocationTrace, DeviceTotal
from ..step.allocator import Alloc, Event, Free, replay
from .budget import fit, gpu_name
from .gpus import (
    CONTEXT_ESTIMATE,
    CONTEXT_SOURCE,
    GPU_SPECS,
    HOPPER_CUBLAS_WORKSPACE,
    NCCL_CHANNELS,
    NCCL_CONNECTION_BYTES,
    NCCL_SOURCE,
)


def nccl_buffers(world_size: int) -> int:
    """NCCL's buffers on one GPU of a step across ``world_size`` ranks, estimated from NCCL's defaults
    (:data:`~.gpus.NCCL_CONNECTION_BYTES` a channel, :data:`~.gpus.NCCL_CHANNELS` channels: ``gpus`` says where each
    figure comes from); 0 on one GPU, where torch makes no NCCL communicator.

    FSDP2's all-gather and reduce-scatter run NCCL's ring, whose two connections a channel (one neighbour each way)
    do not grow with the ranks; the estimate is the same for 2 ranks as for 1,024."""
    return NCCL_CHANNELS * NCCL_CONNECTION_BYTES if world_size > 1 else 0


def device_total(result: RunResult, gpu: str | int, alloc_conf: str | None = None) -> DeviceTotal:
    """The device total of ``result``'s step on ``gpu``: a name :func:`~.budget.gpu_name` reads, or a budget in bytes
    (a card of that memory, its context estimated, cuBLAS's Hopper workspace: the larger default).

    Args:
        result: a simulation with its order of allocations (``simulate(spec, allocations=True)``).
        gpu: the GPU, e.g. "H100" or "h100-80", or bytes.
        alloc_conf: the ``PYTORCH_CUDA_ALLOC_CONF`` the step is replayed under (None: the spec's own,
            ``RunSpec.alloc_conf``; "": torch's defaults).

    Returns:
        The allocated, reserved, cuBLAS, CUDA context and NCCL terms, and where the allocator ran short.

    Raises:
        SpecError: an unknown GPU name, or an allocator setting torch refuses.
    """
    if result.allocations is None or result.memory is None:
        raise RuntimeError("device_total needs a simulation with its allocations: simulate(spec, allocations=True)")
    if isinstance(gpu, str):
        spec = GPU_SPECS[gpu_name(gpu)]
        name, memory, workspace = spec.name, spec.memory_bytes, spec.cublas_workspace_bytes
        context, measured, source = spec.context_bytes, spec.context_measured, spec.context_source
    else:
        name, memory, workspace = "", gpu, HOPPER_CUBLAS_WORKSPACE
        context, measured, source = CONTEXT_ESTIMATE, False, CONTEXT_SOURCE
    trace = result.allocations
    events = device_events(trace, workspace)
    # What cudaMalloc can get: the card's memory less the context, which the driver holds before the first tensor.
    conf = result.spec.alloc_conf if alloc_conf is None else alloc_conf
    config = parse_alloc_conf(conf)
    answer = replay(events, config, capacity=max(0, memory - context))
    # Out of memory, the replay stops there: the reserved bytes the step needs come from the replay without a limit
    # (the total then says by how much it is short; short of nothing, the cause is the allocator's fragmentation).
    needed = answer if answer.out_of_memory_at is None else replay(events, config, capacity=None)
    return DeviceTotal(
        gpu=name,
        allocated_bytes=result.memory.peak_bytes,
        reserved_bytes=needed.reserved_peak,
        cublas_bytes=workspace * len(trace.thread_starts),
        context_bytes=context,
        context_measured=measured,
        context_source=source,
        nccl_bytes=nccl_buffers(result.spec.world_size),
        nccl_source=NCCL_SOURCE if result.spec.world_size > 1 else "",
        largest_free_at_peak=needed.largest_free_at_peak,
        out_of_memory_at=answer.out_of_memory_at,
        trace_how=trace.how,
        trace_events=len(events),
        alloc_conf=conf,
    )


def device_events(trace: AllocationTrace, workspace: int) -> list[Event]:
    """What the device's caching allocator is asked in ``trace``'s step: every device storage on its stream (the
    compute stream, and under FSDP2 its collectives' streams, each a pool of its own: ``AllocationTrace.on_device``),
    and cuBLAS's ``workspace`` bytes at each thread's first matmul."""
    return [
        Alloc(value, stream) if is_alloc else Free(value)
        for is_alloc, value, stream in trace.on_device(at_thread_starts=workspace)
    ]


def with_device_total(result: RunResult, gpu: str | int) -> RunResult:
    """``result`` carrying its device total on ``gpu`` (``RunResult.device_total``, which :func:`~.budget.fits`
    decides on), replayed under the spec's ``alloc_conf``. A table's row carries its order (composed by the replay,
    ``step.replay_order``); a result without one (a row whose order did not compose, which its note says, or a fold
    asked without ``allocations``) is simulated again to record it.

    Raises:
        SpecError: an unknown GPU name, or an allocator setting torch refuses.
    """
    if result.memory is None:
        return result
    recorded = result
    if result.allocations is None:
        from ..step.simulate import simulate  # the core's simulation: only where an order is missing

        recorded = simulate(result.spec, allocations=True)
    # The order travels with the result, so a second replay (expandable_beside) needs no simulation.
    return replace(result, device_total=device_total(recorded, gpu), allocations=recorded.allocations)


def expandable_beside(result: RunResult, gpu: str | int) -> DeviceTotal | None:
    """The device total of ``result``'s step (with its device total: :func:`with_device_total`) replayed again with
    ``expandable_segments:True`` (the setting users are told first after an out-of-memory), for a side-by-side; None
    where the spec already names an allocator setting (its own total is the one asked for) or no order was recorded.

    The same recorded order replayed a second time: no simulation.
    """
    if result.spec.alloc_conf or result.allocations is None or result.device_total is None:
        return None
    return device_total(result, gpu, EXPANDABLE)


# How a search or a table puts a simulated step before the one fit rule: ``(result, budget_bytes) -> result``, the
# result carrying its device total where the rule decides on it (:func:`on_gpu`). Tests stand a stub in for it.
DeviceStep = Callable[[RunResult, int], RunResult]


def on_gpu(gpu: str | int | None = None) -> DeviceStep:
    """The step a search (``gpu_search.cheapest_that_fits``) and the At-scale table (``scale.scale_table``) put each
    simulation through: where the tensors' peak fits the budget, the result with its device total on ``gpu`` (a name
    :func:`~.budget.gpu_name` reads; None: a card of the budget's bytes, its context estimated), so that
    :func:`~.budget.fits` decides on what nvidia-smi will show.

    Where the peak alone is over the budget, the total (never below it: reserved holds every live tensor) is over it
    too: no order is recorded, and the rule decides as before. A table's row brings its order (the replay composes
    it); any other result costs a simulation that records it (``simulate(spec, allocations=True)``: a third shallow
    copy, or the whole model where the copies disagree), only for the settings the rule decides on; the allocator's
    replay of it is cheap.
    """

    def attach(result: RunResult, budget_bytes: int) -> RunResult:
        if result.memory is None or not fit(result.memory.peak_bytes, budget_bytes).fits:
            return result
        return with_device_total(result, budget_bytes if gpu is None else gpu)

    return attach


@dataclass(frozen=True)
class SegmentsOverTime:
    """A step's allocated bytes inside its reserved bytes, event by event, as the caching allocator replayed it
    (without a device limit: the step's own growth), in at most ``points`` samples (each the most of its stretch).

    Attributes:
        alloc_conf: the ``PYTORCH_CUDA_ALLOC_CONF`` replayed under ("": torch's defaults).
        events: the event of the step's order each sample starts at.
        allocated: the bytes live blocks held (``memory_allocated``), the most of each stretch.
        reserved: the bytes the allocator held from the device (``memory_reserved``), the most of each stretch.
        events_total: how many events the step has.
    """

    alloc_conf: str
    events: tuple[int, ...]
    allocated: tuple[int, ...]
    reserved: tuple[int, ...]
    events_total: int

    @property
    def reserved_peak(self) -> int:
        """The most the allocator held (``max_memory_reserved``)."""
        return max(self.reserved, default=0)

    @property
    def allocated_peak(self) -> int:
        """The most the live blocks held (``max_memory_allocated``)."""
        return max(self.allocated, default=0)


def segments_over_time(result: RunResult, alloc_conf: str | None = None, points: int = 600) -> SegmentsOverTime:
    """``result``'s order of allocations replayed (the compute stream, cuBLAS's workspace at each thread's first
    matmul) under ``alloc_conf`` (None: the spec's), sampled for a figure (``show.figures.allocator``).

    Raises:
        SpecError: an allocator setting torch refuses.
    """
    if result.allocations is None:
        raise RuntimeError(
            "segments_over_time needs a simulation with its allocations: simulate(spec, allocations=True)"
        )
    conf = result.spec.alloc_conf if alloc_conf is None else alloc_conf
    events = device_events(result.allocations, HOPPER_CUBLAS_WORKSPACE)
    seen: list[tuple[int, int]] = []
    replay(
        events,
        parse_alloc_conf(conf),
        capacity=None,
        observe=lambda allocated, reserved: seen.append((allocated, reserved)),
    )
    width = max(1, -(-len(seen) // points))  # events a sample stands for
    stretches = [seen[start : start + width] for start in range(0, len(seen), width)]
    return SegmentsOverTime(
        alloc_conf=conf,
        events=tuple(range(0, len(seen), width)),
        allocated=tuple(max(a for a, _ in stretch) for stretch in stretches),
        reserved=tuple(max(r for _, r in stretch) for stretch in stretches),
        events_total=len(seen),
    )
