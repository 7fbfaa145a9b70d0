"""What the one time predictor costs before a Run: the Lab's and the Trade-offs' estimates from an empty store.

    python benchmarks/estimate_cost.py [--models tiny-llama,gpt2-small,qwen3-0.6b] [--lengths 256,1024,4096]
    python benchmarks/estimate_cost.py --measure tiny-llama:256,gpt2-small:256

``--measure`` instead measures those Runs' step (``ckptlab.measure``: one warm-up, two timed steps, the Lab's
default every_n_layers=2 on this CPU) beside the roofline's predicted step, to say how far the estimate is.

A Lab Run's estimate (``ckptlab.lab.run.run_estimate``: the roofline over each part's simulated step on this CPU's
measured speed) is timed cold (the shared store empty: its parts simulated as one table, in this process) and warm
(the store holds them: what every later page and session pays), beside one ``ckptlab.simulate`` of the run itself.
Then the Trade-offs page's default sweep (the default model at 512 tokens, every every_n_layers, no offload, plain
checkpointing): how many distinct simulations its estimate makes, and what they cost. The predicted step and Run
are printed too (predicted (roofline, this CPU)). The machine's load is printed: other work on the cores makes
every figure longer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, describe, measure, simulate
from ckptlab.explore.sweep import SweepSpec
from ckptlab.lab import run as labrun
from ckptlab.lab import tradeoffs_view
from ckptlab.lab.store import SIMULATIONS


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def lab_rows(models: list[str], lengths: list[int]) -> None:
    print("| model | tokens | Run's parts | one simulate, s | estimate cold, s | warm, s | step, s | Run, s |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        positions = describe(model).max_positions or max(lengths)
        for length in (n for n in lengths if n <= positions):
            spec = RunSpec(model=model, seq_len=length, every_n_layers=2)
            SIMULATIONS.clear()
            started = time.perf_counter()
            simulate(replace(spec, device="cpu"))
            one = time.perf_counter() - started
            SIMULATIONS.clear()
            started = time.perf_counter()
            run_s = labrun.run_estimate(spec)
            cold = time.perf_counter() - started
            started = time.perf_counter()
            labrun.run_estimate(spec)
            warm = time.perf_counter() - started
            step = labrun.step_prediction(spec)
            parts = len(labrun.run_parts(spec))
            print(
                f"| {model} | {length} | {parts} | {one:.2f} | {cold:.2f} | {warm:.3f} | "
                f"{step.seconds if step else float('nan'):.2f} | {run_s or float('nan'):.1f} |",
                flush=True,
            )


def default_sweep() -> None:
    spec = SweepSpec(model=RunSpec().model, seq_lens=(512,))
    rows = tradeoffs_view.sweep_rows(spec)
    keys = {labrun.simulated_spec(part) for row in rows for part in labrun.run_parts(row)}
    SIMULATIONS.clear()
    started = time.perf_counter()
    seconds, _ = tradeoffs_view.sweep_estimate(spec)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    tradeoffs_view.sweep_estimate(spec)
    warm = time.perf_counter() - started
    print(
        f"Trade-offs' default sweep ({spec.model}, 512 tokens): {len(rows)} rows, {len(keys)} distinct simulations "
        f"(each row and the off reference it is sized by), {len(SIMULATIONS)} kept; estimate cold {cold:.2f} s, "
        f"warm {warm:.3f} s; predicted sweep {seconds or float('nan'):.1f} s"
    )


def measured_rows(pairs: list[str]) -> None:
    print("| model | tokens | predicted step, s | measured step (median), s | predicted / measured |")
    print("|---|---|---|---|---|")
    for pair in pairs:
        model, length = pair.split(":")
        spec = RunSpec(model=model, seq_len=int(length), every_n_layers=2, warmup=1, repeats=2)
        step = labrun.step_prediction(spec)
        result = measure(spec)
        measured = result.timing.step_s if result.timing is not None else float("nan")
        predicted = step.seconds if step is not None else float("nan")
        print(f"| {model} | {length} | {predicted:.2f} | {measured:.2f} | {predicted / measured:.2f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-llama,tiny-qwen3,tiny-gpt2,gpt2-small,qwen3-0.6b")
    parser.add_argument("--lengths", default="256,1024,4096")
    parser.add_argument("--measure", default="", help="model:tokens,... to measure beside the prediction")
    args = parser.parse_args()
    print(f"before: {load()}")
    if args.measure:
        measured_rows(args.measure.split(","))
    else:
        lab_rows(args.models.split(","), [int(n) for n in args.lengths.split(",")])
        default_sweep()
    print(f"after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
