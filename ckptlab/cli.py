"""``python -m ckptlab``: list the models, run a measured step.

Bad input exits with status 2 and one message naming the value and the fix, never a
traceback; so does a step that does not fit in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from . import catalog
from .cli_simulate import add_simulate_command
from .cli_sweep import add_sweep_command
from .errors import CkptlabError
from .measure import load_model, measure
from .report import models_table, run_report
from .results import DEVICES, DTYPES, RunSpec, compare
from .training import OPTIMIZERS

EXIT_BAD_INPUT = 2  # also: the step does not fit
EXIT_PLAN_MISMATCH = 3  # the observed reruns differ from the plan: loud, never hidden


def add_run_arguments(run: argparse.ArgumentParser, defaults: RunSpec = RunSpec()) -> None:
    """The options of ``run`` that describe one spec; ``simulate`` and ``sweep`` reuse them."""
    run.add_argument("--model", default=defaults.model, help=f"preset name or local directory with config.json (default {defaults.model})")
    run.add_argument("--seq-len", type=int, default=defaults.seq_len, help=f"tokens per sequence (default {defaults.seq_len})")
    run.add_argument("--batch-size", type=int, default=defaults.batch_size, help="sequences per step (default 1)")
    setting = run.add_mutually_exclusive_group()
    setting.add_argument("--every-n-layers", type=int, default=defaults.every_n_layers, help="checkpoint layers 1, 1+N, 1+2N, ... (default 1: all)")
    setting.add_argument("--no-checkpointing", action="store_true", help="run with checkpointing off")
    run.add_argument("--offload", action="store_true", help="keep checkpointed inputs in pinned host memory (CUDA only)")
    run.add_argument("--dtype", choices=DTYPES, default=defaults.dtype, help="default auto: float32 on the CPU, bfloat16 on CUDA")
    run.add_argument("--device", choices=DEVICES, default=defaults.device, help="default auto: CUDA when present")
    run.add_argument("--seed", type=int, default=defaults.seed)
    run.add_argument("--optimizer", choices=OPTIMIZERS, default=defaults.optimizer,
                     help="adamw (default, as Trainer), sgd (no state) or none (forward and backward only)")
    run.add_argument("--lora-rank", type=int, default=defaults.lora_rank, metavar="R",
                     help="train LoRA adapters of rank R on a frozen base (peft); default: full fine-tune")
    run.add_argument("--lora-targets", type=_names, default=defaults.lora_targets, metavar="NAMES",
                     help="comma-separated modules LoRA adapts, e.g. q_proj,v_proj (default: every attention and MLP projection)")


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def spec_from_args(args: argparse.Namespace, **extra) -> RunSpec:
    """The :class:`RunSpec` the options of :func:`add_run_arguments` describe."""
    return RunSpec(
        model=args.model,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        dtype=args.dtype,
        device=args.device,
        every_n_layers=None if args.no_checkpointing else args.every_n_layers,
        offload=args.offload,
        seed=args.seed,
        optimizer=args.optimizer,
        lora_rank=args.lora_rank,
        lora_targets=args.lora_targets,
        **extra,
    )


def _add_models_command(commands) -> None:
    models = commands.add_parser("models", help="list the model presets")
    models.add_argument("--json", action="store_true", help="print the list as JSON")
    models.set_defaults(handler=_models)


def _add_run_command(commands) -> None:
    run = commands.add_parser("run", help="run and measure training steps with one checkpointing setting")
    defaults = RunSpec()
    add_run_arguments(run, defaults)
    run.add_argument("--repeats", type=int, default=defaults.repeats, help=f"timed steps (default {defaults.repeats})")
    run.add_argument("--warmup", type=int, default=defaults.warmup, help=f"untimed steps first (default {defaults.warmup})")
    compare_flag = run.add_mutually_exclusive_group()
    compare_flag.add_argument("--compare", dest="compare", action="store_true", default=None, help="also run checkpointing off and compare (default without --json)")
    compare_flag.add_argument("--no-compare", dest="compare", action="store_false")
    run.add_argument("--json", action="store_true", help="print only the result as JSON")
    run.set_defaults(handler=_run)


# One entry per subcommand: a function that adds its parser to the subparsers and sets
# ``handler`` (a function of the parsed args returning the exit status). A new command
# lives in its own module and adds one line here.
COMMANDS = [_add_models_command, _add_run_command, add_sweep_command, add_simulate_command]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ckptlab",
        description="Activation checkpointing in transformers, measured: run real steps and see what each layer keeps.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except CkptlabError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``... --json | head``): nothing left to say, and no traceback.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout again at exit
        return 0


def _models(args: argparse.Namespace) -> int:
    infos = [catalog.describe(preset.name) for preset in catalog.list_presets()]
    if args.json:
        print(json.dumps([info.to_dict() for info in infos], indent=2))
    else:
        print(models_table(infos))
        print(f"\ndefault: {catalog.DEFAULT_PRESET}. --model also takes a local directory holding a transformers config.json.")
    return 0


def _run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args, repeats=args.repeats, warmup=args.warmup)
    # A progress line only where a person watches; pipes and --json get clean output.
    progress = _print_progress if sys.stderr.isatty() and not args.json else None
    model, info = load_model(spec, progress)
    result = measure(spec, model=model, info=info, progress=progress)
    with_compare = args.compare if args.compare is not None else not args.json
    reference = comparison = None
    if with_compare and spec.checkpointing and result.status == "ok":
        reference = measure(replace(spec, every_n_layers=None, offload=False), model=model, info=info, progress=progress)
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


def _print_progress(message: str, fraction: float) -> None:
    print(f"\r[{fraction:>4.0%}] {message:<50}", end="", file=sys.stderr, flush=True)
