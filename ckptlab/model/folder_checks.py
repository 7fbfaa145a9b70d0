"""A bad model folder is one message, found before anything is built.

``ckptlab.model.configs`` and ``catalog`` load a local folder in three steps; the first two have their checks here:

1. ``config.json`` as raw JSON (:func:`read_config_json`, :func:`check_raw_config`):
   readable, an object, every size or count a positive whole number, and no more than
   :data:`MAX_LAYERS` layers. These run before transformers builds the config, whose
   own arithmetic fails with a ``ZeroDivisionError`` for zero heads and which spends
   minutes on per-layer lists for a billion layers.
2. The config transformers built (:func:`check_config`, :func:`config_error`): its
   validation errors and arithmetic failures become one line, and heads must divide the
   width where the architecture derives ``head_dim`` from it, for architectures that do
   not check this themselves too.
3. The weight files: their checks are ``ckptlab.model.weight_checks``.

Then :func:`check_fits` refuses a build whose parameters alone exceed the memory of the
device it would be built on, from the parameter count the catalog took on the ``meta``
device. It is not a check of the folder: ``describe`` and ``simulate`` accept any size,
so a 70B config can still be simulated on a laptop.

Every message names the file and the field or tensor, and says how to fix it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from ..errors import Command, DoesNotFitError, ModelLoadError, Option, one_line
from ..fact import Fact
from ..units import parameter_count
from .hub import MAX_CONFIG_BYTES  # one bound on a config.json, from a folder or the Hub

# describe() builds every layer on the meta device (1-3 ms each on 2 CPU cores) and the
# lab draws and probes each one; the deepest published language models have about 130.
MAX_LAYERS: int = 1024
_DTYPE_FIELDS = ("torch_dtype", "dtype")  # transformers 5 writes "dtype"; older configs "torch_dtype"

# Sizes and counts that must be positive whole numbers when set (None means "derive it"),
# by their usual name and GPT-2's names; the names other architectures store them under
# come from their config class's attribute_map.
_SIZE_FIELDS: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
}
# What each size field is, for a message that refuses its value (said.config_size.<field> in the locale files).
_MEANING = {
    "num_hidden_layers": Fact("config_size.num_hidden_layers"),
    "hidden_size": Fact("config_size.hidden_size"),
    "num_attention_heads": Fact("config_size.num_attention_heads"),
    "num_key_value_heads": Fact("config_size.num_key_value_heads"),
    "head_dim": Fact("config_size.head_dim"),
    "intermediate_size": Fact("config_size.intermediate_size"),
    "vocab_size": Fact("config_size.vocab_size"),
    "max_position_embeddings": Fact("config_size.max_position_embeddings"),
}


# -- 1. config.json as JSON ---------------------------------------------------------------


def read_config_json(config_file: str) -> dict[str, Any]:
    """The JSON object in ``config_file``.

    Raises:
        ModelLoadError: unreadable, not JSON, nested too deeply, or not an object.
    """
    try:
        size = os.path.getsize(config_file)
    except OSError:
        size = 0  # unreadable: open() below says so
    if size > MAX_CONFIG_BYTES:
        raise ModelLoadError(
            key="folder.config_too_large",
            file=config_file,
            size=size,
            limit=MAX_CONFIG_BYTES,
        )
    try:
        with open(config_file, encoding="utf-8") as f:
            raw = json.load(f, parse_constant=_not_a_number, parse_float=_finite_float)
    except _NonFinite as constant:
        raise ModelLoadError(key="folder.non_finite", file=config_file, constant=constant.args[0]) from None
    except RecursionError:
        raise ModelLoadError(key="folder.deep_json", file=config_file) from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(key="folder.not_json", file=config_file, detail=one_line(exc)) from exc
    if not isinstance(raw, dict):
        raise ModelLoadError(key="folder.not_object", file=config_file, kind=type(raw).__name__)
    _check_dtype_fields(raw, config_file)
    return raw


class _NonFinite(ValueError):
    """NaN, Infinity or -Infinity in a JSON file: Python's json accepts them, no config means them."""


