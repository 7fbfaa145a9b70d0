"""The core from several threads at once (the app's sessions are threads): each call gets the bytes it gets alone."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from ckptlab import RunSpec, measure, simulate, torchstate
from ckptlab.fact import Fact
from ckptlab.model import catalog

pytestmark = pytest.mark.slow  # real steps and simulations

MEASURED = RunSpec(model="tiny-llama", seq_len=64, every_n_layers=1, repeats=1, warmup=0, optimizer="none")
SIMULATED = RunSpec(model="tiny-llama", seq_len=128, dtype="bfloat16", every_n_layers=2, optimizer="adamw")
ROUNDS = 2


def _figures(result):
    memory = result.memory
    return (result.status, memory.baseline_bytes, memory.after_forward_bytes, memory.peak_bytes,
            [layer.observed for layer in result.layers])  # fmt: skip


def _together() -> dict[str, list]:
    """Two measures, two simulations and a bf16 description, released at once by a barrier; what each got."""
    jobs = {
        "measure": lambda: measure(MEASURED),
        "measure-offload-off": lambda: measure(replace(MEASURED, every_n_layers=2)),
        "simulate": lambda: simulate(SIMULATED),
        "simulate-gpt2": lambda: simulate(replace(SIMULATED, model="tiny-gpt2")),
    }
    start = threading.Barrier(len(jobs) + 1)
    got: dict[str, list] = {name: [] for name in jobs}
    failures: list[BaseException] = []

    def run(name: str) -> None:
        start.wait()
        try:
            for _ in range(ROUNDS):
                got[name].append(_figures(jobs[name]()))
        except BaseException as error:  # the test reports it below, with the others
            failures.append(error)

    config, _, task = catalog.load_config("qwen3-0.6b")  # a bf16 config

    def describe_bf16_presets() -> None:  # transformers sets the default dtype while it builds on meta
        start.wait()
        for _ in range(ROUNDS * 4):
            catalog.build_on_meta(config, task)

    threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
    threads.append(threading.Thread(target=describe_bf16_presets))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    return got


def test_threads_measuring_and_simulating_at_once_get_the_bytes_each_gets_alone():
    alone = {
        "measure": _figures(measure(MEASURED)),
        "measure-offload-off": _figures(measure(replace(MEASURED, every_n_layers=2))),
        "simulate": _figures(simulate(SIMULATED)),
        "simulate-gpt2": _figures(simulate(replace(SIMULATED, model="tiny-gpt2"))),
    }
    for name, figures in _together().items():
        assert figures == [alone[name]] * ROUNDS, name


def test_the_lock_is_held_while_a_step_runs():
    """What the lock serializes, seen from inside: a measure's progress report runs while it holds the lock."""
    held: list[bool] = []

    def progress(message: Fact, fraction: float) -> None:
        acquired = torchstate.TORCH_STATE.acquire(blocking=False)  # re-entrant: True in the holding thread
        if acquired:
            torchstate.TORCH_STATE.release()
        outside: list[bool] = []
        other = threading.Thread(target=lambda: outside.append(torchstate.TORCH_STATE.acquire(blocking=False)))
        other.start()
        other.join()
        held.append(acquired and outside == [False])

    measure(MEASURED, progress=progress)
    assert held and all(held)
