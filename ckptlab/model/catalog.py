"""Presets and model loading: a name or a folder in, a model (or its description) out.

A model is named by a preset (``"tiny-llama"``, ``"qwen3-8b"``, see :func:`list_presets`),
by a local directory saved with ``save_pretrained()``, or by a Hugging Face Hub repository
(``"Qwen/Qwen3-8B"``: its ``config.json`` only, ``ckptlab.model.hub``). Presets and Hub models
get random weights: what the lab measures (memory and time of a training step under
checkpointing) depends on shapes, not on trained values. No weight is ever downloaded and no
remote code is run.

:func:`describe` builds the model on the ``meta`` device, so even an 8B shape is counted
in well under a second without allocating its weights. The config behind a name (and its
task and class) comes from ``ckptlab.model.configs``.
"""

from __future__ import annotations

import copy
import functools
import glob
import json
import os
import pickle
from collections.abc import Mapping
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, PretrainedConfig, PreTrainedModel

from ..errors import ModelLoadError, Option, UnsupportedModelError, expect_type, one_line
from ..torchstate import exclusive
from . import experts, folder_checks, hub, lora, presets, quantize, weight_checks
from .attention import SDPA, implementation_for
from .configs import config_with, load_config, model_class_for, preset_names
from .plan import checkpointable_layers, nested_in

# The preset table lives in .presets; these names stay importable from here.
PRESETS = presets.PRESETS
Preset = presets.Preset
CAUSAL_LM = presets.CAUSAL_LM
MASKED_LM = presets.MASKED_LM
DEFAULT_PRESET = presets.DEFAULT_PRESET
ModelInfo = presets.ModelInfo

# Above this a local model is not "meant for the CPU": a training step of a 200M model in
# fp32 needs several GiB (weights, grads, activations) and tens of seconds on a laptop.
CPU_PARAM_LIMIT: int = 200_000_000

# The lab builds with the attention a spec names (RunSpec.attn_implementation, default SDPA: the path every user
# gets by default), set explicitly rather than left to whatever a config or kernel install picks. Classes
# without SDPA support (transformers raises if asked) keep their own default, eager (ckptlab.model.attention).

_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def list_presets() -> list[Preset]:
    """All presets: the CPU-sized ones first, then the real shapes."""
    return list(PRESETS.values())


def _auto_class(task: str) -> type[AutoModelForCausalLM] | type[AutoModelForMaskedLM]:
    return AutoModelForCausalLM if task == CAUSAL_LM else AutoModelForMaskedLM


def _model_kwargs(config: PretrainedConfig, task: str, attn_implementation: str = SDPA) -> dict[str, Any]:
    """Keyword arguments every build passes: the attention asked for (SDPA by default) where the class has it,
    grouped_mm experts, no remote code."""
    kwargs: dict[str, Any] = {"trust_remote_code": False}
    model_class = model_class_for(config, task)
    implementation = implementation_for(model_class, attn_implementation)
    if implementation is not None:
        kwargs["attn_implementation"] = implementation
    if experts.supports_experts_implementation(model_class):
        # transformers' own default, asked for by name so that the measured step and the
        # simulation are sure to run the same experts path (ckptlab.model.experts).
        kwargs["experts_implementation"] = experts.EXPERTS_IMPLEMENTATION
    return kwargs


def _has_weights(path: str) -> bool:
    return any(glob.glob(os.path.join(path, pattern)) for pattern in _WEIGHT_PATTERNS)


def _weight_files(path: str) -> list[str]:
    return [file for pattern in _WEIGHT_PATTERNS for file in glob.glob(os.path.join(path, pattern))]


@exclusive  # process-wide torch state: ckptlab.torchstate
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
            key="model.cannot_build",
            config_class=type(config).__name__,
            detail=f"{type(exc).__name__}: {one_line(exc)}",
        ) from exc


