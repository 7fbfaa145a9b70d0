"""``python -m ckptlab sweep``: every setting of one model, measured, predicted and recommended.

Registered in :data:`ckptlab.cli.COMMANDS`. The sweep's own axes (several sequence
lengths, a list of every_n_layers, offload no/yes/both) are strings parsed here, so that a
bad value gets the lab's one-line message and exit status 2 rather than argparse's usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..explore.budget import GPUS, budget_size, gpu_name
from ..explore.sweep_spec import OFFLOAD_CHOICES, SweepSpec
from ..model.attention import ATTN_IMPLEMENTATIONS
from ..model.libraries import import_transformers_models
from ..model.presets import check_model_named
from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..show.i18n import say, t
from ..show.labels import provenance_label
from ..show.peak_words import peak_where
from ..show.report import RERUN_SHARE_NOTE, VERDICT_LEGEND, VERDICT_WORDS, busy_note, percent, training_name
from ..spec import RunSpec
from ..units import mib, milliseconds
from .args import (
    EXIT_BAD_INPUT,
    add_run_arguments,
    add_spec_flags,
    core_loaded,
    print_progress,
    selective_argument,
    spec_from_args,
    training_args_lines,
)

if TYPE_CHECKING:
    from ..explore.accuracy import PredictionCheck
    from ..explore.recommend import Recommendation
    from ..explore.sweep import SweepResult


def add_sweep_command(commands) -> None:
    """Add ``sweep`` to the subcommands (one entry of ``COMMANDS``)."""
    sweep_parser = commands.add_parser(
        "sweep", help="measure checkpointing off and every every_n_layers: memory against time"
    )
    defaults = RunSpec()
    # The sweep's axes: the declared flags taken as lists (strings parsed here, for the lab's one-line message).
    axes: dict[str, dict[str, Any]] = {
        "seq_len": dict(
            default=str(defaults.seq_len), help=f"one or more lengths, e.g. 256,512,1024 (default {defaults.seq_len})"
        ),
        "every_n_layers": dict(default="all", help="'all' (1 .. the layer count) or a list, e.g. 1,2,4 (default all)"),
        "offload": dict(default="no", help="no, yes or both (offload rows run on CUDA only; default no)"),
        "selective": dict(
            nargs="+",
            type=selective_argument,
            default=[defaults.selective],
            metavar="POLICY",
            help=f"one or more selective policies, e.g. --selective none attention: each checkpointed setting is "
            f"measured with each ({', '.join(SELECTIVE_CHOICES)}, or comma-separated op names; default none)",
        ),
        "attn_implementation": dict(
            nargs="+",
            default=[defaults.attn_implementation],
            metavar="KERNEL",
            help=f"one or more attention implementations, e.g. --attn-implementation sdpa eager: every row (off "
            f"included) is measured with each ({', '.join(ATTN_IMPLEMENTATIONS)}; default "
            f"{defaults.attn_implementation})",
        ),
    }
    add_run_arguments(sweep_parser, defaults, differently=axes)
    # A sweep has an off row of its own: the flag is refused by name (sweep_spec_from_args), not hidden by argparse.
    sweep_parser.add_argument("--no-checkpointing", action="store_true", help=argparse.SUPPRESS)
    steps_help = {  # the sweep's own words for the declared flags
        "repeats": f"timed steps per row (default {defaults.repeats})",
        "warmup": f"untimed steps before the first row of each length (default {defaults.warmup})",
    }
    add_spec_flags(sweep_parser, ("repeats", "warmup"), defaults, helps=steps_help)
    sweep_parser.add_argument(
        "--warmup-each-row", action="store_true", help="warm up before every row, as single runs do"
    )
    sweep_parser.add_argument("--budget", help="memory budget for a recommendation: bytes or e.g. 24GiB, 512MiB")
    sweep_parser.add_argument(
        "--gpu", help=f"recommend for a GPU: {', '.join(GPUS)} (or a short name: H100, L4, 4090, ...)"
    )
    output = sweep_parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print rows, predictions and recommendation as JSON")
    output.add_argument("--csv", action="store_true", help="print the rows as CSV")
    sweep_parser.set_defaults(handler=_sweep)


def parse_seq_lens(text: str) -> tuple[int, ...]:
    """``"256,512"`` -> ``(256, 512)``.

    Raises:
        SpecError: naming the value that is not a whole number >= 1.
    """
    return _whole_numbers(text, "cli.seq_lens_not_whole")


def parse_every_n_layers(text: str) -> tuple[int, ...] | None:
    """``"all"`` -> ``None``; ``"1,2,4"`` -> ``(1, 2, 4)``.

    Raises:
        SpecError: naming the value that is not ``all`` or a whole number >= 1.
    """
    if text.strip().lower() == "all":
        return None
    return _whole_numbers(text, "cli.every_n_layers_not_whole")


def _whole_numbers(text: str, key: str) -> tuple[int, ...]:
    """``"1,2,2"`` -> ``(1, 2)``: whole numbers >= 1, in order, once each; else the SpecError ``key``."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise SpecError(key=key, text=text, part=part)
        values.append(int(part))
    return tuple(dict.fromkeys(values))


