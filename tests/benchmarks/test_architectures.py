"""benchmarks/architectures.py on the architectures of other kinds than the presets: the plan holds and measured
equals simulated (sliding and full attention, MoE, MLA, hybrid state-space, nested checkpointing layers).

The presets' own structures (llama, GPT-2, Qwen3, Qwen3-MoE) are proven the same way, per memory category, in
tests/step/test_training.py and tests/step/test_simulate.py, and Gemma 3's sliding and full layers in
tests/step/test_layer_kinds.py, so they are not run again here (issue 42)."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_benchmark

pytestmark = pytest.mark.slow  # real steps: `pytest -m 'not slow'` skips them

# model type -> the kind benchmarks/architectures.py's tiny config makes of it
OTHER_KINDS = {
    "gemma2": "layers differ",  # sliding and full attention in turn
    "mixtral": "moe",
    "deepseek_v3": "moe",  # MLA attention, a first dense layer, routed and shared experts
    "jamba": "moe",  # a hybrid state-space model: mamba layers, experts on every other layer
    "nemotron_h": "moe",  # a hybrid: mamba, experts, attention and MLP layers
    "bamba": "dense",  # mamba2 layers (its attention layers are none by default)
    "zamba2": "nested",  # a hybrid layer holds a mamba_decoder that is a checkpointing layer too
}


def test_architectures_of_other_kinds_run_as_transformers_plans_and_simulate_exactly(tmp_path):
    benchmark = load_benchmark("architectures")
    for model_type, kind in OTHER_KINDS.items():
        rows = benchmark.rows_for(model_type, seq_len=16, folder=tmp_path / model_type)
        assert [row.get("refused") for row in rows] == [None, None], model_type
        for row in rows:
            assert row["kind"] == kind and row["plan_ok"] and row["sim_plan_ok"], row
            assert row["exact"], benchmark.line_of(row)
