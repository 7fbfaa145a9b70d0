"""The background sweep behind the page: live rows, Stop keeps them, one device turn per row, bad input early."""

from __future__ import annotations

import time

import pytest

from ckptlab.errors import SpecError
from ckptlab.explore.sweep import SweepSpec
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.lab.sweepjob import SweepJob
from ckptlab.show import i18n
from tests.app.polling import HANG_S

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SMALL = SweepSpec(model="tiny-gpt2", seq_lens=(32,), repeats=1, warmup=0)


def _wait(job, until):
    """Until ``until(job.state())``, waiting on the job's thread: no clock a loaded machine can beat."""
    hung_at = time.monotonic() + HANG_S
    while not until(job.state()):
        assert time.monotonic() < hung_at, job.state()
        job.join(0.05)  # returns at once when the job ends
    return job.state()


def test_job_runs_every_row_through_the_device_queue():
    queue = DeviceQueue(poll_s=0.05)
    job = SweepJob(SMALL, queue=queue).start()
    state = _wait(job, lambda s: not s.running)
    assert state.error == "" and state.fraction == 1.0
    assert [row.setting for row in state.result.rows] == ["off"] + [f"n={n}" for n in range(1, 7)]
    assert [row.setting for row in state.rows] == [row.setting for row in state.result.rows]
    # A turn per row's memory step, then one for the length's interleaved timed rounds.
    labels = [turn.label for turn in queue.history()]
    assert len(labels) == 8 and all(label.startswith("sweep tiny-gpt2: row") for label in labels[:7])
    assert labels[7] == "sweep tiny-gpt2: seq 32: 7 settings timed interleaved"
    assert all(row.step_s is not None for row in state.rows)  # the live rows were replaced once timed


def test_stop_keeps_the_rows_measured():
    job = SweepJob(SMALL, queue=DeviceQueue(poll_s=0.05)).start()
    _wait(job, lambda s: len(s.rows) >= 2)
    job.stop()
    state = _wait(job, lambda s: not s.running)
    assert state.result.cancelled and state.stop_requested
    assert 2 <= len(state.result.rows) < 7
    assert [row.setting for row in state.result.rows][:2] == ["off", "n=1"]


def test_stop_while_waiting_for_the_device_keeps_what_there_is():
    queue = DeviceQueue(poll_s=0.05)
    with queue.turn(label="someone else's run"):
        job = SweepJob(SMALL, queue=queue).start()
        _wait(job, lambda s: "waiting for the device" in i18n.say(s.message))
        job.stop()
        state = _wait(job, lambda s: not s.running)
    assert state.result.cancelled and state.result.rows == [] and state.error == ""


def test_bad_input_is_refused_before_any_thread():
    with pytest.raises(SpecError, match="seq_len=0"):
        SweepJob(SweepSpec(seq_lens=(0,)))


def test_a_row_past_the_servers_time_limit_stops_the_sweep_and_says_so():
    queue = DeviceQueue(poll_s=0.05)
    job = SweepJob(SMALL, queue=queue, limit_s=1e-6).start()
    job.join()
    state = job.state()
    assert not state.running and state.failure is not None and state.failure.key == "run.time_limit"
    assert "this server's limit per run" in state.error
    assert queue.busy() == (False, 0)  # the turn was given back


class _BreaksAfter(DeviceQueue):
    """A device queue with a bug: the turn after ``turns`` raises, as a bug inside a sweep would."""

    def __init__(self, turns: int) -> None:
        super().__init__(poll_s=0.05)
        self.left = turns

    def turn(self, *args, **kwargs):
        if self.left == 0:
            raise ZeroDivisionError("the queue broke")
        self.left -= 1
        return super().turn(*args, **kwargs)


def test_a_sweep_that_fails_after_some_rows_keeps_them_and_says_so_in_the_pages_language():
    job = SweepJob(SMALL, queue=_BreaksAfter(2)).start()
    state = _wait(job, lambda s: not s.running)
    assert [row.setting for row in state.result.rows] == ["off", "n=1"] and state.result.cancelled
    assert (
        i18n.say(state.error)
        == "The sweep failed unexpectedly (ZeroDivisionError: the queue broke); the rows measured are kept."
    )
    assert state.failure is None and state.error.key == "sweep.failed_rows_kept"  # a bug: the fact, no lab error
    assert i18n.say(state.error, "pt-BR").startswith("A varredura falhou") and "ZeroDivisionError" in i18n.say(
        state.error, "ja"
    )


def test_a_sweep_that_fails_before_any_row_has_nothing_to_keep():
    state = _wait(SweepJob(SMALL, queue=_BreaksAfter(0)).start(), lambda s: not s.running)
    assert state.result is None and state.rows == [] and "ZeroDivisionError" in i18n.say(state.error)
