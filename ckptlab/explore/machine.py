"""This machine's speed, measured once: a CPU's matmul FLOP/s per dtype at a thread count, its memory bandwidth, and
the host time an op costs beside its arithmetic.

A time estimate before a run (:mod:`ckptlab.explore.step_time`: the roofline over a step's counted work) needs a
device's speed. On a GPU the speed is the datasheet's (:mod:`ckptlab.explore.gpus`); on the CPU no datasheet says
what torch reaches with this build, these cores and this many threads, so a short benchmark measures it: a few
1024 x 1024 matmuls per dtype (under a second), one large copy, and a few steps of a transformers model so narrow that
its arithmetic is nothing (:func:`host_op_seconds`: what an op costs the host in the forward, in autograd's
backward, and in a checkpointed layer's rerun, where the checkpoint's saved-tensor hooks run beside it). The answer
is kept in ``machine.json`` under the user's cache folder (``$XDG_CACHE_HOME/ckptlab``, else ``~/.cache/ckptlab``),
keyed by torch's version, the thread count and the CPU's model, so a process measures only what no earlier one did. Tests never measure: they hand in a speed
(:func:`use_speed`).

A speed measured while other work held the cores (a load average at or above them) is a neighbour's share, not
this CPU's: one such record, kept as it was, made every estimate on this machine 4-6x too long (14.9 GFLOP/s and
2.3 GB/s kept from a run at load 14, against 57-145 GFLOP/s measured idle). So a record says whether it was
``busy``; a busy one is measured again by the next process that reads it, and each figure keeps the fastest seen
(the least disturbed: a neighbour only ever slows a measurement), until one is measured on a machine that was not
busy.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..step.machine_load import machine_load
from ..torchstate import exclusive

MATMUL_SIZE = 1024  # large enough that a matmul runs at the BLAS kernel's speed, small enough for a few in < 1 s
MATMUL_TIME_S = 0.15  # per dtype: repeat the matmul until this much time has gone (at least twice)
COPY_BYTES = 64 * 2**20  # one copy of this many bytes, larger than a CPU's caches, for the memory bandwidth
# The host-time model: a Llama-family causal LM so narrow (hidden 16, 8 tokens) that its ops' arithmetic takes
# nanoseconds, so its step's time is the host's: transformers' Python, nn.Module calls, dispatch, autograd's engine,
# and with every layer checkpointed the checkpoint's hooks. Four layers, so the per-layer ops outnumber the rest.
HOST_MODEL: dict[str, Any] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
    "max_position_embeddings": 64,
}
HOST_TOKENS = 8
HOST_ROUNDS = 24  # timed steps of each setting (off, every layer checkpointed), alternated; the least is kept
HOST_PHASES = ("forward", "backward", "rerun")


@dataclass(frozen=True)
class HostStep:
    """One step of the host-time model: its forward (with the loss) and backward seconds, and its ops by phase
    (:data:`HOST_PHASES`) where they were counted."""

    forward_s: float
    backward_s: float
    ops: Mapping[str, int]


@dataclass(frozen=True)
class CpuSpeed:
    """What this CPU reached: matmul FLOP/s by dtype name ("float32", "bfloat16", ...) at ``threads`` torch threads,
    and its memory bandwidth (bytes a second, a copy's read and write; None where not measured)."""

    matmul_flops: Mapping[str, float] = field(default_factory=dict)
    memory_bandwidth: float | None = None
    threads: int = 1
    measured_at: str = ""  # ISO 8601, UTC, when the benchmark ran
    busy: bool = False  # measured with the load average at or above the cores: measured again by the next reader
    # Seconds of host time an op costs by phase (HOST_PHASES: "forward" issued by the model's Python, "backward" by
    # autograd's engine, "rerun" a checkpointed layer's op with the checkpoint's own cost); empty where not measured.
    host_op_s: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The record as JSON values."""
        return {
            "matmul_flops": dict(self.matmul_flops),
            "memory_bandwidth": self.memory_bandwidth,
            "host_op_s": dict(self.host_op_s),
            "threads": self.threads,
            "measured_at": self.measured_at,
            "busy": self.busy,
        }

    def fastest(self, other: CpuSpeed) -> CpuSpeed:
        """Each figure the faster of this record's and ``other``'s (a neighbour only slows a measurement), busy only
        where both were (one measurement on a machine that was not busy settles the record)."""
        flops = dict(self.matmul_flops)
        for dtype, value in other.matmul_flops.items():
            flops[dtype] = max(flops.get(dtype, 0.0), value)
        bandwidths = [b for b in (self.memory_bandwidth, other.memory_bandwidth) if b is not None]
        host = dict(self.host_op_s)
        for phase, seconds in other.host_op_s.items():  # the least host time seen: a neighbour only adds to it
            host[phase] = min(host.get(phase, seconds), seconds)
        return CpuSpeed(
            matmul_flops=MappingProxyType(flops),
            memory_bandwidth=max(bandwidths) if bandwidths else None,
            threads=other.threads,
            measured_at=other.measured_at,
            busy=self.busy and other.busy,
            host_op_s=MappingProxyType(host),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CpuSpeed:
        """The record :meth:`to_dict` wrote (a value that is not a number raises ``TypeError`` or ``ValueError``)."""
        flops = data.get("matmul_flops")
        flops = flops if isinstance(flops, Mapping) else {}
        bandwidth = data.get("memory_bandwidth")
        host = data.get("host_op_s")
        host = host if isinstance(host, Mapping) else {}
        return cls(
            matmul_flops=MappingProxyType({str(name): float(value) for name, value in flops.items()}),
            memory_bandwidth=None if bandwidth is None else float(str(bandwidth)),
            host_op_s=MappingProxyType({str(phase): float(value) for phase, value in host.items()}),
            threads=int(str(data.get("threads", 1))),
            measured_at=str(data.get("measured_at", "")),
            # A record written before the lab said so was measured on a machine of unknown load: measure again.
            busy=bool(data.get("busy", True)),
        )


def cache_path() -> Path:
    """Where the measured speeds are kept: ``$XDG_CACHE_HOME/ckptlab/machine.json``, else ``~/.cache/ckptlab/...``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "ckptlab" / "machine.json"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s on Linux), else what the platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(threads: int) -> str:
    """What a speed is kept under: torch's version, the thread count and the CPU's model (another of any is
    another speed)."""
    import torch

    return f"torch {torch.__version__} | {threads} threads | {cpu_model()}"