def _not_a_number(constant: str) -> Any:
    raise _NonFinite(constant)


def _finite_float(literal: str) -> float:
    """A JSON number as Python reads it, unless it overflows to infinity (``1e400``, ``-1e400``): json hands such a
    literal to ``float``, which gives ``inf`` where no config means one, so it is refused as Infinity is."""
    value = float(literal)
    if not math.isfinite(value):
        raise _NonFinite(literal[:40])
    return value


def _check_dtype_fields(raw: Mapping[str, Any], config_file: str) -> None:
    """A config's dtype must name a torch dtype ("bfloat16"), "auto" or nothing: transformers looks it up on torch."""
    sections = [("", raw)] + (
        [("text_config.", raw["text_config"])] if isinstance(raw.get("text_config"), dict) else []
    )
    for prefix, section in sections:
        for name in _DTYPE_FIELDS:
            value = section.get(name)
            if value is None or value == "auto":
                continue
            if not (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)):
                raise ModelLoadError(
                    key="folder.bad_dtype", file=config_file, field=f"{prefix}{name}", value=repr(value)
                )


def check_raw_config(raw: Mapping[str, Any], config_file: str, aliases: Mapping[str, str] | None = None) -> None:
    """Sizes, counts and field types in the raw ``config.json``, nested configs included, before anything is built.

    Every section is checked: the top level and each ``*_config`` object it carries (``text_config``,
    ``vision_config``, ``audio_config``, BLT's ``encoder_config``, ``decoder_config`` and ``patcher_config``, ...),
    at any depth: sizes and counts are positive whole numbers, every depth (``num_hidden_layers`` and the other
    names of :data:`_DEPTH_NAMES`) at most :data:`MAX_LAYERS`, and no list longer than that (per-layer lists such
    as ``layer_types``): transformers builds one module per layer and loops over such lists, so a depth of 1e9 in a
    vision tower would loop 1e9 times, on the meta device too. ``num_experts_per_tok`` is at most the experts
    there are; ``architectures`` is a list of class names; ``quantization_config`` an object.

    Args:
        raw: the JSON object.
        config_file: named in the message.
        aliases: the config class's ``attribute_map`` (``{"num_hidden_layers": "n_layer"}``),
            so names an architecture stores under are checked whatever they are; a nested config's own
            class (its ``model_type``) gives its aliases.

    Raises:
        ModelLoadError: the first field that is wrong, by name, with its value.
    """
    quantization = raw.get("quantization_config")
    if quantization is not None and not isinstance(quantization, dict):
        raise ModelLoadError(
            key="folder.bad_quantization_config", file=config_file, value=json.dumps(quantization)[:60]
        )
    for prefix, section, section_aliases in _sections(raw, aliases or {}, "", 0):
        _check_section(prefix, section, section_aliases, config_file)


# Fields that count layers (a depth), in some architecture: each at most MAX_LAYERS.
_DEPTH_NAMES = frozenset(
    {
        "num_hidden_layers",
        "n_layer",
        "n_layers",
        "num_layers",
        "num_global_layers",  # Mllama's vision tower
        "encoder_layers",
        "decoder_layers",
        "num_encoder_layers",
        "num_decoder_layers",
    }
)
# Routed experts and the experts each token goes to, by the names MoE configs store them under.
_EXPERTS_NAMES = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_PER_TOKEN_NAMES = ("num_experts_per_tok", "num_experts_per_token", "moe_topk")
_MAX_NESTING = 4  # configs inside configs (Qwen2.5-Omni's thinker holds a text and a vision config): a few levels


def _sections(
    section: Mapping[str, Any], aliases: Mapping[str, str], prefix: str, level: int
) -> list[tuple[str, Mapping[str, Any], Mapping[str, str]]]:
    """``section`` and every ``*_config`` object inside it (quantization_config is no model), with their aliases."""
    found: list[tuple[str, Mapping[str, Any], Mapping[str, str]]] = [(prefix, section, aliases)]
    if level >= _MAX_NESTING:
        return found
    for key, value in section.items():
        if not (isinstance(key, str) and key.endswith("_config") and isinstance(value, dict)):
            continue
        if key == "quantization_config":
            continue
        found += _sections(value, _aliases_of(value, aliases), f"{prefix}{key}.", level + 1)
    return found


