"""Settings in a URL: a :class:`RunSpec` to query parameters and back, forgiving bad values.

A shared link must always open: every value that does not parse or is out of range falls
back to its default, and the reason is returned as a warning (a :class:`~ckptlab.fact.Fact` under
``said.link.*``) for the page to word in its language. Each field's key, how it is read and its bounds are
declared with the field (``ckptlab.spec_fields``); this module has one reader for each way (:data:`READERS`).

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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import spec_fields
from ..fact import Fact
from ..model.attention import EAGER
from ..model.selective import NONE, selective_key
from ..spec import RunSpec
from ..spec_fields import (  # the bounds a link and the widgets offer: declared with their fields, re-exported here
    BATCH_MAX,
    CLIP_MAX,
    DEVICES,
    LORA_RANK_MAX,
    REPEATS_MAX,
    SEQ_MAX,
    WARMUP_MAX,
    SpecField,
    split_names,
)

__all__ = [
    "BATCH_MAX",
    "CLIP_MAX",
    "LORA_RANK_DEFAULT",
    "LORA_RANK_MAX",
    "REPEATS_MAX",
    "SEQ_MAX",
    "WARMUP_MAX",
    "gpus_from_query",
    "has_control_character",
    "spec_from_query",
    "spec_to_query",
]

LORA_RANK_DEFAULT = 8  # the rank a page's LoRA box offers first: peft's LoraConfig default (r=8), on every page

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _written(field: SpecField, value: Any) -> str | None:
    """A field's value as its link writes it; None: no key (an empty list of names)."""
    assert field.link is not None
    reads = field.link.reads
    if reads in ("every_n", "rank_or_off"):
        return "off" if value is None else str(value)
    if reads in ("flag", "preset"):
        return "1" if value not in (None, False) else "0"
    if reads == "names":
        return ",".join(value) if value else None
    if reads == "number":
        return f"{value:g}"
    return selective_key(value) if isinstance(value, tuple) else str(value)


def spec_to_query(spec: RunSpec, names: Collection[str] | None = None) -> dict[str, str]:
    """The query parameters that :func:`spec_from_query` turns back into ``spec`` (seed aside): each declared field's
    key (``ckptlab.spec_fields``), the first keys always, the others where they differ from the default.

    The one writer of a link: ``names``, the fields a page shows, where it shows fewer than all
    (``ckptlab.lab.widgets.PageWidgets.query``); a page adds only its own keys.
    """
    defaults = RunSpec()
    query = {}
    for field in spec_fields.FIELDS:  # read when called: a field declared there is written by itself
        value = getattr(spec, field.name)
        if names is not None and field.name not in names:
            continue
        if field.link is None or (not field.link.always and value == getattr(defaults, field.name)):
            continue
        text = _written(field, value)
        if text is not None:
            query[field.link.key] = text
    return query


class _Reading:
    """One link being read: its values, the changes to the spec so far and the warnings."""

    def __init__(self, values: dict[str, str], base: RunSpec, devices: Sequence[str]) -> None:
        self.values, self.base, self.devices = values, base, tuple(devices)
        self.changes: dict[str, Any] = {}  # RunSpec fields, each value checked: replace(base, **changes)
        self.warnings: list[Fact] = []

    def ignored(self, field: SpecField, default: object = None, **more: object) -> dict[str, object]:
        """The params of "this value is ignored": the key, the value given, the one used (``default``, else the
        base's)."""
        assert field.link is not None
        used = getattr(self.base, field.name) if default is None else default
        return {**_ignored(field.link.key, self.values, used), **more}


def _read_text(reading: _Reading, field: SpecField, text: str) -> None:
    if text.strip():
        reading.changes[field.name] = text.strip()


def _read_int(reading: _Reading, field: SpecField, text: str) -> None:
    number = _int(text)
    if number is None or not field.low <= number <= field.offered:  # type: ignore[operator]
        reading.warnings.append(Fact("link.not_in_range", reading.ignored(field, low=field.low, high=field.offered)))
    else:
        reading.changes[field.name] = number


def _read_offered(reading: _Reading, field: SpecField, text: str) -> None:
    choices = reading.devices if field.name == "device" else field.offered_choices()
    if text in choices:
        reading.changes[field.name] = text
    else:
        reading.warnings.append(
            Fact("link.not_available", reading.ignored(field, choices=", ".join(map(str, choices))))
        )


