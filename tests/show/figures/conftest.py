"""One sweep for the sweep figures' tests (test_tradeoff, test_prediction): measured once for the folder."""

from __future__ import annotations

import pytest

from ckptlab.explore.sweep import SweepResult, SweepSpec, sweep


@pytest.fixture(scope="package")
def swept() -> SweepResult:
    # The forward and backward alone: the figures' lessons are about where activations put the peak.
    spec = SweepSpec(
        model="tiny-gpt2", seq_lens=(32, 64), every_n_layers=(1, 2, 3), repeats=2, warmup=0, optimizer="none"
    )
    return sweep(spec)
