"""Configs: a preset, a ``save_pretrained()`` folder or a Hub repository into a transformers config, its task,
and its model class.

No weight is downloaded and no remote code is run: a folder's ``config.json``, or the one fetched from the Hub
(``ckptlab.model.hub``), is read as JSON and checked (``ckptlab.model.folder_checks``) before transformers
parses it. :func:`load_config` is the one place a model's name is resolved.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_MASKED_LM_MAPPING

from ..errors import ModelLoadError, Option, SpecError, UnsupportedModelError
from . import folder_checks, folder_files, hub
from .presets import CAUSAL_LM, MASKED_LM, PRESETS, Preset, check_model_named, preset_names


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ModelLoadError: if there is no such preset; the message lists the valid names.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ModelLoadError(key="model.no_preset", name=name, presets=preset_names()) from None


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
        raise UnsupportedModelError(key="model.no_task_model", model_type=repr(config.model_type), task=task)
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
    raise SpecError(key="api.task", task=task, causal=CAUSAL_LM, masked=MASKED_LM)


def load_config(name_or_dir: str) -> tuple[PretrainedConfig, str, str]:
    """The config of a preset, of a local ``save_pretrained()`` folder, or of a Hub repository.

    A preset name wins over a folder of the same name in the working directory, and an existing folder wins
    over a Hub repository of the same ``owner/name``. A name written as a path never goes to the Hub.

    Args:
        name_or_dir: a preset name (see :func:`list_presets`), an existing directory, or a Hub repository
            ``owner/name`` (``owner/name@revision`` for a branch, tag or commit): its ``config.json`` only.

    Returns:
        ``(config, source, task)``: a fresh config the caller may change, ``"preset"``, ``"local"`` or
        ``"hub"``, and ``"causal-lm"`` or ``"masked-lm"``.

    Raises:
        ModelLoadError: unknown name, missing or unreadable ``config.json``, a Hub fetch that failed.
        UnsupportedModelError: not a causal or masked text LM, or the config needs remote code.
    """
    name_or_dir = os.fspath(name_or_dir)
    check_model_named(name_or_dir)
    if name_or_dir in PRESETS:
        preset = PRESETS[name_or_dir]
        kwargs = dict(preset.config)
        config = AutoConfig.for_model(kwargs.pop("model_type"), **copy.deepcopy(kwargs))
        return config, "preset", preset.task
    if not os.path.isdir(name_or_dir) and hub.is_repo_name(name_or_dir):
        config_file = hub.config_file(name_or_dir)
        config = _config_in_folder(os.path.dirname(config_file), config_file, shown=name_or_dir)
        return config, hub.HUB, infer_task(config)
    config = _load_local_config(name_or_dir)
    return config, "local", infer_task(config)


def _load_local_config(path: str) -> PretrainedConfig:
    folder_files.check_folder(path)  # before any file of it is opened, by us or by a loader
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ModelLoadError(key="model.no_config", model=Option("model"), path=repr(path), presets=preset_names())
    return _config_in_folder(path, config_file, shown=path)


def _config_in_folder(folder: str, config_file: str, shown: str) -> PretrainedConfig:
    """The config in ``folder``'s ``config_file``, checked; ``shown`` is how a message names the model."""
    path = shown
    # Read the raw JSON first so that a config needing custom code is refused with our
    # message, before transformers can ask on stdin whether to run it, and so that sizes
    # transformers' own arithmetic chokes on are refused by name (ckptlab.folder_checks).
    raw = folder_checks.read_config_json(config_file)
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    # A model_type that is not a string (a list, say) is unknown too: `in` would raise TypeError on it.
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        if isinstance(raw, dict) and raw.get("auto_map"):
            raise UnsupportedModelError(key="model.remote_code", path=repr(path), model_type=repr(model_type))
        raise UnsupportedModelError(
            key="model.unknown_type", path=repr(path), model_type=repr(model_type), presets=preset_names()
        )
    folder_checks.check_raw_config(raw, config_file, CONFIG_MAPPING[model_type].attribute_map)
    try:
        # Never trust_remote_code=True; False (not None) also keeps transformers from prompting.
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, StrictDataclassError, ArithmeticError, RecursionError) as exc:
        raise folder_checks.config_error(config_file, exc) from exc
    folder_checks.check_config(config, config_file)
    return config


def infer_task(config: PretrainedConfig) -> str:
    """The head ``config`` asks for: :data:`CAUSAL_LM` or :data:`MASKED_LM`.

    Raises:
        UnsupportedModelError: neither a causal nor a masked language model.
    """
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
        key="model.not_a_language_model",
        model_type=repr(config.model_type),
        config_class=type(config).__name__,
        presets=preset_names(),
    )


