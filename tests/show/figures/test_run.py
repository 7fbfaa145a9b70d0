"""Measured runs as bars: a run beside checkpointing off, several settings side by side, offload's share."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ckptlab
from ckptlab.lab.run import run_queued
from ckptlab.show.figures._style import ROLE_COLORS, SETTING_COLORS
from ckptlab.show.figures.diagram import plan_figure
from ckptlab.show.figures.run import comparison_figure, offload_figure, runs_tradeoff_figure
from ckptlab.show.i18n import t
from ckptlab.units import MIB

SPEC = ckptlab.RunSpec(model="tiny-llama", seq_len=128, repeats=1, warmup=1, every_n_layers=2)


@pytest.fixture(scope="module")
def lab():
    return run_queued(SPEC)  # the process-wide cache: shared with the other tests


def test_comparison_chart_puts_the_run_next_to_checkpointing_off(lab):
    figure = comparison_figure(lab.result, lab.reference.result)
    names = [trace.name for trace in figure.data]
    assert names == ["every_n_layers=2", "every_n_layers=2", "checkpointing off", "checkpointing off"]
    memory_run, time_run, memory_off, _ = figure.data
    assert memory_run.y[0] == pytest.approx(lab.result.memory.after_forward_bytes / 2**20)
    assert memory_off.y[0] == pytest.approx(lab.reference.result.memory.after_forward_bytes / 2**20)
    assert time_run.y[2] == pytest.approx(lab.result.timing.step_s * 1000)
    # Two colours, the settings' own: not the diagram's role colours drawn beside them (one colour, one meaning).
    roles = {*ROLE_COLORS.values(), *(trace.marker.color for trace in plan_figure(2, None).data)}
    assert (memory_off.marker.color, memory_run.marker.color) == (SETTING_COLORS["off"], SETTING_COLORS["full"])
    assert not roles & {memory_run.marker.color, memory_off.marker.color}


def test_comparison_chart_of_a_run_without_measurements_is_refused(lab):
    failed = replace(lab.result, status="does_not_fit", memory=None, timing=None)
    with pytest.raises(ValueError, match="does_not_fit"):
        comparison_figure(failed, lab.reference.result)


def test_checkpointing_off_charts_one_series(lab):
    figure = comparison_figure(lab.reference.result, lab.reference.result)
    assert {trace.name for trace in figure.data} == {"checkpointing off"}


def test_tradeoff_and_offload_figures_carry_measured_numbers(measured):
    off, one = measured(every_n_layers=None), measured(every_n_layers=1)
    figure = runs_tradeoff_figure([off, one], lang="en")
    resident = next(trace for trace in figure.data if trace.name == "held after the forward")
    assert list(resident.y) == pytest.approx(
        [off.memory.after_forward_bytes / MIB, one.memory.after_forward_bytes / MIB]
    )
    assert list(resident.x) == [t("setting.short_off", "en"), "n=1"]  # short, so that they stay horizontal
    moved = offload_figure([one], lang="ja").data[0]
    assert moved.y[0] == pytest.approx(one.memory.offload_bytes / MIB) and moved.y[0] > 0


@pytest.mark.parametrize("checkpointed_steps, grey", [([0.30, 0.31, 0.32], False), ([0.19, 0.22, 0.26], True)])
def test_a_step_time_within_the_noise_of_off_is_grey_with_its_spread(measured, checkpointed_steps, grey):
    """The lesson's and the exercises' time bars follow results.judge_time, as the trade-off page does."""
    from ckptlab.show.figures._style import NOISE_GREY

    def timed(run, steps):
        return replace(run, timing=replace(run.timing, step_s=sorted(steps)[1], step_samples=steps))

    off, one = (
        timed(measured(every_n_layers=None), [0.20, 0.21, 0.25]),
        timed(measured(every_n_layers=1), checkpointed_steps),
    )
    bars = next(trace for trace in runs_tradeoff_figure([off, one], lang="en").data if trace.name == "step")
    assert (bars.marker.color[1] == NOISE_GREY) is grey and bars.marker.color[0] != NOISE_GREY
    assert bars.text[1].endswith("(noise)") is grey
    assert list(bars.error_y.array) == pytest.approx([40.0, checkpointed_steps[2] * 1000 - bars.y[1]])


def test_five_settings_keep_their_step_times_readable_over_their_bars(measured):
    """Exercise 6 draws off and four settings; on a busy machine each time says "(noise)". Plotly shrank "1,49
    (noise)" to its bar's width until it was a few pixels tall and ran into its neighbours (issue 58): the words
    wrap to the bar at 13 px and plotly may not shrink them below that."""
    from ckptlab.show.figures._style import PAGE_PX
    from ckptlab.show.figures.run import BAR_CHAR_PX, BAR_TEXT_PX

    def noisy(run, steps):
        return replace(run, timing=replace(run.timing, step_s=sorted(steps)[1], step_samples=steps))

    off = noisy(measured(every_n_layers=None), [0.20, 0.21, 0.25])
    one = noisy(measured(every_n_layers=1), [0.19, 0.22, 0.26])  # the module's runs: only the labels differ
    runs = [off, *(replace(one, spec=replace(one.spec, every_n_layers=n)) for n in (1, 2, 3, 6))]
    figure = runs_tradeoff_figure(runs, lang="pt-BR", width=PAGE_PX)
    bars = next(trace for trace in figure.data if trace.name == t("trade.step", "pt-BR"))
    assert bars.textfont.size == BAR_TEXT_PX and figure.layout.uniformtext.minsize == BAR_TEXT_PX
    bar_px = (PAGE_PX - 60) * (1 - 0.12) / 2 / len(runs) * 0.8
    assert all("<br>" in text for text in bars.text[1:])  # "(ruído)" on a line of its own
    assert all(len(line) * BAR_CHAR_PX <= bar_px for text in bars.text for line in text.split("<br>"))
