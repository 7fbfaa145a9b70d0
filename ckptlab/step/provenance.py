"""What a result says about where its numbers come from: the model as run, and the device, versions and time.

A measured run names its device (the GPU's name, or the CPU's model and cores); a simulated one
says that no GPU was used; a prediction (``explore.predict``) names its formula. Every one carries
the versions of torch and transformers and the time in UTC (:func:`made_now`, the one place a
:class:`~ckptlab.results.Provenance` is built).
"""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone

import torch
import transformers

from ..fact import worded
from ..model.catalog import ModelInfo
from ..results import AS_ON_CPU, NO_GPU, Kind, ModelSummary, Provenance


def model_summary(info: ModelInfo) -> ModelSummary:
    """The part of the catalog's description a result carries."""
    return ModelSummary(
        name=info.name,
        family=info.family,
        task=info.task,
        num_layers=info.num_layers,
        hidden_size=info.hidden_size,
        num_params=info.num_params,
        weights=info.weights,
        experts_implementation=info.experts_implementation,
        num_experts=info.num_experts,
        experts_per_token=info.experts_per_token,
    )


def provenance_for(device: torch.device) -> Provenance:
    """Provenance of a measurement on ``device``, with versions and the time now."""
    if device.type == "cuda":
        return made_now("measured-cuda", torch.cuda.get_device_name(device))
    return made_now("measured-cpu", _cpu_name())


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def simulated_provenance(device_type: str = "cuda") -> Provenance:
    """Provenance of a simulation: fake tensors, no device; standing for CUDA, or the CPU with ``device_type`` "cpu"."""
    return made_now("simulated", worded(AS_ON_CPU if device_type == "cpu" else NO_GPU))


def made_now(kind: Kind, device_name: str) -> Provenance:
    """A :class:`Provenance` of ``kind`` with this process's torch and transformers versions and the time now."""
    return Provenance(
        kind=kind,
        device_name=device_name,
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
