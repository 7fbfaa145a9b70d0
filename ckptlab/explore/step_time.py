"""A Run's time before it runs: the roofline's prediction of each step, on this device, times the steps a Run takes.

There is one time predictor in the lab, :func:`ckptlab.explore.roofline.predict_time`: a step's counted work (the
simulation's :class:`~ckptlab.step.work.StepWork`: every op's FLOPs and bytes, the optimizer's included) over a
device's speed. This module only says which speed a spec's step runs at here (:func:`device_speed`: this CPU's,
measured once by :mod:`ckptlab.explore.machine`, or a known GPU's datasheet record in
:data:`ckptlab.explore.gpus.GPU_SPECS`; an unknown GPU has none, never a guess), which simulation stands for the
step on it (:func:`simulated_spec`), and how many steps a measured Run takes (:func:`run_steps`). What the roofline
leaves out (a busy machine's other tasks, building the model) a server learns from its own runs
(``ckptlab.lab.run.Pace``). The simulations themselves are kept by whoever asks (the app's shared store).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..spec import RunSpec
from ..step.preflight import resolve_device, resolve_dtype
from ..step.work import StepWork
from ..torchstate import measuring_thread_count
from . import machine
from .gpus import GPU_SPECS, GpuSpec
from .roofline import (
    GPU_EFFICIENCY,
    Efficiency,
    Speed,
    TimePrediction,
    cpu_speed,
    measured_efficiency,
    predict_time,
)

# The observed memory step (MemTracker on every module and storage) costs about this many plain steps; the Run counts
# it once, after its warm-up and timed steps.
MEMORY_STEP_COST = 3
CPU_NAME = "this CPU"  # the device a CPU prediction names: "predicted (roofline, this CPU)"
_DEFAULT = RunSpec()


@dataclass(frozen=True)
class DeviceSpeed:
    """A device's speed as the roofline reads it, and how far below it a real step runs there."""

    speed: Speed  # a GpuSpec, or this CPU's measured record (roofline.cpu_speed)
    efficiency: Efficiency  # GPU_EFFICIENCY for a datasheet's figures, measured_efficiency(record) for this CPU's


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


def device_speed(spec: RunSpec) -> DeviceSpeed | None:
    """The speed ``spec``'s step runs at here: this CPU's, measured at the threads a measured step takes (its matmul
    dtype measured too); the GPU's datasheet record for a known card; None for an unknown GPU.

    Raises:
        SpecError: this CPU's record has no memory bandwidth (``roofline.no_bandwidth``).
    """
    device = resolve_device(spec.device)
    if device.type == "cpu":
        record = machine.cpu_speed(str(matmul_dtype(spec)).removeprefix("torch."), measuring_thread_count())
        return DeviceSpeed(cpu_speed(record, CPU_NAME), measured_efficiency(record))
    properties = torch.cuda.get_device_properties(device)
    gpu = gpu_spec_named(properties.name, properties.total_memory)
    return None if gpu is None else DeviceSpeed(gpu, GPU_EFFICIENCY)


def simulated_spec(spec: RunSpec) -> RunSpec:
    """The spec whose simulation stands for ``spec``'s step here: its device resolved, since ``simulate`` stands
    for a CUDA device unless told "cpu" (and a CPU step has the CPU's attention kernels and no offload copies); the
    timing fields (warm-up, repeats) at their defaults, as a simulation reads none of them: a Run asked with more
    repeats shares its step's simulation."""
    return replace(spec, device=resolve_device(spec.device).type, warmup=_DEFAULT.warmup, repeats=_DEFAULT.repeats)


def predict_step(spec: RunSpec, work: StepWork, device: DeviceSpeed) -> TimePrediction:
    """One step of ``spec`` on ``device``: the roofline over ``work``, the counted ops of its simulation
    (:func:`simulated_spec`)."""
    tokens = spec.seq_len * spec.batch_size * spec.gradient_accumulation_steps
    return predict_time(work, device.speed, tokens=tokens, world_size=spec.world_size, efficiency=device.efficiency)


def run_steps(spec: RunSpec) -> float:
    """A measured run's steps in plain steps' time: warm-up, timed, and the observed memory step."""
    return spec.warmup + spec.repeats + MEMORY_STEP_COST
