"""A run's first words once it has the device: building the model, not "waiting for the device" (cheap: no step runs).

In the app a turn measures in a worker process, whose own first progress comes only after it has started
and imported torch: seconds during which the page still said "waiting for the device" on an empty server.
"""

from __future__ import annotations

import pytest

from ckptlab.lab import run as labrun
from ckptlab.lab.run import ResultCache, run_queued
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.spec import RunSpec


class _Measuring(Exception):
    """Raised where the measurement would start: what was said before it is what the test looks at."""


def test_a_turn_says_it_builds_the_model_before_the_measurement_starts(monkeypatch):
    said = []

    def measuring(*args, **kwargs):
        raise _Measuring

    monkeypatch.setattr(labrun, "_measured", measuring)
    spec = RunSpec(model="tiny-llama", seq_len=16, every_n_layers=1, repeats=1, warmup=0)
    with pytest.raises(_Measuring):
        run_queued(spec, queue=DeviceQueue(), cache=ResultCache(), progress=lambda fact, _: said.append(fact))
    assert [fact.key for fact in said] == ["progress.waiting", "progress.building_random"]
    assert said[1].params["name"] == "tiny-llama"
