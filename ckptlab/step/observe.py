"""Observe one training step of a loop the lab does not run: someone's own ``Trainer`` or script.

:func:`~ckptlab.step.measure.observe_memory` runs the step itself. Here the caller's loop
runs it, and the lab only attaches what it measures with: the :class:`LayerProbe` on the
checkpointable layers, the device's memory meter (``meter_for``) and a :class:`StepRecorder`
that follows the meter across the probe's events. The phases a measured step sets by hand
are set by hooks instead:

- a forward pre-hook on the model starts (each micro-batch's) forward;
- a gradient hook on the loss the model returns starts the backward: the first gradient of a
  backward is the loss's own, so memory read there is what the forward left for the backward
  (the resident figure of :class:`~ckptlab.results.MemoryResult`);
- the caller says when the optimizer step starts (:meth:`StepObserver.optimizer_phase`).

:meth:`StepObserver.finish` removes every hook and hands back the same per-layer counts and
memory figures a measured step has, so that a Trainer's step and ``ckptlab.measure`` of the
same setting can be put side by side.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
import torch.nn as nn

from ..model.plan import checkpointable_layers
from ..results import OBSERVED_MEMORY_METHOD, MemoryResult
from .memory_meters import meter_for
from .probe import LayerCounts, LayerProbe, StepRecorder
from .training import model_device, optimizer_state_bytes


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer behind a wrapper (accelerate's ``AcceleratedOptimizer`` keeps it in ``.optimizer``)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return inner if isinstance(inner, torch.optim.Optimizer) else None


def loss_of(output: Any) -> torch.Tensor | None:
    """The tensor the backward will start from: the output's ``loss``, else its first tensor that needs a gradient."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else [output]
    return next((v for v in values if isinstance(v, torch.Tensor) and v.requires_grad), None)


