"""What a ``simulate`` process costs beside its simulation, and what a refusal costs, side by side (issue 61).

    python benchmarks/simulate_process.py [--rounds 3] [--model qwen3-8b] [--seq-len 8192] [--gpu h100-80]

Each round runs, as fresh processes: ``python -m ckptlab simulate --model M --seq-len S --gpu G`` (its CPU seconds
from ``resource.getrusage`` of the child, which a busy machine does not inflate as it does wall time, and, inside it,
the CPU seconds of the ``simulate`` call alone); the bare imports a simulation cannot do without (torch,
transformers, its ``models`` package read once as a simulate process reads it (``ckptlab.model.libraries``),
``transformers.modeling_utils``, the modeling module of the model's family, torch's MemTracker), the floor of any such
process, each import's CPU seconds in that fresh process printed beside; and a refusal (``--seq-len 10000000``, past
the preset's positions). Rounds are interleaved, so a busy moment falls on each alike; the figures are medians. The
children run torch on one thread (``OMP_NUM_THREADS=1`` unless set), as a shared machine's simulations do. Targets:
the process at most 2x its simulation, which needs the rest of the process (at least the bare imports) within one
simulation; the refusal under 1 s of CPU.
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

# The bare imports, each timed in its fresh process (CPU seconds since the previous one), reported on stderr.
FLOOR = """
import json, resource, sys
def cpu():
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime
spent, last = {}, cpu()
def step(name):
    global last
    now = cpu()
    spent[name], last = now - last, now
import torch
step("torch")
import transformers
step("transformers (its import scans its model folders)")
from ckptlab.model.libraries import import_transformers_models
import_transformers_models()
step("transformers.models (read from that scan)")
import transformers.modeling_utils
step("transformers.modeling_utils")
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.for_model(sys.argv[1]))]
step("the family's modeling module")
from torch.distributed._tools.mem_tracker import MemTracker
step("torch's MemTracker")
print(json.dumps(spent), file=sys.stderr)
"""


def _child(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``argv`` as a fresh process from the repository; its CPU seconds (user + system) and what it printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def process_figures(model: str, seq_len: int, gpu: str, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median CPU seconds of a simulate process, of its simulate call, of the bare imports and of a refusal; and of
    each bare import in its fresh process."""
    from ckptlab.model.presets import PRESETS

    family = PRESETS[model].family
    simulate = ["simulate", "--model", model, "--seq-len", str(seq_len), "--gpu", gpu, "--json"]
    samples: dict[str, list[float]] = {"process": [], "simulation": [], "floor": [], "refusal": []}
    imports: dict[str, list[float]] = {}
    for _ in range(rounds):
        cpu, done = _child([sys.executable, "-c", TIMED, *simulate])
        report = json.loads(done.stderr.strip().splitlines()[-1])
        assert report["status"] == 0, done.stderr[-2000:]
        samples["process"].append(cpu)
        samples["simulation"].append(report["simulate_cpu_s"])
        cpu, done = _child([sys.executable, "-c", FLOOR, family])
        assert done.returncode == 0, done.stderr[-2000:]
        samples["floor"].append(cpu)
        for name, seconds in json.loads(done.stderr.strip().splitlines()[-1]).items():
            imports.setdefault(name, []).append(seconds)
        cpu, done = _child([sys.executable, "-m", "ckptlab", "simulate", "--model", model, "--seq-len", "10000000"])
        assert done.returncode == 2 and "positions" in done.stderr, done.stderr[-2000:]
        samples["refusal"].append(cpu)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return medians, {name: statistics.median(values) for name, values in imports.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--gpu", default="h100-80")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    figures, imports = process_figures(args.model, args.seq_len, args.gpu, args.rounds)
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
    for name, seconds in imports.items():
        print(f"{'  ' + name:<44}{seconds:>8.2f}")
    met = "met" if ratio <= PROCESS_TARGET else "MISSED"
    print(f"process / simulation: {ratio:.2f} (target at most {PROCESS_TARGET:g}: {met})")
    # 2x needs the rest of the process within one simulation, and the rest holds at least the bare imports.
    print(f"bare imports / simulation: {figures['floor'] / simulation:.2f} (the process is at least 1 + this)")
    refusal = figures["refusal"]
    met = "met" if refusal < REFUSAL_TARGET_S else "MISSED"
    print(f"refusal (--seq-len 10000000): {refusal:.2f} CPU s (target under {REFUSAL_TARGET_S:g} s: {met})")


if __name__ == "__main__":
    main()
