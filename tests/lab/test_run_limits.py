"""A run in the app can be stopped: by its participant (Cancel), by the server's time limit; either gives everything back."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace

import pytest

from ckptlab.errors import RunStoppedError
from ckptlab.lab.run import ModelKey, ResultCache, build_for_key, run_queued
from ckptlab.lab.runqueue import DeviceQueue, SupersededError
from ckptlab.spec import RunSpec

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SPEC = RunSpec(model="tiny-llama", seq_len=32, every_n_layers=1, repeats=2, warmup=1, optimizer="adamw")


@pytest.fixture(scope="module")
def shared_model():
    """One built model, as the app's cache holds it."""
    built: dict[ModelKey, object] = {}

    def load(key: ModelKey):
        if key not in built:
            built[key] = build_for_key(key)
        return built[key]

    return load


def test_a_run_past_the_time_limit_stops_and_gives_the_device_and_model_back(shared_model):
    queue, cache = DeviceQueue(), ResultCache()
    with pytest.raises(RunStoppedError) as stopped:
        run_queued(SPEC, load=shared_model, queue=queue, cache=cache, limit_s=1e-9)
    assert stopped.value.key == "run.time_limit" and "1e-09 s" in str(stopped.value)
    assert queue.busy() == (False, 0) and cache.get(SPEC) is None  # nothing half-measured is kept
    model, _ = shared_model(("tiny-llama", "float32", "cpu", 0))
    assert all(param.grad is None for param in model.parameters())
    assert not any(module._forward_pre_hooks for module in model.modules())  # the stop checks are gone
    lab = run_queued(SPEC, load=shared_model, queue=queue, cache=cache, limit_s=600)  # the next run is whole
    assert lab.result.status == "ok" and lab.result.plan_matches


@pytest.mark.parametrize("asks_before_stop", [1, 7, 20])
def test_a_cancel_stops_the_run_where_it_is_asked(shared_model, asks_before_stop):
    """Stopped at the first step, inside a later layer's forward or rerun: the same clean outcome."""
    asked = itertools.count(1)
    queue = DeviceQueue()
    with pytest.raises(RunStoppedError) as stopped:
        run_queued(
            SPEC,
            load=shared_model,
            queue=queue,
            cache=ResultCache(),
            should_stop=lambda: next(asked) > asks_before_stop,
        )
    assert stopped.value.key == "run.cancelled"
    assert next(asked) > asks_before_stop + 1  # it was asked, and stopped at the first True
    assert queue.busy() == (False, 0)


def test_a_cancel_while_waiting_gives_the_place_back():
    queue = DeviceQueue(poll_s=0.01)
    holding, release, cancel = threading.Event(), threading.Event(), threading.Event()

    def other_session() -> None:
        with queue.turn(label="another session"):
            holding.set()
            release.wait(30)

    other = threading.Thread(target=other_session)
    other.start()
    holding.wait(30)
    outcome: list[BaseException] = []

    def waiting_participant() -> None:
        try:
            run_queued(SPEC, queue=queue, cache=ResultCache(), should_stop=cancel.is_set, owner="me")
        except RunStoppedError as error:
            outcome.append(error)

    waiting = threading.Thread(target=waiting_participant)
    waiting.start()
    while queue.busy() != (True, 1):  # the participant is in line (the queue's own state, not a timer)
        holding.wait(0.01)
    cancel.set()
    waiting.join(30)
    assert [error.key for error in outcome] == ["run.cancelled_waiting"]  # type: ignore[attr-defined]
    assert queue.busy() == (True, 0)  # the other session still holds the device; the line is empty
    release.set()
    other.join(30)


def test_one_session_never_has_two_runs_in_line():
    """A session's newer Run replaces its waiting one (the orphan of a Streamlit rerun) and waits at the back."""
    queue = DeviceQueue(poll_s=0.01)
    release = threading.Event()
    outcomes: list[str] = []

    def session_run(label: str) -> None:
        try:
            run_queued(replace(SPEC, seq_len=24 + len(outcomes)), queue=queue, cache=ResultCache(), owner="session-1")
            outcomes.append(f"{label} ran")
        except SupersededError:
            outcomes.append(f"{label} replaced")

    def holder() -> None:
        with queue.turn(owner="another session"):
            release.wait(60)

    other = threading.Thread(target=holder)
    other.start()
    while queue.busy() != (True, 0):
        release.wait(0.01)
    older = threading.Thread(target=session_run, args=("older",))
    older.start()
    while queue.busy() != (True, 1):
        release.wait(0.01)
    newer = threading.Thread(target=session_run, args=("newer",))
    newer.start()
    older.join()
    assert outcomes == ["older replaced"] and queue.busy() == (True, 1)  # one place in line, the newer one's
    release.set()
    for thread in (other, newer):
        thread.join()
    assert outcomes == ["older replaced", "newer ran"]