def config_with(config: PretrainedConfig, overrides: Mapping[str, Any] | None) -> PretrainedConfig:
    """A copy of ``config`` with ``overrides`` applied (aliases resolved, per-layer lists rebuilt); ``config`` itself
    when there are none. A key that a wrapper (Gemma3Config, Llama4Config) lacks and its text config has is the text
    config's: ``num_hidden_layers`` of Gemma 3 is its language model's depth.

    Raises:
        SpecError: an unknown attribute or an invalid resulting config.
    """
    if not overrides:
        return config
    text_part = _text_part(config)
    if text_part is not None:  # a wrapper (Gemma3Config, Llama4Config): its text config's keys go to it
        name, text = text_part
        inner = {key: value for key, value in overrides.items() if not hasattr(config, key) and hasattr(text, key)}
        if inner:
            outer = {key: value for key, value in overrides.items() if key not in inner}
            try:
                wrapped = type(config).from_dict({**config.to_dict(), name: config_with(text, inner).to_dict()})
            except (TypeError, ValueError, StrictDataclassError) as exc:
                raise SpecError(key="api.config_overrides_invalid", overrides=dict(overrides), error=str(exc)) from exc
            return config_with(wrapped, outer)
    unknown = [key for key in overrides if not hasattr(config, key)]
    if unknown:
        raise SpecError(key="api.config_overrides_unknown", unknown=unknown, config_class=type(config).__name__)
    # Aliases (GPT-2's num_hidden_layers -> n_layer) are resolved so the new value cannot
    # lose to the old one stored under the real name.
    aliases = getattr(config, "attribute_map", {}) or {}
    resolved = {aliases.get(key, key): value for key, value in overrides.items()}
    values = {**config.to_dict(), **resolved}
    new_depth = resolved.get(aliases.get("num_hidden_layers", "num_hidden_layers"))
    old_depth = getattr(config, "num_hidden_layers", None)
    if isinstance(new_depth, int) and isinstance(old_depth, int) and _is_depth(new_depth) and _is_depth(old_depth):
        _keep_in_step(values, resolved, old_depth, new_depth)
    try:
        return type(config).from_dict(values)
    # transformers 5 validates configs with huggingface_hub strict dataclasses, whose
    # errors are not ValueErrors.
    except (TypeError, ValueError, StrictDataclassError) as exc:
        raise SpecError(key="api.config_overrides_invalid", overrides=dict(overrides), error=str(exc)) from exc


def _text_part(config: PretrainedConfig) -> tuple[str, PretrainedConfig] | None:
    """The name and the config of the text model a wrapper holds (Gemma3Config's ``text_config``); None for a config
    that is its own text config, or whose text part is not one sub-config (transformers finds several)."""
    try:
        text = config.get_text_config()
    except ValueError:  # several text configs (an encoder and a decoder): no one text part
        return None
    if text is config:
        return None
    name = next(
        (name for name in getattr(config, "sub_configs", {}) or {} if getattr(config, name, None) is text), None
    )
    return None if name is None else (name, text)


def _is_depth(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _keep_in_step(values: dict[str, Any], resolved: Mapping[str, Any], old_depth: int, new_depth: int) -> None:
    """Per-layer lists and lists of layer indices of ``values`` made for ``new_depth`` layers (in place), unless
    the overrides (``resolved``) give them."""
    for key in per_layer_lists(values, old_depth):
        if key in resolved:
            continue  # the caller's own list for the new depth
        kept = layers_kept(values[key], new_depth)
        if kept is None:
            values.pop(key)  # no pattern to follow: transformers rebuilds its default, as before
        else:
            values[key] = kept
    for key in layer_index_lists(values, old_depth):
        if key not in resolved and new_depth < old_depth:
            # Zamba2's hybrid_layer_ids, which from_dict would set back over the one its config derives.
            values[key] = [index for index in values[key] if index < new_depth]


def per_layer_lists(values: Mapping[str, Any], depth: Any) -> list[str]:
    """The keys of ``values`` (a config's dict) that hold one entry per layer of a ``depth``-layer model.

    Gemma 3's ``layer_types``, hybrids' ``layers_block_type`` (Zamba2 stores ``layer_types`` under that name),
    Llama 4's ``no_rope_layers``, Gemma 3n's per-layer ``intermediate_size``, ... A list of layer indices
    (``hybrid_layer_ids``, strictly increasing whole numbers) is not one, even when it happens to be as long.
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        return []
    return [
        key
        for key, value in values.items()
        if isinstance(value, (list, tuple)) and len(value) == depth and not _is_index_list(value)
    ]


def layer_index_lists(values: Mapping[str, Any], depth: Any) -> list[str]:
    """The keys of ``values`` that list layers by index (``hybrid_layer_ids``, ``full_attn_idxs``): named for layers,
    strictly increasing whole numbers below ``depth``."""
    if not isinstance(depth, int) or isinstance(depth, bool):
        return []
    return [
        key
        for key, value in values.items()
        if isinstance(value, (list, tuple))
        and any(word in key for word in ("layer", "idx", "ids"))
        and (len(value) == 1 or _is_index_list(value))
        and all(isinstance(item, int) and not isinstance(item, bool) and 0 <= item < depth for item in value)
    ]


def _is_index_list(value: Sequence[Any]) -> bool:
    numbers = [item for item in value if isinstance(item, int) and not isinstance(item, bool)]
    return len(numbers) == len(value) > 1 and all(a < b for a, b in itertools.pairwise(numbers))


def smallest_period(items: Sequence[Any]) -> int:
    """The fewest leading items whose repetition gives ``items`` (``len(items)`` when nothing repeats); 1 when empty."""
    for period in range(1, len(items)):
        if all(items[index] == items[index % period] for index in range(period, len(items))):
            return period
    return max(len(items), 1)


def layers_kept(entries: Sequence[Any], depth: int) -> list[Any] | None:
    """A per-layer list for a copy of ``depth`` layers: the first ``depth`` entries, or the pattern continued.

    A shallower copy keeps the real layers' entries in step with the layers it keeps (the fold's shallow copies
    keep the first layers and whole repeating units, :mod:`ckptlab.step.fold`); a deeper one continues the
    list's repeating pattern. None where a deeper copy has no pattern to continue.
    """
    if depth <= len(entries):
        return list(entries[:depth])
    period = smallest_period(entries)
    if period == len(entries):
        return None
    return [entries[index % period] for index in range(depth)]
