"""What the routing changes: measured MoE steps over several seeds, and the simulation beside them.

    python benchmarks/moe.py [--model tiny-qwen3-moe] [--seq-len 128] [--seeds 0,1,2,3,4]

Fake tensors carry no values, so the simulation cannot know which experts a router picks.
This measures real CPU steps with random weights and different seeds (each seed draws other
weights and other tokens, so another routing), plus one step with the router's weights
zeroed ("collapsed": every token goes to the same top-k experts, the most uneven split
there is), and prints, per memory category after the forward and at the peak, the measured
min / median / max, the simulated bytes, and whether the simulation lies within 3% of the
measured median. The first lines show that the routing did change: tokens on the busiest
and the idlest expert of the first MoE layer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptlab import RunSpec, measure, simulate
from ckptlab.step.preflight import load_model
from ckptlab.step.routing import collapse_routing, expert_load
from ckptlab.step.trainstep import random_batch

TOLERANCE = 0.03


def _routing_split(model: torch.nn.Module, spec: RunSpec) -> tuple[int, int]:
    """Tokens on the busiest and the idlest expert of the first MoE layer, in one forward."""
    load = expert_load(model, random_batch(model, spec, torch.device("cpu")))
    return max(load), min(load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3-moe")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--every-n-layers", default="off,1,2")
    parser.add_argument("--optimizer", default="adamw")
    args = parser.parse_args()
    seeds = [int(item) for item in args.seeds.split(",")]
    settings = [None if item == "off" else int(item) for item in args.every_n_layers.split(",")]

    print(f"{args.model}, seq_len {args.seq_len}, float32, CPU, optimizer {args.optimizer}, torch {torch.__version__}")
    all_within = True
    for every_n_layers in settings:
        base = RunSpec(
            model=args.model,
            seq_len=args.seq_len,
            every_n_layers=every_n_layers,
            dtype="float32",
            device="cpu",
            optimizer=args.optimizer,
            repeats=1,
            warmup=1,
        )
        runs, splits = [], []
        for seed in seeds:
            spec = replace(base, seed=seed)
            model, info = load_model(spec)
            splits.append((f"seed {seed}", *_routing_split(model, spec)))
            runs.append(measure(spec, model=model, info=info))
        model, info = load_model(base)
        collapse_routing(model)
        splits.append(("collapsed", *_routing_split(model, base)))
        runs.append(measure(base, model=model, info=info))
        sim = simulate(base)

        name = "off" if every_n_layers is None else f"every_n_layers={every_n_layers}"
        print(f"\n{name}: tokens x top_k = {args.seq_len} x {info.experts_per_token}, {info.num_experts} experts")
        print(
            "  routing, first MoE layer (busiest / idlest expert, tokens): "
            + ", ".join(f"{label} {hi}/{lo}" for label, hi, lo in splits)
        )
        print(f"  {'bytes':<34}{'measured min':>14}{'median':>14}{'max':>14}{'simulated':>14}  within 3%")
        rows = [
            ("after forward: total", lambda r: r.memory.after_forward_bytes),
            ("peak: total", lambda r: r.memory.peak_bytes),
        ]
        for part, label in (("breakdown_after_forward", "after forward"), ("breakdown_at_peak", "peak")):
            keys = sorted(set().union(*(getattr(r.memory, part).keys() for r in runs + [sim])))
            rows += [(f"{label}: {key}", lambda r, p=part, k=key: getattr(r.memory, p).get(k, 0)) for key in keys]
        for label, read in rows:
            values = [read(run) for run in runs]
            middle = statistics.median(values)
            simulated = read(sim)
            within = abs(simulated - middle) <= TOLERANCE * middle if middle else simulated == 0
            all_within &= within
            print(
                f"  {label:<34}{min(values):>14,}{middle:>14,.0f}{max(values):>14,}{simulated:>14,}  {'yes' if within else 'NO'}"
            )
        spread = max(run.memory.peak_bytes for run in runs) - min(run.memory.peak_bytes for run in runs)
        print(f"  spread of the measured peak over {len(runs)} routings: {spread:,} bytes")
    print("\nsimulation within 3% of the measured median for every category:", "yes" if all_within else "NO")


if __name__ == "__main__":
    main()