def sweep_spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The :class:`SweepSpec` the options describe.

    Raises:
        SpecError: a bad list, offload choice or flag.
    """
    if args.no_checkpointing:
        raise SpecError(key="cli.sweep_no_checkpointing")
    if args.offload not in OFFLOAD_CHOICES:
        raise SpecError(key="cli.sweep_offload", value=args.offload, choices=", ".join(OFFLOAD_CHOICES))
    seq_lens = parse_seq_lens(args.seq_len)
    policies = tuple(args.selective)
    # One policy is the sweep it always was (SweepSpec.selective); several are its policy axis.
    one = policies[0] if len(policies) == 1 else "none"
    attentions = tuple(args.attn_implementation)  # one: every row's; several: the attention axis
    base = spec_from_args(
        replace_namespace(
            args, seq_len=seq_lens[0], every_n_layers=1, offload=False, selective=one, attn_implementation=attentions[0]
        ),
        repeats=args.repeats,
        warmup=args.warmup,
    )
    spec = SweepSpec.from_run_spec(
        base,
        seq_lens=seq_lens,
        every_n_layers=parse_every_n_layers(args.every_n_layers),
        offload=args.offload,
        warmup_each_row=args.warmup_each_row,
        **({"policies": policies} if len(policies) > 1 else {}),
        **({"attn_implementations": attentions} if len(attentions) > 1 else {}),
    )
    spec.validate()
    return spec


def replace_namespace(args: argparse.Namespace, **changes) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def _sweep(args: argparse.Namespace) -> int:
    spec = sweep_spec_from_args(args)
    budget: int | str | None = None
    if args.gpu is not None:
        budget = gpu_name(args.gpu)
    if args.budget is not None:
        budget = budget_size(args.budget, "--budget")
    check_model_named(spec.model)  # the spec's values are checked (sweep_spec_from_args); the model's name too
    import_transformers_models()  # before the core's imports: transformers' model folders read once (model.libraries)
    from ..explore.accuracy import check_predictions  # the core, once the flags are known good (see ckptlab.cli)
    from ..explore.recommend import recommend
    from ..explore.sweep import sweep

    core_loaded(args)
    progress = print_progress if sys.stderr.isatty() and not (args.json or args.csv) else None
    result = sweep(spec, progress=progress)
    if progress:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr)
    checks = check_predictions(result) if result.rows else []
    recommendation = recommend(result.rows, budget) if budget is not None and result.rows else None
    if args.csv:
        print(result.to_csv(), end="")
    elif args.json:
        data = result.to_dict()
        data["predictions"] = [check.to_dict() for check in checks]
        data["recommendation"] = None if recommendation is None else _recommendation_dict(recommendation)
        print(json.dumps(data, indent=2))
    else:
        print("\n".join([*training_args_lines(args), sweep_report(result, checks, recommendation)]))
    if not any(row.status == "ok" for row in result.rows):
        print(t("cli.error", message=t("cli.nothing_fitted")), file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _recommendation_dict(rec: Recommendation) -> dict:
    return {
        "budget_bytes": rec.budget_bytes,
        "budget_label": rec.budget_label,
        "seq_len": rec.seq_len,
        "setting": None if rec.row is None else rec.row.setting,
        "every_n_layers": None if rec.row is None else rec.row.every_n_layers,
        "offload": None if rec.row is None else rec.row.offload,
        "selective": None if rec.row is None else rec.row.selective,
        "margin_bytes": rec.margin_bytes,
        "reason": rec.reason,
        "model_code": rec.model_code,
        "trainer_code": rec.trainer_code,
        "suggestions": rec.suggestions,
        "ranked_by": rec.ranked_by,
        "predicted_recompute": rec.recompute,
    }


def sweep_report(
    result: SweepResult, checks: list[PredictionCheck], recommendation: Recommendation | None = None
) -> str:
    """The sweep as text: the measured table, the predictions beside it, the recommendation."""
    from ..explore.predict_training import LORA_ACTIVATIONS_NOTE

    spec = result.spec
    first = next((row.result for row in result.rows if row.result is not None), None)
    lines = [
        t(
            "cli.sweep_head",
            model=result.model,
            layers=result.num_layers,
            batch=spec.batch_size,
            device=result.device,
            measured=f" · {first.dtype} · {provenance_label(first.provenance)}" if first else "",
            training=training_name(spec.run_spec(spec.seq_lens[0], None, False)),
        )
    ]
    timings = [row.result.timing for row in result.rows if row.result is not None and row.result.timing is not None]
    busy = busy_note(
        result.busy_reasons,
        max((t.load_average for t in timings if t.load_average is not None), default=None),
        next((t.cores for t in timings if t.cores), None),
        max((t.relative_spread for t in timings if t.relative_spread is not None), default=None),
    )
    if busy:
        lines.append(busy)
    lines += [t("cli.note", note=say(note)) for note in result.notes]
    if result.cancelled:
        lines.append(t("cli.note", note=t("cli.sweep_stopped", rows=len(result.rows))))
    lines += ["", t("cli.sweep_measured_legend"), _header(MEASURED_COLUMNS)]
    for row in result.rows:
        if row.status != "ok":
            does_not_fit = t("cli.row_does_not_fit", message=row.message)
            lines.append(f"{row.seq_len:>6}  {row.setting:<14}{row.cp_layers:>3}  {does_not_fit}")
            continue
        lines.append(
            f"{row.seq_len:>6}  {row.setting:<14}{row.cp_layers:>3}  {_mib(row.after_forward_bytes):>9} {_x(row.after_forward_ratio):>6}"
            f"  {_mib(row.peak_above_baseline_bytes):>7} {_x(row.peak_ratio):>6} {_mib(row.peak_bytes):>7} {_mib(row.optimizer_state_bytes):>7}  {_ms(row.forward_s):>6} {_ms(row.backward_s):>6}"
            f" {_ms(row.step_s):>6} {_x(row.step_ratio):>6} {_spread(row.step_spread):>6} {VERDICT_WORDS.get(row.step_verdict, ''):>10}"
            f"  {peak_where(row)}"
        )
    lines.append(VERDICT_LEGEND)
    if checks:
        lines += ["", t("cli.sweep_predicted_legend"), _header(PREDICTED_COLUMNS)]
        for check in checks:
            lines.append(
                f"{check.seq_len:>6}  {check.setting:<14}{_mib(check.measured_after_forward_bytes):>9}  {mib(check.formula_after_forward_bytes):>9}"
                f" {percent(check.formula_error):>7}  {_mib(check.calibrated_after_forward_bytes):>10} {percent(check.calibrated_error):>7}"
                f"  {check.recompute_fraction + 0.0:>10.0%}  {_mib(check.measured_peak_bytes):>7} {_mib(check.formula_peak_bytes):>8}"
                f" {percent(check.formula_peak_error):>7} {check.formula_peak_phase or ''}"
            )
        lines += [
            t("cli.sweep_formula_legend"),
            RERUN_SHARE_NOTE,
            t("cli.sweep_peak_legend", range=backward_range(checks)),
        ]
        if spec.lora_rank is not None:
            lines.append(t("cli.note", note=say(LORA_ACTIVATIONS_NOTE)))
    if recommendation is not None:
        lines.append("")
        head = t("cli.recommendation_head", label=recommendation.budget_label, seq_len=recommendation.seq_len)
        lines.append(head)
        lines.append(f"  {recommendation.reason}")
        if recommendation.row is not None:
            lines += ["  " + line for line in recommendation.model_code.splitlines()]
            if recommendation.row.result is None:  # a row without its run: the box is its setting's line alone
                lines += ["  " + line for line in recommendation.trainer_code.splitlines()]
        lines += [f"  - {suggestion}" for suggestion in recommendation.suggestions]
    return "\n".join(lines)


def backward_range(checks: list[PredictionCheck]) -> str:
    """The backward estimates' error on the rows shown (" (-9.1% to +22.0% above)"), never a range measured elsewhere."""
    errors = [
        c.formula_peak_error for c in checks if c.formula_peak_phase == "backward" and c.formula_peak_error is not None
    ]
    if not errors:
        return ""
    low, high = min(errors), max(errors)
    if low == high:
        return " " + t("cli.sweep_range_one", error=percent(low))
    return " " + t("cli.sweep_range", low=percent(low), high=percent(high))


