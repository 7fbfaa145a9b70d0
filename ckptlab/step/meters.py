"""How the lab reads memory and time on each device.

CUDA: the caching allocator's own statistics (``memory_allocated`` and
``max_memory_allocated`` after ``reset_peak_memory_stats``), and CUDA events read after a
synchronize, so that time means kernel time and not launch time.

CPU: the CPU allocator keeps no statistics, and a process's RSS mixes in the Python
heap, the allocator's cache and the libraries. The lab uses torch's own
``torch.distributed._tools.mem_tracker.MemTracker`` instead of a home-made allocator
hook: it is maintained with torch, counts the bytes of every live tensor storage (the
same quantity the CUDA allocator counts, without its block rounding), understands
activation checkpointing, and breaks the total down into parameters, buffers,
gradients, activations and temporaries. It is a ``TorchDispatchMode`` that looks at every
operator, which slows a step down, so it runs on a separate, untimed step. The same
tracker accounts a simulated step on fake tensors (``ckptlab.simulate``).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
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
from ..results import CPU_MEMORY_METHOD, CPU_TIME_METHOD, CUDA_MEMORY_METHOD, CUDA_TIME_METHOD
from ..torchstate import usable_cores
from .training import gradient_bytes, optimizer_state_bytes, parameter_bytes

# Where the bytes of a step go, by one name everywhere (results, tables, figures, locales).
CATEGORIES = ("parameter", "buffer", "gradient", "optimizer_state", "activation", "temp")
# What a trace counts beside MemTracker's categories: bytes in float32 logits (LogitsShape), not added to the total.
LOGITS = "logits"
HOST = "host"  # and bytes in host memory (a simulated offload's copies), apart from the device's
# On CUDA the allocator cannot tell activations from temporaries: one category holds both.
ACTIVATION_AND_TEMP = "activation_and_temp"
TRACKER_CATEGORIES = {  # MemTracker's names -> the lab's
    "Parameter": "parameter",
    "Buffer": "buffer",
    "Gradient": "gradient",
    "Optstate": "optimizer_state",
    "Activation": "activation",
    "Temp": "temp",
    "Other": "other",
}


class MemoryMeter(Protocol):
    """Reads the memory of one device during one observed step."""

    method: str

    def current(self) -> int:
        """Bytes in use now."""

    def take_peak(self) -> int:
        """Highest bytes in use since the last call (or since watching began); starts a new stretch."""

    def breakdown(self) -> dict[str, int]:
        """Bytes in use now by category, where the meter can tell; else empty."""

    def peak_breakdown(self) -> dict[str, int]:
        """Bytes by category at the highest point of the stretch :meth:`take_peak` just closed."""

    def next_micro_batch(self) -> None:
        """The model is about to run again in the same step (gradient accumulation)."""

    def peak_logits(self) -> int | None:
        """Bytes in float32 logits (:class:`LogitsShape`) at that highest point; None where the meter cannot tell."""


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


class CudaMeter:
    """The CUDA caching allocator's counters for one device.

    They count every tensor of the process on that device: a second model kept alive (a
    cache of several) shows up in a run's baseline. The app keeps one model at a time.
    """

    method = CUDA_MEMORY_METHOD

    def __init__(
        self, device: torch.device, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None
    ) -> None:
        self.device = device
        self._model = model
        self._optimizer = optimizer
        self._last_peak_breakdown: dict[str, int] = {}

    @contextmanager
    def watching(self) -> Iterator[CudaMeter]:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        yield self
        torch.cuda.synchronize(self.device)

    def current(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def take_peak(self) -> int:
        # Host-side counters: reading and resetting them does not synchronize or allocate.
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        # Parameters, buffers and the optimizer's state do not change within a stretch, and
        # gradients only arrive: read at the stretch's end, they are at most one layer's
        # gradients above what was held at its peak. The rest is activations and temporaries.
        self._last_peak_breakdown = self._split(peak)
        return peak

    def breakdown(self) -> dict[str, int]:
        return self._split(self.current())

    def peak_breakdown(self) -> dict[str, int]:
        return self._last_peak_breakdown

    def next_micro_batch(self) -> None:
        pass  # the allocator's counters follow the device, not the modules

    def peak_logits(self) -> int | None:
        return None  # the allocator counts blocks, not tensors

    def _split(self, total: int) -> dict[str, int]:
        """``total`` split into what the model's and the optimizer's tensors hold, and the rest."""
        if self._model is None:
            return {}
        params, buffers = parameter_bytes(self._model, self.device)
        parts = {
            "parameter": params,
            "buffer": buffers,
            "gradient": gradient_bytes(self._model, self.device),
            "optimizer_state": optimizer_state_bytes(self._optimizer, self.device),
        }
        parts[ACTIVATION_AND_TEMP] = max(0, total - sum(parts.values()))
        return {key: value for key, value in parts.items() if value}


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


class OpSink(Protocol):
    """Receives every op the tracker accounts, as it runs (``ckptlab.step.opcount.WorkCounter``: the step's work)."""

    def op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> None:
        """``func`` ran on ``args`` and ``kwargs`` and returned ``out``."""


def reftype_name(reftype: object) -> str:
    """MemTracker's name of a reference type (its str enums and the plain "Total" alike)."""
    return str(getattr(reftype, "value", reftype))


def tracker_breakdown(snap: dict, optimizer_state: int | None) -> dict[str, int]:
    """A MemTracker snapshot (its reference types -> bytes) in the lab's categories.

    MemTracker files every tensor made inside ``optimizer.step()`` as optimizer state, the step's
    temporaries too. The state itself is fixed once created (the warm-up did it): what exceeds
    ``optimizer_state`` (None: no optimizer) is temporaries.
    """
    named = {reftype_name(key): value for key, value in snap.items()}
    parts = {TRACKER_CATEGORIES.get(key, key): value for key, value in named.items() if key != _TOTAL_KEY and value}
    excess = parts.get("optimizer_state", 0) - (optimizer_state or 0)
    if optimizer_state is not None and excess > 0:
        parts["optimizer_state"] = optimizer_state
        parts["temp"] = parts.get("temp", 0) + excess
    return {key: value for key, value in parts.items() if value}


class _LeanMemTracker(MemTracker):
    """MemTracker that keeps only the device totals the lab reads, plus the peak of each stretch.

    The stock ``_update_peak_stats`` walks every tracked module after every operator to keep
    per-module peaks; the lab does not use them, and on a 36-layer model that walk is 5/6 of
    the time (62 s against 10 s for a simulated Qwen3-8B step at 8k tokens). This override
    keeps the device-wide peak and its breakdown exactly as the stock code computes them
    (``tests/step/test_meters.py`` compares the two), and adds the peak since the last
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
    """A hook handle for a parameter that has no hook (see ``_LeanMemTracker``)."""

    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


class TrackerMeter:
    """torch's MemTracker, following the model's parameters, the optimizer's state and everything made in the step."""

    method = CPU_MEMORY_METHOD

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        optimizer: torch.optim.Optimizer | None = None,
        logits: LogitsShape | None = None,
        trace: TraceSink | None = None,
        ops: OpSink | None = None,
    ) -> None:
        self.device = device
        self._model = model
        self._optimizer = optimizer
        self._logits = logits
        self._trace = trace
        self._ops = ops
        self._tracker: _LeanMemTracker | None = None
        self._grad_hooks: list[RemovableHandle] = []  # ModTracker's, registered in this step's forwards so far
        self._last_peak_snap: dict = {}
        self._last_peak_logits = 0

    @contextmanager
    def watching(self) -> Iterator[TrackerMeter]:
        # A fresh tracker per step: MemTracker refuses a second iteration of the same root module.
        self._tracker = _LeanMemTracker(self.device, self._logits, self._trace, self._ops)
        external: list[nn.Module | torch.optim.Optimizer] = [self._model]
        if self._optimizer is not None:  # MemTracker skips a None too; its stub takes none
            external.append(self._optimizer)
        self._tracker.track_external(*external)
        with warnings.catch_warnings(), _removing_mod_tracker_grad_hooks() as self._grad_hooks:
            # ModTracker warns when a module is already gone when its backward hook fires (seen
            # with tiny-bert), and when a module's forward starts while it still counts that module among
            # the parents ("The module hierarchy tracking maybe be messed up": a simulated step of tiny-llama
            # printed it at the top of `ckptlab simulate`); the device totals the lab reads do not depend on
            # per-module stats.
            warnings.filterwarnings("ignore", message="Module is None. Skipping P", category=UserWarning)
            warnings.filterwarnings("ignore", message="The module hierarchy tracking", category=UserWarning)
            with self._tracker:
                self._tracker.take_region_peak()
                yield self

    def _live(self) -> _LeanMemTracker:
        if self._tracker is None:
            raise RuntimeError("TrackerMeter read outside watching()")
        return self._tracker

    def current(self) -> int:
        return self._live().get_tracker_snapshot("current").get(self.device, {}).get(_TOTAL_KEY, 0)

    def take_peak(self) -> int:
        peak, self._last_peak_snap, self._last_peak_logits = self._live().take_region_peak()
        return peak

    def breakdown(self) -> dict[str, int]:
        return self._by_category(self._live().get_tracker_snapshot("current").get(self.device, {}))

    def peak_breakdown(self) -> dict[str, int]:
        return self._by_category(self._last_peak_snap)

    def next_micro_batch(self) -> None:
        # MemTracker refuses a module's second forward in one step ("does not support memory tracking for
        # multiple iterative calls") unless its per-module stats are cleared; the device totals and the
        # peaks the lab reads are kept.
        self._live().reset_mod_stats()
        # The last micro-batch's backward is over: its ModTracker hooks hold its graph's nodes in cycles (below), and
        # with a frozen embedding (LoRA) the embeddings' output is a leaf that requires grad, so its AccumulateGrad
        # node kept it and its .grad (2 x tokens x hidden x 4 B in float32) until the step's end. No run without
        # the tracker holds them (the CPU allocator's events, torch.profiler's profile_memory: issue 62), so the
        # hooks go now.
        _remove_all(self._grad_hooks)

    def peak_logits(self) -> int | None:
        return self._last_peak_logits if self._logits is not None else None

    def storage_names(self, tensor: torch.Tensor) -> list[int]:
        """The names a trace knows ``tensor``'s storages by (:class:`TraceSink`; the tracked ones)."""
        found = (self._live()._WINFO.get(storage) for storage in get_untyped_storages(tensor))
        return [id(entry[0]) for entry in found if entry is not None]

    def _by_category(self, snap: dict) -> dict[str, int]:
        state = optimizer_state_bytes(self._optimizer, self.device) if self._optimizer is not None else None
        return tracker_breakdown(snap, state)


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


