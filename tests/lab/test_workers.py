"""Jobs in worker processes: errors keep their key, limits end the worker, Stop and turns reach across the pipe."""

from __future__ import annotations

import os
import pickle
import signal
import threading

import pytest

from ckptlab.errors import CkptlabError, Option, RunStoppedError, SpecError
from ckptlab.fact import Fact
from ckptlab.lab.runqueue import DeviceQueue, SupersededError
from ckptlab.lab.server import NotAllowedError
from ckptlab.lab.workers import WorkerLostError, WorkerPool, resident_bytes
from ckptlab.step.fsdp import RankFailedError
from ckptlab.torchstate import measuring_threads, thread_plan, usable_cores

TARGETS = "tests.lab.worker_targets"


@pytest.fixture(scope="module")
def pool():
    """Two light workers (torch imported, not transformers): enough for the pool's own rules."""
    workers = WorkerPool(2, 1, warm=("torch", TARGETS), poll_s=0.02, grace_s=0.5).start()
    yield workers
    workers.close()


def test_every_lab_error_pickles_with_its_key_and_params() -> None:
    for error in (
        SpecError(key="spec.whole_number", option=Option("repeats", 0), minimum=1),
        NotAllowedError(key="server.folder_outside", name="/etc"),
        RankFailedError(key="rank.failed", rank=1, world_size=2, message="did not fit"),
        SupersededError(key="queue.superseded"),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.key, back.params) == (error.key, error.params)


def test_an_error_crosses_the_process_boundary_with_its_key(pool: WorkerPool) -> None:
    with pytest.raises(NotAllowedError) as raised:
        pool.run(f"{TARGETS}:fail", NotAllowedError(key="server.folder_outside", name="/etc"))
    assert raised.value.key == "server.folder_outside" and raised.value.params == {"name": "/etc"}
    with pytest.raises(ZeroDivisionError, match="boom"):  # a bug too, as it was raised
        pool.run(f"{TARGETS}:fail", ZeroDivisionError("boom"))


def test_a_job_reaches_the_hub_as_the_server_does(pool: WorkerPool) -> None:
    from ckptlab.model import hub

    for access in (
        hub.HubAccess(enabled=False, cache_dir="/srv/hub-cache", token=False, server=True),
        hub.HubAccess(enabled=True, endpoint="http://127.0.0.1:9", token="instructor-token", server=True),
    ):
        hub.configure(access)  # as the app does from the instructor's policy (pages/_server.py)
        assert pool.run(f"{TARGETS}:hub_access") == (*access.stamp(), access.token)


def test_workers_are_reused_and_set_their_threads(pool: WorkerPool) -> None:
    pids = {pool.run(f"{TARGETS}:pid") for _ in range(4)}
    assert len(pids) <= pool.size  # no new process per job
    assert pool.run(f"{TARGETS}:threads") == pool.threads


def test_a_worker_freezes_its_warm_imports_so_each_steps_collection_skips_them(pool: WorkerPool) -> None:
    assert pool.run(f"{TARGETS}:frozen_torch_module")


def test_thread_plan_never_oversubscribes_the_cores() -> None:
    for cores in (1, 2, 3, 4, 8, 16, 64):
        plan = thread_plan(cores)
        used = plan.device_threads + plan.simulation_workers * plan.simulation_threads
        assert used <= max(cores, 2) and plan.simulation_workers >= 1
    assert thread_plan(2) == thread_plan(2).__class__(1, 1, 1)


