"""The host-time model (explore/machine.host_step): its ops are counted as the simulation counts them, so the host
seconds per op it measures divide by the counts the roofline multiplies them with. No timing is checked here (a
measurement, never a test): the counts are."""

from __future__ import annotations

import pytest
import transformers

from ckptlab import RunSpec, simulate
from ckptlab.explore import machine
from ckptlab.explore.roofline import launches_kernel, step_work


@pytest.mark.slow  # one simulation of the 4-layer host model: the proof is the simulation's own count
def test_the_host_models_ops_are_the_ones_its_simulation_counts(tmp_path):
    transformers.LlamaConfig(**machine.HOST_MODEL).save_pretrained(tmp_path)
    spec = RunSpec(
        model=str(tmp_path), seq_len=machine.HOST_TOKENS, device="cpu", dtype="float32", optimizer="none",
        every_n_layers=1,
    )  # fmt: skip
    work = step_work(simulate(spec))
    assert work is not None
    simulated = {
        phase: sum(item.count for item in work.items if item.phase in phases and launches_kernel(item.cost.op))
        for phase, phases in {"forward": ("forward", "loss"), "backward": ("backward",), "rerun": ("rerun",)}.items()
    }
    model, batch = machine.host_model()
    ran = machine.host_step(model, batch, checkpointed=True, count=True)
    assert ran.ops["rerun"] == simulated["rerun"] > 0  # every layer's forward again, op for op
    # The real step's causal mask asks its values (all, cumsum, a scalar read) where the fake one cannot: a few ops
    # outside the layers, under 5% of each phase.
    assert ran.ops["forward"] == pytest.approx(simulated["forward"], rel=0.05)
    assert ran.ops["backward"] == pytest.approx(simulated["backward"], rel=0.05)
    off = machine.host_step(model, batch, checkpointed=False, count=True)
    assert off.ops["rerun"] == 0 and off.ops["backward"] == ran.ops["backward"]
