"""Trainer's half of a training step: the optimizer as Trainer builds it, its state and its bytes.

A fine-tune's step, as ``transformers.Trainer`` runs it, is ``gradient_accumulation_steps``
micro-batches of forward and backward (the loss divided by their number, the gradients
summed across them), the gradient norm (``clip_grad_norm_``, computed even where nothing is
clipped), ``optimizer.step()`` and ``model.zero_grad()``; with ``bf16=True``/``fp16=True`` the
forward runs under autocast over float32 weights (accelerate's wrapping of the model), and fp16
scales the loss. :class:`Recipe` holds that side of one run; ``ckptlab.step.trainstep`` runs it.

The optimizer is Trainer's own: the class and keyword arguments come from
``Trainer.get_optimizer_cls_and_kwargs`` for the spec's ``optim`` name, over the two parameter
groups ``Trainer.create_optimizer`` makes (weight decay and none). So the implementation is the
one torch picks on the device: fused AdamW by default, and for the others the per-parameter loop
on the CPU and the multi-tensor ("foreach") one on CUDA. A simulation stands for a CUDA device, so
it asks for foreach where torch would pick it there (:func:`make_optimizer`'s ``simulated_cuda``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.distributed.tensor import DTensor

from ..errors import Command, Option, SpecError
from ..fact import Fact
from ..model.libraries import import_bitsandbytes, lab_own_training_arguments, trainer_modules_without_peft
from ..model.quantize import quant_state_tensors
from ..spec import BITSANDBYTES_OPTIMIZERS, LOW_BIT_PACKAGES, RunSpec

MIXED_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the step trains (all of them in a full fine-tune, the adapters with LoRA)."""
    return [param for param in model.parameters() if param.requires_grad]


def trainer_optimizer_class(spec: RunSpec) -> tuple[type[torch.optim.Optimizer], dict]:
    """The optimizer class and keyword arguments Trainer builds for ``spec``'s optim name and optim_args.

    ``RunSpec.validate`` has already refused a low-bit optimizer whose package is missing.
    """
    name = spec.trainer_optimizer
    if name is None:
        raise ValueError("optimizer='none' has no Trainer optimizer")
    # Trainer's import is heavy: only a run with an optimizer pays, and not for peft (ckptlab.model.libraries).
    with trainer_modules_without_peft():
        from transformers import Trainer, TrainingArguments
    if LOW_BIT_PACKAGES.get(spec.optimizer, ("",))[0] == "bitsandbytes":
        import_bitsandbytes()  # Trainer's handler imports it: first, without its Hub kernel lookup

    with lab_own_training_arguments():
        args = TrainingArguments(optim=name, optim_args=spec.optim_args, report_to="none")
    return Trainer.get_optimizer_cls_and_kwargs(args)


def trainer_parameter_groups(model: nn.Module, weight_decay: float = 0.0) -> list[dict]:
    """``Trainer.create_optimizer``'s two groups of the trainable parameters: with weight decay, and without."""
    with trainer_modules_without_peft():
        from transformers import Trainer

    # get_decay_parameter_names reads nothing of the Trainer it belongs to: the model's names decide.
    decay = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
    named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    return [
        {"params": [param for name, param in named if name in decay], "weight_decay": weight_decay},
        {"params": [param for name, param in named if name not in decay], "weight_decay": 0.0},
    ]


def check_optimizer_runs(spec: RunSpec, *, device_type: str, simulated: bool = False) -> None:
    """Refuse a low-bit optimizer where its step cannot be counted: on fake tensors, or measured on the CPU.

    torchao's steps are ``torch.compile(fullgraph=True)`` over quantized state (its AdamW8bit failed so here: "found
    no compiled frames" under MemTracker, the CPU's meter, which is a dispatch mode); on CUDA the allocator's counters
    need no dispatch mode. bitsandbytes' (``spec.BITSANDBYTES_OPTIMIZERS``) pass: their state is plain tensors and
    their step one custom op with a CPU kernel and a fake one, which the meter and a simulation count as stored.

    Raises:
        SpecError: naming the optimizer, its package and what to do instead.
    """
    package = LOW_BIT_PACKAGES.get(spec.optimizer)
    if package is None or spec.optimizer in BITSANDBYTES_OPTIMIZERS:
        return
    if simulated:
        raise SpecError(
            key="spec.optimizer_not_simulated",
            option=Option("optimizer", spec.optimizer),
            measure=Command("measure", (Option("device", "cuda"),)),
            optimizer=spec.optimizer,
            package=package[0],
        )
    if device_type != "cuda":
        raise SpecError(
            key="spec.optimizer_needs_cuda",
            option=Option("optimizer", spec.optimizer),
            cuda=Option("device", "cuda"),
            optimizer=spec.optimizer,
            package=package[0],
        )


def cpu_autocast_warning(spec: RunSpec, device_type: str) -> Fact | None:
    """The warning before a measured run under Trainer's mixed precision on the CPU (``device_type``, the device the
    run resolves to), None elsewhere: CPU autocast makes a step many times slower than float32 (44 s against 5 s on 2
    cores), with the same checkpointing plan. One fact, said by the command line and the Lab page alike."""
    if spec.mixed_precision == "none" or device_type != "cpu":
        return None
    return Fact("warning.cpu_autocast", {"mp": spec.mixed_precision, "steps": spec.warmup + spec.repeats})


