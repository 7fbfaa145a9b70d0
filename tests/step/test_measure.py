"""Real steps on tiny models: observed reruns, resident memory, equivalence, offload, failures."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch

from ckptlab import build_model, list_presets, measure, planned_roles
from ckptlab.fact import Fact
from ckptlab.results import CPU_MEMORY_METHOD, CPU_TIME_METHOD, CUDA_MEMORY_METHOD, CUDA_TIME_METHOD, RunResult
from ckptlab.step.measure import OFFLOAD_ON_CPU_NOTE
from ckptlab.torchstate import thread_plan
from tests.conftest import FAST, requires_cuda

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

TINY = [preset.name for preset in list_presets() if preset.cpu_ok]


def _layer_input_bytes(result: RunResult) -> int:
    """batch x seq x hidden x bytes per element: one layer's input."""
    element = torch.tensor([], dtype=getattr(torch, result.dtype)).element_size()
    return result.spec.batch_size * result.spec.seq_len * result.model.hidden_size * element


@pytest.mark.parametrize("model", TINY)
def test_observed_reruns_equal_the_plan_for_every_tiny_preset(model, measured):
    num_layers = measured(model=model, seq_len=64).model.num_layers
    for every_n_layers in (1, 2, 3, num_layers + 1):
        result = measured(model=model, seq_len=64, every_n_layers=every_n_layers)
        planned = planned_roles(num_layers, every_n_layers)
        assert [layer.planned for layer in result.layers] == planned
        assert [layer.enabled for layer in result.layers] == planned
        assert [layer.observed for layer in result.layers] == planned
        assert all(layer.forward_calls == 1 for layer in result.layers)
        assert [layer.recompute_calls for layer in result.layers] == [int(role == "CP") for role in planned]
        assert result.plan_matches
        assert not any(note.key.startswith("note.plan_mismatch") for note in result.notes)


def test_checkpointing_off_reruns_nothing(measured):
    result = measured(every_n_layers=None)
    assert [layer.observed for layer in result.layers] == ["keep"] * 6
    assert result.plan_matches


def test_every_n_layers_larger_than_the_layer_count_is_said(measured):
    result = measured(every_n_layers=8)
    assert [layer.observed for layer in result.layers] == ["CP"] + ["keep"] * 5
    assert any(note.key == "note.only_first_layer" for note in result.notes)


def test_resident_activations_shrink_as_more_layers_are_checkpointed(measured):
    resident = {n: measured(every_n_layers=n).memory.after_forward_bytes for n in (None, 3, 2, 1)}
    assert resident[None] > resident[3] > resident[2] > resident[1]


def test_full_checkpointing_keeps_one_layer_input_per_layer(measured):
    """With n=1 each layer keeps exactly its input; the rest is the embeddings, the head and the loss.

    Each CP layer's saved bytes are exactly batch x seq x hidden x 4 (the input the checkpoint keeps),
    no tolerance. What else is resident after the forward, once the layers' saved bytes are taken
    away, is the same as in a run with checkpointing off, to the byte, after two differences that
    come from the layers' keyword arguments: the rotary cos/sin tables, which the off run saves
    inside L1 (L1 saves that much more than L2) and the n=1 run keeps in the checkpoints' closures;
    and the int64 position_ids (batch x seq x 8), which only those closures keep alive.
    """
    full, off = measured(every_n_layers=1), measured(every_n_layers=None)
    per_layer = _layer_input_bytes(full)
    assert [layer.saved_bytes for layer in full.layers] == [per_layer] * full.model.num_layers
    rest_full = full.memory.after_forward_bytes - sum(layer.saved_bytes for layer in full.layers)
    rest_off = off.memory.after_forward_bytes - sum(layer.saved_bytes for layer in off.layers)
    rotary_tables = off.layers[0].saved_bytes - off.layers[1].saved_bytes
    head_dim = full.model.hidden_size // 6
    assert rotary_tables == 2 * full.spec.seq_len * head_dim * 4  # cos and sin, (batch, seq, head_dim) float32
    position_ids = full.spec.batch_size * full.spec.seq_len * 8
    assert rest_full == rest_off + rotary_tables + position_ids
    # That rest is dominated by the loss's log-probabilities: batch x seq x vocab x 4 bytes.
    log_probs = full.spec.batch_size * full.spec.seq_len * 4096 * 4
    assert log_probs < rest_full < 1.5 * log_probs


def test_peak_and_baseline_are_consistent(measured):
    for n in (None, 1, 2):
        memory = measured(every_n_layers=n).memory
        assert memory.baseline_bytes >= measured().model.num_params * 4  # parameters are in the baseline
        assert memory.peak_bytes >= memory.baseline_bytes + memory.after_forward_bytes
        assert memory.peak_where.phase in {"forward", "loss", "backward", "optimizer"}
        assert memory.breakdown_at_peak["parameter"] == measured().model.num_params * 4


def test_a_lower_peak_needs_a_long_enough_sequence(measured):
    """The README's pitfall ("where the peak really is"), measured: memory freed after the forward is not always a lower peak.

    At 128 tokens the peak sits at the end of the backward, where the gradients of all
    parameters have arrived, and checkpointing does not lower it; at 512 tokens the activations
    dominate and full checkpointing lowers the peak.
    """
    short_full, short_off = measured(every_n_layers=1), measured(every_n_layers=None)
    assert short_full.memory.peak_bytes == short_off.memory.peak_bytes
    assert short_full.memory.peak_where.phase == "backward"
    long_full, long_off = measured(every_n_layers=1, seq_len=512), measured(every_n_layers=None, seq_len=512)
    assert long_full.memory.peak_bytes < long_off.memory.peak_bytes


