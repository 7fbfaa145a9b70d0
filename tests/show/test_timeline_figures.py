"""Teaching figures: drawn from real runs, every word in the language asked for."""

from __future__ import annotations

import pytest

from ckptlab.show import i18n
from ckptlab.show.timeline_figures import diagram_figure, offload_figure, step_figure, timeline_figure, tradeoff_figure
from ckptlab.step import timeline as tl
from ckptlab.units import MIB


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_timeline_overlays_two_settings_with_phases_peaks_and_a_cursor(measured, lang):
    run, off = measured(every_n_layers=2), measured(every_n_layers=None)
    figure = timeline_figure(run, [off], lang=lang, cursor=5)
    assert figure.layout.title.text == i18n.t("timeline.title", lang)
    names = [trace.name for trace in figure.data]
    assert i18n.t("timeline.legend_now", lang, setting="every_n_layers=2") in names
    assert i18n.t("timeline.legend_now", lang, setting=i18n.t("setting.off", lang)) in names
    # The line through the events is the recorded memory, above the baseline.
    line = next(
        trace for trace in figure.data if trace.name == i18n.t("timeline.legend_now", lang, setting="every_n_layers=2")
    )
    expected = [(p["current_bytes"] - run.memory.baseline_bytes) / MIB for p in run.memory.timeline]
    assert list(line.y) == pytest.approx(expected)
    # Phases shaded, reruns each on their own, the cursor a vertical line.
    rerun_shapes = [shape for shape in figure.layout.shapes if shape.fillcolor == "#E69F00"]
    assert len(rerun_shapes) == 3
    assert any(shape.type == "line" for shape in figure.layout.shapes)
    peak_notes = [note.text for note in figure.layout.annotations if "MiB" in (note.text or "")]
    assert len(peak_notes) == 2 and f"{(run.memory.peak_bytes - run.memory.baseline_bytes) / MIB:,.1f}" in peak_notes[0]


def test_step_figure_bars_are_what_each_layer_holds(measured):
    run = measured(every_n_layers=2)
    points = run.memory.timeline
    index = next(i for i, p in enumerate(points) if p["kind"] == "rerun" and p["layer"] == 2)
    figure = step_figure(run, index, lang="pt-BR")
    by_state = {trace.name: dict(zip(trace.x, trace.y)) for trace in figure.data}
    assert set(by_state[i18n.t("state.recomputing", "pt-BR")]) == {"L3"}
    assert set(by_state[i18n.t("state.freed", "pt-BR")]) == {"L4", "L5", "L6"}
    rise = points[index]["region_peak_bytes"] - points[index]["current_bytes"]
    assert by_state[i18n.t("state.recomputing", "pt-BR")]["L3"] == pytest.approx(
        (run.layers[2].input_bytes + rise) / MIB
    )
    assert i18n.t("event.rerun", "pt-BR", n=3) in figure.layout.title.text


def test_diagram_outlines_the_layer_at_work(measured):
    run = measured(every_n_layers=2)
    figure = diagram_figure(
        [layer.enabled for layer in run.layers],
        lang="ja",
        focus=(2, "backward"),
        reruns=[layer.recompute_calls for layer in run.layers],
    )
    assert {trace.name for trace in figure.data} == {
        i18n.t(f"diagram.legend_{r}", "ja") for r in ("CP", "keep", "rerun")
    }
    rerun = next(trace for trace in figure.data if trace.name == i18n.t("diagram.legend_rerun", "ja"))
    widths = dict(zip(rerun.x, rerun.marker.line.width))
    assert widths[2] == 6 and widths[0] == 2


def test_tradeoff_and_offload_figures_carry_measured_numbers(measured):
    off, one = measured(every_n_layers=None), measured(every_n_layers=1)
    figure = tradeoff_figure([off, one], lang="en")
    resident = next(trace for trace in figure.data if trace.name == "held after the forward")
    assert list(resident.y) == pytest.approx(
        [off.memory.after_forward_bytes / MIB, one.memory.after_forward_bytes / MIB]
    )
    moved = offload_figure([one], lang="ja").data[0]
    assert moved.y[0] == pytest.approx(one.memory.offload_bytes / MIB) and moved.y[0] > 0


def test_a_run_without_timeline_is_refused(measured):
    from dataclasses import replace

    run = measured(every_n_layers=1)
    with pytest.raises(ValueError):
        timeline_figure(replace(run, memory=replace(run.memory, timeline=[])))
    assert tl.num_layers(run.memory.timeline) == run.model.num_layers


@pytest.mark.parametrize("checkpointed_steps, grey", [([0.30, 0.31, 0.32], False), ([0.19, 0.22, 0.26], True)])
def test_a_step_time_within_the_noise_of_off_is_grey_with_its_spread(measured, checkpointed_steps, grey):
    """The lesson's and the exercises' time bars follow results.judge_time, as the trade-off page does."""
    from dataclasses import replace

    from ckptlab.show.noise import NOISE_GREY

    def timed(run, steps):
        return replace(run, timing=replace(run.timing, step_s=sorted(steps)[1], step_samples=steps))

    off, one = (
        timed(measured(every_n_layers=None), [0.20, 0.21, 0.25]),
        timed(measured(every_n_layers=1), checkpointed_steps),
    )
    bars = next(trace for trace in tradeoff_figure([off, one], lang="en").data if trace.name == "step")
    assert (bars.marker.color[1] == NOISE_GREY) is grey and bars.marker.color[0] != NOISE_GREY
    assert bars.text[1].endswith("(noise)") is grey
    assert list(bars.error_y.array) == pytest.approx([40.0, checkpointed_steps[2] * 1000 - bars.y[1]])
