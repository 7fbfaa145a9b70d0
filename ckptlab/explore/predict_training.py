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

The step's peak is the highest of the step's moments. The optimizer step: parameters, buffers,
gradients, the state and the update's temporaries (exact). The backward (an estimate, :class:`BackwardMoments`):
the loss's backward, then each layer's, last to first, then the embeddings'; at each, what the activations hold
then (:mod:`.predict` builds them from :mod:`.formula`) beside the gradients made so far: the head's and the final
norm's first, each layer's as its modules' backward makes them (its MLP's output projection's at its MLP's moment,
its attention's input projections' after its attention's), the input embeddings' last (:func:`training_bytes` counts
them per layer and per moment). On the tiny presets at 64 tokens it is held within -10% and +25% of the measured
peak (``tests/explore/test_predict_training.py``); with eager attention and every layer checkpointed within 5% of
the simulation of a CUDA step, and what eager adds over SDPA within 15% (``tests/test_agreement.py``: on
tiny-llama to a few hundred bytes).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PretrainedConfig
from transformers.modeling_layers import GradientCheckpointingLayer
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
    # Of gradient_bytes: each checkpointing layer's own (a nested layer's in its outermost), in the layers' order, and
    # the input embeddings' (0 when tied to the head: then made with the head's); the rest (head, final norm) first.
    layer_gradient_bytes: tuple[int, ...] = ()
    # Of each layer's own, in the same order, what its backward has made by its two moments (:class:`BackwardMoments`):
    # by its MLP's, its output projection's (the layer's first matmul backward); by its attention's core, all but the
    # attention's input projections' (queries, keys, values: their backward follows the core's). Empty: (0, all).
    layer_gradient_moments: tuple[tuple[int, int], ...] = ()
    embedding_gradient_bytes: int = 0
    # Tied to the head: the embeddings' backward makes a dense gradient of the shared weight's size before adding it
    # to the one the head's backward made (untied, that gradient is the .grad itself, in gradient_bytes).
    tied_embedding_temp_bytes: int = 0

    @property
    def baseline_bytes(self) -> int:
        """Held before the forward from the second step on: parameters, buffers, the optimizer's state."""
        return self.parameter_bytes + self.buffer_bytes + self.optimizer_state_bytes

    @property
    def optimizer_peak_bytes(self) -> int:
        """Held during ``optimizer.step()``: 0 without an optimizer (the step ends with the backward)."""
        return 0 if self.optimizer == "none" else self.baseline_bytes + self.gradient_bytes + self.optimizer_temp_bytes

    def backward_peak_estimate(self, moments: BackwardMoments) -> int:
        """The backward's peak, estimated: the highest of its moments, each with the gradients made by then."""
        layers = len(moments.layer_bytes)
        per_layer = list(self.layer_gradient_bytes)
        by_moment = list(self.layer_gradient_moments) or [(0, own) for own in per_layer]
        if len(per_layer) != layers:
            # Counted on another depth than the prediction's (an Architecture's own num_layers): spread evenly.
            count = max(len(per_layer), 1)
            share = sum(per_layer) // layers if layers else 0
            per_layer = [share] * layers
            by_moment = [(sum(m for m, _ in by_moment) // count, sum(a for _, a in by_moment) // count)] * layers
        made = self.gradient_bytes - sum(per_layer) - self.embedding_gradient_bytes  # the head's, the final norm's
        highest = moments.loss_bytes
        for index in reversed(range(layers)):
            at_mlp, at_attention = moments.layer_bytes[index]
            made_by_mlp, made_by_attention = by_moment[index]
            highest = max(highest, made + made_by_mlp + at_mlp, made + made_by_attention + at_attention)
            made += per_layer[index]
        highest = max(highest, self.gradient_bytes + self.tied_embedding_temp_bytes + moments.end_bytes)
        return self.baseline_bytes + highest

    def peak(self, moments: BackwardMoments) -> tuple[int, PeakPhase]:
        """The step's predicted peak (total, parameters included) and the phase it comes from."""
        backward = self.backward_peak_estimate(moments)
        optimizer = self.optimizer_peak_bytes
        return (optimizer, "optimizer") if optimizer >= backward else (backward, "backward")


@dataclass(frozen=True)
class BackwardMoments:
    """The activations (and the backward's temporaries) alive at each high moment of the backward, above the
    baseline and without the gradients, which :meth:`TrainingBytes.peak` adds as they are made by then."""

    loss_bytes: int  # the loss's backward: all the forward left resident, and the logits' float32 gradients
    # Per layer, in the layers' order: (its MLP's backward, at its activation's; its attention's backward, at its
    # core's), the layer's gradients made by then in TrainingBytes.layer_gradient_moments. (0, 0) for a layer that
    # reruns inside another's.
    layer_bytes: tuple[tuple[int, int], ...]
    end_bytes: int  # the embeddings' backward, once every layer's is done: what outside keeps, a gradient in


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
    params, buffers, trainable, tensors, targets, largest, per_layer, by_moment, embedding, tied_temp = counts
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
        layer_gradient_bytes=per_layer,
        layer_gradient_moments=by_moment,
        embedding_gradient_bytes=embedding,
        tied_embedding_temp_bytes=tied_temp,
    )


# (parameters, buffers, trained, trained tensors, LoRA targets, the largest trained tensor, trained per layer, of them
# made by each layer's two backward moments, trained in the input embeddings, the tied embeddings' dense gradient), bytes
_Counts = tuple[int, int, int, int, tuple[str, ...], int, tuple[int, ...], tuple[tuple[int, int], ...], int, int]


def _layer_index(name: str, layers: Sequence[str]) -> int | None:
    """The outermost checkpointing layer a module or parameter ``name`` lies in (None: outside the layers)."""
    return next((index for index, layer in enumerate(layers) if name.startswith(layer + ".")), None)


def _moment_modules(model: torch.nn.Module, layers: Sequence[str]) -> tuple[frozenset[str], frozenset[str]]:
    """Of the layers' modules (full names), those whose gradients a layer's backward makes early or late.

    The first: each layer's MLP output projection, its last matmul module (down_proj, GPT-2's ``mlp.c_proj``, BERT's
    ``output.dense``), whose backward runs first, before the MLP's activation's. The second: the input projections of
    its attention module (a transformers ``*Attention`` class: the matmul modules before its last, the output
    projection), whose backward follows the core's. A layer without one of them names none (an MoE block's experts
    are not matmul modules)."""
    matmuls = (torch.nn.Linear, Conv1D)
    last: set[str] = set()
    inputs: set[str] = set()
    for layer in layers:
        block = model.get_submodule(layer)
        names = [f"{layer}.{name}" for name, module in block.named_modules() if isinstance(module, matmuls)]
        if names:
            last.add(names[-1])
        attention = next(
            (name for name, module in block.named_modules() if type(module).__name__.endswith("Attention")), None
        )
        if attention is not None:
            inside = [name for name in names if name.startswith(f"{layer}.{attention}.")]
            inputs.update(inside[:-1])
    return frozenset(last), frozenset(inputs)


def _add_by_moment(
    by_moment: list[list[int]], index: int, module: str, size: int, early: frozenset[str], late: frozenset[str]
) -> None:
    """Count ``size`` bytes of gradient made by ``module`` of layer ``index`` at the moments it is made by."""
    by_moment[index][0] += size if module in early else 0
    by_moment[index][1] += 0 if module in late else size


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
    # Where each gradient is made in the backward: per layer, and the input embeddings' last (unless tied to the head,
    # whose backward makes it first).
    layers = [name for name, module in model.named_modules() if isinstance(module, GradientCheckpointingLayer)]
    outermost = [name for name in layers if _layer_index(name, layers) is None]
    early, late = _moment_modules(model, outermost)
    per_layer = [0] * len(layers)
    by_moment = [[0, 0] for _ in layers]
    if rank is None:
        embedding = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        tied = head is not None and head.weight is embedding
        sizes = []
        last = tied_temp = 0
        for name, parameter in model.named_parameters():
            size = parameter.numel() * parameter.element_size()
            sizes.append(size)
            index = _layer_index(name, layers)
            if index is not None:
                per_layer[index] += size
                _add_by_moment(by_moment, index, name.rpartition(".")[0], size, early, late)
            elif parameter is embedding:
                last, tied_temp = (0, size) if tied else (size, 0)
        moments = tuple((mlp, attention) for mlp, attention in by_moment)
        return (
            params,
            buffers,
            sum(sizes),
            len(sizes),
            (),
            max(sizes, default=0),
            tuple(per_layer),
            moments,
            last,
            tied_temp,
        )
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
        index = _layer_index(full_name, layers)
        if index is not None:
            per_layer[index] += rank * (fan_in + fan_out) * ADAPTER
            _add_by_moment(by_moment, index, full_name, rank * (fan_in + fan_out) * ADAPTER, early, late)
        modules += 1
        largest = max(largest, rank * max(fan_in, fan_out) * ADAPTER)
    moments = tuple((mlp, attention) for mlp, attention in by_moment)
    return params + adapters, buffers, adapters, 2 * modules, names, largest, tuple(per_layer), moments, 0, 0
