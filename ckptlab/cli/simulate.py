"""``python -m ckptlab simulate``: a real model size on fake tensors, and whether it fits a GPU.

Registered in :data:`ckptlab.cli.COMMANDS`; the spec options are ``run``'s.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..explore.budget import GPUS, MAX_BUDGET_GIB, Fit, budget_bytes, budget_size, fit, fits, gpu_name
from ..model.libraries import import_transformers_models
from ..show.i18n import say, t
from ..show.labels import provenance_label
from ..show.report import region_words, run_report
from ..units import GIB, mib, milliseconds
from .args import (
    EVERY_SETTING,
    add_run_arguments,
    add_spec_flags,
    check_before_the_core,
    core_loaded,
    spec_from_args,
    training_args_lines,
)

if TYPE_CHECKING:
    from ..explore.longest import LongestSeq
    from ..explore.roofline import SettingTime
    from ..results import RunResult
    from ..results.allocations import DeviceTotal
    from ..spec import RunSpec


def add_simulate_command(commands) -> None:
    """Add ``simulate`` to the subcommands (one entry of ``COMMANDS``)."""
    parser = commands.add_parser(
        "simulate", help="simulate one step of a real model size on fake tensors: memory a GPU would need"
    )
    add_run_arguments(parser, every_setting=True)
    add_spec_flags(parser, ("world_size", "fsdp"))
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument(
        "--gpu",
        help=(
            "say whether it fits this GPU and predict its step time there (roofline): "
            f"{', '.join(GPUS)} (e.g. --gpu H100-80)"
        ),
    )
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
    search = parser.add_mutually_exclusive_group()
    search.add_argument(
        "--fewest-gpus",
        action="store_true",
        help="search the fewest GPUs (FSDP2 past one: 1, 2, 4, 8, 16, 64), then the least recompute, whose simulated "
        "step fits --gpu or --budget on each GPU, for the setting given (with --every-n-layers all: the At-scale "
        "page's settings); GPU counts whose parameters, gradients and optimizer state alone do not fit are skipped",
    )
    search.add_argument(
        "--longest-seq",
        action="store_true",
        help="search the longest --seq-len whose simulated step fits --gpu or --budget, for the setting given "
        "(with --every-n-layers all: off and each distinct every_n_layers); --seq-len is the first guess",
    )
    parser.add_argument("--json", action="store_true", help="print only the result (and the verdict) as JSON")
    parser.set_defaults(handler=_simulate_command)


def fit_verdict(result: RunResult, budget: int, label: str, beside: DeviceTotal | None = None) -> dict:
    """Whether the simulated peak of the whole training step fits ``budget``, by how much, and what it counts; with
    ``beside`` (the same step's order replayed under another allocator setting: ``explore.device.expandable_beside``),
    that total and its fit too, side by side."""
    memory, spec = result.memory, result.spec
    assert memory is not None  # a simulation always has its memory (status "ok"; no time)
    peak = memory.peak_bytes
    # The one rule: what nvidia-smi will show (the device total) within the budget, where the result carries it.
    answer = fit(peak, budget, result.device_total)
    margin, fitting = answer.margin_bytes, answer.fits
    phase = memory.peak_where.phase or "step"
    state = t("cli.fit_state", gib=memory.optimizer_state_bytes / GIB) if memory.optimizer_state_bytes else ""
    if answer.device is not None:
        lines = [device_line(answer.device)]
        if answer.device.alloc_conf:
            lines[0] = t("cli.device_total_under", alloc_conf=answer.device.alloc_conf, line=lines[0])
        if answer.device.out_of_memory_at is not None and margin >= 0:  # the total fits, the allocator does not
            lines.append(
                t(
                    "cli.fit_device_fragmented",
                    label=label,
                    budget_gib=budget / GIB,
                    event=answer.device.out_of_memory_at,
                    state=state,
                )
            )
        else:
            lines.append(
                t(
                    "cli.fit_device_fits" if fitting else "cli.fit_device_short",
                    label=label,
                    budget_gib=budget / GIB,
                    margin_gib=abs(margin) / GIB,
                    state=state,
                )
            )
        if beside is not None:  # the same order replayed under the other setting: the one rule decides it too
            other = fit(peak, budget, beside)
            lines.append(t("cli.device_total_under", alloc_conf=beside.alloc_conf, line=device_line(beside)))
            lines.append(
                t(
                    "cli.beside_fits" if other.fits else "cli.beside_short",
                    label=label,
                    budget_gib=budget / GIB,
                    margin_gib=abs(other.margin_bytes) / GIB,
                    change_gib=(beside.total_bytes - answer.device.total_bytes) / GIB,
                )
            )
        sentence = "\n".join(lines)
    else:
        # Only this sentence says what the peak counts: recommend's imports (sweep, predict, ...; 0.07 s of CPU) are
        # not a --gpu simulate's, whose verdict is the device total's (issue 61).
        from ..explore.recommend import counts_message

        sentence = t(
            "cli.fit_fits" if fitting else "cli.fit_short",
            peak_mib=mib(peak),
            peak_gib=peak / GIB,
            phase=phase,
            label=label,
            budget_gib=budget / GIB,
            margin_gib=abs(margin) / GIB,
            state=state,
            counts=say(counts_message(spec.optimizer, spec.lora_rank)),
        )
    return {
        "budget_bytes": budget,
        "budget_label": label,
        "fits": fitting,
        "margin_bytes": margin,
        "peak_phase": memory.peak_where.phase or None,
        "optimizer": spec.optimizer,
        "optimizer_state_bytes": memory.optimizer_state_bytes,
        "compared_bytes": answer.peak_bytes,  # the device total where there is one, else the tensors' peak
        "compared": "device_total" if answer.device is not None else "peak",
        # The same step under expandable_segments:True, typed as the result's own device_total is.
        **({"beside": _beside_json(beside, fit(peak, budget, beside))} if beside is not None else {}),
        "sentence": sentence,
    }


def _beside_json(total: DeviceTotal, answer: Fit) -> dict:
    from dataclasses import asdict

    return asdict(total) | {
        "cached_bytes": total.cached_bytes,
        "total_bytes": total.total_bytes,
        "fits": answer.fits,
        "margin_bytes": answer.margin_bytes,
    }


def device_line(total: DeviceTotal) -> str:
    """What nvidia-smi will show, term by term, in the CLI's words (GiB at the edge)."""
    context = t("cli.context_measured", gpu=total.gpu) if total.context_measured else t("cli.context_estimated")
    line = t(
        "cli.device_total",
        total_gib=total.total_bytes / GIB,
        allocated_gib=total.allocated_bytes / GIB,
        cached_gib=total.cached_bytes / GIB,
        context_gib=total.context_bytes / GIB,
        context=context,
        cublas_gib=total.cublas_bytes / GIB,
        order=t(f"cli.order_{total.trace_how}"),
    )
    if total.nccl_bytes:  # across ranks: NCCL's buffers, outside torch, always an estimate
        line += " " + t("cli.device_nccl", nccl_gib=total.nccl_bytes / GIB, source=total.nccl_source)
    return line


def _simulate_command(args: argparse.Namespace) -> int:
    every_setting = args.every_n_layers == EVERY_SETTING
    # The table's spec stands for its settings: every_n_layers is set per setting.
    spec = spec_from_args(argparse.Namespace(**{**vars(args), "every_n_layers": 1}) if every_setting else args)
    budget = _budget(args)
    check_before_the_core(spec, seq_len_is_a_guess=args.longest_seq)
    if args.longest_seq:
        if budget is None:
            raise SpecError(key="cli.longest_seq_needs_memory")
        return _longest_command(args, spec, budget, every_setting)
    if args.fewest_gpus:
        if budget is None:
            raise SpecError(key="cli.fewest_gpus_needs_memory")
        return _fewest_command(args, spec, budget, every_setting)
    if every_setting:
        return _table_command(args, spec, budget)
    from ..step.simulate import simulate  # the core, once the flags are known good (see ckptlab.cli)

    core_loaded(args)
    result = simulate(spec, fast=not args.exact, allocations=budget is not None)
    if budget is not None:  # the caching allocator replayed on the GPU (or a card of the budget's bytes)
        from ..explore.device import with_device_total

        result = with_device_total(result, args.gpu or budget[0])
    beside = None
    if (
        budget is not None
    ):  # the setting not given: expandable segments beside torch's defaults, the same order replayed
        from ..explore.device import expandable_beside

        beside = expandable_beside(result, args.gpu or budget[0])
    verdict = fit_verdict(result, *budget, beside=beside) if budget else None
    times = _setting_times(args, [result], simulate) if args.gpu else None
    if args.json:
        data = result.to_dict()
        if verdict:
            data["fit"] = verdict
        if times is not None:
            data |= time_json(times[0])
        print(json.dumps(data, indent=2))
    else:
        print("\n".join([*training_args_lines(args), run_report(result)]))
        if verdict:
            print("\n" + verdict["sentence"])
        if times is not None:
            print("\n" + time_report(times[0]))
    return 0


def _setting_times(args: argparse.Namespace, results: list[RunResult], simulate) -> list[SettingTime]:
    """Each result's predicted time on ``--gpu`` and its factor over off; a lone checkpointed setting that carries
    counted work has off simulated beside it (the factor needs it), and off's own row left out."""
    from ..explore.gpus import GPU_SPECS
    from ..explore.roofline import setting_times, step_work
    from ..spec import Setting

    speed = GPU_SPECS[gpu_name(args.gpu)]
    settings = [Setting.of(result.spec) for result in results]
    if any(setting.every_n_layers is None for setting in settings) or step_work(results[0]) is None:
        return setting_times(results, speed)
    off = simulate(replace(results[0].spec, every_n_layers=None, offload=False), fast=not args.exact)
    return setting_times([*results, off], speed)[: len(results)]


def time_report(row: SettingTime) -> str:
    """One setting's predicted step time in words: seconds, the rerun's share, tokens/s, MFU, each phase and the
    factor over off; or the one line that says the simulation counted no work to time."""
    prediction = row.prediction
    if prediction is None:
        return t("cli.time_no_work")
    lines = [
        t(
            "cli.time_predicted",
            device=prediction.device,
            ms=milliseconds(prediction.seconds),
            rerun_pct=100 * prediction.rerun_share,
            tokens_per_s=prediction.tokens_per_s,
            mfu_pct=100 * prediction.mfu,
            provenance=provenance_label(prediction.provenance),
        ),
        t(
            "cli.time_phases",
            phases=", ".join(
                t("cli.time_phase", phase=t(f"cli.phase_{phase}"), ms=milliseconds(seconds))
                for phase, seconds in prediction.by_phase.items()
                if seconds
            ),
        ),
    ]
    if row.factor_over_off is not None:
        lines.append(t("cli.time_factor", factor=row.factor_over_off))
    return "\n".join(lines)


def longest_json(row: LongestSeq) -> dict:
    """A longest-sequence row's JSON: its figures, without the counted work of its step (thousands of ops)."""
    data = asdict(replace(row, work=None))
    del data["work"]
    return data


def time_json(row: SettingTime) -> dict:
    """The predicted time's JSON fields of one setting: the typed prediction and its factor over off, or null and
    the sentence that says why there is none."""
    note = None if row.prediction is not None else t("cli.time_no_work")
    return {"predicted_time": row.to_dict(), "predicted_time_note": note}


def time_table_report(rows: list[SettingTime]) -> str:
    """One line per setting under the table: its predicted step time and its factor over off."""
    timed = [row.prediction for row in rows if row.prediction is not None]
    if not timed:
        return t("cli.time_no_work")
    setting_word, step_ms, factor = (t(f"cli.column_{name}") for name in ("setting", "step_ms", "factor_over_off"))
    lines = [
        t("cli.time_table_head", device=timed[0].device, provenance=provenance_label(timed[0].provenance)),
        f"{setting_word:<14} {step_ms:>10} {factor:>8}",
    ]
    for row in rows:
        ms = "-" if row.prediction is None else milliseconds(row.prediction.seconds)
        times = "-" if row.factor_over_off is None else f"x{row.factor_over_off:.2f}"
        lines.append(f"{row.setting.key:<14} {ms:>10} {times:>8}")
    return "\n".join(lines)


def _longest_command(args: argparse.Namespace, spec: RunSpec, budget: tuple[int, str], every_setting: bool) -> int:
    """``--longest-seq``: per setting, the longest sequence whose simulated step fits the budget."""
    import_transformers_models()  # before the core's imports: transformers' model folders read once (model.libraries)
    from ..explore.longest import (  # the core, once the flags are known good (see ckptlab.cli)
        longest_seq,
        refuse_over_floor,
    )
    from ..explore.scale import every_n_choices
    from ..model import catalog

    core_loaded(args)
    refuse_over_floor(spec, budget[0])  # at once, not after a search that simulates every length down to the least
    specs = [spec]
    if every_setting:
        num_layers = catalog.describe(spec.model).num_layers
        specs = [replace(spec, every_n_layers=None, offload=False)]
        specs += [replace(spec, every_n_layers=n) for n in every_n_choices(num_layers, "distinct")]
    rows = [longest_seq(one, budget[0], gpu=args.gpu) for one in specs]  # decided on what nvidia-smi will show
    if args.json:
        print(json.dumps({"longest_seq": [longest_json(row) for row in rows], "budget_label": budget[1]}, indent=2))
        return 0
    print("\n".join([*training_args_lines(args), longest_report(spec, rows, budget)]))
    return 0


def _fewest_command(args: argparse.Namespace, spec: RunSpec, budget: tuple[int, str], every_setting: bool) -> int:
    """``--fewest-gpus``: the fewest GPUs, then the least recompute, whose simulated step fits the budget a GPU."""
    import_transformers_models()  # before the core's imports: transformers' model folders read once (model.libraries)
    from ..explore.gpu_search import cheapest_that_fits  # the core, once the flags are known good (see ckptlab.cli)
    from ..explore.scale import ScaleRequest, scale_settings
    from ..model import catalog
    from ..spec import Setting
    from ..step.preflight import simulated_dtype

    core_loaded(args)
    info = catalog.describe(spec.model)
    settings = tuple(scale_settings(info.num_layers)) if every_setting else (Setting.of(spec),)
    request = ScaleRequest(
        spec.model, spec.seq_len, spec.batch_size,
        str(simulated_dtype(spec)).removeprefix("torch."),  # "auto" as every simulation reads it
        settings, spec.optimizer, spec.lora_rank, spec.lora_targets, 1, spec.gradient_accumulation_steps,
        spec.max_grad_norm, spec.mixed_precision, spec.attn_implementation, spec.quantization,
    )  # fmt: skip
    # Each count and setting decided on what nvidia-smi will show on the GPU named (or a card of the budget's bytes).
    search = cheapest_that_fits(request, budget[0], info=info, gpu=args.gpu)
    result = search.result
    if args.json:
        data = {
            "gpus": search.gpus,
            "setting": None if search.setting is None else search.setting.key,
            "peak_bytes": None if result is None or result.memory is None else result.memory.peak_bytes,
            "budget_bytes": budget[0],
            "budget_label": budget[1],
            "counts": list(search.counts),
            "floor_refused": list(search.floor_refused),
            "simulations": search.simulated,
            "looked_at": [[one.spec.world_size, Setting.of(one.spec).key] for one in search.tried],
        }
        print(json.dumps({"fewest_gpus": data}, indent=2))
        return 0
    lines = [
        *training_args_lines(args),
        t("cli.fewest_head", model=spec.model, seq_len=spec.seq_len, batch=spec.batch_size, label=budget[1],
          budget_gib=budget[0] / GIB),
    ]  # fmt: skip
    code = search.code()
    if result is None or result.memory is None or search.setting is None or code is None:
        lines.append(t("cli.fewest_none", gpus=search.counts[-1]))
    else:
        peak = result.memory.peak_bytes
        lines += [
            t("cli.fewest_answer", gpus=search.gpus, setting=search.setting.key, peak_gib=peak / GIB),
            "  " + code.launch,
            "  " + code.ckptlab_launch,
        ]
    refused = ", ".join(map(str, search.floor_refused)) or t("cli.fewest_refused_none")
    lines.append(t("cli.fewest_counted", simulations=search.simulated, refused=refused))
    print("\n".join(lines))
    return 0


def longest_report(spec: RunSpec, rows: list, budget: tuple[int, str]) -> str:
    """One line per setting: the longest sequence that fits, its simulated peak, and the length that does not."""
    setting, longest, peak_gib, spare, next_length = (
        t(f"cli.column_{name}") for name in ("setting", "longest_seq", "peak_gib", "spare_bytes", "next_length")
    )
    header = [
        t("cli.longest_head", model=spec.model, batch=spec.batch_size, label=budget[1], budget_gib=budget[0] / GIB),
        f"{setting:<14} {longest:>11} {peak_gib:>9} {spare:>15}  {next_length}",
    ]
    lines = []
    for row in rows:
        # Two peaks a token apart round to the same GiB: the bytes to spare and over say why one fits and not the next.
        peak = f"{row.peak_bytes / GIB:>9.2f}" if row.peak_bytes is not None else f"{'-':>9}"
        left = f"{row.spare_bytes:>15,}" if row.spare_bytes is not None else f"{'-':>15}"
        if row.over_seq_len is None:
            after = t("cli.longest_limit_fits", limit=row.limit)
        else:
            after = t(
                "cli.longest_over", seq_len=row.over_seq_len, peak_gib=row.over_peak_bytes / GIB, over=row.over_bytes
            )
        lines.append(f"{row.setting:<14} {row.seq_len:>11,} {peak} {left}  {after}")
    return "\n".join(header + lines)


def _budget(args: argparse.Namespace) -> tuple[int, str] | None:
    """The memory to judge the peak against (--gpu, --budget or --budget-gib), and its label."""
    if args.gpu:
        return budget_bytes(args.gpu)
    if args.budget_gib is not None:
        if not (math.isfinite(args.budget_gib) and 0 < args.budget_gib <= MAX_BUDGET_GIB):
            raise SpecError(key="cli.budget_gib", value=args.budget_gib, limit=MAX_BUDGET_GIB)
        return int(args.budget_gib * GIB), t("cli.budget_label", size=f"{args.budget_gib:g} GiB")
    if args.budget is not None:
        size = budget_size(args.budget, "--budget")
        return size, t("cli.budget_label", size=args.budget.strip())
    return None


def _table_command(args: argparse.Namespace, spec: RunSpec, budget: tuple[int, str] | None) -> int:
    """``--every-n-layers all``: off and every every_n_layers of the model, simulated as one computation."""
    import_transformers_models()  # before the core's imports: transformers' model folders read once (model.libraries)
    from ..explore.scale import every_n_choices  # the core, once the flags are known good (see ckptlab.cli)
    from ..model import catalog
    from ..step.simulate import simulate
    from ..step.table import simulate_table

    core_loaded(args)
    num_layers = catalog.describe(spec.model).num_layers
    specs = [replace(spec, every_n_layers=None, offload=False)]
    specs += [replace(spec, every_n_layers=n) for n in every_n_choices(num_layers, "all")]
    # --exact simulates every layer of every setting; else the settings share their shallow steps.
    results = [simulate(one, fast=False) for one in specs] if args.exact else simulate_table(specs)
    besides: list[DeviceTotal | None] = [None] * len(results)
    if budget is not None:  # fits is decided on what nvidia-smi will show: each setting's allocator replayed
        from ..explore.device import expandable_beside, with_device_total

        results = [with_device_total(result, args.gpu or budget[0]) for result in results]
        # Each row's recorded order replayed again with expandable segments, as a single simulation's: no simulation.
        besides = [expandable_beside(result, args.gpu or budget[0]) for result in results]
    verdicts = [
        fit_verdict(result, *budget, beside=beside) if budget else None
        for result, beside in zip(results, besides, strict=True)
    ]
    times = _setting_times(args, results, simulate) if args.gpu else None
    if args.json:
        rows = [result.to_dict() | ({"fit": verdict} if verdict else {}) for result, verdict in zip(results, verdicts)]
        for row, time in zip(rows, times or []):
            row |= time_json(time)
        print(json.dumps({"rows": rows}, indent=2))
        return 0
    print("\n".join([*training_args_lines(args), table_report(results, num_layers, budget)]))
    if times is not None:
        print("\n" + time_table_report(times))
    return 0


def table_report(results: list[RunResult], num_layers: int, budget: tuple[int, str] | None) -> str:
    """One line per setting: CP layers, simulated peak and after-forward, where the peak is, whether it fits."""
    from ..spec import Setting

    first = results[0]
    setting_word, cp_layers, peak_gib, after_fwd, fits_word, peak_in = (
        t(f"cli.column_{name}") for name in ("setting", "cp_layers", "peak_gib", "after_fwd_gib", "fits", "peak_in")
    )
    yes, no = t("cli.table_fits_yes"), t("cli.table_fits_no")
    fits_width = max(len(fits_word), len(yes), len(no)) + 2  # the fits column, two spaces after its longest word
    header = [
        t(
            "cli.table_head",
            model=first.model.name,
            seq_len=first.spec.seq_len,
            batch=first.spec.batch_size,
            dtype=first.dtype,
            settings=len(results),
        ),
        f"{setting_word:<14} {cp_layers:>9} {peak_gib:>9} {after_fwd:>13}  "
        + (f"{fits_word:<{fits_width}}" if budget else "")
        + peak_in,
    ]
    lines = []
    for result in results:
        memory = result.memory
        assert memory is not None  # a simulation always has its memory
        setting = Setting.of(result.spec)
        column = f"{yes if fits(result, budget[0]) else no:<{fits_width}}" if budget else ""
        lines.append(
            f"{setting.key:<14} {setting.cp_layers(num_layers):>9} {memory.peak_bytes / GIB:>9.2f} "
            f"{memory.after_forward_bytes / GIB:>13.2f}  {column}{region_words(memory.peak_where)}"
        )
    footer = [t("cli.table_fits_legend", label=budget[1], budget_gib=budget[0] / GIB)] if budget else []
    return "\n".join(header + lines + footer)
