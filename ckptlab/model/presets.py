"""The preset table: named model shapes the lab builds without any files (see ``catalog``).

Tiny presets fit a training step on 2 CPU cores; real-shape presets carry published
dimensions and are meant for a GPU or the simulation. Every preset gets random weights.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import ModelLoadError, Option
from . import hub

CAUSAL_LM = "causal-lm"
MASKED_LM = "masked-lm"

DEFAULT_PRESET = "tiny-llama"


@dataclass(frozen=True)
class Preset:
    """A named model shape the lab can build without any files."""

    name: str  # what --model takes, e.g. "tiny-llama"
    family: str  # transformers model_type: "llama", "qwen3", "gpt2", "bert", "mistral"
    task: str  # "causal-lm" or "masked-lm"
    cpu_ok: bool  # True: a full step fits 2 CPU cores; False: real shape, for a GPU or simulation
    description: str  # one line for menus and --help
    config: Mapping[str, Any]  # kwargs for AutoConfig.for_model; "model_type" selects the class


def _preset(name: str, task: str, cpu_ok: bool, description: str, **config: Any) -> Preset:
    return Preset(name, config["model_type"], task, cpu_ok, description, MappingProxyType(config))


# Dropout is 0.0 in every preset so that two measured runs, and a run with and without
# checkpointing, compute the same thing; tests switch it on with config_overrides.
# Measured forward+backward with loss, batch 1, seq 256, fp32, 2 CPU cores (torch 2.13,
# transformers 5.24, median of 7 after 2 warm-ups): tiny-llama 0.09 s, tiny-qwen3 0.07 s,
# tiny-gpt2 0.05 s, tiny-bert 0.03 s.
TINY = (
    # Hidden 384 so that the recompute of full checkpointing shows above timing noise on
    # 2 CPU cores at seq 512 (a probe saw +24% step time).
    _preset(
        "tiny-llama",
        CAUSAL_LM,
        True,
        "Llama architecture, 6 layers, hidden 384, random weights",
        model_type="llama",
        hidden_size=384,
        num_hidden_layers=6,
        intermediate_size=1024,
        num_attention_heads=6,
        num_key_value_heads=6,
        vocab_size=4096,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    ),
    _preset(
        "tiny-qwen3",
        CAUSAL_LM,
        True,
        "Qwen3 architecture, 8 layers, hidden 256, GQA 4:2, random weights",
        model_type="qwen3",
        hidden_size=256,
        num_hidden_layers=8,
        intermediate_size=768,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=4096,
        max_position_embeddings=2048,
        attention_dropout=0.0,
    ),
    _preset(
        "tiny-gpt2",
        CAUSAL_LM,
        True,
        "GPT-2 architecture, 6 layers, hidden 256, random weights",
        model_type="gpt2",
        n_embd=256,
        n_layer=6,
        n_head=4,
        vocab_size=4096,
        n_positions=1024,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        # GPT-2's <|endoftext|> is id 50256; keep it inside the small vocabulary.
        bos_token_id=4095,
        eos_token_id=4095,
    ),
    _preset(
        "tiny-bert",
        MASKED_LM,
        True,
        "BERT architecture (masked LM), 4 layers, hidden 256, random weights",
        model_type="bert",
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        vocab_size=4096,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ),
)

# Published dimensions (the models' config.json on the Hub). RoPE is the default kind with
# the published theta: Llama 3.x's "llama3" frequency scaling changes values, not shapes.
REAL_SHAPE = (
    _preset(
        "qwen3-0.6b",
        CAUSAL_LM,
        False,
        "Qwen3-0.6B dimensions (28 layers, hidden 1024), random weights",
        model_type="qwen3",
        hidden_size=1024,
        num_hidden_layers=28,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    _preset(
        "qwen3-8b",
        CAUSAL_LM,
        False,
        "Qwen3-8B dimensions (36 layers, hidden 4096), random weights",
        model_type="qwen3",
        hidden_size=4096,
        num_hidden_layers=36,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    _preset(
        "llama-3.2-1b",
        CAUSAL_LM,
        False,
        "Llama-3.2-1B dimensions (16 layers, hidden 2048), random weights",
        model_type="llama",
        hidden_size=2048,
        num_hidden_layers=16,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
    ),
    _preset(
        "llama-3.1-8b",
        CAUSAL_LM,
        False,
        "Llama-3.1-8B dimensions (32 layers, hidden 4096), random weights",
        model_type="llama",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
    ),
    # v0.2 shape: no sliding window (v0.1 had 4096), theta 1e6, vocab 32000.
    _preset(
        "mistral-7b",
        CAUSAL_LM,
        False,
        "Mistral-7B-v0.2 dimensions (32 layers, hidden 4096), random weights",
        model_type="mistral",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=32000,
        max_position_embeddings=32768,
        sliding_window=None,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    _preset(
        "gpt2-small",
        CAUSAL_LM,
        False,
        "GPT-2 small dimensions (12 layers, hidden 768), random weights",
        model_type="gpt2",
        n_embd=768,
        n_layer=12,
        n_head=12,
        vocab_size=50257,
        n_positions=1024,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    ),
)


# Mixture-of-experts shapes (transformers builds their experts with @use_experts_implementation,
# run by the lab through its "grouped_mm" experts implementation, see ckptlab.model.experts).
# Published dimensions from the models' config.json on the Hub.
MOE_TINY = (
    # Qwen3-MoE with 8 experts, 2 per token: every layer sparse, as in Qwen3-30B-A3B.
    _preset(
        "tiny-qwen3-moe",
        CAUSAL_LM,
        True,
        "Qwen3-MoE architecture, 4 layers, hidden 128, 8 experts (2 per token), random weights",
        model_type="qwen3_moe",
        hidden_size=128,
        num_hidden_layers=4,
        intermediate_size=384,
        moe_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=4096,
        max_position_embeddings=2048,
        attention_dropout=0.0,
    ),
)

MOE_REAL_SHAPE = (
    # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json: 48 layers, hidden 2048,
    # 128 experts of width 768, 8 per token, GQA 32:4, head_dim 128, 30.5B parameters.
    _preset(
        "qwen3-30b-a3b",
        CAUSAL_LM,
        False,
        "Qwen3-30B-A3B dimensions (48 layers, hidden 2048, 128 experts, 8 per token), random weights",
        model_type="qwen3_moe",
        hidden_size=2048,
        num_hidden_layers=48,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    # https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json: 32 layers, hidden
    # 4096, 8 experts of width 14336, 2 per token, GQA 32:8, no sliding window, 46.7B parameters.
    _preset(
        "mixtral-8x7b",
        CAUSAL_LM,
        False,
        "Mixtral-8x7B dimensions (32 layers, hidden 4096, 8 experts, 2 per token), random weights",
        model_type="mixtral",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=14336,
        num_local_experts=8,
        num_experts_per_tok=2,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=32000,
        max_position_embeddings=32768,
        sliding_window=None,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        router_jitter_noise=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
)

# CPU-sized first, then the real shapes.
PRESETS: dict[str, Preset] = {preset.name: preset for preset in TINY + MOE_TINY + REAL_SHAPE + MOE_REAL_SHAPE}


def preset_names() -> str:
    """The presets' names, for a message that lists them."""
    return ", ".join(PRESETS)