def _info(
    name: str, config: PretrainedConfig, source: str, task: str, weights: str, meta_model: PreTrainedModel
) -> ModelInfo:
    layers = checkpointable_layers(meta_model)
    if not layers:
        raise UnsupportedModelError(
            key="model.no_checkpointable_layer",
            every_n_layers=Option("every_n_layers"),
            model_class=type(meta_model).__name__,
            presets=preset_names(),
        )
    # parameters() yields each tensor once, so tied embeddings are counted once.
    num_params = sum(p.numel() for p in meta_model.parameters())
    # buffers() yields each tensor once too; on the meta device they have their dtype (int64 position ids) and no
    # storage, so a buffer of 2^31 positions is counted without being made.
    buffer_bytes = sum(b.numel() * b.element_size() for b in meta_model.buffers())
    text = config.get_text_config()
    max_positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    cpu_ok = PRESETS[name].cpu_ok if source == "preset" else num_params <= CPU_PARAM_LIMIT
    period = experts.layer_period(layers)
    nested = tuple(nested_in(meta_model))
    is_nested = any(parent is not None for parent in nested)
    depth = _depth(text, len(layers))
    foldable = not is_nested and depth == len(layers)
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
        layers_alike=period == 1 and foldable,
        # Nested layers, or more layers than the config's depth, are no repeating unit of that depth: the fold
        # (ckptlab.step.fold) removes whole units by lowering num_hidden_layers, so it is off for them.
        layer_period=period if foldable else len(layers),
        nested_in=nested if is_nested else (),
        depth=depth,
        supports_checkpointing=bool(getattr(meta_model, "supports_gradient_checkpointing", False)),
        buffer_bytes=buffer_bytes,
    )


def _depth(text: PretrainedConfig, num_layers: int) -> int:
    """The text config's ``num_hidden_layers`` (GPT-2's ``n_layer`` through its alias); ``num_layers`` without one."""
    depth = getattr(text, "num_hidden_layers", None)
    return depth if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0 else num_layers


def describe(name_or_dir: str) -> ModelInfo:
    """Shape and size of a model, without allocating it.

    Args:
        name_or_dir: a preset name, a local model directory or a Hub repository (``owner/name``).

    Returns:
        A :class:`ModelInfo`; layers and parameters are counted on a ``meta``-device model (a preset's were, and are
        stored: ``presets.stored_fact``).

    Described once: the answer is kept per preset, per folder as long as its files are
    unchanged, and per Hub repository as long as its config is (a Run validates its spec,
    builds its model and its checkpointing-off reference from one description; an 8B shape
    takes seconds on the meta device).

    Raises:
        ModelLoadError: the name or folder cannot be loaded.
        UnsupportedModelError: not a causal/masked text LM, or no ``GradientCheckpointingLayer``.
    """
    expect_type("ckptlab.describe", "name_or_dir", name_or_dir, (str, os.PathLike), "ckptlab.describe('tiny-llama')")
    name_or_dir = os.fspath(name_or_dir)
    # A preset's description is stored (tests/model/test_preset_facts.py compares it with describe_on_meta): building
    # qwen3-8b on the meta device to count it again cost a simulate process about 0.5 s of CPU (issue 61).
    stored = presets.stored_fact(name_or_dir)
    return stored if stored is not None else describe_on_meta(name_or_dir)


def describe_on_meta(name_or_dir: str) -> ModelInfo:
    """:func:`describe` counted on a ``meta``-device model, a preset's too (what its stored facts are checked against).

    Raises:
        ModelLoadError, UnsupportedModelError: as :func:`describe`.
    """
    name_or_dir = os.fspath(name_or_dir)
    return _described(name_or_dir, _files_stamp(name_or_dir))


def _files_stamp(name_or_dir: str) -> tuple[tuple[str, int, int], ...]:
    """What a description depends on besides the name: a folder's files now (name, mtime, size); a Hub model's
    config as fetched now (its path holds the commit); none for a preset."""
    if name_or_dir in PRESETS:  # a preset name wins over a folder of the same name (load_config)
        return ()
    if not os.path.isdir(name_or_dir) and hub.is_repo_name(name_or_dir):
        # The process's one fetch of this config (hub.config_file): a moved branch is seen by the next process, the
        # Hub switched off at once (HubAccess.enabled is asked first).
        config_file = hub.config_file(name_or_dir)
        return ((config_file, os.stat(config_file).st_mtime_ns, os.stat(config_file).st_size),)
    try:
        with os.scandir(name_or_dir) as entries:
            return tuple(
                sorted(
                    (entry.name, entry.stat().st_mtime_ns, entry.stat().st_size) for entry in entries if entry.is_file()
                )
            )
    except (OSError, ValueError):  # no such folder (or a NUL in its name): load_config says so, nothing is kept
        return ()