def matmul_flops(dtype: str, threads: int) -> float:
    """FLOP/s of a ``MATMUL_SIZE`` square matmul in ``dtype`` at ``threads`` torch threads: the best of a few
    (the least disturbed by the machine's other work), after one to warm the kernel up."""
    import torch

    size = MATMUL_SIZE
    a = torch.randn(size, size).to(getattr(torch, dtype))
    b = torch.randn(size, size).to(getattr(torch, dtype))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.mm(a[:512, :512], b[:512, :512])  # the kernel's first call (its dispatch, its packing buffers)
        best, spent, runs = float("inf"), 0.0, 0
        while runs < 2 or (spent < MATMUL_TIME_S and runs < 8):
            start = time.perf_counter()
            torch.mm(a, b)
            took = time.perf_counter() - start
            best, spent, runs = min(best, took), spent + took, runs + 1
    finally:
        torch.set_num_threads(before)
    return 2 * size**3 / best


def copy_bandwidth() -> float:
    """Bytes a second of one large copy (read and written: twice its size), the best of three."""
    import torch

    source = torch.empty(COPY_BYTES, dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)  # the pages touched once
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * COPY_BYTES / best


def host_model() -> tuple[Any, dict[str, Any]]:
    """:data:`HOST_MODEL` built with random weights (seeded), in training mode, and its batch as the lab's step
    builds one (``step.trainstep.random_batch``: tokens as labels, no KV cache) of :data:`HOST_TOKENS` tokens."""
    import torch
    import transformers

    from ..spec import RunSpec
    from ..step.trainstep import random_batch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**HOST_MODEL)).train()
    return model, random_batch(model, RunSpec(seq_len=HOST_TOKENS), torch.device("cpu"))


