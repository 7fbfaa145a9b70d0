"""A calibration: per-layer activations and the rest, taken from one measured run with checkpointing off.

:func:`calibrate` reads them from the run's layers (``LayerResult.saved_bytes`` and
``input_bytes``) and its memory; :func:`ckptlab.explore.predict.predict` then predicts every
other setting at the same shape from them (``method="calibrated"``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from ..errors import CHECKPOINTING_OFF, Option, SpecError
from ..results import RunResult
from .formula import FLOAT32, architecture


@dataclass(frozen=True)
class Calibration:
    """Per-layer activations and the rest, taken from one measured run with checkpointing off."""

    seq_len: int  # the run's tokens per sequence: calibrated predictions hold for this shape only
    batch_size: int
    device: str  # e.g. "cpu": where the run was measured
    layer_bytes: list[int]  # per layer: what it saves when kept (L1 without the tensors all layers share)
    input_bytes: list[int]  # per layer: its input, what it keeps when checkpointed
    outside_bytes: int  # resident after the forward outside the layers (embeddings, head, loss, shared tables)
    input_saved_as_is: bool  # a layer's saved tensors include its input's storage (so a rerun adds the rest only)
    forward_s: float  # measured median forward (with the loss)
    step_s: float  # measured median step
    source: str  # the run's provenance label
    optimizer: str = "adamw"  # the run's optimizer: a prediction from it is for the same one
    lora_rank: int | None = None  # the run's LoRA rank: LoRA changes what the layers save
    lora_targets: tuple[str, ...] | None = None  # the run's LoRA targets, as its spec gave them


def calibrate(off: RunResult) -> Calibration:
    """Per-layer activations and the rest from a measured run with checkpointing off.

    Raises:
        SpecError: if the run had checkpointing on, or has no measurements.
    """
    if off.spec.every_n_layers is not None:
        raise SpecError(
            key="api.calibrate_needs_off",
            off=CHECKPOINTING_OFF,
            option=Option("every_n_layers", off.spec.every_n_layers),
            none=Option("every_n_layers", None),
        )
    if off.memory is None or off.timing is None:
        raise SpecError(key="api.calibrate_needs_measured", status=off.status)
    saved = [layer.saved_bytes for layer in off.layers]
    layer_bytes = list(saved)
    if len(saved) > 1:
        # Tensors every layer uses (the rotary tables) are deduplicated into L1's count, but they
        # stay resident whatever is checkpointed: they belong outside the layers.
        shared = max(0, saved[0] - int(statistics.median(saved[1:])))
        layer_bytes[0] -= shared
    element = torch.tensor([], dtype=getattr(torch, off.dtype)).element_size()
    rms = architecture(off.spec.model).norm == "rms"
    return Calibration(
        seq_len=off.spec.seq_len,
        batch_size=off.spec.batch_size,
        device=off.device,
        layer_bytes=layer_bytes,
        input_bytes=[layer.input_bytes for layer in off.layers],
        outside_bytes=off.memory.after_forward_bytes - sum(layer_bytes),
        # RMSNorm in a 16-bit dtype keeps a float32 copy of the input, not the input itself.
        input_saved_as_is=not (rms and element != FLOAT32),
        forward_s=off.timing.forward_s,
        step_s=off.timing.step_s,
        source=off.provenance.label,
        optimizer=off.spec.optimizer,
        lora_rank=off.spec.lora_rank,
        lora_targets=off.spec.lora_targets,
    )
