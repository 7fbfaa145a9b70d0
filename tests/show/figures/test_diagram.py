"""The CP / keep / rerun diagram, tested on the figures themselves (the page only places them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ckptlab
from ckptlab.lab.run import run_queued
from ckptlab.show.figures._style import PAGE_PX, column_px
from ckptlab.show.figures.diagram import (
    BOX_PAD_PX,
    BOX_SHARE,
    TEXT_SIZES,
    WIDEST_ROLE_EM,
    diagram_figure,
    focus_of,
    plan_figure,
    roles_diagram_figure,
)
from ckptlab.show.i18n import number, t
from ckptlab.step.probe import region_for

SPEC = ckptlab.RunSpec(model="tiny-llama", seq_len=128, repeats=1, warmup=1, every_n_layers=2)
LEGEND = {role: t(f"diagram.legend_{role}", "en") for role in ("CP", "keep", "rerun")}


@pytest.fixture(scope="module")
def lab():
    return run_queued(SPEC)  # the process-wide cache: shared with the other tests


def _boxes(figure) -> dict[str, list[str]]:
    """Legend name -> the words written in its boxes."""
    return {trace.name: list(trace.text) for trace in figure.data}


def _hatched(trace) -> bool:
    return bool(trace.marker.pattern.shape)


def test_diagram_has_a_forward_and_a_backward_row_in_layer_order(lab):
    figure = diagram_figure(lab.result)
    assert list(figure.layout.yaxis.ticktext) == ["Forward →", "← Backward"]
    boxes = _boxes(figure)
    assert set(boxes) == {LEGEND["CP"], LEGEND["keep"], LEGEND["rerun"]}
    assert boxes[LEGEND["CP"]] == ["L1<br><b>CP</b>", "L3<br><b>CP</b>", "L5<br><b>CP</b>"]
    assert boxes[LEGEND["rerun"]] == ["L1<br><b>rerun</b>", "L3<br><b>rerun</b>", "L5<br><b>rerun</b>"]
    keep = next(trace for trace in figure.data if trace.name == LEGEND["keep"])
    assert list(keep.x) == [1, 3, 5, 1, 3, 5]  # L2, L4, L6 in both rows
    forward_base, backward_base = sorted(set(keep.base), reverse=True)
    assert list(keep.base) == [forward_base] * 3 + [backward_base] * 3


def test_each_role_has_its_own_colour_the_same_on_every_diagram_and_observed_rows_are_solid(lab):
    figure = diagram_figure(lab.result)
    colours = {trace.name: trace.marker.color for trace in figure.data}
    assert len(set(colours.values())) == 3
    assert not any(_hatched(trace) for trace in figure.data)  # observed rows are solid
    roles = [layer.enabled for layer in lab.result.layers]
    teaching = roles_diagram_figure(roles, reruns=[layer.recompute_calls for layer in lab.result.layers])
    assert {trace.name: trace.marker.color for trace in teaching.data} == colours
    planned = {trace.name.removesuffix(" (planned)"): trace.marker.color for trace in plan_figure(6, 2).data}
    assert planned == colours
    assert lab.result.provenance.label in figure.layout.title.subtitle.text.replace("<br>", " ")


def test_the_lesson_diagram_draws_the_same_boxes_as_the_run_diagram(lab):
    """One drawing for both: the roles the lesson passes give the boxes the lab shows for that run."""
    layers = lab.result.layers
    teaching = roles_diagram_figure(
        [layer.enabled for layer in layers], reruns=[layer.recompute_calls for layer in layers]
    )
    assert _boxes(teaching) == _boxes(diagram_figure(lab.result))
    assert teaching.layout.title.text is None  # untitled: it sits beside other figures


def test_hover_shows_what_was_measured_for_each_layer(lab):
    figure = diagram_figure(lab.result)
    hovers = {text.split("</b>")[0].removeprefix("<b>"): text for trace in figure.data for text in trace.hovertext}
    for layer in lab.result.layers:
        text = hovers[layer.name]
        assert f"forward calls: {layer.forward_calls}" in text
        assert f"reruns observed: {layer.recompute_calls}" in text
        assert f"{layer.saved_bytes:,} bytes" in text


def test_a_mismatch_adds_the_planned_rows_hatched(lab):
    layers = list(lab.result.layers)
    # L2 was planned "keep" but, say, a model class override checkpointed it anyway.
    layers[1] = replace(layers[1], enabled="CP", recompute_calls=1)
    mismatched = replace(lab.result, layers=layers)
    assert not mismatched.plan_matches
    figure = diagram_figure(mismatched, width=PAGE_PX)  # one line of six (a 3/5 column wraps them: longer labels)
    assert list(figure.layout.yaxis.ticktext) == ["Forward →", "← Backward", "Planned forward", "Planned backward"]
    assert "DIFFERS" in figure.layout.title.text.replace("<br>", " ")
    planned = [trace for trace in figure.data if trace.name.endswith("(planned)")]
    observed = [trace for trace in figure.data if not trace.name.endswith("(planned)")]
    assert planned and all(_hatched(trace) for trace in planned)  # planned rows never pass for observed ones
    assert observed and not any(_hatched(trace) for trace in observed)
    observed_cp = next(trace for trace in figure.data if trace.name == LEGEND["CP"])
    assert "L2<br><b>CP</b>" in observed_cp.text
    planned_keep = next(trace for trace in figure.data if trace.name == LEGEND["keep"] + " (planned)")
    assert "L2<br><b>keep</b>" in planned_keep.text


def test_matching_runs_have_no_planned_rows(lab):
    figure = diagram_figure(lab.result)
    assert not any("planned" in trace.name for trace in figure.data)


def test_long_models_wrap_into_lines_of_twelve():
    figure = plan_figure(36, 4, width=PAGE_PX)  # the page's width: twelve boxes a line hold "rerun"
    assert len(figure.layout.yaxis.ticktext) == 6  # 3 lines x (forward, backward)
    assert figure.layout.yaxis.ticktext[2] == "Forward →<br>L13–L24"
    cp = next(trace for trace in figure.data if trace.name.startswith(LEGEND["CP"]))
    assert len(cp.text) == 9  # L1, L5, ..., L33
    assert max(max(trace.x) for trace in figure.data) == 11


@pytest.mark.parametrize("layers", [12, 28, 36])
def test_a_deep_model_in_the_labs_column_wraps_so_every_box_holds_its_role(layers):
    """gpt2-small's 12 layers in the Lab's 3/5 column at 1280x720 were 12 boxes of 26 px, and "rerun" (2.56 em of
    bold Arial, 41 px at the smallest size the boxes may shrink to) was cut by its neighbours ("erun", issue 58): the
    lines come from the figure's width, as many layers in each, and a box holds "rerun" at that size."""
    width = column_px(0.6)
    figure = plan_figure(layers, 1, width=width)
    per_line = max(max(trace.x) for trace in figure.data) + 1
    lines = len(figure.layout.yaxis.ticktext) // 2
    assert per_line * lines - layers < lines  # balanced: 12 as 6 + 6, not 10 + 2
    plot_px = width - figure.layout.margin.l - figure.layout.margin.r
    least = TEXT_SIZES["titled"][1]
    assert figure.layout.uniformtext.minsize == least  # plotly shrinks a box's words no further than that
    assert plot_px / per_line * BOX_SHARE >= WIDEST_ROLE_EM * least + BOX_PAD_PX
    # The page's width holds more a line: the plan above the Lab's settings is drawn across the page.
    assert max(max(trace.x) for trace in plan_figure(layers, 1, width=PAGE_PX).data) + 1 > per_line


