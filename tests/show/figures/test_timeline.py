"""Memory through a step and one moment of it: drawn from real runs, every word in the language asked for."""

from __future__ import annotations

import pytest

from ckptlab.show import i18n
from ckptlab.show.figures._style import CATEGORY_COLORS, PHASE_COLORS, PHASE_LABEL_COLOR
from ckptlab.show.figures.timeline import peak_cause, step_figure, timeline_figure
from ckptlab.step import timeline as tl
from ckptlab.units import MIB


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_timeline_overlays_two_settings_with_phases_peaks_and_a_cursor(measured, lang):
    run, off = measured(every_n_layers=2), measured(every_n_layers=None)
    figure = timeline_figure(run, [off], lang=lang, cursor=5)
    assert figure.layout.title.text.replace("<br>", " ") == i18n.t("timeline.title", lang)
    names = [trace.name for trace in figure.data]
    assert i18n.t("timeline.legend_now", lang, setting="every_n_layers=2") in names
    assert i18n.t("timeline.legend_now", lang, setting=i18n.t("setting.off", lang)) in names
    # The line through the events is the recorded memory, above the baseline.
    line = next(
        trace for trace in figure.data if trace.name == i18n.t("timeline.legend_now", lang, setting="every_n_layers=2")
    )
    expected = [(p.current_bytes - run.memory.baseline_bytes) / MIB for p in run.memory.timeline]
    assert list(line.y) == pytest.approx(expected)
    # Phases shaded, each rerun a band of its own in the legend's rerun colour, the cursor a vertical line.
    rerun = next(trace for trace in figure.data if trace.name == i18n.t("timeline.legend_rerun", lang))
    rerun_shapes = [shape for shape in figure.layout.shapes if shape.fillcolor == rerun.marker.color]
    assert len(rerun_shapes) == 3  # L1, L3 and L5 are CP at n=2
    # Each phase its neutral wash (none of the memory categories' colours), named in one text grey.
    washes = {shape.fillcolor for shape in figure.layout.shapes if shape.type == "rect"} - {rerun.marker.color}
    assert {PHASE_COLORS["forward"], PHASE_COLORS["backward"]} <= washes <= set(PHASE_COLORS.values())
    assert not washes & set(CATEGORY_COLORS.values())
    names = {f"<b>{i18n.t('band.' + phase, lang)}</b>" for phase in PHASE_COLORS}
    labels = [note for note in figure.layout.annotations if note.text in names]
    assert len(labels) == len(washes) and {note.font.color for note in labels} == {PHASE_LABEL_COLOR}
    assert any(shape.type == "line" for shape in figure.layout.shapes)
    peak_notes = [note.text for note in figure.layout.annotations if "MiB" in (note.text or "")]
    peak = i18n.number((run.memory.peak_bytes - run.memory.baseline_bytes) / MIB, ",.1f", lang)  # 75,3 in pt-BR
    assert len(peak_notes) == 2 and peak in peak_notes[0]
    assert figure.layout.separators == i18n.separators(lang)  # the axes' and hover labels' numbers alike


def test_step_figure_bars_are_what_each_layer_holds(measured):
    run = measured(every_n_layers=2)
    points = run.memory.timeline
    index = next(i for i, p in enumerate(points) if p.kind == "rerun" and p.layer == 2)
    figure = step_figure(run, index, lang="pt-BR")
    by_state = {trace.name: dict(zip(trace.x, trace.y)) for trace in figure.data}
    assert set(by_state[i18n.t("state.recomputing", "pt-BR")]) == {"L3"}
    assert set(by_state[i18n.t("state.freed", "pt-BR")]) == {"L4", "L5", "L6"}
    rise = points[index].region_peak_bytes - points[index].current_bytes
    assert by_state[i18n.t("state.recomputing", "pt-BR")]["L3"] == pytest.approx(
        (run.layers[2].input_bytes + rise) / MIB
    )
    assert i18n.t("event.rerun", "pt-BR", n=3) in figure.layout.title.text.replace("<br>", " ")


def test_a_run_without_timeline_is_refused(measured):
    from dataclasses import replace

    run = measured(every_n_layers=1)
    with pytest.raises(ValueError):
        timeline_figure(replace(run, memory=replace(run.memory, timeline=[])))
    assert tl.num_layers(run.memory.timeline) == run.model.num_layers


def test_the_peak_cause_names_where_the_peak_is(measured):
    from ckptlab.show.labels import event_label

    run = measured(every_n_layers=2)
    point = run.memory.timeline[tl.peak_index(run.memory.timeline)]
    assert event_label(point, "ja") in peak_cause(run, "ja")
