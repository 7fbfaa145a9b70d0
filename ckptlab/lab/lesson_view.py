"""What the Learn pages (Lesson, Timeline, Exercises) say about a run, worked out here so the pages only draw.

Each function takes measured results (or the lesson's simulated sharding idea) and the page's
language ``lang`` and returns numbers in bytes, labels or sentences; nothing here imports streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from ..explore.formula import architecture, eager_scores_bytes
from ..explore.roofline import TEXTBOOK_FACTOR
from ..results import RunResult, TimelinePoint, memory_of
from ..show.figures.breakdown import breakdown_figure
from ..show.figures.diagram import roles_diagram_figure
from ..show.figures.timeline import peak_cause
from ..show.i18n import number, t
from ..show.labels import event_label, provenance_label
from ..spec import RunSpec
from ..step import timeline as tl
from ..units import MIB
from .exercises import Exercise, Outcome, evaluate
from .learn import RERUN_LENGTHS, RERUN_MODELS, AllocatorIdea, QloraIdea, RerunIdea, ShardingIdea
from .run import reference_spec


def run_diagram(run: RunResult, lang: str, **options: Any) -> go.Figure:
    """The CP / keep / rerun diagram of a measured run: its layers' roles and the reruns observed.

    ``options``: ``focus`` and ``height``, as :func:`~ckptlab.show.figures.diagram.roles_diagram_figure` takes them.
    """
    roles = [layer.enabled for layer in run.layers]  # "CP" or "keep", as read back from transformers' flags
    return roles_diagram_figure(roles, lang=lang, reruns=[layer.recompute_calls for layer in run.layers], **options)


def event_option(points: Sequence[TimelinePoint], index: int, lang: str) -> str:
    """A step slider's option: ``3/40 · forward L2``."""
    return f"{index + 1}/{len(points)} · {event_label(points[index], lang)}"


def loss_index(run: RunResult) -> int:
    """The index of the loss in the run's timeline: where the forward's activations are all held."""
    return next(i for i, point in enumerate(memory_of(run).timeline) if point.kind == "loss")


def saved_bytes(run: RunResult) -> int:
    """Activations the layers saved for the backward, all layers together."""
    return sum(layer.saved_bytes for layer in run.layers)


def activation_share(off: RunResult) -> float:
    """Activations (and temporaries where CUDA cannot split them) as a share of the peak, checkpointing off."""
    parts = memory_of(off).breakdown_at_peak
    return (parts.get("activation", 0) + parts.get("activation_and_temp", 0)) / sum(parts.values())


def above_baseline(run: RunResult, point: TimelinePoint) -> tuple[int, int]:
    """At one event: memory now and the highest since the last event, both above the memory before the forward."""
    baseline = memory_of(run).baseline_bytes
    return point.current_bytes - baseline, point.region_peak_bytes - baseline


def bump_line(points: Sequence[TimelinePoint], lang: str) -> str:
    """How many reruns raised memory, and the largest rise ("" when none did)."""
    bumps = tl.rerun_bumps(points)
    if not bumps:
        return ""
    layer, rise = max(bumps.items(), key=lambda item: item[1])
    return t("timeline.bump_line", lang, count=len(bumps), n=layer + 1, mib=number(rise / MIB, ",.1f", lang))


def shard_labels(idea: ShardingIdea, lang: str) -> list[str]:
    """The lesson's sharding bars: how many GPUs and which checkpointing."""
    return [
        t(
            "lesson.shard.bar_one" if bar.spec.world_size == 1 else "lesson.shard.bar_many",
            lang,
            gpus=bar.spec.world_size,
            setting=t("setting.short_off", lang) if bar.spec.every_n_layers is None else f"n={bar.spec.every_n_layers}",
        )
        for bar in idea.bars
    ]


def shard_caption(idea: ShardingIdea, lang: str) -> str:
    """What the sharding figure shows, in numbers: state divided by the GPUs, activations by checkpointing."""
    return t(
        "lesson.shard.caption",
        lang,
        gpus=idea.bars[-1].spec.world_size,
        state=number(idea.state_ratio * 100, ".0f", lang),
        act_gpus=number(idea.activation_ratio_gpus * 100, ".0f", lang),
        act_ckpt=number(idea.activation_ratio_checkpointing * 100, ".0f", lang),
        gathered=number(idea.gathered_bytes / MIB, ",.0f", lang),
    )


def exercise_runs(exercise: Exercise, results: Mapping[RunSpec, RunResult]) -> dict[int | None, RunResult]:
    """The exercise's runs by every_n_layers (None: checkpointing off)."""
    runs: dict[int | None, RunResult] = {spec.every_n_layers: results[spec] for spec in exercise.specs()}
    runs[None] = results[reference_spec(exercise.specs()[0])]
    return runs


