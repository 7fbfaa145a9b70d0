"""How the lab reads memory on each device.

CUDA: the caching allocator's own statistics (``memory_allocated`` and
``max_memory_allocated`` after ``reset_peak_memory_stats``).

CPU: the CPU allocator keeps no statistics, and a process's RSS mixes in the Python
heap, the allocator's cache and the libraries. The lab uses torch's own
``torch.distributed._tools.mem_tracker.MemTracker`` instead of a home-made allocator
hook: it is maintained with torch, counts the bytes of every live tensor storage (the
same quantity the CUDA allocator counts, without its block rounding), understands
activation checkpointing, and breaks the total down into parameters, buffers,
gradients, activations and temporaries. It is a ``TorchDispatchMode`` that looks at every
operator, which slows a step down, so it runs on a separate, untimed step. The same
tracker accounts a simulated step on fake tensors (``ckptlab.simulate``). The lab's subclass of
it lives with torch's other private internals the lab uses, in :mod:`.torch_workarounds`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from ..results import CPU_MEMORY_METHOD, CUDA_MEMORY_METHOD
from .torch_workarounds import (
    TOTAL_KEY,
    LeanMemTracker,
    LogitsShape,
    OpSink,
    TraceSink,
    reftype_name,
    remove_all_hooks,
    removing_mod_tracker_grad_hooks,
)
from .training import gradient_bytes, optimizer_state_bytes, parameter_bytes

# Where the bytes of a step go, by one name everywhere (results, tables, figures, locales).
CATEGORIES = ("parameter", "buffer", "gradient", "optimizer_state", "activation", "temp")
HOST = "host"  # what a trace counts in host memory (a simulated offload's copies), apart from the device's
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


def tracker_breakdown(snap: dict, optimizer_state: int | None) -> dict[str, int]:
    """A MemTracker snapshot (its reference types -> bytes) in the lab's categories.

    MemTracker files every tensor made inside ``optimizer.step()`` as optimizer state, the step's
    temporaries too. The state itself is fixed once created (the warm-up did it): what exceeds
    ``optimizer_state`` (None: no optimizer) is temporaries.
    """
    named = {reftype_name(key): value for key, value in snap.items()}
    parts = {TRACKER_CATEGORIES.get(key, key): value for key, value in named.items() if key != TOTAL_KEY and value}
    excess = parts.get("optimizer_state", 0) - (optimizer_state or 0)
    if optimizer_state is not None and excess > 0:
        parts["optimizer_state"] = optimizer_state
        parts["temp"] = parts.get("temp", 0) + excess
    return {key: value for key, value in parts.items() if value}


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
        self._tracker: LeanMemTracker | None = None
        self._grad_hooks: list[RemovableHandle] = []  # ModTracker's, registered in this step's forwards so far
        self._last_peak_snap: dict = {}
        self._last_peak_logits = 0

    @contextmanager
    def watching(self) -> Iterator[TrackerMeter]:
        # A fresh tracker per step: MemTracker refuses a second iteration of the same root module.
        self._tracker = LeanMemTracker(self.device, self._logits, self._trace, self._ops)
        external: list[nn.Module | torch.optim.Optimizer] = [self._model]
        if self._optimizer is not None:  # MemTracker skips a None too; its stub takes none
            external.append(self._optimizer)
        self._tracker.track_external(*external)
        with warnings.catch_warnings(), removing_mod_tracker_grad_hooks() as self._grad_hooks:
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

    def _live(self) -> LeanMemTracker:
        if self._tracker is None:
            raise RuntimeError("TrackerMeter read outside watching()")
        return self._tracker

    def current(self) -> int:
        return self._live().get_tracker_snapshot("current").get(self.device, {}).get(TOTAL_KEY, 0)

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
        remove_all_hooks(self._grad_hooks)

    def peak_logits(self) -> int | None:
        return self._last_peak_logits if self._logits is not None else None

    def storage_names(self, tensor: torch.Tensor) -> list[int]:
        """The names a trace knows ``tensor``'s storages by (:class:`TraceSink`; the tracked ones)."""
        return self._live().storage_names(tensor)

    def _by_category(self, snap: dict) -> dict[str, int]:
        state = optimizer_state_bytes(self._optimizer, self.device) if self._optimizer is not None else None
        return tracker_breakdown(snap, state)


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
