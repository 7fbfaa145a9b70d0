"""Checkpointing under FSDP2 across ranks: the sharding, and the measured step each rank runs.

Every rank is a process started by torch's own launcher (``torch.distributed.run``, i.e.
``torchrun``; ``python -m ckptlab run --nproc-per-node N --fsdp`` starts it). Each rank

1. joins the process group the launcher describes (gloo on the CPU, NCCL on CUDA), with a
   timeout on every collective, so that no rank waits forever on one that has died;
2. builds the same model (the spec's seed), enables checkpointing with transformers' own
   ``activation_checkpointing_enable``, and shards it with FSDP2's ``fully_shard``: every
   decoder layer, then the root, as torchtitan and accelerate do;
3. runs the lab's measured step (:func:`ckptlab.step.measure.measure`: forward, backward,
   optimizer step, the probe and the meters) on its own batch (seed + rank);
4. sends its memory, time and per-layer rows to rank 0 (``dist.gather_object``).

A rank that fails raises; the launcher sees it exit and ends the others (its own failure
handling), and the collective timeout is the backstop. The lab spawns no process and
writes no collective of its own.

The simulated counterpart (fake tensors, a fake process group, up to 1024 ranks) is
``ckptlab.step.fake_pg``; both shard with :func:`shard_model`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import cast

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # FSDP2's interface for a custom comm
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllocMixin

from ..errors import CkptlabError, Command, Option, SpecError
from ..fact import Fact
from ..model.plan import checkpointable_layers
from ..model.selective import enable_checkpointing
from ..results import RankResult, RunResult
from ..spec import RunSpec
from ..torchstate import launched
from .measure import measure
from .preflight import load_model, resolve_device
from .stopping import Progress
from .training import MIXED_PRECISION_DTYPES

COLLECTIVE_TIMEOUT_S = 120  # a collective that waits longer raises: the backstop when a rank dies silently
# A test hook: the collective timeout in seconds, raised so far that a test waiting for the launcher to end a
# rank cannot mistake the backstop for it (tests/cli/test_fsdp_cli.py).
COLLECTIVE_TIMEOUT_ENV = "CKPTLAB_COLLECTIVE_TIMEOUT_S"
FAIL_ON_RANK_ENV = "CKPTLAB_FAIL_ON_RANK"  # a test hook: that rank fails just before its first step


def _collective_timeout_s() -> float:
    return float(os.environ.get(COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S))


class RankFailedError(CkptlabError):
    """A rank could not run its step (it did not fit, or a failure on that rank); the launcher ends the rest."""


def mixed_precision_policy(spec: RunSpec) -> MixedPrecisionPolicy | None:
    """FSDP2's mixed precision for ``spec``: 16-bit all-gathered parameters, float32 gradient reduction; None without.

    The reason the lab casts this way across ranks, and not with autocast: ``RunSpec.mixed_precision_via``.
    """
    if spec.mixed_precision_via != "fsdp2":
        return None
    return MixedPrecisionPolicy(param_dtype=MIXED_PRECISION_DTYPES[spec.mixed_precision], reduce_dtype=torch.float32)


def shard_model(model: nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy | None = None) -> None:
    """Shard ``model`` with FSDP2 in place: each checkpointable (decoder) layer, then the root.

    Each layer is then one all-gather in the forward (and again for a checkpointed layer's rerun)
    and one reduce-scatter in the backward; the root holds the embeddings, the final norm and the head.
    With ``mp_policy`` (:func:`mixed_precision_policy`) the shards stay in their dtype (float32 master
    weights) and what is all-gathered, and computed with, is the policy's ``param_dtype``.
    """
    policy = mp_policy or MixedPrecisionPolicy()  # fully_shard's own default: no casting
    for layer in checkpointable_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


class InPlaceReduceScatter(DefaultAllocMixin, ReduceScatter):  # FSDP2's own buffers
    """FSDP2's reduce-scatter for gloo ranks that holds what NCCL's holds: the input and this rank's output.

    gloo has no reduce-scatter of its own: ``ProcessGroupGloo::reduce_scatter_tensor_coalesced``
    clones the whole input, all-reduces the clone and copies this rank's chunk out. Measured on 2
    gloo ranks, that clone (a float32 copy of a unit's gradients) was the peak's only difference from
    the simulation, whose fake process group stands for NCCL: +12,584,448 B of temporaries on
    tiny-llama, +8,389,632 B on tiny-qwen3. This one all-reduces FSDP2's own input buffer in place (a
    scratch buffer FSDP2 drops right after) and copies this rank's chunk into the output, so gloo
    ranks hold what the GPU ranks the lab stands for hold. Installed with FSDP2's own hook,
    ``FSDPModule.set_custom_reduce_scatter``, on gloo ranks only.
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: object,
        async_op: bool = False,
    ) -> None:
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):  # FSDP2 asks for these unless a divide factor is set
            raise NotImplementedError(f"the gloo ranks' reduce-scatter sums or averages, not {op}")
        dist.all_reduce(input_tensor, op=dist.ReduceOp.SUM, group=group)
        output_tensor.copy_(input_tensor.chunk(group.size())[group.rank()])
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(group.size())


