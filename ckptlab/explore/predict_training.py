"""The training half of a prediction: parameters, gradients, the optimizer's state, and the step's peak.

None of these depend on the tokens, so they are arithmetic, not a model of the step
(``ckptlab.step.training`` holds the same terms measured):

- parameters: counted on the model built on the ``meta`` device, in the spec's dtype, each
  tensor once (tied embeddings once); with LoRA plus the adapters;
- LoRA (peft): for each module peft adapts (a target name equal to a module's name or ending
  it), ``rank x (in + out)`` parameters in float32 (peft upcasts 16-bit adapters by default),
  two tensors (A and B); the base is frozen, so only the adapters train;
- gradients: one per trained parameter, in its dtype (every optimizer: the backward makes them);
- the optimizer's state, by Trainer's name (:data:`STATE_TENSORS`): AdamW keeps ``exp_avg`` and
  ``exp_avg_sq`` in the parameter's dtype (two times the trained bytes), Adagrad its ``sum`` and
  RMSprop its ``square_avg`` (one time), each plus a 4-byte ``step`` counter per trained tensor where
  the optimizer keeps it (on the device when fused, Trainer's default; else on the host on CUDA, so
  counted on the CPU only); SGD without momentum: none. Adafactor's factored moments and the
  low-bit optimizers are not counted: simulate them;
- the step's temporaries: fused AdamW (Trainer's default) makes none; the multi-tensor update
  torch runs on CUDA for the others holds one more copy of the trained bytes (``sqrt(exp_avg_sq)``,
  ``sqrt(sum)``); the per-parameter loop it runs on the CPU about two copies of the largest
  trained tensor (an estimate: AdamW's optimizer step within 1% on the tiny presets).

The step's peak is the larger of two moments. The optimizer step: parameters, buffers,
gradients, the state and the update's temporaries (exact). The backward: parameters,
buffers, the state, the activations resident after the forward, one rerun's rebuilt
activations and every gradient, counted as if they were all alive at once, and none of its
temporaries (the logits' gradient, a matmul's output): an estimate, not a bound, since the two
errors pull opposite ways. On the tiny presets at 64 tokens it came out between -9% (BERT,
SGD) and +20% of the measured peak (``tests/explore/test_predict_training.py``).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PretrainedConfig
from transformers.pytorch_utils import Conv1D

from ..errors import Command, Option, SpecError, not_one_of
from ..fact import Fact
from ..model import catalog
from ..model.configs import infer_task
from ..model.lora import resolve_targets
from ..model.quantize import Quantization
from ..spec import OPTIMIZERS, TRAINER_DEFAULT_OPTIMIZER, check_lora

PeakPhase = Literal["backward", "optimizer"]
# Trainer's optimizers the formula counts: (tensors the size of each trained parameter in the state, fused).
STATE_TENSORS = {
    "adamw_torch_fused": (2, True),
    "adamw_torch": (2, False),
    "adagrad": (1, False),
    "rmsprop": (1, False),
    "sgd": (0, False),
    "none": (0, False),
}
ADAPTER = 4  # bytes: peft keeps LoRA adapters in float32 (autocast_adapter_dtype) whatever the base's dtype
STEP_COUNTER = 4  # bytes: AdamW's float32 ``step`` per parameter tensor

# With LoRA the formula counts a full fine-tune's activations (said.predict.lora_activations says how far off).
LORA_ACTIVATIONS_NOTE = Fact("predict.lora_activations")


@dataclass(frozen=True)
class TrainingBytes:
    """What a training step holds besides its activations, for one model, dtype, optimizer and LoRA."""

    optimizer: str  # a RunSpec.optimizer the formula counts (STATE_TENSORS; "adamw" is adamw_torch_fused)
    lora_rank: int | None  # None: full fine-tune
    lora_targets: tuple[str, ...]  # the modules' names peft adapts (empty for a full fine-tune)
    parameter_bytes: int  # every parameter on the device: the base in the dtype, adapters in float32
    buffer_bytes: int  # the model's buffers (rotary tables' inverse frequencies, position ids, ...)
    trainable_bytes: int  # the parameters that train: all of them, or the adapters
    trainable_tensors: int  # how many tensors train (AdamW keeps a step counter for each)
    gradient_bytes: int  # one gradient per trained parameter, after the backward
    optimizer_state_bytes: int  # the moments (+ step counters where they are on the device); 0 for sgd and none
    optimizer_temp_bytes: int  # held during step() only: none fused, a copy of the trained bytes with foreach

    @property
    def baseline_bytes(self) -> int:
        """Held before the forward from the second step on: parameters, buffers, the optimizer's state."""
        return self.parameter_bytes + self.buffer_bytes + self.optimizer_state_bytes

    @property
    def optimizer_peak_bytes(self) -> int:
        """Held during ``optimizer.step()``: 0 without an optimizer (the step ends with the backward)."""
        return 0 if self.optimizer == "none" else self.baseline_bytes + self.gradient_bytes + self.optimizer_temp_bytes

    def backward_peak_estimate(self, resident_bytes: int, rerun_extra_bytes: int) -> int:
        """The backward's peak, estimated: every activation and every gradient alive at once, no temporaries."""
        return self.baseline_bytes + resident_bytes + rerun_extra_bytes + self.gradient_bytes

    def peak(self, resident_bytes: int, rerun_extra_bytes: int) -> tuple[int, PeakPhase]:
        """The step's predicted peak (total, parameters included) and the phase it comes from."""
        backward = self.backward_peak_estimate(resident_bytes, rerun_extra_bytes)
        optimizer = self.optimizer_peak_bytes
        return (optimizer, "optimizer") if optimizer >= backward else (backward, "backward")


