"""Every place the lab leans on torch's private internals, in one module.

torch gives no public API for what the CPU meter needs, so the lab subclasses the private
``torch.distributed._tools.mem_tracker.MemTracker`` (:class:`LeanMemTracker`: it overrides private methods
and reads private fields) and replaces ``register_multi_grad_hook`` in the private
``torch.distributed._tools.mod_tracker`` (:func:`removing_mod_tracker_grad_hooks`), and it reads FSDP2's streams off
the root's private state (:func:`fsdp_stream_now`). Private code changes
without notice between torch releases: ``tests/step/test_torch_workarounds.py`` names the torch version
each workaround was written for and fails when torch changes, so that whoever upgrades torch re-checks them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn as nn
from torch._guards import active_fake_mode
from torch.distributed._tools import mod_tracker as _mod_tracker
from torch.distributed._tools.mem_tracker import (
    _TOTAL_KEY,
    MemTracker,
    _MemRefType,
    _RefType,
    _UpdateType,
    _WeakRefInfo,
    get_untyped_storages,
)
from torch.utils.hooks import RemovableHandle

from ..model.quantize import quant_state_tensors

# What a trace counts beside MemTracker's categories: bytes in float32 logits (LogitsShape), not added to the total.
LOGITS = "logits"
# MemTracker's key of a device's total in its snapshots (a private name: read through this one).
TOTAL_KEY = _TOTAL_KEY


@dataclass(frozen=True)
class LogitsShape:
    """What the float32 logits of a step look like: ``tokens x vocab`` elements, the vocabulary last.

    transformers' losses upcast the whole logits to float32 (``ForCausalLMLoss``: ``logits.float()``),
    and cross-entropy keeps a float32 log-softmax of the same size; their gradients in the backward are
    the same size again. All of them live outside the layers: checkpointing cannot free them.
    """

    tokens: int  # batch x seq
    vocab: int

    def matches(self, tensor: torch.Tensor) -> bool:
        return (
            tensor.dtype == torch.float32
            and tensor.dim() >= 2
            and tensor.shape[-1] == self.vocab
            and tensor.numel() == self.tokens * self.vocab
        )


class TraceSink(Protocol):
    """Receives what a tracker sees on its device, change by change (``ckptlab.step.replay.StepTrace``).

    ``storage`` names a storage for as long as it lives; ``category`` is MemTracker's (``"Activation"``, ...).
    """

    def boundary(self) -> None:
        """A new stretch begins (the timeline's next event)."""

    def sample(self) -> None:
        """An operator has run: the stretch's peak is read here."""

    def change(self, storage: int, category: str, delta: int, *, gone: bool = False) -> None:
        """``delta`` bytes of ``storage`` in ``category`` (``gone``: the storage is freed)."""

    def after_forward(self) -> None:
        """The forward is over: the step reads what stays resident here."""

    def hand_over(self, storages: list[int], layer: int) -> None:
        """``storages`` are layer ``layer``'s input from now on (whoever made them)."""

    def follow_streams(self, now: Callable[[], str | None]) -> None:
        """The step allocates on FSDP2's streams too: ``now()`` names the current one (:func:`fsdp_stream_now`)."""


class OpSink(Protocol):
    """Receives every op the tracker accounts, as it runs (``ckptlab.step.opcount.WorkCounter``: the step's work)."""

    def op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> None:
        """``func`` ran on ``args`` and ``kwargs`` and returned ``out``."""


def reftype_name(reftype: object) -> str:
    """MemTracker's name of a reference type (its str enums and the plain "Total" alike)."""
    return str(getattr(reftype, "value", reftype))


class LeanMemTracker(MemTracker):
    """MemTracker that keeps only the device totals the lab reads, plus the peak of each stretch.

    The stock ``_update_peak_stats`` walks every tracked module after every operator to keep
    per-module peaks; the lab does not use them, and on a 36-layer model that walk is 5/6 of
    the time (62 s against 10 s for a simulated Qwen3-8B step at 8k tokens). This override
    keeps the device-wide peak and its breakdown exactly as the stock code computes them
    (``tests/step/test_memory_meters.py`` compares the two), and adds the peak since the last
    :meth:`take_region_peak`, so a timeline can say how high memory rose between two events. A
    ``trace`` (:class:`TraceSink`) is told every change on the device as it happens, and ``ops``
    (:class:`OpSink`) every op the tracker accounts, in the same dispatch (the simulation counts its work there).
    """

    def __init__(
        self,
        device: torch.device,
        logits: LogitsShape | None = None,
        trace: TraceSink | None = None,
        ops: OpSink | None = None,
    ) -> None:
        super().__init__()
        self._device = device
        self._trace = trace
        self._ops = ops
        self._region_peak = 0
        self._region_peak_snap: dict = {}
        self._logits = logits
        self._logits_counted: dict[int, int] = {}  # id of a logits storage's _WeakRefInfo -> its bytes counted now
        self._logits_now = 0  # bytes in float32 logits now
        self._region_peak_logits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        # The ops MemTracker accounts: not DTensor's (it answers NotImplemented and sees the local ops that follow),
        # nor those DTensor's shape propagation runs in a fake mode of its own.
        if self._ops is not None and out is not NotImplemented and active_fake_mode() is self._fake_mode_on_entry:
            self._ops.op(func, args, kwargs, out)
        return out

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> tuple[int, int]:
        # Stock MemTracker hooks every parameter's gradient, and torch refuses a hook on a tensor
        # that does not require grad (a frozen LoRA base). Frozen parameters get no gradient, so
        # they are marked as hooked with a no-op handle and tracked as parameters all the same.
        if install_grad_hooks:
            for param in module.parameters():
                if not param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                    self._param_to_grad_hook_handles[param] = (_NO_HOOK, _NO_HOOK)
        # A 4-bit weight's quant state (absmax, their double quantization) is neither a parameter nor a buffer, yet
        # the weight's bytes: counted as parameters.
        for tensor in quant_state_tensors(module):
            self._update_and_maybe_create_winfos(tensor, _MemRefType.PARAM)
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def _update_peak_stats(self, peak_state: object) -> None:
        if self._trace is not None:
            self._trace.sample()
        for device, snap in self._curr_mem_snap.items():
            total = snap[_TOTAL_KEY]
            if self._peak_mem.get(device, 0) < total:
                self._peak_mem[device] = total
                self._peak_mem_snap[device] = dict(snap)
            if device == self._device and total > self._region_peak:
                self._region_peak = total
                self._region_peak_snap = dict(snap)
                self._region_peak_logits = self._logits_now

    def take_region_peak(self) -> tuple[int, dict, int]:
        """The highest total since the last call, with its breakdown and its float32 logits' bytes; the next
        stretch starts at the current total."""
        if self._trace is not None:
            self._trace.boundary()
        peak, peak_snap, peak_logits = self._region_peak, self._region_peak_snap, self._region_peak_logits
        snap = self._curr_mem_snap.get(self._device, {})
        self._region_peak, self._region_peak_snap = snap.get(_TOTAL_KEY, 0), dict(snap)
        self._region_peak_logits = self._logits_now
        return peak, peak_snap, peak_logits

    def storage_names(self, tensor: torch.Tensor) -> list[int]:
        """The names a trace knows ``tensor``'s storages by (:class:`TraceSink`; the tracked ones)."""
        found = (self._WINFO.get(storage) for storage in get_untyped_storages(tensor))
        return [id(entry[0]) for entry in found if entry is not None]

    # -- the float32 logits, followed storage by storage as MemTracker follows every storage --

    def _track(self, reftype: _RefType, t: torch.Tensor) -> None:
        super()._track(reftype, t)  # the dispatch path: every tensor an operator returns
        if self._logits is not None and t.device == self._device and self._logits.matches(t):
            for storage in get_untyped_storages(t):
                winfo, _ = self._WINFO.get(storage, (None, None))
                if winfo is not None and id(winfo) not in self._logits_counted:
                    self._logits_counted[id(winfo)] = 0
                    self._recount_logits(winfo, alive=True)

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        if id(winfo) in self._logits_counted:
            self._recount_logits(winfo, alive=u_type != _UpdateType.DEL)
        if self._trace is not None and winfo.device == self._device:  # after the logits: a freed storage is gone
            self._tell_trace(self._trace, u_type, winfo, old_mem_consumed, old_reftype)

    @staticmethod
    def _tell_trace(trace: TraceSink, u_type, winfo: _WeakRefInfo, old_mem_consumed, old_reftype) -> None:
        # The same four updates MemTracker's _update_snap applies to its snapshot.
        storage, category = id(winfo), reftype_name(winfo.reftype)
        if u_type == _UpdateType.ADD:
            trace.change(storage, category, winfo.mem_consumed)
        elif u_type == _UpdateType.DEL:
            trace.change(storage, category, -winfo.mem_consumed, gone=True)
        elif u_type == _UpdateType.REF:
            trace.change(storage, reftype_name(old_reftype), -winfo.mem_consumed)
            trace.change(storage, category, winfo.mem_consumed)
        elif u_type == _UpdateType.SIZE:
            trace.change(storage, category, winfo.mem_consumed - old_mem_consumed)

    def _recount_logits(self, winfo: _WeakRefInfo, *, alive: bool) -> None:
        # Activations and temporaries only: a weight's transposed view can have the logits' shape (tokens == hidden).
        counted = alive and winfo.reftype in (_MemRefType.ACT, _MemRefType.TEMP)
        now = winfo.mem_consumed if counted else 0
        if self._trace is not None and now != self._logits_counted[id(winfo)]:
            self._trace.change(id(winfo), LOGITS, now - self._logits_counted[id(winfo)])
        self._logits_now += now - self._logits_counted[id(winfo)]
        if alive:
            self._logits_counted[id(winfo)] = now
        else:
            del self._logits_counted[id(winfo)]


class _NoHook:
    """A hook handle for a parameter that has no hook (see ``LeanMemTracker``)."""

    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


# -- the hooks MemTracker leaves behind ----------------------------------------------------------
#
# MemTracker's ModTracker calls torch.autograd.graph.register_multi_grad_hook on the inputs and
# outputs of every module in the forward and throws the handles away. In mode "all" the hook's
# closure holds the grad_fn of each tensor it is registered on, and the hook dict is held by
# those same autograd nodes from C++: node -> hook dict -> closure -> grad_fns -> node. gc sees
# that edge only while the Python grad_fn is the node's sole owner (THPCppFunction_traverse
# checks use_count() == 1), and in a step's graph every node is also owned by the edge of the
# node after it. So a full gc.collect() frees one node of the chain: a tiny model's step needed
# ~56 of them, and automatic full collections are rare. Until then the nodes keep what they
# reach: AccumulateGrad (the parameters) and every other hook on them, the LayerProbe's among
# them and through it the model. TrackerMeter keeps the handles and removes those hooks when
# its step is over, which breaks every cycle at once.

_KEPT_HANDLES = threading.local()  # .handles: the list of the step this thread is watching, or None
_INSTALL_LOCK = threading.Lock()
_REAL_MULTI_GRAD_HOOK = getattr(_mod_tracker, "register_multi_grad_hook", None)  # None: a torch that moved it


def _register_multi_grad_hook_kept(*args, **kwargs) -> RemovableHandle:
    """ModTracker's ``register_multi_grad_hook``, keeping the handle for the step this thread watches."""
    assert _REAL_MULTI_GRAD_HOOK is not None  # installed only where torch has it
    handle = _REAL_MULTI_GRAD_HOOK(*args, **kwargs)
    kept = getattr(_KEPT_HANDLES, "handles", None)
    if kept is not None:
        kept.append(handle)
    return handle


def remove_all_hooks(handles: list[RemovableHandle]) -> None:
    """Remove every hook of ``handles`` and empty the list (the one list ModTracker's registrations go on to)."""
    for handle in handles:
        handle.remove()
    handles.clear()


@contextmanager
def removing_mod_tracker_grad_hooks() -> Iterator[list[RemovableHandle]]:
    """Remove, on exit, the multi-grad hooks ModTracker registered in this thread meanwhile (the list it yields:
    :meth:`TrackerMeter.next_micro_batch` removes those of a finished micro-batch sooner).

    The replacement is installed in ``torch.distributed._tools.mod_tracker`` once (ModTracker
    looks the name up there at each call) and behaves as the original outside a watched step
    and in other threads; ModTracker registers only in the forward, on the thread running it.
    """
    if _REAL_MULTI_GRAD_HOOK is not None:
        with _INSTALL_LOCK:
            _mod_tracker.register_multi_grad_hook = _register_multi_grad_hook_kept
    outer = getattr(_KEPT_HANDLES, "handles", None)
    handles: list[RemovableHandle] = []
    _KEPT_HANDLES.handles = handles
    try:
        yield handles
    finally:
        _KEPT_HANDLES.handles = outer
        remove_all_hooks(handles)


# -- FSDP2's streams in a simulated step ----------------------------------------------------------
#
# torch's caching allocator takes a block from the pool of the stream current when it is allocated
# (``DeviceCachingAllocator::malloc`` gets ``getCurrentCUDAStream()``; ``get_free_block`` looks among that stream's
# blocks only). FSDP2 allocates its collectives' buffers inside ``device_handle.stream(...)``: in torch 2.13's
# ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, ``foreach_all_gather`` (lines 336-360) allocates the
# all-gather's output (the input is a view of it, ``all_gather_copy_in``) and, under a mixed-precision policy, the cast
# shards (``_get_param_all_gather_inputs``, lines 419-421) on ``all_gather_copy_in_stream``, and ``foreach_reduce``
# (lines 611-616) the reduce-scatter's output, which becomes the sharded gradients, on ``reduce_scatter_stream``; its
# input (line 597) and the unsharded parameters (``foreach_all_gather_copy_out``) on the current stream.
# ``FSDPCommContext.get_all_gather_streams`` (``_fsdp_param_group.py`` lines 116-126) gives the two all-gather
# streams in the forward and the backward's pre-backward unshard, the current one for an asynchronous or explicit
# prefetch. On fake CPU tensors FSDP2's device handle is ``torch.cpu``, whose ``stream(...)`` context sets what
# ``torch.cpu.current_stream()`` answers: the simulated step enters the same contexts in the same places.

FSDP_STREAMS = ("all_gather_copy_in_stream", "all_gather_stream", "reduce_scatter_stream", "all_reduce_stream")


def fsdp_stream_now(model: nn.Module) -> Callable[[], str | None]:
    """For a simulation of ``model`` sharded with FSDP2 on fake CPU tensors: a function that names the stream current
    now, as its attribute of FSDP2's ``FSDPCommContext`` (one of :data:`FSDP_STREAMS`), or None for the default
    (compute) stream.

    FSDP2 keeps its streams on the root's private state (``FSDPModule._get_fsdp_state()._comm_ctx``), made at the
    first forward (``FSDPCommContext.lazy_init``): looked up at each call."""
    state = model._get_fsdp_state()  # type: ignore[operator]  # an FSDPModule's private method

    def now() -> str | None:
        current = torch.cpu.current_stream()
        context = getattr(state, "_comm_ctx", None)
        for name in FSDP_STREAMS:
            if getattr(context, name, None) is current:
                return name
        return None

    return now
