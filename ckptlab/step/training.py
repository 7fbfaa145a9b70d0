"""The optimizer half of a training step: which optimizer, its state, and its bytes.

A fine-tune's step is forward, backward, ``optimizer.step()`` and
``optimizer.zero_grad(set_to_none=True)``. The lab builds the optimizer people use
(``torch.optim.AdamW``, what ``transformers.Trainer`` uses) over the parameters that train,
so that the memory it reports counts the optimizer's state as a real run holds it.

Both optimizers run torch's multi-tensor ("foreach") implementation, the one torch picks by
default on CUDA. It is chosen explicitly so that a CPU run, a simulation on fake tensors and
a GPU run take the same code path and allocate the same temporaries in ``step()``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from ..spec import OPTIMIZERS

LEARNING_RATE = 5e-5  # Trainer's default; the lab measures memory and time, not convergence


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the step trains (all of them in a full fine-tune, the adapters with LoRA)."""
    return [param for param in model.parameters() if param.requires_grad]


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer | None:
    """The optimizer ``name`` over ``model``'s trainable parameters; None for "none".

    Raises:
        ValueError: for a name outside :data:`OPTIMIZERS` (``RunSpec.validate`` says it to people first).
    """
    params = trainable_parameters(model)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LEARNING_RATE, foreach=True)
    if name == "none":
        return None
    raise ValueError(f"optimizer={name!r} is not one of {', '.join(OPTIMIZERS)}")


def prime_state(optimizer: torch.optim.Optimizer | None) -> None:
    """Create the optimizer's state as the first ``step()`` does, without a forward and backward.

    A simulated step has no warm-up: zero gradients and one ``step()`` give it the state a
    real run holds from its second step on (AdamW's moments are allocated at the first step).
    """
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

    params = _storage_bytes(p for p in model.parameters() if on_device(p))
    buffers = _storage_bytes(b for b in model.buffers() if on_device(b))
    return params, buffers


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):  # FSDP2's sharded parameters, their gradients and states: this rank's shard
            tensor = tensor.to_local()
        storage = tensor.untyped_storage()
        if storage._cdata in seen:  # the C storage's address: the same for every view, fake tensors too
            continue
        seen.add(storage._cdata)
        total += storage.nbytes()
    return total
