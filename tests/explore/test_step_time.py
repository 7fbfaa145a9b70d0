"""A step's time before it runs (explore/step_time: the roofline on this device) and this machine's speed
(explore/machine): no benchmark runs in a test (tests/conftest.py hands one in); the cache is read and written in a
folder of the test's own."""

from __future__ import annotations

import pytest

from ckptlab import RunSpec
from ckptlab.explore import machine
from ckptlab.explore.roofline import CPU_DISPATCH_S, measured_efficiency
from ckptlab.explore.step_time import device_speed, gpu_spec_named, predict_step, run_steps
from ckptlab.step.work import OpCost, StepWork, WorkItem
from ckptlab.units import GIB

HOST = {"forward": 15e-6, "backward": 7e-6, "rerun": 45e-6}  # a measured record's host seconds an op


def test_the_machines_speed_is_measured_once_per_torch_threads_and_cpu_and_kept_in_the_users_cache(
    tmp_path, monkeypatch
):
    measured = []

    def benchmark(dtypes, threads):  # stands for the matmuls: no test measures this machine
        measured.append((dtypes, threads))
        return machine.CpuSpeed({dtype: 1e9 * threads for dtype in dtypes}, 2e9, threads, "now", host_op_s=HOST)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "measure_speed", benchmark)
    monkeypatch.setattr(machine, "_KNOWN", {})
    monkeypatch.setattr(machine, "_GIVEN", [])  # conftest's speed set aside for this test
    assert machine.cpu_speed("float32", 1).matmul_flops["float32"] == 1e9
    assert machine.cache_path() == tmp_path / "ckptlab" / "machine.json" and machine.cache_path().exists()
    monkeypatch.setattr(machine, "_KNOWN", {})  # a new process: read from the file, not measured again
    assert machine.cpu_speed("float32", 1).memory_bandwidth == 2e9 and len(measured) == 1
    machine.cpu_speed("bfloat16", 1)  # a dtype not measured yet at that thread count
    assert machine.cpu_speed("float32", 2).threads == 2  # another thread count is another speed
    assert measured == [(("float32",), 1), (("bfloat16",), 1), (("float32",), 2)]
    monkeypatch.setattr(machine, "_KNOWN", {})
    assert machine.cpu_speed("bfloat16", 1).matmul_flops == {"float32": 1e9, "bfloat16": 1e9}
    assert len(measured) == 3


def test_a_speed_measured_on_a_busy_machine_is_measured_again_and_keeps_the_fastest_figures(tmp_path, monkeypatch):
    """The record that made every estimate here 4-6x too long: 14.9 GFLOP/s and 2.3 GB/s measured at load 14."""
    speeds = iter(
        [  # (float32 FLOP/s, bandwidth, busy): at load 14, busy again but faster, then idle and slower by noise
            (14.9e9, 2.3e9, True, 90e-6),
            (60e9, 2.0e9, True, 60e-6),
            (57e9, 9e9, False, 70e-6),
        ]
    )
    measured = []

    def benchmark(dtypes, threads):
        flops, bandwidth, busy, rerun_s = next(speeds)
        measured.append(busy)
        host = {**HOST, "rerun": rerun_s}
        return machine.CpuSpeed({dtype: flops for dtype in dtypes}, bandwidth, threads, "now", busy, host)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "measure_speed", benchmark)
    monkeypatch.setattr(machine, "_GIVEN", [])
    # the host's time per op is the least seen (a neighbour only adds to it), as the speeds are the fastest
    expected_rows = [(14.9e9, 2.3e9, True, 90e-6), (60e9, 2.3e9, True, 60e-6), (60e9, 9e9, False, 60e-6)]
    for expected in [*expected_rows, expected_rows[-1]]:
        monkeypatch.setattr(machine, "_KNOWN", {})  # each a new process, reading machine.json
        speed = machine.cpu_speed("float32", 1)
        figures = (speed.matmul_flops["float32"], speed.memory_bandwidth, speed.busy, speed.host_op_s["rerun"])
        assert figures == expected
        assert machine.cpu_speed("float32", 1) is speed  # measured at most once a process
    assert len(measured) == 3  # the record settled by the measurement on a machine that was not busy


def test_a_cuda_devices_name_finds_its_datasheet_or_none():
    assert gpu_spec_named("NVIDIA H100 80GB HBM3", 80 * GIB).name == "H100 80 GB"
    assert gpu_spec_named("NVIDIA A100-SXM4-40GB", 40 * GIB).name == "A100 40 GB"
    assert gpu_spec_named("NVIDIA A100-SXM4-80GB", 80 * GIB).name == "A100 80 GB"
    assert gpu_spec_named("NVIDIA GeForce RTX 4090", 24 * GIB).name == "RTX 4090 24 GB"
    assert gpu_spec_named("Tesla T4", 16 * GIB) is None  # unknown: no estimate, never a guess


def test_a_steps_time_on_this_cpu_is_the_rooflines_over_its_counted_work_at_the_measured_speed():
    """No second divide-by-speed: a CPU step is :func:`ckptlab.explore.roofline.predict_time` on this CPU's measured
    record (conftest's: 50 GFLOP/s float32, 5 GB/s, no host times: the dispatch's 5 us), each op the larger of its
    compute and its memory time, the host's time added (a CPU runs both in turn)."""
    spec = RunSpec(model="tiny-llama", seq_len=256, device="cpu", every_n_layers=1)
    device = device_speed(spec)
    assert (
        device is not None
        and device.efficiency == measured_efficiency(machine.cpu_speed("float32", 1))
        and device.speed.name == "this CPU"
    )
    matmul = OpCost("aten.mm.default", "float32", flops=10**9, bytes=10**6)  # compute-bound: 1e9 / 50e9 = 20 ms
    update = OpCost("aten.add.Tensor", "float32", flops=0, bytes=10**9)  # memory-bound: 1e9 / 5e9 = 200 ms
    view = OpCost("aten.view.default", "float32", flops=0, bytes=0)  # no kernel: free
    work = StepWork(
        (WorkItem("forward", 0, matmul, 3), WorkItem("optimizer", None, update, 1), WorkItem("forward", 0, view, 9))
    )
    step = predict_step(spec, work, device)
    assert step.seconds == pytest.approx(3 * (0.02 + CPU_DISPATCH_S) + 0.2 + CPU_DISPATCH_S)
    assert step.provenance.label == "predicted (roofline, this CPU)" and step.tokens == 256
    assert run_steps(spec) == spec.warmup + spec.repeats + 3  # the Run's steps: warm-up, timed, the memory step
