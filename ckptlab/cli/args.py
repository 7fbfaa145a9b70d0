"""What the commands share: the options that describe one spec, the exit codes, the progress line.

``run``, ``simulate`` and ``sweep`` add the same spec options (:func:`add_run_arguments`), each the declared flags of
the fields it alone takes (:func:`add_spec_flags`: ``--repeats``, ``--world-size``, ``--fsdp``), and read them back the
same way (:func:`spec_from_args`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NoReturn

from .. import spec_fields
from ..fact import CUT_AT, Fact, cut_for_message
from ..model import hub
from ..model.attention import ATTN_IMPLEMENTATIONS
from ..model.presets import check_model_named, stored_fact
from ..model.quantize import load_quantization_file
from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..show.i18n import say, t
from ..show.wording import CliFlags, Flag
from ..spec import OPTIMIZERS, RunSpec
from ..spec_fields import MAX_WORLD_SIZE, SpecField, split_names
from ..torchstate import freeze_what_is_loaded
from ..training_args import DEFAULTED_NAMES, load_training_args_file, read_training_args

EXIT_BAD_INPUT = 2  # also: the step does not fit
EXIT_PLAN_MISMATCH = 3  # the observed reruns differ from the plan: loud, never hidden


# A value argparse quotes in its message, longer than a message shows whole (fact.CUT_AT).
_QUOTED_LONG = re.compile("'([^']{" + str(CUT_AT + 1) + ",})'")


class Parser(argparse.ArgumentParser):
    """argparse with the lab's way of refusing bad input: one line naming the value (and the choices), exit 2.

    argparse's own ``error`` prints the whole usage block first; a newcomer who typed
    ``--dtype float64`` needs the one line that says what is accepted. Subcommands' parsers
    are made of this class too (``add_subparsers`` uses the parent's class).
    """

    def error(self, message: str) -> NoReturn:
        # argparse quotes the value whole ("invalid choice: 'zzz...'"): a long one is cut as the lab's messages cut it.
        message = _QUOTED_LONG.sub(lambda found: repr(cut_for_message(found.group(1))), message)
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see: {self.prog} --help)\n")


class _Given(argparse.Action):
    """Store the value, and remember that the flag was given: a flag given on the command line wins over
    ``--training-args`` (argparse's defaults cannot tell a default from a value typed equal to it)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


def _flag(parser: argparse._ActionsContainer, *names: str, **options) -> None:
    """A spec option that records that it was given; ``store_true=True`` for a flag without a value."""
    if options.pop("store_true", False):
        options.update(nargs=0, const=True, default=False)
    parser.add_argument(*names, action=_Given, **options)


EVERY_SETTING = "all"  # simulate --every-n-layers all: off and every value of every_n_layers, as one table


def every_n_or_all(value: str) -> int | str:
    """``--every-n-layers`` of ``simulate``: a whole number, or "all" for the table of every setting."""
    if value.strip().lower() == EVERY_SETTING:
        return EVERY_SETTING
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(t("cli.every_n_or_all", value=value)) from None


def _helps(defaults: RunSpec, every_setting: bool) -> dict[str, str]:
    """argparse's help of each shared flag, by the RunSpec field it sets (a flag without one has no help)."""
    return {
        "model": "preset name, local directory with config.json, or Hugging Face Hub repository owner/name (its "
        f"config.json only, random weights) (default {defaults.model})",
        "seq_len": f"tokens per sequence (default {defaults.seq_len})",
        "batch_size": "sequences per step (default 1)",
        "every_n_layers": "checkpoint layers 1, 1+N, 1+2N, ... (default 1: all)"
        + ("; 'all': off and every N from 1 to the layer count, as one table" if every_setting else ""),
        "offload": "keep checkpointed inputs in pinned host memory (CUDA only)",
        "dtype": "the weights; default auto: float32 on the CPU or with --mixed-precision, else bfloat16 on CUDA",
        "device": "the device simulated: cpu for the CPU's kernels and dtype; default auto: a CUDA device"
        if every_setting  # simulate's parser
        else "default auto: CUDA when present",
        "optimizer": "TrainingArguments.optim's name, built as Trainer builds it: adamw (default: Trainer's, fused), "
        f"{', '.join(name for name in OPTIMIZERS if name not in ('adamw', 'none'))}; or none (forward and backward only)",
        "optim_args": "TrainingArguments.optim_args, e.g. momentum=0.9",
        "gradient_accumulation_steps": "micro-batches per optimizer step, as Trainer's (default 1)",
        "max_grad_norm": "Trainer's gradient clipping bound (default 1.0; 0 still computes the norm, as Trainer)",
        "mixed_precision": "bf16 or fp16: autocast over float32 weights, as TrainingArguments(bf16=True); with --fsdp, "
        "FSDP2's MixedPrecisionPolicy instead (16-bit all-gathers, float32 gradient reduction; default none)",
        "lora_rank": "train LoRA adapters of rank R on a frozen base (peft); default: full fine-tune",
        "lora_targets": "comma-separated modules LoRA adapts, e.g. q_proj,v_proj (default: every attention and MLP "
        "projection)",
        "selective": "selective checkpointing: what a CP layer keeps besides its input: "
        f"{', '.join(SELECTIVE_CHOICES)}, or comma-separated op names such as aten.mm,aten.bmm (default none)",
        "quantization": "a 4-bit base (QLoRA) or an 8-bit one: BitsAndBytesConfig's fields as JSON, e.g. "
        '{"load_in_4bit": true, "bnb_4bit_quant_type": "nf4"} or {"load_in_8bit": true}; needs --lora-rank',
        "attn_implementation": "the attention the model is built with (transformers' attn_implementation): "
        f"{', '.join(ATTN_IMPLEMENTATIONS)}; eager keeps each layer's heads x seq^2 probabilities, flash_attention_2 "
        f"needs CUDA and the flash-attn package (default {defaults.attn_implementation})",
        "world_size": f"ranks to simulate with a fake process group, 1 to {MAX_WORLD_SIZE} (with --fsdp); figures are "
        "rank 0's",
        "fsdp": "shard with FSDP2 (fully_shard on every decoder layer, then the root) across the ranks",
        "alloc_conf": "the caching allocator's settings as PYTORCH_CUDA_ALLOC_CONF says them, e.g. "
        "expandable_segments:True or max_split_size_mb:128 (default: torch's); simulate --gpu replays the step "
        "under them",
    }


def _type_options(field: SpecField, every_setting: bool) -> dict[str, Any]:
    """argparse's type, choices or store_true for a declared flag (``spec_fields.Cli.type``)."""
    assert field.cli is not None
    kind = field.cli.type
    if kind == "switch":
        return {"store_true": True}
    if kind == "choice":
        return {"choices": field.choices}
    if field.cli.special == "checkpointing" and every_setting:
        return {"type": every_n_or_all}
    readers: dict[str, Callable[[str], Any]] = {
        "int": int,
        "float": float,
        "names": split_names,
        "policy": selective_argument,
    }
    return {"type": readers[kind]} if kind in readers else {}


def add_run_arguments(
    run: argparse.ArgumentParser,
    defaults: RunSpec = RunSpec(),
    *,
    every_setting: bool = False,
    differently: Mapping[str, dict[str, Any]] | None = None,
) -> None:
    """The options of ``run`` that describe one spec, one for each shared flag ``ckptlab.spec_fields`` declares;
    ``simulate`` and ``sweep`` reuse them.

    ``every_setting``: ``--every-n-layers`` also takes "all" (``simulate``'s table). ``differently``: the fields a
    command takes its own way (``sweep``'s several lengths, its lists), by name, with argparse's options for the
    declared flag: added after ``--training-args``, in the declarations' order, in place of the plain ones.
    """
    differently = differently or {}
    add_spec_flags(run, [name for name in shared_fields() if name not in differently], defaults, every_setting)
    run.add_argument(
        "--training-args",
        metavar="FILE.json",
        help="your TrainingArguments as JSON (the fields TrainingArguments(**json) takes): the step they run; "
        "the flags above, where given, win over the file",
    )
    for field in spec_fields.FIELDS:
        if field.name in differently and field.cli is not None:
            run.add_argument(field.cli.flag, **differently[field.name])


def shared_fields() -> tuple[str, ...]:
    """The fields every command that describes a spec takes (``spec_fields.Cli.shared``), in the declarations'
    order; read when asked, so a field declared there is a flag by itself."""
    return tuple(field.name for field in spec_fields.FIELDS if field.cli is not None and field.cli.shared)


def add_spec_flags(
    parser: argparse._ActionsContainer,
    names: Sequence[str],
    defaults: RunSpec = RunSpec(),
    every_setting: bool = False,
    helps: Mapping[str, str] | None = None,
) -> None:
    """The declared flags of the fields ``names`` (``spec_fields.Cli``: the flag, how argparse reads it, its metavar,
    its special adder), in the declarations' order, each defaulting to ``defaults``' value and storing the field of
    its name; ``helps``: a command's own help for a field (``run``'s and ``sweep``'s ``--repeats``), else the shared
    one."""
    helps = {**_helps(defaults, every_setting), **(helps or {})}
    for field in spec_fields.FIELDS:
        if field.cli is None or field.name not in names:
            continue
        options = _type_options(field, every_setting)
        if "store_true" not in options:
            options["default"] = getattr(defaults, field.name)
        if field.cli.metavar is not None:
            options["metavar"] = field.cli.metavar
        if field.name in helps:
            options["help"] = helps[field.name]
        if field.cli.special in ADD_SPECIAL:
            ADD_SPECIAL[field.cli.special](parser, field.cli.flag, options)
        else:
            _flag(parser, field.cli.flag, dest=field.name, **options)


def _model_flags(run: argparse._ActionsContainer, flag: str, options: dict[str, Any]) -> None:
    """``--model``, and ``--revision`` of a Hub repository (which travels inside the name: owner/name@revision)."""
    _flag(run, flag, **options)
    _flag(
        run,
        "--revision",
        default=None,
        help="a branch, tag or commit of the Hub repository --model names (default: its main branch)",
    )


def _checkpointing_flags(run: argparse._ActionsContainer, flag: str, options: dict[str, Any]) -> None:
    """``--every-n-layers N`` or ``--no-checkpointing`` (every_n_layers=None), one or the other."""
    setting = run.add_mutually_exclusive_group()
    _flag(setting, flag, **options)
    _flag(setting, "--no-checkpointing", store_true=True, help="run with checkpointing off")


def _quantization_flag(run: argparse._ActionsContainer, flag: str, options: dict[str, Any]) -> None:
    """``--quantization-config FILE.json``: the field's value is the file's (``spec_from_args`` reads it)."""
    _flag(run, flag, **{**options, "dest": "quantization", "default": None})


# The shared flags added their own way (spec_fields.Cli.special names them): parser, flag, argparse's options.
ADD_SPECIAL: dict[str, Callable[[argparse._ActionsContainer, str, dict[str, Any]], None]] = {
    "model": _model_flags,
    "checkpointing": _checkpointing_flags,
    "quantization_file": _quantization_flag,
}


def selective_argument(text: str) -> str | tuple[str, ...]:
    """A policy's name, or op names (any name with a dot); torch's check of the names is the spec's."""
    if text in SELECTIVE_CHOICES:
        return text
    if "." in text:
        return split_names(text)
    raise argparse.ArgumentTypeError(t("cli.selective_choice", text=text, choices=", ".join(SELECTIVE_CHOICES)))


def spec_from_args(args: argparse.Namespace, **extra) -> RunSpec:
    """The :class:`RunSpec` the options of :func:`add_run_arguments` describe.

    With ``--training-args``, the file gives the step's fields (``RunSpec.from_training_args``) and the
    flags given on the command line win over it; ``extra`` wins over both.

    Raises:
        SpecError: a training args file that cannot be read as TrainingArguments.
    """
    # The flags of add_run_arguments, each setting the RunSpec field of its name (--no-checkpointing sets
    # every_n_layers): every field but the commands' own (run's and sweep's --repeats and --warmup, the ranks).
    spec_flags = shared_fields()
    flags = {field: getattr(args, field) for field in spec_flags}
    # A revision travels inside the model's name (owner/name@revision): one string every front end and the JSON keep.
    flags["model"] = hub.with_revision(flags["model"], getattr(args, "revision", None))
    if args.no_checkpointing:
        flags["every_n_layers"] = None
    if isinstance(flags["quantization"], str):  # --quantization-config FILE.json
        flags["quantization"] = load_quantization_file(flags["quantization"])
    extra = {"world_size": getattr(args, "world_size", 1), "fsdp": getattr(args, "fsdp", False), **extra}
    path = getattr(args, "training_args", None)
    if path is None:
        return RunSpec(**flags, **extra)
    given: frozenset[str] = getattr(args, "given", frozenset())
    # The file does not say the model nor the sequence (TrainingArguments has neither): the flags do.
    chosen = {"model", "seq_len"} | {dest for dest in given if dest in spec_flags}
    if "no_checkpointing" in given:
        chosen.add("every_n_layers")
    return RunSpec.from_training_args(
        load_training_args_file(path), **{field: flags[field] for field in chosen}, **extra
    )


def check_before_the_core(spec: RunSpec, *, seq_len_is_a_guess: bool = False) -> None:
    """Every check of ``spec`` that needs no model built: its values, that its model is a preset or a folder, and a
    preset's limits as stored (``RunSpec.check_model_limits``; a folder's and a Hub repository's are in their config,
    read by the core).

    Called before a command imports the core (torch, transformers), so a typo or a sequence past a preset's positions
    is answered at once (0.3 s of CPU, where importing the core first cost 4 s: benchmarks/simulate_process.py).

    Args:
        seq_len_is_a_guess: ``spec.seq_len`` is where a search starts (``simulate --longest-seq``), not a length to
            run: the search stops at the positions itself.

    Raises:
        SpecError: the first bad value (``RunSpec.validate``), a sequence past a preset's positions.
        ModelLoadError: a model that is neither a preset nor an existing directory.
        UnsupportedModelError: checkpointing asked of a preset whose class cannot checkpoint.
    """
    spec.validate()
    check_model_named(os.fspath(spec.model))
    info = stored_fact(os.fspath(spec.model))
    if info is not None:
        (replace(spec, seq_len=1) if seq_len_is_a_guess else spec).check_model_limits(info)


def core_loaded(args: argparse.Namespace) -> None:
    """Called by a command once it imported the core: in ``python -m ckptlab``'s own process, what the imports
    loaded is frozen out of the collector's walks and the collector, paused while they ran (``ckptlab/__main__.py``),
    runs again (``ckptlab.torchstate.freeze_what_is_loaded``); a caller's ``main([...])`` keeps its collector as it
    was."""
    if args.own_process:
        freeze_what_is_loaded()


def training_args_lines(args: argparse.Namespace) -> list[str]:
    """What a ``--training-args`` file left to Trainer's defaults and what it set that the lab does not count, for
    the text output; empty without a file."""
    path = getattr(args, "training_args", None)
    if path is None:
        return []
    reading = read_training_args(load_training_args_file(path))
    given: frozenset[str] = getattr(args, "given", frozenset())
    lines = [t("cli.training_args_from", path=path)]
    defaulted = {name: value for name, value in reading.defaulted.items() if DEFAULTED_NAMES[name] not in given}
    if defaulted:
        listed = ", ".join(f"{name}={value!r}" for name, value in defaulted.items())
        lines.append("  " + t("cli.training_args_defaulted", listed=listed))
    if reading.unused:
        lines.append("  " + t("cli.training_args_unused", names=", ".join(reading.unused)))
    return lines


def argv_from_spec(spec: RunSpec) -> list[str]:
    """The ``run`` options that give back ``spec`` (world size aside: the launcher sets it); for launched ranks.

    Each declared flag with its value (``spec_fields``); a switch where on, nothing for None.
    """
    argv: list[str] = []
    for field in spec_fields.FIELDS:
        value = getattr(spec, field.name)
        if field.cli is None:
            continue
        if field.cli.special in ARGV_SPECIAL:
            argv += ARGV_SPECIAL[field.cli.special](field.cli.flag, value)
        elif field.cli.type == "switch":
            argv += [field.cli.flag] if value else []
        elif value is not None:
            words = ",".join(value) if isinstance(value, tuple) else repr(value) if isinstance(value, float) else value
            argv += [field.cli.flag, str(words)]
    return argv


# The fields written back their own way (spec_fields.Cli.special names them): the flag and the value -> argv.
ARGV_SPECIAL: dict[str, Callable[[str, Any], list[str]]] = {
    "checkpointing": lambda flag, every: ["--no-checkpointing"] if every is None else [flag, str(every)],
    # Not written: a file's fields; ranks refuse LoRA (spec.fsdp_with_lora), which a 4-bit base needs.
    "quantization_file": lambda flag, quantization: [],
    "ranks": lambda flag, size: [],  # the launcher sets the world size
}


# The flags whose dest is not the RunSpec field they set: a switch for one value, and run's ranks.
_DEST_IS_OPTION = {"no_checkpointing": "every_n_layers=None", "nproc_per_node": "world_size"}


def option_flags(parser: argparse.ArgumentParser) -> CliFlags:
    """Each command's flags by the option they set (``ckptlab.show.wording.CliFlags``), read from its parser.

    The parser is the one home of a flag's name: a core error names a setting by its RunSpec field
    (``ckptlab.errors.Option``) and the CLI words it with the flag its own parser reads into that field,
    so there is no second table to keep in step. An action's dest is its field but for
    :data:`_DEST_IS_OPTION`.
    """
    flags: dict[str, dict[str, Flag]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                table = flags.setdefault(name, {})
                for option in command._actions:
                    long = [text for text in option.option_strings if text.startswith("--")]
                    if long and option.dest != "help":
                        table.setdefault(
                            _DEST_IS_OPTION.get(option.dest, option.dest), Flag(long[0], option.nargs == 0)
                        )
    return flags


def print_progress(message: Fact, fraction: float) -> None:
    print(f"\r[{fraction:>4.0%}] {say(message):<50}", end="", file=sys.stderr, flush=True)


class LineProgress:
    """Progress for a standard error that is not a terminal (a log, CI, ``nohup``): one line each time the message
    changes, so a long run says it is alive without a carriage return a file cannot show."""

    def __init__(self) -> None:
        self._last = ""

    def __call__(self, message: Fact, fraction: float) -> None:
        words = say(message)
        if words != self._last:
            self._last = words
            print(f"[{fraction:>4.0%}] {words}", file=sys.stderr, flush=True)
