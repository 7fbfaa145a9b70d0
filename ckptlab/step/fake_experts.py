"""Mixture-of-experts layers on fake tensors: torch's grouped matmul in every dtype its kernels take.

transformers' ``grouped_mm`` experts (``ckptlab.model.experts``) call
``torch.nn.functional.grouped_mm``, that is ``aten._grouped_mm``. Its CPU kernel (torch
>= 2.9) and its CUDA kernels take float32, bfloat16 and float16 alike (measured here on the
CPU: forward and backward run in all three), but the meta function fake tensors use still
checks for bfloat16 only, so a float32 simulation stops with "Expected inputs of BF16 type".

:class:`GroupedMmShapes` answers that one call for fake tensors in another dtype with an
output of the shape and dtype the kernel gives (torch's own rule,
``_create_grouped_mm_output_tensor``), and leaves everything else alone: transformers' code
path, autograd's ``_grouped_mm`` backward (which saves what the real op saves and calls
``_grouped_mm`` again for the gradients) and the memory tracker, which sees the op and its
output as for a real run. A bfloat16 call goes to torch's own meta function, with its checks.

Other MoE code (a Python loop over the experts that were hit, ``nonzero``, ``.item()``)
needs the routing's values, which fake tensors do not have: :func:`unsupported_moe_error`
turns torch's complaint into one :class:`~ckptlab.errors.UnsupportedModelError`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import Command, UnsupportedModelError

# What a fake-tensor step raises when the model needs the values of a tensor (a routing decision).
DATA_DEPENDENT_ERRORS = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)

_GROUPED_MM = torch.ops.aten._grouped_mm.default


def grouped_mm_output_shape(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None) -> list[int]:
    """The shape of ``aten._grouped_mm(mat_a, mat_b, offs)``'s output (torch's rule, all four layouts)."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        if offs is None:  # torch refuses this layout without offsets too
            raise ValueError("grouped_mm of two 2D matrices needs offs (one group per expert).")
        return [offs.size(0), mat_a.size(0), mat_b.size(1)]  # (groups, m, n): the weights' gradient
    if mat_a.dim() == 2:
        return [mat_a.size(0), mat_b.size(-1)]  # (tokens, n): the forward, and the input's gradient
    if mat_b.dim() == 2:
        return [mat_a.size(1), mat_b.size(1)]
    return [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]  # a batched matmul


class GroupedMmShapes(TorchDispatchMode):
    """Inside ``FakeTensorMode``: ``aten._grouped_mm`` on fake non-bfloat16 tensors gets its output shape.

    Enter it after ``FakeTensorMode`` (so the output it makes is a fake tensor) and before any
    memory tracker (so the tracker sees the op as usual).
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _GROUPED_MM and _fake_outside_bf16(args):
            mat_a, mat_b = args[0], args[1]
            offs = kwargs.get("offs", args[2] if len(args) > 2 else None)
            dtype = kwargs.get("out_dtype") or mat_a.dtype
            # This mode is off while it runs: the allocation goes to FakeTensorMode below it.
            return torch.empty(grouped_mm_output_shape(mat_a, mat_b, offs), dtype=dtype, device=mat_a.device)
        return func(*args, **kwargs)


def _fake_outside_bf16(args: tuple[Any, ...]) -> bool:
    mats = args[:2]
    return all(isinstance(mat, FakeTensor) for mat in mats) and any(mat.dtype != torch.bfloat16 for mat in mats)


def unsupported_moe_error(model_name: str, family: str, exc: Exception) -> UnsupportedModelError:
    """The one message for a model whose layers need tensor values the simulation does not have."""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UnsupportedModelError(
        key="model.moe_not_simulable",
        measure=Command("measure"),
        name=repr(model_name),
        family=family,
        detail=f"{type(exc).__name__}: {first_line[:160]}",
    )
