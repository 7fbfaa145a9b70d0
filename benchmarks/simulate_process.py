"""What a ``simulate`` process costs beside its simulation, and what a refusal costs, side by side (issue 61).

    python benchmarks/simulate_process.py [--rounds 3] [--model qwen3-8b] [--seq-len 8192] [--gpu h100-80]

Each round runs, as fresh processes: ``python -m ckptlab simulate --model M --seq-len S --gpu G`` (its CPU seconds
from ``resource.getrusage`` of the child, which a busy machine does not inflate as it does wall time, and, inside it,
the CPU seconds of the ``simulate`` call alone); the bare imports a simulation cannot do without (torch,
transformers' modeling of the model's family, torch's MemTracker), the floor of any such process; and a refusal
(``--seq-len 10000000``, past the preset's positions). Rounds are interleaved, so a busy moment falls on each alike;
the figures are medians. Targets: the process at most 2x its simulation; the refusal under 1 s of CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROCESS_TARGET = 2.0  # the process at most this many times its simulation
REFUSAL_TARGET_S = 1.0

# The command as `python -m ckptlab` runs it, with the simulate call's own CPU seconds reported on stderr. The core's
# module is imported first so the call can be wrapped; the command imports it anyway, so the process does the same.
TIMED = """
import json, resource, sys
def cpu():
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime
import ckptlab.step.simulate as core
real, spent = core.simulate, []
def timed(*args, **kwargs):
    start = cpu()
    try:
        return real(*args, **kwargs)
    finally:
        spent.append(cpu() - start)
core.simulate = timed
from ckptlab.cli import main
status = main(sys.argv[1:], own_process=True)
print(json.dumps({"status": status, "simulate_cpu_s": sum(spent)}), file=sys.stderr)
"""

FLOOR = """
import torch, transformers
from torch.distributed._tools.mem_tracker import MemTracker
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.for_model(sys.argv[1]))]
"""


def _child(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``argv`` as a fresh process from the repository; its CPU seconds (user + system) and what it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def process_figures(model: str, seq_len: int, gpu: str, rounds: int) -> dict[str, float]:
    """Median CPU seconds of a simulate process, of its simulate call, of the bare imports and of a refusal."""
    from ckptlab.model.presets import PRESETS

    family = PRESETS[model].family
    simulate = ["simulate", "--model", model, "--seq-len", str(seq_len), "--gpu", gpu, "--json"]
    samples: dict[str, list[float]] = {"process": [], "simulation": [], "floor": [], "refusal": []}
    for _ in range(rounds):
        cpu, done = _child([sys.executable, "-c", TIMED, *simulate])
        report = json.loads(done.stderr.strip().splitlines()[-1])
        assert report["status"] == 0, done.stderr[-2000:]
        samples["process"].append(cpu)
        samples["simulation"].append(report["simulate_cpu_s"])
        cpu, done = _child([sys.executable, "-c", "import sys\n" + FLOOR, family])
        assert done.returncode == 0, done.stderr[-2000:]
        samples["floor"].append(cpu)
        cpu, done = _child([sys.executable, "-m", "ckptlab", "simulate", "--model", model, "--seq-len", "10000000"])
        assert done.returncode == 2 and "positions" in done.stderr, done.stderr[-2000:]
        samples["refusal"].append(cpu)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--gpu", default="h100-80")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    figures = process_figures(args.model, args.seq_len, args.gpu, args.rounds)
    process, simulation = figures["process"], figures["simulation"]
    ratio = process / simulation
    print(
        f"{args.model} at {args.seq_len} tokens, --gpu {args.gpu}; median CPU s of {args.rounds} fresh processes each"
    )
    print(f"{'':<44}{'CPU s':>8}")
    print(f"{'simulate process':<44}{process:>8.2f}")
    print(f"{'  its simulate call':<44}{simulation:>8.2f}")
    print(f"{'  the rest (imports, checks, output)':<44}{process - simulation:>8.2f}")
    print(f"{'bare imports (torch, transformers, MemTracker)':<44}{figures['floor']:>8.2f}")
    met = "met" if ratio <= PROCESS_TARGET else "MISSED"
    print(f"process / simulation: {ratio:.2f} (target at most {PROCESS_TARGET:g}: {met})")
    refusal = figures["refusal"]
    met = "met" if refusal < REFUSAL_TARGET_S else "MISSED"
    print(f"refusal (--seq-len 10000000): {refusal:.2f} CPU s (target under {REFUSAL_TARGET_S:g} s: {met})")


if __name__ == "__main__":
    main()
