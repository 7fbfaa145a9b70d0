"""Where the memory goes: the peak by category, one stacked bar per run, the lab's one palette, provenance said."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ckptlab
from ckptlab.show import i18n
from ckptlab.show.figures._style import column_px
from ckptlab.show.figures.breakdown import SHARDING_PARTS, TICK_CHAR_PX, breakdown_figure, sharding_figure
from ckptlab.show.labels import training_label
from ckptlab.spec import RunSpec
from ckptlab.units import MIB

SPEC = RunSpec(model="tiny-llama", seq_len=128, every_n_layers=None, repeats=1, warmup=0)


@pytest.fixture(scope="module")
def runs() -> dict[str, ckptlab.RunResult]:
    # Simulated: a fraction of a second each, and the same categories a measured run has on the CPU.
    return {
        "off": ckptlab.simulate(SPEC),
        "n=1": ckptlab.simulate(replace(SPEC, every_n_layers=1)),
        "lora": ckptlab.simulate(replace(SPEC, lora_rank=8)),
    }


def _bars(figure):
    return [trace for trace in figure.data if trace.type == "bar"]


def test_each_bar_stacks_the_categories_to_the_total_at_the_peak(runs):
    figure = breakdown_figure([("off", runs["off"]), ("n=1", runs["n=1"])])
    names = [trace.name for trace in _bars(figure)]
    assert {"parameters", "optimizer state"} <= set(names)
    assert "buffers" not in names  # folded into the parameters
    for slot, run in enumerate((runs["off"], runs["n=1"])):
        stacked = sum(trace.y[slot] for trace in _bars(figure))
        assert stacked == pytest.approx(sum(run.memory.breakdown_at_peak.values()) / MIB)
    parameters = next(trace for trace in _bars(figure) if trace.name == "parameters")
    breakdown = runs["off"].memory.breakdown_at_peak
    assert parameters.y[0] == pytest.approx((breakdown["parameter"] + breakdown.get("buffer", 0)) / MIB)
    totals = next(trace for trace in figure.data if trace.type == "scatter")
    assert totals.text[0].endswith("MiB")


def test_one_palette_and_the_peak_phase_on_each_tick(runs):
    """A category has one colour across the lab: here and on the At-scale figure, and one apart from another."""
    from ckptlab.explore.scale import Setting, scale_table
    from ckptlab.show.figures.scale import scale_peak_figure

    figure = breakdown_figure([("off", runs["off"]), ("n=1", runs["n=1"])])
    colours = {trace.name: trace.marker.color for trace in _bars(figure)}
    at_scale = scale_peak_figure(scale_table("tiny-llama", 64, 1, "bfloat16", (Setting(None),)))
    scale_colours = {trace.name: trace.marker.color for trace in at_scale.data if trace.type == "bar"}
    for part in ("parameter", "optimizer_state"):
        name = i18n.t(f"category.{part}", "en")
        assert colours[name] == scale_colours[i18n.t(f"scale_figures.{part}", "en")], part
    assert len(set(colours.values())) == len(colours)
    ticks = list(_bars(figure)[0].x)
    assert ticks[0].startswith("off<br>peak in: ") and ticks[1].startswith("n=1<br>peak in: ")


@pytest.mark.parametrize("lang", ["en", "pt-BR", "ja"])
def test_three_bars_in_the_labs_narrow_column_keep_their_labels_horizontal_and_within_their_bars(runs, lang):
    """Off, plain and a selective policy beside the Lab's diagram (320 px at 1280x720): labels wrapped to 20
    characters were wider than their bar, so plotly turned them sideways and the figure's edge cut them ("checkpoin",
    issue 58). Each line now fits its bar's share of the figure, and the labels stay horizontal."""
    width = column_px(0.4)
    bars = [(i18n.t("setting.short_off", lang), runs["off"]), ("n=1", runs["n=1"]), ("selective: matmuls", runs["n=1"])]
    figure = breakdown_figure(bars, lang=lang, width=width)
    assert figure.layout.xaxis.tickangle == 0
    bar_px = (width - figure.layout.margin.l - figure.layout.margin.r) / len(bars)
    lines = [line for tick in _bars(figure)[0].x for line in tick.split("<br>")]
    widest = max(sum(2 if ch >= "\u3000" else 1 for ch in line) for line in lines)
    assert widest * TICK_CHAR_PX <= bar_px  # "peak in: backward" is two lines, each inside its bar


