"""torch's process-wide state, and the one lock that serializes the core's use of it.

Some of what a training step depends on is kept by torch per process, not per thread:

- the default dtype: transformers' ``from_config`` / ``from_pretrained`` set it with
  ``torch.set_default_dtype`` while they build a model (bfloat16 for a bf16 config) and set it
  back after; a float32 step in another thread that creates a tensor meanwhile gets bfloat16
  ("expected m1 and m2 to have the same dtype");
- the global module hooks: MemTracker's ModTracker registers forward and backward hooks on
  *every* module of the process (``register_module_forward_pre_hook``), so two tracked steps
  at once see each other's modules ("The Module hierarchy tracking is wrong", a ``KeyError``
  on a weak reference to another thread's ``Embedding``);
- the global random generator (``torch.manual_seed``), which seeds a model's weights and a batch.

None of them can be made per thread from outside torch and transformers. So the core's entry
points that build a model or run a step (``build_on_meta``, ``build_model``, ``load_model``,
``measure``, ``simulate``, ``time_settings``, ``check_gradients``) hold :data:`TORCH_STATE`
for as long as they run: threads calling them at once (the app's sessions, a user's thread
pool) take turns and each gets the bytes it gets alone. Re-entrant, as they call each other.
A shared server does better than taking turns: it runs each job in a worker process of its
own (``ckptlab.lab.workers``), where this lock is never contended.

Nothing may wait for another thread while holding it (a device turn, a job's result): the
callers take their turn first and then call the core.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

TORCH_STATE = threading.RLock()  # serializes model building and steps: see the module's docstring

P = ParamSpec("P")
R = TypeVar("R")


def exclusive(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` run while holding :data:`TORCH_STATE` (looked up at each call, so a test can watch it)."""

    @functools.wraps(function)
    def holding(*args: P.args, **kwargs: P.kwargs) -> R:
        with TORCH_STATE:
            return function(*args, **kwargs)

    return holding


def launched() -> bool:
    """True in a process started by torch's launcher (torchrun sets these for every rank).

    Read from the environment only, so the CLI knows which path a ``run`` takes before it imports torch.
    """
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def pause_collection() -> None:
    """Stop the cyclic garbage collector until :func:`freeze_what_is_loaded` (a process that owns its interpreter:
    ``python -m ckptlab``, before it imports anything of the lab).

    Importing torch and transformers makes several hundred thousand objects, and the collector, which starts a walk
    every 700 new ones, walked them about 1,050 times (8 of them full walks over everything made so far) to find next
    to nothing: 0.6-0.8 s of CPU a ``simulate`` process, more than a tenth of it (issue 61). What the imports leave
    unreachable with the collector paused (9,240 objects, 7.0 MB by ``sys.getsizeof``, after a ``simulate``'s
    imports) is frozen with the rest and kept. A command that runs no step after its imports (``models``, bad input,
    ``--help``, ``run``'s launcher waiting on its ranks) ends with the collector still paused.
    """
    gc.disable()


def freeze_what_is_loaded() -> None:
    """Take the objects alive now (torch's, transformers' and ckptlab's modules) out of the collector's walks, and
    collect again from here on (after :func:`pause_collection`, the collector was off during the imports).

    Every observed step starts with a full ``gc.collect()`` (``observe_memory``: a CUDA meter must
    not count tensors that only a reference cycle still holds), and with torch and transformers
    loaded a full collection walks their several hundred thousand objects: 0.2 s a step, a quarter
    of a simulation of qwen3-8b. Frozen (``gc.freeze``), they are never walked again; what is made
    later still is. Only a process that owns its interpreter calls this, once, after its imports
    (the CLI's commands, the app's job workers): the library never does, as whatever is alive at
    that moment is never collected.

    No collection first: after a ``simulate`` process's imports a full ``gc.collect()`` walked
    347,000 objects and found none unreachable: 0.15 s of CPU a process for nothing (issue 61).
    Whatever cycles imports might leave are frozen with them: a few objects kept, never a walk.
    """
    gc.freeze()
    gc.enable()  # every step after this is collected as before (each observed step's own full collection included)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform says it, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadPlan:
    """How the cores are shared: one device worker, and a bounded pool of CPU-heavy (simulation) workers."""

    device_threads: int  # torch threads of what measures (the app's device worker, `run`, `measure`)
    simulation_workers: int  # simulations that may run at once
    simulation_threads: int  # torch threads of each simulation worker


def thread_plan(cores: int | None = None) -> ThreadPlan:
    """Half the cores to the measured run, the other half to simulations, at least one thread each: the one rule of
    how many torch threads measure on a shared machine (the app's workers, ``run`` and ``measure``).

    Two cores: one thread measures, one simulation at a time on the other. Sixteen: 8 threads
    measure, 4 simulations of 2 threads each. The sum is the core count (at least 2).
    """
    cores = max(1, int(usable_cores() if cores is None else cores))
    device = max(1, cores // 2)
    rest = max(1, cores - device)
    workers = max(1, rest // 2)
    return ThreadPlan(device, workers, max(1, rest // workers))


def measuring_thread_count() -> int:
    """The torch threads a measured step of this process runs with (:func:`measuring_threads`): its own count, at
    most :func:`thread_plan`'s ``device_threads``. A time estimate before a run reads the machine's speed at it."""
    import torch

    return min(torch.get_num_threads(), thread_plan().device_threads)


@contextmanager
def measuring_threads() -> Iterator[int]:
    """torch's intra-op threads at most :func:`thread_plan`'s ``device_threads`` for the block, and put back after.

    torch's default is one thread a core: on a shared 2-core machine two threads made each step wait for the
    neighbours' tasks (3-11x slower under load; issue 61), where one thread left the other core to them. A measured
    step takes the cores the app's device worker takes; a process that set fewer (a test worker's share of the
    cores, a user's choice) keeps its own. Yields the thread count.
    """
    import torch  # only a measured step gets here, with torch already imported

    before = torch.get_num_threads()
    threads = measuring_thread_count()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)