class StepObserver:
    """The lab's probe and memory meter on a model, for one step that another loop runs.

    Usage::

        observer = StepObserver(model, optimizer)
        observer.begin()              # before the step's first forward
        ...                           # the loop's forward(s) and backward(s)
        observer.optimizer_phase()    # before optimizer.step()
        ...
        counts, memory = observer.finish()   # after the step; every hook is gone

    A forward that raises (out of memory, offload without an accelerator) takes the meter and the
    probe off at once: the loop's exception then leaves no dispatch mode or layer hook behind.
    Only the inert hook that noticed it stays on the model until :meth:`detach` (torch cannot
    remove a module's hook while it runs that module's hooks).

    Args:
        model: the model the loop trains (a transformers model, or a wrapper such as a PEFT model).
        optimizer: the loop's optimizer, so that its state is counted (a wrapper is unwrapped).
        on_failure: called with the error when the step's forward raised and the observer let go.
    """

    def __init__(
        self, model: nn.Module, optimizer: Any = None, on_failure: Callable[[BaseException], None] | None = None
    ) -> None:
        self.model = model
        self.optimizer = inner_optimizer(optimizer)
        self.device = model_device(model)
        self.layers = checkpointable_layers(model)
        self.micro_batches = 0  # forwards seen in the step (gradient accumulation runs several)
        self.on_failure = on_failure
        self.failed: BaseException | None = None  # the error of a forward that raised while observed
        self._stack: ExitStack | None = None
        self._top_hooks: list[Any] = []  # on the model itself: removed by detach() only
        self._probe: LayerProbe | None = None
        self._recorder: StepRecorder | None = None
        self._meter: Any = None
        self._baseline = 0
        self._resident: dict[str, Any] = {}
        self._state_before = 0

    @property
    def attached(self) -> bool:
        return self._stack is not None

    def begin(self) -> None:
        """Attach the meter, the probe and the phase hooks, and enter the step's forward."""
        gc.collect()
        self._state_before = optimizer_state_bytes(self.optimizer, self.device)
        stack = ExitStack()
        try:
            self._meter = meter_for(self.model, self.device, self.optimizer)
            stack.enter_context(self._meter.watching())
            self._baseline = self._meter.current()
            self._recorder = StepRecorder(self._meter)
            self._probe = LayerProbe(self.model, on_region=self._recorder, track_saved=True)
            stack.enter_context(self._probe.attached())
            self._top_hooks = [
                self.model.register_forward_pre_hook(self._forward_begins),
                self.model.register_forward_hook(self._forward_ends, always_call=True),  # a forward that raises too
            ]
        except BaseException:
            stack.close()
            self._remove_top_hooks()
            raise
        self._stack = stack
        self._probe.begin_step()

    def next_micro_batch(self) -> None:
        """The loop's next micro-batch of the same step is about to run its forward (Trainer's ``on_substep_end``).

        MemTracker refuses a module's second forward in one step unless its module stats are cleared first,
        and its own hooks run before any of the model's: so the loop must say so before the forward starts.
        """
        if self._probe is not None and self._meter is not None:
            self._meter.next_micro_batch()
            self._probe.begin_micro_batch(self._probe.micro_batch + 1)

    def optimizer_phase(self) -> None:
        """The backward is over; the optimizer's step starts."""
        if self._probe is not None:
            self._probe.set_phase("optimizer")

    def finish(self) -> tuple[list[LayerCounts], MemoryResult]:
        """End the step, remove every hook, and return the per-layer counts and the memory figures.

        Raises:
            RuntimeError: the step never reached a backward (nothing to report).
        """
        if self._probe is None or self._recorder is None:
            raise RuntimeError("StepObserver.finish() without begin()")
        self._probe.end_step()
        peak_point = self._recorder.finish()
        self.detach()
        if "bytes" not in self._resident or peak_point is None:
            raise RuntimeError("the observed step ran no backward through the model's output")
        memory = MemoryResult(
            # The meter's method is a measured run's, whose memory step is a step of its own; here it is the loop's.
            method=OBSERVED_MEMORY_METHOD,
            baseline_bytes=self._baseline,
            after_forward_bytes=self._resident["bytes"],
            peak_bytes=peak_point.region_peak_bytes,
            peak_where=peak_point.region,
            breakdown_after_forward=self._resident["breakdown"],
            breakdown_at_peak=peak_point.region_peak_breakdown,
            optimizer_state_bytes=optimizer_state_bytes(self.optimizer, self.device),
            timeline=list(self._recorder.timeline),
        )
        return self._probe.counts, memory

    @property
    def optimizer_state_created(self) -> bool:
        """The optimizer had no state before the step and has some now (AdamW's first ``step()``)."""
        return self._state_before == 0 and optimizer_state_bytes(self.optimizer, self.device) > 0

    def detach(self) -> None:
        """Remove every hook and stop the meter (safe to call twice, and after a failure)."""
        self._let_go()
        self._remove_top_hooks()

    def _let_go(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def _remove_top_hooks(self) -> None:
        hooks, self._top_hooks = self._top_hooks, []
        for handle in hooks:
            handle.remove()

    # -- the phase hooks ----------------------------------------------------------------------

    def _forward_begins(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.micro_batches += 1
        if self._probe is not None and self._probe.phase != "forward":
            # The next micro-batch of a loop that did not call next_micro_batch() (Trainer does).
            self._probe.begin_micro_batch(self._probe.micro_batch + 1)

    def _forward_ends(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        error = sys.exc_info()[1]  # set only when torch calls this hook because the forward raised
        if output is None and error is not None:
            self._forward_failed(error)
            return
        loss = loss_of(output)
        if loss is not None and self._stack is not None:
            handle = loss.register_hook(self._backward_begins)
            self._stack.callback(handle.remove)

    def _forward_failed(self, error: BaseException) -> None:
        if self._stack is None:
            return
        self.failed = error
        self._probe = None
        self._let_go()
        pre_hook = self._top_hooks.pop(0)  # safe: torch is running the model's forward hooks, not its pre-hooks
        pre_hook.remove()
        if self.on_failure is not None:
            self.on_failure(error)

    def _backward_begins(self, grad: torch.Tensor) -> None:
        if self._probe is None or self._probe.phase == "backward":
            return
        if "bytes" not in self._resident:  # the first micro-batch's: what one forward leaves for its backward
            self._resident["bytes"] = self._meter.current() - self._baseline
            self._resident["breakdown"] = self._meter.breakdown()
        self._probe.set_phase("backward")
