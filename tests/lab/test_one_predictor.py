"""Issues 57 and 58: one time predictor. The Lab's estimate before a Run is the roofline's over the step's simulated
work on this CPU's measured speed: the same number ``simulate`` and the roofline give for the same spec, each
simulation made once per spec for every session (the shared store)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import ckptlab
from ckptlab import RunSpec
from ckptlab.explore import machine
from ckptlab.explore.roofline import cpu_speed, measured_efficiency, predict_result
from ckptlab.lab import run as labrun
from ckptlab.lab import store as shared
from ckptlab.lab.store import ResultStore, json_bytes


@pytest.mark.slow  # two real simulations: the proof is that the page's number is simulate's
@pytest.mark.simulated_work
def test_the_labs_estimate_is_simulates_cpu_prediction_of_the_same_spec(monkeypatch):
    store: ResultStore = ResultStore(json_bytes)
    monkeypatch.setattr(labrun, "SIMULATIONS", store)  # an empty shared store: this test's simulations only
    monkeypatch.setattr(shared, "SIMULATIONS", store)
    spec = RunSpec(model="tiny-gpt2", seq_len=32, every_n_layers=2)  # the cheapest preset to simulate; "auto": the CPU

    lab = labrun.step_prediction(spec)
    # simulate's own CPU step, timed by the roofline on this CPU's measured record (tests/conftest.py's).
    simulated = ckptlab.simulate(replace(spec, device="cpu"))
    record = machine.cpu_speed("float32", 1)
    alone = predict_result(simulated, cpu_speed(record, "this CPU"), efficiency=measured_efficiency(record))
    assert lab is not None and alone is not None
    assert lab.seconds == alone.seconds and lab.by_phase == alone.by_phase
    assert lab.provenance.label == "predicted (roofline, this CPU)"
    # The Run's wait (its part alone) is that step times the Run's steps, from the store: no second simulation,
    # nor one for more repeats (a simulation reads no timing field).
    longer = replace(spec, repeats=9, warmup=3)
    assert labrun.run_estimate(longer, alone=True) == lab.seconds * labrun.run_steps(longer)
    assert list(store) == [replace(spec, device="cpu")]
