"""The order of a step's device allocations (issue 60): what torch's caching allocator would be asked, in order.

A trace is kept on a simulated result but not written to its JSON in full (a deep model's step is 100k events): the
JSON carries what the allocator's replay answers (``ckptlab.step.allocator``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Stream = Literal["compute", "host", "all_gather"]
COMPUTE: Stream = "compute"  # the step's own stream: the device allocator's pool
HOST_COPIES: Stream = "host"  # offload's copies in pinned host memory: never in the device's allocator
ALL_GATHER: Stream = "all_gather"  # FSDP2's all-gather stream: a pool of its own in the device's allocator

How = Literal["whole_step", "layers_repeated"]
WHOLE_STEP: How = "whole_step"  # every layer of the model was simulated and recorded
LAYERS_REPEATED: How = "layers_repeated"  # the middle layers' events repeated as the fold repeats their bytes


@dataclass(frozen=True)
class AllocationTrace:
    """A step's storages born and freed, in order.

    Attributes:
        sizes: the bytes each storage asked for (as the tensor's storage asks: before the allocator's rounding), by
            its ordinal (the order of births).
        streams: the stream each storage was made on, by ordinal.
        events: the step in order: ``a >= 0`` is the birth of storage ``a``, ``~a`` (negative) its free. A storage
            resized (FSDP2's ``resize_``) is a new birth and the old one's free, as the allocator sees it.
        how: whether the whole step was recorded or its middle layers repeated as the fold repeats them.
    """

    sizes: tuple[int, ...]
    streams: tuple[Stream, ...]
    events: tuple[int, ...]
    how: How

    def on(self, stream: Stream) -> list[tuple[bool, int]]:
        """The events of one ``stream`` as ``(is_alloc, value)``: an allocation's bytes, or a free's allocation number
        counted among that stream's allocations (what ``ckptlab.step.allocator.replay`` takes)."""
        renumbered: dict[int, int] = {}
        out: list[tuple[bool, int]] = []
        for event in self.events:
            ordinal = event if event >= 0 else ~event
            if self.streams[ordinal] != stream:
                continue
            if event >= 0:
                renumbered[ordinal] = len(renumbered)
                out.append((True, self.sizes[ordinal]))
            else:
                out.append((False, renumbered[ordinal]))
        return out