def _aliases_of(section: Mapping[str, Any], parent: Mapping[str, str]) -> Mapping[str, str]:
    """A nested config's ``attribute_map``, from its ``model_type`` (save_pretrained writes it); its parent's without."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = section.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        return getattr(CONFIG_MAPPING[model_type], "attribute_map", None) or {}
    return parent


def _check_section(prefix: str, section: Mapping[str, Any], aliases: Mapping[str, str], config_file: str) -> None:
    """One section's sizes, depths, lists, experts and architectures (:func:`check_raw_config`)."""
    fields = {usual: set(names) for usual, names in _SIZE_FIELDS.items()}
    for usual, stored in aliases.items():
        if usual in fields:
            fields[usual].add(stored)
    depths = (_DEPTH_NAMES | fields["num_hidden_layers"]) & section.keys()
    for usual, names in fields.items():
        for name in sorted(names & section.keys()):
            _check_size(f"{prefix}{name}", section[name], usual, config_file)
    for name in sorted(depths):
        value = section[name]
        _check_size(f"{prefix}{name}", value, "num_hidden_layers", config_file)
        if isinstance(value, int) and value > MAX_LAYERS:
            raise ModelLoadError(
                key="folder.too_many_layers",
                file=config_file,
                name=f"{prefix}{name}",
                value=value,
                limit=MAX_LAYERS,
            )
    for name, value in section.items():
        if isinstance(value, list) and len(value) > MAX_LAYERS:
            raise ModelLoadError(
                key="folder.long_list", file=config_file, name=f"{prefix}{name}", length=len(value), limit=MAX_LAYERS
            )
    architectures = section.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(name, str) for name in architectures)
    ):
        raise ModelLoadError(
            key="folder.bad_architectures",
            file=config_file,
            name=f"{prefix}architectures",
            value=json.dumps(architectures)[:60],
        )
    _check_experts(prefix, section, config_file)


def _check_experts(prefix: str, section: Mapping[str, Any], config_file: str) -> None:
    """Each token goes to at most the experts there are: the router's top-k of more than it has fails in torch."""
    experts = next(((name, section[name]) for name in _EXPERTS_NAMES if _is_count(section.get(name))), None)
    per_token = next(((name, section[name]) for name in _PER_TOKEN_NAMES if _is_count(section.get(name))), None)
    if experts is not None and per_token is not None and per_token[1] > experts[1]:
        raise ModelLoadError(
            key="folder.experts_per_token",
            file=config_file,
            per_token_name=f"{prefix}{per_token[0]}",
            per_token=per_token[1],
            experts_name=f"{prefix}{experts[0]}",
            experts=experts[1],
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_size(name: str, value: Any, usual: str, config_file: str) -> None:
    if value is None or isinstance(value, (list, tuple, dict)):
        return  # "derive it" (n_inner, head_dim, ...); per-stage lists belong to vision models, refused later
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelLoadError(
            key="folder.bad_size", file=config_file, name=name, value=json.dumps(value)[:60], meaning=_MEANING[usual]
        )


# -- 2. the config transformers built ------------------------------------------------------


def config_error(config_file: str, exc: BaseException) -> ModelLoadError:
    """One line for an exception transformers raised while building the config or the model from it."""
    cause = exc.__cause__ if isinstance(exc, StrictDataclassError) and exc.__cause__ else exc
    return ModelLoadError(
        key="folder.invalid_model", file=config_file, detail=f"{type(cause).__name__}: {one_line(cause).rstrip('.')}"
    )


def check_config(config: Any, config_file: str) -> None:
    """The sizes of the built config (defaults included), and heads against width.

    ``head_dim`` absent or None means the architecture derives it as
    ``hidden_size // num_attention_heads``, which needs the division to be exact;
    grouped-query attention needs ``num_attention_heads`` to be a multiple of
    ``num_key_value_heads``.

    Raises:
        ModelLoadError: naming the fields and their values.
    """
    text = config.get_text_config()
    stored = {usual: (getattr(text, "attribute_map", None) or {}).get(usual, usual) for usual in _SIZE_FIELDS}
    for usual in _SIZE_FIELDS:
        if usual != "max_position_embeddings":
            _check_size(stored[usual], getattr(text, usual, None), usual, config_file)
    hidden = getattr(text, "hidden_size", None)
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None)
    if hidden and heads and getattr(text, "head_dim", None) is None and hidden % heads:
        divisors = [n for n in range(1, min(hidden, 256) + 1) if hidden % n == 0]
        nearest = min(divisors, key=lambda n: abs(n - heads))
        raise ModelLoadError(
            key="folder.heads_divide",
            file=config_file,
            hidden_name=stored["hidden_size"],
            hidden=hidden,
            heads_name=stored["num_attention_heads"],
            heads=heads,
            nearest=nearest,
        )
    if heads and kv_heads and heads % kv_heads:
        raise ModelLoadError(
            key="folder.kv_groups",
            file=config_file,
            heads_name=stored["num_attention_heads"],
            heads=heads,
            kv_name=stored["num_key_value_heads"],
            kv_heads=kv_heads,
        )