def make_optimizer(spec: RunSpec, model: nn.Module, *, simulated_cuda: bool = False) -> torch.optim.Optimizer | None:
    """The optimizer ``spec`` names, built as Trainer builds it over ``model``'s trainable parameters; None for "none".

    Args:
        simulated_cuda: the step stands for a CUDA device on fake CPU tensors: take the multi-tensor
            implementation torch's default picks for CUDA tensors, where the class has one and Trainer
            asked for neither fused nor foreach.
    """
    if spec.trainer_optimizer is None:
        return None
    optimizer_class, kwargs = trainer_optimizer_class(spec)
    kwargs = dict(kwargs)
    takes = inspect.signature(optimizer_class.__init__).parameters
    if simulated_cuda and "foreach" in takes and not kwargs.get("fused") and kwargs.get("foreach") is None:
        kwargs["foreach"] = True
    groups = trainer_parameter_groups(model)
    fake_mode = _fake_mode_of(groups)
    if fake_mode is None or spec.optimizer not in BITSANDBYTES_OPTIMIZERS:
        return optimizer_class(groups, **kwargs)
    # bitsandbytes builds its 8-bit quantization maps in __init__ from Python floats (``.tolist()`` of a tensor, which
    # a fake tensor cannot answer): build them as real tensors, then hand the step fake copies (2 x 256 float32, one
    # pair for every parameter, as on a GPU). Its state and step then run on fake tensors as they would on real ones.
    with unset_fake_temporarily():
        optimizer = optimizer_class(groups, **kwargs)
    qmaps = optimizer.name2qmap  # type: ignore[attr-defined]  # bitsandbytes' Optimizer8bit
    for name, qmap in qmaps.items():
        qmaps[name] = fake_mode.from_tensor(qmap)
    return optimizer


def _fake_mode_of(groups: list[dict]) -> FakeTensorMode | None:
    """The fake mode the parameters were made in, or None for real parameters."""
    for group in groups:
        for param in group["params"]:
            local = param.to_local() if isinstance(param, DTensor) else param
            return local.fake_mode if isinstance(local, FakeTensor) else None
    return None


@dataclass
class Recipe:
    """Trainer's side of one run's steps: the optimizer, accumulation, the norm and mixed precision."""

    optimizer: torch.optim.Optimizer | None
    accumulation: int = 1  # micro-batches per optimizer step
    clip_bound: float | None = None  # clip_grad_norm_'s max_norm (inf: the norm alone); None: no norm
    autocast_dtype: torch.dtype | None = None  # the forward's autocast dtype; None: no autocast
    scaler: torch.amp.GradScaler | None = None  # fp16's loss scaling, as accelerate's

    @classmethod
    def for_spec(cls, spec: RunSpec, model: nn.Module, *, simulated_cuda: bool = False) -> Recipe:
        """The recipe of ``spec`` over ``model``'s trainable parameters (see :func:`make_optimizer`)."""
        optimizer = make_optimizer(spec, model, simulated_cuda=simulated_cuda)
        clip_bound = None
        if optimizer is not None:
            # Trainer clips with max_grad_norm > 0 and otherwise still computes the norm, with an infinite bound.
            clip_bound = float(spec.max_grad_norm) if spec.max_grad_norm > 0 else math.inf
        # Under FSDP2 the cast is fully_shard's (ckptlab.step.fsdp.mixed_precision_policy), not autocast's.
        autocast_dtype = (
            MIXED_PRECISION_DTYPES.get(spec.mixed_precision) if spec.mixed_precision_via == "autocast" else None
        )
        scaler = None
        if spec.mixed_precision == "fp16" and optimizer is not None:
            scaler = torch.amp.GradScaler(model_device(model).type)
        return cls(optimizer, spec.gradient_accumulation_steps, clip_bound, autocast_dtype, scaler)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without parameters)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def prime_state(recipe: Recipe) -> None:
    """Create the optimizer's state as the first ``step()`` does, without a forward and backward.

    A simulated step has no warm-up: zero gradients and one ``step()`` give it the state a
    real run holds from its second step on (AdamW's moments are allocated at the first step).
    """
    optimizer = recipe.optimizer
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None, device: torch.device | None = None) -> int:
    """Bytes of the tensors in the optimizer's state (on ``device`` when given), each storage once.

    AdamW holds ``exp_avg`` and ``exp_avg_sq`` in each parameter's dtype, plus a ``step``
    counter per parameter (a host scalar unless the optimizer is fused or capturable).
    """
    if optimizer is None:
        return 0
    return _storage_bytes(
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and (device is None or value.device.type == device.type)
    )


def gradient_bytes(model: nn.Module, device: torch.device | None = None) -> int:
    """Bytes of the gradients the parameters hold now (on ``device`` when given)."""
    return _storage_bytes(
        param.grad
        for param in model.parameters()
        if param.grad is not None and (device is None or param.grad.device.type == device.type)
    )


def parameter_bytes(model: nn.Module, device: torch.device | None = None) -> tuple[int, int]:
    """Bytes of ``(parameters, buffers)`` (on ``device`` when given), each storage once."""

    def on_device(tensor: torch.Tensor) -> bool:
        return device is None or tensor.device.type == device.type

    # A 4-bit weight's quant state counts with its weight (ckptlab.model.quantize).
    params = _storage_bytes(p for p in [*model.parameters(), *quant_state_tensors(model)] if on_device(p))
    buffers = _storage_bytes(b for b in model.buffers() if on_device(b))
    return params, buffers


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):  # FSDP2's sharded parameters, their gradients and states: this rank's shard
            # Without grad mode to_local() hands back the local tensor itself; with it, a differentiable view made
            # through autograd and every tracker's dispatch (a third of an FSDP2 simulation: counted per region).
            with torch.no_grad():
                tensor = tensor.to_local()
        storage = tensor.untyped_storage()
        if storage._cdata in seen:  # the C storage's address: the same for every view, fake tensors too
            continue
        seen.add(storage._cdata)
        total += storage.nbytes()
    return total
