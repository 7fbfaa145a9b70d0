"""A table of settings as one computation (ckptlab.step.table): every derived figure is simulate(fast=False)'s.

These tests take the pairwise derivation, the table's way where the replay (``tests/step/test_replay.py``) cannot
give a group: FSDP2 ranks, and models whose steps break the replay's premise.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab import RunSpec
from ckptlab.model.plan import CP, KEEP
from ckptlab.step import table as table_module
from ckptlab.step.simulate import simulate
from ckptlab.step.table import NotDerivable, TableSimulation, simulate_table

DERIVED = "note.derived_from_roles"


@pytest.fixture(autouse=True)
def pairwise(monkeypatch):
    """No replay: every group takes the pairwise derivation."""

    def refuse(self, *args, **kwargs):
        raise NotDerivable("the pairwise derivation under test")

    monkeypatch.setattr(TableSimulation, "_replayed", refuse)


def _figures(result):
    """Everything a derived result must share with the exact one, event by event and layer by layer."""
    memory = result.memory
    timeline = [
        (p.order, p.kind, p.phase, p.layer, p.rerun, p.event, p.micro_batch, p.current_bytes, p.region_peak_bytes)
        for p in memory.timeline
    ]
    breakdowns = [p.region_peak_breakdown for p in memory.timeline]
    summary = replace(memory, timeline=[])
    return summary, timeline, breakdowns, result.layers, result.ranks and result.ranks[0].memory.peak_bytes


def _keys(result) -> list[str]:
    return [note.key for note in result.notes]


# (model, spec fields, settings as (every_n_layers, offload), the settings not derived): dense, MoE and
# FSDP ranks, accumulation with mixed precision, a selective policy; each with offload and an
# every_n_layers of at least half the layers. Under FSDP2 the first step of a process holds more in
# its gradient norm than the later ones: a check step sees it and the steps are simulated again.
CASES = {
    "dense": (
        "tiny-llama",
        {},
        [(None, False), (1, False), (1, True), (2, False), (3, True), (4, False), (6, False)],
        [],
    ),
    "moe": ("tiny-qwen3-moe", {}, [(None, False), (1, True), (2, False), (3, False), (4, True)], []),
    "fsdp": (
        "tiny-llama",
        {"world_size": 2, "fsdp": True},
        [(None, False), (1, True), (2, False), (3, False)],
        [],
    ),
    # Trainer's side of the step and a selective policy: fields of the spec that every setting shares.
    "accumulation": (
        "tiny-llama",
        {"gradient_accumulation_steps": 2, "mixed_precision": "bf16"},
        [(None, False), (1, True), (2, False), (4, False)],
        [],
    ),
    "selective": ("tiny-llama", {"selective": "matmuls"}, [(1, False), (3, True), (4, False)], []),
}


@pytest.mark.slow  # every setting simulated layer by layer too, to compare
@pytest.mark.parametrize("case", list(CASES))
def test_every_derived_setting_has_the_exact_simulations_bytes(case):
    model, fields, settings, simulated = CASES[case]
    base = RunSpec(model=model, seq_len=64, batch_size=1, dtype="float32", **fields)
    specs = [replace(base, every_n_layers=n, offload=offload) for n, offload in settings]
    seen: list[float] = []
    derived = simulate_table(specs, progress=lambda message, fraction: seen.append(fraction))
    assert seen == sorted(seen) and seen[-1] == 1.0
    for setting, spec, result in zip(settings, specs, derived):
        exact = simulate(spec, fast=False)
        assert (DERIVED in _keys(result)) == (setting not in simulated), f"{setting}: {_keys(result)}"
        assert result.memory.peak_bytes == exact.memory.peak_bytes
        assert result.memory.after_forward_bytes == exact.memory.after_forward_bytes
        assert result.memory.peak_where == exact.memory.peak_where
        assert [p.current_bytes for p in result.memory.timeline] == [p.current_bytes for p in exact.memory.timeline]
        assert _figures(result) == _figures(exact), spec
        # The notes are the exact simulation's but for how the layers were simulated.
        assert [key for key in _keys(result) if key != DERIVED] == _keys(exact)


def test_the_settings_share_their_shallow_steps():
    base = RunSpec(model="tiny-llama", seq_len=32, batch_size=1, dtype="float32")
    table = TableSimulation()
    results = [table.result(replace(base, every_n_layers=n)) for n in (1, 2, 3)]
    # n=1: [CP CP CP] and [CP CP CP CP], the fold's steps (no check step: simulate trusts them too);
    # n=2 and n=3 share [CP r keep], [CP a b keep].
    assert table.simulated_layers == 3 + 4 + 2 * 3 + 4 * 4
    assert all(DERIVED in _keys(result) for result in results)
    assert [layer.planned for layer in results[2].layers] == [CP, KEEP, KEEP, CP, KEEP, KEEP]
    assert [layer.observed for layer in results[2].layers] == [CP, KEEP, KEEP, CP, KEEP, KEEP]
    # Only the first layer checkpointed: [CP keep keep] and [CP keep keep keep] are simulated already, and the
    # steps with a CP in the middle check them (no check step).
    again = table.result(replace(base, every_n_layers=6))
    assert table.simulated_layers == 29 and DERIVED in _keys(again)
    alone = TableSimulation()
    alone.result(replace(base, every_n_layers=6))
    assert alone.simulated_layers == 3 + 4  # alone, the fold's two steps
    # Under FSDP2 a step can differ by its order in the process: there a single role has its check step.
    sharded = TableSimulation()
    sharded.result(replace(base, every_n_layers=6, world_size=2, fsdp=True))
    # (Simulated twice where it was the process's first FSDP2 step and the check failed once.)
    assert {plan for _, plan in sharded._steps} == {(CP, KEEP, KEEP), (CP, KEEP, KEEP, KEEP), (CP, *[KEEP] * 4)}


def test_a_setting_that_cannot_be_derived_is_simulated(monkeypatch):
    def refuse(roles, steps):
        raise NotDerivable("for the test")

    monkeypatch.setattr(table_module, "derive", refuse)
    spec = RunSpec(model="tiny-llama", seq_len=32, batch_size=1, dtype="float32", every_n_layers=2)
    result = TableSimulation().result(spec)
    assert DERIVED not in _keys(result)
    assert result.memory.peak_bytes == simulate(spec).memory.peak_bytes


def test_shallow_steps_that_do_not_add_up_are_refused():
    """The premise is checked: a figure outside the middle must grow by the same amount in every shallow step."""
    spec = RunSpec(model="tiny-llama", seq_len=32, batch_size=1, dtype="float32", every_n_layers=2)
    table = TableSimulation()
    table.result(spec)
    group = table_module._group(spec)
    steps = {plan: step for (spec_, plan), step in table._steps.items() if spec_ == group}
    roles = (CP, KEEP, CP, KEEP, CP, KEEP)
    table_module.derive(roles, steps)  # as simulated: it adds up
    plan = (CP, KEEP, KEEP, KEEP)
    tampered = replace(steps[plan].memory, after_forward_bytes=steps[plan].memory.after_forward_bytes + 1)
    steps[plan] = replace(steps[plan], memory=tampered)
    with pytest.raises(NotDerivable, match="add up"):
        table_module.derive(roles, steps)
