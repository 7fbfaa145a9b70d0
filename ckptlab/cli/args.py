"""What the commands share: the options that describe one spec, the exit codes, the progress line.

``run``, ``simulate`` and ``sweep`` add the same spec options (:func:`add_run_arguments`) and
read them back the same way (:func:`spec_from_args`).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..spec import DEVICES, DTYPES, MAX_WORLD_SIZE, OPTIMIZERS, RunSpec

EXIT_BAD_INPUT = 2  # also: the step does not fit
EXIT_PLAN_MISMATCH = 3  # the observed reruns differ from the plan: loud, never hidden


class Parser(argparse.ArgumentParser):
    """argparse with the lab's way of refusing bad input: one line naming the value (and the choices), exit 2.

    argparse's own ``error`` prints the whole usage block first; a newcomer who typed
    ``--dtype float64`` needs the one line that says what is accepted. Subcommands' parsers
    are made of this class too (``add_subparsers`` uses the parent's class).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see: {self.prog} --help)\n")


def add_run_arguments(run: argparse.ArgumentParser, defaults: RunSpec = RunSpec()) -> None:
    """The options of ``run`` that describe one spec; ``simulate`` and ``sweep`` reuse them."""
    run.add_argument(
        "--model",
        default=defaults.model,
        help=f"preset name or local directory with config.json (default {defaults.model})",
    )
    run.add_argument(
        "--seq-len", type=int, default=defaults.seq_len, help=f"tokens per sequence (default {defaults.seq_len})"
    )
    run.add_argument("--batch-size", type=int, default=defaults.batch_size, help="sequences per step (default 1)")
    setting = run.add_mutually_exclusive_group()
    setting.add_argument(
        "--every-n-layers",
        type=int,
        default=defaults.every_n_layers,
        help="checkpoint layers 1, 1+N, 1+2N, ... (default 1: all)",
    )
    setting.add_argument("--no-checkpointing", action="store_true", help="run with checkpointing off")
    run.add_argument(
        "--offload", action="store_true", help="keep checkpointed inputs in pinned host memory (CUDA only)"
    )
    run.add_argument(
        "--dtype", choices=DTYPES, default=defaults.dtype, help="default auto: float32 on the CPU, bfloat16 on CUDA"
    )
    run.add_argument("--device", choices=DEVICES, default=defaults.device, help="default auto: CUDA when present")
    run.add_argument("--seed", type=int, default=defaults.seed)
    run.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=defaults.optimizer,
        help="adamw (default, as Trainer), sgd (no state) or none (forward and backward only)",
    )
    run.add_argument(
        "--lora-rank",
        type=int,
        default=defaults.lora_rank,
        metavar="R",
        help="train LoRA adapters of rank R on a frozen base (peft); default: full fine-tune",
    )
    run.add_argument(
        "--lora-targets",
        type=_names,
        default=defaults.lora_targets,
        metavar="NAMES",
        help="comma-separated modules LoRA adapts, e.g. q_proj,v_proj (default: every attention and MLP projection)",
    )
    run.add_argument(
        "--selective",
        type=_selective,
        default=defaults.selective,
        metavar="POLICY",
        help=f"selective checkpointing: what a CP layer keeps besides its input: {', '.join(SELECTIVE_CHOICES)}, or "
        "comma-separated op names such as aten.mm,aten.bmm (default none)",
    )


def _selective(text: str) -> str | tuple[str, ...]:
    """A policy's name, or op names (any name with a dot); torch's check of the names is the spec's."""
    if text in SELECTIVE_CHOICES:
        return text
    if "." in text:
        return _names(text)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not one of {', '.join(SELECTIVE_CHOICES)}, nor op names like aten.mm,aten.bmm"
    )


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
        selective=getattr(args, "selective", "none"),
        **{"world_size": getattr(args, "world_size", 1), "fsdp": getattr(args, "fsdp", False), **extra},
    )


def add_fsdp_argument(parser: argparse.ArgumentParser) -> None:
    """``--fsdp``, for the commands that run across ranks (``run``, ``simulate``)."""
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="shard with FSDP2 (fully_shard on every decoder layer, then the root) across the ranks",
    )


def add_world_size_argument(parser: argparse.ArgumentParser) -> None:
    """``--world-size N``: the ranks a simulation stands for (``simulate``)."""
    parser.add_argument(
        "--world-size",
        type=int,
        default=1,
        metavar="N",
        help=f"ranks to simulate with a fake process group, 1 to {MAX_WORLD_SIZE} (with --fsdp); figures are rank 0's",
    )


def argv_from_spec(spec: RunSpec) -> list[str]:
    """The ``run`` options that give back ``spec`` (world size aside: the launcher sets it); for launched ranks."""
    argv = ["--model", spec.model, "--seq-len", str(spec.seq_len), "--batch-size", str(spec.batch_size)]
    argv += ["--dtype", spec.dtype, "--device", spec.device, "--seed", str(spec.seed), "--optimizer", spec.optimizer]
    argv += ["--repeats", str(spec.repeats), "--warmup", str(spec.warmup)]
    argv += ["--no-checkpointing"] if spec.every_n_layers is None else ["--every-n-layers", str(spec.every_n_layers)]
    if spec.offload:
        argv.append("--offload")
    if spec.lora_rank is not None:
        argv += ["--lora-rank", str(spec.lora_rank)]
    if spec.lora_targets is not None:
        argv += ["--lora-targets", ",".join(spec.lora_targets)]
    if spec.fsdp:
        argv.append("--fsdp")
    if spec.selective != "none":
        argv += ["--selective", spec.selective if isinstance(spec.selective, str) else ",".join(spec.selective)]
    return argv


def print_progress(message: str, fraction: float) -> None:
    print(f"\r[{fraction:>4.0%}] {message:<50}", end="", file=sys.stderr, flush=True)
