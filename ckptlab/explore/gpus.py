"""The GPUs the lab knows: one record each, its memory beside its speed, every figure from the vendor's datasheet.

One home for what a GPU *is* (issue 59's time and issue 60's device total read the same record):
:data:`GPU_SPECS` holds one :class:`GpuSpec` per card; :data:`ckptlab.explore.budget.GPUS` (name to bytes)
is derived from it, so a budget, a time prediction and the nvidia-smi prediction cannot disagree on which
cards exist.

The figures are the **dense** ones (a datasheet's headline "with sparsity" figure is twice the dense one
and no training step reaches it) and per **direction** for the links (datasheets add both directions:
NVLink 4's "900 GB/s" is 450 GB/s each way; PCIe Gen5 x16's "128 GB/s" is 64 GB/s each way). Where a card
comes in several form factors the lab takes the one named in :attr:`GpuSpec.form`: the SXM boards of the data
center GPUs (what clusters and cloud 8-GPU nodes have). docs/gpus.md lists each figure with its source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from ..units import GIB, MIB

TERA = 10**12
GIGA = 10**9


@dataclass(frozen=True)
class Link:
    """A link's kind and its bandwidth in bytes a second, one direction."""

    name: str  # "PCIe Gen5 x16", "NVLink 4", ...
    bytes_per_s: float  # one direction: a datasheet's bidirectional figure halved


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: its memory, its dense peak FLOP/s per dtype, its memory bandwidth and its two links.

    ``dense_flops`` is keyed by what a matmul runs in: "bfloat16", "float16", "tf32" (float32 on tensor
    cores, torch's ``allow_tf32``) and "float32" (the CUDA cores). ``source`` is the datasheet the figures
    were read from.
    """

    name: str  # the lab's name, as budgets and pages show it: "H100 80 GB"
    form: str  # the board the figures are of: "SXM", "PCIe"
    memory_bytes: int  # what the card is sold with, read as GiB (nvidia-smi shows a little less)
    dense_flops: Mapping[str, float]  # FLOP/s, dense, by the dtype the matmul runs in
    memory_bandwidth: float  # bytes a second, the card's memory
    host_link: Link  # GPU to host (offload's copies)
    gpu_link: Link  # GPU to GPU (FSDP2's collectives); PCIe where the card has no NVLink
    source: str  # the datasheet
    # Outside the tensors (issue 60): what a step holds on the card beside them. ``cublas_workspace_bytes`` is
    # torch's default cuBLAS workspace for the card (CUBLAS_WORKSPACE_CONFIG unset), which goes through the caching
    # allocator; the CUDA context does not, and ``context_source`` says whether its figure was measured (where) or
    # is an estimate (from what).
    cublas_workspace_bytes: int = 0
    context_bytes: int = 0
    context_measured: bool = False
    context_source: str = ""


def _flops(bf16: float, tf32: float, fp32: float) -> Mapping[str, float]:
    """Dense FLOP/s per dtype, in TFLOP/s; float16 runs at bfloat16's rate on every card here."""
    return MappingProxyType(
        {"bfloat16": bf16 * TERA, "float16": bf16 * TERA, "tf32": tf32 * TERA, "float32": fp32 * TERA}
    )


_PCIE4 = Link("PCIe Gen4 x16", 32 * GIGA)  # 64 GB/s both directions
_PCIE5 = Link("PCIe Gen5 x16", 64 * GIGA)  # 128 GB/s both directions
_NVLINK3 = Link("NVLink 3", 300 * GIGA)  # A100: 600 GB/s both directions
_NVLINK4 = Link("NVLink 4", 450 * GIGA)  # H100/H200: 900 GB/s both directions

_H100 = "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM column)"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM column)"
_A100 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (SXM)"
_L4 = "https://www.nvidia.com/en-us/data-center/l4/"
_ADA = "NVIDIA Ada GPU Architecture whitepaper v2.1, Appendix A, GeForce RTX 4090 (tensor FLOPS with FP32 accumulate)"

GPU_SPECS: Mapping[str, GpuSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            GpuSpec("H100 80 GB", "SXM", 80 * GIB, _flops(989.4, 494.7, 66.9), 3.35e12, _PCIE5, _NVLINK4, _H100),
            GpuSpec("H200 141 GB", "SXM", 141 * GIB, _flops(989.4, 494.7, 66.9), 4.8e12, _PCIE5, _NVLINK4, _H200),
            GpuSpec("A100 40 GB", "SXM", 40 * GIB, _flops(312, 156, 19.5), 1.555e12, _PCIE4, _NVLINK3, _A100),
            GpuSpec("A100 80 GB", "SXM", 80 * GIB, _flops(312, 156, 19.5), 2.039e12, _PCIE4, _NVLINK3, _A100),
            GpuSpec("L4 24 GB", "PCIe", 24 * GIB, _flops(121, 60, 30.3), 300e9, _PCIE4, _PCIE4, _L4),
            GpuSpec("RTX 4090 24 GB", "PCIe", 24 * GIB, _flops(165.2, 82.6, 82.6), 1.008e12, _PCIE4, _PCIE4, _ADA),
        )
    }
)

