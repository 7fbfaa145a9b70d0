"""The lesson's sharding idea, on the simulations it is drawn from: sharding divides the state, checkpointing the activations."""

from __future__ import annotations

import pytest

from ckptlab.lab import learn, store
from ckptlab.lab.learn import SHARDING, SHARDING_GPUS, per_gpu_parts, sharding_idea, sharding_specs
from ckptlab.lab.store import ResultStore


@pytest.fixture(scope="module")
def idea():
    """The lesson's own configuration (qwen3-0.6b, 1024 tokens; about 25 s on 2 cores), kept for the process."""
    return sharding_idea()


def test_the_specs_are_off_and_every_layer_at_each_gpu_count_fsdp_past_one():
    specs = sharding_specs()
    assert [(s.world_size, s.fsdp, s.every_n_layers) for s in specs] == [
        (1, False, None), (1, False, 1), (2, True, None), (2, True, 1), (4, True, None), (4, True, 1)
    ]  # fmt: skip
    assert all(s.model == SHARDING.model and s.optimizer == "adamw" for s in specs)


def test_sharding_divides_parameters_gradients_and_optimizer_state(idea):
    for every_n_layers in (None, 1):
        one = idea.bar(1, every_n_layers).parts
        for gpus in SHARDING_GPUS[1:]:
            shard = idea.bar(gpus, every_n_layers).parts
            for part in ("parameter", "gradient", "optimizer_state"):
                assert shard[part] == pytest.approx(one[part] / gpus, rel=0.01), (gpus, every_n_layers, part)
    assert idea.state_ratio == pytest.approx(1 / max(SHARDING_GPUS), rel=0.01)


def test_checkpointing_divides_the_activations_and_sharding_does_not(idea):
    for gpus in SHARDING_GPUS:
        off, on = idea.bar(gpus, None).parts, idea.bar(gpus, 1).parts
        assert on["activation"] < 0.6 * off["activation"]  # checkpointing every layer: under 60% on any GPU count
        assert on["parameter"] == off["parameter"] and on["optimizer_state"] == off["optimizer_state"]
    one = idea.bar(1, None).parts["activation"]
    assert all(idea.bar(g, None).parts["activation"] == pytest.approx(one, rel=0.03) for g in SHARDING_GPUS)
    assert idea.activation_ratio_checkpointing < 0.6 and idea.activation_ratio_gpus == pytest.approx(1, rel=0.03)
    assert 0 < idea.gathered_bytes < idea.bar(1, None).parts["parameter"]  # one layer and the root, not the model


def test_every_bar_is_a_simulation_and_is_reused(idea, monkeypatch):
    assert {bar.result.provenance.kind for bar in idea.bars} == {"simulated"}
    assert all(bar.parts == per_gpu_parts(bar.result) for bar in idea.bars)
    monkeypatch.setattr(store, "simulate_table", lambda *a, **k: pytest.fail("simulated again"))
    assert sharding_idea().bars[0].result is idea.bars[0].result  # kept for the process: a workshop waits once


def test_what_the_shared_store_lacks_is_simulated_as_one_table_and_kept_there(monkeypatch):
    assert learn.simulated is store.simulated  # one bounded store for the simulations of every page, one way in
    kept: ResultStore = ResultStore(lambda result: 1, max_entries=4)
    monkeypatch.setattr(store, "SIMULATIONS", kept)
    tables: list[list] = []

    def table(specs, progress=None):
        tables.append(list(specs))
        return [f"result {index}" for index, _ in enumerate(specs)]

    monkeypatch.setattr(store, "simulate_table", table)
    specs = sharding_specs()
    assert learn.simulated(specs[:3]) == {spec: f"result {i}" for i, spec in enumerate(specs[:3])}
    again = learn.simulated(specs)
    assert tables == [specs[:3], specs[3:]]  # off and on of a GPU count in one table; the kept ones not again
    assert again[specs[0]] == "result 0" and len(kept) == 4  # bounded: the store holds at most its entries
