"""The formula on mixture-of-experts layers: to the byte for the families it knows, a typed flag for the rest."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig

from ckptlab import RunSpec, predict, simulate
from ckptlab.explore.formula import EXPERTS_COUNTED_NOTE, architecture, experts_not_counted_note, layer_activation_bytes
from ckptlab.show import i18n

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SMALL = {"vocab_size": 512, "max_position_embeddings": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
CONFIGS = {
    "mixtral": lambda: MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, **SMALL
    ),
    "qwen2_moe": lambda: Qwen2MoeConfig(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_hidden_layers=2,
        num_experts=6,
        num_experts_per_tok=2,
        **SMALL,
    ),
}


@pytest.mark.parametrize("dtype, element", [("float32", 4), ("bfloat16", 2)])
@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "tiny-qwen3-moe"])
def test_the_formula_counts_what_an_moe_layer_saves(family, dtype, element, tmp_path):
    """Router, top-k routed copies, shared expert: equal to the bytes autograd saves in a kept MoE layer."""
    if family in CONFIGS:
        CONFIGS[family]().save_pretrained(tmp_path)
        model = str(tmp_path)
    else:
        model = family
    arch = architecture(model)
    assert arch.experts and arch.experts_counted
    sim = simulate(RunSpec(model=model, seq_len=40, every_n_layers=None, dtype=dtype, optimizer="none"))
    assert layer_activation_bytes(arch, 40, 1, element) == sim.layers[1].saved_bytes


def test_top_k_not_the_expert_count_sets_the_activations():
    """16 experts instead of 8 add only router probabilities; top-4 instead of top-2 doubles the routed copies."""
    base = architecture("tiny-qwen3-moe")  # h 128, i_e 128, 8 experts, top-2, renormalised, bf16 weights
    h, i, k, tokens = base.hidden_size, base.expert_intermediate_size, base.experts_per_token, 128
    one = layer_activation_bytes(base, tokens, 1, 2)
    more_experts = layer_activation_bytes(replace(base, experts=16), tokens, 1, 2)
    more_routed = layer_activation_bytes(replace(base, experts_per_token=2 * k), tokens, 1, 2)
    assert more_experts - one == tokens * 4 * 8 + 4 * 8  # float32 probabilities, int32 offsets
    per_copy = 2 * (2 * h + 4 * i) + 2 + 3 * 8  # activations in bf16, the weight, three int64 indices
    assert more_routed - one == tokens * k * (per_copy + 8 + 4)  # + the top-k id and its renormalised weight


def test_an_moe_the_formula_does_not_know_is_flagged_on_every_prediction():
    config = OlmoeConfig(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, **SMALL
    )
    assert not architecture(config, 2).experts_counted
    formula = [p for p in predict(config, seq_len=32, num_layers=2, every_n_layers=[1]) if p.method == "formula"]
    assert formula and all(not p.experts_counted for p in formula)
    assert all(experts_not_counted_note("olmoe") in p.facts for p in formula)
    assert all(p.notes == tuple(i18n.say(fact) for fact in p.facts) for p in formula)  # the English, as always
    counted = predict("tiny-qwen3-moe", seq_len=32, every_n_layers=[1])
    assert all(p.experts_counted and EXPERTS_COUNTED_NOTE in p.facts for p in counted if p.method == "formula")
    dense = predict("tiny-llama", seq_len=32, every_n_layers=[1])
    assert all(p.experts_counted and not any(fact.key.startswith("predict.experts") for fact in p.facts) for p in dense)
