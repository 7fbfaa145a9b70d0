"""A plan's step replayed from the stretches of shallow steps (ckptlab.step.replay): every figure is simulate(fast=False)'s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ckptlab import RunSpec
from ckptlab.model.plan import CP, KEEP
from ckptlab.results.allocations import STRETCHES_REPLAYED, WHOLE_STEP
from ckptlab.step import replay
from ckptlab.step.fold import NotDerivable
from ckptlab.step.simulate import prepare, simulate
from ckptlab.step.table import TableSimulation, simulate_table

pytestmark = pytest.mark.slow  # simulations: `pytest -m 'not slow'` skips them

REPLAYED = "note.replayed"
NO_ORDER = "note.allocation_order_not_replayed"
# Six layers: 5 checkpoints the last layer too, 6 only the first.
SETTINGS = [(None, False), (1, False), (1, True), (2, False), (3, False), (5, False), (6, False)]
# Each kind of plan once (off, one role, both roles, a checkpointed last layer), for the cases whose difference is
# the model's structure or Trainer's side of the step, not the plan: every plan of SETTINGS runs on the dense case.
FEW = [(None, False), (1, False), (2, False), (5, False)]
TIED = [(1, False), (2, False), (3, False)]  # plans whose shallow steps hold three depths on four layers


def _figures(result):
    """Everything a replayed result must share with the exact one, event by event and layer by layer."""
    memory = result.memory
    timeline = [
        (p.order, p.kind, p.phase, p.layer, p.rerun, p.event, p.micro_batch, p.current_bytes, p.region_peak_bytes)
        for p in memory.timeline
    ]
    details = [(p.region_peak_breakdown, p.region_peak_logits_bytes) for p in memory.timeline]
    return replace(memory, timeline=[]), timeline, details, result.layers


def _keys(result) -> list[str]:
    return [note.key for note in result.notes]


# (model, spec fields, settings): each structurally different model (a dense decoder, GPT-2's Conv1D, BERT's encoder,
# MoE) in bfloat16, and Trainer's side of the step, LoRA, offload and selective policies on one of them; tiny-qwen3
# is a dense decoder as tiny-llama is, so it runs with the options rather than alone (issue 42). Mixed precision is
# fp16's case: bf16 autocast takes the same code (ckptlab.step.trainstep._forward_loss, autocast to a 2-byte dtype,
# the logits back in float32), and the replay never reads the dtype (its stretches are byte counts); fp16 adds the
# grad scaler and two micro-batches on top. FSDP2 ranks take the fold, setting by setting (tests/step/test_fsdp.py
# proves the fold exact there). tiny-qwen3 runs on 6 of its 8 layers (the shallower fixture): the layers a setting
# of FEW is written for, at three quarters of the operations.
SIX_QWEN3 = ("tiny-qwen3", 6)
CASES = {
    "llama": ("tiny-llama", {"dtype": "bfloat16"}, SETTINGS),
    "gpt2": ("tiny-gpt2", {"dtype": "bfloat16"}, FEW),
    "bert": ("tiny-bert", {"dtype": "bfloat16"}, FEW),
    "moe": ("tiny-qwen3-moe", {"dtype": "bfloat16"}, FEW),
    "float32 lora": (SIX_QWEN3, {"lora_rank": 8}, FEW),
    "fp16 accumulation": ("tiny-llama", {"mixed_precision": "fp16", "gradient_accumulation_steps": 2}, FEW),
    "offload everywhere": (SIX_QWEN3, {"offload": True}, [(1, True), (2, True), (3, True)]),
    "selective": ("tiny-llama", {"selective": "matmuls"}, [(1, False), (1, True), (2, False), (4, True)]),
    # Tied embeddings (qwen3-0.6b, gemma, llama 3.2 1B): no state outside the layers sits between AdamW's decayed and
    # not decayed groups, so a deeper step adds both groups' blocks as one run of events (issue 60/61).
    "tied qwen3": (("tiny-qwen3", 4, {"tie_word_embeddings": True}), {"dtype": "bfloat16"}, TIED),
}
# The cases whose every setting's order of allocations composes from the shallow steps' (ckptlab.step.replay_order);
# the others' settings say they do not where they do not, and the device total simulates them for their order.
ORDER_COMPOSED = {"llama", "gpt2", "bert", "moe", "tied qwen3"}


@pytest.mark.parametrize("case", list(CASES))  # every setting simulated layer by layer too, to compare
def test_every_replayed_setting_has_the_exact_simulations_bytes(case, shallower):
    model, fields, settings = CASES[case]
    if isinstance(model, tuple):  # (preset, layers[, config fields]): the preset cut to so many layers
        model = shallower(*model[:2], **(model[2] if len(model) > 2 else {}))
    base = RunSpec(model=model, seq_len=64, batch_size=1, **{"dtype": "float32", **fields})
    specs = [replace(base, every_n_layers=n, offload=offload) for n, offload in settings]
    seen: list[float] = []
    derived = simulate_table(specs, progress=lambda message, fraction: seen.append(fraction))
    assert seen == sorted(seen) and seen[-1] == 1.0
    for spec, result in zip(specs, derived):
        exact = simulate(spec, fast=False, allocations=True)
        assert REPLAYED in _keys(result), f"{spec}: {_keys(result)}"
        assert _figures(result) == _figures(exact), spec
        assert result.work == exact.work is not None, spec  # every op's FLOPs and bytes, by phase and layer
        # The notes are the exact simulation's but for how the layers were simulated (and their order, where not).
        assert [key for key in _keys(result) if key not in (REPLAYED, NO_ORDER)] == _keys(exact)
        # The order of allocations the device total replays: every birth, free and resize, event for event.
        order, whole = result.allocations, exact.allocations
        assert whole is not None and (order is None) == (NO_ORDER in _keys(result))
        assert order is not None or case not in ORDER_COMPOSED, spec
        if order is not None:
            assert (order.how, whole.how) == (STRETCHES_REPLAYED, WHOLE_STEP)
            assert (order.sizes, order.streams, order.events, order.thread_starts) == (
                whole.sizes,
                whole.streams,
                whole.events,
                whole.thread_starts,
            ), spec


def test_a_table_records_each_kind_of_stretch_once():
    """Checkpointing off, n=1, its offload twin and three settings of both roles: four shallow steps of 13 layers."""
    base = RunSpec(model="tiny-llama", seq_len=32, batch_size=1, dtype="float32")
    settings = [(None, False), (1, False), (1, True), (2, False), (3, False), (6, False)]  # none checkpoints L6
    specs = [replace(base, every_n_layers=n, offload=offload) for n, offload in settings]
    table = TableSimulation(specs)
    results = [table.result(spec) for spec in specs]
    assert all(REPLAYED in _keys(result) for result in results)
    # off: keep x3; n=1: CP x2 (its middle layer from the step of both roles); n=1 with offload: CP x3;
    # n=2, 3 and 6: CP keep CP keep keep.
    assert table.simulated_layers == 3 + 2 + 3 + 5
    assert [layer.planned for layer in results[4].layers] == [CP, KEEP, KEEP, CP, KEEP, KEEP]
    assert [layer.observed for layer in results[4].layers] == [CP, KEEP, KEEP, CP, KEEP, KEEP]
    # Asked alone, a setting of one role records three layers, and one more for what grows with the depth.
    alone = TableSimulation()
    alone.result(replace(base, every_n_layers=1))
    assert alone.simulated_layers == 3 + 4
    # A checkpointed last layer among both roles: the ends of CP keep CP, three layers more.
    table.result(replace(base, every_n_layers=5))
    assert table.simulated_layers == 3 + 2 + 3 + 5 + 3


@pytest.mark.parametrize("refused", ["replay", "fsdp2"])
def test_a_group_the_replay_cannot_give_takes_the_fold_setting_by_setting(monkeypatch, refused):
    spec = RunSpec(model="tiny-llama", seq_len=32, batch_size=1, dtype="float32", every_n_layers=2)
    if refused == "replay":

        def refuse(spec, roles, sources):
            raise NotDerivable("for the test")

        monkeypatch.setattr(replay, "derive", refuse)
    else:
        spec = replace(spec, world_size=2, fsdp=True)
    result = TableSimulation().result(spec)
    folded = simulate(spec)
    assert REPLAYED not in _keys(result) and _keys(result) == _keys(folded)
    assert _figures(result) == _figures(folded)


@pytest.fixture(scope="module")
def recorded():
    """The steps a table of n=1 and n=2 records for tiny-llama, and what to derive from them."""
    spec = RunSpec(model="tiny-llama", seq_len=32, batch_size=1, dtype="float32", every_n_layers=1)
    _, dtype, config, task = prepare(spec)
    steps = [replay.record(config, task, spec, dtype, plan) for plan in ((CP, CP), (CP, KEEP, CP, KEEP, KEEP))]
    return spec, steps


def test_steps_that_disagree_on_a_kind_of_stretch_are_refused(recorded):
    """The premise is checked where two steps hold the same kind of stretch: here the first layer's forward."""
    spec, steps = recorded
    roles = (CP, KEEP, CP, KEEP, CP, KEEP)
    replay.derive(replace(spec, every_n_layers=2), roles, replay.Sources(steps, steps))  # as recorded: they agree
    first = steps[0]
    (end, parts), *rest = first.stretches[1]  # the first layer's forward
    tampered = {**parts, ("local",): {**parts.get(("local",), {}), "Activation": 1}}
    stretches = (first.stretches[0], ((end, tampered), *rest), *first.stretches[2:])
    bad = replace(first, stretches=stretches)
    with pytest.raises(NotDerivable, match="differ"):
        replay.Sources([bad, steps[1]], steps)


def test_a_layer_further_away_than_its_neighbours_is_refused(recorded):
    _, steps = recorded
    mixed = steps[1]
    end, parts = mixed.stretches[-4][0]  # a layer's backward, near the end of the step
    assert mixed.step.memory.timeline[-4].layer is not None
    tampered = {**parts, ("near", "far"): {"Temp": -8}}
    bad = replace(
        mixed, stretches=(*mixed.stretches[:-4], ((end, tampered), *mixed.stretches[-4][1:]), *mixed.stretches[-3:])
    )
    with pytest.raises(NotDerivable, match="two or more away"):
        replay.Sources([steps[0], bad], steps)


def test_what_grows_with_the_depth_needs_two_depths_and_grows_evenly(recorded):
    _, steps = recorded
    with pytest.raises(NotDerivable, match="two depths"):
        replay.Sources(steps, steps[:1])
    three = replace(steps[0], roles=(CP, CP, CP))  # a third depth that does not lie on the line of the other two
    with pytest.raises(NotDerivable, match="not affine at 3 layers"):
        replay.Sources(steps, [*steps, three])
