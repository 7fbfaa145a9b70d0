"""Text at the edge: the CP / keep / rerun diagram and the tables the command line prints.

Pure functions from results to strings; the units come from ``ckptlab.units`` (MiB = 2**20
bytes, which public tables write as "MB").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..model.presets import ModelInfo
from ..model.selective import selective_key
from ..results import (
    BUSY_SPREAD,
    MIN_SAMPLES_TO_JUDGE,
    BusyReason,
    Comparison,
    Judgement,
    LayerResult,
    MemoryResult,
    ModelSummary,
    Region,
    RunResult,
    TimingResult,
)
from ..spec import RunSpec
from ..units import MIB, mib, milliseconds
from .i18n import say, t
from .labels import event_label, method_label, provenance_label, setting_label
from .peak_words import logits_sentence

LAYERS_PER_LINE = 12  # wrap the diagram so a 36-layer model still fits a terminal
ARROWS = (" -> ", " <- ")
WEIGHTS = (
    "random",
    "loaded",
    "fake",
)  # ModelSummary.weights: built, read from a folder, simulated  # the forward's and the backward's, between the boxes

# The command line's words, English (the CLI's language), from the locale files like every other sentence:
# a sweep row's time against checkpointing off in one word (results.Judgement), and the legends.
VERDICT_WORDS = {judgement.value: t(f"cli.verdict_{judgement.value}", "en") for judgement in Judgement}
VERDICT_LEGEND = t("cli.verdict_legend", "en", min_samples=MIN_SAMPLES_TO_JUDGE)
RERUN_SHARE_NOTE = t("cli.rerun_share", "en")


def percent(value: float | None, digits: int = 1) -> str:
    """A signed percentage, e.g. "+2.5%"; "0.0%" rather than "-0.0%" or "+0.0%"; "" for None."""
    if value is None:
        return ""
    text = f"{value * 100:+.{digits}f}%"
    return text[1:] if float(text[:-1]) == 0 else text


def busy_note(reasons: Sequence[BusyReason], load: float | None, cores: int | None, spread: float | None) -> str:
    """Up front when the machine was too busy to time: why, with the figures; "" when it was not."""
    if not reasons:
        return ""
    why = []
    if "load" in reasons and load is not None:
        why.append(t("cli.busy_load", "en", load=load, cores=cores))
    if "spread" in reasons and spread is not None:
        why.append(t("cli.busy_spread", "en", spread=spread, limit=BUSY_SPREAD))
    if "shared" in reasons:
        why.append(t("cli.busy_shared", "en"))
    return t("cli.busy", "en", why="; ".join(why))


def timing_busy_note(timing: TimingResult | None) -> str:
    """:func:`busy_note` for one run's timing."""
    if timing is None:
        return ""
    return busy_note(timing.busy_reasons, timing.load_average, timing.cores, timing.relative_spread)


def setting_name(every_n_layers: int | None, offload: bool = False) -> str:
    """``"every_n_layers=2"``, ``"every_n_layers=1, offload"`` or ``"checkpointing off"`` (the label, in English)."""
    return setting_label(every_n_layers, offload, "en")


def training_name(spec: RunSpec) -> str:
    """What the step trains and how, as Trainer runs it: ``"full fine-tune, AdamW (fused, Trainer's default),
    gradient norm clipped at 1.0"``, ``"LoRA r=8 on q_proj, v_proj, sgd, 4 micro-batches a step, bf16 autocast"``."""
    tuned = t("cli.training_full") if spec.lora_rank is None else t("cli.training_lora", rank=spec.lora_rank)
    if spec.lora_targets:
        tuned = t("cli.training_lora_on", lora=tuned, targets=", ".join(spec.lora_targets))
    if spec.quantization is not None:
        if spec.quantization.bits == 8:
            tuned = t("cli.training_8bit", tuned=tuned)
        else:
            tuned = t("cli.training_qlora", tuned=tuned, quant_type=spec.quantization.bnb_4bit_quant_type)
    if spec.optimizer == "none":
        parts = [tuned, t("cli.training_no_optimizer")]
    else:
        optimizer = t("cli.training_adamw") if spec.optimizer == "adamw" else spec.optimizer
        if spec.optim_args:
            optimizer = t("cli.training_optim_args", optimizer=optimizer, args=spec.optim_args)
        parts = [tuned, optimizer]
    if spec.gradient_accumulation_steps > 1:
        parts.append(t("cli.training_accumulation", steps=spec.gradient_accumulation_steps))
    if spec.mixed_precision_via == "autocast":
        parts.append(t("cli.training_autocast", mp=spec.mixed_precision))
    elif spec.mixed_precision_via == "fsdp2":
        parts.append(t("cli.training_fsdp2_mp", mp=spec.mixed_precision))
    if spec.optimizer != "none":
        bound = spec.max_grad_norm
        parts.append(t("cli.training_clipped", bound=float(bound)) if bound > 0 else t("cli.training_not_clipped"))
    return ", ".join(parts)


