"""LoRA adapters through ``peft``, on a frozen base, as most people fine-tune a 7-8B model.

Checkpointing stays transformers' own: it is enabled on the base model
(``peft_model.get_base_model().activation_checkpointing_enable(...)``), as PEFT users do. The
decoder layers keep their class when peft injects adapters into their projections, so the
lab's plan and probe find them through the wrapper.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from ..errors import Option, SpecError, UnsupportedModelError
from .libraries import import_peft
from .plan import checkpointable_layers

if TYPE_CHECKING:  # peft is imported where LoRA runs: only they pay for it
    from peft import PeftModel

# Projection modules peft can wrap: torch's Linear, and transformers' Conv1D (GPT-2's projections).
_ADAPTABLE = (nn.Linear, Conv1D)


def linear_module_names(model: nn.Module) -> list[str]:
    """Short names of the projections inside the model's checkpointable layers (``q_proj``, ``c_attn``, ...).

    These are the attention and MLP projections of the architecture: the default LoRA targets.
    """
    names: list[str] = []
    for layer in checkpointable_layers(model):
        for name, module in layer.named_modules():
            short = name.rsplit(".", 1)[-1]
            if name and isinstance(module, _ADAPTABLE) and short not in names:
                names.append(short)
    return names


def projection_shapes(model: nn.Module) -> tuple[tuple[str, int, int], ...]:
    """(short name, in features, out features) of every projection LoRA could adapt in the checkpointable layers,
    one entry per module (a 32-layer model lists each of its q_proj 32 times): what a rank is bounded by, and what
    the adapters of a rank weigh (``rank x (in + out)`` parameters each)."""
    shapes = []
    for layer in checkpointable_layers(model):
        for name, module in layer.named_modules():
            if name and isinstance(module, nn.Linear):
                shapes.append((name.rsplit(".", 1)[-1], module.in_features, module.out_features))
            elif name and isinstance(module, Conv1D):  # GPT-2's: weight (in, out)
                shapes.append((name.rsplit(".", 1)[-1], module.weight.shape[0], module.weight.shape[1]))
    return tuple(shapes)


def adapted_shapes(shapes: Sequence[tuple[str, int, int]], targets: Sequence[str] | None) -> list[tuple[str, int, int]]:
    """The entries of :func:`projection_shapes` that ``targets`` adapt (None or empty: every projection)."""
    return [shape for shape in shapes if not targets or shape[0] in targets]


def check_rank(rank: int, shapes: Sequence[tuple[str, int, int]], model_name: str) -> None:
    """Refuse a rank above the smallest dimension of a projection it adapts: such an adapter is no longer low-rank
    (at that width it is a full matrix), and a rank of 100,000 builds gigabytes of adapters before any step.

    Raises:
        SpecError: ``spec.lora_rank_too_large``, naming the rank, the projection and its shape.
    """
    if not shapes:
        return  # nothing to adapt: resolve_targets says so when the adapters are built
    name, fan_in, fan_out = min(shapes, key=lambda shape: min(shape[1], shape[2]))
    smallest = min(fan_in, fan_out)
    if rank > smallest:
        raise SpecError(
            key="spec.lora_rank_too_large",
            option=Option("lora_rank", rank),
            model=model_name,
            module=name,
            fan_in=fan_in,
            fan_out=fan_out,
            smallest=smallest,
            rank=rank,
        )


def adapter_parameters(rank: int, shapes: Sequence[tuple[str, int, int]]) -> int:
    """The parameters rank-``rank`` adapters add on ``shapes``: ``A`` (rank x in) and ``B`` (out x rank) each."""
    return sum(rank * (fan_in + fan_out) for _, fan_in, fan_out in shapes)


def resolve_targets(model: nn.Module, targets: Sequence[str] | None) -> list[str]:
    """The modules to adapt: ``targets`` checked against the model, or every projection it has.

    Raises:
        UnsupportedModelError: the model has no linear projection in its layers.
        SpecError: a target the model does not have, naming the ones it has.
    """
    available = linear_module_names(model)
    if not available:
        raise UnsupportedModelError(key="lora.no_linear", model_class=type(model).__name__)
    if not targets:
        return available
    unknown = [name for name in targets if name not in available]
    if unknown:
        raise SpecError(
            key="lora.unknown_targets",
            option=Option("lora_targets"),
            unknown=", ".join(unknown),
            model_class=type(model).__name__,
            available=", ".join(available),
        )
    return list(targets)


def lora_config_fields(rank: int, targets: Sequence[str]) -> dict[str, object]:
    """peft's ``LoraConfig`` fields of the lab's adapters (what :func:`apply_lora` builds and the code box writes).

    ``lora_alpha = 2 x rank`` and no adapter dropout: neither changes the memory of a step.

    Args:
        rank: the LoRA rank.
        targets: the module names to adapt, resolved (:func:`resolve_targets`).
    """
    return {"r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "target_modules": list(targets)}


def apply_lora(model: PreTrainedModel, rank: int, targets: Sequence[str] | None) -> PeftModel:
    """Freeze ``model`` and wrap it with rank-``rank`` LoRA adapters on ``targets`` (peft), as
    :func:`lora_config_fields` says."""
    import_peft()
    from peft import LoraConfig, get_peft_model  # imported here: only LoRA runs pay for it

    config = LoraConfig(**lora_config_fields(rank, resolve_targets(model, targets)))  # type: ignore[arg-type]
    with quiet_peft(), _fake_safe(model):
        return get_peft_model(model, config)


_FAKE = threading.local()
_INSTALL_LOCK = threading.Lock()


@contextmanager
def _fake_safe(model: nn.Module) -> Iterator[None]:
    """Let peft adapt a model on fake tensors (``ckptlab.simulate``).

    peft creates each adapter in float32, moves it with ``Module.to(device, dtype)`` to the
    base layer, and (``autocast_adapter_dtype``, its default) casts bfloat16 and float16
    adapters back to float32. ``Module.to`` swaps fake parameters, which torch refuses
    ("Cannot swap ... weakref"). On fake tensors an adapter is already where that round trip
    leaves it (float32, on the one fake device), so ``Module.to`` returns the module unmoved,
    for this thread and while peft builds the adapters only; real tensors and other threads
    keep torch's own ``to``.
    """
    if not isinstance(next(model.parameters(), None), FakeTensor):
        yield
        return
    with _INSTALL_LOCK:
        if not getattr(nn.Module.to, "_ckptlab_fake_safe", False):
            original = nn.Module.to

            def to(self, *args, **kwargs):
                return self if getattr(_FAKE, "active", False) else original(self, *args, **kwargs)

            to._ckptlab_fake_safe = True  # type: ignore[attr-defined]
            nn.Module.to = to  # type: ignore[method-assign]
    _FAKE.active = True
    try:
        yield
    finally:
        _FAKE.active = False


@contextmanager
def adapted(model: PreTrainedModel, rank: int | None, targets: Sequence[str] | None) -> Iterator[nn.Module]:
    """``model`` to train: itself for a full fine-tune, or wrapped in LoRA adapters for the block.

    peft injects the adapters into ``model``'s own modules and freezes its parameters; on the
    way out the adapters are unloaded and every ``requires_grad`` is as it was, so a model the
    caller passed in (the app's cache) is the caller's again, error or not.
    """
    if rank is None:
        yield model
        return
    trainable = [param.requires_grad for param in model.parameters()]
    wrapped = apply_lora(model, rank, targets)
    try:
        yield wrapped
    finally:
        with quiet_peft():
            wrapped.unload()
        for param, flag in zip(model.parameters(), trainable):
            param.requires_grad_(flag)


@contextmanager
def quiet_peft() -> Iterator[None]:
    """Silence what peft 0.21 says on every call with transformers 5: not the user's concern.

    peft reads transformers' deprecated ``is_gradient_checkpointing`` (a FutureWarning) and
    warns when a Conv1D target needs ``fan_in_fan_out``, which it then sets itself.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*", category=UserWarning)
        yield
