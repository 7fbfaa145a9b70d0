"""At-scale figures: stacked peak per setting against a GPU line, fits marked, host memory apart, all "simulated"."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab.explore.scale import ScaleTable, Setting, scale_table
from ckptlab.show.figures._style import VERDICT_COLORS
from ckptlab.show.figures.scale import resident_figure, scale_peak_figure
from ckptlab.show.i18n import t
from ckptlab.units import GIB, MIB

SETTINGS = (Setting(None), Setting(1), Setting(1, offload=True))
HOST = t("scale_figures.host", "en")


@pytest.fixture(scope="module")
def table() -> ScaleTable:
    return scale_table("tiny-llama", 128, 1, "bfloat16", SETTINGS)


def _bars(figure, name):
    return next(trace for trace in figure.data if trace.name == name)


def _span(trace, slot: int) -> tuple[float, float]:
    """Where a bar sits along the x axis in a setting's slot: [left, right]."""
    offsets = trace.offset if isinstance(trace.offset, (list, tuple)) else [trace.offset] * len(trace.x)
    widths = trace.width if isinstance(trace.width, (list, tuple)) else [trace.width] * len(trace.x)
    at = list(trace.x).index(slot)
    return slot + offsets[at], slot + offsets[at] + widths[at]


def _big(table: ScaleTable, factor: int = 1000) -> ScaleTable:
    """The same table with every byte count multiplied: the size of a real model (off twice that, so peaks differ)."""

    def grow(result):
        factor_here = factor * (2 if result.spec.every_n_layers is None else 1)
        memory = result.memory
        return replace(
            result,
            memory=replace(
                memory,
                peak_bytes=memory.peak_bytes * factor_here,
                after_forward_bytes=memory.after_forward_bytes * factor_here,
                host_offload_bytes=memory.host_offload_bytes * factor_here,
                breakdown_at_peak={key: value * factor_here for key, value in memory.breakdown_at_peak.items()},
            ),
        )

    return replace(table, results=[grow(result) for result in table.results])


def test_peak_stacks_the_parts_to_the_peak_with_host_memory_apart(table):
    figure = scale_peak_figure(table)
    names = [trace.name for trace in figure.data]
    for part in ("parameters and buffers", "gradients", "activations", "temporaries"):
        assert part in names
    assert (
        "simulated" in figure.layout.title.text.replace("<br>", " ") and "simulated" in figure.layout.yaxis.title.text
    )
    assert figure.layout.yaxis.title.text.endswith("MiB")  # a tiny model: GiB would read 0.0
    assert "buffers" not in names  # folded into the parameters
    device = [trace for trace in figure.data if trace.type == "bar" and trace.name != HOST]
    for slot, result in enumerate(table.results):
        stacked = sum(trace.y[slot] for trace in device)
        assert stacked == pytest.approx(result.memory.peak_bytes / MIB)
        top = device[-1]
        assert top.base[slot] + top.y[slot] == pytest.approx(stacked)
    host = _bars(figure, HOST)
    offload = table.result_for(Setting(1, offload=True))
    assert list(host.x) == [2] and host.y[0] == pytest.approx(offload.memory.host_offload_bytes / MIB)
    assert host.marker.pattern.shape and not any(trace.marker.pattern.shape for trace in device)  # hatched: not GPU
    (host_left, host_right), (device_left, device_right) = _span(host, 2), _span(device[0], 2)
    assert device_right <= host_left or host_right <= device_left  # beside the device bar, not on it
    assert min(host_left, device_left) > 1.5 and max(host_right, device_right) < 2.5  # both in the offload slot
    assert all("simulated" in text and "MiB" in text and "GiB" in text for trace in device for text in trace.hovertext)


def test_the_budget_is_a_line_and_each_setting_is_marked(table):
    big = _big(table)
    peaks = sorted(result.memory.peak_bytes for result in big.results)
    budget = (peaks[0] + peaks[-1]) // 2
    figure = scale_peak_figure(big, budget, "Card 1", selected=Setting(1))
    assert figure.layout.yaxis.title.text.endswith("GiB")
    line = _bars(figure, f"Card 1: {budget / GIB:,.1f} GiB")
    assert line.mode == "lines" and list(line.y) == [pytest.approx(budget / GIB)] * 2
    fit, no_fit = _bars(figure, "fits in Card 1"), _bars(figure, "does not fit in Card 1")
    marked = {round(x, 2) for x in fit.x} | {round(x, 2) for x in no_fit.x}
    assert len(fit.x) + len(no_fit.x) == len(big.results) and len(marked) == len(big.results)
    assert fit.marker.symbol == "circle" and no_fit.marker.symbol == "x"
    # The verdict in neutrals: no mark or its number in a colour of the category bars it sits on.
    assert (fit.marker.color, no_fit.marker.color) == (VERDICT_COLORS[True], VERDICT_COLORS[False])
    assert (fit.textfont.color, no_fit.textfont.color) == (fit.marker.color, no_fit.marker.color)
    bar_colors = {trace.marker.color for trace in figure.data if trace.type == "bar"}
    assert len(bar_colors) > 1 and not bar_colors & {fit.marker.color, no_fit.marker.color}
    assert list(no_fit.x) == [0] and no_fit.y[0] * GIB > budget  # off: twice the others
    device = next(trace for trace in figure.data if trace.type == "bar")
    for x in fit.x:  # each mark over its setting's device bar: over the device half of the offload slot
        left, right = _span(device, round(x))
        assert left < x < right
    assert all("simulated" in text for text in fit.hovertext + no_fit.hovertext)
    assert sum("<b>" in tick for tick in figure.layout.xaxis.ticktext) == 1  # the setting shown below


