"""The attention implementation as a setting: eager keeps each layer's probabilities, SDPA a logsumexp instead."""

from __future__ import annotations

import pytest
import torch

from ckptlab import RunSpec, measure, simulate
from ckptlab.model import catalog
from ckptlab.results import RunResult
from ckptlab.step.trainstep import random_batch
from tests.model.test_folders import config_folder

pytestmark = pytest.mark.slow  # real steps and simulations

# A test-made llama without dropout (SDPA with attention dropout takes the CPU's math path and keeps the
# probabilities too), no GQA (eager's repeat_kv would copy keys and values).
SHAPE = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "vocab_size": 256,
    "attention_dropout": 0.0,
}
SEQ = 48


def test_eager_keeps_the_probabilities_sdpa_a_logsumexp_measured_simulated_and_same_gradients(tmp_path):
    model = str(config_folder(tmp_path / "llama", **SHAPE))
    spec = RunSpec(
        model=model, seq_len=SEQ, dtype="float32", device="cpu", every_n_layers=None, optimizer="none", repeats=1
    )
    heads, layers = SHAPE["num_attention_heads"], SHAPE["num_hidden_layers"]
    # Eager keeps heads x seq^2 float32 probabilities a layer; SDPA's CPU flash path keeps a float32 logsumexp of
    # heads x seq instead (both keep q, k, v and the output, which o_proj's input shares).
    expected = layers * heads * (SEQ**2 - SEQ) * 4
    resident = {}
    for attention in ("sdpa", "eager"):
        run_spec = RunSpec(**{**spec.to_dict(), "attn_implementation": attention, "warmup": 0})
        measured, simulated = measure(run_spec), simulate(run_spec, fast=False)
        assert RunResult.from_dict(measured.to_dict()).spec == measured.spec  # the JSON keeps the attention
        assert not [note for note in measured.notes if note.key == "note.attention_kept"]
        resident[attention] = (measured.memory.after_forward_bytes, simulated.memory.after_forward_bytes)
        # Observed per layer: what the attention kept, the probabilities (eager), the output and logsumexp (SDPA).
        head_dim = SHAPE["head_dim"]
        kept = heads * SEQ * SEQ * 4 if attention == "eager" else SEQ * heads * head_dim * 4 + heads * SEQ * 4
        for result in (measured, simulated):
            assert [layer.attention_bytes for layer in result.layers] == [kept] * layers, (attention, result.device)
    assert resident["eager"][0] - resident["sdpa"][0] == expected  # measured
    assert resident["eager"][1] - resident["sdpa"][1] == expected  # simulated

    gradients = {}
    for attention in ("sdpa", "eager"):
        built, _ = catalog.build_model(model, seed=0, attn_implementation=attention)
        assert built.config._attn_implementation == attention
        batch = random_batch(built, spec, torch.device("cpu"))
        built(**batch).loss.backward()
        gradients[attention] = [param.grad for param in built.parameters()]
    for sdpa, eager in zip(gradients["sdpa"], gradients["eager"], strict=True):
        torch.testing.assert_close(eager, sdpa, rtol=1e-4, atol=1e-5)
