"""What nvidia-smi will show for a simulated step on one GPU: the caching allocator replayed, and what lies outside it.

The step's order of allocations (``RunResult.allocations``: ``simulate(..., allocations=True)``) goes through the
model of torch's caching allocator (:mod:`ckptlab.step.allocator`) with cuBLAS's workspace allocated at each thread's
first matmul (the forward's and autograd's: ``AllocationTrace.thread_starts``), on a device of the GPU's memory less
what lies outside the allocator (the CUDA context). The answer is a :class:`~ckptlab.results.allocations.DeviceTotal`:
each term and where it came from; :func:`ckptlab.explore.budget.fit` decides on its sum.

Not counted yet: FSDP2's all-gather stream (its own pool: the trace records every storage on the compute stream)
and NCCL's buffers outside torch; a step across ranks says so (``nccl_bytes`` 0).
"""

from __future__ import annotations

from ..results import RunResult
from ..results.allocations import COMPUTE, DeviceTotal
from ..step.allocator import Alloc, AllocatorConfig, Event, Free, replay
from .budget import gpu_name
from .gpus import GPU_SPECS


def device_total(result: RunResult, gpu: str, config: AllocatorConfig | None = None) -> DeviceTotal:
    """The device total of ``result``'s step on ``gpu`` (a name :func:`~.budget.gpu_name` reads).

    Args:
        result: a simulation with its order of allocations (``simulate(spec, allocations=True)``).
        gpu: the GPU, e.g. "H100" or "h100-80".
        config: the ``PYTORCH_CUDA_ALLOC_CONF`` the step runs with (None: torch's defaults).

    Returns:
        The allocated, reserved, cuBLAS, CUDA context and NCCL terms, and where the allocator ran short.

    Raises:
        SpecError: an unknown GPU name, or an allocator setting torch refuses.
    """
    if result.allocations is None or result.memory is None:
        raise RuntimeError("device_total needs a simulation with its allocations: simulate(spec, allocations=True)")
    spec = GPU_SPECS[gpu_name(gpu)]
    trace = result.allocations
    workspace = spec.cublas_workspace_bytes
    events: list[Event] = [
        Alloc(value) if is_alloc else Free(value) for is_alloc, value in trace.on(COMPUTE, at_thread_starts=workspace)
    ]
    # What cudaMalloc can get: the card's memory less the context, which the driver holds before the first tensor.
    answer = replay(events, config or AllocatorConfig(), capacity=spec.memory_bytes - spec.context_bytes)
    return DeviceTotal(
        gpu=spec.name,
        allocated_bytes=result.memory.peak_bytes,
        reserved_bytes=answer.reserved_peak,
        cublas_bytes=workspace * len(trace.thread_starts),
        context_bytes=spec.context_bytes,
        context_measured=spec.context_measured,
        context_source=spec.context_source,
        nccl_bytes=0,
        largest_free_at_peak=answer.largest_free_at_peak,
        out_of_memory_at=answer.out_of_memory_at,
        trace_how=trace.how,
        trace_events=len(events),
    )
