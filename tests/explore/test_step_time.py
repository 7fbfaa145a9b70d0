"""A step's time before it runs (explore/step_time) and this machine's speed (explore/machine): no benchmark runs in a
test (tests/conftest.py hands one in); the cache is read and written in a folder of the test's own."""

from __future__ import annotations

import pytest

from ckptlab import RunSpec
from ckptlab.explore import machine
from ckptlab.explore.step_time import Speed, gpu_spec_named, step_flops, step_seconds
from ckptlab.units import GIB


def test_the_machines_speed_is_measured_once_per_torch_threads_and_cpu_and_kept_in_the_users_cache(
    tmp_path, monkeypatch
):
    measured = []

    def benchmark(dtypes, threads):  # stands for the matmuls: no test measures this machine
        measured.append((dtypes, threads))
        return machine.CpuSpeed({dtype: 1e9 * threads for dtype in dtypes}, 2e9, threads, "now")

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


def test_a_cuda_devices_name_finds_its_datasheet_or_none():
    assert gpu_spec_named("NVIDIA H100 80GB HBM3", 80 * GIB).name == "H100 80 GB"
    assert gpu_spec_named("NVIDIA A100-SXM4-40GB", 40 * GIB).name == "A100 40 GB"
    assert gpu_spec_named("NVIDIA A100-SXM4-80GB", 80 * GIB).name == "A100 80 GB"
    assert gpu_spec_named("NVIDIA GeForce RTX 4090", 24 * GIB).name == "RTX 4090 24 GB"
    assert gpu_spec_named("Tesla T4", 16 * GIB) is None  # unknown: no estimate, never a guess


def test_a_steps_time_counts_its_matmuls_the_rerun_and_the_optimizers_pass():
    off = RunSpec(model="qwen3-0.6b", seq_len=256, every_n_layers=None)
    every = RunSpec(model="qwen3-0.6b", seq_len=256, every_n_layers=1)
    fourth = RunSpec(model="qwen3-0.6b", seq_len=256, every_n_layers=4)
    # The rerun: each checkpointed layer's forward once more (28 layers; n=4 checkpoints 7 of them).
    assert step_flops(every) - step_flops(off) == pytest.approx(4 * (step_flops(fourth) - step_flops(off)))
    # 6 x parameters x tokens, give or take: the embeddings are no matmul, attention's scores are one.
    assert step_flops(off) == pytest.approx(6 * 596e6 * 256, rel=0.1)
    lora = RunSpec(model="qwen3-0.6b", seq_len=256, every_n_layers=None, lora_rank=8)
    assert step_flops(lora) == pytest.approx(step_flops(off) * 2 / 3)  # a frozen base: no weights' gradients
    speed = Speed(matmul_flops=1e11, memory_bandwidth=1e10, source="cpu")
    optimizer = 7 * 596_049_920 * 4 / 1e10  # AdamW's pass over float32 parameters, gradients and moments
    assert step_seconds(off, speed, 596_049_920) == pytest.approx(step_flops(off) / 1e11 + optimizer)
