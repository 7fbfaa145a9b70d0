"""A user's ``TrainingArguments`` read as the lab's spec: the fields that change a training step's bytes.

``RunSpec.from_training_args`` and ``python -m ckptlab run|simulate|sweep --training-args FILE.json``
take the arguments a fine-tune already has (a ``TrainingArguments`` or the JSON of the fields
``TrainingArguments(**json)`` takes). :func:`read_training_args` says which spec fields they set:

- ``per_device_train_batch_size`` -> ``batch_size``; ``gradient_accumulation_steps``; ``max_grad_norm``;
  ``optim`` and ``optim_args`` -> ``optimizer`` and ``optim_args``; ``bf16``/``fp16`` -> ``mixed_precision``;
  ``use_cpu`` -> ``device``;
- ``activation_checkpointing`` (or its older name ``gradient_checkpointing``) and its kwargs ->
  ``every_n_layers`` and ``offload``, which Trainer pops from the kwargs (defaults 1 and False).

A field the arguments leave out takes Trainer's own default (read from ``TrainingArguments``
itself, batch 8 per device among them), and the reading names them; the fields that do not change
the step's bytes (learning rate, logging, saving, ...) are read and named as not used. A file
written for a GPU (``bf16=True``) is read on any machine: ``TrainingArguments`` refuses bf16 without
a GPU, so the file's other fields are checked by ``TrainingArguments`` with bf16 and fp16 set aside.

``TrainingArguments(**json)`` opens the files some fields name (``accelerator_config``, ``fsdp_config``,
``deepspeed``: ``/dev/zero`` there reads until memory runs out) and ``json.loads`` any text starting with
"{" in its dict fields, without a depth bound. So the lab reads the file itself (a regular file of at most
:data:`MAX_FILE_BYTES`, nested at most :data:`MAX_JSON_DEPTH` deep), refuses a field that names a file or
a config (:data:`FILE_FIELDS`) before anything is opened, parses the checkpointing kwargs itself, and hands
``TrainingArguments`` only the fields it counts and the plain values (numbers, text, lists of them) of the
fields it reads and does not count: no dict field, no text of one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import Option, SpecError
from .fact import Fact, worded
from .files import json_depth, read_json_object
from .model.libraries import trainer_modules_without_peft
from .spec_fields import FIELDS

MAX_FILE_BYTES = 1_000_000  # a TrainingArguments file is a few KiB; anything larger is not one
MAX_JSON_DEPTH = 16  # TrainingArguments' deepest field is a dict of kwargs: two levels; json parses by recursion
# Fields whose value TrainingArguments opens as a file or hands to DeepSpeed / accelerate as a config: the lab
# counts none of them, and refuses them before anything is opened (a dict there is refused too: one rule).
FILE_FIELDS = ("accelerator_config", "fsdp_config", "deepspeed")
_DICT_FIELDS = ("lr_scheduler_kwargs",)  # read, not counted, and never handed on: TrainingArguments json.loads them
_LISTED = 10  # names an unknown-fields message lists before "and N more"
# What the lab's steps run of the checkpointing kwargs left after Trainer's pops (every_n_layers, offload): transformers'
# non-reentrant checkpoint, its default ({} becomes use_reentrant=False). A key with another value (use_reentrant=True,
# a context_fn, preserve_rng_state, ...) changes what torch's checkpoint keeps or runs, so it is refused by name.
RUN_KWARGS: dict[str, Any] = {"use_reentrant": False}

# TrainingArguments' fields the lab reads, with the types their JSON values must have.
_BOOL, _INT, _NUMBER, _TEXT = (bool,), (int,), (int, float), (str,)
STEP_FIELDS: dict[str, tuple[type, ...]] = {
    "per_device_train_batch_size": _INT,
    "gradient_accumulation_steps": _INT,
    "max_grad_norm": _NUMBER,
    "optim": _TEXT,
    "optim_args": (str, type(None)),
    "bf16": _BOOL,
    "fp16": _BOOL,
    "use_cpu": _BOOL,
    "activation_checkpointing": _BOOL,
    "gradient_checkpointing": _BOOL,
    "activation_checkpointing_kwargs": (dict, str, type(None)),
    "gradient_checkpointing_kwargs": (dict, str, type(None)),
}
# What a reading says was left at Trainer's default: the fields that change the step (one name per idea), each
# with the RunSpec field it sets (a flag of that field given on the command line means it is not defaulted):
# the TrainingArguments names the fields declare (spec_fields.SpecField.trainer), in STEP_FIELDS' order.
_DECLARED = {field.trainer: field.name for field in FIELDS if field.trainer is not None}
DEFAULTED_NAMES = {name: _DECLARED[name] for name in STEP_FIELDS if name in _DECLARED}


@dataclass(frozen=True)
class TrainingArgsReading:
    """What a user's TrainingArguments set in a spec, and what they left to Trainer's defaults."""

    changes: dict[str, Any]  # RunSpec fields and their values
    defaulted: dict[str, Any]  # step fields the arguments left out, with Trainer's default value
    unused: tuple[str, ...]  # fields given that do not change the step's bytes
    checkpoint_kwargs: dict[str, Any]  # what is left of the checkpointing kwargs after Trainer's pops
    kwargs_field: str = "activation_checkpointing_kwargs"  # the field they came from (or its older name)

    def check_runnable(self) -> None:
        """Refuse checkpointing kwargs the lab's steps do not run (:data:`RUN_KWARGS`), naming the first.

        Raises:
            SpecError: ``training_args.kwarg_not_run``, naming the key and its value (``use_reentrant=True``,
                ``context_fn='os.system'``).
        """
        for key, value in self.checkpoint_kwargs.items():
            if key in RUN_KWARGS and value is RUN_KWARGS[key]:
                continue
            raise SpecError(
                key="training_args.kwarg_not_run",
                field=self.kwargs_field,
                name=str(key),
                value=repr(value),
                selective=Option("selective"),
            )


def checkpointing_kwargs(kwargs: Mapping[str, Any] | str | None) -> tuple[int, bool, dict[str, Any]]:
    """(every_n_layers, offload, the rest) of TrainingArguments' checkpointing kwargs, as ``Trainer.train`` pops them.

    TrainingArguments also takes the dict as JSON text, read here with the file's bounds.

    Raises:
        SpecError: text that is not a JSON object (``training_args.bad_kwargs``).
    """
    parsed = _kwargs_object("activation_checkpointing_kwargs", kwargs) if isinstance(kwargs, str) else kwargs
    rest = dict(parsed or {})
    return rest.pop("every_n_layers", 1), bool(rest.pop("offload", False)), rest


def _kwargs_object(field: str, text: str) -> dict[str, Any]:
    """A dict field given as JSON text, parsed with the file's bounds; it must be an object."""
    try:
        if len(text) > MAX_FILE_BYTES or json_depth(text) > MAX_JSON_DEPTH:
            raise Refused(Fact("training_args.kwargs_too_large", {"limit": MAX_FILE_BYTES, "depth": MAX_JSON_DEPTH}))
        parsed = json.loads(text, parse_constant=_refuse_constant)
        if not isinstance(parsed, dict):
            raise Refused(Fact("training_args.kwargs_not_object", {"kind": type(parsed).__name__}))
    except (ValueError, RecursionError) as error:
        raise SpecError(
            key="training_args.bad_kwargs", field=field, value=repr(text[:60]), error=_detail(error, 120)
        ) from None
    return parsed


