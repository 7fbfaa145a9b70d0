"""The room's figure: a histogram of the predictions beside the measured answer, bars for a choice."""

from __future__ import annotations

from ckptlab.show.figures.room import PERCENT_BIN, room_figure
from ckptlab.show.i18n import t


def _vlines(figure) -> list[float]:
    return [shape.x0 for shape in figure.layout.shapes]


def test_a_percent_round_has_the_off_line_and_the_measured_one():
    figure = room_figure("percent", [40, 45, 90], 37.0, lang="en")
    (histogram,) = figure.data
    assert list(histogram.x) == [40, 45, 90] and histogram.xbins.size == PERCENT_BIN
    assert sorted(_vlines(figure)) == [37.0, 100.0]
    assert figure.layout.xaxis.title.text == t("classroom.fig_percent_axis", "en")


def test_a_kept_round_is_a_histogram_of_kib_without_an_off_line():
    figure = room_figure("kept", [100.0, 250.0, 260.0], 240.0, lang="ja")
    (histogram,) = figure.data
    assert histogram.type == "histogram" and histogram.xbins.size == 24.0  # a tenth of the measurement
    assert _vlines(figure) == [240.0]  # KiB have no "checkpointing off = 100%" line
    assert "240.0 KiB" in " ".join(annotation.text for annotation in figure.layout.annotations)
    assert figure.layout.xaxis.title.text == t("classroom.fig_kept_axis", "ja")


def test_a_choice_round_has_one_bar_per_choice():
    figure = room_figure("choice", [1, 2, 2], 2.0, choices=(1, 2, 3), lang="en")
    (bars,) = figure.data
    assert list(bars.y) == [1, 2, 0]
