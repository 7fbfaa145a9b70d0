"""A fake process group: FSDP2 at real world sizes in one process, with no GPU and no peers.

``torch.testing._internal.distributed.fake_pg`` registers a backend "fake" whose collectives
return at once without moving data; with fake tensors (``ckptlab.step.simulate``) FSDP2
allocates exactly what rank 0 of an N-rank run allocates: its shards, the all-gather and
reduce-scatter buffers, the unsharded parameters of the layer at work. Two findings shape it:

- the device mesh is made **outside** ``FakeTensorMode``: inside it, ``init_device_mesh``
  fails on a data-dependent ``.item()``;
- the default process group is one per process: a simulation may not run beside a real
  group (a launched rank), and two simulations across ranks take turns (the app's threads).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from ..errors import SpecError
from ..spec import RunSpec

_ONE_GROUP_AT_A_TIME = threading.Lock()


@contextmanager
def fake_mesh(spec: RunSpec) -> Iterator[DeviceMesh | None]:
    """A 1-D mesh of ``spec.world_size`` fake ranks, this process rank 0; None when the spec does not shard.

    The process group is destroyed on the way out, whatever happens inside.

    Raises:
        SpecError: when this process already has a (real) process group.
    """
    if not spec.fsdp:
        yield None
        return
    with _ONE_GROUP_AT_A_TIME:
        if dist.is_initialized():
            raise SpecError(
                key="api.simulate_in_process_group",
                ranks=spec.world_size,
                backend=dist.get_backend(),
                size=dist.get_world_size(),
            )
        dist.init_process_group("fake", rank=0, world_size=spec.world_size, store=FakeStore())
        try:
            yield init_device_mesh("cpu", (spec.world_size,))
        finally:
            dist.destroy_process_group()
