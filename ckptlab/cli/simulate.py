"""``python -m ckptlab simulate``: a real model size on fake tensors, and whether it fits a GPU.

Registered in :data:`ckptlab.cli.COMMANDS`; the spec options are ``run``'s.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING

from ..errors import SpecError, check_at_most
from ..explore.budget import GPUS, budget_bytes
from ..show.report import run_report
from ..units import GIB, mib, parse_size
from .args import (
    add_fsdp_argument,
    add_run_arguments,
    add_world_size_argument,
    check_before_the_core,
    spec_from_args,
    training_args_lines,
)

if TYPE_CHECKING:
    from ..results import RunResult

MAX_BUDGET_GIB = 2**20  # a mebi-GiB (1 PiB): above any machine, and still a whole number of bytes


def add_simulate_command(commands) -> None:
    """Add ``simulate`` to the subcommands (one entry of ``COMMANDS``)."""
    parser = commands.add_parser(
        "simulate", help="simulate one step of a real model size on fake tensors: memory a GPU would need"
    )
    add_run_arguments(parser)
    add_world_size_argument(parser)
    add_fsdp_argument(parser)
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--gpu", help=f"say whether it fits this GPU: {', '.join(GPUS)} (e.g. --gpu H100-80)")
    budget.add_argument(
        "--budget",
        metavar="SIZE",
        help="say whether it fits this much memory: bytes or e.g. 40GiB (as sweep's --budget)",
    )
    # The older spelling stays: scripts written for it keep working.
    budget.add_argument("--budget-gib", type=float, metavar="X", help="the same as --budget XGiB")
    parser.add_argument(
        "--exact", action="store_true", help="simulate every layer instead of extrapolating (slower, same bytes)"
    )
    parser.add_argument("--json", action="store_true", help="print only the result (and the verdict) as JSON")
    parser.set_defaults(handler=_simulate_command)


def fit_verdict(result: RunResult, budget: int, label: str) -> dict:
    """Whether the simulated peak of the whole training step fits ``budget``, by how much, and what it counts."""
    from ..explore.recommend import counts_note
    from ..explore.scale import fits

    memory, spec = result.memory, result.spec
    assert memory is not None  # a simulation always has its memory (status "ok"; no time)
    peak = memory.peak_bytes
    margin = budget - peak
    fitting = fits(result, budget)  # the one rule: the whole step's simulated peak within the budget
    words = "fits" if fitting else "does not fit"
    phase = memory.peak_where.phase or "step"
    state = f" Optimizer state: {memory.optimizer_state_bytes / GIB:.1f} GiB." if memory.optimizer_state_bytes else ""
    sentence = (
        f"Simulated peak {mib(peak)} MiB ({peak / GIB:.1f} GiB, in the {phase}) {words} in {label} "
        f"({budget / GIB:.1f} GiB): {'margin' if fitting else 'short by'} {abs(margin) / GIB:.1f} GiB.{state} "
        + counts_note(spec.optimizer, spec.lora_rank)
    )
    return {
        "budget_bytes": budget,
        "budget_label": label,
        "fits": fitting,
        "margin_bytes": margin,
        "peak_phase": memory.peak_where.phase or None,
        "optimizer": spec.optimizer,
        "optimizer_state_bytes": memory.optimizer_state_bytes,
        "sentence": sentence,
    }


def _simulate_command(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    budget = None
    if args.gpu:
        budget = budget_bytes(args.gpu)
    elif args.budget_gib is not None:
        if not (math.isfinite(args.budget_gib) and 0 < args.budget_gib <= MAX_BUDGET_GIB):
            raise SpecError(
                f"--budget-gib {args.budget_gib} is not valid: give a finite number of GiB above 0 and at most "
                f"{MAX_BUDGET_GIB:,}, e.g. 80."
            )
        budget = (int(args.budget_gib * GIB), f"a budget of {args.budget_gib:g} GiB")
    elif args.budget is not None:
        size = parse_size(args.budget, "--budget")
        check_at_most("--budget", size, MAX_BUDGET_GIB * GIB, "above any machine's memory")
        budget = (size, f"a budget of {args.budget.strip()}")
    check_before_the_core(spec)
    from ..step.simulate import simulate  # the core, once the flags are known good (see ckptlab.cli)

    result = simulate(spec, fast=not args.exact)
    verdict = fit_verdict(result, *budget) if budget else None
    if args.json:
        data = result.to_dict()
        if verdict:
            data["fit"] = verdict
        print(json.dumps(data, indent=2))
    else:
        print("\n".join([*training_args_lines(args), run_report(result)]))
        if verdict:
            print("\n" + verdict["sentence"])
    return 0