def test_plan_figure_is_hatched_and_says_nothing_was_measured():
    figure = plan_figure(6, None)
    assert [trace.name for trace in figure.data] == [LEGEND["keep"] + " (planned)"]
    assert all(_hatched(trace) for trace in figure.data)
    assert "nothing measured" in figure.layout.title.subtitle.text.replace("<br>", " ")


def test_a_run_that_did_not_fit_draws_its_plan(lab):
    failed = replace(lab.result, status="does_not_fit", layers=[], memory=None, timing=None)
    figure = diagram_figure(failed)
    assert "did not fit" in figure.layout.title.text.replace("<br>", " ")
    assert sum(len(trace.x) for trace in figure.data) == 12


def test_diagram_outlines_the_layer_at_work(measured):
    from ckptlab.show import i18n

    run = measured(every_n_layers=2)
    figure = roles_diagram_figure(
        [layer.enabled for layer in run.layers],
        lang="ja",
        focus=(2, "backward"),
        reruns=[layer.recompute_calls for layer in run.layers],
    )
    assert {trace.name for trace in figure.data} == {
        i18n.t(f"diagram.legend_{r}", "ja") for r in ("CP", "keep", "rerun")
    }
    rerun = next(trace for trace in figure.data if trace.name == i18n.t("diagram.legend_rerun", "ja"))
    widths = [width for trace in figure.data for width in trace.marker.line.width]
    # L3's rerun box, and no other (not its forward box), has the widest outline; the others fade.
    assert dict(zip(rerun.x, rerun.marker.line.width))[2] == max(widths) and widths.count(max(widths)) == 1
    opacity = [value for trace in figure.data for value in trace.marker.opacity]
    assert opacity.count(max(opacity)) == 1 and dict(zip(rerun.x, rerun.marker.opacity))[2] == max(opacity)


