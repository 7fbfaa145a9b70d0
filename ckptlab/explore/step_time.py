"""A step's time before it runs: the one estimate the lab shows before a run, limits a server by, and counts down from.

A training step's matmul FLOPs (:func:`step_flops`, from the formula's per-layer count,
:func:`ckptlab.explore.formula.forward_flops`: projections, MLP, attention's scores over the sequence, the head)
over the device's matmul speed, plus the optimizer's pass over its state over the device's memory bandwidth
(:func:`optimizer_bytes`). The speed is this CPU's, measured once (:mod:`ckptlab.explore.machine`), or a known GPU's
dense datasheet figure (:data:`ckptlab.explore.gpus.GPU_SPECS`); an unknown GPU has no estimate (None), never a
guess. What it leaves out (elementwise work, a busy machine's other tasks, building the model) a server learns
from its own runs (``ckptlab.lab.run.Pace``). Issue 59's roofline will predict a step op by op from the same speeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.plan import planned_roles
from ..spec import RunSpec
from ..step.preflight import resolve_device, resolve_dtype
from ..torchstate import measuring_thread_count
from .formula import Architecture, architecture, forward_flops, selective_skipped_flops
from .gpus import GPU_SPECS, GpuSpec
from .machine import cpu_speed

# The observed memory step (MemTracker on every module and storage) costs about this many plain steps; the Run counts
# it once, after its warm-up and timed steps.
MEMORY_STEP_COST = 3
# Optimizer state passes, in the parameter's bytes, per trainable parameter: AdamW reads the parameter, its gradient
# and two moments and writes the parameter and both moments back (7); a plain update reads two and writes one (3).
OPTIMIZER_PASSES = {"none": 0}
ADAM_PASSES, PLAIN_PASSES = 7, 3


@dataclass(frozen=True)
class Speed:
    """What a step's work is divided by: matmul FLOP/s in the step's dtype and memory bytes a second."""

    matmul_flops: float
    memory_bandwidth: float | None
    source: str  # "cpu" (measured on this machine) or a GPU's name in GPU_SPECS


def gpu_spec_named(device_name: str, memory_bytes: int) -> GpuSpec | None:
    """The :data:`GPU_SPECS` record of a CUDA device (``torch.cuda.get_device_name``, e.g. "NVIDIA H100 80GB HBM3"),
    the one whose memory is nearest where a name comes in two sizes; None for a card the lab does not know."""
    name = device_name.upper().replace(" ", "")
    found = [spec for spec in GPU_SPECS.values() if spec.name.rsplit(" ", 2)[0].upper().replace(" ", "") in name]
    return min(found, key=lambda spec: abs(spec.memory_bytes - memory_bytes), default=None)


def matmul_dtype(spec: RunSpec) -> torch.dtype:
    """What the step's matmuls run in: the mixed precision's dtype, else the weights'."""
    device = resolve_device(spec.device)
    if spec.mixed_precision != "none":
        return torch.bfloat16 if spec.mixed_precision == "bf16" else torch.float16
    return resolve_dtype(spec.dtype, device, spec.mixed_precision)


def device_speed(spec: RunSpec) -> Speed | None:
    """The speed ``spec``'s step runs at here: this CPU's, measured at the threads a measured step takes; the GPU's
    datasheet figure for a known card; None for an unknown GPU."""
    device = resolve_device(spec.device)
    dtype = str(matmul_dtype(spec)).removeprefix("torch.")
    if device.type == "cpu":
        speed = cpu_speed(dtype, measuring_thread_count())
        return Speed(speed.matmul_flops[dtype], speed.memory_bandwidth, "cpu")
    properties = torch.cuda.get_device_properties(device)
    gpu = gpu_spec_named(properties.name, properties.total_memory)
    if gpu is None:
        return None
    # float32 matmuls run on the CUDA cores unless torch is told to allow TF32 (its default: not allowed).
    key = "tf32" if dtype == "float32" and torch.backends.cuda.matmul.allow_tf32 else dtype
    return Speed(gpu.dense_flops[key], gpu.memory_bandwidth, gpu.name)


def step_flops(spec: RunSpec, arch: Architecture | None = None) -> float:
    """Matmul FLOPs of one training step of ``spec`` (every micro-batch of it).

    The forward once; the backward twice the forward (the inputs' gradients and the weights'), once where the base
    is frozen (LoRA: only the inputs' gradients, the adapters' being small); each checkpointed layer's forward again
    (the rerun), less what a selective policy takes from its cache.
    """
    arch = arch or architecture(spec.model)
    layer, forward = forward_flops(arch, spec.seq_len)
    backward = forward * (1 if spec.lora_rank is not None else 2)
    checkpointed = planned_roles(arch.num_layers, spec.every_n_layers).count("CP")
    # A named policy's cached matmuls are not rerun; ops named one by one are not counted off (the estimate errs long).
    policy = spec.selective if isinstance(spec.selective, str) else "none"
    rerun = checkpointed * (layer - selective_skipped_flops(arch, policy, spec.seq_len))
    return (forward + backward + rerun) * spec.seq_len * spec.batch_size * spec.gradient_accumulation_steps


def optimizer_bytes(spec: RunSpec, num_params: int) -> int:
    """Bytes the optimizer step moves: its passes over the trainable parameters' state (none for LoRA's few)."""
    if spec.lora_rank is not None:
        return 0
    passes = OPTIMIZER_PASSES.get(spec.optimizer, ADAM_PASSES if "adam" in spec.optimizer else PLAIN_PASSES)
    element = resolve_dtype(spec.dtype, resolve_device(spec.device), spec.mixed_precision).itemsize
    return passes * num_params * element


def step_seconds(spec: RunSpec, speed: Speed, num_params: int, arch: Architecture | None = None) -> float:
    """One training step of ``spec`` at ``speed``: its matmuls and its optimizer's pass over memory."""
    seconds = step_flops(spec, arch) / speed.matmul_flops
    if speed.memory_bandwidth:
        seconds += optimizer_bytes(spec, num_params) / speed.memory_bandwidth
    return seconds


def run_steps(spec: RunSpec) -> float:
    """A measured run's steps in plain steps' time: warm-up, timed, and the observed memory step."""
    return spec.warmup + spec.repeats + MEMORY_STEP_COST
