"""The timeline's recorder does not change the measured peak, and costs little time (benchmarks/instrumentation.py)."""

from __future__ import annotations

import pytest
import torch

from ckptlab import RunSpec, load_model
from ckptlab.step.trainstep import random_batch
from tests.benchmarks import load_benchmark

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them


def _benchmark():
    return load_benchmark("instrumentation")


def test_recording_the_timeline_changes_neither_the_peak_nor_much_time():
    benchmark = _benchmark()
    spec = RunSpec(model="tiny-llama", seq_len=128, every_n_layers=2, device="cpu")
    model, _ = load_model(spec)
    model.train()
    model.activation_checkpointing_enable(every_n_layers=2)
    ratios = benchmark.recorder_ratio(
        model, random_batch(model, spec, torch.device("cpu")), torch.device("cpu"), rounds=3
    )
    assert ratios["peak_ratio"] == 1.0  # reading counters allocates nothing: the same peak to the byte
    # Time on a shared 2-core machine is noisy; the benchmark script quotes the real ratio with more rounds.
    assert ratios["time_ratio"] < 1.5, ratios
