"""At-scale figures: stacked peak per setting against a GPU line, fits marked, host memory apart, all "simulated"."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab.explore.scale import ScaleTable, Setting, scale_table
from ckptlab.show.scale_figures import HOST_PATTERN, WORDS, peak_figure, resident_figure
from ckptlab.units import GIB, MIB

SETTINGS = (Setting(None), Setting(1), Setting(1, offload=True))


@pytest.fixture(scope="module")
def table() -> ScaleTable:
    return scale_table("tiny-llama", 128, 1, "bfloat16", SETTINGS)


def _bars(figure, name):
    return next(trace for trace in figure.data if trace.name == name)


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
    figure = peak_figure(table)
    names = [trace.name for trace in figure.data]
    for part in ("parameters and buffers", "gradients", "activations", "temporaries"):
        assert part in names
    assert "simulated" in figure.layout.title.text and "simulated" in figure.layout.yaxis.title.text
    assert figure.layout.yaxis.title.text.endswith("MiB")  # a tiny model: GiB would read 0.0
    assert "buffers" not in names  # folded into the parameters
    device = [trace for trace in figure.data if trace.type == "bar" and trace.name != WORDS["host"]]
    for slot, result in enumerate(table.results):
        stacked = sum(trace.y[slot] for trace in device)
        assert stacked == pytest.approx(result.memory.peak_bytes / MIB)
        top = device[-1]
        assert top.base[slot] + top.y[slot] == pytest.approx(stacked)
    host = _bars(figure, WORDS["host"])
    offload = table.result_for(Setting(1, offload=True))
    assert list(host.x) == [2] and host.y[0] == pytest.approx(offload.memory.host_offload_bytes / MIB)
    assert host.marker.pattern.shape == HOST_PATTERN["shape"]  # hatched: not GPU memory
    assert host.offset == 0.02 and device[0].offset[2] < 0  # beside the device bar, not on it
    assert all("simulated" in text and "MiB" in text and "GiB" in text for trace in device for text in trace.hovertext)


def test_the_budget_is_a_line_and_each_setting_is_marked(table):
    big = _big(table)
    peaks = sorted(result.memory.peak_bytes for result in big.results)
    budget = (peaks[0] + peaks[-1]) // 2
    figure = peak_figure(big, budget, "Card 1", selected=Setting(1))
    assert figure.layout.yaxis.title.text.endswith("GiB")
    line = _bars(figure, f"Card 1: {budget / GIB:,.1f} GiB")
    assert line.mode == "lines" and list(line.y) == [pytest.approx(budget / GIB)] * 2
    fit, no_fit = _bars(figure, "fits in Card 1"), _bars(figure, "does not fit in Card 1")
    marked = {round(x, 2) for x in fit.x} | {round(x, 2) for x in no_fit.x}
    assert len(fit.x) + len(no_fit.x) == len(big.results) and len(marked) == len(big.results)
    assert fit.marker.symbol == "circle" and no_fit.marker.symbol == "x"
    assert list(no_fit.x) == [0] and no_fit.y[0] * GIB > budget  # off: twice the others
    assert list(fit.x) == [1, pytest.approx(2 - 0.22)]  # over the device half of the offload slot
    assert all("simulated" in text for text in fit.hovertext + no_fit.hovertext)
    assert sum("<b>" in tick for tick in figure.layout.xaxis.ticktext) == 1  # the setting shown below


def test_a_budget_far_above_every_bar_is_named_not_drawn(table):
    figure = peak_figure(table, 80 * GIB, "H100 80 GB")
    assert not [trace for trace in figure.data if trace.type == "scatter" and trace.mode == "lines"]
    assert "far above" in figure.layout.title.subtitle.text
    assert _bars(figure, "fits in H100 80 GB")


def test_resident_after_the_forward_per_setting(table):
    figure = resident_figure(table)
    bars = _bars(figure, WORDS["resident"])
    assert list(bars.y) == pytest.approx([result.memory.after_forward_bytes / MIB for result in table.results])
    assert "simulated" in figure.layout.title.text and "simulated" in figure.layout.yaxis.title.text
    host = _bars(figure, WORDS["host"])
    assert host.marker.pattern.shape == "/" and len(host.x) == 1
    assert list(figure.layout.xaxis.ticktext) == ["off<br>0 CP", "n=1<br>6 CP", "n=1+offload<br>6 CP"]


def test_a_stopped_table_draws_what_it_has_and_words_can_be_replaced(table):
    partial = replace(table, results=table.results[:1], cancelled=True)
    figure = peak_figure(partial, 10 * MIB, words={"fits": "cabe em {budget}", "no_fit": "não cabe em {budget}"})
    assert len(figure.layout.xaxis.ticktext) == 1
    assert any(trace.name.startswith("não cabe") or trace.name.startswith("cabe") for trace in figure.data)