@functools.lru_cache(maxsize=64)
def _described(name_or_dir: str, stamp: tuple[tuple[str, int, int], ...]) -> ModelInfo:
    """:func:`describe` itself; ``stamp`` (:func:`_files_stamp`) keys the cache, a failure is not kept."""
    config, source, task = load_config(name_or_dir)
    weights = "loaded" if source == "local" and _has_weights(name_or_dir) else "random"
    meta_model = build_on_meta(config, task)
    if weights == "loaded":
        weight_checks.check_weights(_weight_files(name_or_dir), meta_model, config)
    return _info(name_or_dir, config, source, task, weights, meta_model)


def projection_shapes(name_or_dir: str) -> tuple[tuple[str, int, int], ...]:
    """Every projection LoRA could adapt in the model's layers, as ``ckptlab.model.lora.projection_shapes`` lists
    them, counted on the meta device (no memory) and kept like :func:`describe`'s answer.

    Raises:
        ModelLoadError, UnsupportedModelError: as :func:`describe`.
    """
    name_or_dir = os.fspath(name_or_dir)
    return _projection_shapes(name_or_dir, _files_stamp(name_or_dir))


@functools.lru_cache(maxsize=64)
def _projection_shapes(name_or_dir: str, stamp: tuple[tuple[str, int, int], ...]) -> tuple[tuple[str, int, int], ...]:
    config, _, task = load_config(name_or_dir)
    return lora.projection_shapes(build_on_meta(config, task))


def instantiate(
    config: PretrainedConfig, task: str, dtype: torch.dtype, attn_implementation: str = SDPA
) -> PreTrainedModel:
    """A model with fresh weights from ``config``, made in the current device context, with the attention asked for.

    ``build_model`` wraps it in ``torch.device(...)``; ``ckptlab.simulate`` calls it under
    ``FakeTensorMode``, where the weights take no memory.
    """
    return _auto_class(task).from_config(config, dtype=dtype, **_model_kwargs(config, task, attn_implementation))


