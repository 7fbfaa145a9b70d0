"""Shared fixtures: small, fast specs and a cache of measured runs reused across tests."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ckptlab import RunResult, RunSpec, measure

# Short sequences and one timed step keep each real run well under a second on 2 cores. The
# forward and backward alone (optimizer "none", the lessons' step): most tests reason about
# activations; tests/test_training.py covers the optimizer's step and LoRA.
FAST = RunSpec(model="tiny-llama", seq_len=128, batch_size=1, every_n_layers=1, repeats=1, warmup=0, optimizer="none")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="session")
def measured():
    """``measured(**changes)``: a real run of ``FAST`` with ``changes``, measured once per session."""
    cache: dict[RunSpec, RunResult] = {}

    def run(**changes) -> RunResult:
        spec = replace(FAST, **changes)
        if spec not in cache:
            cache[spec] = measure(spec)
        return cache[spec]

    return run