def check_model_named(name_or_dir: str) -> None:
    """Raise unless ``name_or_dir`` is a preset, an existing directory or a Hub repository's name: the one check
    of a model's name that needs no model (nor transformers, nor the network), so the CLI refuses a typo before
    the heavy imports. Whether the repository exists is the Hub's to say (``ckptlab.model.hub``).

    Raises:
        ModelLoadError: a file where a folder was expected (``model.is_a_file``), a Hub repository's name with a
            revision none can have (``hub.bad_revision``), or neither a preset, an existing directory nor an
            ``owner/name`` (``model.not_found``).
    """
    if name_or_dir in PRESETS or os.path.isdir(name_or_dir) or hub.is_repo_name(name_or_dir):
        return
    hub.check_revision(name_or_dir)  # owner/name@. : the revision is wrong, not the name
    if os.path.exists(name_or_dir):
        raise ModelLoadError(
            key="model.is_a_file", model=Option("model"), name=repr(name_or_dir), presets=preset_names()
        )
    raise ModelLoadError(key="model.not_found", name=repr(name_or_dir), presets=preset_names())


@dataclass(frozen=True)
class ModelInfo:
    """What the lab needs to know about a model before (or after) building it."""

    name: str  # preset name, the directory path as given, or the Hub repository (owner/name[@revision])
    family: str  # config.model_type
    task: str  # "causal-lm" | "masked-lm"
    num_layers: int  # GradientCheckpointingLayer modules, the ones every_n_layers counts
    hidden_size: int  # width of the residual stream
    num_attention_heads: int  # query heads per layer
    vocab_size: int  # rows of the embedding (and columns of the logits)
    max_positions: int | None  # longest sequence the model accepts, None if unbounded
    num_params: int  # unique parameters, tied ones counted once
    cpu_ok: bool  # presets: as declared; local dirs and Hub models: num_params <= CPU_PARAM_LIMIT
    source: str  # "preset", "local" or "hub" (its config.json from the Hugging Face Hub, random weights)
    weights: str  # "random" or "loaded" (what build_model does)
    experts_implementation: str | None = None  # transformers' experts setting the lab builds with; None: dense
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0  # top_k: experts each token is routed to
    moe_layers: int = 0  # checkpointable layers that hold routed experts
    layers_alike: bool = (
        True  # every layer of one kind: same modules, shapes and per-layer settings (experts.layer_kind)
    )
    layer_period: int = (
        1  # the fewest leading layers whose kinds repeat through the model (Gemma 3: 6); the fold's unit
    )
    # Per layer, the index of the checkpointing layer it sits inside (Zamba2's mamba_decoder in its hybrid layer),
    # None at the top; empty when no layer is nested. A nested layer reruns whenever its parent does.
    nested_in: tuple[int | None, ...] = ()
    depth: int = 0  # the config's num_hidden_layers (0: as many as num_layers), the depth a simulation builds
    supports_checkpointing: bool = True  # transformers' supports_gradient_checkpointing for the class
    # Bytes of the model's buffers (BERT's position_ids and token_type_ids, rotary inv_freq, ...), counted on the
    # meta device: resident beside the parameters in every run, so part of every memory floor.
    buffer_bytes: int = 0

    def to_dict(self) -> dict:
        """A plain dict of the fields, for JSON and tables."""
        return dataclasses.asdict(self)


