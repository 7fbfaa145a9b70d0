"""Presets and model loading: shapes, parameter counts, local folders, refusals."""

from __future__ import annotations

import json
import resource

import pytest
import torch
from transformers import BertConfig, OpenAIGPTConfig, T5Config, ViTConfig

from ckptlab.errors import ModelLoadError, SpecError, UnsupportedModelError
from ckptlab.model.catalog import (
    CPU_PARAM_LIMIT,
    DEFAULT_PRESET,
    ModelInfo,
    Preset,
    build_model,
    build_on_meta,
    describe,
    list_presets,
    load_config,
    model_class_for,
)
from ckptlab.model.configs import get_preset

TINY = [p.name for p in list_presets() if p.cpu_ok]

# name: (layers, hidden, published parameter count)
EXPECTED = {
    "tiny-llama": (6, 384, None),
    "tiny-qwen3": (8, 256, None),
    "tiny-gpt2": (6, 256, None),
    "tiny-bert": (4, 256, None),
    "tiny-qwen3-moe": (4, 128, None),
    "qwen3-0.6b": (28, 1024, 0.60e9),
    "qwen3-8b": (36, 4096, 8.19e9),
    "llama-3.2-1b": (16, 2048, 1.24e9),
    "llama-3.1-8b": (32, 4096, 8.03e9),
    "mistral-7b": (32, 4096, 7.24e9),
    "gpt2-small": (12, 768, 124e6),
    "qwen3-30b-a3b": (48, 2048, 30.5e9),  # the model card: 30.5B in total, 3.3B activated
    "mixtral-8x7b": (32, 4096, 46.7e9),  # Mistral's announcement: 46.7B in total, 12.9B per token
}


