"""A sweep's figures, tested in the core: what they draw, and that every one says where it came from."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab.explore.recommend import recommend
from ckptlab.explore.sweep import SweepResult, SweepSpec
from ckptlab.explore.sweep_rows import pareto_rows, rows_from_results
from ckptlab.show.figures.tradeoff import (
    LABEL_PX,
    PARETO_PLOT_PX,
    label_box,
    seq_len_figure,
    sweep_peak_figure,
    sweep_provenance_label,
    sweep_tradeoff_figure,
)
from ckptlab.show.peak_words import peak_sentence
from ckptlab.spec import RunSpec
from ckptlab.step.simulate import simulate
from ckptlab.units import MIB
from tests.explore.test_recommend import TABLE


def _names(figure):
    return [trace.name for trace in figure.data if trace.name]


def _says_where_from(figure):
    subtitle = figure.layout.title.subtitle.text.replace("<br>", " ")
    assert subtitle.startswith("measured on the CPU"), subtitle


def test_pareto_frontier_of_a_hand_made_table():
    assert [row.setting for row in pareto_rows(TABLE)] == ["off", "n=8", "n=4", "n=2", "n=1", "n=1+offload"]
    slower_and_bigger = TABLE[2].__class__(
        **{**TABLE[2].__dict__, "step_s": 0.2, "peak_bytes": 990 * MIB, "every_n_layers": 3}
    )
    assert slower_and_bigger not in pareto_rows([*TABLE, slower_and_bigger])


def test_tradeoff_figure_points_frontier_budget_and_recommendation():
    result = SweepResult(spec=SweepSpec(seq_lens=(1024,)), model="hand-made", num_layers=8, device="cuda:0", rows=TABLE)
    rec = recommend(TABLE, 800 * MIB)
    figure = sweep_tradeoff_figure(result, 1024, rec)
    points = figure.data[0]
    assert list(points.text) == [row.setting for row in TABLE]
    assert list(points.y) == [row.peak_bytes / MIB for row in TABLE]
    frontier = next(t for t in figure.data if t.name.startswith("Pareto frontier"))
    assert list(frontier.y) == [row.peak_bytes / MIB for row in pareto_rows(TABLE)]
    star = next(t for t in figure.data if t.name.startswith("recommended"))
    assert star.name == "recommended: n=4 (fastest that fits)" and list(star.y) == [780]
    assert figure.layout.shapes[0].y0 == 800  # the budget line, MiB
    assert figure.layout.title.subtitle.text.replace("<br>", " ") == "measured on CUDA"


def test_the_pareto_labels_meet_no_other_label_point_or_the_budget_line():
    """Issue 43: the labels overlapped each other and the budget line at 1280x720. Close points and a budget
    between them: each label gets a free place in the plot (boxes estimated as drawn: PARETO_PLOT_PX)."""
    rows = [
        replace(TABLE[index], step_s=step, step_min_s=step, step_max_s=step * 1.02, peak_bytes=mib * MIB)
        for index, step, mib in ((0, 0.100, 800), (2, 0.1015, 812), (3, 0.103, 790), (4, 0.160, 400))
    ]
    result = SweepResult(spec=SweepSpec(seq_lens=(1024,)), model="hand-made", num_layers=8, device="cuda:0", rows=rows)
    figure = sweep_tradeoff_figure(result, 1024, recommend(rows, 805 * MIB))
    points = figure.data[0]
    (x0, x1), (y0, y1) = figure.layout.xaxis.range, figure.layout.yaxis.range
    width, height = PARETO_PLOT_PX
    centres = [((x - x0) * width / (x1 - x0), (y1 - y) * height / (y1 - y0)) for x, y in zip(points.x, points.y)]
    boxes = [
        label_box(centre, place, 0.6 * LABEL_PX * len(text), 1.3 * LABEL_PX, 7.0)
        for centre, place, text in zip(centres, points.textposition, points.text)
    ]
    assert len(set(points.textposition)) > 1  # the close ones were moved apart
    budget = (y1 - 805) * height / (y1 - y0)
    for index, box in enumerate(boxes):
        assert box[0] >= 0 and box[2] <= width and box[1] >= 0 and box[3] <= height, (points.text[index], box)
        assert not box[1] < budget < box[3], points.text[index]  # the budget line runs under or over it
        for other in boxes[index + 1 :]:
            assert not (box[0] < other[2] and other[0] < box[2] and box[1] < other[3] and other[1] < box[3])


def test_tradeoff_figure_of_a_real_sweep(swept):
    rows = swept.rows_at(64)
    figure = sweep_tradeoff_figure(swept, 64, recommend(swept.rows, max(row.peak_bytes for row in rows)))
    # Two timed steps a row are too few to judge: every setting but off is greyed (the legend names the grey).
    assert list(figure.data[0].text) == [row.setting for row in rows]
    assert len(set(figure.data[0].marker.color)) == 2
    assert all(row.time_is_noise for row in rows[1:])
    # At 64 tokens every setting has the same peak (the gradients'): the frontier is the fastest point alone.
    frontier = next(t for t in figure.data if t.name.startswith("Pareto frontier"))
    assert len(frontier.x) == 1
    _says_where_from(figure)
    # Ranked by the prediction, the star says so rather than "fastest".
    star = next(t for t in figure.data if t.name.startswith("recommended"))
    assert "least predicted recompute" in star.name and "fastest" not in star.name


def test_seq_len_figure_measured_and_predicted_series(swept):
    figure = seq_len_figure(swept)
    names = _names(figure)
    for label in ("off", "full (n=1)", "partial (n=2)"):
        assert f"{label} (measured)" in names and f"{label} (predicted, formula)" in names
    # On the CPU offload is not measured: it appears only as a prediction.
    assert "offload (n=1) (predicted, formula)" in names and "offload (n=1) (measured)" not in names
    off = next(t for t in figure.data if t.name == "off (predicted, formula)")
    assert max(off.x) == 256  # up to 4x the longest measured length
    full = next(t for t in figure.data if t.name == "full (n=1) (predicted, formula)")
    assert all(f < o for f, o in zip(full.y, off.y))
    _says_where_from(figure)


def test_peak_figure_and_sentences(swept):
    figure = sweep_peak_figure(swept, 64)
    assert set(_names(figure)) == {row.setting for row in swept.rows_at(64)}
    _says_where_from(figure)
    off = swept.off_row(64)
    for row in swept.rows_at(64):
        sentence = peak_sentence(row, off)
        assert sentence.startswith(f"{row.setting}: the peak") and row.peak_where in sentence
    # At 64 tokens the peak is at the end of the backward, and checkpointing cannot lower it.
    full = next(row for row in swept.rows_at(64) if row.every_n_layers == 1)
    assert "frees activations, not gradients" in peak_sentence(full, off)
    assert "not lower" in peak_sentence(full, off)
    # Decided on the event's kind, never on the words describing it.
    assert full.peak_kind == "backward_end"
    worded_alike = replace(full, peak_kind="layer_backward", result=None)
    assert "last gradients" in worded_alike.peak_where
    assert "frees activations, not gradients" not in peak_sentence(worded_alike, off)


def test_a_peak_in_the_optimizer_step_says_checkpointing_cannot_lower_it():
    # Trainer's default, fused AdamW, makes no temporaries in its step, nor does the CPU's per-parameter loop
    # at this size; the multi-tensor AdamW a CUDA device runs for adamw_torch does (simulated here).
    specs = [RunSpec(model="tiny-gpt2", seq_len=32, every_n_layers=n, optimizer="adamw_torch") for n in (None, 1)]
    off, full = rows_from_results([simulate(spec) for spec in specs])
    assert full.peak_phase == "optimizer"
    assert "optimizer's state" in peak_sentence(full, off) and "not lower" in peak_sentence(full, off)


def test_a_time_within_the_noise_is_greyed_and_named():
    from ckptlab.results import Judgement, TimeVerdict
    from ckptlab.show.figures._style import NOISE_GREY
    from ckptlab.show.noise import sweep_table

    noise = TimeVerdict(ratio=0.67, spread=0.8, samples=4, judgement=Judgement.NOISE)
    clear = TimeVerdict(ratio=1.3, spread=0.02, samples=4, judgement=Judgement.MEASURABLE)
    rows = [
        TABLE[0],
        TABLE[2].__class__(**{**TABLE[2].__dict__, "time_verdict": noise, "step_verdict": "noise"}),
        TABLE[3].__class__(**{**TABLE[3].__dict__, "time_verdict": clear, "step_verdict": "measurable"}),
    ]
    result = SweepResult(spec=SweepSpec(seq_lens=(1024,)), model="hand-made", num_layers=8, device="cuda:0", rows=rows)
    figure = sweep_tradeoff_figure(result, 1024)
    points = figure.data[0]
    grey = next(trace for trace in figure.data if trace.name == "time within the noise (grey)").marker.color
    colours = list(points.marker.color)
    assert colours[1] == grey == NOISE_GREY and colours[0] == colours[2] != grey  # only the noisy point is grey
    assert list(points.text) == ["off", "n=4", "n=2"]  # the grey and the legend say noise (words collided)
    table = sweep_table(rows, "en")
    assert [line["time vs off"] for line in table] == ["", "noise: not measurable", "measurable"]
    assert sweep_table(rows, "ja")[1]["off との時間差"] == "ノイズ:測定可能な差ではない"


def test_a_table_without_its_runs_says_the_kind_of_measurement_in_the_language_asked_for():
    result = SweepResult(spec=SweepSpec(seq_lens=(1024,)), model="hand-made", num_layers=8, device="cuda:0", rows=TABLE)
    assert sweep_provenance_label(result) == "measured on CUDA"
    assert sweep_provenance_label(result, "ja") == "CUDA で実測"
    cpu = [TABLE[0].__class__(**{**TABLE[0].__dict__, "provenance": "measured-cpu"})]
    assert sweep_provenance_label(replace(result, rows=cpu), "pt-BR") == "medido na CPU"
    assert sweep_provenance_label(replace(result, rows=[])) == "measured"


# What the hovers said in English before they went through the locale files (terms like forward,
# backward, offload and seq stay English in every language, as in the figures' titles).
ENGLISH_HOVER = ("step", "peak", "resident after", "reached", "recommended", "measured", "predicted", "full (",
                 "partial (", " of L", " in ", "noise", "last gradients")  # fmt: skip


def _hover_words(figure):
    """Everything a hover shows: its template, the points' text and custom data, the trace's name."""
    for trace in figure.data:
        yield trace.hovertemplate or ""
        yield trace.name or ""
        text = trace.text if trace.text is not None else ()
        yield from ([text] if isinstance(text, str) else [str(item) for item in text])
        for item in trace.customdata if trace.customdata is not None else ():
            yield from (value for value in item if isinstance(value, str))


def _figures(swept, lang):
    rows = swept.rows_at(64)
    recommendation = recommend(swept.rows, max(row.peak_bytes for row in rows))
    return [
        sweep_tradeoff_figure(swept, 64, recommendation, lang),
        seq_len_figure(swept, lang=lang),
        sweep_peak_figure(swept, 64, lang),
    ]


@pytest.mark.parametrize("lang", ["pt-BR", "ja"])
def test_the_hovers_speak_the_pages_language(swept, lang):
    said = [words for figure in _figures(swept, lang) for words in _hover_words(figure)]
    assert any("%{customdata[0]}" in words for words in said)  # the scan sees the hovers
    english = [(word, words) for words in said for word in ENGLISH_HOVER if word in words]
    assert not english, english


def test_the_english_hovers_say_what_they_said_before(swept):
    points, *_ = _figures(swept, "en")[0].data
    assert points.hovertemplate == (
        "%{text}: step %{x:,.0f} ms, peak %{y:,.1f} MiB<br>resident after the forward %{customdata[1]:,.1f} MiB"
        "<br>peak reached in: %{customdata[0]}<extra></extra>"
    )
    assert [where for where, _ in points.customdata] == [row.peak_where for row in swept.rows_at(64)]
    star = next(trace for trace in _figures(swept, "en")[0].data if trace.name.startswith("recommended"))
    assert star.hovertemplate.startswith("recommended: ") and star.hovertemplate.endswith("<extra></extra>")
    peak = sweep_peak_figure(swept, 64)
    marker = next(trace for trace in peak.data if trace.mode == "markers")
    row = swept.rows_at(64)[0]
    assert (
        marker.hovertemplate
        == f"{row.setting}: peak {row.peak_bytes / MIB:,.1f} MiB in {row.peak_where}<extra></extra>"
    )
    line = next(trace for trace in peak.data if trace.mode == "lines")
    assert list(line.text) == [point.event for point in row.result.memory.timeline]


def test_the_tradeoff_figure_tells_the_policies_apart():
    from tests.explore.test_sweep_policies import POLICY_TABLE

    spec = SweepSpec(seq_lens=(1024,), every_n_layers=(1, 2), policies=("none", "attention"))
    result = SweepResult(spec=spec, model="hand-made", num_layers=8, device="cuda:0", rows=POLICY_TABLE)
    figure = sweep_tradeoff_figure(result, 1024, recommend(POLICY_TABLE, 700 * MIB))
    plain, kept = figure.data[0], figure.data[1]
    assert plain.name == "selective=none (measured)" and kept.name == "selective=attention (measured)"
    assert list(plain.text) == ["off", "n=2", "n=1"] and list(kept.text) == ["n=2+attention", "n=1+attention"]
    assert plain.marker.symbol != kept.marker.symbol and plain.marker.color[1] != kept.marker.color[0]
    star = next(t for t in figure.data if t.name.startswith("recommended"))
    assert star.name == "recommended: n=1+attention (fastest that fits)"
    # One policy: the one trace it always had.
    assert (
        sweep_tradeoff_figure(replace(result, rows=POLICY_TABLE[:2]), 1024).data[0].name == "configuration (measured)"
    )
