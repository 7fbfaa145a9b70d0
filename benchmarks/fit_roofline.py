"""Fit ONE of the roofline's efficiency constants on ONE published row, then print the rows it is checked on.

    python benchmarks/fit_roofline.py [--fit launch|compute|memory]

The row: this project's H200 run (docs/gpu-results.md, section 3): qwen3-0.6b, 4096 tokens, bf16, forward and
backward only, every_n_layers=2 at x1.24 the step with checkpointing off. The script simulates both settings (with
optimizer "none": the timed step had no optimizer), predicts their times on the H200 record with the counted work
the simulation carries (``RunResult.work``, issue 59's first item), and searches the one constant named by
``--fit`` (the others held at their first values in ``ckptlab/explore/roofline.py``) for the factor 1.24. It prints
the fitted value to write into roofline.py by hand, and the same-run rows it was not fitted on (n=4 x1.11, n=1 x2.10)
as a first check; docs/published-tables.md holds the other published rows.

A simulation without counted work (before the counting merged) is said in one line, and the script exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, simulate
from ckptlab.explore.gpus import GPU_SPECS
from ckptlab.explore.roofline import GPU_EFFICIENCY, Efficiency, predict_time, result_tokens, step_work

ROW = {"model": "qwen3-0.6b", "seq_len": 4096, "dtype": "bfloat16", "gpu": "H200 141 GB", "n": 2, "factor": 1.24}
CHECKS = {4: 1.11, 1: 2.10}  # the same run's other settings: not fitted on
# The constant each choice moves, and the range searched (geometric grid).
FITS = {"launch": ("launch_s", 1e-6, 50e-6), "compute": ("compute", 0.3, 0.95), "memory": ("memory", 0.4, 0.95)}
# The timed step ran the forward and the backward: the optimizer's phase is left out of the factor.
TIMED = ("forward", "loss", "backward", "rerun", "offload", "collective")


def factor(works: dict, n: int, efficiency: Efficiency, tokens: int) -> float:
    gpu = GPU_SPECS[ROW["gpu"]]

    def seconds(work) -> float:
        prediction = predict_time(work, gpu, tokens=tokens, efficiency=efficiency, f32="float32")
        return sum(prediction.by_phase[phase] for phase in TIMED)

    return seconds(works[n]) / seconds(works[None])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", choices=sorted(FITS), default="launch")
    args = parser.parse_args()
    works, tokens = {}, 0
    for n in (None, ROW["n"], *CHECKS):
        spec = RunSpec(
            model=ROW["model"], seq_len=ROW["seq_len"], dtype=ROW["dtype"], every_n_layers=n, optimizer="none"
        )
        result = simulate(spec)
        work = step_work(result)
        if work is None:
            print("The simulated result carries no counted work (RunResult.work): nothing to fit yet.")
            return 1
        works[n], tokens = work, result_tokens(result)
    field, low, high = FITS[args.fit]
    grid = [low * (high / low) ** (i / 400) for i in range(401)]
    best = min(
        grid,
        key=lambda v: abs(
            factor(works, ROW["n"], dataclasses.replace(GPU_EFFICIENCY, **{field: v}), tokens) - ROW["factor"]
        ),
    )
    fitted = dataclasses.replace(GPU_EFFICIENCY, **{field: best})
    print(f"{ROW['model']}, {ROW['seq_len']} tokens, {ROW['dtype']}, {ROW['gpu']}; fitted {field} = {best:.4g}")
    if best in (grid[0], grid[-1]):
        # The factor moves little with any one constant where the step is bound by something else: say so rather
        # than hand a value at the edge of the range over as a fit.
        print(
            f"  at the edge of the range searched ({low:g} to {high:g}): no {field} within it reaches x{ROW['factor']}"
        )
    print(f"{'setting':<8}{'published':>10}{'first values':>14}{'fitted':>8}")
    for n, published in ((ROW["n"], ROW["factor"]), *CHECKS.items()):
        first = factor(works, n, GPU_EFFICIENCY, tokens)
        print(f"n={n:<6}{published:>10.2f}{first:>14.2f}{factor(works, n, fitted, tokens):>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