def _step(model: torch.nn.Module, vocab_size: int, seq: int = 64) -> torch.Tensor:
    """One forward and backward with the model's own loss; returns the loss."""
    ids = torch.randint(0, vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss


def _params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# --- presets -------------------------------------------------------------------------


def test_presets_are_listed_tiny_first_and_include_the_default():
    presets = list_presets()
    assert all(isinstance(p, Preset) for p in presets)
    assert [p.name for p in presets] == list(EXPECTED)
    flags = [p.cpu_ok for p in presets]
    assert flags == sorted(flags, reverse=True), "CPU-sized presets come first"
    assert DEFAULT_PRESET == "tiny-llama" == presets[0].name
    assert get_preset("qwen3-8b").family == "qwen3"
    assert get_preset("tiny-bert").task == "masked-lm"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_describe_gives_layers_hidden_and_published_size(name):
    layers, hidden, published = EXPECTED[name]
    info = describe(name)
    assert isinstance(info, ModelInfo)
    assert (info.num_layers, info.hidden_size) == (layers, hidden)
    assert info.source == "preset" and info.weights == "random"
    assert info.family == get_preset(name).family
    assert info.cpu_ok == get_preset(name).cpu_ok
    assert info.max_positions is not None and info.max_positions >= 512
    if published is not None:
        assert info.num_params == pytest.approx(published, rel=0.02)
    assert info.to_dict()["num_params"] == info.num_params


def test_qwen3_0_6b_ties_embeddings():
    info = describe("qwen3-0.6b")
    embedding = info.vocab_size * info.hidden_size
    # Tied: the embedding is counted once, leaving about 0.44B in the layers.
    assert info.num_params - embedding == pytest.approx(0.44e9, rel=0.02)


def test_describe_8b_allocates_nothing():
    describe("tiny-llama")  # import and first-use costs are not what is measured
    before = _peak_rss_bytes()
    info = describe("qwen3-8b")
    assert info.num_params > 8e9
    # 8B parameters in fp32 would be 32 GB; allow only interpreter noise.
    assert _peak_rss_bytes() - before < 512 * 2**20
    config, _, task = load_config("qwen3-8b")
    assert {p.device.type for p in build_on_meta(config, task).parameters()} == {"meta"}


def test_unknown_name_lists_presets_and_says_how_a_hub_repository_is_named():
    with pytest.raises(ModelLoadError) as exc:
        describe("Qwen3-8B")  # no owner/: not a Hub repository's name, so nothing is asked of the Hub
    message = str(exc.value)
    assert "Qwen3-8B" in message and "tiny-llama" in message
    assert "owner/name" in message  # what a Hub name looks like (tests/model/test_hub.py fetches them)
    with pytest.raises(ModelLoadError, match="tiny-llama"):
        get_preset("tiny-llamaa")


# --- building ------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_tiny_preset_builds_and_trains_one_step(name):
    model, info = build_model(name)
    assert model.training
    assert model.config._attn_implementation == "sdpa"
    assert next(model.parameters()).dtype == torch.float32
    loss = _step(model, info.vocab_size)
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_same_seed_same_weights_other_seed_other_weights():
    a, _ = build_model("tiny-qwen3", seed=3)
    b, _ = build_model("tiny-qwen3", seed=3)
    c, _ = build_model("tiny-qwen3", seed=4)
    assert _params_equal(a, b)
    assert not _params_equal(a, c)


def test_dtype_is_applied_and_default_dtype_left_alone():
    model, _ = build_model("tiny-gpt2", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32


def test_model_class_for_resolves_auto_classes():
    config, _, task = load_config("tiny-bert")
    assert model_class_for(config, task).__name__ == "BertForMaskedLM"
    config, _, task = load_config("tiny-llama")
    assert model_class_for(config, task).__name__ == "LlamaForCausalLM"
    with pytest.raises(UnsupportedModelError, match="masked-lm"):
        model_class_for(config, "masked-lm")


# --- config_overrides ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("tiny-llama", {"attention_dropout": 0.5}),
        ("tiny-gpt2", {"resid_pdrop": 0.5}),
        ("tiny-bert", {"hidden_dropout_prob": 0.5}),
    ],
)
def test_config_overrides_switch_dropout_on(name, overrides):
    ids = torch.randint(0, 4096, (1, 32), generator=torch.Generator().manual_seed(0))
    plain, _ = build_model(name)
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, plain(input_ids=ids).logits)
    noisy, _ = build_model(name, config_overrides=overrides)
    assert all(getattr(noisy.config, key) == value for key, value in overrides.items())
    with torch.no_grad():
        assert not torch.equal(noisy(input_ids=ids).logits, noisy(input_ids=ids).logits)


@pytest.mark.parametrize("name, layers", [("tiny-qwen3", 3), ("tiny-qwen3", 10), ("tiny-gpt2", 2)])
def test_config_overrides_change_depth(name, layers):
    # qwen3 stores a per-layer list and gpt2 calls the field n_layer: both must follow.
    model, info = build_model(name, config_overrides={"num_hidden_layers": layers})
    assert info.num_layers == layers == model.config.num_hidden_layers


def test_config_overrides_reject_unknown_keys_and_invalid_values():
    with pytest.raises(SpecError, match="attention_dropuot"):
        build_model("tiny-llama", config_overrides={"attention_dropuot": 0.1})
    with pytest.raises(SpecError, match="layer_types"):
        build_model("tiny-qwen3", config_overrides={"layer_types": ["full_attention"]})


# --- local directories -----------------------------------------------------------------


def test_local_dir_with_weights_loads_them(tmp_path):
    original, _ = build_model("tiny-llama", seed=7)
    original.save_pretrained(tmp_path)
    info = describe(str(tmp_path))
    assert (info.source, info.weights, info.family, info.task) == ("local", "loaded", "llama", "causal-lm")
    assert info.num_params == describe("tiny-llama").num_params
    assert info.cpu_ok == (info.num_params <= CPU_PARAM_LIMIT)
    loaded, loaded_info = build_model(str(tmp_path), seed=99)
    assert loaded_info.weights == "loaded"
    assert loaded.training and loaded.config._attn_implementation == "sdpa"
    assert _params_equal(original, loaded)
    assert torch.isfinite(_step(loaded, info.vocab_size))