def category_name(key: str) -> str:
    """A memory category's words (``"optimizer_state"`` -> ``"optimizer state"``), from the English locale."""
    return t(f"category.{key}", "en")


def diagram(forward_roles: Sequence[str], backward_roles: Sequence[str], title: str) -> str:
    """The text diagram of one step (as the README's sample output shows it).

    Args:
        forward_roles: per layer, "CP" (keeps only its input) or "keep".
        backward_roles: per layer in forward order, "rerun" or "keep".
        title: first line, e.g. "every_n_layers=2".

    Returns:
        Lines like::

            every_n_layers=2
            Forward:   input  -> [L1] -> [L2]
                                  CP     keep
            Backward:  output <- [L2] <- [L1]
                                 keep   rerun
    """
    lines = [title]
    layers = range(len(forward_roles))
    # "Forward:   input  -> ": the words from the locale files, padded so both rows' first boxes line up.
    names = (t("cli.diagram_forward", "en"), t("cli.diagram_backward", "en"))
    ends = (t("cli.diagram_input", "en"), t("cli.diagram_output", "en"))
    name_width, end_width = max(map(len, names)) + 2, max(map(len, ends)) + 1
    heads = [f"{name:<{name_width}}{end:<{end_width}}{arrow.lstrip()}" for name, end, arrow in zip(names, ends, ARROWS)]
    for roles, order, arrow, head in (
        (forward_roles, layers, ARROWS[0], heads[0]),
        (backward_roles, layers[::-1], ARROWS[1], heads[1]),
    ):
        for start in range(0, len(order), LAYERS_PER_LINE):
            lines += _row(head, order[start : start + LAYERS_PER_LINE], roles, arrow)
            head = "               ..." + arrow  # a wrapped line goes on from the one above
    return "\n".join(lines)