def test_a_measured_step_takes_the_device_workers_threads_and_gives_them_back() -> None:
    """``run`` and ``measure`` follow the workers' rule (issue 61): torch's default of a thread a core is cut to the
    device worker's share; a process that asked for fewer keeps them; either is put back after."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(usable_cores())  # torch's default
        with measuring_threads() as threads:
            assert threads == torch.get_num_threads() == thread_plan().device_threads
        assert torch.get_num_threads() == usable_cores()
        torch.set_num_threads(1)
        with measuring_threads() as threads:
            assert threads == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_job_past_its_time_limit_is_killed_and_replaced(pool: WorkerPool) -> None:
    killed = pool.killed
    seen: list[int] = []

    def on_progress(message: Fact, fraction: float) -> None:
        seen.append(os.getpid())  # progress arrives in the caller's own process

    with pytest.raises(RunStoppedError) as raised:
        pool.run(f"{TARGETS}:hold", progress=on_progress, limit_s=0.3)
    assert raised.value.key == "job.time_limit" and seen
    assert pool.killed == killed + 1
    assert pool.run(f"{TARGETS}:pid") > 0  # the pool still serves


def test_a_job_over_the_memory_cap_is_killed(pool: WorkerPool) -> None:
    worker_pid = pool.run(f"{TARGETS}:pid")
    baseline = resident_bytes(worker_pid)
    assert baseline > 0
    with pytest.raises(RunStoppedError) as raised:
        pool.run(f"{TARGETS}:hold", 400, memory_cap_bytes=baseline + 150 * 2**20)
    assert raised.value.key == "job.memory_cap"
    assert set(raised.value.params) == {"used", "cap"}


def test_stop_ends_the_job_in_its_worker_without_a_kill(pool: WorkerPool) -> None:
    killed, asked = pool.killed, threading.Event()
    answer = pool.run(f"{TARGETS}:hold", progress=lambda m, f: asked.set(), should_stop=asked.is_set)
    assert answer == "stopped" and pool.killed == killed


def test_an_exception_from_should_stop_kills_the_worker_and_propagates(pool: WorkerPool) -> None:
    class SessionGone(Exception):
        pass

    killed, holding = pool.killed, threading.Event()

    def gone() -> bool:
        if holding.is_set():
            raise SessionGone
        return False

    with pytest.raises(SessionGone):
        pool.run(f"{TARGETS}:hold", progress=lambda m, f: holding.set(), should_stop=gone)
    assert pool.killed == killed + 1


def test_a_worker_that_dies_says_so(pool: WorkerPool) -> None:
    def kill_the_worker(worker_pid: str, fraction: float) -> None:
        os.kill(int(worker_pid), signal.SIGKILL)  # from outside, as the kernel's OOM killer would

    with pytest.raises(WorkerLostError) as raised:
        pool.run(f"{TARGETS}:hold", progress=kill_the_worker)
    assert raised.value.key == "job.worker_lost"


def test_a_job_takes_its_device_turns_in_the_parent(pool: WorkerPool) -> None:
    queue = DeviceQueue(poll_s=0.01)
    labels = pool.run(f"{TARGETS}:turns", ["a", "b"], turn=lambda label: queue.turn(label=label))
    assert labels == ["a", "b"]
    assert [turn.label for turn in queue.history()] == ["a", "b"]


def test_a_turn_held_past_its_limit_is_given_back(pool: WorkerPool) -> None:
    queue = DeviceQueue(poll_s=0.01)
    with pytest.raises(CkptlabError) as raised:
        pool.run(f"{TARGETS}:hold_in_turn", turn=lambda label: queue.turn(label=label), turn_limit_s=0.3)
    assert raised.value.key == "job.time_limit"
    assert queue.busy() == (False, 0) and len(queue.history()) == 1


def test_a_worker_never_runs_the_parents_main_script(tmp_path, monkeypatch):
    """Under Streamlit ``__main__`` is the page being run; spawn would run it again in the child."""
    import sys
    import types

    page = tmp_path / "page.py"
    page.write_text("raise SystemExit(3)  # a page script: the worker must not run it\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(page)
    monkeypatch.setitem(sys.modules, "__main__", main)
    fresh = WorkerPool(1, 1, warm=("torch", TARGETS), poll_s=0.02)
    try:
        assert fresh.run(f"{TARGETS}:pid") > 0
    finally:
        fresh.close()
    assert sys.modules["__main__"] is main
