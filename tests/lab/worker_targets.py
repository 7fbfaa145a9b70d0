"""Jobs the worker-pool tests run in a worker process (importable there: spawn children get the parent's sys.path)."""

from __future__ import annotations

import os

from ckptlab.lab.workers import JobContext


def hold(context: JobContext, allocate_mib: int = 0) -> str:
    """Hold ``allocate_mib`` MiB (every page touched, so it is resident) until stopped: only a Stop or a kill ends it."""
    held = bytearray(allocate_mib * 2**20)
    for index in range(0, len(held), 4096):
        held[index] = 1
    context.progress(str(os.getpid()), 0.5)  # the test that kills a worker finds it so
    while not context.wait_cancelled(1.0):
        pass
    return "stopped"


def fail(context: JobContext, error: Exception) -> None:
    """Raise ``error`` in the worker: how a test sees an error cross the process boundary."""
    raise error


def turns(context: JobContext, labels: list[str]) -> list[str]:
    """Take one device turn per label, reporting each inside it."""
    for label in labels:
        with context.turn(label):
            context.progress(label, 0.5)
    return labels


def threads(context: JobContext) -> int:
    """The worker's torch threads."""
    import torch

    return torch.get_num_threads()


def pid(context: JobContext) -> int:
    return os.getpid()


def frozen_torch_module(context: JobContext) -> bool:
    """Whether the worker froze what its warm imports loaded (torch's module among it) before this job."""
    import gc

    import torch

    walked = gc.get_objects()  # what a collection walks: the frozen objects are not among them
    return gc.get_freeze_count() > 0 and not any(obj is torch.__dict__ for obj in walked)


def hold_in_turn(context: JobContext) -> str:
    """Hold a device turn until stopped."""
    with context.turn("held"):
        return hold(context)


def hub_access(context: JobContext) -> tuple:
    """The worker's way to the Hub now (the parent's, sent with the job), the token included."""
    from ckptlab.model import hub

    access = hub.access()
    return (*access.stamp(), access.token)
