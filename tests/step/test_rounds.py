"""Interleaved timing: the order of the timed steps, and their seconds, observed through an injected clock."""

from __future__ import annotations

import itertools

import pytest

from ckptlab import RunSpec, load_model
from ckptlab.errors import SpecError
from ckptlab.step.rounds import step_order, time_settings

SPEC = RunSpec(model="tiny-gpt2", seq_len=32, every_n_layers=1, repeats=3, warmup=0, optimizer="none")


class FakeClock:
    """Marks are numbers, each step's phases last 1 s, 2 s and 0 s: no wall clock involved."""

    method = "fake clock"

    def __init__(self):
        self.ticks = itertools.count()

    def mark(self):
        return next(self.ticks)

    def seconds(self, start, end):
        return float(end - start)


def test_step_order_interleaved_and_blocks():
    assert step_order(3, 2, "interleaved") == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert step_order(3, 2, "blocks") == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    with pytest.raises(SpecError, match="'sideways'"):
        step_order(3, 2, "sideways")


@pytest.fixture(scope="module")
def built():
    return load_model(SPEC)


@pytest.mark.parametrize("order", ["interleaved", "blocks"])
def test_settings_are_timed_in_the_order_asked_with_the_injected_clock(built, order):
    model, info = built
    specs = [RunSpec(**{**SPEC.__dict__, "every_n_layers": n}) for n in (None, 1, 2)]
    seen = []
    timed = time_settings(
        specs, model, info, order=order, clock=FakeClock(), on_step=lambda round_, index: seen.append(index)
    )
    expected = [0, 1, 2] * 3 if order == "interleaved" else [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert seen == expected
    assert timed.rounds_done == 3 and timed.notes == [[], [], []]  # every timed step reran exactly the plan
    for timing in timed.timings:
        assert timing.method == "fake clock"
        assert timing.step_samples == [2.0, 2.0, 2.0]  # forward 1 mark, backward 1 mark, no optimizer
    assert all(not getattr(layer, "gradient_checkpointing", False) for layer in model.modules())  # given back


def test_a_stop_keeps_the_steps_timed_so_far(built):
    model, info = built
    specs = [RunSpec(**{**SPEC.__dict__, "every_n_layers": n}) for n in (None, 1)]
    steps = []
    timed = time_settings(
        specs, model, info, clock=FakeClock(), on_step=lambda r, i: steps.append(i), stopped=lambda: len(steps) >= 3
    )
    assert steps == [0, 1, 0] and timed.rounds_done == 1
    assert [len(t.step_samples) for t in timed.timings] == [2, 1]


def test_settings_that_differ_in_more_than_checkpointing_are_refused(built):
    model, info = built
    with pytest.raises(SpecError, match="differ only in every_n_layers"):
        time_settings([SPEC, RunSpec(**{**SPEC.__dict__, "seq_len": 64})], model, info)
