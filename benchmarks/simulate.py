"""How long a simulation takes: the fast path against simulating every layer, side by side.

    python benchmarks/simulate.py [--model qwen3-8b] [--seq-len 8192]

Prints, for checkpointing off and several every_n_layers, the seconds of the fast path
(two shallow copies, extrapolated) and of simulating every layer, their ratio, and
whether the bytes agree. Target: one 8B configuration in under 3 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--every-n-layers", default="off,1,2,4,9")
    args = parser.parse_args()

    settings = [None if item == "off" else int(item) for item in args.every_n_layers.split(",")]
    simulate(RunSpec(model="tiny-llama", seq_len=64))  # first-call costs (imports, fake-mode caches) not charged below
    print(f"{args.model}, seq_len {args.seq_len}, bf16, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'setting':<12}{'fast s':>8}{'every layer s':>15}{'ratio':>8}  same bytes  under 3 s")
    for every_n_layers in settings:
        spec = RunSpec(model=args.model, seq_len=args.seq_len, every_n_layers=every_n_layers)
        start = time.perf_counter()
        fast = simulate(spec)
        fast_s = time.perf_counter() - start
        start = time.perf_counter()
        full = simulate(spec, fast=False)
        full_s = time.perf_counter() - start
        same = fast.memory.timeline == full.memory.timeline and fast.memory.peak_bytes == full.memory.peak_bytes
        name = "off" if every_n_layers is None else f"n={every_n_layers}"
        print(
            f"{name:<12}{fast_s:>8.2f}{full_s:>15.2f}{fast_s / full_s:>8.2f}  {same!s:<10}  {'yes' if fast_s < 3 else 'NO'}"
        )


if __name__ == "__main__":
    main()
