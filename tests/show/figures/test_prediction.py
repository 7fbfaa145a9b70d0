"""A prediction beside the measurement: the formula's beside a sweep's rows, a participant's guess beside a run."""

from __future__ import annotations

from ckptlab.explore.accuracy import check_predictions
from ckptlab.show import i18n
from ckptlab.show.figures.prediction import guess_figure, sweep_prediction_figure
from ckptlab.units import MIB


def _names(figure):
    return [trace.name for trace in figure.data if trace.name]


def _says_where_from(figure):
    subtitle = figure.layout.title.subtitle.text.replace("<br>", " ")
    assert subtitle.startswith("measured on the CPU"), subtitle


def test_sweep_prediction_figure_puts_predicted_beside_measured_with_errors(swept):
    checks = check_predictions(swept)
    figure = sweep_prediction_figure(swept, checks, 64)
    names = set(_names(figure))
    assert names == {"measured", "predicted (formula)", "predicted (calibrated)"}
    measured_memory = next(t for t in figure.data if t.name == "measured" and t.xaxis == "x")
    assert list(measured_memory.y) == [row.after_forward_bytes / MIB for row in swept.rows_at(64)]
    for trace in figure.data:
        if trace.name.startswith("predicted"):
            assert trace.marker.pattern.shape  # hatched: never mistaken for a measurement
            assert all(text.endswith("%") for text in trace.text)  # the error of the prediction
            # Upright and at its size: lying down in a grouped bar, plotly shrank it to 5 px (issue 43).
            assert trace.textangle == -90 and trace.constraintext == "none" and trace.textfont.size >= 11
        else:
            assert not trace.marker.pattern.shape  # the measurement is solid
    formula, calibrated = (
        next(t for t in figure.data if t.name == name) for name in ("predicted (formula)", "predicted (calibrated)")
    )
    assert formula.marker.pattern.shape != calibrated.marker.pattern.shape  # the two predictions told apart
    assert "predictions: formula" in figure.layout.title.subtitle.text.replace("<br>", " ")
    _says_where_from(figure)


def test_a_guess_is_drawn_beside_the_measurement_with_checkpointing_off_marked():
    figure = guess_figure(60, 75, lang="ja")
    bars = figure.data[0]
    assert list(bars.x) == [60, 75]
    assert list(bars.y) == [i18n.t("exercise.your_prediction", "ja"), i18n.t("exercise.measured", "ja")]
    assert bars.marker.color[0] != bars.marker.color[1]  # a guess never passes for the measurement
    assert [shape.x0 for shape in figure.layout.shapes] == [100]  # checkpointing off is 100 %
    assert figure.layout.annotations[0].text == i18n.t("exercise.off_line", "ja")
    assert not guess_figure(2, 3, unit=" GiB").layout.shapes  # no 100 % line for another unit
