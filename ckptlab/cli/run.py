"""``python -m ckptlab run``: one measured step (and checkpointing off beside it), as text or JSON.

Across ranks, ``--nproc-per-node N --fsdp`` starts N processes through torch's own launcher
(``python -m torch.distributed.run``, i.e. torchrun), each running this same command as one
rank (``ckptlab.step.fsdp.measure_ranks``); rank 0 prints the result with every rank's
figures. ``torchrun --nproc-per-node N -m ckptlab run --fsdp`` does the same by hand.
Several machines: the same command on each, with ``--nnodes M --rdzv-endpoint HOST:PORT``
(the launcher's c10d rendezvous; HOST is one of the machines, PORT free there).

When a rank fails, it records its message in a file the launching command reads; the launcher
ends the other ranks, and the command prints that one message and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import CkptlabError, SpecError
from ..model.libraries import import_transformers_models
from ..show.i18n import say, t
from ..spec import RunSpec
from ..torchstate import launched
from .args import (
    EXIT_BAD_INPUT,
    EXIT_PLAN_MISMATCH,
    LineProgress,
    add_run_arguments,
    add_spec_flags,
    argv_from_spec,
    check_before_the_core,
    core_loaded,
    print_progress,
    spec_from_args,
    training_args_lines,
)

# A folder where a failing rank writes what went wrong, for the launcher's caller.
RANK_ERRORS_ENV = "CKPTLAB_RANK_ERRORS"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding ckptlab/: the ranks import it from there


def add_run_command(commands) -> None:
    run = commands.add_parser("run", help="run and measure training steps with one checkpointing setting")
    defaults = RunSpec()
    add_run_arguments(run, defaults)
    steps_help = {  # run's own words for the declared flags
        "repeats": f"timed steps (default {defaults.repeats})",
        "warmup": f"untimed steps first (default {defaults.warmup})",
    }
    add_spec_flags(run, ("repeats", "warmup"), defaults, helps=steps_help)
    compare_flag = run.add_mutually_exclusive_group()
    compare_flag.add_argument(
        "--compare",
        dest="compare",
        action="store_true",
        default=None,
        help="also run checkpointing off and compare (default without --json; not across ranks)",
    )
    compare_flag.add_argument("--no-compare", dest="compare", action="store_false")
    run.add_argument("--json", action="store_true", help="print only the result as JSON")
    run.add_argument(
        "--quiet", action="store_true", help="no progress and no warnings on standard error (errors still print)"
    )
    ranks = run.add_argument_group("across ranks (torch's launcher, torchrun)")
    add_spec_flags(ranks, ("fsdp",))  # the world size: --nproc-per-node x --nnodes
    ranks.add_argument(
        "--nproc-per-node", type=int, metavar="N", help="start N ranks on this machine through torchrun (with --fsdp)"
    )
    ranks.add_argument(
        "--oversubscribe",
        action="store_true",
        help="start more ranks than this machine has CPU cores (or GPUs): each then gets a share of one",
    )
    ranks.add_argument("--nnodes", type=int, default=1, metavar="M", help="machines taking part (default 1)")
    ranks.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="where the ranks meet (needed with --nnodes > 1); default on one machine: a free local port",
    )
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if launched():
        return _run_rank(args)
    if args.nproc_per_node is not None:
        return _launch(args)
    if args.nnodes != 1 or args.rdzv_endpoint:
        raise SpecError(key="cli.nodes_without_ranks")
    spec = spec_from_args(args, repeats=args.repeats, warmup=args.warmup)
    check_before_the_core(spec)
    import_transformers_models()  # before the core's imports: transformers' model folders read once (model.libraries)
    from ..results import compare  # the core, once the spec is known good (see ckptlab.cli)
    from ..show.report import run_report
    from ..step.measure import measure
    from ..step.preflight import load_model, resolve_device
    from ..step.training import cpu_autocast_warning

    core_loaded(args)
    # On standard error, so standard output (a report, --json) stays clean: one updating line on a terminal, a
    # line per message in a log (a long run must say it is alive there too); --quiet says nothing.
    progress = None if args.quiet else print_progress if sys.stderr.isatty() else LineProgress()
    warning = cpu_autocast_warning(spec, resolve_device(spec.device).type)
    if not args.quiet and warning is not None:
        print(t("cli.warning", message=say(warning)), file=sys.stderr, flush=True)
    model, info = load_model(spec, progress)
    result = measure(spec, model=model, info=info, progress=progress)
    with_compare = args.compare if args.compare is not None else not args.json
    reference = comparison = None
    if with_compare and spec.checkpointing and result.status == "ok":
        reference = measure(spec.checkpointing_off(), model=model, info=info, progress=progress)
        if reference.status == "ok":
            comparison = compare(result, reference)
    if progress is print_progress:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    if args.json:
        print(result.to_json())
    else:
        print("\n".join([*training_args_lines(args), run_report(result, comparison, reference)]))
    if result.status != "ok":
        if args.json:
            print(t("cli.error", message=result.message), file=sys.stderr)
        return EXIT_BAD_INPUT
    if not result.plan_matches:
        print(t("cli.plan_mismatch"), file=sys.stderr)
        return EXIT_PLAN_MISMATCH
    return 0


# -- across ranks -----------------------------------------------------------------------------


def check_room_for_ranks(ranks: int, device: str, oversubscribe: bool) -> None:
    """Refuse more ranks on this machine than it has CPU cores (gloo) or GPUs (NCCL), unless asked to insist.

    Raises:
        SpecError: naming the ranks, what the machine has, and --oversubscribe.
    """
    if oversubscribe:
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    have = torch.cuda.device_count() if device == "cuda" else cores
    if ranks > have:
        raise SpecError(
            key="cli.ranks_over_gpus" if device == "cuda" else "cli.ranks_over_cores", ranks=ranks, have=have
        )


def _launch(args: argparse.Namespace) -> int:
    """Start ``--nproc-per-node`` ranks of this command through torch's launcher; one message if a rank fails."""
    for name in ("nproc_per_node", "nnodes"):
        value = getattr(args, name)
        if value < 1:
            raise SpecError(key="cli.launch_whole_number", flag=name.replace("_", "-"), value=value)
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise SpecError(key="cli.nodes_without_endpoint", nodes=args.nnodes)
    spec = spec_from_args(args, repeats=args.repeats, warmup=args.warmup, world_size=args.nproc_per_node * args.nnodes)
    check_before_the_core(spec)  # bad input: one message and status 2 before any process starts
    import_transformers_models()  # before the core's imports: transformers' model folders read once (model.libraries)
    from ..step.preflight import resolve_device

    check_room_for_ranks(args.nproc_per_node, resolve_device(spec.device).type, args.oversubscribe)
    if args.compare:
        raise SpecError(key="cli.compare_across_ranks")
    if args.rdzv_endpoint:
        where = ["--nnodes", str(args.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
    else:
        where = ["--standalone"]  # a rendezvous on a free local port: two runs at once do not collide
    command = [sys.executable, "-m", "torch.distributed.run", *where, "--nproc-per-node", str(args.nproc_per_node)]
    command += ["--max-restarts", "0", "-m", "ckptlab", "run", *argv_from_spec(spec)]
    command += ["--json"] if args.json else []
    with tempfile.TemporaryDirectory(prefix="ckptlab-ranks-") as errors, tempfile.TemporaryFile("w+") as log:
        env = {
            **os.environ,
            RANK_ERRORS_ENV: errors,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
        }
        # The ranks' stdout is the result; the launcher's own lines and the ranks' tracebacks go to a log,
        # shown only when no rank said what went wrong.
        launcher = subprocess.run(command, env=env, stderr=log, check=False)
        if launcher.returncode == 0:
            return 0
        failure = _first_failure(Path(errors))
        if failure is not None:
            print(t("cli.error", message=failure["message"]), file=sys.stderr)
            return failure["exit"]
        log.seek(0)
        tail = "\n".join(log.read().splitlines()[-15:])
        print(tail + "\n" + t("cli.launcher_failed", status=launcher.returncode), file=sys.stderr)
        return EXIT_BAD_INPUT


def _run_rank(args: argparse.Namespace) -> int:
    """One rank of a launched run: measure, and on rank 0 print every rank's result."""
    import_transformers_models()  # before the core's imports: transformers' model folders read once (model.libraries)
    from ..show.report import run_report
    from ..step.fsdp import measure_ranks

    core_loaded(args)
    try:
        spec = spec_from_args(args, repeats=args.repeats, warmup=args.warmup, world_size=int(os.environ["WORLD_SIZE"]))
        spec.validate()
        progress = print_progress if sys.stderr.isatty() and not args.json else None
        result = measure_ranks(spec, progress=progress)
    except CkptlabError as error:
        _record_failure(str(error), EXIT_BAD_INPUT)
        raise  # the command prints it and exits with status 2; the launcher ends the other ranks
    except Exception as error:
        crash = t("cli.rank_crashed", rank=os.environ.get("RANK"), kind=type(error).__name__, error=error)
        _record_failure(crash, EXIT_BAD_INPUT)
        raise
    if result is None:
        return 0
    print(result.to_json() if args.json else run_report(result))
    if not result.plan_matches:
        message = t("cli.plan_mismatch_ranks")
        print(message, file=sys.stderr)
        _record_failure(message, EXIT_PLAN_MISMATCH)
        return EXIT_PLAN_MISMATCH
    return 0


def _record_failure(message: str, status: int) -> None:
    folder = os.environ.get(RANK_ERRORS_ENV)
    if not folder:
        return
    record = {"rank": int(os.environ.get("RANK", 0)), "exit": status, "message": message, "at": time.time()}
    with open(Path(folder) / f"rank{record['rank']}.json", "w") as file:
        json.dump(record, file)


def _first_failure(folder: Path) -> dict | None:
    """The failure recorded first (its rank failed; the others were ended after it), or None."""
    records = [json.loads(path.read_text()) for path in folder.glob("rank*.json")]
    return min(records, key=lambda record: record["at"], default=None)
