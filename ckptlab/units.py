"""Units, in one place: bytes and seconds into the numbers and words the front ends show.

MiB = 2**20 bytes (public tables write it as "MB"); GiB = 2**30 bytes. The core counts
bytes and seconds; only the edges (report, figures, pages, the command line) divide.
"""

from __future__ import annotations

import re

from .errors import SpecError
from .fact import ENGLISH, UNIT_SPECS, Fact, localized

KIB = 2**10
MIB = 2**20
GIB = 2**30
# A template's unit specs (ckptlab.fact.UNIT_SPECS): bytes as GiB or MiB, a count in millions or billions, each with
# the one decimal (two for billions) the pages show.
UNIT_SPECS.update(
    {
        "gib": (GIB, ",.1f"),
        "gib0": (GIB, ",.0f"),
        "mib": (MIB, ",.1f"),
        "mib0": (MIB, ",.0f"),
        "millions": (1e6, ",.1f"),
        "billions": (1e9, ",.2f"),
    }
)


def parameter_count(count: int) -> Fact:
    """A number of parameters as every message says it: "8.03B" from a billion, else "494.0M" (``said.count.*``)."""
    return Fact("count.billions" if count >= 1e9 else "count.millions", {"count": count})


# Sizes as people write them: binary (KiB, MiB, GiB) and decimal (KB, MB, GB) units, or bytes.
SIZE_UNITS = {"": 1, "b": 1, "kib": KIB, "mib": MIB, "gib": GIB, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def mib(num_bytes: float, lang: str = ENGLISH) -> str:
    """Bytes as MiB with one decimal, e.g. ``"194.1"`` (``"1.234,5"`` in pt-BR: :func:`ckptlab.fact.localized`)."""
    return localized(f"{num_bytes / MIB:,.1f}", lang)


def milliseconds(seconds: float, lang: str = ENGLISH) -> str:
    return localized(f"{seconds * 1000:,.0f}", lang)


_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*")  # a number (no sign, no exponent) and a unit, or none


def size_in_bytes(text: str, unit: str = "") -> float | None:
    """The bytes ``text`` says: a number with a unit of :data:`SIZE_UNITS` (any case), a bare number in ``unit``'s
    (``""``: bytes; ``"gib"``: a page's box in GiB); None when it is not one. The one reading of a size, as it is
    written: 0 and, past float's range, inf come back as they are, for the caller's bounds (:func:`parse_size`'s, a
    page's clamp)."""
    match = _SIZE.fullmatch(text)
    written = (match.group(2) or unit).lower() if match else ""
    if not match or written not in SIZE_UNITS:
        return None
    return float(match.group(1)) * SIZE_UNITS[written]


def parse_size(text: str, name: str = "size") -> int:
    """``"24GiB"``, ``"512 MiB"``, ``"1000000"`` -> bytes (:func:`size_in_bytes`).

    Args:
        text: a positive number, with or without a unit of :data:`SIZE_UNITS` (any case), of at least one byte
            (a fraction of a byte beyond it is dropped).
        name: what the value is called where it was given (a flag such as ``--budget``), for the message.

    Raises:
        SpecError: naming the value and the accepted forms, or a size under one byte.
    """
    size = size_in_bytes(text)
    if size is None or not 0 < size < float("inf"):  # 400 digits parse as inf
        raise SpecError(key="spec.not_a_size", name=name, value=repr(text))
    if size < 1:  # "0.5" or "0.0001KiB": int() would make it a budget of 0 bytes, which nothing fits
        raise SpecError(key="spec.size_under_a_byte", name=name, value=repr(text), size=size)
    return int(size)