# What ``catalog.describe`` finds for each preset, kept as data so ``python -m ckptlab models`` answers without
# building a model (nor importing torch). tests/model/test_preset_facts.py describes every preset and compares;
# after changing a preset, rewrite the file with ``catalog.write_preset_facts()``.
PRESET_FACTS_FILE = Path(__file__).with_name("preset_facts.json")


def stored_facts() -> list[ModelInfo]:
    """Every preset's :class:`ModelInfo`, in the order of :data:`PRESETS`, as stored in :data:`PRESET_FACTS_FILE`."""
    stored = _stored()
    return [stored[name] for name in PRESETS]


def stored_fact(name: str) -> ModelInfo | None:
    """A preset's :class:`ModelInfo` as stored (what describing it on the meta device finds), without torch; None for
    a name that is not a preset (a folder or a Hub repository: only their config says their limits)."""
    return _stored().get(name) if name in PRESETS else None


@functools.cache
def _stored() -> dict[str, ModelInfo]:
    # Read once a process: the file changes only with a preset (catalog.write_preset_facts), never while the lab runs.
    stored = json.loads(PRESET_FACTS_FILE.read_text(encoding="utf-8"))
    return {
        name: ModelInfo(**{**facts, "nested_in": tuple(facts.get("nested_in", ()))}) for name, facts in stored.items()
    }
