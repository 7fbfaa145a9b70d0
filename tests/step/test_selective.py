"""Selective activation checkpointing: what a policy keeps, measured, observed, simulated, and unchanged gradients."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ckptlab import RunSpec, SpecError, measure, simulate
from ckptlab.model import catalog
from ckptlab.model.selective import SelectivePolicy, enable_checkpointing, op_name
from ckptlab.results import RunResult
from ckptlab.step.equivalence import check_gradients
from ckptlab.step.trainstep import random_batch
from tests.model.test_folders import config_folder

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

CPU_ATTENTION = "aten._scaled_dot_product_flash_attention_for_cpu"
# A test-made architecture: GQA (4 query heads, 2 key/value heads), head_dim 24 (not hidden / heads).
SHAPE = {
    "num_hidden_layers": 3,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "vocab_size": 256,
}
SEQ, BATCH = 80, 2


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> str:
    return str(config_folder(tmp_path_factory.mktemp("sac") / "model", **SHAPE))


def _spec(model: str, **changes) -> RunSpec:
    base = RunSpec(
        model=model, seq_len=SEQ, batch_size=BATCH, dtype="float32", device="cpu", optimizer="none", repeats=1, warmup=1
    )
    return replace(base, **changes)


def _attention_output_bytes() -> int:
    """The CPU flash op's outputs, from the shape: the output (b, s, heads, d) and the logsumexp (b, heads, s), float32."""
    heads, head_dim = SHAPE["num_attention_heads"], SHAPE["head_dim"]
    return BATCH * SEQ * heads * head_dim * 4 + BATCH * heads * SEQ * 4


def test_keeping_the_attention_adds_exactly_its_outputs_after_the_forward(made):
    plain = measure(_spec(made, every_n_layers=1))
    kept = measure(_spec(made, every_n_layers=1, selective="attention"))
    layers = SHAPE["num_hidden_layers"]
    extra = kept.memory.after_forward_bytes - plain.memory.after_forward_bytes
    assert extra == layers * _attention_output_bytes()
    assert extra == sum(layer.kept_bytes for layer in kept.layers)
    assert (
        kept.memory.breakdown_after_forward["activation"] - plain.memory.breakdown_after_forward["activation"] == extra
    )
    assert all(layer.kept_ops == {CPU_ATTENTION: 1} for layer in kept.layers)
    assert kept.plan_matches and not [
        n for n in kept.notes if n.key.startswith("note.plan_mismatch") or n.key == "note.selective_matched_nothing"
    ]


def test_simulate_equals_the_run_within_3_percent_per_category(made):
    spec = _spec(made, every_n_layers=1, selective="attention", optimizer="adamw")
    run, sim = measure(spec), simulate(spec, fast=False)
    assert [layer.kept_bytes for layer in sim.layers] == [layer.kept_bytes for layer in run.layers]
    assert [layer.reused_ops for layer in sim.layers] == [layer.reused_ops for layer in run.layers]
    for name in ("breakdown_after_forward", "breakdown_at_peak"):
        measured, simulated = getattr(run.memory, name), getattr(sim.memory, name)
        for category, amount in measured.items():
            assert simulated.get(category, 0) == pytest.approx(amount, rel=0.03), (name, category)
    assert sim.memory.after_forward_bytes == pytest.approx(run.memory.after_forward_bytes, rel=0.03)