@exclusive  # process-wide torch state: ckptlab.torchstate
def build_model(
    name_or_dir: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    config_overrides: Mapping[str, Any] | None = None,
    quantization: quantize.Quantization | None = None,
    attn_implementation: str = SDPA,
) -> tuple[PreTrainedModel, ModelInfo]:
    """Build a model ready for a training step.

    Presets, Hub models and folders holding only ``config.json`` get random weights drawn after
    ``torch.manual_seed(seed)``, so two builds with the same seed are identical. A folder
    with ``*.safetensors`` or ``pytorch_model*.bin`` files is loaded from them.

    Args:
        name_or_dir: a preset name, a local model directory or a Hub repository (``owner/name``).
        dtype: dtype of the parameters.
        device: where the model lives; random weights are created there directly.
        seed: seed for random weights.
        config_overrides: config attributes to change before building, e.g.
            ``{"attention_dropout": 0.1}`` to switch dropout on.
        quantization: a 4-bit or 8-bit base: the linear layers quantized as transformers loads them
            (``ckptlab.model.quantize``), then peft's ``prepare_model_for_kbit_training``.
        attn_implementation: transformers' ``attn_implementation`` ("sdpa", "eager", ...; ckptlab.model.attention);
            a class that refuses SDPA keeps eager.

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
    loaded = source == "local" and _has_weights(name_or_dir)
    # Checked on meta first (describe): refusing an unsupported model should not cost its weights.
    if config_overrides:
        config = config_with(config, config_overrides)
        meta_model = build_on_meta(config, task)
        if loaded:
            weight_checks.check_weights(_weight_files(name_or_dir), meta_model, config)
        info = _info(name_or_dir, config, source, task, "loaded" if loaded else "random", meta_model)
        del meta_model
    else:
        info = describe(name_or_dir)
    stored = None  # a quantized base at its quantized size (quantized_on_fake), not its 16-bit one
    if quantization is not None:
        stored = (quantized_on_fake(config, task, dtype, quantization)[1], quantization.label)
    folder_checks.check_fits(info, dtype, device, stored)  # the parameters alone must fit the device
    auto = _auto_class(task)
    torch.manual_seed(seed)
    if loaded:
        loading: dict[str, Any] = {}
        if quantization is not None:  # transformers quantizes while loading (or reads a pre-quantized folder)
            loading = {"quantization_config": quantization.bnb_config(), "device_map": str(device)}
        try:
            model = auto.from_pretrained(
                name_or_dir,
                config=config,
                local_files_only=True,
                dtype=dtype,
                **_model_kwargs(config, task, attn_implementation),
                **loading,
            )
        except ImportError as exc:  # a quantization_config whose package is not installed (bitsandbytes, ...)
            detail = one_line(exc, 200)
            raise ModelLoadError(key="model.quantization_package", path=repr(name_or_dir), detail=detail) from None
        except (SafetensorError, pickle.UnpicklingError, RuntimeError) as exc:
            problem = weight_checks.weights_error(name_or_dir, exc)
            if problem is None:
                raise
            raise problem from exc
    else:
        # Created on the target device directly: an 8B model never passes through host memory.
        with torch.device(device):
            model = instantiate(without_quantization(config), task, dtype, attn_implementation)
        if quantization is not None:
            quantize.quantize(model, quantization)
    if quantization is None:
        # transformers wraps PreTrainedModel.to in functools.wraps, whose stub mypy calls unbound.
        model.to(device)  # type: ignore[arg-type]
    else:
        quantize.prepare(model)  # a quantized model is not moved (transformers refuses .to on it)
    model.train()
    return model, info


@exclusive  # process-wide torch state: ckptlab.torchstate
def quantized_on_fake(
    config: PretrainedConfig, task: str, dtype: torch.dtype, quantization: quantize.Quantization
) -> tuple[PreTrainedModel, int]:
    """The model with a 4-bit or 8-bit base as a run builds it, on fake tensors (``quantize.quantize`` and peft's
    ``prepare_model_for_kbit_training``, as ``ckptlab.simulate``), and its parameter bytes as a run's tracker counts
    them: the packed 4-bit weights, their quant states (absmax, with double quantization their own absmax and code
    maps) or the int8 weights and their row scales (SCB) and the modules kept in 16 bits (embeddings, the head, ``llm_int8_skip_modules``) after peft's float32
    cast. The one count of a quantized base's bytes (predict, the preflight's floor): no formula of its own."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = instantiate(without_quantization(copy.deepcopy(config)), task, dtype)
        quantize.quantize(model, quantization)
        quantize.prepare(model)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    storages: dict[int, int] = {}  # a state's tensors by storage, each once (as the tracker counts them)
    for tensor in quantize.quant_state_tensors(model):
        storage = tensor.untyped_storage()
        storages[storage._cdata] = storage.nbytes()
    return model, params + sum(storages.values())


def quantized_parameter_bytes(name_or_dir: str, dtype: torch.dtype, quantization: quantize.Quantization) -> int:
    """:func:`quantized_on_fake`'s bytes for a preset, folder or Hub name (kept per files' stamp, as ``describe``)."""
    return _quantized_parameter_bytes(name_or_dir, _files_stamp(name_or_dir), dtype, quantization)


@functools.lru_cache(maxsize=16)
def _quantized_parameter_bytes(
    name_or_dir: str, stamp: tuple[tuple[str, int, int], ...], dtype: torch.dtype, quantization: quantize.Quantization
) -> int:
    config, _, task = load_config(name_or_dir)
    return quantized_on_fake(config, task, dtype, quantization)[1]


def without_quantization(config: PretrainedConfig) -> PretrainedConfig:
    """``config`` without its ``quantization_config`` (a copy; itself when it has none): ``from_config`` builds
    random float weights, which ``ckptlab.model.quantize`` quantizes as loading would."""
    if getattr(config, "quantization_config", None) is None:
        return config
    config = copy.deepcopy(config)
    del config.quantization_config
    return config


def write_preset_facts() -> None:
    """Describe every preset and store the answers in ``presets.PRESET_FACTS_FILE`` (what ``models`` prints).

    Run after changing a preset; tests/model/test_preset_facts.py fails until the file matches.
    """
    facts = {preset.name: describe_on_meta(preset.name).to_dict() for preset in list_presets()}
    presets.PRESET_FACTS_FILE.write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
