"""The device queue and run_queued: one run at a time across threads, FIFO, nothing left locked."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from dataclasses import replace

import pytest
from streamlit.runtime.scriptrunner_utils.exceptions import StopException

import ckptlab
from ckptlab.fact import Fact
from ckptlab.lab.run import ResultCache, build_for_key, reference_spec, run_queued
from ckptlab.lab.runqueue import DeviceBusyError, DeviceQueue

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SPEC = ckptlab.RunSpec(model="tiny-llama", seq_len=128, repeats=1, warmup=1)


def _wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def _assert_no_overlap(intervals: list[tuple[float, float]]) -> None:
    ordered = sorted(intervals)
    for (_, end), (start, _) in itertools.pairwise(ordered):
        assert end <= start, f"two turns overlap: {ordered}"


class _Loader:
    """Builds each model once and shares it, like the app's st.cache_resource."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict = {}

    def __call__(self, key):
        with self._lock:
            if key not in self._models:
                self._models[key] = build_for_key(key)
            return self._models[key]


# -- DeviceQueue ----------------------------------------------------------------------------


def test_waiters_are_served_first_in_first_out_and_told_how_many_are_ahead():
    queue = DeviceQueue(poll_s=0.01)
    served: list[int] = []
    first_report: dict[int, int] = {}
    threads = []

    def worker(number: int) -> None:
        def on_wait(ahead: int) -> None:
            first_report.setdefault(number, ahead)

        with queue.turn(on_wait=on_wait, label=f"w{number}"):
            served.append(number)
            time.sleep(0.01)

    with queue.turn(label="holder"):
        for number in range(4):
            thread = threading.Thread(target=worker, args=(number,))
            thread.start()
            threads.append(thread)
            _wait_until(lambda number=number: queue.busy() == (True, number + 1))
    for thread in threads:
        thread.join(10)

    assert served == [0, 1, 2, 3]
    # The holder plus everyone who joined earlier.
    assert first_report == {0: 1, 1: 2, 2: 3, 3: 4}
    history = queue.history()
    assert [turn.label for turn in history] == ["holder", "w0", "w1", "w2", "w3"]
    _assert_no_overlap([(turn.started_at, turn.ended_at) for turn in history])
    assert queue.busy() == (False, 0)


@pytest.mark.parametrize("error", [StopException, RuntimeError])
def test_a_wait_abandoned_from_on_wait_gives_its_place_back(error):
    """Streamlit stops a closed session by raising from its next st.* call: here, on_wait."""
    queue = DeviceQueue(poll_s=0.01)
    outcome: dict[str, object] = {}

    def abandoned() -> None:
        def on_wait(ahead: int) -> None:
            raise error("session closed")

        try:
            with queue.turn(on_wait=on_wait):
                outcome["abandoned ran"] = True
        except BaseException as caught:  # StopException is a BaseException
            outcome["abandoned"] = type(caught)

    def patient() -> None:
        with queue.turn():
            outcome["patient ran"] = True

    with queue.turn():
        first = threading.Thread(target=abandoned)
        first.start()
        first.join(10)
        second = threading.Thread(target=patient)
        second.start()
        _wait_until(lambda: queue.busy() == (True, 1))
    second.join(10)
    assert outcome == {"abandoned": error, "patient ran": True}
    assert queue.busy() == (False, 0)


def test_an_exception_inside_the_turn_frees_the_device():
    queue = DeviceQueue(poll_s=0.01)
    with pytest.raises(StopException), queue.turn():
        raise StopException()
    assert queue.busy() == (False, 0)
    with queue.turn(timeout=1):
        pass


def test_a_wait_times_out_with_a_message_and_leaves_the_line():
    queue = DeviceQueue(poll_s=0.01)
    with queue.turn():
        errors: list[Exception] = []

        def late() -> None:
            try:
                with queue.turn(timeout=0.05):
                    pass
            except DeviceBusyError as error:
                errors.append(error)

        thread = threading.Thread(target=late)
        thread.start()
        thread.join(10)
    assert len(errors) == 1 and "stayed busy" in str(errors[0])
    assert isinstance(errors[0], ckptlab.CkptlabError)
    assert queue.busy() == (False, 0)


def test_a_nested_turn_in_the_same_thread_is_refused_instead_of_deadlocking():
    queue = DeviceQueue(poll_s=0.01)
    with queue.turn(), pytest.raises(RuntimeError, match="already holds"), queue.turn(timeout=1):
        pass
    assert queue.busy() == (False, 0)


# -- run_queued ------------------------------------------------------------------------------


