"""The app's background jobs with their work in a worker process: the same answers, hard limits, a gone session ends them."""

from __future__ import annotations

import threading
import time

import pytest

from ckptlab import simulate
from ckptlab.explore.scale import ScaleRequest
from ckptlab.explore.sweep import SweepSpec
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.lab.scalejob import ScaleJob, SearchJob
from ckptlab.lab.sweepjob import SweepJob
from ckptlab.lab.workers import WorkerPool
from ckptlab.show import i18n
from ckptlab.spec import Setting
from tests.app.polling import HANG_S

pytestmark = pytest.mark.slow  # worker processes and real steps

SETTINGS = (Setting(None), Setting(1))  # what crosses the boundary: one setting off, one checkpointed
# What crosses the boundary is the same whatever the model: tiny-bert's 4 layers at 32 tokens, a simulation's operations
# the fewest (tiny-llama's own answers at scale are tests/explore/test_scale.py's and the journeys').
REQUEST = ScaleRequest("tiny-bert", 32, 1, "bfloat16", SETTINGS)
SMALL = SweepSpec(model="tiny-gpt2", seq_lens=(32,), every_n_layers=(1,), repeats=1, warmup=0)


# The tests run in this file's order for a reason of time only: a limit or a gone session kills the pool's worker, and
# the next job waits for its replacement to import torch and transformers. The tests whose job needs a ready worker
# come first; the last, a job past its whole limit, is ended while the replacement still imports.


@pytest.fixture(scope="module")
def workers():
    pool = WorkerPool(1, 1, poll_s=0.02, grace_s=2.0).start()
    yield pool
    pool.close()


def _wait(job, until):
    """Until ``until(job.state())``, waiting on the job's thread: no clock a loaded machine can beat."""
    hung_at = time.monotonic() + HANG_S
    while not until(job.state()):
        assert time.monotonic() < hung_at, job.state()
        job.join(0.05)
    return job.state()


def test_a_scale_job_in_a_worker_simulates_the_bytes_of_one_here(workers):
    seen = []
    job = ScaleJob(REQUEST, workers=workers, on_result=seen.append).start()
    state = _wait(job, lambda s: not s.running)
    assert state.error == "" and state.table is not None and not state.table.cancelled
    here = {result.spec: simulate(result.spec) for result in state.table.results}
    for result in state.table.results:
        assert result.memory.peak_bytes == here[result.spec].memory.peak_bytes
        assert result.memory.after_forward_bytes == here[result.spec].memory.after_forward_bytes
    assert [r.spec for r in seen] == [r.spec for r in state.table.results]  # on_result ran here, as each came


def test_a_gpu_search_in_a_worker_answers_as_here(workers):
    from ckptlab.explore.gpu_search import cheapest_that_fits

    budget = 2**30
    job = SearchJob(REQUEST, budget, counts=(1, 2), workers=workers).start()
    state = _wait(job, lambda s: not s.running)
    here = cheapest_that_fits(REQUEST, budget, counts=(1, 2))
    assert state.error == "" and state.search is not None
    assert state.search.result is not None and here.result is not None
    assert state.search.result.spec == here.result.spec
    assert state.search.result.memory.peak_bytes == here.result.memory.peak_bytes


def test_a_sweep_in_a_worker_takes_one_device_turn_per_row_here(workers):
    queue = DeviceQueue(poll_s=0.02)
    job = SweepJob(SMALL, queue=queue, workers=workers).start()
    state = _wait(job, lambda s: not s.running)
    assert state.error == "" and [row.setting for row in state.result.rows] == ["off", "n=1"]
    labels = [turn.label for turn in queue.history()]
    assert len(labels) == 3 and all(label.startswith("sweep tiny-gpt2: ") for label in labels)
    assert all(row.step_s is not None for row in state.rows)


def test_a_sweep_whose_session_is_gone_ends_and_gives_its_turn_back(workers):
    queue = DeviceQueue(poll_s=0.02)
    gone = threading.Event()
    with queue.turn(label="someone else's run"):
        job = SweepJob(SMALL, queue=queue, workers=workers, alive=lambda: not gone.is_set()).start()
        _wait(job, lambda s: "waiting for the device" in i18n.say(s.message))
        gone.set()  # the tab is closed while the sweep waits
        state = _wait(job, lambda s: not s.running)
    assert state.result is not None and state.result.cancelled and state.result.rows == []
    assert queue.busy() == (False, 0) and len(queue.history()) == 1  # it never took a turn


def test_a_sweep_row_past_the_limit_kills_the_worker_and_says_the_run_limit(workers):
    queue, killed = DeviceQueue(poll_s=0.02), workers.killed
    job = SweepJob(SMALL, queue=queue, workers=workers, limit_s=0.05).start()
    state = _wait(job, lambda s: not s.running)
    assert state.failure is not None and state.failure.key == "run.time_limit"
    assert workers.killed == killed + 1 and queue.busy() == (False, 0)


def test_a_scale_job_past_its_limit_is_ended_with_the_simulation_message(workers):
    killed = workers.killed
    job = ScaleJob(ScaleRequest("tiny-llama", 2048, 1, "bfloat16", SETTINGS), workers=workers, limit_s=0.5).start()
    state = _wait(job, lambda s: not s.running)
    assert state.failure is not None and state.failure.key == "simulation.time_limit"
    assert workers.killed == killed + 1
