"""The work of every op a simulated step runs: FLOPs, bytes read and written, the dtype, by phase and layer (issue 59).

The simulation's MemTracker (``torch_workarounds.LeanMemTracker``) already sees every aten op of the step on fake tensors, the
rerun of a checkpointed layer included; with a :class:`WorkCounter` it hands each op here as it runs (no second pass):

- **FLOPs** from torch's own formulas (``torch.utils.flop_counter.flop_registry``, keyed by the op's overload packet
  and called as ``FlopCounterMode`` calls them, with ``out_val``), and the lab's own where torch has none but the
  simulation runs the op (:data:`LAB_FORMULAS`): the CPU flash attention a fake CPU step dispatches SDPA to (counted
  as the CUDA flash kernel it stands for, with torch's formulas on the same shapes; like torch's, they count the whole
  ``s x s`` scores, causal or not), MoE's grouped matmul, and bitsandbytes' 4-bit dequantization (a 4-bit matmul is
  a dequantization, its 4-bit bytes, then a matmul in the compute dtype, whose FLOPs torch counts).
- **Bytes**: every distinct input tensor read plus every distinct output written, each at the elements it spans
  (``torch.utils._runtime_estimation.get_num_bytes``'s rule: a broadcast dimension, stride 0, is read once). That
  module is not imported: it imports ``torch._inductor`` (3 s of a simulation's process), and the rule is three
  lines. An in-place op reads and writes its tensor: both count.
- **Phase** from the probe's event (``probe.EVENTS``): forward, loss, backward, optimizer (the gradient norm and the
  step); inside a layer's backward an op that runs under torch's recomputation hooks is the checkpoint's recompute
  (``rerun``, :func:`recomputing`); FSDP2's collectives
  (``c10d``'s ops) are ``collective``; offload's copies to the host and back (``HostLedger``) are ``offload``.
- **Layer**: the event's layer (None outside the decoder layers).

Views and allocations launch no kernel and move no byte: they are not counted. Ops of one stretch (the probe's event)
with the same phase and cost are one entry with a count; :func:`step_work` groups the stretches into a
:class:`~ckptlab.results.work.StepWork`, and the fold (:mod:`.fold`) and the replay (:mod:`.replay`) carry the
stretches as they carry a stretch's bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..results import Region, TimelinePoint
from ..results.work import PHASES, OpCost, StepWork, WorkItem

# What one stretch of a step ran: (phase, cost) -> how many times.
StretchWork = Mapping[tuple[str, OpCost], int]


class NotCombinable(Exception):
    """Stretches of work that do not combine across depths (:func:`combine`); the fold and the replay say so."""


COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# Ops that launch no kernel and move no byte: a new tensor's storage (its values are written by the next op) and the
# aliases views are not in their schema (views are: ``OpOverload.is_view``).
_NO_KERNEL = frozenset(
    {
        "prim.device",
        "profiler._record_function_enter",
        "profiler._record_function_enter_new",
        "profiler._record_function_exit",
        "aten.empty",
        "aten.empty_strided",
        "aten.empty_like",
        "aten.new_empty",
        "aten.new_empty_strided",
        "aten._unsafe_view",
        "aten.lift_fresh",
        "aten.detach",
        "aten.alias",
        "aten.set_",
        "aten.resize_",
        "aten.sym_size",
        "aten.sym_stride",
        "aten.sym_numel",
        "aten.sym_storage_offset",
        "_c10d_functional.wait_tensor",  # waits for a collective counted where it was issued
    }
)
TO_HOST = "host_copy.to_host"  # offload's copy of a checkpointed layer's input to pinned host memory
TO_DEVICE = "host_copy.to_device"  # and back, in the backward


# -- the lab's own formulas, where torch's registry has none -----------------------------------------------------


def flash_for_cpu_flops(query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """``aten._scaled_dot_product_flash_attention_for_cpu``: the CUDA flash kernel's count on the same shapes."""
    return int(sdpa_flop_count(tuple(query.shape), tuple(key.shape), tuple(value.shape)))


