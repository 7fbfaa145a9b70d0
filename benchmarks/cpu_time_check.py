"""The roofline checked on this machine: `run`'s measured CPU steps against the predictor with this CPU's figures.

    python benchmarks/cpu_time_check.py [--lengths 256,1024] [--repeats 4]

With ONE torch thread (set here; the load average is printed before and after), each config (dense tiny-llama, the
GQA tiny-qwen3, the MoE tiny-qwen3-moe) at two lengths is timed for checkpointing off, every_n_layers 1 and 2, and
offload on one built model, round by round (``ckptlab.step.rounds.time_settings``, the sweep's own order: every
setting takes a step in each round, so a burst of the machine's other work hits all of them alike; one warm-up round;
the median of the timed steps; forward and backward, no optimizer). Timed one setting after another instead (each a
``measure`` of its own), two timings of the same n=1 step differed by 10-60% on this machine at load 1-2, more than
the 10% the check asks;
the same specs are simulated and their counted work timed by ``ckptlab.explore.roofline.predict_time`` on this CPU's
measured matmul FLOP/s, bandwidth and host time per op (``explore.machine.cpu_speed``, cached under the user's
cache; ``roofline.measured_efficiency``: a CPU's host time adds to each op's arithmetic). Printed: each setting's measured and predicted factor over off and the error (target: within 10%).

Offload does not run on a CPU (``save_on_cpu(pin_memory=True)`` needs an accelerator): the lab runs the layers
checkpointed without it (``note.offload_on_cpu``), so the measured offload row is n=1's step again, and the
predictor, which has no host link on a CPU, times it without the copies; the row says so.

A benchmark, never a timed test: the figures are as trustworthy as the machine was idle (a load above the cores
means other work shared them; the script says so).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from ckptlab import RunSpec, load_model, simulate
from ckptlab.explore import machine
from ckptlab.explore.roofline import (
    Efficiency,
    Speed,
    cpu_speed,
    measured_efficiency,
    predict_time,
    result_tokens,
    step_work,
)
from ckptlab.step.rounds import time_settings
from ckptlab.step.work import StepWork

CONFIGS = ("tiny-llama", "tiny-qwen3", "tiny-qwen3-moe")  # dense, GQA 4:2, MoE
SETTINGS: dict[str, tuple[int | None, bool]] = {"off": (None, False), "n=1": (1, False), "n=2": (2, False)}
OFFLOAD = ("offload", (1, True))
WITHIN = 0.10  # predicted factor within 10% of the measured one
THREADS = 1


@dataclass(frozen=True)
class Check:
    """One setting's factor over off, measured and predicted."""

    setting: str
    measured_s: float
    predicted_s: float
    measured_factor: float
    predicted_factor: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured, of the factors."""
        return self.predicted_factor / self.measured_factor - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= WITHIN


def without_copies(work: StepWork) -> StepWork:
    """The work without offload's copies and collectives: what a CPU step runs (it has no host or GPU link)."""
    return StepWork(tuple(item for item in work.items if item.phase not in ("offload", "collective")))


def predicted_seconds(work: StepWork, speed: Speed, efficiency: Efficiency, tokens: int) -> float:
    """The step's predicted seconds on this CPU's measured figures and host times."""
    return predict_time(without_copies(work), speed, tokens=tokens, efficiency=efficiency, f32="float32").seconds


def checks(measured: Mapping[str, float], predicted: Mapping[str, float]) -> list[Check]:
    """Each setting's measured and predicted seconds turned into factors over "off" and their error."""
    return [
        Check(
            setting,
            measured[setting],
            predicted[setting],
            measured[setting] / measured["off"],
            predicted[setting] / predicted["off"],
        )
        for setting in measured
    ]


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    record = machine.cpu_speed("float32", THREADS)
    speed = cpu_speed(record, f"this CPU, {THREADS} thread")
    efficiency = measured_efficiency(record)
    print(f"torch threads {torch.get_num_threads()}; before: {load()}")
    print(
        f"this CPU ({machine.cpu_model()}): float32 matmul {record.matmul_flops['float32'] / 1e9:.1f} GFLOP/s, "
        f"bandwidth {(record.memory_bandwidth or 0) / 1e9:.1f} GB/s, host time per op "
        + ", ".join(f"{phase} {seconds * 1e6:.1f} us" for phase, seconds in record.host_op_s.items())
        + f" (measured {record.measured_at})"
    )
    print("| config | tokens | setting | measured s | predicted s | measured factor | predicted factor | error |")
    print("|---|---|---|---|---|---|---|---|")
    inside = total = 0
    highest = os.getloadavg()[0]
    for model in args.configs.split(","):
        for length in (int(n) for n in args.lengths.split(",")):
            base = RunSpec(
                model=model, seq_len=length, dtype="float32", device="cpu", optimizer="none", repeats=args.repeats
            )
            named = {setting: replace(base, every_n_layers=n, offload=offload) for setting, (n, offload) in (
                *SETTINGS.items(), OFFLOAD)}  # fmt: skip
            model_built, info = load_model(base)
            timed = time_settings(list(named.values()), model_built, info, warmup_rounds=1)
            del model_built
            measured: dict[str, float] = {}
            predicted: dict[str, float] = {}
            for (setting, spec), timing in zip(named.items(), timed.timings):
                if timing is None:
                    print(f"| {model} | {length} | {setting} | not timed | | | | |")
                    break
                measured[setting] = timing.step_s
                simulated = simulate(spec)
                work = step_work(simulated)
                if work is None:
                    print("The simulated result carries no counted work (RunResult.work): nothing to predict.")
                    return 1
                predicted[setting] = predicted_seconds(work, speed, efficiency, result_tokens(simulated))
                highest = max(highest, os.getloadavg()[0])
            else:
                for check in checks(measured, predicted):
                    if check.setting == "off":
                        continue
                    total += 1
                    inside += check.within
                    note = " (no offload on a CPU: n=1 again)" if check.setting == "offload" else ""
                    print(
                        f"| {model} | {length} | {check.setting}{note} | {check.measured_s:.3f} | "
                        f"{check.predicted_s:.3f} | x{check.measured_factor:.3f} | x{check.predicted_factor:.3f} | "
                        f"{check.error:+.1%} |",
                        flush=True,
                    )
    print(f"within {WITHIN:.0%}: {inside} of {total}; after: {load()}; highest 1-minute load seen {highest:.2f}")
    if highest > (os.cpu_count() or 1):
        print("the load was above the cores: other work shared them, so the measured factors are not trustworthy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
