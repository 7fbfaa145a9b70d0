"""Figure contents, tested on the figures themselves (the page only places them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ckptlab
from ckptlab.lab.run import run_queued
from ckptlab.show import figures

SPEC = ckptlab.RunSpec(model="tiny-llama", seq_len=128, repeats=1, warmup=1, every_n_layers=2)


@pytest.fixture(scope="module")
def lab():
    return run_queued(SPEC)  # the process-wide cache: shared with the other tests


def _boxes(figure) -> dict[str, list[str]]:
    """Legend name -> the words written in its boxes."""
    return {trace.name: list(trace.text) for trace in figure.data}


def test_diagram_has_a_forward_and_a_backward_row_in_layer_order(lab):
    figure = figures.diagram_figure(lab.result)
    assert list(figure.layout.yaxis.ticktext) == ["Forward →", "← Backward"]
    boxes = _boxes(figure)
    assert set(boxes) == {figures.LEGEND["CP"], figures.LEGEND["keep"], figures.LEGEND["rerun"]}
    assert boxes[figures.LEGEND["CP"]] == ["L1<br><b>CP</b>", "L3<br><b>CP</b>", "L5<br><b>CP</b>"]
    assert boxes[figures.LEGEND["rerun"]] == ["L1<br><b>rerun</b>", "L3<br><b>rerun</b>", "L5<br><b>rerun</b>"]
    keep = next(trace for trace in figure.data if trace.name == figures.LEGEND["keep"])
    assert list(keep.x) == [1, 3, 5, 1, 3, 5]  # L2, L4, L6 in both rows
    forward_base, backward_base = sorted(set(keep.base), reverse=True)
    assert list(keep.base) == [forward_base] * 3 + [backward_base] * 3


def test_colours_and_legend_entries(lab):
    figure = figures.diagram_figure(lab.result)
    for trace in figure.data:
        role = next(role for role, name in figures.LEGEND.items() if name == trace.name)
        assert trace.marker.color == figures.COLORS[role]
        assert trace.marker.pattern.shape == ""  # observed rows are solid
    assert len(set(figures.COLORS.values())) == 3
    assert lab.result.provenance.label in figure.layout.title.subtitle.text


def test_hover_shows_what_was_measured_for_each_layer(lab):
    figure = figures.diagram_figure(lab.result)
    hovers = {text.split("</b>")[0].removeprefix("<b>"): text for trace in figure.data for text in trace.hovertext}
    for layer in lab.result.layers:
        text = hovers[layer.name]
        assert f"forward calls: {layer.forward_calls}" in text
        assert f"reruns observed: {layer.recompute_calls}" in text
        assert f"{layer.saved_bytes:,} bytes" in text


def test_a_mismatch_adds_the_planned_rows(lab):
    layers = list(lab.result.layers)
    # L2 was planned "keep" but, say, a model class override checkpointed it anyway.
    layers[1] = replace(layers[1], enabled="CP", recompute_calls=1)
    mismatched = replace(lab.result, layers=layers)
    assert not mismatched.plan_matches
    figure = figures.diagram_figure(mismatched)
    assert list(figure.layout.yaxis.ticktext) == ["Forward →", "← Backward", "Planned forward", "Planned backward"]
    assert "DIFFERS" in figure.layout.title.text
    planned = [trace for trace in figure.data if trace.name.endswith("(planned)")]
    assert planned and all(trace.marker.pattern.shape == figures.PLANNED_PATTERN for trace in planned)
    observed_cp = next(trace for trace in figure.data if trace.name == figures.LEGEND["CP"])
    assert "L2<br><b>CP</b>" in observed_cp.text
    planned_keep = next(trace for trace in figure.data if trace.name == figures.LEGEND["keep"] + " (planned)")
    assert "L2<br><b>keep</b>" in planned_keep.text


def test_matching_runs_have_no_planned_rows(lab):
    figure = figures.diagram_figure(lab.result)
    assert not any("planned" in trace.name for trace in figure.data)


def test_long_models_wrap_into_lines_of_twelve():
    figure = figures.plan_figure(36, 4)
    assert len(figure.layout.yaxis.ticktext) == 6  # 3 lines x (forward, backward)
    assert figure.layout.yaxis.ticktext[2] == "Forward →<br>L13–L24"
    cp = next(trace for trace in figure.data if trace.name.startswith(figures.LEGEND["CP"]))
    assert len(cp.text) == 9  # L1, L5, ..., L33
    assert max(max(trace.x) for trace in figure.data) == 11


def test_plan_figure_is_hatched_and_says_nothing_was_measured():
    figure = figures.plan_figure(6, None)
    assert [trace.name for trace in figure.data] == [figures.LEGEND["keep"] + " (planned)"]
    assert "nothing measured" in figure.layout.title.subtitle.text


def test_a_run_that_did_not_fit_draws_its_plan(lab):
    failed = replace(lab.result, status="does_not_fit", layers=[], memory=None, timing=None, message="no room")
    figure = figures.diagram_figure(failed)
    assert "did not fit" in figure.layout.title.text
    assert sum(len(trace.x) for trace in figure.data) == 12


def test_comparison_chart_puts_the_run_next_to_checkpointing_off(lab):
    figure = figures.comparison_figure(lab.result, lab.reference.result)
    names = [trace.name for trace in figure.data]
    assert names == ["every_n_layers=2", "every_n_layers=2", "checkpointing off", "checkpointing off"]
    memory_run, time_run, memory_off, _ = figure.data
    assert memory_run.y[0] == pytest.approx(lab.result.memory.after_forward_bytes / 2**20)
    assert memory_off.y[0] == pytest.approx(lab.reference.result.memory.after_forward_bytes / 2**20)
    assert time_run.y[2] == pytest.approx(lab.result.timing.step_s * 1000)
    assert memory_run.marker.color == figures.RUN_COLOR and memory_off.marker.color == figures.OFF_COLOR


def test_comparison_chart_of_a_run_without_measurements_is_refused(lab):
    failed = replace(lab.result, status="does_not_fit", memory=None, timing=None)
    with pytest.raises(ValueError, match="does_not_fit"):
        figures.comparison_figure(failed, lab.reference.result)


def test_checkpointing_off_charts_one_series(lab):
    figure = figures.comparison_figure(lab.reference.result, lab.reference.result)
    assert {trace.name for trace in figure.data} == {"checkpointing off"}


def test_the_core_figures_do_not_import_streamlit():
    import ast
    import importlib
    import inspect

    for name in ("show.figures", "lab.run", "lab.runqueue", "show.export", "model.snippets", "lab.query"):
        module = importlib.import_module(f"ckptlab.{name}")
        tree = ast.parse(inspect.getsource(module))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not any(name.startswith("streamlit") for name in imported), module.__name__


def test_a_simulated_step_is_titled_simulated():
    from ckptlab import RunSpec, simulate
    from ckptlab.show.figures import diagram_figure

    figure = diagram_figure(simulate(RunSpec(model="tiny-llama", seq_len=64, every_n_layers=2)))
    assert "(simulated)" in figure.layout.title.text and "observed" not in figure.layout.title.text


def test_the_diagram_shows_moe_reruns_recomputing_router_and_experts():
    """Simulated tiny-qwen3-moe, n=2: the rerun boxes (L1, L3) say router + experts, the keep ones do not."""
    from ckptlab import RunSpec, simulate
    from ckptlab.show.figures import diagram_figure

    result = simulate(RunSpec(model="tiny-qwen3-moe", seq_len=32, every_n_layers=2, optimizer="none"))
    figure = diagram_figure(result)
    texts = [text for trace in figure.data for text in trace.text]
    with_experts = sorted(text.split("<br>")[0] for text in texts if "router + experts" in text)
    assert with_experts == ["L1", "L3"]
    assert "router and experts" in figure.layout.title.subtitle.text
    assert all("MoE reruns observed" in hover for trace in figure.data for hover in trace.hovertext)