def flash_for_cpu_backward_flops(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    """``aten._scaled_dot_product_flash_attention_for_cpu_backward``: the CUDA flash backward's count."""
    shapes = (tuple(grad_out.shape), tuple(query.shape), tuple(key.shape), tuple(value.shape))
    return int(sdpa_backward_flop_count(*shapes))


def grouped_mm_flops(mat_a: Any, mat_b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """``aten._grouped_mm``: 2 x the sum over groups of ``m x k x n``.

    The groups split one dimension of the operands (``offs``), so the sum is the whole product: a (tokens x k) by
    (groups x k x n) matmul (MoE's experts, and the input's gradient) is ``2 x tokens x k x n``; a batched 3-D by
    3-D one ``2 x groups x m x k x n``; a 2-D by 2-D one (the weights' gradient, ``k`` split by groups into a
    groups x m x n output) ``2 x m x k x n``. Every case but the last is ``2 x`` the output's elements ``x k``.
    """
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        return 2 * mat_a.numel() * mat_b.shape[-1]
    return 2 * out_val.numel() * mat_a.shape[-1]


def dequantize_4bit_flops(packed: Any, absmax: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """bitsandbytes' 4-bit dequantization: one multiply a weight (its code's value by its block's absmax). Its bytes,
    the packed 4-bit weight and the absmax read and the compute-dtype weight written, are counted as any op's."""
    return int(out_val.numel())


def gemm_4bit_flops(inputs: Any, packed: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    """bitsandbytes' fused 4-bit matmul (its forward on the CPU backend): the matmul's ``2 x m x k x n``, the
    dequantization inside it not counted (its bytes are the 4-bit weight's, counted as any op's)."""
    return 2 * int(out_val.numel()) * int(inputs.shape[-1])


# By the op packet's qualified name (bitsandbytes registers its ops when imported, which a run without a 4-bit base
# never does), each tested against a hand count in tests/step/test_opcount.py.
LAB_FORMULAS: dict[str, Callable[..., int]] = {
    "aten._scaled_dot_product_flash_attention_for_cpu": flash_for_cpu_flops,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": flash_for_cpu_backward_flops,
    "aten._grouped_mm": grouped_mm_flops,
    "bitsandbytes.dequantize_4bit": dequantize_4bit_flops,
    "bitsandbytes.gemm_4bit": gemm_4bit_flops,
}


def formula_for(func: Any) -> Callable[..., int] | None:
    """The FLOP formula of an op (an ``OpOverload``): torch's, else the lab's; None: it does no arithmetic counted."""
    packet = func.overloadpacket
    return flop_registry.get(packet) or LAB_FORMULAS.get(_packet_name(func))


def _packet_name(func: Any) -> str:
    return f"{func.namespace}.{func.overloadpacket.__name__}"


def recomputing() -> bool:
    """Whether the op running now is a checkpoint's recompute: torch's non-reentrant checkpoint runs it under its
    ``_recomputation_hook`` (saved-tensor hooks), the innermost while it runs. Grad mode cannot tell: the recompute
    enables it, but an autograd Function's forward (bitsandbytes' 4-bit matmul) runs without it in the recompute too.
    """
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return hooks is not None and getattr(hooks[0], "__qualname__", "").startswith(_RECOMPUTATION_HOOK)


_RECOMPUTATION_HOOK = torch.utils.checkpoint._recomputation_hook.__name__ + "."


def tensor_bytes(tensor: torch.Tensor) -> int:
    """The bytes an op reads or writes of ``tensor``: the elements it spans, a broadcast (stride 0) dimension once."""
    try:
        strides = tensor.stride()
    except RuntimeError:  # a layout without strides (sparse, nested): every element
        return tensor.numel() * tensor.element_size()
    count = 1
    for size, stride in zip(tensor.shape, strides):
        if stride:
            count *= size
    return count * tensor.element_size()


def _tensors(values: Sequence[Any], into: list[torch.Tensor]) -> None:
    """The tensors of an op's arguments or outputs (lists of tensors too: foreach and fused ops), each once."""
    for value in values:
        if isinstance(value, torch.Tensor):
            if not any(value is seen for seen in into):
                into.append(value)
        elif isinstance(value, (list, tuple)):
            _tensors(value, into)


class _Op:
    """What the counter knows of an op overload, found once."""

    __slots__ = ("collective", "counted", "formula", "name")

    def __init__(self, func: Any) -> None:
        packet = _packet_name(func)
        self.name = str(func)  # e.g. "aten.mm.default"
        self.counted = not getattr(func, "is_view", False) and packet not in _NO_KERNEL
        self.formula = formula_for(func)
        self.collective = func.namespace in COLLECTIVE_NAMESPACES


def counted(func: Any) -> bool:
    """Whether the simulation counts an op overload: not a view, not an allocation or a metadata op
    (:data:`_NO_KERNEL`). The host-time benchmark (``explore.machine.host_op_seconds``) counts a real step's ops by
    this rule (with the roofline's, ``launches_kernel``), so its seconds per op divide by what a simulation counts."""
    return _Op(func).counted


class WorkCounter:
    """Counts the ops of one observed step, stretch by stretch (an ``OpSink`` of ``torch_workarounds``' tracker).

    ``stretches[0]`` is what ran before the step's first event; ``stretches[k]`` the stretch of the timeline's
    ``k - 1``-th point (the probe's event ``k - 1`` to the next).
    """

    def __init__(self) -> None:
        self.stretches: list[Counter[tuple[str, OpCost]]] = [Counter()]
        self._phase = "forward"
        self._in_layer_backward = False
        self._ops: dict[Any, _Op] = {}
        self._costs: dict[tuple[Any, ...], OpCost] = {}  # an op and its tensors' shapes, strides and dtypes
        self._dtypes: dict[torch.dtype, str] = {}

    def enter(self, region: Region) -> None:
        """The probe's next event: a new stretch begins."""
        self.stretches.append(Counter())
        self._phase = region.phase
        self._in_layer_backward = region.phase == "backward" and region.layer is not None

    def op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> None:
        """An op ran: count it in the current stretch."""
        known = self._ops.get(func)
        if known is None:
            known = self._ops[func] = _Op(func)
        if not known.counted:
            return
        inputs: list[torch.Tensor] = []
        _tensors(args, inputs)
        if kwargs:
            _tensors(tuple(kwargs.values()), inputs)
        outputs: list[torch.Tensor] = []
        _tensors(out if isinstance(out, (list, tuple)) else (out,), outputs)
        key = (
            func,
            tuple([(t.shape, t.stride(), t.dtype) for t in inputs]),
            tuple([(t.shape, t.stride(), t.dtype) for t in outputs]),
        )
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = self._cost(known, func, args, kwargs or {}, out, inputs, outputs)
        if known.collective:
            phase = "collective"
        elif self._in_layer_backward and recomputing():
            phase = "rerun"
        else:
            phase = self._phase
        self.stretches[-1][(phase, cost)] += 1

    def copy(self, nbytes: int, dtype: torch.dtype, *, to_host: bool) -> None:
        """Offload copied ``nbytes`` to the host (``to_host``) or back: bytes over the host link, no arithmetic."""
        self.stretches[-1][("offload", OpCost(TO_HOST if to_host else TO_DEVICE, self._dtype(dtype), 0, nbytes))] += 1

    def _cost(
        self,
        known: _Op,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        out: Any,
        inputs: list[torch.Tensor],
        outputs: list[torch.Tensor],
    ) -> OpCost:
        read = sum(map(tensor_bytes, inputs))
        written = sum(map(tensor_bytes, outputs))
        # A collective moves its unsharded buffer (an all-gather's output, a reduce-scatter's input) over the link.
        moved = max(read, written) if known.collective else read + written
        flops = int(known.formula(*args, **kwargs, out_val=out)) if known.formula is not None else 0
        # The dtype it computes in: its first input's (a matmul's operands), else what it makes.
        first = inputs[0] if inputs else outputs[0] if outputs else None
        return OpCost(known.name, self._dtype(first.dtype) if first is not None else "", flops, moved)

    def _dtype(self, dtype: torch.dtype) -> str:
        name = self._dtypes.get(dtype)
        if name is None:
            name = self._dtypes[dtype] = str(dtype).removeprefix("torch.")
        return name

    def counted(self) -> tuple[dict[tuple[str, OpCost], int], ...]:
        """The stretches as plain dicts, the first being what ran before the step's first event."""
        return tuple(dict(stretch) for stretch in self.stretches)


def step_work(stretches: Sequence[StretchWork], timeline: Sequence[TimelinePoint]) -> StepWork:
    """The step's :class:`StepWork` from its stretches (the first before the first event, then one per point of
    ``timeline``, whose layer each stretch's ops are tagged with): one item per phase, layer and cost, in the order of
    :data:`PHASES`, then the layer (None first), then the cost."""
    if len(stretches) != len(timeline) + 1:
        raise RuntimeError(f"{len(stretches)} stretches of work for {len(timeline)} events")
    grouped: dict[tuple[str, int | None, OpCost], int] = {}
    for layer, stretch in zip([None, *(point.layer for point in timeline)], stretches):
        for (phase, cost), count in stretch.items():
            key = (phase, layer, cost)
            grouped[key] = grouped.get(key, 0) + count
    # In one order whatever the stretches' (the fold's and the replay's combine theirs): by phase, layer and cost.
    items = sorted(grouped.items(), key=lambda entry: _item_order(*entry[0]))
    return StepWork(tuple(WorkItem(phase, layer, cost, count) for (phase, layer, cost), count in items))


def _item_order(phase: str, layer: int | None, cost: OpCost) -> tuple[Any, ...]:
    return PHASES.index(phase), -1 if layer is None else layer, cost.op, cost.dtype, cost.flops, cost.bytes


def combine(op: Callable[..., int], first: StretchWork, *others: StretchWork) -> dict[tuple[str, OpCost], int]:
    """Stretches combined count by count with ``op`` (the fold's and the replay's steps over depths), a cost absent
    from a stretch counting 0 there.

    A call whose cost changes with the depth (the gradient norm's norm of the per-parameter norms, a fused or foreach
    optimizer op: one call, more bytes) is in some stretches and not others, and its counts would go negative: within
    its op, phase and dtype, the costs every stretch has combine their counts, and the others, paired in order of
    size, combine cost by cost.

    ``op`` raises :class:`NotCombinable` where it finds no whole number.

    Raises:
        NotCombinable: an op's calls neither give counts nor pair up across the stretches.
    """
    works = (first, *others)
    groups: dict[tuple[str, str, str], list[tuple[str, OpCost]]] = {}
    for key in dict.fromkeys(key for work in works for key in work):
        groups.setdefault((key[0], key[1].op, key[1].dtype), []).append(key)
    result: dict[tuple[str, OpCost], int] = {}
    for (phase, name, dtype), keys in groups.items():
        try:
            counts = {key: op(*(work.get(key, 0) for work in works)) for key in keys}
        except NotCombinable:  # ``op`` found no whole count: a moving call's
            counts = {key: -1 for key in keys}
        if all(count >= 0 for count in counts.values()):
            result.update({key: count for key, count in counts.items() if count})
            continue
        moving = [key for key in keys if not all(key in work for work in works)]
        for key in keys:
            if key not in moving:
                count = op(*(work[key] for work in works))
                if count < 0:
                    raise NotCombinable(f"{name}'s count in {phase} does not grow with the depth")
                if count:
                    result[key] = count
        calls = [sorted(((key[1], work[key]) for key in moving if key in work), key=_by_size) for work in works]
        if any([count for _, count in call] != [count for _, count in calls[0]] for call in calls):
            raise NotCombinable(f"{name}'s calls in {phase} do not pair up across depths")
        for paired in zip(*calls):
            costs = [cost for cost, _ in paired]
            made = OpCost(name, dtype, op(*(cost.flops for cost in costs)), op(*(cost.bytes for cost in costs)))
            if made.flops < 0 or made.bytes < 0:
                raise NotCombinable(f"{name}'s cost in {phase} does not grow with the depth")
            result[(phase, made)] = result.get((phase, made), 0) + paired[0][1]
    return result


def _by_size(entry: tuple[OpCost, int]) -> tuple[int, int, int]:
    cost, count = entry
    return cost.bytes, cost.flops, count