def host_step(model: Any, batch: Mapping[str, Any], checkpointed: bool, *, count: bool = False) -> HostStep:
    """One training step of ``model`` (no optimizer) with every layer checkpointed or none: its forward (with the
    loss) and backward seconds, and with ``count`` its ops by phase as the simulation counts them
    (``step.opcount.counted`` and the roofline's ``launches_kernel``; a backward op under the checkpoint's recompute
    is a rerun), the counting's own cost in the seconds then."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ..step.opcount import counted, recomputing
    from .roofline import launches_kernel

    class Counting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = dict.fromkeys(HOST_PHASES, 0)
            self.backward = False

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if counted(func) and launches_kernel(str(func)):
                phase = "forward" if not self.backward else "rerun" if recomputing() else "backward"
                self.ops[phase] += 1
            return func(*args, **(kwargs or {}))

    if checkpointed:
        model.activation_checkpointing_enable(every_n_layers=1)
    else:
        model.activation_checkpointing_disable()
    counting = Counting() if count else None
    with counting if counting is not None else contextlib.nullcontext():
        start = time.perf_counter()
        loss = model(**batch).loss
        middle = time.perf_counter()
        if counting is not None:
            counting.backward = True
        loss.backward()
        end = time.perf_counter()
    model.zero_grad(set_to_none=True)
    return HostStep(middle - start, end - middle, MappingProxyType(counting.ops) if counting else MappingProxyType({}))


def host_op_seconds() -> dict[str, float]:
    """Host seconds an op costs on this CPU at torch's current thread count, by phase: steps of :func:`host_model`
    with checkpointing off and with every layer checkpointed (:func:`host_step`), alternated, the least time of each
    kept (a neighbour only slows a step: under a load of 3.8 on 2 cores the median's rerun figure ranged 38-83 us
    over four tries, the least 32-38 us):

    - "forward": the off step's forward and loss time over its ops (the model's Python issues them);
    - "backward": the off step's backward time over its ops (autograd's engine issues them);
    - "rerun": what checkpointing every layer adds to the step, over the rerun's ops: the rerun itself and the
      checkpoint's hooks (every saved tensor packed in the forward, packed again in the recompute and unpacked in
      the backward), which a roofline of the ops alone leaves out (about three forward ops on this lab's CPU).
    """
    model, batch = host_model()
    # The first step of each counts the ops, and warms the kernels and transformers' caches up.
    off, every = (host_step(model, batch, checkpointed, count=True).ops for checkpointed in (False, True))
    steps: dict[bool, list[HostStep]] = {False: [], True: []}
    for _ in range(HOST_ROUNDS):
        for checkpointed in (False, True):
            steps[checkpointed].append(host_step(model, batch, checkpointed))
    whole = {ck: min(s.forward_s + s.backward_s for s in steps[ck]) for ck in steps}
    return {
        "forward": min(s.forward_s for s in steps[False]) / off["forward"],
        "backward": min(s.backward_s for s in steps[False]) / off["backward"],
        "rerun": max(whole[True] - whole[False], 0.0) / max(every["rerun"], 1),
    }


@exclusive  # torch's thread count is process-wide: no step may run while the benchmark sets it
def measure_speed(dtypes: tuple[str, ...], threads: int) -> CpuSpeed:
    """This CPU's speed for ``dtypes`` at ``threads`` threads, measured now (under a second a dtype, and about a
    second for the host's costs), and whether other work held the cores meanwhile (the load average at or above
    them, before or after)."""
    import torch

    flops = MappingProxyType({dtype: matmul_flops(dtype, threads) for dtype in dtypes})
    bandwidth = copy_bandwidth()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        host = MappingProxyType(host_op_seconds())
    finally:
        torch.set_num_threads(before)
    return CpuSpeed(
        matmul_flops=flops,
        memory_bandwidth=bandwidth,
        threads=threads,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        busy=machine_busy(),
        host_op_s=host,
    )


def machine_busy() -> bool:
    """Whether the 1-minute load average is at or above the cores this process may use (unknown load: busy)."""
    load, cores = machine_load()
    return load is None or cores is None or load >= cores


_LOCK = threading.Lock()
_KNOWN: dict[str, CpuSpeed] = {}  # this process's speeds by machine_key: read or measured once
_GIVEN: list[CpuSpeed] = []  # a speed handed in (use_speed): read instead of any measured one


def use_speed(speed: CpuSpeed | None) -> None:
    """Take ``speed`` as this machine's for every thread count (a test's, never measured), or None to measure."""
    with _LOCK:
        _GIVEN[:] = [] if speed is None else [speed]


def _read_cache(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or a file another version left unreadable: measure again
        return {}
    return data if isinstance(data, dict) else {}


def cpu_speed(dtype: str, threads: int) -> CpuSpeed:
    """This CPU's speed at ``threads`` threads, with ``dtype``'s matmul in it: the speed handed in, else the one
    this process or an earlier one measured (``machine.json``), else measured now and kept there; a record measured
    on a busy machine is measured again once a process, and each figure keeps the fastest seen."""
    key = machine_key(threads)
    with _LOCK:
        if _GIVEN:
            return _GIVEN[0]
        known = _KNOWN.get(key)
        if known is None:
            try:
                known = CpuSpeed.from_dict(_read_cache(cache_path()).get(key) or {})  # type: ignore[arg-type]
            except (TypeError, ValueError):
                known = CpuSpeed(threads=threads)
        if key not in _KNOWN and known.busy and known.matmul_flops:  # this process's first read of a busy record
            known = known.fastest(measure_speed(tuple(known.matmul_flops), threads))
            _write_cache(key, known)
        if dtype not in known.matmul_flops or known.memory_bandwidth is None or not known.host_op_s:
            known = known.fastest(measure_speed((dtype,), threads))
            _write_cache(key, known)
        _KNOWN[key] = known
        return known


def _write_cache(key: str, speed: CpuSpeed) -> None:
    """Keep ``speed`` under ``key`` in ``machine.json`` (written whole, then renamed: a reader never sees half)."""
    path = cache_path()
    data = _read_cache(path)
    data[key] = speed.to_dict()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        partial.replace(path)
    except OSError:  # a read-only home: the speed is still this process's for its life
        pass
