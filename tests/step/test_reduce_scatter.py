"""The gloo ranks' in-place reduce-scatter gives each rank the sum (or mean) of its chunk, as NCCL's does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ckptlab.step.fsdp import InPlaceReduceScatter

pytestmark = pytest.mark.slow  # two processes

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2


def rank_main(rank: int, store: str, out: str) -> None:
    """One rank (run as ``python -c``): reduce-scatters a known tensor with SUM and AVG, writes what it got."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        got = {}
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            scratch = torch.arange(6, dtype=torch.float32) + 10 * rank  # rank 0: 0..5, rank 1: 10..15
            output = torch.empty(3)
            InPlaceReduceScatter()(output, scratch, dist.group.WORLD, op)
            got[str(op)] = output.tolist()
        try:
            InPlaceReduceScatter()(torch.empty(3), torch.zeros(6), dist.group.WORLD, dist.ReduceOp.MAX)
        except NotImplementedError as error:
            got["max"] = str(error)
        Path(out).write_text(json.dumps(got))
    finally:
        dist.destroy_process_group()


def test_each_rank_gets_the_reduced_chunk_it_owns(tmp_path):
    # Plain processes, not multiprocessing's spawn: spawn re-runs the parent's __main__, which an AppTest
    # earlier in the same pytest process may have left pointing at a page script.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    outs = [tmp_path / f"rank{rank}.json" for rank in range(WORLD)]
    code = (
        "import sys; from tests.step.test_reduce_scatter import rank_main; rank_main(int(sys.argv[1]), *sys.argv[2:])"
    )
    ranks = [
        subprocess.Popen([sys.executable, "-c", code, str(rank), str(tmp_path / "store"), str(out)], cwd=ROOT, env=env)
        for rank, out in enumerate(outs)
    ]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    got = [json.loads(out.read_text()) for out in outs]
    summed = [10 + 2 * i for i in range(6)]  # (i) + (i + 10)
    assert got[0][str(dist.ReduceOp.SUM)] == summed[:3] and got[1][str(dist.ReduceOp.SUM)] == summed[3:]
    assert got[0][str(dist.ReduceOp.AVG)] == [v / 2 for v in summed[:3]]
    assert got[1][str(dist.ReduceOp.AVG)] == [v / 2 for v in summed[3:]]
    assert all("sums or averages" in rank["max"] for rank in got)
