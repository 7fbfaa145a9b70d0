"""The work a step does, op by op: FLOPs and bytes moved, tagged by phase and layer (issue 59's counts).

The simulated step already dispatches every aten op of a training step (reruns included) through the lab's
MemTracker; the counts are taken there, in the same pass, and turned into time elsewhere
(``explore/roofline``: a GPU's speed is an explore-level fact, the work is the step's).

This module holds the typed record both sides agree on (``ckptlab.step.work`` re-exports it, and a
:class:`~ckptlab.results.RunResult` carries it: results sit below the step). Ops with the same name, dtype, FLOPs and bytes in the
same phase and layer are one :class:`WorkItem` with a count, so a step of thousands of ops stays a few hundred
records, and the fold repeats a layer's items as it repeats its bytes (a layer's counts are exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The phases of a step, in the order a step runs them. "offload" is a checkpointed layer's input copied to the
# host and back (transformers' save_on_cpu, on the compute stream); "collective" is FSDP2's all-gathers and
# reduce-scatters; a rerun is a checkpointed layer's forward run again inside the backward.
PHASES = ("forward", "loss", "backward", "rerun", "optimizer", "offload", "collective")


@dataclass(frozen=True)
class OpCost:
    """One op's work: its aten name, the dtype it computes in, its FLOPs and the bytes it reads and writes."""

    op: str  # e.g. "aten.mm.default"
    dtype: str  # "bfloat16", "float32", ... (torch's name without "torch."); a matmul's inputs' dtype
    flops: int  # torch.utils.flop_counter's formula (or the lab's own where torch has none); 0 if it has none
    bytes: int  # inputs read plus outputs written (torch.utils._runtime_estimation.get_num_bytes's rule)


@dataclass(frozen=True)
class WorkItem:
    """``count`` ops of one cost, in one phase of one layer (``layer`` None: outside the decoder layers)."""

    phase: str  # one of PHASES
    layer: int | None
    cost: OpCost
    count: int


@dataclass(frozen=True)
class StepWork:
    """Every op of one step, grouped; the whole step's, the fold's repeats included."""

    items: tuple[WorkItem, ...]

    def flops(self, phase: str | None = None) -> int:
        """The step's FLOPs, or one phase's."""
        return sum(i.cost.flops * i.count for i in self.items if phase is None or i.phase == phase)

    def bytes(self, phase: str | None = None) -> int:
        """The bytes the step's ops read and write, or one phase's."""
        return sum(i.cost.bytes * i.count for i in self.items if phase is None or i.phase == phase)

    def kernels(self, phase: str | None = None) -> int:
        """How many ops (kernel launches on a GPU) the step runs, or one phase."""
        return sum(i.count for i in self.items if phase is None or i.phase == phase)

    def layers(self) -> list[int | None]:
        """The layers the step's items name, None (outside the decoder layers) first, then in order."""
        found = {item.layer for item in self.items}
        return ([None] if None in found else []) + sorted(layer for layer in found if layer is not None)

    def summary(self) -> dict[str, Any]:
        """A compact summary for JSON: FLOPs, bytes and kernels per phase, and per layer and phase.

        Not every item: a step of an 8B model has a few hundred, the same in every layer, and a reader (or a chart)
        asks for totals; the typed items stay on the result for the Python API and the roofline.
        """

        def figures(items: list[WorkItem]) -> dict[str, dict[str, int]]:
            sub = StepWork(tuple(items))
            phases = [phase for phase in PHASES if any(item.phase == phase for item in items)]
            return {
                "flops": {phase: sub.flops(phase) for phase in phases},
                "bytes": {phase: sub.bytes(phase) for phase in phases},
                "kernels": {phase: sub.kernels(phase) for phase in phases},
            }

        return {
            **figures(list(self.items)),
            "by_layer": [
                {"layer": layer, **figures([item for item in self.items if item.layer == layer])}
                for layer in self.layers()
            ],
        }
