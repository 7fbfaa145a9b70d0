"""How fast the CLI answers what needs no model, against importing torch and transformers, side by side.

    python benchmarks/cli_startup.py [--rounds 5]

Each command runs as a whole fresh process (``python -m ckptlab ...``), rounds interleaved so a
busy moment of the machine falls on every command alike; the figure is the median wall time.
Goal (issue 29): ``--help``, ``models`` and an argument error in at most a quarter of a bare
``import torch, transformers``. Also: ``describe('qwen3-8b')`` on the meta device, in-process
(what a Run's first check of an 8B shape costs).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.25

COMMANDS = {
    "import torch, transformers": [sys.executable, "-c", "import torch, transformers"],
    "python -c pass": [sys.executable, "-c", "pass"],
    "--help": [sys.executable, "-m", "ckptlab", "--help"],
    "models": [sys.executable, "-m", "ckptlab", "models"],
    "run --seq-len 0 (error)": [sys.executable, "-m", "ckptlab", "run", "--seq-len", "0"],
    "run --model tiny-lama (error)": [sys.executable, "-m", "ckptlab", "run", "--model", "tiny-lama"],
}


BARE = "import torch, transformers"
BASELINES = (BARE, "python -c pass")  # what the CLI's commands are held against, not commands with a goal


def startup_figures(rounds: int = 5) -> dict[str, float]:
    """The median wall seconds of each command of :data:`COMMANDS`, ``rounds`` fresh processes each, interleaved."""
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(command, cwd=ROOT, capture_output=True, check=False)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(samples) for name, samples in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    medians = startup_figures(args.rounds)
    bare = medians[BARE]
    print(f"median of {args.rounds} fresh processes each, interleaved; goal: at most {GOAL:.0%} of the bare import")
    print(f"{'command':<32}{'median s':>9}{'x bare import':>15}  goal")
    for name, median in medians.items():
        ratio = median / bare
        goal = "" if name in BASELINES else ("met" if ratio <= GOAL else "MISSED")
        print(f"{name:<32}{median:>9.3f}{ratio:>15.2f}  {goal}")

    sys.path.insert(0, str(ROOT))
    from ckptlab.model.catalog import describe

    describe("tiny-llama")  # first-use costs (imports) are not what is measured
    start = time.perf_counter()
    describe("qwen3-8b")
    print(f"\ndescribe('qwen3-8b') on the meta device, in-process: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