# The tables' columns as the rows below them are aligned: (the space before it, its header's key, its alignment
# and width); the last one's rows are of any length.
MEASURED_COLUMNS = (
    ("", "seq", ">6"),
    ("  ", "setting", "<14"),
    ("", "cp", ">3"),
    ("  ", "resident", ">9"),
    (" ", "x_off", ">6"),
    ("  ", "peak", ">7"),
    (" ", "x_off", ">6"),
    (" ", "total", ">7"),
    (" ", "optim", ">7"),
    ("  ", "fwd", ">6"),
    (" ", "bwd", ">6"),
    (" ", "step", ">6"),
    (" ", "x_off", ">6"),
    (" ", "spread", ">6"),
    (" ", "time", ">10"),
    ("  ", "peak_reached_in", ""),
)
PREDICTED_COLUMNS = (
    ("", "seq", ">6"),
    ("  ", "setting", "<14"),
    ("", "measured", ">9"),
    ("  ", "formula", ">9"),
    (" ", "error", ">7"),
    ("  ", "calibrated", ">10"),
    (" ", "error", ">7"),
    ("  ", "rerun_share", ">11"),
    ("  ", "peak", ">7"),
    (" ", "formula", ">8"),
    (" ", "error", ">7"),
    (" ", "in", ""),
)


def _header(columns: tuple[tuple[str, str, str], ...]) -> str:
    """A table's header line: each column's word from the locale files, aligned as its rows."""
    return "".join(f"{space}{t(f'cli.column_{key}'):{align}}" for space, key, align in columns)


def _x(ratio: float | None) -> str:
    return "" if ratio is None else f"x{ratio:.2f}"


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else milliseconds(seconds)


def _spread(spread: float | None) -> str:
    return "" if spread is None else f"{spread:.0%}"


def _mib(value: int | None) -> str:
    return "" if value is None else mib(value)
