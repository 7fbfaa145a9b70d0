"""How busy the machine is: whether a step timed now says more about the neighbours than about the step."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..torchstate import usable_cores


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
