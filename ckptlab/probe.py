"""Observe a training step layer by layer: calls, reruns, saved bytes and where the peak is.

transformers checkpoints a layer's ``forward``, not its ``__call__`` (DESIGN.md): a
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
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.utils.weak import WeakIdKeyDictionary

from .plan import checkpointable_layers

Phase = Literal["idle", "forward", "backward"]


@dataclass
class LayerCounts:
    """What one layer did during one step, as observed."""

    forward_calls: int = 0  # times the layer's __call__ ran in the forward phase
    recompute_calls: int = 0  # times its forward ran again during the backward (the rerun)
    saved_bytes: int = 0  # bytes autograd saved for backward while this layer ran (deduplicated by storage)
    input_bytes: int = 0  # bytes of the layer's positional tensor inputs: what a CP layer keeps, and what offload moves


@dataclass(frozen=True)
class Region:
    """A stretch of the step between two probe events."""

    phase: str  # "forward", "loss" or "backward"
    layer: int | None  # 0-based layer index, None outside the layers
    rerun: bool  # True while the backward recomputes a checkpointed layer
    description: str  # for people, e.g. "backward of L3, during its rerun"

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "layer": self.layer, "rerun": self.rerun, "description": self.description}


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
    """

    def __init__(
        self,
        model: nn.Module,
        on_region: Callable[[Region], None] | None = None,
        track_saved: bool = True,
    ) -> None:
        self.model = model
        self.layers = checkpointable_layers(model)
        self.on_region = on_region
        self.track_saved = track_saved
        self.phase: Phase = "idle"
        self._state = _StepState(counts=[LayerCounts() for _ in self.layers])
        self._current_layer: int | None = None
        self._entry_child: dict[int, nn.Module] = {}
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
        self._state = _StepState(counts=[LayerCounts() for _ in self.layers])
        self._current_layer = None
        self.phase = "forward"
        self._emit("forward", None, False, "forward: embeddings")

    def set_phase(self, phase: Phase) -> None:
        """Move to ``"backward"`` right before ``loss.backward()``; ``"idle"`` after it."""
        self.phase = phase
        if phase == "backward":
            self._emit("backward", None, False, "backward: loss, logits and final norm")

    def end_step(self) -> None:
        """Leave the step (the backward has returned)."""
        self.phase = "idle"
        self._current_layer = None

    # -- hooks --------------------------------------------------------------------------

    @contextmanager
    def attached(self) -> Iterator[LayerProbe]:
        """Register the hooks for the duration of the block and remove them after."""
        with ExitStack() as stack:
            for index, layer in enumerate(self.layers):
                stack.callback(layer.register_forward_pre_hook(self._layer_pre_hook(index)).remove)
                stack.callback(layer.register_forward_hook(self._layer_post_hook(index)).remove)
                for child in layer.children():
                    stack.callback(child.register_forward_pre_hook(self._child_pre_hook(index, child)).remove)
            if self.track_saved:
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack))
            yield self

    def _layer_pre_hook(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.phase != "forward":
                return
            counts = self._state.counts[index]
            counts.forward_calls += 1
            counts.input_bytes += _storage_bytes(args)
            self._current_layer = index
            self._entry_child.pop(index, None)
            if self.on_region is not None:
                self._emit("forward", index, False, f"forward of L{index + 1}")
                if index == 0:
                    # The gradient reaching the first layer's input ends the layers' backward.
                    # (Every other layer's input is its predecessor's output, hooked below.)
                    for tensor in _tensors(args):
                        if tensor.requires_grad:
                            tensor.register_hook(self._grad_hook(None))
                            break

        return hook

    def _layer_post_hook(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.phase != "forward":
                return
            self._current_layer = None
            if self.on_region is None:
                return
            last = index == len(self.layers) - 1
            if last:
                self._emit("loss", None, False, "forward: final norm, logits and loss")
            else:
                self._emit("forward", None, False, f"forward: L{index + 1} done")
            # The gradient reaching this layer's output means its backward starts.
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(self._grad_hook(index))
                    break

        return hook

    def _child_pre_hook(self, index: int, child: nn.Module) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.phase == "forward":
                # The first child to run is the layer's entry point; its calls in the
                # backward count the reruns, whatever the early stop of the recompute skips.
                self._entry_child.setdefault(index, child)
            elif self.phase == "backward" and self._entry_child.get(index) is child:
                self._state.counts[index].recompute_calls += 1
                self._emit("backward", index, True, f"backward of L{index + 1}: its rerun, then its gradients")

        return hook

    def _grad_hook(self, index: int | None) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if index is None:
                self._emit("backward", None, False, "backward: embeddings and the last gradients")
            else:
                self._emit("backward", index, False, f"backward of L{index + 1}")

        return hook

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.phase == "forward":
            storage = tensor.untyped_storage()
            state = self._state
            if storage not in self._param_storages and storage not in state.seen_storages:
                state.seen_storages[storage] = True
                if self._current_layer is None:
                    state.outside_saved_bytes += storage.nbytes()
                else:
                    state.counts[self._current_layer].saved_bytes += storage.nbytes()
        # detach(): returning the tensor itself would make a reference cycle (see
        # torch.autograd.graph.saved_tensors_hooks); the storage is shared, nothing is copied.
        return tensor.detach()

    def _emit(self, phase: str, layer: int | None, rerun: bool, description: str) -> None:
        if self.on_region is not None:
            self.on_region(Region(phase, layer, rerun, description))


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a hook's args or output, in order (tuples, lists and ModelOutputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _storage_bytes(value: Any) -> int:
    """Bytes of the distinct storages behind the tensors in ``value``."""
    storages = [tensor.untyped_storage() for tensor in _tensors(value)]
    # The list keeps every storage object alive, so no id() is reused within it.
    return sum({id(storage): storage.nbytes() for storage in storages}.values())


@dataclass(frozen=True)
class TimelinePoint:
    """Memory at one event of the step: the start of a :class:`Region`."""

    order: int  # position in the step, from 0
    phase: str  # "forward", "loss" or "backward"
    layer: int | None  # 0-based layer index, None outside the layers
    rerun: bool  # the backward is recomputing a checkpointed layer
    event: str  # the region that starts here, for people
    current_bytes: int  # memory in use at this event
    peak_bytes: int  # highest memory so far in the step (catches what rose and fell between events)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class StepRecorder:
    """Follows a memory meter across the probe's regions: the timeline, and where the peak rose last.

    At each region change it reads the memory in use and the peak so far. If the peak grew
    since the last change, it was reached in the region that just ended; the last region
    to raise it holds the step's peak. Reading two counters per event allocates nothing,
    so recording changes neither the peak nor the step.

    Args:
        read_current: bytes in use now (for example ``torch.cuda.memory_allocated``).
        read_peak: the peak so far (for example ``torch.cuda.max_memory_allocated``).
    """

    def __init__(self, read_current: Callable[[], int], read_peak: Callable[[], int]) -> None:
        self._read_current = read_current
        self._read_peak = read_peak
        self._current: Region | None = None
        self._last_peak = read_peak()
        self.peak_region: Region | None = None
        self.timeline: list[TimelinePoint] = []

    def __call__(self, region: Region) -> None:
        self._close_current()
        self._current = region
        self.timeline.append(
            TimelinePoint(
                order=len(self.timeline),
                phase=region.phase,
                layer=region.layer,
                rerun=region.rerun,
                event=region.description,
                current_bytes=self._read_current(),
                peak_bytes=self._last_peak,
            )
        )

    def finish(self) -> Region | None:
        """Close the last region and return where the peak was (None if it never rose)."""
        self._close_current()
        self._current = None
        return self.peak_region

    def _close_current(self) -> None:
        peak = self._read_peak()
        if peak > self._last_peak and self._current is not None:
            self.peak_region = self._current
        self._last_peak = max(peak, self._last_peak)
