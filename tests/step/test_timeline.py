"""The recorded timeline of a real step: valid order, the run's peak, and what each layer holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab.step import timeline as tl


def _roles(result) -> list[str]:
    return [layer.planned for layer in result.layers]


@pytest.mark.parametrize("every_n", [None, 1, 2, 4])
def test_events_come_in_a_valid_order_and_the_peak_is_the_runs(measured, every_n):
    result = measured(every_n_layers=every_n)
    points = result.memory.timeline
    assert tl.check_order(points, _roles(result)) == []
    phases = [point.phase for point in points]
    last_forward = max(i for i, phase in enumerate(phases) if phase == "forward")
    first_backward = phases.index("backward")
    assert last_forward < phases.index("loss") < first_backward  # forward, loss, then backward
    reruns = [point for point in points if point.kind == "rerun"]
    assert all(point.phase == "backward" and point.order > first_backward for point in reruns)
    assert sorted(point.layer for point in reruns) == [i for i, role in enumerate(_roles(result)) if role == "CP"]
    assert tl.peak_bytes(points) == result.memory.peak_bytes
    assert points[tl.peak_index(points)].event == result.memory.peak_where.description


def test_the_checks_catch_a_rerun_of_a_keep_layer_and_a_backward_before_the_loss(measured):
    result = measured(every_n_layers=2)
    points = list(result.memory.timeline)
    roles = _roles(result)
    assert tl.check_order(points, ["keep"] * len(roles))  # reruns where the roles say keep
    swapped = list(points)
    loss = next(i for i, p in enumerate(swapped) if p.kind == "loss")
    swapped[loss], swapped[loss + 1] = swapped[loss + 1], swapped[loss]
    swapped = [replace(point, order=order) for order, point in enumerate(swapped)]
    assert any("phase" in problem for problem in tl.check_order(swapped, roles))
    missing = [p for p in points if p.kind != "rerun" or p.layer != 0]
    missing = [replace(point, order=order) for order, point in enumerate(missing)]
    assert any("L1 reran 0 times" in problem for problem in tl.check_order(missing, roles))


def test_positions_put_a_layer_at_the_same_place_for_every_setting(measured):
    off, two = measured(every_n_layers=None), measured(every_n_layers=2)
    layers = off.model.num_layers
    place = {(p.kind, p.layer): x for p, x in zip(off.memory.timeline, tl.positions(off.memory.timeline, layers))}
    for point, x in zip(two.memory.timeline, tl.positions(two.memory.timeline, layers)):
        if (point.kind, point.layer) in place:
            assert place[(point.kind, point.layer)] == x
    assert tl.positions(two.memory.timeline, layers) == sorted(tl.positions(two.memory.timeline, layers))
    spans = tl.phase_spans(two.memory.timeline, layers)
    assert [span.layer for span in spans if span.band == "rerun"] == [4, 2, 0]
    assert spans[0].band == "forward" and spans[-1].band == "backward" and spans[-1].end == tl.end_position(layers)


def test_layer_states_follow_the_step(measured):
    result = measured(every_n_layers=2)
    points, roles = result.memory.timeline, _roles(result)
    kinds = [(p.kind, p.layer) for p in points]
    assert set(tl.layer_states(points, roles, 0)) == {"pending"}
    at_loss = tl.layer_states(points, roles, kinds.index(("loss", None)))
    assert at_loss == ["input_only", "held"] * 3  # CP layers kept their input, keep layers their activations
    rerun_l3 = tl.layer_states(points, roles, kinds.index(("rerun", 2)))
    assert rerun_l3 == ["input_only", "held", "recomputing", "freed", "freed", "freed"]
    backward_l4 = tl.layer_states(points, roles, kinds.index(("layer_backward", 3)))
    assert backward_l4[3] == "backward" and backward_l4[4:] == ["freed", "freed"]
    assert set(tl.layer_states(points, roles, len(points) - 1)) == {"freed"}
    held = tl.layer_bytes(at_loss, result.layers, points[kinds.index(("loss", None))])
    assert held == [
        layer.input_bytes if role == "CP" else layer.saved_bytes for layer, role in zip(result.layers, roles)
    ]
    with pytest.raises(IndexError):
        tl.layer_states(points, roles, len(points))


def test_every_rerun_raises_memory_above_its_start(measured):
    result = measured(every_n_layers=1)
    bumps = tl.rerun_bumps(result.memory.timeline)
    assert sorted(bumps) == list(range(result.model.num_layers))
    assert all(rise > 0 for rise in bumps.values())


def test_micro_batches_and_the_gradient_norm_follow_each_other_on_the_axis():
    """With accumulation each micro-batch takes the span of one step again; the norm and the optimizer follow."""
    from ckptlab import RunSpec, measure
    from ckptlab.show.figures.timeline import timeline_figure

    result = measure(RunSpec(model="tiny-llama", seq_len=32, gradient_accumulation_steps=2, repeats=1, warmup=1))
    points = result.memory.timeline
    places = tl.positions(points)
    assert places == sorted(places) and len(set(places)) == len(places)
    assert tl.micro_batches(points) == 2 and places[-1] < tl.end_position(6, 2)
    kinds = [point.kind for point in points]
    assert places[kinds.index("grad_norm")] < places[kinds.index("optimizer")]
    roles = [layer.planned for layer in result.layers]
    assert tl.layer_states(points, roles, kinds.index("micro_batch")) == ["pending"] * 6
    assert timeline_figure(result).data
