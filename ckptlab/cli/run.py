"""``python -m ckptlab run``: one measured step (and checkpointing off beside it), as text or JSON."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ..results import compare
from ..show.report import run_report
from ..spec import RunSpec
from ..step.measure import load_model, measure
from .args import EXIT_BAD_INPUT, EXIT_PLAN_MISMATCH, add_run_arguments, print_progress, spec_from_args


def add_run_command(commands) -> None:
    run = commands.add_parser("run", help="run and measure training steps with one checkpointing setting")
    defaults = RunSpec()
    add_run_arguments(run, defaults)
    run.add_argument("--repeats", type=int, default=defaults.repeats, help=f"timed steps (default {defaults.repeats})")
    run.add_argument(
        "--warmup", type=int, default=defaults.warmup, help=f"untimed steps first (default {defaults.warmup})"
    )
    compare_flag = run.add_mutually_exclusive_group()
    compare_flag.add_argument(
        "--compare",
        dest="compare",
        action="store_true",
        default=None,
        help="also run checkpointing off and compare (default without --json)",
    )
    compare_flag.add_argument("--no-compare", dest="compare", action="store_false")
    run.add_argument("--json", action="store_true", help="print only the result as JSON")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args, repeats=args.repeats, warmup=args.warmup)
    # A progress line only where a person watches; pipes and --json get clean output.
    progress = print_progress if sys.stderr.isatty() and not args.json else None
    model, info = load_model(spec, progress)
    result = measure(spec, model=model, info=info, progress=progress)
    with_compare = args.compare if args.compare is not None else not args.json
    reference = comparison = None
    if with_compare and spec.checkpointing and result.status == "ok":
        reference = measure(
            replace(spec, every_n_layers=None, offload=False), model=model, info=info, progress=progress
        )
        if reference.status == "ok":
            comparison = compare(result, reference)
    if progress:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    if args.json:
        print(result.to_json())
    else:
        print(run_report(result, comparison, reference))
    if result.status != "ok":
        if args.json:
            print(f"error: {result.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not result.plan_matches:
        print("PLAN MISMATCH: the observed reruns differ from the plan; see the notes above.", file=sys.stderr)
        return EXIT_PLAN_MISMATCH
    return 0
