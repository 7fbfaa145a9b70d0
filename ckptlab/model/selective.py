"""Selective activation checkpointing (SAC): which op outputs a checkpointed layer keeps, in one place.

Plain checkpointing keeps a CP layer's input and reruns its whole forward in the backward. With
a selective policy the layer also keeps the outputs of chosen ops, and the rerun takes those from
a cache instead of running them again. It is torch's own API, passed through transformers::

    model.activation_checkpointing_enable(
        every_n_layers=n, offload=o,
        activation_checkpointing_kwargs={"use_reentrant": False,
                                         "context_fn": partial(create_selective_checkpoint_contexts, policy)})

(:func:`enable_checkpointing` makes that call). What the policy keeps lives in SAC's own cache,
not in autograd's saved tensors: ``save_on_cpu`` (offload) never sees it, so with offload the
kept outputs stay on the device, and only the layer inputs move.

The policies (``RunSpec.selective``, ``--selective``):

- ``"none"``: plain checkpointing.
- ``"attention"``: the outputs of the fused attention op SDPA dispatches: on the CPU
  ``_scaled_dot_product_flash_attention_for_cpu``; on CUDA flash, memory-efficient or cuDNN (output
  and logsumexp, plus the kernels' RNG seed and offset). With attention dropout in training
  (BERT, GPT-2 configs with ``attn_pdrop`` > 0) SDPA on the CPU takes its math path, written out
  as bmm, softmax, dropout and bmm, which has no single attention op: the policy then keeps
  nothing in those layers and the run says so loudly (a plan mismatch, ``note.selective_matched_nothing``),
  rather than guessing which of the math path's tensors "the attention" is. Use ``"matmuls"`` to
  keep that path's two bmm outputs.
- ``"matmuls"``: every mm, addmm and bmm output (the layer's projections, and the math path's
  score and value products), plus the attention ops above.
- ``"torchtitan"``: torchtitan's "selective op" mode: its op save list, read from
  pytorch/torchtitan ``torchtitan/models/llama3/infra/parallelize.py`` (``_op_sac_save_list``),
  and its rule from ``torchtitan/distributed/activation_checkpoint.py`` (``_custom_policy``): save
  every listed op but every second ``aten.mm`` of a checkpointed region. Only the eager aten
  and c10d ops of that list are here (its higher-order ops, flex attention and compiled regions,
  need ``torch.compile``). torchtitan's list has no CPU attention op, so on the CPU it recomputes
  the attention: what torchtitan would do there.
- a tuple of op names (from Python): keep the outputs of exactly those ops, e.g.
  ``("aten.mm", "aten._scaled_dot_product_flash_attention_for_cpu")``; a name with no overload
  (``aten.mm``) matches all of its overloads. A name torch does not know is refused
  (:func:`validate_selective`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import CHECKPOINTING_OFF, Option, SpecError, not_one_of

# torch is imported where an op is resolved or a policy runs, not above: checking a policy's name (the CLI's
# flags, a RunSpec) does not load torch, so ``python -m ckptlab --help`` answers at once.
if TYPE_CHECKING:
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import CheckpointPolicy

    Op = torch._ops.OpOverload | torch._ops.OpOverloadPacket

Selective = str | tuple[str, ...]  # a policy's name, or op names to keep (from Python)

NONE = "none"
# The fused attention ops SDPA dispatches, by path: CPU flash; CUDA flash, memory-efficient, cuDNN.
ATTENTION_OPS = (
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
)
MATMUL_OPS = ("aten.mm", "aten.addmm", "aten.bmm")
# torchtitan's _op_sac_save_list (pytorch/torchtitan, torchtitan/models/llama3/infra/parallelize.py),
# its eager ops only; the higher-order ops of that list (flex_attention, inductor_compiled_code) and
# torch_attn._varlen_attn need torch.compile or a library the lab does not run.
TORCHTITAN_OPS = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "aten.max.default",  # torchtitan: the absolute maximum a low-precision (float8) step scales by
)
POLICIES: dict[str, tuple[str, ...]] = {
    "attention": ATTENTION_OPS,
    "matmuls": MATMUL_OPS + ATTENTION_OPS,
    "torchtitan": TORCHTITAN_OPS,
}
CHOICES = (NONE, *POLICIES)  # the named policies, as --selective lists them


def validate_selective(selective: object) -> None:
    """Raise :class:`SpecError` unless ``selective`` is a policy's name or a tuple of op names torch knows.

    Raises:
        SpecError: an unknown policy (``spec.not_one_of``), or the first op name torch does not have
            (``spec.selective_op``), naming it.
    """
    if isinstance(selective, str):
        if selective not in CHOICES:
            raise not_one_of("selective", selective, (*CHOICES, "a tuple of op names"))
        return
    if not isinstance(selective, tuple) or not selective:
        raise not_one_of("selective", selective, (*CHOICES, "a tuple of op names"))
    for name in selective:
        resolve_op(name)


def check_selective(selective: object, every_n_layers: int | None) -> None:
    """A spec's selective setting: a known policy or known ops, and checkpointing on when it is not "none".

    Raises:
        SpecError: as :func:`validate_selective`, or a policy with checkpointing off
            (``spec.selective_without_checkpointing``).
    """
    validate_selective(selective)
    if isinstance(selective, (str, tuple)) and selective != NONE and every_n_layers is None:
        raise SpecError(
            key="spec.selective_without_checkpointing",
            option=Option("selective", selective_key(selective)),
            off=CHECKPOINTING_OFF,
            every_n_layers=Option("every_n_layers"),
            none=Option("selective", NONE),
            policy=selective_key(selective),
        )


def resolve_op(name: object) -> Op:
    """The torch op a name means: ``"aten.mm"`` (every overload) or ``"aten.mm.default"`` (that one).

    Raises:
        SpecError: torch has no op of that name (``spec.selective_op``).
    """
    import torch

    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) in (2, 3) and all(parts):
        try:
            op = getattr(getattr(torch.ops, parts[0]), parts[1])
            if len(parts) == 3:
                op = getattr(op, parts[2])
        except (AttributeError, RuntimeError):
            op = None
        if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return op
    raise SpecError(key="spec.selective_op", name=str(name))


def selective_ops(selective: Selective) -> tuple[str, ...]:
    """The op names a policy keeps the outputs of (none for ``"none"``)."""
    return selective if isinstance(selective, tuple) else POLICIES.get(selective, ())


def selective_key(selective: Selective) -> str:
    """A short stable id of a policy: its name, or ``"ops:aten.mm+aten.bmm"`` for op names."""
    return selective if isinstance(selective, str) else "ops:" + "+".join(selective)


def op_name(func: Any) -> str:
    """An op's name without its overload, e.g. ``"aten.mm"``: how counts of ops are keyed."""
    packet = getattr(func, "overloadpacket", func)
    return str(packet)