def test_concurrent_runs_take_turns_and_each_measures_as_if_alone():
    """Several sessions press Run at once, through the code path the page uses."""
    specs = [replace(SPEC, every_n_layers=n) for n in (1, 2, 5)]  # the settings other tests measure alone
    queue, cache, load = DeviceQueue(poll_s=0.01), ResultCache(), _Loader()
    results: dict[int, object] = {}
    spans: dict[int, list[float]] = {}
    first_wait: dict[int, int] = {}
    errors: list[BaseException] = []

    def session(index: int) -> None:
        def progress(message: Fact, fraction: float) -> None:
            if message.key != "progress.waiting":  # the wait before the turn is not the turn
                spans.setdefault(index, []).append(time.monotonic())

        def on_wait(ahead: int) -> None:
            first_wait.setdefault(index, ahead)

        try:
            results[index] = run_queued(
                specs[index], load=load, progress=progress, on_wait=on_wait, queue=queue, cache=cache
            )
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = []
    with queue.turn(label="holder"):  # every session joins while the device is busy: a known order
        for index in range(len(specs)):
            thread = threading.Thread(target=session, args=(index,))
            thread.start()
            threads.append(thread)
            _wait_until(lambda index=index: queue.busy()[1] == index + 1)
    for thread in threads:
        thread.join(120)

    assert not errors
    assert sorted(results) == [0, 1, 2]
    assert first_wait == {0: 1, 1: 2, 2: 3}
    history = [turn for turn in queue.history() if turn.label != "holder"]
    assert [turn.ticket for turn in history] == sorted(turn.ticket for turn in history)  # FIFO
    _assert_no_overlap([(turn.started_at, turn.ended_at) for turn in queue.history()])
    _assert_no_overlap([(min(times), max(times)) for times in spans.values()])

    # The first session measured the shared reference; the later ones reused it.
    assert not results[0].reference.reused and results[1].reference.reused and results[2].reference.reused
    for index, spec in enumerate(specs):
        lab = results[index]
        assert lab.result.status == "ok" and lab.result.spec == spec and lab.comparison is not None
        assert lab.reference.result.spec == reference_spec(spec)

    # Nobody saw anybody else's memory: the numbers equal a run made alone (the process-wide
    # cache holds runs other tests made alone; whatever is missing is measured alone here).
    for index, spec in enumerate(specs):
        solo = run_queued(spec, load=load, queue=DeviceQueue())
        shared = results[index].result.memory
        assert shared.baseline_bytes == solo.result.memory.baseline_bytes
        assert shared.after_forward_bytes == solo.result.memory.after_forward_bytes
        assert results[index].reference.result.memory.baseline_bytes == solo.reference.result.memory.baseline_bytes


def test_identical_settings_are_reused_without_queueing():
    off = replace(SPEC, every_n_layers=None)  # one measurement: checkpointing off is its own reference
    queue, cache = DeviceQueue(poll_s=0.01), ResultCache()
    first = run_queued(off, queue=queue, cache=cache)
    assert not first.run.reused and first.reference is first.run
    assert first.comparison.step_ratio == 1.0
    turns = len(queue.history())
    with queue.turn():  # a busy device does not delay a reused result
        again = run_queued(off, queue=queue, cache=cache, timeout=0.05)
    assert again.run.reused and again.reference.reused
    assert again.result is first.result and again.run.measured_at == first.run.measured_at
    assert len(queue.history()) == turns + 1  # only the holder's turn was added


def test_bad_input_fails_before_queueing():
    queue = DeviceQueue(poll_s=0.01)
    with queue.turn():  # would time out if the bad spec queued
        with pytest.raises(ckptlab.SpecError, match="longer than"):
            run_queued(replace(SPEC, model="tiny-gpt2", seq_len=4096), queue=queue, timeout=0.05)
        with pytest.raises(ckptlab.ModelLoadError, match=r"config\.json"):
            run_queued(replace(SPEC, model="/"), queue=queue, timeout=0.05)


def test_an_eight_billion_model_on_the_cpu_is_refused_and_frees_the_device(monkeypatch):
    preflight = sys.modules["ckptlab.step.preflight"]
    # Whatever this machine's RAM, the refusal must come before any weights exist.
    monkeypatch.setattr(preflight, "available_host_bytes", lambda: 8 * 2**30)
    queue = DeviceQueue(poll_s=0.01)
    with pytest.raises(ckptlab.DoesNotFitError, match="does not fit"):
        run_queued(replace(SPEC, model="qwen3-8b", device="cpu"), queue=queue, cache=ResultCache())
    assert queue.busy() == (False, 0)


def test_phase_significance_follows_compare_and_needs_enough_steps():
    from ckptlab.lab.run import phase_significant
    from ckptlab.results import MIN_SAMPLES_TO_JUDGE

    lab = run_queued(SPEC)  # shared cache
    run, base = lab.result, lab.reference.result

    def timed(result, samples):
        return replace(result, timing=replace(result.timing, forward_samples=samples))

    few = [0.1] * (MIN_SAMPLES_TO_JUDGE - 1)
    assert phase_significant(timed(run, few), timed(base, [0.2] * 3), "forward") is None
    assert phase_significant(timed(run, [0.1, 0.11, 0.12]), timed(base, [0.2, 0.21, 0.22]), "forward") is True
    assert phase_significant(timed(run, [0.1, 0.2, 0.3]), timed(base, [0.15, 0.25, 0.35]), "forward") is False
