"""The fewest-GPUs search's order, on a stubbed simulation (the real one: tests/explore/test_gpu_search.py): the
counts the parameter floor refuses are never simulated, the leanest setting decides a count, and the answer is
the one the search setting by setting gives, at every budget, in fewer simulations."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest

from ckptlab.explore import gpu_search
from ckptlab.explore.gpu_search import cheapest_that_fits, holds_no_more
from ckptlab.explore.scale import ScaleRequest, scale_settings
from ckptlab.model.plan import planned_roles
from ckptlab.spec import RunSpec, Setting

LAYERS = 32  # llama-3.1-8b's: off, n=1, n=1+offload and the divisors 2 to 32
GIB = 2**30
FLOOR = 120 * GIB  # parameters, gradients and optimizer state on one GPU
INPUT, LAYER = GIB // 8, GIB  # a CP layer keeps its input, a keep layer all its activations
COUNTS = (1, 2, 4, 8, 16, 64)


@pytest.fixture(autouse=True)
def _tensors_only(monkeypatch):
    """The device total stubbed as the tensors' peak (the search's order is what is tested here; that the search
    decides on the device total is tests/explore/test_device.py's)."""
    monkeypatch.setattr(gpu_search, "on_gpu", lambda gpu=None: lambda result, budget: result)


def _peak(spec: RunSpec) -> int:
    """A peak that holds what each layer keeps, the rerun's one layer, and the floor's share of a rank."""
    roles = planned_roles(LAYERS, spec.every_n_layers)
    kept = sum(LAYER if role != "CP" else 0 if spec.offload else INPUT for role in roles)
    rerun = LAYER if "CP" in roles else 0
    return FLOOR // spec.world_size + kept + rerun + GIB // 3


class _Stub:
    """Stands for ckptlab.step.table.TableSimulation; records what was simulated."""

    calls: ClassVar[list[RunSpec]] = []

    def __init__(self, specs=()):
        pass

    def result(self, spec: RunSpec, progress=None):
        _Stub.calls.append(spec)
        return SimpleNamespace(spec=spec, memory=SimpleNamespace(peak_bytes=_peak(spec)), device_total=None)


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setattr(gpu_search, "TableSimulation", _Stub)
    monkeypatch.setattr(gpu_search, "parameter_floor", lambda spec: (FLOOR // spec.world_size, "bfloat16"))
    _Stub.calls = []
    return ScaleRequest("llama-3.1-8b", 4096, 1, "bfloat16", tuple(scale_settings(LAYERS)))


def test_the_leanest_holds_no_more_than_any_other_setting_and_nested_divisors_are_ordered():
    settings = scale_settings(LAYERS)
    assert all(holds_no_more(Setting(1, offload=True), other, LAYERS) for other in settings)
    assert holds_no_more(Setting(2), Setting(8), LAYERS) and not holds_no_more(Setting(8), Setting(2), LAYERS)
    assert not holds_no_more(Setting(1), Setting(1, offload=True), LAYERS)
    assert not holds_no_more(Setting(1, selective="attention"), Setting(2), LAYERS)  # its CP layers keep more


def test_the_answer_is_the_search_setting_by_settings_at_every_budget_in_fewer_simulations(stubbed):
    request = stubbed
    specs = [request.spec(setting, gpus) for setting in request.settings for gpus in COUNTS]
    peaks = sorted({_peak(spec) for spec in specs})
    budgets = sorted({budget for peak in peaks for budget in (peak - 1, peak)})
    totals = [0, 0]
    for budget in budgets:
        _Stub.calls = []
        new = cheapest_that_fits(request, budget, counts=COUNTS)
        new_calls = list(_Stub.calls)
        _Stub.calls = []
        before = cheapest_that_fits(request, budget, counts=COUNTS, by_floor=False)
        assert (new.gpus, new.setting) == (before.gpus, before.setting), budget
        assert new.simulated == len(new_calls) == len(set(new_calls)), budget
        refused = {count for count in COUNTS if FLOOR // count > budget}
        assert set(new.floor_refused) == refused and not any(spec.world_size in refused for spec in new_calls)
        # Past one GPU never more; on one GPU a cheap setting that fits costs the leanest's and a bisection's more.
        assert new.simulated <= before.simulated + (2 if new.gpus == 1 else 0), (budget, new.simulated)
        totals = [totals[0] + new.simulated, totals[1] + before.simulated]
    assert 3 * totals[0] < totals[1], totals


def test_without_a_leanest_setting_it_searches_setting_by_setting(stubbed):
    request = ScaleRequest("llama-3.1-8b", 4096, 1, "bfloat16", (Setting(None), Setting(4), Setting(8)))
    budget = _peak(request.spec(Setting(8), 16))
    found = cheapest_that_fits(request, budget, counts=COUNTS)
    before = cheapest_that_fits(request, budget, counts=COUNTS, by_floor=False)
    assert (found.gpus, found.setting) == (before.gpus, before.setting) == (16, Setting(8))