# -- building: does it fit the device at all -----------------------------------------------


def memory_limit(device: torch.device) -> tuple[int, str | Fact, Fact] | None:
    """``(bytes, the device (a GPU's name, or this CPU), its memory)``, said in a message: a CUDA device's total memory, the CPU's physical RAM; None if unknown."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        total = props.total_memory
        return total, props.name, Fact("memory.cuda_total", {"total": total, "name": props.name})
    if device.type == "cpu":
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            return None
        return total, Fact("device.this_cpu"), Fact("memory.cpu_total", {"total": total})
    return None


def check_fits(
    info: Any, dtype: torch.dtype, device: torch.device | str, stored: tuple[int, str] | None = None
) -> None:
    """Refuse a model whose parameters, in ``dtype``, and buffers exceed the device's total memory.

    The rule is the floor of any training step: parameters and buffers (BERT's position ids: 16 GiB each at 2^31
    positions) must be resident, and their gradients, the optimizer and the activations only add to them. So a refusal here is
    never wrong, whatever the sequence length or checkpointing setting; the finer CPU
    check (parameters and gradients against the free memory) stays in ``ckptlab.measure``.

    Args:
        info: the catalog's ``ModelInfo`` (``num_params`` counted on the meta device).
        dtype: the dtype the parameters will have.
        device: where the model would be built.
        stored: a 4-bit base's bytes as a run holds them and its quant type (``catalog.quantized_parameter_bytes``),
            counted instead of ``num_params`` in ``dtype``.

    Raises:
        DoesNotFitError: naming the parameter count, the bytes and the limit.
    """
    device = torch.device(device)
    limit = memory_limit(device)
    element = torch.empty((), dtype=dtype).element_size()
    weights, label = stored or (info.num_params * element, str(dtype).removeprefix("torch."))
    needed = weights + info.buffer_bytes
    if limit is None or needed <= limit[0]:
        return
    _, where, what = limit
    embedding = info.vocab_size * info.hidden_size
    local = info.source == "local"
    raise DoesNotFitError(
        key="model.too_big_local" if local else "model.too_big_preset",
        simulate=Command("simulate", (Option("model", info.name),)),
        where=where,
        embedding=parameter_count(embedding),
        what=what,
        name=repr(info.name),
        parameters=parameter_count(info.num_params),
        needed=needed,
        buffers=info.buffer_bytes,
        dtype=label,
        limit_bytes=limit[0],
        device="CPU" if device.type == "cpu" else where,
        layers=info.num_layers,
        hidden=info.hidden_size,
        vocab=info.vocab_size,
    )
