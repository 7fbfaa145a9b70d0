"""A run's whole code box: the Python that builds and sets up the model the lab measured, from its ``RunSpec``.

One function, :func:`training_code`, writes it for every page and command that shows a model's code (the Lab page,
the Trade-offs recommendation and ``sweep``, the single-GPU answer of At scale and ``simulate --fewest-gpus``), in
the order a run of the lab builds its model (``ckptlab.step.measure``):

1. the imports, each once, sorted as isort sorts them;
2. a selective policy's ``context_fn`` (``ckptlab.model.selective``), when the spec has one;
3. the model line: ``from_pretrained`` with the weights' dtype, the attention (a model keyword; SDPA, transformers'
   default, is not written) and, for a 4-bit base, ``quantization_config=BitsAndBytesConfig(...)``;
4. for a 4-bit base, peft's ``prepare_model_for_kbit_training`` (``ckptlab.model.quantize.prepare``);
5. transformers' checkpointing call on the base (its offload, its policy's ``context_fn``), or the call that turns it
   off;
6. LoRA's ``get_peft_model`` with the lab's ``LoraConfig`` (``ckptlab.model.lora``), on the checkpointed base;
7. the ``TrainingArguments`` of the step (``RunSpec.trainer_fields()``): Trainer enables the same checkpointing again
   from them, so the box serves a loop of one's own and Trainer alike. ``bf16=True`` raises on a machine without a
   GPU unless ``use_cpu=True``: a spec on the CPU writes it, one whose device is "auto" says so in a comment.

The pieces are ``ckptlab.model.snippets``'s; this module only puts them in order. Its comments are code comments, in
English like the code itself (the locale files hold sentences a person reads in the app, not the code they copy).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch

from ..model import catalog
from ..model.hub import split_revision
from ..model.lora import resolve_targets
from ..model.presets import CAUSAL_LM
from ..model.quantize import as_quantization
from ..model.selective import NONE
from ..model.snippets import (
    POLICY_IMPORTS,
    PREPARE_COMMENT,
    bnb_config_lines,
    enable_lines,
    lora_snippet,
    policy_lines,
    trainer_snippet,
)
from ..spec import RunSpec
from .preflight import device_type_of, resolve_dtype

SDPA = "sdpa"  # transformers' default attention: the model line leaves it out


def training_code(spec: RunSpec, dtype: str | torch.dtype | None = None, targets: Sequence[str] | None = None) -> str:
    """The whole code box of ``spec``: Python that builds, prepares and checkpoints the model the lab measured.

    Args:
        spec: the run (a preset's name, a folder or a Hub repository in ``spec.model``).
        dtype: the weights' dtype the run had (``RunResult.dtype``); None: ``spec.dtype`` as a run on this machine
            resolves it (``preflight.resolve_dtype``; "auto" is float32 on the CPU).
        targets: the modules LoRA adapts, resolved; None: ``spec.lora_targets`` checked against the model, read on
            the meta device (every projection when the spec names none).

    Returns:
        Python source that runs as pasted (a preset is the lab's random-weights shape: a comment says to put a
        model's name there).

    Raises:
        ModelLoadError, UnsupportedModelError: the model cannot be read; SpecError: a LoRA target it does not have.

    Example::

        >>> print(training_code(RunSpec(model="tiny-llama", every_n_layers=2)).splitlines()[0])
        import torch
    """
    config, source, task = catalog.load_config(spec.model)
    auto_class = "AutoModelForCausalLM" if task == CAUSAL_LM else "AutoModelForMaskedLM"
    quantization = as_quantization(spec.quantization)
    selective = spec.checkpointing and spec.selective != NONE
    lora = spec.lora_rank is not None
    if lora and targets is None:
        targets = resolve_targets(catalog.build_on_meta(config, task), spec.lora_targets)
    if dtype is None:
        dtype = resolve_dtype(spec.dtype, torch.device(device_type_of(spec.device)), spec.mixed_precision)
    dtype_name = str(dtype).removeprefix("torch.")

    imports: set[tuple[str, str | None]] = {("torch", None), ("transformers", auto_class)}
    imports.add(("transformers", "TrainingArguments"))
    if selective:
        imports.update(POLICY_IMPORTS)
    if quantization is not None:
        imports |= {("transformers", "BitsAndBytesConfig"), ("peft", "prepare_model_for_kbit_training")}
    if lora:
        imports |= {("peft", "LoraConfig"), ("peft", "get_peft_model")}

    body: list[str] = []
    if selective:
        body += [*policy_lines(spec.selective), "", ""]
    if quantization is not None:
        body += bnb_config_lines(quantization.to_dict())
    body += _model_lines(spec.model, source, auto_class, dtype_name, spec.attn_implementation, quantization is not None)
    if quantization is not None:
        if spec.checkpointing:
            body += [PREPARE_COMMENT, "model = prepare_model_for_kbit_training(model)"]
        else:  # what the lab's run leaves after turning the preparation's checkpointing off (quantize.prepare)
            body.append("model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)")
    # Off is said too, as a run of the lab says it (measure.apply_setting): a model from elsewhere may have it on.
    body += enable_lines(spec.every_n_layers, spec.offload, context_fn=selective)
    if lora:
        assert spec.lora_rank is not None and targets is not None  # for mypy: lora says both
        body.append("# LoRA on the checkpointed base (peft keeps the decoder layers and their checkpointing)")
        body.append(lora_snippet(spec.lora_rank, targets))
    trainer = trainer_snippet(spec.every_n_layers, spec.offload, spec.trainer_fields(), context_fn=selective)
    body += ["", "# Trainer(model=model, args=args, ...) turns the same checkpointing on again from these arguments"]
    if spec.mixed_precision != "none" and spec.device == "auto":
        # Where to run is the machine's own choice here ("cpu" writes use_cpu=True: RunSpec.trainer_fields), and
        # TrainingArguments refuses bf16/fp16 on a machine without a GPU unless told to use the CPU.
        body.append(
            f"# {spec.mixed_precision}=True needs a GPU: on a machine without one add use_cpu=True, or it raises"
        )
    body.append(f"args = {trainer}")
    return "\n".join([*import_lines(imports), "", *body])


def _model_lines(name: str, source: str, auto_class: str, dtype: str, attention: str, quantized: bool) -> list[str]:
    """``model = <auto class>.from_pretrained(...)`` with the keywords that make the lab's model (``source``: the
    name's kind, as ``load_config`` resolved it: "preset", "local" or "hub")."""
    repo, revision = split_revision(name) if source == "hub" else (name, None)
    preset = f"  # the lab's preset {name}: your model's name or folder" if source == "preset" else ""
    arguments = [f"{json.dumps(repo)},{preset}"]  # a Python literal in double quotes, whatever a folder's name holds
    if revision is not None:
        arguments.append(f'revision="{revision}",')
    arguments.append(f"dtype=torch.{dtype},")
    if attention != SDPA:
        arguments.append(f'attn_implementation="{attention}",  # a model keyword: TrainingArguments has none')
    if quantized:  # bitsandbytes quantizes while loading, onto the device the map names
        arguments += ["quantization_config=bnb_config,", 'device_map="auto",']
    return [f"model = {auto_class}.from_pretrained(", *(f"    {argument}" for argument in arguments), ")"]


def import_lines(imports: set[tuple[str, str | None]]) -> list[str]:
    """``import x`` and ``from x import a, b`` lines, each module once, sorted as isort (ruff's ``I``) sorts them:
    the standard library first, then the rest; ``import`` before ``from`` within a group.

    Args:
        imports: (module, name) pairs; a None name is ``import module``.
    """
    groups: list[list[str]] = []
    for standard in (True, False):
        modules = sorted({module for module, _ in imports if (module.split(".")[0] in _STANDARD) == standard})
        plain = [f"import {module}" for module in modules if (module, None) in imports]
        named = []
        for module in modules:
            names = sorted((name for found, name in imports if found == module and name is not None), key=_isort_key)
            if names:
                named.append(f"from {module} import {', '.join(names)}")
        if plain or named:
            groups.append(plain + named)
    lines: list[str] = []
    for group in groups:
        lines += [*([""] if lines else []), *group]
    return lines


_STANDARD = {"functools"}  # the standard library's modules the box can import


def _isort_key(name: str) -> tuple[int, str]:
    # isort's default order of names: CONSTANTS, then Classes, then functions.
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name
