"""The gloo ranks' in-place reduce-scatter gives each rank the sum (or mean) of its chunk, as NCCL's does."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ckptlab.step.fsdp import InPlaceReduceScatter

pytestmark = pytest.mark.slow  # two processes

WORLD = 2


def _rank(rank: int, store_path: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    try:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            scratch = torch.arange(6, dtype=torch.float32) + 10 * rank  # rank 0: 0..5, rank 1: 10..15
            output = torch.empty(3)
            InPlaceReduceScatter()(output, scratch, dist.group.WORLD, op)
            out[rank, str(op)] = output.tolist()
        with pytest.raises(NotImplementedError, match="sums or averages"):
            InPlaceReduceScatter()(torch.empty(3), torch.zeros(6), dist.group.WORLD, dist.ReduceOp.MAX)
    finally:
        dist.destroy_process_group()


def test_each_rank_gets_the_reduced_chunk_it_owns(tmp_path):
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(str(tmp_path / "store"), out), nprocs=WORLD, join=True)
        got = dict(out)
    summed = [10 + 2 * i for i in range(6)]  # (i) + (i + 10)
    assert got[0, str(dist.ReduceOp.SUM)] == summed[:3] and got[1, str(dist.ReduceOp.SUM)] == summed[3:]
    assert got[0, str(dist.ReduceOp.AVG)] == [v / 2 for v in summed[:3]]
    assert got[1, str(dist.ReduceOp.AVG)] == [v / 2 for v in summed[3:]]