def training_bytes(
    model: str | PretrainedConfig,
    dtype: torch.dtype,
    *,
    optimizer: str = "adamw",
    lora_rank: int | None = None,
    lora_targets: Sequence[str] | None = None,
    device: str = "cpu",
    quantization: Quantization | None = None,
) -> TrainingBytes:
    """Parameters, gradients and optimizer state of one training step, counted on the ``meta`` device.

    Args:
        model: a preset name, a local directory or a transformers config.
        dtype: the parameters' dtype.
        optimizer, lora_rank, lora_targets: as in :class:`~ckptlab.RunSpec`.
        device: "cpu" or "cuda": AdamW keeps its step counters on the device on the CPU only.
        quantization: a 4-bit base (as :class:`~ckptlab.RunSpec`): the base counted as the simulation builds it
            (``catalog.quantized_on_fake``), not in ``dtype``.

    Raises:
        SpecError: an optimizer, rank or target that is not valid (naming the fix).
        ModelLoadError, UnsupportedModelError: a model the catalog cannot build.
    """
    if optimizer not in OPTIMIZERS:
        raise not_one_of("optimizer", optimizer, OPTIMIZERS)
    name = TRAINER_DEFAULT_OPTIMIZER if optimizer == "adamw" else optimizer
    if name not in STATE_TENSORS:
        raise SpecError(
            key="predict.optimizer_not_counted",
            option=Option("optimizer", optimizer),
            simulate=Command("simulate", (Option("optimizer", optimizer),)),
            optimizer=optimizer,
        )
    check_lora(lora_rank, lora_targets or None)  # empty targets: none
    if isinstance(model, PretrainedConfig):
        counts = _count(model, infer_task(model), dtype, lora_rank, tuple(lora_targets or ()), quantization)
    else:
        counts = _count_named(str(model), dtype, lora_rank, tuple(lora_targets or ()), quantization)
    params, buffers, trainable, tensors, targets, largest = counts
    moments, fused = STATE_TENSORS[name]
    stateful = moments > 0
    counters = STEP_COUNTER * tensors if stateful and (fused or device != "cuda") else 0
    # None fused; the multi-tensor update on CUDA copies the trained bytes; the CPU's per-parameter loop less.
    temporaries = 0 if fused or not stateful else trainable if device == "cuda" else 2 * largest
    return TrainingBytes(
        optimizer=optimizer,
        lora_rank=lora_rank,
        lora_targets=targets,
        parameter_bytes=params,
        buffer_bytes=buffers,
        trainable_bytes=trainable,
        trainable_tensors=tensors,
        gradient_bytes=trainable,
        optimizer_state_bytes=moments * trainable + counters,
        optimizer_temp_bytes=temporaries,
    )


# (parameters, buffers, trained, trained tensors, LoRA targets, the largest trained tensor), bytes
_Counts = tuple[int, int, int, int, tuple[str, ...], int]


@functools.lru_cache(maxsize=64)
def _count_named(
    name: str, dtype: torch.dtype, rank: int | None, targets: tuple[str, ...], quantization: Quantization | None
) -> _Counts:
    config, _, task = catalog.load_config(name)
    return _count(config, task, dtype, rank, targets, quantization)


def _count(
    config: PretrainedConfig,
    task: str,
    dtype: torch.dtype,
    rank: int | None,
    targets: tuple[str, ...],
    quantization: Quantization | None = None,
) -> _Counts:
    model: torch.nn.Module
    if quantization is None:
        with torch.device("meta"):
            model = catalog.instantiate(copy.deepcopy(config), task, dtype)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
    else:
        model, params = catalog.quantized_on_fake(config, task, dtype, quantization)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    if rank is None:
        sizes = [p.numel() * p.element_size() for p in model.parameters()]
        return params, buffers, sum(sizes), len(sizes), (), max(sizes, default=0)
    names = tuple(resolve_targets(model, targets or None))
    adapters = 0
    modules = 0
    largest = 0
    for full_name, module in model.named_modules():
        # peft's rule for a list of targets: the module's name is a target or ends with "." + a target.
        if not any(full_name == name or full_name.endswith("." + name) for name in names):
            continue
        if isinstance(module, torch.nn.Linear):
            fan_in, fan_out = module.in_features, module.out_features
        elif isinstance(module, Conv1D):
            fan_in, fan_out = module.weight.shape  # Conv1D stores (in, out)
        else:
            continue
        adapters += rank * (fan_in + fan_out) * ADAPTER  # A: rank x in, B: out x rank
        modules += 1
        largest = max(largest, rank * max(fan_in, fan_out) * ADAPTER)
    return params + adapters, buffers, adapters, 2 * modules, names, largest
