"""Units, in one place: bytes and seconds into the numbers and words the front ends show.

MiB = 2**20 bytes (public tables write it as "MB"); GiB = 2**30 bytes. The core counts
bytes and seconds; only the edges (report, figures, pages, the command line) divide.
"""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30


def mib(num_bytes: float) -> str:
    """Bytes as MiB with one decimal, e.g. ``"194.1"``."""
    return f"{num_bytes / MIB:,.1f}"


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"
