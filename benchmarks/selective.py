"""Selective checkpointing, timed: step time of off / full / attention / matmuls, with the lab's noise verdict.

On one built model, for each sequence length, it times checkpointing off, full checkpointing
(every layer, nothing kept) and the selective policies ``attention`` and ``matmuls``, interleaved
round by round (``ckptlab.step.rounds``: a burst of load hits every setting alike), and prints:

- the median step and the ratio of medians to off, judged by ``ckptlab.results.judge_time``
  (measurable only when the fastest-to-slowest ranges do not overlap);
- the same ratio to full checkpointing: how much of its slowdown a policy wins back;
- from one observed step per setting: what stays resident after the forward and what the policy
  kept (MiB), and the ops the CP layers' reruns ran again.

    python benchmarks/selective.py [--model tiny-llama] [--seq-len 512,2048] [--repeats 6]
                                   [--threads 2] [--optimizer none] [--device auto]

A busy machine is said up front (``ckptlab.show.noise``), and its times are then not to be read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, load_model, measure
from ckptlab.results import judge_time
from ckptlab.show.noise import timing_busy_message
from ckptlab.step.machine_load import machine_load
from ckptlab.step.rounds import time_settings
from ckptlab.units import MIB

SETTINGS = (("off", None, "none"), ("full", 1, "none"), ("attention", 1, "attention"), ("matmuls", 1, "matmuls"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--seq-len", default="512,2048", help="comma-separated sequence lengths")
    parser.add_argument("--repeats", type=int, default=6, help="timed rounds (one step of every setting each)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--optimizer", default="none", help="as RunSpec.optimizer (none: forward and backward)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    seq_lens = [int(part) for part in args.seq_len.split(",")]
    base = RunSpec(
        model=args.model,
        seq_len=seq_lens[0],
        repeats=args.repeats,
        warmup=1,
        optimizer=args.optimizer,
        device=args.device,
        dtype=args.dtype,
    )
    model, info = load_model(base)
    load, cores = machine_load()
    print(
        f"{info.name}, optimizer {args.optimizer}, {args.repeats} timed rounds, torch threads "
        f"{torch.get_num_threads()}; load average {load} on {cores} cores at the start"
    )
    for seq_len in seq_lens:
        specs = [replace(base, seq_len=seq_len, every_n_layers=n, selective=selective) for _, n, selective in SETTINGS]
        timed = time_settings(specs, model, info, warmup_rounds=1)
        observed = [measure(spec, model=model, info=info, timed=False) for spec in specs]
        off, full = timed.timings[0], timed.timings[1]
        assert off is not None and full is not None  # every setting was timed (no stop asked)
        print(f"\nseq_len {seq_len}, batch 1, {observed[0].dtype} on {observed[0].device}")
        busy = next((timing_busy_message(timing) for timing in timed.timings if timing_busy_message(timing)), "")
        if busy:
            print(busy)
        print(
            f"{'setting':<10} {'step ms':>8} {'spread':>7} {'x off':>6} {'verdict':<11} {'x full':>7} {'verdict':<11}"
            f" {'resident MiB':>12} {'kept MiB':>9}  rerun ops (a CP layer)"
        )
        for (name, _, _), timing, result in zip(SETTINGS, timed.timings, observed):
            assert timing is not None
            to_off = judge_time(timing.step_samples, off.step_samples)
            to_full = judge_time(timing.step_samples, full.step_samples)
            memory = result.memory
            assert memory is not None  # a tiny preset fits
            kept = sum(layer.kept_bytes for layer in result.layers)
            cp = next((layer for layer in result.layers if layer.enabled == "CP"), None)
            if cp is None:
                rerun = "-"
            elif not cp.reused_ops:
                rerun = "its whole forward"
            else:
                cached = ", ".join(f"{op} x{count}" for op, count in sorted(cp.reused_ops.items()))
                rerun = f"{sum(cp.rerun_ops.values())} ran again; from the cache: {cached}"
            spread = timing.relative_spread or 0.0
            print(
                f"{name:<10} {statistics.median(timing.step_samples) * 1000:>8.1f} {spread:>7.0%} "
                f"{to_off.ratio:>6.3f} {to_off.judgement.value:<11} {to_full.ratio:>7.3f} {to_full.judgement.value:<11}"
                f" {memory.after_forward_bytes / MIB:>12.1f} {kept / MIB:>9.2f}  {rerun}"
            )
            if not result.plan_matches:
                print(f"  PLAN MISMATCH in {name}: {'; '.join(result.notes)}")
    print(f"\nload average {machine_load()[0]} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