def test_local_masked_lm_keeps_its_task(tmp_path):
    model, _ = build_model("tiny-bert")
    model.save_pretrained(tmp_path)  # architectures: ["BertForMaskedLM"]
    assert describe(str(tmp_path)).task == "masked-lm"


def test_local_dir_with_only_config_gets_random_weights(tmp_path):
    config, _, _ = load_config("tiny-gpt2")
    config.save_pretrained(tmp_path)
    info = describe(str(tmp_path))
    assert (info.source, info.weights, info.num_layers) == ("local", "random", 6)
    a, _ = build_model(str(tmp_path), seed=1)
    b, _ = build_model(str(tmp_path), seed=1)
    assert _params_equal(a, b)


def test_bare_bert_config_is_a_masked_lm(tmp_path):
    # bert also has a causal head in transformers; without is_decoder it is an encoder.
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    config.save_pretrained(tmp_path)
    assert describe(str(tmp_path)).task == "masked-lm"


def test_dir_without_config_names_the_path(tmp_path):
    with pytest.raises(ModelLoadError) as exc:
        describe(str(tmp_path))
    assert str(tmp_path) in str(exc.value) and "config.json" in str(exc.value)
    assert "tiny-llama" in str(exc.value)
    assert not isinstance(exc.value, UnsupportedModelError)


def test_file_instead_of_dir_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    with pytest.raises(ModelLoadError, match="not a directory"):
        describe(str(path))


@pytest.mark.parametrize(
    "config",
    [
        ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2),
        T5Config(d_model=64, num_layers=2),
    ],
    ids=["vit", "t5"],
)
def test_non_lm_configs_are_unsupported(tmp_path, config):
    config.save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=config.model_type):
        describe(str(tmp_path))


def test_model_without_checkpointing_layers_is_unsupported(tmp_path):
    # OpenAI GPT's blocks do not inherit GradientCheckpointingLayer in transformers 5.x.
    OpenAIGPTConfig(n_embd=64, n_layer=2, n_head=2, vocab_size=128, n_positions=64).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="GradientCheckpointingLayer") as exc:
        build_model(str(tmp_path))
    assert "OpenAIGPTLMHeadModel" in str(exc.value)


def test_remote_code_config_is_refused_without_prompting(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "my_custom_lm", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}})
    )
    with pytest.raises(UnsupportedModelError, match="remote code"):
        describe(str(tmp_path))


@pytest.mark.parametrize("model_type", [["llama"], {"name": "llama"}, 7, None], ids=["list", "dict", "int", "null"])
def test_a_model_type_that_is_not_a_string_is_unsupported_not_a_type_error(tmp_path, model_type):
    # A list or dict model_type made the `in CONFIG_MAPPING` test raise TypeError (unhashable), found by mypy.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(UnsupportedModelError, match="does not know"):
        describe(str(tmp_path))


def test_unreadable_config_is_a_load_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="JSON"):
        describe(str(tmp_path))


def test_a_class_that_refuses_sdpa_keeps_eager_and_says_so():
    """Gemma 2's class refuses SDPA (its soft-capping): the build asks nothing of it, and a run says eager ran."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, MambaConfig

    from ckptlab.model.attention import attention_notes, implementation_for

    assert implementation_for(Gemma2ForCausalLM, "sdpa") is None and implementation_for(Gemma2ForCausalLM, "eager")
    (note,) = attention_notes(Gemma2ForCausalLM, Gemma2Config(), "sdpa")
    assert note.key == "note.attention_kept" and note.params["used"] == "eager"
    assert attention_notes(LlamaForCausalLM, LlamaConfig(), "sdpa") == []
    assert attention_notes(Gemma2ForCausalLM, MambaConfig(), "sdpa") == []  # no attention heads: nothing to say
