"""Presets and model loading: a name or a folder in, a config or a model out.

A model is named by a preset (``"tiny-llama"``, ``"qwen3-8b"``, see :func:`list_presets`)
or by a local directory saved with ``save_pretrained()``. Presets carry published
dimensions and get random weights: what the lab measures (memory and time of a training
step under checkpointing) depends on shapes, not on trained values. Nothing is ever
downloaded and no remote code is run.

:func:`describe` builds the model on the ``meta`` device, so even an 8B shape is counted
in well under a second without allocating its weights.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MASKED_LM_MAPPING

from ..errors import ModelLoadError, SpecError, UnsupportedModelError
from . import experts, folder_checks, presets
from .plan import checkpointable_layers

# The preset table lives in .presets; these names stay importable from here.
PRESETS = presets.PRESETS
Preset = presets.Preset
CAUSAL_LM = presets.CAUSAL_LM
MASKED_LM = presets.MASKED_LM
DEFAULT_PRESET = presets.DEFAULT_PRESET

# Above this a local model is not "meant for the CPU": a training step of a 200M model in
# fp32 needs several GiB (weights, grads, activations) and tens of seconds on a laptop.
CPU_PARAM_LIMIT: int = 200_000_000

# The lab measures the standard attention path every user gets by default (PyTorch SDPA),
# so it is set explicitly rather than left to whatever a config or kernel install picks.
# Classes without SDPA support (transformers raises if asked) keep their own default, eager.
_ATTN_IMPLEMENTATION = "sdpa"

_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


@dataclass(frozen=True)
class ModelInfo:
    """What the lab needs to know about a model before (or after) building it."""

    name: str  # preset name, or the directory path as given
    family: str  # config.model_type
    task: str  # "causal-lm" | "masked-lm"
    num_layers: int  # GradientCheckpointingLayer modules, the ones every_n_layers counts
    hidden_size: int  # width of the residual stream
    num_attention_heads: int  # query heads per layer
    vocab_size: int  # rows of the embedding (and columns of the logits)
    max_positions: int | None  # longest sequence the model accepts, None if unbounded
    num_params: int  # unique parameters, tied ones counted once
    cpu_ok: bool  # presets: as declared; local dirs: num_params <= CPU_PARAM_LIMIT
    source: str  # "preset" or "local"
    weights: str  # "random" or "loaded" (what build_model does)
    experts_implementation: str | None = None  # transformers' experts setting the lab builds with; None: dense
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0  # top_k: experts each token is routed to
    moe_layers: int = 0  # checkpointable layers that hold routed experts
    layers_alike: bool = True  # every layer has the same modules and shapes (the simulation's fast path needs it)
    supports_checkpointing: bool = True  # transformers' supports_gradient_checkpointing for the class

    def to_dict(self) -> dict:
        """A plain dict of the fields, for JSON and tables."""
        return dataclasses.asdict(self)


def list_presets() -> list[Preset]:
    """All presets: the CPU-sized ones first, then the real shapes."""
    return list(PRESETS.values())


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ModelLoadError: if there is no such preset; the message lists the valid names.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelLoadError(
            f"There is no preset {name!r}. Valid presets: {_preset_names()}.",
            key="model.no_preset",
            name=name,
            presets=_preset_names(),
        ) from None


def _preset_names() -> str:
    return ", ".join(PRESETS)


def model_class_for(config: PretrainedConfig, task: str) -> type:
    """The transformers class that ``AutoModelForCausalLM`` / ``AutoModelForMaskedLM`` picks.

    Args:
        config: a transformers config.
        task: ``"causal-lm"`` or ``"masked-lm"``.

    Returns:
        The concrete model class, e.g. ``LlamaForCausalLM``.

    Raises:
        UnsupportedModelError: if the config has no model for that task.
        SpecError: if ``task`` is neither of the two.
    """
    mapping = _task_mapping(task)
    if type(config) not in mapping:
        raise UnsupportedModelError(
            f"model_type {config.model_type!r} has no {task} model in transformers. The lab runs "
            "causal or masked text language models (Llama, Qwen3, Mistral, GPT-2, BERT, ...).",
            key="model.no_task_model",
            model_type=repr(config.model_type),
            task=task,
        )
    classes = mapping[type(config)]
    if not isinstance(classes, (list, tuple)):
        return classes
    # Same tie-break as transformers' own resolution: the config's architectures, else the first.
    by_name = {cls.__name__: cls for cls in classes}
    for arch in getattr(config, "architectures", None) or []:
        if arch in by_name:
            return by_name[arch]
    return classes[0]


def _task_mapping(task: str) -> Mapping[type, Any]:
    if task == CAUSAL_LM:
        return MODEL_FOR_CAUSAL_LM_MAPPING
    if task == MASKED_LM:
        return MODEL_FOR_MASKED_LM_MAPPING
    raise SpecError(f"task={task!r} is not valid: use {CAUSAL_LM!r} or {MASKED_LM!r}.")


def _auto_class(task: str) -> type[AutoModelForCausalLM] | type[AutoModelForMaskedLM]:
    return AutoModelForCausalLM if task == CAUSAL_LM else AutoModelForMaskedLM


def _model_kwargs(config: PretrainedConfig, task: str) -> dict[str, Any]:
    """Keyword arguments every build passes: SDPA where the class has it, grouped_mm experts, no remote code."""
    kwargs: dict[str, Any] = {"trust_remote_code": False}
    model_class = model_class_for(config, task)
    if getattr(model_class, "_supports_sdpa", False):
        kwargs["attn_implementation"] = _ATTN_IMPLEMENTATION
    if experts.supports_experts_implementation(model_class):
        # transformers' own default, asked for by name so that the measured step and the
        # simulation are sure to run the same experts path (ckptlab.model.experts).
        kwargs["experts_implementation"] = experts.EXPERTS_IMPLEMENTATION
    return kwargs


def load_config(name_or_dir: str) -> tuple[PretrainedConfig, str, str]:
    """The config of a preset or of a local ``save_pretrained()`` folder.

    A preset name wins over a folder of the same name in the working directory.

    Args:
        name_or_dir: a preset name (see :func:`list_presets`) or an existing directory.

    Returns:
        ``(config, source, task)``: a fresh config the caller may change, ``"preset"`` or
        ``"local"``, and ``"causal-lm"`` or ``"masked-lm"``.

    Raises:
        ModelLoadError: unknown name, missing or unreadable ``config.json``.
        UnsupportedModelError: not a causal or masked text LM, or the config needs remote code.
    """
    name_or_dir = os.fspath(name_or_dir)
    if name_or_dir in PRESETS:
        preset = PRESETS[name_or_dir]
        kwargs = dict(preset.config)
        config = AutoConfig.for_model(kwargs.pop("model_type"), **copy.deepcopy(kwargs))
        return config, "preset", preset.task
    if os.path.isdir(name_or_dir):
        config = _load_local_config(name_or_dir)
        return config, "local", _infer_task(config)
    if os.path.exists(name_or_dir):
        raise ModelLoadError(
            f"{name_or_dir!r} is a file, not a directory: point --model at the folder that holds "
            f"config.json, or use a preset: {_preset_names()}.",
            key="model.is_a_file",
            name=repr(name_or_dir),
            presets=_preset_names(),
        )
    raise ModelLoadError(
        f"{name_or_dir!r} is neither a preset nor an existing directory. Presets: {_preset_names()}. "
        "A directory must exist on this machine and hold a config.json. Hub ids such as "
        "'Qwen/Qwen3-8B' are not downloaded: save the config (or model) locally with "
        "save_pretrained() and pass that folder.",
        key="model.not_found",
        name=repr(name_or_dir),
        presets=_preset_names(),
    )


def _load_local_config(path: str) -> PretrainedConfig:
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ModelLoadError(
            f"{path!r} has no config.json; it is not a transformers model folder. To resolve this, "
            "point --model at a folder saved with save_pretrained(), or use a preset: "
            f"{_preset_names()}.",
            key="model.no_config",
            path=repr(path),
            presets=_preset_names(),
        )
    # Read the raw JSON first so that a config needing custom code is refused with our
    # message, before transformers can ask on stdin whether to run it, and so that sizes
    # transformers' own arithmetic chokes on are refused by name (ckptlab.folder_checks).
    raw = folder_checks.read_config_json(config_file)
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    # A model_type that is not a string (a list, say) is unknown too: `in` would raise TypeError on it.
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        if isinstance(raw, dict) and raw.get("auto_map"):
            raise UnsupportedModelError(
                f"{path!r} has model_type {model_type!r}, which needs the model's own Python code "
                "(auto_map in config.json). The lab does not run remote code (trust_remote_code "
                "stays False); use a model built into transformers or a preset.",
                key="model.remote_code",
                path=repr(path),
                model_type=repr(model_type),
            )
        raise UnsupportedModelError(
            f"{path!r} has model_type {model_type!r}, which this transformers does not know. "
            f"Use a built-in text LM (llama, qwen3, mistral, gpt2, bert, ...) or a preset: {_preset_names()}.",
            key="model.unknown_type",
            path=repr(path),
            model_type=repr(model_type),
            presets=_preset_names(),
        )
    folder_checks.check_raw_config(raw, config_file, CONFIG_MAPPING[model_type].attribute_map)
    try:
        # Never trust_remote_code=True; False (not None) also keeps transformers from prompting.
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, StrictDataclassError, ArithmeticError, RecursionError) as exc:
        raise folder_checks.config_error(config_file, exc) from exc
    folder_checks.check_config(config, config_file)
    return config


def infer_task(config: PretrainedConfig) -> str:
    """The head ``config`` asks for: :data:`CAUSAL_LM` or :data:`MASKED_LM`.

    Raises:
        UnsupportedModelError: neither a causal nor a masked language model.
    """
    return _infer_task(config)


def _infer_task(config: PretrainedConfig) -> str:
    # The architectures a model was saved from say what its head is, and some types
    # (bert, roberta, ...) have both a causal and a masked model.
    for arch in getattr(config, "architectures", None) or []:
        if arch.endswith(("ForCausalLM", "LMHeadModel")) and type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
            return CAUSAL_LM
        if arch.endswith("ForMaskedLM") and type(config) in MODEL_FOR_MASKED_LM_MAPPING:
            return MASKED_LM
    causal = type(config) in MODEL_FOR_CAUSAL_LM_MAPPING
    masked = type(config) in MODEL_FOR_MASKED_LM_MAPPING
    if causal and masked:
        # Encoders like BERT list a causal head too, but it only makes sense with is_decoder.
        return CAUSAL_LM if getattr(config, "is_decoder", False) else MASKED_LM
    if causal:
        return CAUSAL_LM
    if masked:
        return MASKED_LM
    raise UnsupportedModelError(
        f"model_type {config.model_type!r} ({type(config).__name__}) is neither a causal nor a "
        "masked language model in transformers. The lab runs causal or masked text LMs "
        f"(Llama, Qwen3, Mistral, GPT-2, BERT, ...); try a preset: {_preset_names()}.",
        key="model.not_a_language_model",
        model_type=repr(config.model_type),
        config_class=type(config).__name__,
        presets=_preset_names(),
    )


def _apply_overrides(config: PretrainedConfig, overrides: Mapping[str, Any] | None) -> PretrainedConfig:
    if not overrides:
        return config
    unknown = [key for key in overrides if not hasattr(config, key)]
    if unknown:
        raise SpecError(
            f"config_overrides names {unknown} which {type(config).__name__} does not have; "
            "check the spelling against the config's attributes (e.g. attention_dropout, resid_pdrop)."
        )
    # Aliases (GPT-2's num_hidden_layers -> n_layer) are resolved so the new value cannot
    # lose to the old one stored under the real name.
    aliases = getattr(config, "attribute_map", {}) or {}
    resolved = {aliases.get(key, key): value for key, value in overrides.items()}
    values = {**config.to_dict(), **resolved}
    # A per-layer list saved for the old depth would fail validation; let it be rebuilt.
    if aliases.get("num_hidden_layers", "num_hidden_layers") in resolved and "layer_types" not in resolved:
        values.pop("layer_types", None)
    try:
        return type(config).from_dict(values)
    # transformers 5 validates configs with huggingface_hub strict dataclasses, whose
    # errors are not ValueErrors.
    except (TypeError, ValueError, StrictDataclassError) as exc:
        raise SpecError(f"config_overrides={dict(overrides)!r} gives an invalid config: {exc}") from exc


def _has_weights(path: str) -> bool:
    return any(glob.glob(os.path.join(path, pattern)) for pattern in _WEIGHT_PATTERNS)


def _weight_files(path: str) -> list[str]:
    return [file for pattern in _WEIGHT_PATTERNS for file in glob.glob(os.path.join(path, pattern))]


def build_on_meta(config: PretrainedConfig, task: str) -> PreTrainedModel:
    """The model with shapes but no storage: counting an 8B model costs no memory."""
    kwargs = _model_kwargs(config, task)  # raises UnsupportedModelError with our message
    try:
        with torch.device("meta"):
            return _auto_class(task).from_config(copy.deepcopy(config), **kwargs)
    # ArithmeticError and RuntimeError ("negative dimension"): sizes in a config.json of an
    # architecture ckptlab.folder_checks has no rule for.
    except (TypeError, ValueError, AttributeError, KeyError, ArithmeticError, RuntimeError) as exc:
        raise ModelLoadError(
            f"transformers could not build {type(config).__name__}: {type(exc).__name__}: "
            f"{folder_checks.one_line(exc)}. To resolve this error, check the sizes in its config "
            "(positive, and attention heads that divide hidden_size).",
            key="model.cannot_build",
            config_class=type(config).__name__,
            detail=f"{type(exc).__name__}: {folder_checks.one_line(exc)}",
        ) from exc


def _info(
    name: str, config: PretrainedConfig, source: str, task: str, weights: str, meta_model: PreTrainedModel
) -> ModelInfo:
    layers = checkpointable_layers(meta_model)
    if not layers:
        raise UnsupportedModelError(
            f"{type(meta_model).__name__} has no layer that inherits "
            "transformers.modeling_layers.GradientCheckpointingLayer, so every_n_layers has nothing "
            "to count and transformers cannot checkpoint it the standard way. Use a model whose "
            f"layers do (Llama, Qwen3, Mistral, GPT-2, BERT, ...) or a preset: {_preset_names()}.",
            key="model.no_checkpointable_layer",
            model_class=type(meta_model).__name__,
            presets=_preset_names(),
        )
    # parameters() yields each tensor once, so tied embeddings are counted once.
    num_params = sum(p.numel() for p in meta_model.parameters())
    text = config.get_text_config()
    max_positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    cpu_ok = PRESETS[name].cpu_ok if source == "preset" else num_params <= CPU_PARAM_LIMIT
    moe = experts.experts_shape(config, layers, getattr(meta_model.config, "_experts_implementation", None))
    return ModelInfo(
        name=name,
        family=config.model_type,
        task=task,
        num_layers=len(layers),
        hidden_size=text.hidden_size,
        num_attention_heads=text.num_attention_heads,
        vocab_size=text.vocab_size,
        max_positions=max_positions,
        num_params=num_params,
        cpu_ok=cpu_ok,
        source=source,
        weights=weights,
        experts_implementation=moe.implementation,
        num_experts=moe.num_experts,
        experts_per_token=moe.experts_per_token,
        moe_layers=moe.moe_layers,
        layers_alike=experts.layers_alike(layers),
        supports_checkpointing=bool(getattr(meta_model, "supports_gradient_checkpointing", False)),
    )


def describe(name_or_dir: str) -> ModelInfo:
    """Shape and size of a model, without allocating it.

    Args:
        name_or_dir: a preset name or a local model directory.

    Returns:
        A :class:`ModelInfo`; layers and parameters are counted on a ``meta``-device model.

    Raises:
        ModelLoadError: the name or folder cannot be loaded.
        UnsupportedModelError: not a causal/masked text LM, or no ``GradientCheckpointingLayer``.
    """
    name_or_dir = os.fspath(name_or_dir)
    config, source, task = load_config(name_or_dir)
    weights = "loaded" if source == "local" and _has_weights(name_or_dir) else "random"
    meta_model = build_on_meta(config, task)
    if weights == "loaded":
        folder_checks.check_weights(_weight_files(name_or_dir), meta_model, config)
    return _info(name_or_dir, config, source, task, weights, meta_model)


def instantiate(config: PretrainedConfig, task: str, dtype: torch.dtype) -> PreTrainedModel:
    """A model with fresh weights from ``config``, made in the current device context.

    ``build_model`` wraps it in ``torch.device(...)``; ``ckptlab.simulate`` calls it under
    ``FakeTensorMode``, where the weights take no memory.
    """
    return _auto_class(task).from_config(config, dtype=dtype, **_model_kwargs(config, task))


def config_with(config: PretrainedConfig, overrides: Mapping[str, Any]) -> PretrainedConfig:
    """A copy of ``config`` with ``overrides`` applied (aliases resolved, per-layer lists rebuilt).

    Raises:
        SpecError: an unknown attribute or an invalid resulting config.
    """
    return _apply_overrides(config, overrides)


def build_model(
    name_or_dir: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    config_overrides: Mapping[str, Any] | None = None,
) -> tuple[PreTrainedModel, ModelInfo]:
    """Build a model ready for a training step.

    Presets and folders holding only ``config.json`` get random weights drawn after
    ``torch.manual_seed(seed)``, so two builds with the same seed are identical. A folder
    with ``*.safetensors`` or ``pytorch_model*.bin`` files is loaded from them.

    Args:
        name_or_dir: a preset name or a local model directory.
        dtype: dtype of the parameters.
        device: where the model lives; random weights are created there directly.
        seed: seed for random weights.
        config_overrides: config attributes to change before building, e.g.
            ``{"attention_dropout": 0.1}`` to switch dropout on.

    Returns:
        ``(model, info)``: the model in ``train()`` mode, and its :class:`ModelInfo`.

    Raises:
        ModelLoadError: the name or folder cannot be loaded.
        UnsupportedModelError: not a causal/masked text LM, or no ``GradientCheckpointingLayer``.
        SpecError: ``config_overrides`` names an unknown attribute or gives an invalid config.
        DoesNotFitError: the parameters alone exceed the memory of ``device`` (nothing is built).
    """
    name_or_dir = os.fspath(name_or_dir)
    config, source, task = load_config(name_or_dir)
    config = _apply_overrides(config, config_overrides)
    loaded = source == "local" and _has_weights(name_or_dir)
    # Check on meta first: refusing an unsupported model should not cost its weights.
    weights = "loaded" if loaded else "random"
    meta_model = build_on_meta(config, task)
    if loaded:
        folder_checks.check_weights(_weight_files(name_or_dir), meta_model, config)
    info = _info(name_or_dir, config, source, task, weights, meta_model)
    del meta_model
    folder_checks.check_fits(info, dtype, device)  # the parameters alone must fit the device
    auto = _auto_class(task)
    torch.manual_seed(seed)
    if loaded:
        try:
            model = auto.from_pretrained(
                name_or_dir, config=config, local_files_only=True, dtype=dtype, **_model_kwargs(config, task)
            )
        except (SafetensorError, pickle.UnpicklingError, RuntimeError) as exc:
            problem = folder_checks.weights_error(name_or_dir, exc)
            if problem is None:
                raise
            raise problem from exc
    else:
        # Created on the target device directly: an 8B model never passes through host memory.
        with torch.device(device):
            model = instantiate(config, task, dtype)
    # transformers wraps PreTrainedModel.to in functools.wraps, whose stub mypy calls unbound.
    model.to(device)  # type: ignore[arg-type]
    model.train()
    return model, info