def test_a_budget_far_above_every_bar_is_named_not_drawn(table):
    figure = scale_peak_figure(table, 80 * GIB, "H100 80 GB")
    assert not [trace for trace in figure.data if trace.type == "scatter" and trace.mode == "lines"]
    assert "far above" in figure.layout.title.subtitle.text.replace("<br>", " ")
    assert _bars(figure, "fits in H100 80 GB")


def test_resident_after_the_forward_per_setting(table):
    figure = resident_figure(table)
    bars = _bars(figure, t("scale_figures.resident", "en"))
    assert list(bars.y) == pytest.approx([result.memory.after_forward_bytes / MIB for result in table.results])
    assert (
        "simulated" in figure.layout.title.text.replace("<br>", " ") and "simulated" in figure.layout.yaxis.title.text
    )
    host = _bars(figure, HOST)
    assert host.marker.pattern.shape and not bars.marker.pattern.shape and len(host.x) == 1  # hatched: not GPU
    assert list(figure.layout.xaxis.ticktext) == ["off<br>0 CP", "n=1<br>6 CP", "n=1+offload<br>6 CP"]


def test_a_stopped_table_draws_what_it_has_in_the_language_asked_for(table):
    partial = replace(table, results=table.results[:1], cancelled=True)
    figure = scale_peak_figure(partial, 10 * MIB, lang="pt-BR")
    assert len(figure.layout.xaxis.ticktext) == 1
    assert any(trace.name.startswith("não cabe") or trace.name.startswith("cabe") for trace in figure.data)
    assert "simulad" in figure.layout.title.text.replace(
        "<br>", " "
    ) and "simulado" in figure.layout.title.subtitle.text.replace("<br>", " ")


def test_the_english_words_are_the_ones_the_figures_had_before_the_locale_files():
    """The words moved from a dict in the module to the locale files: in English nothing changed."""
    table_of_one = scale_table("tiny-llama", 64, 1, "bfloat16", (Setting(1),))
    figure = resident_figure(table_of_one)
    assert figure.layout.title.text.replace("<br>", " ") == "Resident after the forward, simulated: tiny-llama, seq 64"
    subtitle = figure.layout.title.subtitle.text.replace("<br>", " ")
    provenance = table_of_one.results[0].provenance.label
    assert subtitle.startswith(f"batch 1 · bfloat16 · {provenance} activations kept for the backward")
    assert figure.layout.xaxis.title.text == "setting (checkpointed layers)"
    assert figure.layout.yaxis.title.text == "simulated memory, MiB"
    names = [trace.name for trace in scale_peak_figure(table_of_one).data]
    assert "parameters and buffers" in names and "activations" in names


def test_memory_against_predicted_time_one_point_a_setting_and_the_budget_line():
    """Issue 59: at scale, each setting's simulated peak against its predicted step time on the GPU, the points that
    fit marked as the peak figure marks them, the budget drawn; the axes say which figure is predicted."""
    from ckptlab.explore.gpus import GPU_SPECS
    from ckptlab.explore.scale import table_times
    from ckptlab.show.figures.scale import scale_time_figure
    from tests.explore import hand_table

    table = hand_table.table(hand_table.PEAKS)
    times = table_times(table, GPU_SPECS["H100 80 GB"])
    figure = scale_time_figure(table, times, hand_table.BUDGET, "H100 80 GB", selected=Setting(1), lang="en")
    fitting, over = _bars(figure, "fits in H100 80 GB"), _bars(figure, "does not fit in H100 80 GB")
    assert sorted(fitting.text) == sorted(["<b>n=1</b>", "n=1+offload", "n=2+offload"])
    assert sorted(over.text) == ["n=2", "off"]
    ms = {row.setting.key: row.prediction.seconds * 1000 for row in times}
    assert dict(zip(over.text, over.x)) == {"off": ms["off"], "n=2": ms["n=2"]}
    assert dict(zip(over.text, over.y)) == {"off": 100.0, "n=2": 90.0}  # GiB: the unit of the tallest
    line = _bars(figure, "H100 80 GB: 75.0 GiB")
    assert list(line.y) == [75.0, 75.0]
    assert "predicted (roofline, H100 80 GB)" in figure.layout.xaxis.title.text
    assert "×1.33" in next(h for h in fitting.hovertext if "n=1<" in h)
    untimed = hand_table.table(hand_table.PEAKS, counted=False)
    empty = scale_time_figure(untimed, table_times(untimed, GPU_SPECS["H100 80 GB"]), None, lang="ja")
    assert not [trace for trace in empty.data if trace.x]  # no counted work: no point pretends a time
