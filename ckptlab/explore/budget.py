"""Memory budgets: a GPU of the list or a number of bytes, with the label the lab shows for it.

One home for the budget a person gives (the trade-offs page, the At-scale page, ``sweep --budget``,
``simulate --budget``): :data:`GPUS` and :func:`budget_bytes`; sizes written with units
("24GiB") are read by :func:`ckptlab.units.parse_size`.
"""

from __future__ import annotations

import re

from ..errors import SpecError
from ..units import GIB, mib, parse_size

_SIZE_WITH_UNIT = re.compile(
    r"\s*[-+]?[0-9]*\.?[0-9]+\s*[A-Za-z]+\s*"
)  # a number and a unit; a bare "24" is a GPU's name

# Memory each card is sold with, read as GiB (nvidia-smi shows a little less, e.g. 81,559 MiB
# on an H100 80GB, and the CUDA context takes a few hundred MiB outside torch's counts: the
# margin should cover both).
GPUS: dict[str, int] = {
    "H100 80 GB": 80 * GIB,
    "H200 141 GB": 141 * GIB,
    "A100 40 GB": 40 * GIB,
    "A100 80 GB": 80 * GIB,
    "L4 24 GB": 24 * GIB,
    "RTX 4090 24 GB": 24 * GIB,
}


def budget_bytes(budget: int | str) -> tuple[int, str]:
    """A budget in bytes and its label, from bytes or a name in :data:`GPUS`.

    A text with a unit ("230MiB", "40GiB") is a size (:func:`ckptlab.units.parse_size`), as ``--budget`` reads it.

    Raises:
        SpecError: an unknown GPU name or a budget that is not a positive number of bytes.
    """
    if isinstance(budget, str):
        if _SIZE_WITH_UNIT.fullmatch(budget):  # "230MiB", "40 GiB": a size, as the command line's --budget takes
            size = parse_size(budget, "budget")
            return size, f"{mib(size)} MiB"
        name = gpu_name(budget)
        return GPUS[name], name
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise SpecError(
            f"budget={budget!r} is not valid: give a positive number of bytes or a GPU name ({', '.join(GPUS)}).",
            key="budget.bad_budget",
            value=budget,
            gpus=", ".join(GPUS),
        )
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
    which = f"matches {', '.join(matches)}: say which" if matches else "is not in the list"
    raise SpecError(
        f"GPU {text!r} {which} ({', '.join(GPUS)}). Or give a budget in bytes.",
        key="budget.ambiguous_gpu" if matches else "budget.unknown_gpu",
        name=repr(text),
        matches=", ".join(matches),
        gpus=", ".join(GPUS),
    )


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower().replace("gb", "") if ch.isalnum())
