"""The Learn pages' shared runs: one measurement per distinct run for the whole server, waits with an estimate."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import pytest

from ckptlab.lab import learnruns
from ckptlab.lab.learn import LESSON_PARTS, lesson_part
from ckptlab.lab.learnruns import LEARN_OWNER, SharedRuns, warm, workshop_ideas, workshop_specs
from ckptlab.lab.run import Pace, reference_spec
from ckptlab.lab.runqueue import DeviceBusyError
from ckptlab.spec import RunSpec

SPEC = RunSpec(model="tiny-llama", seq_len=64, every_n_layers=1, repeats=1, warmup=0, optimizer="none")
OTHER = RunSpec(model="tiny-llama", seq_len=64, every_n_layers=2, repeats=1, warmup=0, optimizer="none")


class Gated:
    """A stand-in for run_queued that waits for ``go`` and counts what it was asked."""

    def __init__(self, fail_first: bool = False) -> None:
        self.go, self.started = threading.Event(), threading.Event()
        self.asked: list[tuple[RunSpec, str]] = []
        self.fail_first = fail_first

    def __call__(self, spec, *, progress, on_wait, owner, **_):
        self.asked.append((spec, owner))
        self.started.set()
        progress("half", 0.5)
        assert self.go.wait(60), "the test never let the run go"
        if self.fail_first and len(self.asked) == 1:
            raise DeviceBusyError(key="queue.busy", seconds="1", ahead=0)
        run = SimpleNamespace(result=f"run {spec.every_n_layers}")
        reference = SimpleNamespace(result="off")
        return SimpleNamespace(result=run.result, run=run, reference=reference)


class HeldIdea:
    """A stand-in for a simulated idea held open by ``go``: counts how often it was started."""

    def __init__(self) -> None:
        self.go, self.started, self.calls = threading.Event(), threading.Event(), 0

    def __call__(self, progress=None, workers=None):
        self.calls += 1
        self.started.set()
        assert self.go.wait(60), "the test never let the simulation go"
        return f"idea {self.calls}"


@pytest.fixture(autouse=True)
def held_ideas(monkeypatch) -> dict[str, HeldIdea]:
    """The lesson's simulated ideas stubbed for every test here (a warm-up starts them once its runs are measured),
    with the server's jobs forgotten; let go at the end."""
    held = {name: HeldIdea() for name in learnruns.IDEAS}
    for name, idea in held.items():
        monkeypatch.setitem(learnruns.IDEAS, name, idea)
    monkeypatch.setattr(learnruns, "_ideas", {})
    yield held
    for idea in held.values():
        idea.go.set()


def test_two_sessions_asking_for_the_same_run_share_one_measurement():
    measure = Gated()
    runs = SharedRuns(measure=measure, pace=Pace())
    runs.ask([SPEC])
    assert measure.started.wait(60)
    runs.ask([SPEC])  # a second session while the first's run is measured: it waits for that one
    waiting = runs.state([SPEC])
    assert not waiting.done and not waiting.settled and waiting.results == {}
    assert 0 < waiting.fraction < 1 and waiting.left_s > 0 and not waiting.measured_pace
    measure.go.set()
    done = runs.wait([SPEC])
    runs.ask([SPEC])  # asked again once measured: nothing more to do
    assert done.done and done.results == {SPEC: "run 1", reference_spec(SPEC): "off"}
    assert runs.wait([SPEC]).done
    assert measure.asked == [(SPEC, LEARN_OWNER)] and runs.measurements == 1


def test_the_runs_of_one_page_wait_for_those_ahead_and_count_them_in_the_estimate():
    measure = Gated()
    runs = SharedRuns(measure=measure, pace=Pace())
    runs.ask([SPEC])
    assert measure.started.wait(60)
    runs.ask([OTHER, SPEC])
    alone, behind = runs.state([SPEC]), runs.state([OTHER])
    assert behind.left_s > alone.left_s > 0  # the page asking for OTHER waits for SPEC's run first
    measure.go.set()
    assert runs.wait([OTHER, SPEC]).done
    assert [spec for spec, _ in measure.asked] == [SPEC, OTHER]


def test_a_failed_run_stays_said_until_it_is_tried_again():
    measure = Gated(fail_first=True)
    runs = SharedRuns(measure=measure, pace=Pace())
    measure.go.set()
    runs.ask([SPEC])
    failed = runs.wait([SPEC])
    assert failed.settled and not failed.done and isinstance(failed.failures[SPEC], DeviceBusyError)
    runs.ask([SPEC])  # a page's rerun asks again: the failure stays said, nothing runs
    assert runs.state([SPEC]).failures and runs.measurements == 1
    runs.ask([SPEC], retry=True)  # Try again
    assert runs.wait([SPEC]).done and runs.measurements == 2


