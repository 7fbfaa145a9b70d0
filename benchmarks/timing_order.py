"""Timing order, measured: the same settings timed in blocks (A A A B B B) and interleaved (A B A B), one process.

The sweep times its settings interleaved, round by round (``ckptlab.step.rounds``), so that a
burst of load on a shared machine hits every setting alike. This benchmark checks that it
pays: on one built model it times the same settings both ways, ``--trials`` times each,
alternating which order goes first, and prints side by side, per setting and order:

- the median step and its relative spread (fastest to slowest step over the median);
- the ratio of medians to checkpointing off, and the verdict of ``ckptlab.results.judge_time``;
- the spread of the per-round ratio to off (interleaved only pairs a setting's step with off's
  step of the same round; for blocks the i-th steps are paired): the noise on the ratio itself.

    python benchmarks/timing_order.py [--model tiny-llama] [--seq-len 256] [--every-n-layers 1,2,3]
                                      [--repeats 6] [--trials 2] [--threads 1]

Results on the development machine are in docs/measuring.md ("Interleaved rounds in the sweep").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, load_model
from ckptlab.results import judge_time
from ckptlab.spec import ORDERS
from ckptlab.step.machine_load import machine_load
from ckptlab.step.rounds import time_settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--every-n-layers", default="1,2,3")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--optimizer", default="none")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = RunSpec(model=args.model, seq_len=args.seq_len, repeats=args.repeats, warmup=1, optimizer=args.optimizer)
    specs = [replace(base, every_n_layers=None)] + [
        replace(base, every_n_layers=int(n)) for n in args.every_n_layers.split(",")
    ]
    names = ["off" if spec.every_n_layers is None else f"n={spec.every_n_layers}" for spec in specs]
    model, info = load_model(base)
    load, cores = machine_load()
    print(
        f"{info.name}, seq {args.seq_len}, optimizer {args.optimizer}, {args.repeats} timed steps a setting, "
        f"{args.trials} trials an order, {args.threads} thread(s); load average {load} on {cores} cores at the start"
    )
    spreads: dict[str, list[list[float]]] = {order: [[] for _ in specs] for order in ORDERS}
    ratio_spreads: dict[str, list[list[float]]] = {order: [[] for _ in specs] for order in ORDERS}
    medians: dict[str, list[list[float]]] = {order: [[] for _ in specs] for order in ORDERS}
    verdicts: dict[str, list[list[str]]] = {order: [[] for _ in specs] for order in ORDERS}
    time_settings(specs, model, info, warmup_rounds=1)  # a first pass that nobody quotes
    for trial in range(args.trials):
        for order in ORDERS if trial % 2 == 0 else tuple(reversed(ORDERS)):
            timed = time_settings(specs, model, info, order=order)
            off = timed.timings[0].step_samples
            for index, timing in enumerate(timed.timings):
                samples = timing.step_samples
                medians[order][index].append(statistics.median(samples))
                spreads[order][index].append(timing.relative_spread)
                per_round = [a / b for a, b in zip(samples, off)]
                ratio_spreads[order][index].append((max(per_round) - min(per_round)) / statistics.median(per_round))
                verdicts[order][index].append(judge_time(samples, off).judgement.value)
    print()
    print(
        f"{'setting':<8} | {'blocks: step ms':>15} {'spread':>7} {'x off':>6} {'ratio spread':>12} {'verdicts':<22}"
        f" | {'interleaved: step ms':>20} {'spread':>7} {'x off':>6} {'ratio spread':>12} verdicts"
    )
    for index, name in enumerate(names):
        cells = []
        for order in ("blocks", "interleaved"):
            step = statistics.median(medians[order][index])
            ratio = step / statistics.median(medians[order][0])
            cells.append(
                (
                    step * 1000,
                    statistics.median(spreads[order][index]),
                    ratio,
                    statistics.median(ratio_spreads[order][index]),
                    ",".join(verdicts[order][index]) if index else "",
                )
            )
        (b_ms, b_sp, b_x, b_rs, b_v), (i_ms, i_sp, i_x, i_rs, i_v) = cells
        print(
            f"{name:<8} | {b_ms:>15,.0f} {b_sp:>7.0%} {b_x:>6.2f} {b_rs:>12.0%} {b_v:<22}"
            f" | {i_ms:>20,.0f} {i_sp:>7.0%} {i_x:>6.2f} {i_rs:>12.0%} {i_v}"
        )
    for order in ("blocks", "interleaved"):
        everything = [value for row in spreads[order] for value in row]
        ratios = [value for row in ratio_spreads[order][1:] for value in row]
        print(
            f"{order}: median step spread {statistics.median(everything):.0%}, "
            f"median spread of the per-round ratio to off {statistics.median(ratios):.0%}"
        )
    print(f"load average {machine_load()[0]} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
