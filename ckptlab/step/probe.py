"""Observe a training step layer by layer: calls, reruns, saved bytes and where the peak is.

transformers checkpoints a layer's ``forward``, not its ``__call__`` (docs/measuring.md, "The plan"): a
forward hook on the layer fires once per step, while hooks on its children fire again
when the backward recomputes it. So :class:`LayerProbe` counts forward calls on the
layer and reruns on the layer's *first child*, and attributes the tensors autograd saves
during the forward (seen through ``saved_tensors_hooks``) to the layer running then.

The probe also emits a stream of step events (layer entered, layer left, backward
reached a layer, ...) so that a memory meter can draw the step's timeline and tell in
which stretch of it the peak occurred (:class:`StepRecorder`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from ..fact import text
from ..model.experts import moe_parts
from ..model.plan import checkpointable_layers
from ..model.selective import SelectivePolicy, policy_of
from ..results import Region, TimelinePoint
from .memory_meters import MemoryMeter
from .selective import SelectiveObserver, tensors_in, watching_context_fns

Phase = Literal["idle", "forward", "backward", "grad_norm", "optimizer"]


@dataclass
class LayerCounts:
    """What one layer did during one step, as observed."""

    forward_calls: int = 0  # times the layer's __call__ ran in the forward phase (once per micro-batch)
    recompute_calls: int = 0  # times its forward ran again during the backward (the rerun; once per micro-batch)
    saved_bytes: int = 0  # bytes autograd saved while this layer ran in one micro-batch (deduplicated by storage)
    input_bytes: int = 0  # its positional tensor inputs in one micro-batch: what a CP layer keeps, offload moves
    moe: bool = False  # the layer routes tokens to experts (a router and an experts module)
    router_recompute_calls: int = 0  # MoE: times its router ran again during the backward
    experts_recompute_calls: int = 0  # MoE: times its experts ran again during the backward
    # Selective checkpointing (ckptlab.step.selective), counted in an observed step (track_saved), first micro-batch:
    selective: str = "none"  # the policy the layer's checkpoint ran with (its key), "none" for plain or keep
    kept_bytes: int = 0  # bytes of the op outputs the policy kept in SAC's cache (each storage once)
    kept_ops: dict[str, int] = field(default_factory=dict)  # op -> outputs kept in the forward
    rerun_ops: dict[str, int] = field(default_factory=dict)  # op -> times it ran again in the backward's rerun
    reused_ops: dict[str, int] = field(default_factory=dict)  # op -> times the rerun took it from the cache
    attention_bytes: int = 0  # of saved_bytes, what the attention kept (attention_module, kept_by_attention)


# The events of a step, in the order they come: the forward of each layer and its end, the
# head and the loss, the backward reaching each layer (and rerunning a CP one), the embeddings.
# kind: (phase, rerun, description; {n} is the 1-based layer number)
EVENTS: dict[str, tuple[str, bool]] = {
    "embeddings": ("forward", False),
    "micro_batch": ("forward", False),
    "layer_forward": ("forward", False),
    "layer_done": ("forward", False),
    "loss": ("loss", False),
    "backward": ("backward", False),
    "layer_backward": ("backward", False),
    "rerun": ("backward", True),
    "backward_end": ("backward", False),
    "grad_norm": ("optimizer", False),
    "optimizer": ("optimizer", False),
}


def region_for(kind: str, layer: int | None = None, micro_batch: int = 0) -> Region:
    """The :class:`Region` an event of ``kind`` starts (``layer`` 0-based, for the per-layer kinds; ``micro_batch``
    0-based, the micro-batch of a step with gradient accumulation)."""
    phase, rerun = EVENTS[kind]
    # The description is the JSON's English, from the one home of an event's words (event.<kind> of en.json); a page
    # says the event in its reader's language from the kind (show.labels.event_label).
    description = text(f"event.{kind}").format(n="" if layer is None else layer + 1)
    return Region(kind, phase, layer, rerun, description, micro_batch)


@dataclass
class _StepState:
    counts: list[LayerCounts]
    outside_saved_bytes: int = 0  # saved by embeddings, final norm, head and loss
    seen_storages: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary)


class LayerProbe:
    """Hooks on a model's checkpointable layers that observe one step at a time.

    Usage::

        probe = LayerProbe(model)
        with probe.attached():
            probe.begin_step()
            loss = model(...).loss      # phase "forward"
            probe.set_phase("backward")
            loss.backward()
            probe.end_step()
        probe.counts  # per-layer LayerCounts of the last step

    Args:
        model: a transformers model.
        on_region: called with each new :class:`Region` as the step moves on; used to
            locate the memory peak. ``None`` skips building regions (cheaper, for timed steps).
        track_saved: attribute autograd's saved tensors to layers (one Python call per
            saved tensor; the instrumentation benchmark measures its cost).
        on_input: called with a layer's index and its hidden-state input (its first positional
            argument) as its forward begins (``ckptlab.step.replay`` hands the storages to the layer).
    """

    def __init__(
        self,
        model: nn.Module,
        on_region: Callable[[Region], None] | None = None,
        track_saved: bool = True,
        on_input: Callable[[int, torch.Tensor], None] | None = None,
    ) -> None:
        self.model = model
        self.layers = checkpointable_layers(model)
        self.on_region = on_region
        self.track_saved = track_saved
        self.on_input = on_input
        self.phase: Phase = "idle"
        self.micro_batch = 0  # 0-based: the micro-batch the step is in (gradient accumulation)
        self._moe_parts = [moe_parts(layer) for layer in self.layers]
        self._policies: list[SelectivePolicy | None] = [policy_of(layer) for layer in self.layers]
        self._state = self._fresh_state()
        self._current_layer: int | None = None
        self._attentions = [attention_module(layer) for layer in self.layers]
        self._in_attention = 0  # inside a layer's attention module's own code (its projections aside)
        self._attention_inputs: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storages it was handed (cos, sin, mask)
        self._entry_child: dict[int, nn.Module] = {}
        self._grad_hooks: list[RemovableHandle] = []  # on step tensors; removed when the probe detaches
        self._param_storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for param in model.parameters():
            self._param_storages[param.untyped_storage()] = True

    @property
    def counts(self) -> list[LayerCounts]:
        """Per-layer observations of the current or last step."""
        return self._state.counts

    @property
    def outside_saved_bytes(self) -> int:
        """Bytes saved for backward outside any layer (embeddings, final norm, head, loss)."""
        return self._state.outside_saved_bytes

    # -- step control -------------------------------------------------------------------

    def begin_step(self) -> None:
        """Reset the counts and enter the forward phase."""
        # Read at each step: the sweep's rounds switch the setting between steps under one probe.
        self._policies = [policy_of(layer) for layer in self.layers]
        self._state = self._fresh_state()
        self._current_layer = None
        self.micro_batch = 0
        self.phase = "forward"
        self._emit("embeddings")

    def begin_micro_batch(self, micro_batch: int) -> None:
        """Enter the forward of the next micro-batch (0-based ``micro_batch`` >= 1) of a step that accumulates.

        Calls and reruns go on counting; the bytes a layer saves and receives are those of the first
        micro-batch (every micro-batch has the same shapes).
        """
        self.micro_batch = micro_batch
        self._current_layer = None
        self.phase = "forward"
        self._emit("micro_batch")

    def set_phase(self, phase: Phase) -> None:
        """Move to ``"backward"`` right before ``loss.backward()``, ``"grad_norm"`` before the gradient norm,
        ``"optimizer"`` before ``optimizer.step()``."""
        self.phase = phase
        if phase in ("backward", "grad_norm", "optimizer"):
            self._emit(phase)

    def _fresh_state(self) -> _StepState:
        return _StepState(
            counts=[
                LayerCounts(moe=experts is not None, selective=policy.key if policy else "none")
                for (_, experts), policy in zip(self._moe_parts, self._policies)
            ]
        )

    def _running_counts(self) -> LayerCounts | None:
        """The counts of the layer whose forward runs now (the selective observer's attribution).

        Only in the first micro-batch: like the saved bytes, what a policy keeps and reruns is one micro-batch's.
        """
        return None if self._current_layer is None or self.micro_batch else self._state.counts[self._current_layer]

    def end_step(self) -> None:
        """Leave the step (the backward has returned)."""
        self.phase = "idle"
        self._current_layer = None

    # -- hooks --------------------------------------------------------------------------

    @contextmanager
    def attached(self) -> Iterator[LayerProbe]:
        """Register the hooks for the duration of the block and remove them after.

        The gradient hooks on the step's tensors go too: they live on autograd nodes, and a
        node kept alive past the step (MemTracker's hooks did, see ``ckptlab.step.torch_workarounds``) would
        keep this probe, and through it the model, alive with it.
        """
        with ExitStack() as stack:
            stack.callback(self._remove_grad_hooks)
            for index, layer in enumerate(self.layers):
                stack.callback(layer.register_forward_pre_hook(self._layer_pre_hook(index)).remove)
                stack.callback(layer.register_forward_hook(self._layer_post_hook(index)).remove)
                for child in layer.children():
                    stack.callback(child.register_forward_pre_hook(self._child_pre_hook(index, child)).remove)
                attention = self._attentions[index]
                if attention is not None and self.track_saved:
                    for handle in self._attention_hooks(attention):
                        stack.callback(handle.remove)
                # In an MoE layer the rerun is seen on the router and the experts themselves too.
                for part, module in zip(("router", "experts"), self._moe_parts[index]):
                    if module is not None:
                        stack.callback(module.register_forward_pre_hook(self._moe_pre_hook(index, part)).remove)
            if self.track_saved:
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack))
                # What a selective policy keeps is not saved through autograd: its own observer counts it.
                # Made here, not kept: an observer held by the probe would tie the probe (and its model) into a
                # reference cycle that only the garbage collector frees, and a run's memory with it.
                observer = SelectiveObserver(self._running_counts)
                stack.enter_context(observer.watching(self._attached_policies()))
                stack.enter_context(watching_context_fns(self.layers, observer))  # a user's own (Trainer's kwargs)
            yield self

    def _attention_hooks(self, attention: nn.Module) -> list[RemovableHandle]:
        """Hooks that mark the attention module's own code: entered, left, and its projections (children with
        parameters) left out; the tensors it is handed (hidden states, cos and sin, the mask) are its inputs."""

        def enter(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self._in_attention += 1
            for tensor in tensors_in((args, kwargs)):
                self._attention_inputs[tensor.untyped_storage()] = True

        def leave(*_: Any) -> None:
            self._in_attention -= 1

        def resume(*_: Any) -> None:
            self._in_attention += 1

        handles = [
            attention.register_forward_pre_hook(enter, with_kwargs=True),
            attention.register_forward_hook(leave),
        ]
        for child in attention.children():
            if any(True for _ in child.parameters()):  # a projection or a norm: not what the attention keeps
                handles.append(child.register_forward_pre_hook(leave))
                handles.append(child.register_forward_hook(resume))
        return handles

    def _attached_policies(self) -> list[SelectivePolicy]:
        return list({id(policy): policy for policy in map(policy_of, self.layers) if policy is not None}.values())

    def _layer_pre_hook(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.phase != "forward":
                return
            counts = self._state.counts[index]
            counts.forward_calls += 1
            if self.micro_batch == 0:
                counts.input_bytes += _storage_bytes(args)
            if self.on_input is not None and args and isinstance(args[0], torch.Tensor):
                self.on_input(index, args[0])
            self._current_layer = index
            # Not inside any attention as a layer begins: a rerun that stopped early (torch's checkpoint stops the
            # recompute once it has what the backward needs) never ran the attention's forward hook.
            self._in_attention = 0
            self._entry_child.pop(index, None)
            if self.on_region is not None:
                self._emit("layer_forward", index)
                if index == 0 and self.micro_batch == 0:
                    # The gradient reaching the first layer's input ends the layers' backward.
                    # (Every other layer's input is its predecessor's output, hooked below.)
                    self._hook_gradient(args, None)

        return hook

    def _layer_post_hook(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.phase != "forward":
                return
            self._current_layer = None
            if self.on_region is None:
                return
            last = index == len(self.layers) - 1
            self._emit("loss" if last else "layer_done", None if last else index)
            # The gradient reaching this layer's output means its backward starts.
            self._hook_gradient(output, index)

        return hook

    def _child_pre_hook(self, index: int, child: nn.Module) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.phase == "forward":
                # The first child to run is the layer's entry point; its calls in the
                # backward count the reruns, whatever the early stop of the recompute skips.
                self._entry_child.setdefault(index, child)
            elif self.phase == "backward" and self._entry_child.get(index) is child:
                self._state.counts[index].recompute_calls += 1
                self._emit("rerun", index)

        return hook

    def _moe_pre_hook(self, index: int, part: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.phase == "backward":
                counts = self._state.counts[index]
                name = f"{part}_recompute_calls"
                setattr(counts, name, getattr(counts, name) + 1)

        return hook

    def _remove_grad_hooks(self) -> None:
        for handle in self._grad_hooks:
            handle.remove()
        self._grad_hooks.clear()

    def _hook_gradient(self, value: Any, index: int | None) -> None:
        """Emit, when the gradient of the first tensor in ``value`` that needs one arrives, the backward reaching
        layer ``index`` (None: the backward's end)."""
        tensor = next((tensor for tensor in tensors_in(value) if tensor.requires_grad), None)
        if tensor is not None:
            kind = "backward_end" if index is None else "layer_backward"
            self._grad_hooks.append(tensor.register_hook(lambda grad: self._emit(kind, index)))

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.phase == "forward" and self.micro_batch == 0:
            storage = tensor.untyped_storage()
            state = self._state
            if storage not in self._param_storages and storage not in state.seen_storages:
                state.seen_storages[storage] = True
                if self._current_layer is None:
                    state.outside_saved_bytes += storage.nbytes()
                else:
                    counts = state.counts[self._current_layer]
                    counts.saved_bytes += storage.nbytes()
                    if self._in_attention > 0 and storage not in self._attention_inputs and kept_by_attention(tensor):
                        counts.attention_bytes += storage.nbytes()
        # detach(): returning the tensor itself would make a reference cycle (see
        # torch.autograd.graph.saved_tensors_hooks); the storage is shared, nothing is copied.
        return tensor.detach()

    def _emit(self, kind: str, layer: int | None = None) -> None:
        if self.on_region is not None:
            self.on_region(region_for(kind, layer, self.micro_batch))


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def attention_module(layer: nn.Module) -> nn.Module | None:
    """The layer's attention: the innermost module whose class is an ``...Attention`` (LlamaAttention,
    GPT2Attention, BertSelfAttention); None for a layer without one."""
    found = [module for module in layer.modules() if type(module).__name__.endswith("Attention")]
    innermost = [
        module for module in found if not any(other is not module for other in found if _inside(other, module))
    ]
    return innermost[0] if innermost else None


def _inside(inner: nn.Module, outer: nn.Module) -> bool:
    return any(module is inner for module in outer.modules()) and inner is not outer


# What autograd saves in an attention's own code that the attention kept: the probabilities (softmax, their cast copy,
# dropout's mask and output) for eager; the fused op's output and its logsumexp for SDPA's kernels.
_KEPT_NODES = ("Softmax", "ToCopy", "Dropout", "Mul", "Attention", "ScaledDotProduct")


def kept_by_attention(tensor: torch.Tensor) -> bool:
    """A tensor saved in an attention's own code is one the attention kept (rather than its queries, keys and
    values, made by projections and the rotary embedding): the output of a softmax, a cast, a dropout or the
    fused op, or a tensor no autograd node made (the logsumexp, a dropout mask)."""
    made = tensor._base if tensor._base is not None else tensor  # a matmul saves a view of what it multiplies
    node = made.grad_fn
    return node is None or any(word in type(node).__name__ for word in _KEPT_NODES)


def _storage_bytes(value: Any) -> int:
    """Bytes of the distinct storages behind the tensors in ``value``."""
    storages = [tensor.untyped_storage() for tensor in tensors_in(value)]
    # The list keeps every storage object alive, so no id() is reused within it.
    return sum({id(storage): storage.nbytes() for storage in storages}.values())


class StepRecorder:
    """Follows a memory meter across the probe's events: the step's timeline and its peak.

    At each event it closes the previous stretch with the meter's peak since then, and
    opens a new point with the memory in use. The step's peak is the highest stretch, and
    that stretch says where it happened. Reading counters allocates nothing, so recording
    changes neither the peak nor the step.

    Args:
        meter: a :class:`~ckptlab.step.memory_meters.MemoryMeter` that is watching.
    """

    def __init__(self, meter: MemoryMeter) -> None:
        self._meter = meter
        self.timeline: list[TimelinePoint] = []

    def __call__(self, region: Region) -> None:
        self._close_last()
        self.timeline.append(
            TimelinePoint(
                order=len(self.timeline),
                kind=region.kind,
                phase=region.phase,
                layer=region.layer,
                rerun=region.rerun,
                event=region.description,
                current_bytes=self._meter.current(),
                micro_batch=region.micro_batch,
            )
        )

    def finish(self) -> TimelinePoint | None:
        """Close the last stretch; return the point whose stretch holds the step's peak."""
        self._close_last()
        return max(self.timeline, key=lambda point: point.region_peak_bytes, default=None)  # the first of equal highs

    def _close_last(self) -> None:
        peak = self._meter.take_peak()
        if self.timeline:
            last = self.timeline[-1]
            self.timeline[-1] = replace(
                last,
                region_peak_bytes=max(peak, last.current_bytes),
                region_peak_breakdown=self._meter.peak_breakdown(),
                region_peak_logits_bytes=self._meter.peak_logits(),
            )