class _Dispatched(TorchDispatchMode):
    """Counts the ops that really run below SAC's recompute mode (entered before the backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[op_name(func)] += 1
        return func(*args, **(kwargs or {}))


def _backward_ops(model: str, selective: str) -> Counter[str]:
    """The forward ops dispatched during the backward of one step: what the reruns ran again."""
    spec = _spec(model, every_n_layers=1, selective=selective)
    built, _ = catalog.build_model(model, dtype=torch.float32, device=torch.device("cpu"), seed=0)
    built.train()
    enable_checkpointing(built, 1, False, selective)
    batch = random_batch(built, spec, torch.device("cpu"))
    loss = built(**batch).loss
    counter = _Dispatched()
    with counter:
        loss.backward()
    return counter.ops


def test_the_backward_runs_the_attention_zero_times_again_and_the_rest_of_the_layer_again(made):
    layers = SHAPE["num_hidden_layers"]
    plain, kept = _backward_ops(made, "none"), _backward_ops(made, "attention")
    assert plain[CPU_ATTENTION] == layers  # plain checkpointing: every rerun runs the attention again
    assert kept[CPU_ATTENTION] == 0  # kept: no rerun runs it
    assert kept["aten.mm"] == plain["aten.mm"] > 0  # the projections still run again (and their gradients)
    # The lab's own observation says the same, per layer.
    result = measure(_spec(made, every_n_layers=1, selective="attention"))
    for layer in result.layers:
        assert layer.recompute_calls == 1
        assert CPU_ATTENTION not in layer.rerun_ops and layer.reused_ops == {CPU_ATTENTION: 1}
        assert layer.rerun_ops["aten.mm"] >= 6  # q, k, v, o, gate, up (the rerun stops before down_proj)


def test_every_n_layers_two_keeps_only_in_the_checkpointed_layers(made):
    result = measure(_spec(made, every_n_layers=2, selective="attention"))
    assert [layer.enabled for layer in result.layers] == ["CP", "keep", "CP"]
    assert [layer.kept_bytes for layer in result.layers] == [_attention_output_bytes(), 0, _attention_output_bytes()]
    assert result.plan_matches


def test_matmuls_keep_every_projection_and_torchtitan_every_other_mm(made):
    matmuls = measure(_spec(made, every_n_layers=1, selective="matmuls"))
    assert matmuls.layers[0].kept_ops == {"aten.mm": 7, CPU_ATTENTION: 1}
    assert "aten.mm" not in matmuls.layers[0].rerun_ops  # every mm the rerun met came from the cache
    titan = measure(_spec(made, every_n_layers=1, selective="torchtitan"))
    assert titan.layers[0].kept_ops == {"aten.mm": 4}  # 1st, 3rd, 5th and 7th of 7; no CPU attention op listed
    assert titan.layers[0].rerun_ops[CPU_ATTENTION] == 1


def test_op_names_from_python_keep_those_ops_and_read_back_from_json(made):
    result = measure(_spec(made, every_n_layers=1, selective=("aten.mm.default",)))
    assert result.layers[0].kept_ops == {"aten.mm": 7}
    again = RunResult.from_dict(result.to_dict())
    assert again.spec.selective == ("aten.mm.default",) and again.layers == result.layers
    assert again.plan_matches


@pytest.mark.parametrize(
    "selective, key",
    [("attentions", "spec.not_one_of"), (("aten.nosuch_op",), "spec.selective_op"), (("mm",), "spec.selective_op")],
)
def test_an_unknown_policy_or_op_is_one_keyed_error_naming_it(selective, key):
    with pytest.raises(SpecError) as caught:
        RunSpec(selective=selective).validate()
    assert caught.value.key == key
    named = selective if isinstance(selective, str) else selective[0]
    assert named in str(caught.value)


def test_a_policy_with_checkpointing_off_is_refused():
    with pytest.raises(SpecError) as caught:
        RunSpec(every_n_layers=None, selective="attention").validate()
    assert caught.value.key == "spec.selective_without_checkpointing"


def test_gradients_are_bit_equal_with_dropout_in_the_mlp_and_residual():
    # GPT-2: resid_pdrop and embd_pdrop on, attention dropout off so SDPA keeps its fused CPU op.
    for selective in ("attention", "matmuls"):
        check = check_gradients(
            RunSpec(model="tiny-gpt2", seq_len=64, batch_size=2, every_n_layers=1, selective=selective),
            attention_dropout=0.0,
        )
        assert check.equal and check.gradients_compared > 0, selective


def test_attention_dropout_keeps_nothing_says_so_loudly_and_leaves_gradients_equal():
    """The decision (ckptlab.model.selective): SDPA's math path has no attention op, so nothing is kept, loudly."""
    spec = RunSpec(model="tiny-gpt2", seq_len=64, every_n_layers=1, selective="attention", optimizer="none")
    assert check_gradients(replace(spec, batch_size=2)).equal  # attention dropout 0.1 too
    built, info = catalog.build_model(
        "tiny-gpt2", dtype=torch.float32, device=torch.device("cpu"), seed=0, config_overrides={"attn_pdrop": 0.1}
    )
    result = measure(replace(spec, repeats=1, warmup=1), model=built, info=info)
    assert all(layer.kept_bytes == 0 and not layer.kept_ops for layer in result.layers)
    assert not result.plan_matches
    assert any(getattr(note, "key", "") == "note.selective_matched_nothing" for note in result.notes)
    # "matmuls" keeps the math path's products instead.
    matmuls = measure(replace(spec, selective="matmuls", repeats=1, warmup=1), model=built, info=info)
    assert matmuls.layers[0].kept_ops.get("aten.bmm") == 2 and matmuls.plan_matches