def _read_every_n(reading: _Reading, field: SpecField, text: str) -> None:
    text, number = text.strip().lower(), _int(text)
    if text in ("off", "none"):
        reading.changes[field.name] = None
    elif number is not None and number >= field.low:  # type: ignore[operator]
        reading.changes[field.name] = number
    else:
        reading.warnings.append(Fact("link.not_every_n", reading.ignored(field)))


def _read_flag(reading: _Reading, field: SpecField, text: str) -> None:
    assert field.link is not None
    flag, off = text.strip().lower(), False if field.link.on is True else None
    if flag in _TRUE or flag in _FALSE:
        reading.changes[field.name] = field.link.on if flag in _TRUE else off
    else:
        was = getattr(reading.base, field.name)
        reading.warnings.append(Fact("link.not_a_flag", reading.ignored(field, int(was not in (None, False)))))


def _read_one_of(reading: _Reading, field: SpecField, text: str) -> None:
    choices = field.offered_choices()
    if text.strip().lower() in choices:
        reading.changes[field.name] = text.strip().lower()
    else:
        reading.warnings.append(Fact("link.not_one_of", reading.ignored(field, choices=", ".join(map(str, choices)))))


def _read_number(reading: _Reading, field: SpecField, text: str) -> None:
    assert field.link is not None and field.low is not None and field.offered is not None
    try:
        bound = float(text)
    except ValueError:
        bound = math.nan
    if field.never is not None and bound == field.never:  # clip=inf: what --max-grad-norm inf means (never clip)
        reading.changes[field.name] = field.never
    elif math.isfinite(bound):
        # The page's box holds low to offered: a value outside is clamped, and the link is told so.
        used = min(max(bound, float(field.low)), float(field.offered))
        reading.changes[field.name] = used
        if used != bound:
            reading.warnings.append(
                Fact("link.clamped", {"key": field.link.key, "value": text, "used": used, "unit": ""})
            )
    else:
        reading.warnings.append(
            Fact("link.not_a_number", reading.ignored(field, f"{getattr(reading.base, field.name):g}"))
        )


def _read_rank_or_off(reading: _Reading, field: SpecField, text: str) -> None:
    text, number = text.strip().lower(), _int(text)
    if text in _FALSE or text == "none":
        reading.changes[field.name] = None
    elif number is not None and field.low <= number <= field.offered:  # type: ignore[operator]
        reading.changes[field.name] = number
    else:
        was = getattr(reading.base, field.name)
        reading.warnings.append(Fact("link.not_a_rank", reading.ignored(field, was or "off", high=field.offered)))


def _read_names(reading: _Reading, field: SpecField, text: str) -> None:
    names = split_names(text)
    reading.changes[field.name] = names or None  # empty: the default (for LoRA's targets: every projection)


# How a link's value is read (spec_fields.Link.reads), in the order a link is read: its warnings come in this order.
READERS: dict[str, Callable[[_Reading, SpecField, str], None]] = {
    "text": _read_text,
    "int": _read_int,
    "offered": _read_offered,
    "every_n": _read_every_n,
    "flag": _read_flag,
    "one_of": _read_one_of,
    "number": _read_number,
    "rank_or_off": _read_rank_or_off,
    "preset": _read_flag,
    "names": _read_names,
}


def spec_from_query(
    params: Mapping[str, str | Sequence[str]],
    *,
    devices: Sequence[str] = DEVICES,
    default: RunSpec | None = None,
) -> tuple[RunSpec, list[Fact]]:
    """Read settings from query parameters; anything unusable falls back with a warning.

    Each declared field's key is read as its declaration says (``ckptlab.spec_fields.Link.reads``), the readers in
    the order of :data:`READERS`.

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
    warnings: list[Fact] = []
    for key in [key for key, value in values.items() if has_control_character(value)]:
        warnings.append(Fact("link.control_character", {"key": key, "value": values.pop(key)}))
    reading = _Reading(values, base, devices)
    for reads, read in READERS.items():
        for field in spec_fields.FIELDS:
            if field.link is not None and field.link.reads == reads and field.link.key in values:
                read(reading, field, values[field.link.key])
    warnings += reading.warnings

    spec = replace(base, **reading.changes)
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