class SacObserver(Protocol):
    """What watches a policy at work (``ckptlab.step.selective``): it makes the SAC contexts of one region."""

    def contexts(self, policy: SelectivePolicy) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]: ...


class SelectivePolicy:
    """One selective policy, ready for ``torch.utils.checkpoint``'s ``context_fn``.

    Args:
        selective: the spec's value (a policy's name or op names); validated here.

    ``context_fn`` is called by torch at each checkpointed region's forward and returns its
    (forward, recompute) contexts. While an :attr:`observer` is set, the observer makes them,
    so that an observed step counts what the policy kept and what the rerun ran; timed steps run
    with none.
    """

    def __init__(self, selective: Selective) -> None:
        import torch

        validate_selective(selective)
        self.selective = selective
        self.key = selective_key(selective)
        ops = [resolve_op(name) for name in selective_ops(selective)]
        self._overloads = frozenset(op for op in ops if isinstance(op, torch._ops.OpOverload))
        self._packets = frozenset(op for op in ops if isinstance(op, torch._ops.OpOverloadPacket))
        self._every_other_mm = selective == "torchtitan"
        self.observer: SacObserver | None = None

    def keeps(self, func: Any) -> bool:
        """Whether the policy keeps ``func``'s outputs (before torchtitan's every-second-mm rule)."""
        return func in self._overloads or getattr(func, "overloadpacket", None) in self._packets

    def region_policy(self) -> Callable[..., CheckpointPolicy]:
        """A fresh policy function for one checkpointed region (torchtitan's mm count is per region)."""
        import torch
        from torch.utils.checkpoint import CheckpointPolicy

        mm_count: defaultdict[str, int] = defaultdict(int)

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            keep = self.keeps(func)
            if keep and self._every_other_mm and func == torch.ops.aten.mm.default:
                mm_count["mm"] += 1
                keep = mm_count["mm"] % 2 == 1  # torchtitan: "except every second mm"
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return policy

    def context_fn(self) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        """torch's SAC contexts for one region (the observer's, while one watches)."""
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        if self.observer is not None:
            return self.observer.contexts(self)
        return create_selective_checkpoint_contexts(self.region_policy())


def checkpointing_kwargs(policy: SelectivePolicy | None) -> dict[str, Any] | None:
    """transformers' ``activation_checkpointing_kwargs`` for a policy (None: its default, non-reentrant)."""
    # SAC needs the non-reentrant checkpoint; transformers' default is that too, said here explicitly.
    return None if policy is None else {"use_reentrant": False, "context_fn": policy.context_fn}


def enable_checkpointing(
    model: nn.Module, every_n_layers: int, offload: bool, selective: Selective = NONE
) -> SelectivePolicy | None:
    """Turn checkpointing on with transformers' call, with the selective policy ``selective`` (if any).

    Returns:
        The policy the checkpointed layers run with, or None for plain checkpointing.
    """
    policy = None if selective == NONE else SelectivePolicy(selective)
    model.activation_checkpointing_enable(  # type: ignore[operator]  # a transformers PreTrainedModel
        every_n_layers=every_n_layers, offload=offload, activation_checkpointing_kwargs=checkpointing_kwargs(policy)
    )
    return policy


def policy_of(layer: nn.Module) -> SelectivePolicy | None:
    """The lab's selective policy a checkpointed layer runs with, read from the function transformers set on it."""
    if not getattr(layer, "gradient_checkpointing", False):
        return None
    function = getattr(layer, "_gradient_checkpointing_func", None)
    context_fn = getattr(function, "keywords", {}).get("context_fn")
    owner = getattr(context_fn, "__self__", None)
    return owner if isinstance(owner, SelectivePolicy) else None
