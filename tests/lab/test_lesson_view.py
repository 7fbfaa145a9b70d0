"""The Learn pages' numbers and words (ckptlab.lab.lesson_view), on real runs of the tiny preset."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from ckptlab.lab import lesson_view
from ckptlab.lab.exercises import EXERCISES, MAX_POINTS
from ckptlab.lab.run import reference_spec
from ckptlab.show import i18n
from ckptlab.step import timeline as tl
from ckptlab.units import MIB
from tests.conftest import FAST

lang = "en"  # the tests read the English words


def test_the_loss_event_and_the_saved_activations(measured):
    off = measured(every_n_layers=None)
    points = off.memory.timeline
    index = lesson_view.loss_index(off)
    assert points[index].kind == "loss" and all(p.kind != "loss" for p in points[:index])
    assert lesson_view.saved_bytes(off) == sum(layer.saved_bytes for layer in off.layers) > 0
    assert 0 < lesson_view.activation_share(off) <= 1


def test_memory_above_the_baseline_and_the_rerun_bumps(measured):
    run = measured(every_n_layers=1)
    point = run.memory.timeline[-1]
    now, high = lesson_view.above_baseline(run, point)
    assert now == point.current_bytes - run.memory.baseline_bytes and high >= now
    bumps = tl.rerun_bumps(run.memory.timeline)
    line = lesson_view.bump_line(run.memory.timeline, lang)
    assert bool(line) == bool(bumps)
    if bumps:
        layer, rise = max(bumps.items(), key=lambda item: item[1])
        assert f"L{layer + 1}" in line and f"{rise / MIB:,.1f}" in line
    assert lesson_view.bump_line([], lang) == ""


def test_slider_options_and_the_run_diagram(measured):
    run = measured(every_n_layers=2)
    points = run.memory.timeline
    assert lesson_view.event_option(points, 0, "en").startswith(f"1/{len(points)} · ")
    figure = lesson_view.run_diagram(run, "en", height=230)
    assert figure.layout.height == 230


def test_the_sharding_bars_and_caption_say_gpus_and_setting():
    def bar(gpus, n):
        return SimpleNamespace(spec=SimpleNamespace(world_size=gpus, every_n_layers=n, model="m", seq_len=1024))

    idea = SimpleNamespace(
        bars=[bar(1, None), bar(1, 1), bar(4, None), bar(4, 1)],
        state_ratio=0.25,
        activation_ratio_gpus=1.0,
        activation_ratio_checkpointing=0.1,
        gathered_bytes=300 * MIB,
    )
    off = i18n.t("setting.short_off", lang)
    assert lesson_view.shard_labels(idea, lang) == [
        f"1 GPU<br>{off}",
        "1 GPU<br>n=1",
        f"4 GPUs<br>{off}",
        "4 GPUs<br>n=1",
    ]
    caption = lesson_view.shard_caption(idea, lang)
    assert caption == i18n.t(
        "lesson.shard.caption", lang, gpus=4, state="25", act_gpus="100", act_ckpt="10", gathered="300"
    )


def test_exercise_runs_and_outcomes_only_where_answered_and_measured(measured):
    exercise = EXERCISES[0]
    results = {}
    for spec in exercise.specs():
        assert spec.model == FAST.model
        results[spec] = measured(**{f: getattr(spec, f) for f in ("seq_len", "every_n_layers", "repeats", "warmup")})
        results[reference_spec(spec)] = measured(every_n_layers=None, seq_len=spec.seq_len, repeats=spec.repeats,
                                                warmup=spec.warmup)  # fmt: skip
    runs = lesson_view.exercise_runs(exercise, results)
    assert None in runs and runs[None].spec.every_n_layers is None
    assert lesson_view.outcomes(EXERCISES, {}, results, "en") == {}
    scored = lesson_view.outcomes(EXERCISES, {exercise.id: 50.0}, results, "en")
    assert list(scored) == [exercise.id] and 0 <= scored[exercise.id].points <= MAX_POINTS


def test_the_attention_part_draws_what_eager_holds_after_the_forward(measured):
    """Issue 58: at 128 tokens the part drew the peak, where eager's probabilities are already freed: two equal bars
    (105.2 MiB each), the difference in the caption alone. Its bars are now what the forward leaves held."""
    sdpa, eager = measured(every_n_layers=None), measured(every_n_layers=None, attn_implementation="eager")
    figure = lesson_view.attention_figure([sdpa, eager], lang)
    bars = [trace for trace in figure.data if trace.type == "bar"]
    totals = [sum(trace.y[slot] for trace in bars) * MIB for slot in (0, 1)]
    assert totals == pytest.approx([run.memory.after_forward_bytes for run in (sdpa, eager)])
    # tiny-llama: 6 layers of 6 heads keep seq^2 float32 probabilities where SDPA keeps a logsumexp of seq
    seq = sdpa.spec.seq_len
    assert totals[1] - totals[0] == pytest.approx(6 * 6 * (seq * seq - seq) * 4)
    assert figure.layout.title.text == i18n.t("breakdown.title_after_forward", lang)
    shown = lesson_view.attention_shown(sdpa, eager, lang)
    assert f"**{eager.memory.peak_bytes / MIB:,.1f} MiB**" in shown  # the peaks, said as another figure


def test_each_part_says_its_own_provenance_and_model():
    """Issue 58: one sentence said every figure was measured on tiny-llama; the 4-bit and sharding parts are simulated
    and the sharding part runs qwen3-0.6b. The caption is the results' own."""
    from ckptlab.lab.learn import SHARDING
    from ckptlab.results import Provenance
    from ckptlab.show.labels import provenance_label

    def result(kind: str, model: str) -> SimpleNamespace:
        provenance = Provenance(kind, "Intel Xeon, 2 cores", "2.13", "5.24", "2026-12-05T00:00:00Z")
        return SimpleNamespace(provenance=provenance, spec=replace(SHARDING, model=model))

    for language in i18n.LANGUAGES:
        shard = result("simulated", SHARDING.model)
        words = lesson_view.source_caption([shard, shard], language)
        assert provenance_label(shard.provenance, language) in words and "qwen3-0.6b" in words
        assert provenance_label("measured-cpu", language) not in words
        words = lesson_view.source_caption([result("measured-cpu", "tiny-llama")], language)
        assert provenance_label("measured-cpu", language) in words and "tiny-llama" in words


def test_the_4_bit_bars_say_what_differs_between_them_on_lines_that_fit():
    """Issue 58: two bars both read "bfloat16 base" (their settings were cut off with the rotated labels)."""
    from ckptlab.model.quantize import QLORA
    from ckptlab.show.figures.breakdown import sharding_figure, tick_width

    def bar(quantized, n):
        return SimpleNamespace(spec=SimpleNamespace(quantization=QLORA if quantized else None, dtype="bfloat16",
                                                    every_n_layers=n))  # fmt: skip

    idea = SimpleNamespace(bars=[bar(False, None), bar(False, 1), bar(True, None), bar(True, 1)])
    for language in i18n.LANGUAGES:
        labels = lesson_view.qlora_labels(idea, language)
        assert len(set(labels)) == 4, labels
        figure = sharding_figure([(label, {"parameter": MIB}) for label in labels], "", lang=language)
        assert figure.layout.xaxis.tickangle == 0  # horizontal: never turned sideways and cut
        for tick in figure.data[0].x:
            assert all(len(line) <= tick_width(4) for line in tick.split("<br>")), tick