def outcomes(
    exercises: Sequence[Exercise], answers: Mapping[str, float], results: Mapping[RunSpec, RunResult], lang: str
) -> dict[str, Outcome]:
    """The answered exercises whose runs are measured, scored in ``lang``: the score is recomputed, never stored."""
    return {
        exercise.id: evaluate(exercise, answers[exercise.id], exercise_runs(exercise, results), lang)
        for exercise in exercises
        if exercise.id in answers and all(spec in results for spec in exercise.specs())
    }


def keep_caption(plain: RunResult, kept: RunResult, lang: str) -> str:
    """The lesson's "what to keep" part under its figures: what keeping the attention cost and saved, measured."""
    cp = [layer for layer in kept.layers if layer.enabled == "CP"]
    kib = sum(layer.kept_bytes for layer in cp) / 1024
    extra = (memory_of(kept).after_forward_bytes - memory_of(plain).after_forward_bytes) / 1024
    return t(
        "lesson.keep.caption",
        lang,
        kib=number(kib, ",.1f", lang),
        layers=len(cp),
        plain=number(memory_of(plain).after_forward_bytes / MIB, ",.2f", lang),
        kept=number(memory_of(kept).after_forward_bytes / MIB, ",.2f", lang),
        extra=number(extra, ",.1f", lang),
        reused=number(sum(sum(layer.reused_ops.values()) for layer in cp), ",", lang),
        rerun=number(sum(sum(layer.rerun_ops.values()) for layer in cp), ",", lang),
    )


def attention_caption(runs: Sequence[tuple[RunResult, RunResult]], lang: str) -> str:
    """The lesson's attention part under its figure: ``runs`` is (SDPA, eager) at a short and a long sequence,
    checkpointing off. Eager minus SDPA per layer, measured, beside the Ultra-Scale Playbook's ``5·a·s/h`` term
    (``5·a·s²`` bytes a layer and sequence: 16-bit probabilities, dropout mask and dropped probabilities) and
    the lab's formula for this model (no dropout: the probabilities alone, ``eager_scores_bytes``)."""
    (short_sdpa, short_eager), (long_sdpa, long_eager) = runs
    arch = architecture(short_sdpa.spec.model, len(short_sdpa.layers))
    element = 4 if short_sdpa.dtype == "float32" else 2

    def per_layer(sdpa: RunResult, eager: RunResult) -> float:
        return (memory_of(eager).after_forward_bytes - memory_of(sdpa).after_forward_bytes) / len(sdpa.layers)

    def playbook(run: RunResult) -> float:  # 5·a·s² bytes a layer (batch 1 aside: times the batch)
        return 5 * arch.num_heads * run.spec.seq_len**2 * run.spec.batch_size

    def formula(run: RunResult) -> int:
        return eager_scores_bytes(arch, run.spec.seq_len, run.spec.batch_size, element)

    short, long = per_layer(short_sdpa, short_eager), per_layer(long_sdpa, long_eager)
    return t(
        "lesson.attention.caption",
        lang,
        seq_short=short_sdpa.spec.seq_len,
        seq_long=long_sdpa.spec.seq_len,
        short=f"{short / MIB:,.2f}",
        long=f"{long / MIB:,.2f}",
        growth=f"{long / short:,.1f}" if short else "-",
        lengths=f"{long_sdpa.spec.seq_len / short_sdpa.spec.seq_len:g}",
        heads=arch.num_heads,
        playbook_short=f"{playbook(short_sdpa) / MIB:,.2f}",
        playbook_long=f"{playbook(long_sdpa) / MIB:,.2f}",
        formula_short=f"{formula(short_sdpa) / MIB:,.2f}",
        formula_long=f"{formula(long_sdpa) / MIB:,.2f}",
    )


def attention_figure(runs: Sequence[RunResult], lang: str) -> go.Figure:
    """The attention part's bars: each run (SDPA and eager, checkpointing off) by what it holds at the end of the
    forward beyond its weights. Not the peak: at a short sequence the peak comes after the backward freed the
    probabilities, so eager's and SDPA's peaks are equal there and the difference was in the caption alone."""
    bars = [
        (t("lesson.attention.bar", lang, attention=run.spec.attn_implementation, seq=run.spec.seq_len), run)
        for run in runs
    ]
    return breakdown_figure(bars, lang=lang, height=420, at="after_forward")


def attention_shown(sdpa: RunResult, eager: RunResult, lang: str) -> str:
    """What the attention part's bars are (held after the forward, not the peak) and the step's peak of each run at the
    short length, measured: there the peak comes after the backward freed the probabilities, the same for both."""
    return t(
        "lesson.attention.shown",
        lang,
        seq=sdpa.spec.seq_len,
        peak_sdpa=number(memory_of(sdpa).peak_bytes / MIB, ",.1f", lang),
        peak_eager=number(memory_of(eager).peak_bytes / MIB, ",.1f", lang),
        cause=peak_cause(eager, lang),
    )


