"""The lab's Run in a worker process: the same bytes as in the server's process, a hard time limit, shared cores said."""

from __future__ import annotations

import threading

import pytest

from ckptlab import measure
from ckptlab.errors import RunStoppedError
from ckptlab.lab.run import ResultCache, run_queued
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.lab.workers import WorkerPool
from ckptlab.spec import RunSpec

pytestmark = pytest.mark.slow  # worker processes and real steps

SPEC = RunSpec(model="tiny-llama", seq_len=32, every_n_layers=1, repeats=2, warmup=1, optimizer="adamw")
TARGETS = "tests.lab.worker_targets"


@pytest.fixture(scope="module")
def workers():
    pool = WorkerPool(1, 1, poll_s=0.02).start()
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def sharing():
    pool = WorkerPool(1, 1, warm=("torch", TARGETS), poll_s=0.02, grace_s=0.5).start()
    yield pool
    pool.close()


def test_a_run_in_a_worker_measures_the_bytes_of_the_run_here(workers):
    lab = run_queued(SPEC, queue=DeviceQueue(), cache=ResultCache(), workers=workers)
    alone, reference = measure(SPEC), measure(RunSpec(**{**SPEC.__dict__, "every_n_layers": None}))
    for figure in ("baseline_bytes", "after_forward_bytes", "peak_bytes", "breakdown_at_peak"):
        assert getattr(lab.result.memory, figure) == getattr(alone.memory, figure), figure
    assert lab.reference is not None and lab.reference.result.memory.peak_bytes == reference.memory.peak_bytes
    assert [layer.observed for layer in lab.result.layers] == [layer.observed for layer in alone.layers]


def test_a_run_past_the_limit_is_killed_with_the_run_limit_message(workers):
    queue, killed = DeviceQueue(), workers.killed
    with pytest.raises(RunStoppedError) as stopped:
        run_queued(SPEC, queue=queue, cache=ResultCache(), workers=workers, limit_s=0.05)
    assert stopped.value.key == "run.time_limit"
    assert workers.killed == killed + 1 and queue.busy() == (False, 0)
    assert run_queued(SPEC, queue=queue, cache=ResultCache(), workers=workers).result.status == "ok"  # served again


def test_a_cpu_run_timed_beside_a_simulation_says_the_cores_were_shared(workers, sharing):
    holding, done = threading.Event(), threading.Event()
    other = threading.Thread(
        target=lambda: sharing.run(f"{TARGETS}:hold", progress=lambda m, f: holding.set(), should_stop=done.is_set)
    )
    other.start()
    assert holding.wait(60)
    try:
        lab = run_queued(SPEC, queue=DeviceQueue(), cache=ResultCache(), workers=workers, sharing=sharing)
    finally:
        done.set()
        other.join()
    assert lab.result.timing is not None and "shared" in lab.result.timing.busy_reasons
    alone = run_queued(SPEC, queue=DeviceQueue(), cache=ResultCache(), workers=workers, sharing=sharing)
    assert alone.result.timing is not None and "shared" not in alone.result.timing.busy_reasons
