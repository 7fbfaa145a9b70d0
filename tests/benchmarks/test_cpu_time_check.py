"""The CPU time check's arithmetic on injected figures (benchmarks/cpu_time_check.py; its measurements are a script)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ckptlab.explore.machine import CpuSpeed
from ckptlab.explore.roofline import cpu_speed, measured_efficiency
from ckptlab.step.work import OpCost, StepWork, WorkItem

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_time_check.py"
RECORD = CpuSpeed(matmul_flops={"float32": 20e9}, memory_bandwidth=10e9, host_op_s={"forward": 20e-6, "backward": 8e-6})
SPEED, EFFICIENCY = cpu_speed(RECORD, "a CPU"), measured_efficiency(RECORD)  # injected, not measured
MATMUL = OpCost("aten.mm.default", "float32", flops=2 * 512**3, bytes=3 * 512 * 512 * 4)  # 13.4 ms at 20 GFLOP/s


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("cpu_time_check_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_prediction_uses_the_measured_figures_and_drops_the_copies_a_cpu_cannot_make(check):
    tiny = OpCost("aten.add.Tensor", "float32", flops=0, bytes=1000)  # 0.1 us of bandwidth beside 20 us of host
    copy = OpCost("aten._to_copy.default", "float32", flops=0, bytes=2**20)
    off = StepWork(
        (WorkItem("forward", 0, MATMUL, 1), WorkItem("backward", 0, MATMUL, 2), WorkItem("forward", 0, tiny, 4))
    )
    offloaded = StepWork((*off.items, WorkItem("rerun", 0, MATMUL, 1), WorkItem("offload", 0, copy, 2)))
    matmul_s = 2 * 512**3 / 20e9  # no efficiency below a measured speed
    off_s = matmul_s + 20e-6 + 2 * (matmul_s + 8e-6) + 4 * (0.1e-6 + 20e-6)  # the host's time adds on a CPU
    assert check.predicted_seconds(off, SPEED, EFFICIENCY, 64) == pytest.approx(off_s)
    # offload's copies need a host link a CPU has not: dropped, not refused (the lab runs n=1 without them there);
    # the record has no rerun time: a forward op's
    rerun_s = matmul_s + 20e-6
    assert check.predicted_seconds(offloaded, SPEED, EFFICIENCY, 64) == pytest.approx(off_s + rerun_s)


def test_factors_over_off_and_the_error_against_the_measured_one(check):
    rows = check.checks({"off": 2.0, "n=1": 2.6, "n=2": 2.3}, {"off": 1.0, "n=1": 1.25, "n=2": 1.2})
    assert [row.setting for row in rows] == ["off", "n=1", "n=2"]
    off, n1, n2 = rows
    assert (off.measured_factor, off.predicted_factor, off.error) == (1.0, 1.0, 0.0)
    assert (n1.measured_factor, n1.predicted_factor) == (pytest.approx(1.3), pytest.approx(1.25))
    assert n1.error == pytest.approx(1.25 / 1.3 - 1) and n1.within  # -3.8%
    assert n2.error == pytest.approx(1.2 / 1.15 - 1) and n2.within  # +4.3%
    wide = check.checks({"off": 1.0, "n=1": 1.5}, {"off": 1.0, "n=1": 1.2})[1]
    assert wide.error == pytest.approx(-0.2) and not wide.within