def source_caption(results: Sequence[RunResult], lang: str) -> str:
    """Where a part's figures come from, from its results: each provenance (measured on the CPU, simulated, ...) and
    each model, as the results say (the sharding part is qwen3-0.6b simulated, the others tiny-llama)."""
    separator = t("said.list_separator", lang)
    return t(
        "lesson.source",
        lang,
        provenance=separator.join(dict.fromkeys(provenance_label(run.provenance, lang) for run in results)),
        model=separator.join(dict.fromkeys(run.spec.model for run in results)),
    )


def qlora_labels(idea: QloraIdea, lang: str) -> list[str]:
    """The lesson's 4-bit bars: which base (16-bit or 4-bit) and which checkpointing."""
    return [
        t(
            "lesson.qlora.bar_4bit" if bar.spec.quantization is not None else "lesson.qlora.bar_16bit",
            lang,
            dtype=bar.spec.dtype,
            setting=t("setting.short_off", lang) if bar.spec.every_n_layers is None else f"n={bar.spec.every_n_layers}",
        )
        for bar in idea.bars
    ]


def qlora_caption(idea: QloraIdea, lang: str) -> str:
    """What the 4-bit figure shows, in simulated numbers: the weights shrink, the activations, the logits and the
    adapters' optimizer state do not, and checkpointing is what cuts the activations."""
    sixteen, four = idea.bar(False, None), idea.bar(True, None)
    four_on = idea.bar(True, 1)

    def mib(value: float) -> str:
        return number(value / MIB, ",.1f", lang)

    return t(
        "lesson.qlora.caption",
        lang,
        params_16=mib(sixteen.parts["parameter"]),
        params_4=mib(four.parts["parameter"]),
        act_16=mib(sixteen.parts["activation"]),
        act_4=mib(four.parts["activation"]),
        act_4_on=mib(four_on.parts["activation"]),
        logits=mib(idea.logits_bytes),
        state_16=mib(sixteen.parts["optimizer_state"]),
        state_4=mib(four.parts["optimizer_state"]),
        peak_off=mib(memory_of(four.result).peak_bytes),
        peak_on=mib(memory_of(four_on.result).peak_bytes),
    )


def allocator_caption(idea: AllocatorIdea, lang: str) -> str:
    """What the allocator figure shows, in numbers: the tensors' peak, what the allocator reserved for them with
    torch's defaults (its cache the difference), and with expandable segments."""

    def mib(value: float) -> str:
        return number(value / MIB, ",.1f", lang)

    default, expandable = idea.default, idea.expandable
    return t(
        "lesson.allocator.caption",
        lang,
        tensors=mib(memory_of(idea.result).peak_bytes),
        allocated=mib(default.allocated_peak),
        reserved=mib(default.reserved_peak),
        cached=mib(default.reserved_peak - default.allocated_peak),
        expandable=mib(expandable.reserved_peak),
        events=number(default.events_total, ",", lang),
    )


def rerun_labels(idea: RerunIdea, lang: str) -> list[str]:
    """The time part's bars: the model and the length."""
    return [t("lesson.rerun.bar", lang, model=case.model, seq=number(case.seq_len, ",", lang)) for case in idea.cases]


def rerun_caption(idea: RerunIdea, lang: str) -> str:
    """What the time figure shows, in predicted numbers: each case's factor against the textbook's, the head and the
    loss never rerun, the attention's share growing with the length, the small model bound by launches."""
    small, large = RERUN_MODELS
    short, long = RERUN_LENGTHS
    small_short, small_long = idea.case(small, short).anatomy, idea.case(small, long).anatomy
    large_short, large_long = idea.case(large, short).anatomy, idea.case(large, long).anatomy

    def percent(share: float) -> str:
        return number(share * 100, ",.0f", lang)

    return t(
        "lesson.rerun.caption",
        lang,
        gpu=idea.gpu,
        small=small,
        large=large,
        short=number(short, ",", lang),
        long=number(long, ",", lang),
        textbook=TEXTBOOK_FACTOR,
        factors=", ".join(
            t(
                "lesson.rerun.factor",
                lang,
                model=case.model,
                seq=number(case.seq_len, ",", lang),
                factor=case.anatomy.factor,
            )
            for case in idea.cases
        ),
        head_small=percent(small_long.head_share),
        head_large=percent(large_long.head_share),
        attention_short=percent(large_short.attention_share),
        attention_long=percent(large_long.attention_share),
        launch=percent(small_short.launch_share),
        launch_large=percent(large_long.launch_share),
        mfu_small=percent(small_short.off.mfu),
        mfu_large=percent(large_long.off.mfu),
    )