def test_the_estimate_is_scaled_by_the_runs_this_server_measured():
    pace = Pace()
    predicted, measured = pace.estimate(SPEC)
    assert not measured and predicted > 0
    pace.record(SPEC, predicted * 10)  # this machine took ten times the formula's prediction
    scaled, measured = pace.estimate(OTHER)
    assert measured and scaled == pytest.approx(10 * Pace().estimate(OTHER)[0])


def test_the_warm_up_holds_every_exercise_run():
    from ckptlab.lab.exercises import EXERCISES

    warm = set(workshop_specs())
    assert all(spec in warm for exercise in EXERCISES for spec in exercise.specs())


def test_the_warm_up_queues_the_workshops_runs_once():
    measure = Gated()
    measure.go.set()
    runs = SharedRuns(measure=measure, pace=Pace())
    warm(runs=runs)
    warm(runs=runs)  # every page opened asks again: nothing is queued twice
    assert runs.wait(workshop_specs()).done
    assert [spec for spec, _ in measure.asked] == workshop_specs()


def test_a_pages_runs_go_ahead_of_the_warm_ups():
    measure = Gated()
    runs = SharedRuns(measure=measure, pace=Pace())
    warm(runs=runs)
    assert measure.started.wait(60)  # the warm-up's first run holds the device
    first, *rest = workshop_specs()
    page = replace(OTHER, seq_len=256)  # a run only a page asks for
    runs.ask([page, rest[-1]])  # the page's own run, and one the warm-up queued last
    measure.go.set()
    assert runs.wait([*workshop_specs(), page]).done
    assert [spec for spec, _ in measure.asked] == [first, page, rest[-1], *rest[:-1]]


def test_every_part_of_the_lesson_is_in_the_warm_up():
    """Issue 58: with CKPTLAB_WARM_LEARN=1 the attention, offload, limits, 4-bit and sharding parts still waited (their
    runs were not in the warm-up's list, the simulations not warmed). The list is the parts' own."""
    warm, ideas = set(workshop_specs()), set(workshop_ideas())
    for part in LESSON_PARTS:
        assert part.runs or part.idea, part.name
        assert all(spec in warm for spec in part.asks()), part.name
        assert part.idea is None or part.idea in ideas, part.name
    eager = [spec for spec in lesson_part("attention").asks() if spec.attn_implementation == "eager"]
    assert len(eager) == 2 and all(spec in warm for spec in eager)  # the ones today's list missed


def test_the_warm_up_simulates_the_ideas_after_its_runs_and_a_page_joins_the_one_in_flight(held_ideas):
    held = held_ideas
    measure = Gated()
    runs = SharedRuns(measure=measure, pace=Pace())
    warm(runs=runs)
    warm(runs=runs)  # every page opened asks again: the ideas are still started once
    assert measure.started.wait(60)
    assert not any(idea.started.is_set() for idea in held.values())  # not beside the timed runs
    measure.go.set()
    assert runs.wait(workshop_specs()).done
    for idea in held.values():
        assert idea.started.wait(60)  # started by the measuring thread once its line emptied
    first, second = learnruns.qlora_job(), learnruns.qlora_job()  # two sessions open the 4-bit part meanwhile
    assert first is second
    for idea in held.values():
        idea.go.set()
    first.join(60)
    assert first.outcome()[2] == "idea 1" and [idea.calls for idea in held.values()] == [1] * len(held)  # each once


def test_a_pages_runs_are_simulated_for_their_estimate_when_asked_never_in_the_state_under_the_lock(monkeypatch):
    """The estimate's simulations (seconds each) are made when a page asks, outside the store's lock; the state a
    page polls under the lock only reads the kept ones (a warm-up's runs are not simulated for it)."""
    from ckptlab.lab import run as labrun

    calls: list[tuple[list[RunSpec], bool]] = []
    stubbed = labrun.counted_works

    def counted(specs, simulate_missing=True, workers=None):
        calls.append((list(specs), simulate_missing))
        return stubbed(specs, simulate_missing, workers)

    monkeypatch.setattr(labrun, "counted_works", counted)
    measure = Gated()
    runs = SharedRuns(measure=measure, pace=Pace())
    runs.ask([OTHER], warming=True)
    assert calls == []  # the warm-up's runs: no simulation asked
    runs.ask([SPEC])
    assert calls and all(simulate for _, simulate in calls)  # the page's run, its parts simulated now
    asked = len(calls)
    assert measure.started.wait(60)
    runs.state([SPEC])
    assert len(calls) > asked and not any(simulate for _, simulate in calls[asked:])
    measure.go.set()
    runs.wait([SPEC, OTHER])
