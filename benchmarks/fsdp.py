"""FSDP2 across ranks: simulation time at real world sizes, and a measured 2-rank step beside a 1-rank one.

    python benchmarks/fsdp.py [--model qwen3-8b] [--seq-len 4096] [--world-sizes 8,64]
                              [--measured-model tiny-llama] [--measured-seq-len 256]

Prints, for each world size, the seconds one simulated step of the model takes (fake tensors,
a fake process group, rank 0) and rank 0's parameters and peak; then the median step of the
measured model on one process (no sharding) and on two gloo ranks under FSDP2, launched by
``python -m ckptlab run --nproc-per-node 2 --fsdp``. On a 2-core machine the 2 ranks share
the cores the single process had (torchrun sets OMP_NUM_THREADS=1 per rank), and every
parameter is all-gathered and every gradient reduce-scattered: a CPU says what FSDP costs in
collectives, not what it saves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunResult, RunSpec, measure, simulate
from ckptlab.units import GIB

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--world-sizes", default="8,64")
    parser.add_argument("--measured-model", default="tiny-llama")
    parser.add_argument("--measured-seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    simulate(RunSpec(model="tiny-llama", seq_len=64, world_size=2, fsdp=True))  # imports and caches not charged
    print(f"Simulated: {args.model}, seq_len {args.seq_len}, bf16, AdamW, every_n_layers=1, torch {torch.__version__}")
    print(f"{'ranks':>6}{'seconds':>9}{'params GiB':>12}{'of total':>10}{'peak GiB':>10}")
    for world_size in (int(item) for item in args.world_sizes.split(",")):
        start = time.perf_counter()
        result = simulate(RunSpec(model=args.model, seq_len=args.seq_len, world_size=world_size, fsdp=True))
        seconds = time.perf_counter() - start
        params = result.memory.breakdown_baseline["parameter"]
        share = params / (2 * result.model.num_params)
        print(
            f"{world_size:>6}{seconds:>9.2f}{params / GIB:>12.3f}{share:>10.4f}{result.memory.peak_bytes / GIB:>10.2f}"
        )

    spec = RunSpec(model=args.measured_model, seq_len=args.measured_seq_len, repeats=args.repeats, warmup=1)
    one = measure(spec)
    two = _two_ranks(spec)
    print(f"\nMeasured: {args.measured_model}, seq_len {spec.seq_len}, float32, AdamW, every_n_layers=1, CPU")
    print(f"{'run':<34}{'step ms':>9}{'peak MiB':>10}")
    print(
        f"{f'1 process ({torch.get_num_threads()} threads)':<34}{one.timing.step_s * 1e3:>9.0f}{one.memory.peak_bytes / 2**20:>10.1f}"
    )
    for row in two.ranks:
        label = f"FSDP2 rank {row.rank} of 2 (gloo, 1 thread)"
        print(f"{label:<34}{row.timing.step_s * 1e3:>9.0f}{row.memory.peak_bytes / 2**20:>10.1f}")


def _two_ranks(spec: RunSpec) -> RunResult:
    command = [sys.executable, "-m", "ckptlab", "run", "--nproc-per-node", "2", "--fsdp", "--json"]
    command += ["--model", spec.model, "--seq-len", str(spec.seq_len), "--repeats", str(spec.repeats), "--warmup", "1"]
    done = subprocess.run(command, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, check=True)
    return RunResult.from_dict(json.loads(done.stdout))


if __name__ == "__main__":
    main()