def _row(head: str, layers: Sequence[int], roles: Sequence[str], arrow: str) -> list[str]:
    """``layers``' boxes (``[L1] -> [L2]``) after ``head``, and under each box its role."""
    cells = [f"[L{i + 1}]" for i in layers]
    top = head + arrow.join(cells)
    under = [" "] * (len(top) + 2)
    column = len(head)
    for cell, role in zip(cells, (roles[i] for i in layers)):
        begin = max(0, column + (len(cell) - len(role)) // 2)
        under[begin : begin + len(role)] = role
        column += len(cell) + len(arrow)
    return [top, "".join(under).rstrip()]


def result_diagram(result: RunResult) -> str:
    """The diagram of what a run did: forward row from the flags transformers set, backward row from the reruns observed."""
    title = setting_name(result.spec.every_n_layers, result.memory.offload_applied if result.memory else False)
    text = diagram(
        [layer.enabled for layer in result.layers],
        ["rerun" if layer.recompute_calls else "keep" for layer in result.layers],
        t("cli.diagram_observed", "en", title=title),
    )
    if not result.plan_matches:
        planned = diagram(
            [layer.planned for layer in result.layers],
            ["rerun" if layer.planned == "CP" else "keep" for layer in result.layers],
            t("cli.diagram_planned", "en", title=title),
        )
        text += "\n\n" + planned
    moe_reruns = sum(
        1 for layer in result.layers if layer.moe and layer.router_recompute_calls and layer.experts_recompute_calls
    )
    if moe_reruns:
        text += "\n" + t("cli.moe_reruns", "en", layers=moe_reruns)
    selective = selective_lines(result)
    if selective:
        text += "\n" + "\n".join(selective)
    return text


def _ops(counts: dict[str, int], limit: int = 4) -> str:
    """``aten.mm x6, aten.bmm x2, ...``: the most frequent ops first."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    words = ", ".join(f"{name} x{count}" for name, count in ranked[:limit])
    return words + (", " + t("cli.ops_more", "en", count=len(ranked) - limit) if len(ranked) > limit else "")


def _layer_names(layers: Sequence[LayerResult]) -> str:
    """``L1``, ``L1-L6`` (consecutive), ``L1, L3, L5``, or ``L1, L3, ... L35 (18 layers)``."""
    indices = [layer.index for layer in layers]
    if len(layers) == 1:
        return layers[0].name
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"{layers[0].name}-{layers[-1].name}"
    if len(layers) <= 4:
        return ", ".join(layer.name for layer in layers)
    count = t("cli.layer_count", "en", count=len(layers))
    return f"{layers[0].name}, {layers[1].name}, ... {layers[-1].name} {count}"


def selective_lines(result: RunResult) -> list[str]:
    """Inside the CP layers of a run with a selective policy: what each kept and what its rerun ran, observed.

    Lines like ``L1-L6  CP + attention kept: 0.19 MiB (...)`` and ``rerun without attention: ...``;
    none for plain checkpointing. Consecutive layers that did the same are folded into one row.
    """
    if result.spec.selective == "none":
        return []
    policy = selective_key(result.spec.selective)
    groups: dict[tuple, list[LayerResult]] = {}
    for layer in result.layers:
        if layer.enabled != "CP":
            continue
        row = (
            layer.selective,
            layer.kept_bytes,
            tuple(sorted(layer.kept_ops.items())),
            tuple(sorted(layer.rerun_ops.items())),
            tuple(sorted(layer.reused_ops.items())),
        )
        groups.setdefault(row, []).append(layer)
    lines = [t("cli.selective_head", "en", policy=policy)]
    for layers in groups.values():
        first = layers[0]
        name = _layer_names(layers)
        if not first.kept_ops:
            lines.append("  " + t("cli.selective_kept_nothing", "en", layers=name, policy=policy))
        else:
            kept = t(
                "cli.selective_kept",
                "en",
                layers=name,
                policy=policy,
                mib=mib(first.kept_bytes),
                ops=_ops(first.kept_ops),
            )
            lines.append("  " + kept)
        reran = sum(first.rerun_ops.values())
        if first.reused_ops:
            rerun = t(
                "cli.selective_rerun_without",
                "en",
                policy=policy,
                ops_count=reran,
                ops=_ops(first.rerun_ops),
                reused=_ops(first.reused_ops),
            )
        else:
            rerun = t("cli.selective_rerun_full", "en", ops_count=reran)
        lines.append("    " + rerun)
    return lines


def _selective_words(spec: RunSpec) -> str:
    policy = "" if spec.selective == "none" else f", selective={selective_key(spec.selective)}"
    attention = (
        "" if spec.attn_implementation == "sdpa" else t("cli.report_attention", "en", kernel=spec.attn_implementation)
    )
    return policy + (f" · {attention}" if attention else "")


def _experts_words(model: ModelSummary) -> str:
    if not model.experts_implementation:
        return ""
    experts = t(
        "cli.report_experts",
        "en",
        experts=model.num_experts,
        per_token=model.experts_per_token,
        implementation=model.experts_implementation,
    )
    return ", " + experts


def run_report(result: RunResult, comparison: Comparison | None = None, reference: RunResult | None = None) -> str:
    """The command line's human-readable report of one run."""
    spec, model = result.spec, result.model
    described = t(
        "cli.report_model",
        "en",
        name=model.name,
        family=model.family,
        layers=model.num_layers,
        hidden=model.hidden_size,
        params_m=model.num_params / 1e6,
        weights=t(f"cli.weights_{model.weights}", "en") if model.weights in WEIGHTS else model.weights,
        experts=_experts_words(model),
    )
    ran = t(
        "cli.report_spec",
        "en",
        seq_len=spec.seq_len,
        batch=spec.batch_size,
        dtype=result.dtype,
        device=result.device,
        setting=setting_name(spec.every_n_layers, spec.offload),
        selective=_selective_words(spec),
        training=training_name(spec),
    )
    versions = f"torch {result.provenance.torch_version} · transformers {result.provenance.transformers_version}"
    head = f"{described}\n{ran}\n{provenance_label(result.provenance, 'en')} · {versions}"
    if result.status != "ok":
        return head + "\n\n" + result.message
    busy = timing_busy_note(result.timing) or (reference is not None and timing_busy_note(reference.timing))
    if busy:
        head += "\n\n" + busy
    memory, timing = result.memory, result.timing
    assert memory is not None  # status "ok": measured or simulated, memory is always there
    ref_memory = reference.memory if reference else None
    ref_timing = reference.timing if reference else None

    def row(label: str, read: Callable[[MemoryResult], int], note: str) -> str:
        """A memory row: this run's MiB, the reference's beside them."""
        return _table_row(label, mib(read(memory)), mib(read(ref_memory)) if ref_memory else None, note)

    optimizer = memory.optimizer_state_bytes
    lines = [head, "", result_diagram(result), ""]
    off = t("cli.column_off", "en") if reference else None
    lines.append(_table_row(t("cli.memory_head", "en"), t("cli.column_this_run", "en"), off, ""))
    baseline_note = t("cli.memory_baseline_note_optimizer" if optimizer else "cli.memory_baseline_note", "en")
    lines.append(row(t("cli.memory_baseline", "en"), lambda m: m.baseline_bytes, baseline_note))
    if optimizer:
        of_which, steady = t("cli.memory_optimizer", "en"), t("cli.memory_optimizer_note", "en")
        lines.append(row("  " + of_which, lambda m: m.optimizer_state_bytes, steady))
    resident, needs = t("cli.memory_resident", "en"), t("cli.memory_resident_note", "en")
    lines.append(row(resident, lambda m: m.after_forward_bytes, needs))
    reached = t("cli.memory_peak_note", "en", where=region_words(memory.peak_where))
    lines.append(row(t("cli.memory_peak", "en"), lambda m: m.peak_bytes, reached))
    if memory.breakdown_at_peak:
        # Parts under 0.05 MiB (a norm's gradient, the rotary buffer) would print as "0.0": left out.
        parts = sorted(
            ((name, amount) for name, amount in memory.breakdown_at_peak.items() if amount >= 0.05 * MIB),
            key=lambda item: -item[1],
        )
        listed = ", ".join(f"{category_name(name)} {mib(amount)}" for name, amount in parts)
        lines.append("  " + t("cli.memory_at_peak", "en", parts=listed))
    if memory.logits_set_the_peak:
        lines.append("  " + logits_sentence(memory))
    if memory.offload_bytes and spec.offload:
        if result.provenance.kind == "simulated":
            verb = t("cli.offload_simulated", "en")
        elif memory.offload_applied:
            verb = t("cli.offload_applied", "en")
        else:
            verb = t("cli.offload_not_applied", "en")
        lines.append(_table_row(t("cli.memory_offload", "en"), mib(memory.offload_bytes), None, verb))
    lines.append(f"  ({method_label(memory.method, 'en')})")
    lines.append("")
    if timing is None:
        lines.append("  " + t("cli.time_not_simulated", "en"))
    else:
        lines += _time_rows(timing, ref_timing, spec.warmup)
    if comparison is not None:
        lines += [
            "",
            t("cli.against_off", "en"),
            "  " + step_time_words(comparison),
            "  "
            + t("cli.against_off_ratios", "en", resident=comparison.after_forward_ratio, peak=comparison.peak_ratio),
        ]
    if result.ranks:
        lines += ["", *rank_table(result)]
    lines += ["", t("cli.per_layer", "en"), layer_table(result)]
    if result.notes:
        lines += ["", t("cli.notes", "en")] + [f"  - {say(note)}" for note in result.notes]
    return "\n".join(lines)


def rank_table(result: RunResult) -> list[str]:
    """Every rank's memory (MiB) and step time, and whether the ranks showed the same CP / keep / rerun pattern."""
    spec = result.spec
    head = t("cli.ranks_head_simulated" if result.timing is None else "cli.ranks_head", "en", ranks=spec.world_size)
    rank, baseline, params, optim, resident, peak, step_ms = (
        t(f"cli.column_{name}", "en") for name in ("rank", "baseline", "params", "optim", "resident", "peak", "step_ms")
    )
    lines = [
        head,
        f"  {rank:>4}  {baseline:>9} {params:>9} {optim:>9}  {resident:>9}  {peak:>9}  {step_ms:>8}",
    ]
    for row in result.ranks:
        memory = row.memory
        assert memory is not None  # a rank's result is gathered only from a step that ran
        step = milliseconds(row.timing.step_s) if row.timing else "-"
        lines.append(
            f"  {row.rank:>4}  {mib(memory.baseline_bytes):>9} {mib(memory.breakdown_baseline.get('parameter', 0)):>9}"
            f" {mib(memory.optimizer_state_bytes):>9}  {mib(memory.after_forward_bytes):>9}  {mib(memory.peak_bytes):>9}"
            f"  {step:>8}"
        )
    patterns = {tuple(layer.observed for layer in row.layers) for row in result.ranks}
    if len(result.ranks) > 1:
        lines.append("  " + t("cli.ranks_same" if len(patterns) == 1 else "cli.ranks_differ", "en"))
    return lines


def _time_rows(timing: TimingResult, ref_timing: TimingResult | None, warmup: int) -> list[str]:
    lines = [
        _table_row(
            t("cli.time_head", "en"),
            t("cli.column_median", "en"),
            t("cli.column_off", "en") if ref_timing else None,
            t("cli.time_steps", "en", steps=len(timing.step_samples), warmup=warmup)
            if timing.threads is None  # a result saved before the field
            else t(
                "cli.time_steps_threads",
                "en",
                steps=len(timing.step_samples),
                warmup=warmup,
                threads=timing.threads,
                cores=timing.cores,
            ),
        )
    ]
    for label, value, samples, ref in (
        (
            t("cli.time_forward", "en"),
            timing.forward_s,
            timing.forward_samples,
            ref_timing.forward_s if ref_timing else None,
        ),
        (
            t("cli.time_backward", "en"),
            timing.backward_s,
            timing.backward_samples,
            ref_timing.backward_s if ref_timing else None,
        ),
        (
            t("cli.time_optimizer", "en"),
            timing.optimizer_s,
            timing.optimizer_samples,
            ref_timing.optimizer_s if ref_timing else None,
        ),
        (t("cli.time_step", "en"), timing.step_s, timing.step_samples, ref_timing.step_s if ref_timing else None),
    ):
        if not samples:  # no optimizer in the step
            continue
        spread = t("cli.time_spread", "en", fastest=milliseconds(min(samples)), slowest=milliseconds(max(samples)))
        lines.append(_table_row(label, milliseconds(value), None if ref is None else milliseconds(ref), spread))
    lines.append(f"  ({method_label(timing.method, 'en')})")
    return lines


def region_words(region: Region) -> str:
    """Where in the step (the peak was reached), in English: the event's words, or as a result read back said it."""
    return event_label(region, "en")


def step_time_words(comparison: Comparison) -> str:
    """The step time against checkpointing off and what it is worth (``Comparison.describe_step``'s English)."""
    return comparison.describe_step("en")


def _table_row(label: str, value: str, reference: str | None, note: str) -> str:
    ref = f"{reference:>10}" if reference is not None else ""
    return f"  {label:<30}{value:>10}{ref}   {note}".rstrip()


def layer_table(result: RunResult) -> str:
    """Per-layer rows: planned, flag, observed, calls, reruns, saved MiB (and of them, the attention's) and input MiB.

    Consecutive layers with identical rows are folded into one ("L2-L35"), so a 36-layer
    model reads as its pattern.
    """
    columns = (
        ("layer", "<8"),
        ("planned", "<9"),
        ("flag", "<6"),
        ("observed", "<10"),
        ("fwd_calls", ">10"),
        ("reruns", ">8"),
        ("saved_mib", ">11"),
        ("attn_mib", ">10"),
        ("input_mib", ">11"),
    )
    header = "  " + "".join(f"{t(f'cli.column_{name}', 'en'):{align}}" for name, align in columns)
    groups: list[list] = []
    for layer in result.layers:
        row = (
            layer.planned,
            layer.enabled,
            layer.observed,
            layer.forward_calls,
            layer.recompute_calls,
            mib(layer.saved_bytes),
            mib(layer.attention_bytes),
            mib(layer.input_bytes),
        )
        if groups and groups[-1][1] == row and groups[-1][0][-1].index == layer.index - 1:
            groups[-1][0].append(layer)
        else:
            groups.append([[layer], row])
    rows = []
    for layers, (planned, enabled, observed, calls, reruns, saved, attention, inputs) in groups:
        name = layers[0].name if len(layers) == 1 else f"{layers[0].name}-{layers[-1].name}"
        rows.append(
            f"  {name:<8}{planned:<9}{enabled:<6}{observed:<10}{calls:>10}{reruns:>8}{saved:>11}{attention:>10}{inputs:>11}"
        )
    return "\n".join([header] + rows)


def models_table(infos: Sequence[ModelInfo]) -> str:
    """``python -m ckptlab models``: one row per preset, each text column as wide as its longest value plus two."""
    cpu, gpu = t("cli.models_cpu", "en"), t("cli.models_gpu", "en")
    rows = [
        (info.name, info.family, info.task, info.num_layers, info.hidden_size, _params(info.num_params))
        + (cpu if info.cpu_ok else gpu,)
        for info in infos
    ]
    names = tuple(
        t(f"cli.column_{name}", "en") for name in ("name", "family", "task", "layers", "hidden", "params", "for")
    )
    widths = [max(len(str(value)) for value in column) for column in zip(names, *rows)]

    def line(values: Sequence[object]) -> str:
        # Text left-aligned, numbers right-aligned; two spaces between columns so none runs into the next.
        cells = [
            f"{value:>{width}}" if isinstance(value, int) or index == 5 else f"{value!s:<{width}}"
            for index, (value, width) in enumerate(zip(values, widths))
        ]
        return "  ".join(cells).rstrip()

    return "\n".join([line(names)] + [line(row) for row in rows])


def _params(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"