def _remove_all(handles: list[RemovableHandle]) -> None:
    """Remove every hook of ``handles`` and empty the list (the one list ModTracker's registrations go on to)."""
    for handle in handles:
        handle.remove()
    handles.clear()


@contextmanager
def _removing_mod_tracker_grad_hooks() -> Iterator[list[RemovableHandle]]:
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
        _remove_all(handles)


class Clock(Protocol):
    """Marks points in a step and tells the seconds between two marks.

    A mark is the clock's own token (a float, a CUDA event): only the clock that made it reads it.
    """

    method: str

    def mark(self) -> Any: ...

    def seconds(self, start: Any, end: Any) -> float: ...


class CpuClock:
    method = CPU_TIME_METHOD

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start


class CudaClock:
    method = CUDA_TIME_METHOD

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        torch.cuda.synchronize(self.device)
        return start.elapsed_time(end) / 1000.0


def meter_for(
    model: nn.Module,
    device: torch.device,
    optimizer: torch.optim.Optimizer | None = None,
    logits: LogitsShape | None = None,
    trace: TraceSink | None = None,
    ops: OpSink | None = None,
) -> CudaMeter | TrackerMeter:
    """The memory meter the lab trusts on ``device``, counting ``model``'s tensors and ``optimizer``'s state (and,
    where it follows tensors, the float32 ``logits``; a ``trace`` is told every change, and ``ops`` every op, where
    the meter follows tensors)."""
    if device.type == "cuda":
        return CudaMeter(device, model, optimizer)
    return TrackerMeter(model, device, optimizer, logits, trace, ops)


def machine_load(
    getloadavg: Callable[[], tuple[float, float, float]] | None = None, cores: int | None = None
) -> tuple[float | None, int | None]:
    """(1-minute load average, CPU cores this process may use): what says a machine is too busy to time.

    A load average above the core count means more runnable tasks than cores: a timed step
    then waits its turn, and its time says more about the neighbours than about the step.
    Tests pass ``getloadavg`` and ``cores``; None where the platform has no load average.
    """
    read = getloadavg or getattr(os, "getloadavg", None)
    try:
        load = read()[0] if read is not None else None
    except OSError:
        load = None
    return load, usable_cores() if cores is None else cores


def clock_for(device: torch.device) -> CudaClock | CpuClock:
    """The clock the lab trusts on ``device``."""
    return CudaClock(device) if device.type == "cuda" else CpuClock()