def test_the_focus_follows_the_timeline():
    assert focus_of(region_for("embeddings")) is None
    assert focus_of(region_for("rerun", 2)) == (2, "backward")
    assert focus_of(region_for("layer_forward", 0)) == (0, "forward")


def test_a_simulated_step_is_titled_simulated():
    from ckptlab import RunSpec, simulate

    figure = diagram_figure(simulate(RunSpec(model="tiny-llama", seq_len=64, every_n_layers=2)))
    assert "(simulated)" in figure.layout.title.text.replace(
        "<br>", " "
    ) and "observed" not in figure.layout.title.text.replace("<br>", " ")


def test_the_diagram_shows_moe_reruns_recomputing_router_and_experts():
    """Simulated tiny-qwen3-moe, n=2: the rerun boxes (L1, L3) say router + experts, the keep ones do not."""
    from ckptlab import RunSpec, simulate

    result = simulate(RunSpec(model="tiny-qwen3-moe", seq_len=32, every_n_layers=2, optimizer="none"))
    figure = diagram_figure(result)
    texts = [text for trace in figure.data for text in trace.text]
    with_experts = sorted(text.split("<br>")[0] for text in texts if "router + experts" in text)
    assert with_experts == ["L1", "L3"]
    assert "router and experts" in figure.layout.title.subtitle.text.replace("<br>", " ")
    assert all("MoE reruns observed" in hover for trace in figure.data for hover in trace.hovertext)


def test_the_core_figures_do_not_import_streamlit():
    import ast
    import importlib
    import inspect

    pictures = ("diagram", "run", "timeline", "tradeoff", "prediction", "breakdown", "scale", "_style")
    others = ("show.labels", "lab.run", "lab.runqueue", "show.export", "model.snippets", "lab.query")
    for name in (*(f"show.figures.{picture}" for picture in pictures), *others):
        module = importlib.import_module(f"ckptlab.{name}")
        tree = ast.parse(inspect.getsource(module))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not any(name.startswith("streamlit") for name in imported), module.__name__


def test_a_selective_run_says_what_the_cp_layers_kept_in_its_subtitle_and_its_boxes_fit():
    """A box is a layer's width (40 px for six layers in the Lab's column at 1280x720): "kept 780.0 KiB" and
    "reran the rest" spilled into the next boxes (issue 43), and the subtitle's policy, on the provenance's line,
    ran past the figure's edge ("selective=attention: e"). The boxes say name and role; the subtitle the rest."""
    lab = run_queued(replace(SPEC, selective="attention"))
    figure = diagram_figure(lab.result, lang="pt-BR")
    boxes = _boxes(figure)
    cp = [layer for layer in lab.result.layers if layer.enabled == "CP"]
    assert cp and all(layer.kept_bytes > 0 for layer in cp)
    legend = {role: t(f"diagram.legend_{role}", "pt-BR") for role in ("CP", "rerun")}
    assert boxes[legend["CP"]] == [f"{layer.name}<br><b>CP</b>" for layer in cp]
    assert boxes[legend["rerun"]] == [f"{layer.name}<br><b>rerun</b>" for layer in cp]
    subtitle = figure.layout.title.subtitle.text
    _, *policy = subtitle.split("<br>selective=")  # the policy starts a line of its own
    least = min(layer.kept_bytes for layer in cp)
    kept = (
        f"{number(least / 2**20, ',.1f', 'pt-BR')} MiB"
        if least >= 2**20
        else f"{number(least / 1024, ',.1f', 'pt-BR')} KiB"
    )
    assert policy and kept in policy[0]  # in the reader's numbers
    assert all(len(line) <= 49 for line in subtitle.split("<br>"))  # heading()'s wrap for a size-20 title
    hover = next(text for trace in figure.data for text in trace.hovertext if text.startswith(f"<b>{cp[0].name}<"))
    assert f"{cp[0].kept_bytes:,}".replace(",", ".") in hover
    # Plain checkpointing's subtitle says no policy.
    assert "selective=" not in diagram_figure(run_queued(SPEC).result).layout.title.subtitle.text
