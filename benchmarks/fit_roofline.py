"""Fit ONE of the roofline's efficiency constants on ONE figure of this project's H200 run, then print the rows it is
checked on.

    python benchmarks/fit_roofline.py [--fit host|launch|compute|memory]

The row: this project's H200 run (docs/gpu-results.md): qwen3-0.6b, 4096 tokens, bf16, forward and backward only.
The script simulates checkpointing off and every_n_layers 2, 4 and 1 (with optimizer "none": the timed step had no
optimizer), predicts their times on the H200 record from the counted work each simulation carries
(``RunResult.work``), and searches the one constant named by ``--fit`` (the others held at their values in
``ckptlab/explore/roofline.py``):

- ``host`` (the default) fits ``python_op_s``, the floor of an op the model's Python issues, on the measured time of
  the forward with the loss with checkpointing off: 41 ms (section 6, the "off" column of ``ckptlab run``). A
  figure of off alone: every factor stays a check.
- ``launch``, ``compute``, ``memory`` fit ``launch_s``, ``compute``, ``memory`` on the factor of every_n_layers=2,
  x1.24 (section 3); then only n=4 and n=1 are checks.

It prints the fitted value to write into roofline.py by hand, and the section-3 factors beside the predictions
with the constants as they are and as fitted. docs/published-tables.md holds the other published rows.
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
from ckptlab.step.work import StepWork

ROW = {"model": "qwen3-0.6b", "seq_len": 4096, "dtype": "bfloat16", "gpu": "H200 141 GB"}
FACTORS = {2: 1.24, 4: 1.11, 1: 2.10}  # section 3: each setting's step over off (n=1: wide spread, x1.67 in run 1)
OFF_MS = 102.4  # section 3: off's forward and backward, median of 5
OFF_FORWARD_MS = 41.0  # section 6: off's forward with the loss (`ckptlab run`, the "off" column)
# The constant each choice moves, the range searched (geometric grid) and what it is fitted on.
FITS = {
    "host": ("python_op_s", 1e-6, 100e-6, "forward"),
    "launch": ("launch_s", 1e-6, 50e-6, "n=2"),
    "compute": ("compute", 0.3, 0.95, "n=2"),
    "memory": ("memory", 0.4, 0.95, "n=2"),
}
# The timed step ran the forward and the backward: the optimizer's phase is left out.
TIMED = ("forward", "loss", "backward", "rerun", "offload", "collective")


def seconds(work: StepWork, efficiency: Efficiency, tokens: int, phases: tuple[str, ...] = TIMED) -> float:
    """The predicted seconds of ``phases`` of a step on the H200 record."""
    prediction = predict_time(work, GPU_SPECS[ROW["gpu"]], tokens=tokens, efficiency=efficiency, f32="float32")
    return sum(prediction.by_phase[phase] for phase in phases)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", choices=sorted(FITS), default="host")
    args = parser.parse_args()
    works: dict[int | None, StepWork] = {}
    tokens = 0
    for n in (None, *FACTORS):
        spec = RunSpec(
            model=ROW["model"], seq_len=ROW["seq_len"], dtype=ROW["dtype"], every_n_layers=n, optimizer="none"
        )
        result = simulate(spec)
        work = step_work(result)
        if work is None:
            print("The simulated result carries no counted work (RunResult.work): nothing to fit yet.")
            return 1
        works[n], tokens = work, result_tokens(result)
    field, low, high, target = FITS[args.fit]

    def factor(n: int, efficiency: Efficiency) -> float:
        return seconds(works[n], efficiency, tokens) / seconds(works[None], efficiency, tokens)

    def miss(value: float) -> float:
        efficiency = dataclasses.replace(GPU_EFFICIENCY, **{field: value})
        if target == "forward":
            return abs(seconds(works[None], efficiency, tokens, ("forward", "loss")) * 1e3 - OFF_FORWARD_MS)
        return abs(factor(2, efficiency) - FACTORS[2])

    grid = [low * (high / low) ** (i / 400) for i in range(401)]
    best = min(grid, key=miss)
    fitted = dataclasses.replace(GPU_EFFICIENCY, **{field: best})
    on = f"off's forward with the loss, {OFF_FORWARD_MS:g} ms" if target == "forward" else "n=2's x1.24"
    print(f"{ROW['model']}, {ROW['seq_len']} tokens, {ROW['dtype']}, {ROW['gpu']}; fitted {field} = {best:.4g} on {on}")
    if best in (grid[0], grid[-1]):
        # The figure moves little with one constant where the step is bound by something else: say so rather than
        # hand a value at the edge of the range over as a fit.
        print(f"  at the edge of the range searched ({low:g} to {high:g}): no {field} within it reaches the figure")
    for label, efficiency in (("as in roofline.py", GPU_EFFICIENCY), ("fitted", fitted)):
        forward = seconds(works[None], efficiency, tokens, ("forward", "loss")) * 1e3
        off = seconds(works[None], efficiency, tokens) * 1e3
        print(
            f"  {label}: off forward+loss {forward:.1f} ms (measured {OFF_FORWARD_MS:g}), "
            f"off forward+backward {off:.1f} ms (measured {OFF_MS:g}, {off / OFF_MS - 1:+.1%})"
        )
    print(f"{'setting':<8}{'published':>10}{'roofline.py':>13}{'error':>8}{'fitted':>8}{'error':>8}")
    for n, published in FACTORS.items():
        now, then = factor(n, GPU_EFFICIENCY), factor(n, fitted)
        print(f"n={n:<6}{published:>10.2f}{now:>13.3f}{now - published:>+8.3f}{then:>8.3f}{then - published:>+8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