def test_timing_has_medians_and_samples(measured):
    timing = measure(replace(FAST, repeats=3)).timing
    assert timing.threads == min(torch.get_num_threads(), thread_plan().device_threads)  # the workers' rule
    assert len(timing.step_samples) == 3
    assert timing.step_s == sorted(timing.step_samples)[1]
    assert 0 < timing.forward_s < timing.step_s
    assert timing.step_spread[0] <= timing.step_s <= timing.step_spread[1]


@pytest.mark.parametrize(
    "model, dropout",
    [
        ("tiny-llama", {"attention_dropout": 0.2}),
        ("tiny-gpt2", {"resid_pdrop": 0.2, "attn_pdrop": 0.2, "embd_pdrop": 0.2}),
    ],
)
@pytest.mark.parametrize("every_n_layers", [1, 2])
def test_checkpointing_changes_neither_loss_nor_gradients(model, dropout, every_n_layers):
    """Same seed, with and without checkpointing: equal loss and gradients, dropout on (RNG preserved)."""
    reference, _ = build_model(model, seed=0, config_overrides=dropout)
    checkpointed, _ = build_model(model, seed=0, config_overrides=dropout)
    checkpointed.activation_checkpointing_enable(every_n_layers=every_n_layers)
    ids = torch.randint(0, 4096, (2, 64), generator=torch.Generator().manual_seed(1))

    def loss_and_grads(m, seed=0):
        m.train()
        torch.manual_seed(seed)
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {name: p.grad.clone() for name, p in m.named_parameters()}
        m.zero_grad(set_to_none=True)
        return loss.detach(), grads

    loss, grads = loss_and_grads(reference)
    loss_cp, grads_cp = loss_and_grads(checkpointed)
    torch.testing.assert_close(loss_cp, loss)
    assert grads_cp.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_cp[name], grads[name], msg=name)
    # The dropout is really on: another seed gives another loss, so the equality above means something.
    assert not torch.equal(loss_and_grads(reference, seed=1)[0], loss)


def test_offload_on_the_cpu_completes_and_says_why_not(measured):
    result = measured(every_n_layers=2, offload=True)
    assert result.status == "ok"
    assert result.memory.offload_applied is False
    assert OFFLOAD_ON_CPU_NOTE in result.notes
    # What it would move: the inputs kept by the three checkpointed layers.
    assert result.memory.offload_bytes == 3 * _layer_input_bytes(result)
    moved = {"bytes": 3 * _layer_input_bytes(result), "layers": 3}
    assert Fact("note.offload_would_move", moved) in result.notes
    # It ran as plain checkpointing: the same resident memory as without offload.
    assert result.memory.after_forward_bytes == measured(every_n_layers=2).memory.after_forward_bytes


def test_result_says_what_it_is(measured):
    result = measured()
    assert result.provenance.kind == "measured-cpu"
    assert result.provenance.label.startswith("measured on the CPU")
    assert result.memory.method == CPU_MEMORY_METHOD
    assert result.timing.method == CPU_TIME_METHOD
    assert RunResult.from_dict(result.to_dict()) == result


def test_an_out_of_memory_step_is_a_result_and_the_next_run_works(monkeypatch, caplog):
    """A step that runs out of memory reports "does not fit", frees what it held, and the process goes on; the next
    run, as the README's script runs it, logs each of its phases at INFO (issue 58: 53 s with no output)."""
    measure_module = sys.modules["ckptlab.step.measure"]  # the module; ckptlab.measure is the function

    real_step = measure_module.train_step
    calls = {"n": 0}

    def failing_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(measure_module, "train_step", failing_step)
    result = measure(replace(FAST, warmup=1))
    assert result.status == "does_not_fit"
    assert result.memory is None and result.timing is None
    assert "Does not fit" in result.message and "seq_len=128" in result.message
    monkeypatch.setattr(measure_module, "train_step", real_step)
    with caplog.at_level("INFO", logger="ckptlab.progress"):
        assert measure(FAST).status == "ok"
    said = [record.getMessage() for record in caplog.records if record.name == "ckptlab.progress"]
    assert said[0].endswith("0% building tiny-llama (13.8M parameters, random weights)") and said[-1] == "100% done"
    assert len(said) == 2 + FAST.warmup + FAST.repeats + 1  # building, each step, the memory step, done: once each


@requires_cuda
def test_offload_on_cuda_moves_checkpointed_inputs_off_the_device():
    spec = replace(FAST, device="cuda", dtype="bfloat16", seq_len=1024, every_n_layers=1)
    plain, offloaded = measure(spec), measure(replace(spec, offload=True))
    assert offloaded.memory.offload_applied
    assert offloaded.provenance.kind == "measured-cuda"
    freed = plain.memory.after_forward_bytes - offloaded.memory.after_forward_bytes
    assert freed == pytest.approx(offloaded.memory.offload_bytes, rel=0.05)


@requires_cuda
def test_cuda_memory_comes_from_the_allocator():
    result = measure(replace(FAST, device="cuda"))
    assert result.memory.method == CUDA_MEMORY_METHOD
    assert result.timing.method == CUDA_TIME_METHOD
    assert result.memory.baseline_bytes >= result.model.num_params * 2


def test_a_reused_model_does_not_pile_up_embedding_hooks():
    """activation_checkpointing_enable adds an input-embeddings hook per call; measure removes the run's own."""
    spec = replace(FAST, seq_len=64)
    model, info = sys.modules["ckptlab.step.measure"].load_model(spec)
    for every_n_layers in (1, 2, 1, None):
        measure(replace(spec, every_n_layers=every_n_layers), model=model, info=info)
        assert len(model.get_input_embeddings()._forward_hooks) == 0