def test_the_subtitle_says_where_the_numbers_come_from_and_what_is_trained(runs):
    figure = breakdown_figure([("off", runs["off"]), ("n=1", runs["n=1"])])
    subtitle = figure.layout.title.subtitle.text.replace("<br>", " ")
    assert "simulated" in subtitle and "tiny-llama, seq 128" in subtitle
    assert "AdamW, full fine-tune" in subtitle
    assert "simulated" in _bars(figure)[0].hovertext[0]
    mixed = breakdown_figure([("full", runs["off"]), ("LoRA", runs["lora"])]).layout.title.subtitle.text
    assert "fine-tune" not in mixed  # bars differ in what they train: their labels say it, not the subtitle
    assert training_label(runs["lora"].spec) == "AdamW, LoRA rank 8"


def test_lora_keeps_almost_no_optimizer_state(runs):
    figure = breakdown_figure([("full", runs["off"]), ("LoRA", runs["lora"])])
    state = next(trace for trace in _bars(figure) if trace.name == "optimizer state")
    assert state.y[1] < state.y[0] / 10


def test_cuda_draws_activations_and_temporaries_as_one_segment(runs):
    run = runs["off"]
    breakdown = dict(run.memory.breakdown_at_peak)
    breakdown["activation_and_temp"] = breakdown.pop("activation", 0) + breakdown.pop("temp", 0)
    cuda = replace(run, memory=replace(run.memory, breakdown_at_peak=breakdown))
    names = [trace.name for trace in _bars(breakdown_figure([("off", cuda)]))]
    assert "activations and temporaries" in names
    assert "activations" not in names and "temporaries" not in names


def test_a_run_without_memory_is_left_out_and_words_follow_the_language(runs):
    failed = replace(runs["n=1"], memory=None)
    figure = breakdown_figure([("off", runs["off"]), ("n=1", failed)], lang="ja")
    assert len(_bars(figure)[0].x) == 1
    assert figure.layout.title.text.replace("<br>", " ") == i18n.t("breakdown.title", "ja")
    assert i18n.t("category.parameter", "ja") in [trace.name for trace in _bars(figure)]


def test_the_sharding_figure_draws_each_part_side_by_side_in_the_category_colours(runs):
    bars = [("1 GPU · off", {"parameter": 8 * MIB, "gradient": 8 * MIB, "optimizer_state": 16 * MIB, "activation": 20 * MIB}),
            ("2 GPUs · off", {"parameter": 4 * MIB, "gradient": 4 * MIB, "optimizer_state": 8 * MIB, "activation": 20 * MIB})]  # fmt: skip
    figure = sharding_figure(bars, "tiny · simulated", lang="ja")
    assert figure.layout.barmode == "group"  # not stacked: each part is its own maximum
    assert [trace.name for trace in figure.data] == [i18n.t(f"category.{part}", "ja") for part in SHARDING_PARTS]
    # Each part in the colour the breakdown figure gives that category.
    breakdown = breakdown_figure([("off", runs["off"]), ("n=1", runs["n=1"])], lang="ja")
    colours = {trace.name: trace.marker.color for trace in _bars(breakdown)}
    shared = [trace for trace in figure.data if trace.name in colours]
    assert len(shared) >= 3 and all(trace.marker.color == colours[trace.name] for trace in shared)
    assert list(figure.data[2].y) == [16, 8] and list(figure.data[3].x) == ["1 GPU · off", "2 GPUs · off"]
    assert (
        "simulated" in figure.layout.title.subtitle.text.replace("<br>", " ")
        and "MiB" in figure.layout.yaxis.title.text
    )


def test_a_japanese_subtitle_wraps_to_the_labs_narrow_column_and_no_line_starts_with_a_closing_mark():
    """The Lab's breakdown sits in a 0.4 column (321 px): its subtitle wraps by pixels there (a CJK character is
    about 13 px, a Latin one 5.9), where 52 characters a line ran past the figure's edge in Japanese once Chromium had
    a Japanese font; a line never begins with "、" (kinsoku)."""
    from ckptlab.show.figures._style import SUBTITLE_UNIT_PX, SUBTITLE_WIDE_UNITS, heading

    subtitle = "gpt2-small, seq 8 · オプティマイザのステップなし、フル fine-tune<br>CPU で実測 (Intel(R) Xeon(R) Processor, 2 cores)"
    lines = heading("t", subtitle, width_px=column_px(0.4))["subtitle"]["text"].split("<br>")
    assert len(lines) == 3 and not any(line.startswith("、") for line in lines)
    for line in lines:
        units = sum(SUBTITLE_WIDE_UNITS if ord(ch) > 0x2E80 else 1 for ch in line)
        assert units * SUBTITLE_UNIT_PX <= column_px(0.4) - 16
    assert (
        "fine-tune" in heading("t", "x · full fine-tune", width_px=None)["subtitle"]["text"]
    )  # wide figures as before
