"""Memory budgets: a GPU of the list or a number of bytes, with the label the lab shows for it.

One home for the budget a person gives (the trade-offs page, the At-scale page, ``sweep --budget``,
``simulate --budget``): :data:`GPUS` and :func:`budget_bytes`; sizes written with units
("24GiB") are read by :func:`ckptlab.units.parse_size`.

And the one home of "does this peak fit that budget": :func:`fit` decides it, with its margin and the
thin-margin warning (:class:`Fit`); :func:`fits` asks it of a result. The recommendation, its advice, the
At-scale table, the GPU search, the CLI and the pages all ask these two; ``tests/explore/test_fit_rule.py``
scans the sources so that a second comparison against a budget cannot come back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import SpecError, check_at_most
from ..fact import Fact
from ..units import GIB, mib, parse_size
from .gpus import GPU_SPECS

_SIZE_WITH_UNIT = re.compile(
    r"\s*[-+]?[0-9]*\.?[0-9]+\s*[A-Za-z]+\s*"
)  # a number and a unit; a bare "24" is a GPU's name

if TYPE_CHECKING:  # only for the annotation: the CLI imports this module before torch may load
    from ..results import RunResult
    from ..results.allocations import DeviceTotal

# Memory each card is sold with, read as GiB, from the one GPU table (:mod:`ckptlab.explore.gpus`). nvidia-smi
# shows a little less (e.g. 81,559 MiB on an H100 80GB); the CUDA context and the allocator's cache are terms of the
# device total (:mod:`ckptlab.explore.device`) that the fit compares where there is one.
GPUS: dict[str, int] = {name: spec.memory_bytes for name, spec in GPU_SPECS.items()}


# The budget's bounds, the one home. Any budget a person gives (``simulate --budget``/``--budget-gib``, ``sweep
# --budget``, :func:`budget_bytes`) is at most MAX_BUDGET_GIB; a page's custom box (the At-scale page's, in GiB, and its
# link's ``gpu=24GiB``) offers BUDGET_BOX_GIB, its least and most.
MAX_BUDGET_GIB = 2**20  # a mebi-GiB (1 PiB): above any machine, and still a whole number of bytes
BUDGET_BOX_GIB = (0.01, 4096.0)


def budget_size(text: str, name: str) -> int:
    """A budget written as a size ("24GiB", "512MiB", bytes) in bytes: :func:`ckptlab.units.parse_size`'s reading,
    at most :data:`MAX_BUDGET_GIB`.

    Raises:
        SpecError: a text that is no size, or a size above the bound, naming ``name`` (``--budget``).
    """
    size = parse_size(text, name)
    check_at_most(name, size, MAX_BUDGET_GIB * GIB, Fact("bound.budget"))
    return size


def budget_bytes(budget: int | str) -> tuple[int, str]:
    """A budget in bytes and its label, from bytes or a name in :data:`GPUS`.

    A text with a unit ("230MiB", "40GiB") is a size (:func:`ckptlab.units.parse_size`), as ``--budget`` reads it.

    Raises:
        SpecError: an unknown GPU name or a budget that is not a positive number of bytes.
    """
    if isinstance(budget, str):
        if _SIZE_WITH_UNIT.fullmatch(budget):  # "230MiB", "40 GiB": a size, as the command line's --budget takes
            size = budget_size(budget, "budget")
            return size, f"{mib(size)} MiB"
        name = gpu_name(budget)
        return GPUS[name], name
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise SpecError(key="budget.bad_budget", value=budget, gpus=", ".join(GPUS))
    check_at_most("budget", budget, MAX_BUDGET_GIB * GIB, Fact("bound.budget"))
    return budget, f"{mib(budget)} MiB"


def gpu_name(text: str) -> str:
    """The :data:`GPUS` entry ``text`` names: exactly, or unambiguously ("H100", "a100-40gb", "4090").

    Raises:
        SpecError: no entry or more than one matches; the message lists them.
    """
    if text in GPUS:
        return text
    key = _squash(text)
    matches = [name for name in GPUS if key and key in _squash(name)]
    if len(matches) == 1:
        return matches[0]
    raise SpecError(
        key="budget.ambiguous_gpu" if matches else "budget.unknown_gpu",
        name=repr(text),
        matches=", ".join(matches),
        gpus=", ".join(GPUS),
    )


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower().replace("gb", "") if ch.isalnum())


# Of the budget: a fit with less than this to spare is said to be thin (what a device total does not model: the
# card's memory as nvidia-smi reads it, an estimated context, other processes).
THIN_MARGIN = 0.05


@dataclass(frozen=True)
class Fit:
    """Whether a peak fits a budget, by how much, and whether the margin is thin (:func:`fit` decides all three)."""

    peak_bytes: int  # what was compared: the device total where there is one, else the tensors' peak
    budget_bytes: int
    fits: bool  # the peak within the budget (equal fits)
    margin_bytes: int  # the budget minus the peak: negative by as much as it is short
    thin: bool  # it fits with less than THIN_MARGIN of the budget to spare
    # The terms compared, where the device total was (allocated: simulated; reserved: the allocator replayed;
    # cuBLAS; the CUDA context, measured or estimated; NCCL): what nvidia-smi will show.
    device: DeviceTotal | None = None

    @property
    def short_bytes(self) -> int:
        """By how much the peak is over the budget (the margin's other sign)."""
        return -self.margin_bytes


def fit(peak_bytes: int, budget_bytes: int, device: DeviceTotal | None = None) -> Fit:
    """The one rule: ``peak_bytes`` fits ``budget_bytes`` when it is at most the budget; thin below 5% to spare.

    With ``device`` (``ckptlab.explore.device.device_total``: the caching allocator replayed over the step, its
    workspaces, the CUDA context), its total is what is compared, not the tensors' peak: a step dies when the
    allocator cannot get one more segment, and the context takes its share of the card first. A bytes budget is
    judged the same way (the context then estimated): the tensors alone would call fitting what runs out.
    """
    compared = device.total_bytes if device is not None else peak_bytes
    margin = budget_bytes - compared
    fitting = margin >= 0 and (device is None or device.out_of_memory_at is None)
    return Fit(compared, budget_bytes, fitting, margin, fitting and margin < THIN_MARGIN * budget_bytes, device)


def fits(result: RunResult, budget_bytes: int) -> bool:
    """True when a result's peak (parameters, gradients, activations, temporaries) fits ``budget_bytes``; where the
    result carries its device total (``RunResult.device_total``), that total is what must fit.

    A result without memory (a run that failed) fits nothing.
    """
    return result.memory is not None and fit(result.memory.peak_bytes, budget_bytes, result.device_total).fits
