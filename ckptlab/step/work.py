"""The typed record of a step's work, where the step's modules and the roofline (``explore/roofline``) import it.

Its one home is :mod:`ckptlab.results.work`: a :class:`~ckptlab.results.RunResult` carries it, and results sit below
the step in the layers (ARCHITECTURE.md).
"""

from __future__ import annotations

from ..results.work import PHASES, OpCost, StepWork, WorkItem

__all__ = ["PHASES", "OpCost", "StepWork", "WorkItem"]