# cuBLAS's workspace, per handle and stream, as torch allocates it through the caching allocator
# (pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize; read from a recent main, not yet
# checked against the 2.13 tag): with
# CUBLAS_WORKSPACE_CONFIG unset, ``4096 * 8 * 1024`` bytes on sm_90 (Hopper: H100, H200), else
# ``4096 * 1024 * 2 + 16 * 1024 * 8`` (":4096:2:16:8"); cuBLASLt shares it (TORCH_CUBLASLT_UNIFIED_WORKSPACE, on by
# default). This project's H200 run found two of them, 64 MiB (docs/gpu-results.md).
HOPPER_CUBLAS_WORKSPACE = 4096 * 8 * 1024
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8

# The CUDA context with lazy module loading (torch's default since 1.13): no figure measured on these cards is on
# record here, so each is an estimate, from the context measured on other cards and what a training step loads on
# top (cuBLAS's, cuDNN's and the attention kernels, lazily): 287,047,680 B right after context creation with lazy
# loading (pytorch/pytorch#86509); "around 400MB" (pytorch/pytorch#109888); 426 MiB on an RTX 6000 Ada with torch
# 2.10 + CUDA 13.0 at `mem_get_info` (unslothai/unsloth-zoo#1053). The lab takes 512 MiB, as the example
# line; a GPU run replaces it with `mem_get_info`'s used bytes minus `memory_reserved` (the GPU check's job).
CONTEXT_ESTIMATE = 512 * MIB
CONTEXT_SOURCE = "pytorch/pytorch#86509 (287,047,680 B); unslothai/unsloth-zoo#1053 (426 MiB, RTX 6000 Ada)"

# NCCL's buffers (issue 60), outside torch's allocator: an estimate from NCCL's own defaults, the same for every card
# here (no figure measured on record). FSDP2's all-gathers and reduce-scatters run NCCL's ring: on each channel a GPU
# holds one connection's buffers from its ring neighbour, one per protocol, at NCCL's defaults (NVIDIA/nccl
# src/init.cc: ``DEFAULT_BUFFSIZE (1 << 22)`` for Simple, the ``NCCL_BUFFSIZE`` of NCCL's docs; ``DEFAULT_LL_BUFFSIZE``
# 8 lines x 512 threads x 8 steps x 16 B = 524,288 B; ``DEFAULT_LL128_BUFFSIZE`` 120 x 640 x 8 x 8 B = 4,915,200 B),
# 9,633,792 B that NCCL maps through cuMem in 2 MiB granules (10,485,760 B, the size NVIDIA/nccl#1685's
# NCCL_DEBUG_SUBSYS=ALLOC log shows on 8 H100s), plus the 2,097,152 B allocation that log shows beside it per
# connection. Channels: as many as 32 on an NVSwitch node of H100s (NVIDIA/nccl#1685), 24 on one of A100s
# (NVIDIA/nccl-tests#100); the lab takes 32, NCCL's MAXCHANNELS of those releases. Beside the published figures:
# docs/allocator-published.md.
NCCL_PROTOCOL_BYTES = 4 * MIB + 524_288 + 4_915_200  # Simple + LL + LL128, one connection
NCCL_CONNECTION_BYTES = -(-NCCL_PROTOCOL_BYTES // (2 * MIB)) * 2 * MIB + 2 * MIB  # 12 MiB
NCCL_CHANNELS = 32
NCCL_SOURCE = "NCCL's defaults (NVIDIA/nccl src/init.cc), 32 channels (NVIDIA/nccl#1685)"
_HOPPER = ("H100 80 GB", "H200 141 GB")

GPU_SPECS = MappingProxyType(
    {
        name: replace(
            spec,
            cublas_workspace_bytes=HOPPER_CUBLAS_WORKSPACE if name in _HOPPER else CUBLAS_WORKSPACE,
            context_bytes=CONTEXT_ESTIMATE,
            context_measured=False,
            context_source=CONTEXT_SOURCE,
        )
        for name, spec in GPU_SPECS.items()
    }
)
