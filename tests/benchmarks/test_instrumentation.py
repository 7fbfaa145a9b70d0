"""The timeline's recorder does not change the measured peak (benchmarks/instrumentation.py, which also times it)."""

from __future__ import annotations

import pytest
import torch

from ckptlab import RunSpec, load_model
from ckptlab.step.trainstep import random_batch
from tests.benchmarks import load_benchmark

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them


def _benchmark():
    return load_benchmark("instrumentation")


def test_recording_the_timeline_leaves_the_peak_to_the_byte():
    benchmark = _benchmark()
    spec = RunSpec(model="tiny-llama", seq_len=128, every_n_layers=2, device="cpu")
    model, _ = load_model(spec)
    model.train()
    model.activation_checkpointing_enable(every_n_layers=2)
    # One round: the peak is the same to the byte in every round. The time is the benchmark script's to judge (its
    # RECORDER_LIMIT, more rounds side by side on a quiet machine), not this test's: a bound of 1.5 here failed CI of
    # 2026-12-04 at 1.57 (0.51 s over 0.32 s, beside the other worker's tests).
    ratios = benchmark.recorder_ratio(
        model, random_batch(model, spec, torch.device("cpu")), torch.device("cpu"), rounds=1
    )
    assert ratios["peak_ratio"] == 1.0  # reading counters allocates nothing: the same peak to the byte