def test_with_lora_the_policy_keeps_the_same_attention(made):
    full = measure(_spec(made, every_n_layers=1, selective="attention"))
    lora = measure(_spec(made, every_n_layers=1, selective="attention", lora_rank=4))
    assert [layer.kept_bytes for layer in lora.layers] == [layer.kept_bytes for layer in full.layers]
    assert lora.plan_matches


def test_simulated_offload_leaves_what_the_policy_kept_on_the_device(made):
    # A simulation for a CUDA device: offload applies there (a simulation of the CPU has none to make).
    spec = _spec(made, every_n_layers=1, offload=True, optimizer="adamw", device="cuda")
    plain, kept = simulate(spec, fast=False), simulate(replace(spec, selective="attention"), fast=False)
    extra = SHAPE["num_hidden_layers"] * _attention_output_bytes()
    assert kept.memory.after_forward_bytes - plain.memory.after_forward_bytes == extra  # on the device
    assert kept.memory.host_offload_bytes == plain.memory.host_offload_bytes > 0  # only the inputs moved
    assert any(getattr(note, "key", "") == "note.selective_offload" for note in kept.notes)


def test_simulated_fsdp_keeps_the_attention_of_every_layer(made):
    result = simulate(_spec(made, every_n_layers=1, selective="attention", world_size=2, fsdp=True), fast=False)
    assert [layer.kept_bytes for layer in result.layers] == [_attention_output_bytes()] * SHAPE["num_hidden_layers"]
    assert result.plan_matches


def test_the_fast_simulation_extrapolates_what_the_policy_kept():
    spec = RunSpec(model="qwen3-0.6b", seq_len=256, every_n_layers=1, selective="attention", optimizer="none")
    fast, exact = simulate(spec), simulate(spec, fast=False)
    assert fast.memory.after_forward_bytes == exact.memory.after_forward_bytes
    assert [layer.kept_bytes for layer in fast.layers] == [layer.kept_bytes for layer in exact.layers]
    # qwen3-0.6b: 16 heads x 128 = 2048 = twice the hidden size per token, bf16, plus a float32 logsumexp.
    assert exact.layers[0].kept_bytes == 256 * 16 * 128 * 2 + 16 * 256 * 4


def test_a_policy_object_refuses_bad_names_too():
    with pytest.raises(SpecError):
        SelectivePolicy(("aten.mm", "aten.no_such"))


def test_with_the_trainer_settings_the_policy_keeps_one_micro_batchs_attention(made):
    """Gradient accumulation and clipping (main's Trainer step): what is kept is counted for one micro-batch."""
    one = measure(_spec(made, every_n_layers=1, selective="attention", optimizer="sgd"))
    accumulated = measure(
        _spec(made, every_n_layers=1, selective="attention", optimizer="sgd", gradient_accumulation_steps=2)
    )
    assert [layer.kept_bytes for layer in accumulated.layers] == [_attention_output_bytes()] * SHAPE[
        "num_hidden_layers"
    ]
    assert [layer.kept_ops for layer in accumulated.layers] == [layer.kept_ops for layer in one.layers]
    assert all(layer.recompute_calls == 2 for layer in accumulated.layers) and accumulated.plan_matches


def test_under_bf16_autocast_the_policy_keeps_the_attention_in_bf16(made):
    result = measure(_spec(made, every_n_layers=1, selective="attention", optimizer="sgd", mixed_precision="bf16"))
    heads, head_dim = SHAPE["num_attention_heads"], SHAPE["head_dim"]
    bf16 = BATCH * SEQ * heads * head_dim * 2 + BATCH * heads * SEQ * 4  # the output in bf16, the logsumexp float32
    assert [layer.kept_bytes for layer in result.layers] == [bf16] * SHAPE["num_hidden_layers"]
    assert result.plan_matches
