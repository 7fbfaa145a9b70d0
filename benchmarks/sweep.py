"""What a sweep saves over single runs, measured side by side in one process.

A full sweep of one model (checkpointing off and every every_n_layers, 1 .. layers) with
the same warm-up and repeats as a single run, against the same configurations run one by
one through ``ckptlab.measure(spec)``, each building its own model and warming up. Three
ways, in a different order each round so that a busy machine slows them alike:

- ``singles``: one ``measure(spec)`` per configuration (model built and warmed up each time);
- ``sweep``: ``ckptlab.sweep`` as it runs by default: one model, ``warmup`` steps before the
  first row of each sequence length and none before later rows;
- ``sweep, warm-up per row``: one model, every row warmed up like a single run
  (``warmup_each_row=True``): what the model building alone saves.

It prints each total (wall time, and this process's CPU time, which a machine shared with
other jobs distorts less), its ratio to ``singles``, and per row the median step time of the
sweep over that of the single run (near 1 when skipping the later rows' warm-up changes
no timing, which is what justifies it), and checks that memory is the same to the byte.

    python benchmarks/sweep.py [--model tiny-llama] [--seq-len 512] [--rounds 3] [--threads N]

On the development machine (2 cores shared with other jobs), tiny-llama, seq 512, warm-up
2, repeats 4, ``--threads 1``, medians of 3 rounds: singles 23.8 s, sweep 18.2 s (x0.77;
CPU time x0.77), sweep with a warm-up per row 23.0 s (x0.97: building the model once saves
little; the warm-ups are what a sweep saves). Per row, the sweep's median step over the
single run's was 0.95-1.08, the same with or without the later rows' warm-up: skipping it
changes no timing. With torch's default 2 threads the same machine, busy with other
jobs, gave totals from 14 s to 254 s for the same work (threads spinning for a core), so
only single-threaded numbers are quoted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, measure
from ckptlab.explore.sweep import SweepSpec, plan_sweep, sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--seq-len", type=int, default=RunSpec().seq_len)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: torch's, one per core); 1 makes CPU time robust"
    )
    args = parser.parse_args()
    if args.threads:
        # On a machine shared with other jobs, torch's worker threads spin while they wait for a core,
        # which inflates CPU time too; one thread makes CPU time count this process's work only.
        torch.set_num_threads(args.threads)

    single = RunSpec(model=args.model, seq_len=args.seq_len, device="cpu")
    spec = SweepSpec.from_run_spec(single)
    specs = [
        spec.run_spec(seq_len, n, offload, selective=policy, attn_implementation=attention)
        for seq_len, n, offload, policy, attention in plan_sweep(spec).rows
    ]
    print(
        f"{args.model}, seq {args.seq_len}, {torch.get_num_threads()} torch threads, {len(specs)} configurations (off + every_n_layers 1..{len(specs) - 1}), "
        f"warm-up {single.warmup}, repeats {single.repeats}, {args.rounds} rounds"
    )

    totals: dict[str, list[float]] = {"singles": [], "sweep": [], "sweep, warm-up per row": []}
    cpu: dict[str, list[float]] = {name: [] for name in totals}
    step_ratios: dict[str, list[list[float]]] = {"sweep": [], "sweep, warm-up per row": []}

    def run(name: str) -> list:
        if name == "singles":
            return [measure(run_spec) for run_spec in specs]
        return sweep(SweepSpec.from_run_spec(single, warmup_each_row=name != "sweep")).rows

    names = list(totals)
    for round_index in range(args.rounds):
        outputs = {}
        # A different order each round, so that a machine getting busier or quieter favours none of them.
        for name in names[round_index % 3 :] + names[: round_index % 3]:
            started, cpu_started = time.perf_counter(), time.process_time()
            outputs[name] = run(name)
            totals[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
        singles = outputs["singles"]
        for name in step_ratios:
            for row, alone in zip(outputs[name], singles):
                assert row.after_forward_bytes == alone.memory.after_forward_bytes, row.setting
                assert row.peak_bytes == alone.memory.peak_bytes, row.setting
            step_ratios[name].append([row.step_s / alone.timing.step_s for row, alone in zip(outputs[name], singles)])
        print(
            f"round {round_index + 1}: "
            + ", ".join(f"{name} {values[-1]:.1f} s (CPU {cpu[name][-1]:.1f} s)" for name, values in totals.items()),
            flush=True,
        )

    print(f"\nmedian total over {args.rounds} rounds (memory equal to the byte in every row):")
    for label, table in (("wall", totals), ("CPU", cpu)):
        reference = statistics.median(table["singles"])
        for name, values in table.items():
            total = statistics.median(values)
            print(f"  {label:<5}{name:<24} {total:7.1f} s   x{total / reference:.2f} of the single runs")
    print("\nper row, median step time in the sweep over the single run's (median over rounds):")
    settings = ["off"] + [f"n={run_spec.every_n_layers}" for run_spec in specs[1:]]
    print(f"  {'row':<8}" + "".join(f"{name:>26}" for name in step_ratios))
    for index, setting in enumerate(settings):
        cells = [statistics.median(ratios[index] for ratios in step_ratios[name]) for name in step_ratios]
        print(f"  {setting:<8}" + "".join(f"{cell:>26.2f}" for cell in cells))


if __name__ == "__main__":
    main()