def reduce_scatter_in_place(model: nn.Module) -> None:
    """Every FSDP2 unit of ``model`` reduce-scatters with :class:`InPlaceReduceScatter` (gloo ranks)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(InPlaceReduceScatter())


def backend_for(device: torch.device) -> str:
    """The collective backend for ``device``: NCCL on CUDA, gloo on the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


@contextmanager
def launched_group(device_name: str) -> Iterator[torch.device]:
    """The process group torch's launcher describes (env://): joined here and left at the end, or the caller's.

    A process that runs several steps across ranks initializes the group once itself (as a training
    script does) and this uses it: re-initializing a gloo group in the same launched process reuses
    the launcher's store keys and can hang in gloo's connectFullMesh until the timeout.

    Yields:
        This rank's device (its own GPU on CUDA, from ``LOCAL_RANK``).

    Raises:
        SpecError: outside a launched process, with no process group of the caller's.
    """
    if not launched() and not dist.is_initialized():
        raise SpecError(
            key="api.measure_ranks_not_launched",
            launch=Command("measure", (Option("world_size", 2), Option("fsdp", True))),
        )
    wants_cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if wants_cuda and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = resolve_device(device_name)
    if dist.is_initialized():
        yield device
        return
    dist.init_process_group(backend_for(device), timeout=timedelta(seconds=_collective_timeout_s()))
    try:
        yield device
    finally:
        dist.destroy_process_group()


def measure_ranks(spec: RunSpec, *, progress: Progress | None = None) -> RunResult | None:
    """Run ``spec`` sharded with FSDP2 on this rank of a launched group, and gather every rank's figures.

    Call it in every process the launcher started. ``spec.world_size`` and ``spec.fsdp`` are
    taken from the group (the group's size, sharding on).

    Returns:
        On rank 0: rank 0's :class:`RunResult` with ``ranks`` holding every rank's memory, time
        and layers, and notes where the ranks disagree. On the other ranks: None.

    Raises:
        SpecError, ModelLoadError, DoesNotFitError: for bad input, on every rank alike.
        RankFailedError: when this rank's step did not fit or failed.
    """
    with launched_group(spec.device) as device:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        spec = replace(spec, world_size=world_size, fsdp=True)
        model, info = load_model(spec)  # the spec's seed on every rank: the same weights everywhere
        model.train()
        if spec.every_n_layers is not None:  # spec.checkpointing
            # Before sharding, as a training script does; measure() enables it again, harmlessly.
            enable_checkpointing(model, spec.every_n_layers, False, spec.selective)
        shard_model(model, init_device_mesh(device.type, (world_size,)), mixed_precision_policy(spec))
        if backend_for(device) == "gloo":
            reduce_scatter_in_place(model)
        if os.environ.get(FAIL_ON_RANK_ENV) == str(rank):
            raise RankFailedError(
                key="rank.injected_failure", rank=rank, world_size=world_size, variable=FAIL_ON_RANK_ENV
            )
        own_batch = replace(spec, seed=spec.seed + rank)  # each rank its own tokens; the weights stay the same
        result = measure(own_batch, model=model, info=info, progress=progress if rank == 0 else None)
        if result.status != "ok":
            # Its collectives are now out of step with the other ranks': end this rank, the launcher ends the rest.
            raise RankFailedError(key="rank.failed", rank=rank, world_size=world_size, message=result.message)
        own = RankResult(rank=rank, memory=result.memory, timing=result.timing, layers=result.layers)
        gathered: list[RankResult | None] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(own, gathered, dst=0)
        # The sharded model's hooks hold the device mesh, and through it the process group: free them here,
        # while the group and the interpreter are alive, not at the interpreter's exit, where tearing gloo's
        # worker threads down is not safe (pytorch/pytorch#179291). A guess at the rare rank abort seen in CI
        # ("terminate called without an active exception"), which was never reproduced here: see
        # tests/step/test_fsdp.py.
        del model
        gc.collect()
    if rank != 0:
        return None
    # On rank 0 gather_object has filled every slot with that rank's RankResult.
    ranks = sorted(cast("list[RankResult]", gathered), key=lambda row: row.rank)
    gloo = [_GLOO_REDUCE_SCATTER] if backend_for(device) == "gloo" else []
    notes = [*result.notes, _sharding_note(spec, device), *gloo, *_disagreements(ranks)]
    return replace(result, spec=spec, ranks=ranks, notes=notes)


_GLOO_REDUCE_SCATTER = Fact("note.gloo_reduce_scatter")


def _sharding_note(spec: RunSpec, device: torch.device) -> Fact:
    return Fact("note.fsdp_ranks", {"ranks": spec.world_size, "backend": backend_for(device)})


def _disagreements(ranks: list[RankResult]) -> list[Fact]:
    """Notes where a rank's CP / keep / rerun pattern differs from rank 0's (it must not)."""
    first = [layer.observed for layer in ranks[0].layers]
    notes: list[Fact] = []
    for row in ranks[1:]:
        observed = [layer.observed for layer in row.layers]
        if observed != first:
            notes.append(
                Fact("note.ranks_disagree", {"rank": row.rank, "observed": str(observed), "first": str(first)})
            )
    return notes