def read_training_args(args: Any) -> TrainingArgsReading:
    """The spec fields a ``TrainingArguments`` (or a mapping of its fields) sets.

    Raises:
        SpecError: unknown field names, a value of the wrong type, or fields ``TrainingArguments`` refuses.
    """
    with trainer_modules_without_peft():  # a reading adapts nothing: no peft (ckptlab.model.libraries)
        from transformers import TrainingArguments

    if isinstance(args, TrainingArguments):
        given = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainingArguments)}
        values, left_out = given, set()
    else:
        given = _checked_mapping(args, TrainingArguments)
        values = {**_defaults(TrainingArguments), **given}
        left_out = {name for name in DEFAULTED_NAMES if name not in given}
    optim = str(getattr(values["optim"], "value", values["optim"]))  # an OptimizerNames member or its text
    checkpointing = bool(values.get("activation_checkpointing") or values.get("gradient_checkpointing"))
    kwargs_field = next(
        (name for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs") if values.get(name)),
        "activation_checkpointing_kwargs",
    )
    kwargs = values.get(kwargs_field)
    every_n_layers, offload, rest = checkpointing_kwargs(kwargs)
    mixed = "bf16" if values["bf16"] else "fp16" if values["fp16"] else "none"
    changes: dict[str, Any] = {
        "batch_size": values["per_device_train_batch_size"],
        "gradient_accumulation_steps": values["gradient_accumulation_steps"],
        "max_grad_norm": float(values["max_grad_norm"]),
        "optimizer": optim,
        "optim_args": values["optim_args"],
        "mixed_precision": mixed,
        "every_n_layers": every_n_layers if checkpointing else None,
        "offload": offload if checkpointing else False,
    }
    if values.get("use_cpu"):
        changes["device"] = "cpu"
    defaults = _defaults(TrainingArguments)
    return TrainingArgsReading(
        changes=changes,
        defaulted={name: _plain(defaults[name]) for name in DEFAULTED_NAMES if name in left_out},
        unused=tuple(sorted(name for name in given if name not in STEP_FIELDS and given[name] != defaults.get(name))),
        checkpoint_kwargs=rest,
        kwargs_field=kwargs_field,
    )


def load_training_args_file(path: str | Path) -> dict[str, Any]:
    """The JSON object of a TrainingArguments file, read by ``ckptlab.files``' one reader.

    Raises:
        SpecError: no such file, too large, not JSON, or not an object.
    """
    shown = str(Path(path))

    def refuse(problem: Fact | str) -> SpecError:
        """The file's problem (``read_json_object``'s) as this file's own keyed error."""
        if isinstance(problem, Fact) and problem.key == "file.no_such_file":
            return SpecError(key="training_args.no_file", path=shown)
        if isinstance(problem, Fact) and problem.key == "file.over_bytes":
            return SpecError(key="training_args.too_large", path=shown, limit=MAX_FILE_BYTES)
        if isinstance(problem, Fact) and problem.key == "file.not_object":
            return SpecError(key="training_args.not_object", path=shown, kind=problem.params["kind"])
        return SpecError(key="training_args.not_json", path=shown, error=problem)

    return read_json_object(path, max_bytes=MAX_FILE_BYTES, max_depth=MAX_JSON_DEPTH, refuse=refuse, error=SpecError)


def _refuse_constant(name: str) -> Any:
    raise Refused(Fact("file.not_a_json_number", {"name": name}))


class Refused(ValueError):
    """Why a JSON text of training args is refused, as a fact; caught here and said in the lab's error."""

    def __init__(self, reason: Fact) -> None:
        super().__init__(worded(reason))
        self.reason = reason


def _detail(error: BaseException, limit: int) -> Fact | str:
    """What went wrong reading JSON: the lab's own reason (a fact), or the library's text, cut at ``limit``."""
    return error.reason if isinstance(error, Refused) else str(error)[:limit]


def _checked_mapping(args: Any, arguments_class: type) -> dict[str, Any]:
    if not isinstance(args, Mapping):
        raise SpecError(key="training_args.not_mapping", value=repr(args)[:80], args=args)
    known = {field.name for field in dataclasses.fields(arguments_class)}
    unknown = sorted(str(name)[:60] for name in args if name not in known)
    if unknown:
        more = Fact("training_args.more_fields", {"count": len(unknown) - _LISTED}) if len(unknown) > _LISTED else ""
        raise SpecError(key="training_args.unknown_fields", fields=", ".join(unknown[:_LISTED]), more=more)
    files = [name for name in FILE_FIELDS if args.get(name) is not None]
    if files:
        raise SpecError(key="training_args.file_field", fields=", ".join(files))
    wrong = [
        f"{name}={repr(value)[:80]} (expected {' or '.join(kind.__name__ for kind in kinds)})"
        for name, kinds in STEP_FIELDS.items()
        if name in args
        for value in [args[name]]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    ]
    if wrong:
        raise SpecError(key="training_args.wrong_types", fields="; ".join(wrong))
    if args.get("bf16") and args.get("fp16"):
        raise SpecError(key="training_args.both_precisions")
    checked = dict(args)
    for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs", *_DICT_FIELDS):
        if isinstance(checked.get(name), str):
            checked[name] = _kwargs_object(name, checked[name])
    # Only the counted fields and the plain values of the others reach TrainingArguments: a dict field (or its
    # JSON text) is what it parses or opens, so the lab keeps those to itself.
    handed = {
        name: value
        for name, value in checked.items()
        if name in STEP_FIELDS or (name not in _DICT_FIELDS and _plain_value(value))
    }
    try:
        # TrainingArguments checks the rest (strategies, optimizer names, ...); bf16/fp16 need a GPU to pass its
        # check, and the lab reads them itself, so the check runs without them, on the CPU.
        arguments_class(**{**handed, "bf16": False, "fp16": False, "use_cpu": True})
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        detail = str(error)[:400]
        raise SpecError(key="training_args.refused", error=detail) from None
    return checked


def _plain_value(value: Any) -> bool:
    """A number, a text, None, or a short list of them: what a field TrainingArguments does not open may hold."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, list) and len(value) <= 64 and all(isinstance(v, (bool, int, float, str)) for v in value)


def _defaults(arguments_class: type) -> dict[str, Any]:
    """Every field's default, as ``TrainingArguments`` declares it."""
    defaults = {}
    for field in dataclasses.fields(arguments_class):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)  # an enum member (OptimizerNames) as its text
