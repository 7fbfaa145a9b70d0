"""Settings in a URL: a :class:`RunSpec` to query parameters and back, forgiving bad values.

A shared link must always open: every value that does not parse or is out of range falls
back to its default, and the reason is returned as a warning (a :class:`~ckptlab.fact.Fact` under
``said.link.*``) for the page to word in its language.

    ?model=tiny-qwen3&seq=1024&batch=1&dtype=auto&device=auto&n=2&offload=0&repeats=4&warmup=2&opt=adamw&lora=off

``n=off`` is checkpointing off. ``model`` is a preset name or a local directory path.
``opt`` is the optimizer (adamw, sgd, none); ``lora=8`` trains rank-8 LoRA adapters on a
frozen base, on the modules in ``targets=q_proj,v_proj`` (absent: every projection).
Whether the targets exist in the model is checked later, by the page, which has the model.
The At-scale page adds ``gpus=8`` (:func:`gpus_from_query`): GPUs sharing the model under FSDP2.
Trainer's side of the step, where it is not the default: ``accum=4`` (gradient accumulation steps),
``mp=bf16`` (mixed precision), ``clip=0.5`` (max_grad_norm), ``attn=eager`` (``ckptlab.lab.stepboxes``).
``selective=attention`` is the CP layers' selective policy (``ckptlab.model.selective``; absent: none).
``qlora=1`` is a 4-bit base, QLoRA's setting (``ckptlab.model.quantize.QLORA``; needs ``lora``; absent: none).
``attn=eager`` is the attention implementation (``ckptlab.model.attention``; absent: sdpa).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..fact import Fact
from ..model.attention import EAGER, available_attentions
from ..model.quantize import QLORA
from ..model.selective import CHOICES as SELECTIVE_CHOICES
from ..model.selective import NONE, selective_key
from ..spec import DEVICES, DTYPES, MAX_ACCUMULATION_STEPS, MIXED_PRECISIONS, OPTIMIZERS, RunSpec
from .stepboxes import step_query

# Bounds shared by the query parser and the page's widgets.
SEQ_MAX = 262_144
BATCH_MAX = 256
REPEATS_MAX = 50
WARMUP_MAX = 20
LORA_RANK_MAX = 1024
CLIP_MAX = 1e6  # max_grad_norm in a link and the box: far above any gradient norm a step sees
LORA_RANK_DEFAULT = 8  # the rank a page's LoRA box offers first: peft's LoraConfig default (r=8), on every page

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class _IntField:
    attr: str
    low: int
    high: int


_INTS = {
    "seq": _IntField("seq_len", 1, SEQ_MAX),
    "batch": _IntField("batch_size", 1, BATCH_MAX),
    "repeats": _IntField("repeats", 1, REPEATS_MAX),
    "warmup": _IntField("warmup", 0, WARMUP_MAX),
    "accum": _IntField("gradient_accumulation_steps", 1, MAX_ACCUMULATION_STEPS),
}


def spec_to_query(spec: RunSpec) -> dict[str, str]:
    """The query parameters that :func:`spec_from_query` turns back into ``spec`` (seed aside)."""
    return {
        "model": spec.model,
        "seq": str(spec.seq_len),
        "batch": str(spec.batch_size),
        "dtype": spec.dtype,
        "device": spec.device,
        "n": "off" if spec.every_n_layers is None else str(spec.every_n_layers),
        "offload": "1" if spec.offload else "0",
        "repeats": str(spec.repeats),
        "warmup": str(spec.warmup),
        "opt": spec.optimizer,
        "lora": "off" if spec.lora_rank is None else str(spec.lora_rank),
        **({"targets": ",".join(spec.lora_targets)} if spec.lora_targets else {}),
        **step_query(spec.to_dict()),
        **({"selective": selective_key(spec.selective)} if spec.selective != NONE else {}),
        **({"qlora": "1"} if spec.quantization is not None else {}),
    }


def spec_from_query(
    params: Mapping[str, str | Sequence[str]],
    *,
    devices: Sequence[str] = DEVICES,
    default: RunSpec | None = None,
) -> tuple[RunSpec, list[Fact]]:
    """Read settings from query parameters; anything unusable falls back with a warning.

    Args:
        params: the URL's query parameters (a repeated key may come as a list: its last value counts).
        devices: the device choices this machine offers ("cuda" only where there is one).
        default: the settings for missing or bad values (``RunSpec()`` if ``None``).

    Returns:
        ``(spec, warnings)``: a spec that passes ``RunSpec.validate()`` and one fact per
        value that was ignored. Whether the model exists is checked later, by the page.
    """
    base = default or RunSpec()
    values = {key: _last(value) for key, value in params.items()}
    changes: dict[str, Any] = {}  # RunSpec fields, each value checked above: replace(base, **changes)
    warnings: list[Fact] = []
    for key in [key for key, value in values.items() if has_control_character(value)]:
        warnings.append(Fact("link.control_character", {"key": key, "value": values.pop(key)}))

    model = values.get("model", "").strip()
    if model:
        changes["model"] = model
    for key, field in _INTS.items():
        if key in values:
            number = _int(values[key])
            if number is None or not field.low <= number <= field.high:
                warnings.append(
                    Fact(
                        "link.not_in_range",
                        {**_ignored(key, values, getattr(base, field.attr)), "low": field.low, "high": field.high},
                    )
                )
            else:
                changes[field.attr] = number
    for key, choices in (("dtype", DTYPES), ("device", tuple(devices))):
        if key in values:
            if values[key] in choices:
                changes[key] = values[key]
            else:
                warnings.append(
                    Fact(
                        "link.not_available",
                        {**_ignored(key, values, getattr(base, key)), "choices": ", ".join(choices)},
                    )
                )
    if "n" in values:
        text = values["n"].strip().lower()
        number = _int(text)
        if text in ("off", "none"):
            changes["every_n_layers"] = None
        elif number is not None and number >= 1:
            changes["every_n_layers"] = number
        else:
            warnings.append(Fact("link.not_every_n", _ignored("n", values, base.every_n_layers)))
    if "offload" in values:
        flag = values["offload"].strip().lower()
        if flag in _TRUE or flag in _FALSE:
            changes["offload"] = flag in _TRUE
        else:
            warnings.append(Fact("link.not_a_flag", _ignored("offload", values, int(base.offload))))

    for key, choices, attr in (
        ("mp", MIXED_PRECISIONS, "mixed_precision"),
        ("opt", OPTIMIZERS, "optimizer"),
        ("selective", SELECTIVE_CHOICES, "selective"),
        ("attn", available_attentions(), "attn_implementation"),
    ):
        if key in values:
            if values[key].strip().lower() in choices:
                changes[attr] = values[key].strip().lower()
            else:
                warnings.append(
                    Fact(
                        "link.not_one_of", {**_ignored(key, values, getattr(base, attr)), "choices": ", ".join(choices)}
                    )
                )
    if "clip" in values:
        try:
            bound = float(values["clip"])
        except ValueError:
            bound = math.nan
        if math.isfinite(bound):
            # The page's box holds 0 to CLIP_MAX: a bound outside is clamped, and the link is told so.
            changes["max_grad_norm"] = min(max(bound, 0.0), CLIP_MAX)
            if changes["max_grad_norm"] != bound:
                warnings.append(
                    Fact(
                        "link.clamped",
                        {"key": "clip", "value": values["clip"], "used": f"{changes['max_grad_norm']:g}"},
                    )
                )
        else:
            warnings.append(Fact("link.not_a_number", _ignored("clip", values, f"{base.max_grad_norm:g}")))
    if "lora" in values:
        text = values["lora"].strip().lower()
        number = _int(text)
        if text in _FALSE or text == "none":
            changes["lora_rank"] = None
        elif number is not None and 1 <= number <= LORA_RANK_MAX:
            changes["lora_rank"] = number
        else:
            warnings.append(
                Fact("link.not_a_rank", {**_ignored("lora", values, base.lora_rank or "off"), "high": LORA_RANK_MAX})
            )
    if "qlora" in values:
        flag = values["qlora"].strip().lower()
        if flag in _TRUE or flag in _FALSE:
            changes["quantization"] = QLORA if flag in _TRUE else None
        else:
            warnings.append(Fact("link.not_a_flag", _ignored("qlora", values, int(base.quantization is not None))))
    if "targets" in values:
        names = tuple(dict.fromkeys(name.strip() for name in values["targets"].split(",") if name.strip()))
        changes["lora_targets"] = names or None  # empty: every projection

    spec = replace(base, **changes)
    if spec.lora_targets is not None and spec.lora_rank is None:
        spec = replace(spec, lora_targets=None)  # targets without LoRA mean nothing; not worth a warning
    if spec.quantization is not None and spec.lora_rank is None:
        spec = replace(spec, quantization=None)  # a 4-bit base trains adapters only: without LoRA, none
    if spec.offload and spec.every_n_layers is None:
        warnings.append(Fact("link.needs_checkpointing", {"key": "offload", "value": "1", "fallback": "off"}))
        spec = replace(spec, offload=False)
    if spec.selective != NONE and spec.every_n_layers is None:
        warnings.append(
            Fact(
                "link.needs_checkpointing",
                {"key": "selective", "value": selective_key(spec.selective), "fallback": NONE},
            )
        )
        spec = replace(spec, selective=NONE)
    if spec.selective == "attention" and spec.attn_implementation == EAGER:  # the pair RunSpec refuses
        warnings.append(Fact("link.attention_policy_eager", {"fallback": NONE}))
        spec = replace(spec, selective=NONE)
    if spec.mixed_precision != "none" and spec.dtype == "float16":
        warnings.append(Fact("link.needs_float32", {"value": spec.mixed_precision}))
        spec = replace(spec, mixed_precision="none")
    return spec, warnings


def gpus_from_query(value: str | Sequence[str], choices: Sequence[int], default: int = 1) -> tuple[int, list[Fact]]:
    """The number of GPUs in a link (``?gpus=8``), one of ``choices``; anything else falls back with a warning.

    Returns:
        ``(gpus, warnings)``.
    """
    text = _last(value).strip()
    number = None if has_control_character(text) else _int(text)
    if number is not None and number in choices:
        return number, []
    listed = ", ".join(str(choice) for choice in choices)
    return default, [Fact("link.not_one_of", {"key": "gpus", "value": text, "choices": listed, "default": default})]


def _ignored(key: str, values: Mapping[str, str], default: object) -> dict[str, object]:
    """The params every "this value of the link is ignored" fact names: the key, the value given, the one used."""
    return {"key": key, "value": values[key], "default": default}


def has_control_character(text: str) -> bool:
    """True when ``text`` holds a control character (a NUL byte, a newline, an escape): no setting has one, and a
    NUL in a path makes the operating system's calls raise rather than answer."""
    return any(unicodedata.category(character) == "Cc" for character in text)


def _last(value: str | Sequence[str]) -> str:
    if isinstance(value, str):
        return value
    return str(value[-1]) if len(value) else ""


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except (TypeError, ValueError):
        return None
