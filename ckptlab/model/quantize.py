"""A quantized base as bitsandbytes stores it (QLoRA's 4 bits, LLM.int8()'s 8 bits): the setting, the quantized
model, peft's preparation.

:class:`Quantization` is ``transformers.BitsAndBytesConfig``'s own fields that change the bytes of a step: for a
4-bit base ``load_in_4bit``, ``bnb_4bit_quant_type``, ``bnb_4bit_use_double_quant``, ``bnb_4bit_compute_dtype``; for
an 8-bit base ``load_in_8bit``, ``llm_int8_threshold``, ``llm_int8_has_fp16_weight`` (false only); for both
``llm_int8_skip_modules``; with BitsAndBytesConfig's defaults (fp4, no double quantization, float32 compute,
threshold 6.0). BitsAndBytesConfig accepts unknown keys silently; the lab refuses them.

:func:`quantize` replaces the model's linear layers in place as transformers' bitsandbytes integration does
when it loads a model (``replace_with_bnb_linear``, then ``Params4bit(weight).to(device)`` or
``Int8Params(weight).to(device)`` per layer: the modules it keeps in 16 bits, the head and
``llm_int8_skip_modules``, stay). On fake tensors (``ckptlab.simulate``) neither ``Params4bit`` nor ``Int8Params``
can wrap a FakeTensor, so the layers keep their real class (``bnb.nn.Linear4bit``/``bnb.nn.Linear8bitLt``, which
peft's LoRA layers are picked by) and the weight is a fake parameter carrying the real parameter's attributes, made by
bitsandbytes' own ``quantize_4bit``/``int8_vectorwise_quant`` on fake storage (its ops have fake kernels).
:func:`prepare` is peft's ``prepare_model_for_kbit_training``.

An 8-bit base's step is bitsandbytes' training path on the CPU (``MatMul8bitFp``: the int8 weight dequantized to the
input's dtype, then ``F.linear``; ``llm_int8_threshold`` is not used there), measured on the CPU and simulated on fake
CPU tensors alike. On CUDA bitsandbytes runs ``MatMul8bitLt`` instead: it quantizes each input row-wise to int8 and
keeps for the backward a float16 copy of the input (where the input is not float16) and the input's outlier columns
(those with a value above ``llm_int8_threshold``, data-dependent, kept in 16 bits). The lab counts neither: for a
CUDA GPU its figure of an 8-bit base is the CPU path's, a lower bound, and its note says so (``note.int8_cpu_path``).

``import bitsandbytes`` takes seconds: it happens only here, in functions a quantized run calls.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import Option, SpecError
from ..fact import Fact
from ..files import read_json_object
from .libraries import import_bitsandbytes, import_peft

QUANT_TYPES = ("nf4", "fp4")
COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
PIP_LINE = "pip install bitsandbytes"
# BitsAndBytesConfig's fields that a config.json's quantization_config carries and that change no byte of a
# step at these values: read and dropped. Any other value, or any other key, is refused.
_INERT = {
    "quant_method": "bitsandbytes",
    "bnb_4bit_quant_storage": "uint8",
    "llm_int8_enable_fp32_cpu_offload": False,
}
# The fields one width reads and the other ignores (BitsAndBytesConfig ignores them too): held at their defaults.
_4BIT_ONLY = ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype")
_8BIT_ONLY = ("llm_int8_threshold", "llm_int8_has_fp16_weight")
_PRIVATE = ("_load_in_4bit", "_load_in_8bit")  # BitsAndBytesConfig.to_dict's copies of load_in_4bit/8bit
# transformers decides whether to quantize each module by matching its name against every name of
# llm_int8_skip_modules with re.match (quantizers_utils.should_convert_module: modules x names matches, each
# pattern compiled through re's cache). Past the cache's 512 patterns every match compiles its pattern again:
# 600 names took 19 s on tiny-llama against 7.5 s for 512, and 6,000 did not end in 150 s. A list of module
# names, or prefixes and patterns, for a model the lab handles (at most 1,024 layers) fits well within 512.
MAX_SKIP_MODULES = 512


@dataclass(frozen=True)
class Quantization:
    """A 4-bit or an 8-bit base: ``BitsAndBytesConfig``'s fields, by their own names and with its defaults.

    ``Quantization(load_in_8bit=True)`` is an 8-bit base (``load_in_4bit`` then False); the fields the chosen width
    does not read are held at their defaults, so two equal settings compare equal.
    """

    load_in_4bit: bool = True  # a 4-bit base (QLoRA's), unless load_in_8bit
    bnb_4bit_quant_type: str = "fp4"  # "nf4" (QLoRA's) or "fp4" (BitsAndBytesConfig's default)
    bnb_4bit_use_double_quant: bool = False  # the absmax quantized again (8 bits per 64 weights instead of 32)
    bnb_4bit_compute_dtype: str = "float32"  # the dtype Linear4bit computes in; BitsAndBytesConfig's None is float32
    llm_int8_skip_modules: tuple[str, ...] | None = None  # modules kept in 16 bits; None: transformers' own choice
    load_in_8bit: bool = False  # an 8-bit base (LLM.int8(): bitsandbytes' Linear8bitLt, Int8Params)
    llm_int8_threshold: float = 6.0  # outliers above it computed in 16 bits on CUDA (the module docstring)
    llm_int8_has_fp16_weight: bool = False  # True (a 16-bit weight kept and trained beside the int8 one) is refused

    def __post_init__(self) -> None:
        if isinstance(self.llm_int8_skip_modules, list):  # JSON gives a list; a tuple keeps the spec hashable
            object.__setattr__(self, "llm_int8_skip_modules", tuple(self.llm_int8_skip_modules))
        if self.load_in_8bit is True:
            object.__setattr__(self, "load_in_4bit", False)
        if isinstance(self.llm_int8_threshold, int) and not isinstance(self.llm_int8_threshold, bool):
            object.__setattr__(self, "llm_int8_threshold", float(self.llm_int8_threshold))  # JSON's 6 is 6.0
        ignored = _4BIT_ONLY if self.load_in_8bit is True else _8BIT_ONLY
        for name in ignored:
            object.__setattr__(self, name, self.__dataclass_fields__[name].default)

    @property
    def bits(self) -> int:
        """8 for an 8-bit base, else 4."""
        return 8 if self.load_in_8bit is True else 4

    @property
    def label(self) -> str:
        """The base's format in one word: the 4-bit quant type ("nf4", "fp4") or "int8"."""
        return "int8" if self.bits == 8 else self.bnb_4bit_quant_type

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Quantization:
        """The quantization a ``BitsAndBytesConfig(**config)`` mapping (a JSON file, a config.json's
        ``quantization_config``) asks for.

        Raises:
            SpecError: a key BitsAndBytesConfig does not have or the lab does not count, a bad value, neither width or
                both.
        """
        if not isinstance(config, Mapping):
            raise _value_error("quantization", config, Fact("quantization.expected_object"))
        fields = {name: value for name, value in config.items() if name not in _PRIVATE}
        unknown = [
            str(name)
            for name, value in fields.items()
            if name not in cls.__dataclass_fields__ and _INERT.get(name, _UNSEEN) != value
        ]
        if unknown:
            raise SpecError(
                key="spec.quantization_keys",
                option=Option("quantization"),
                unknown=", ".join(sorted(unknown))[:200],
                known=", ".join(cls.__dataclass_fields__),
            )
        if (fields.get("load_in_4bit") is True) == (fields.get("load_in_8bit") is True):
            raise SpecError(
                key="spec.quantization_width",
                option=Option("quantization"),
                four=fields.get("load_in_4bit", False),
                eight=fields.get("load_in_8bit", False),
            )
        ignored = _4BIT_ONLY if fields.get("load_in_8bit") is True else _8BIT_ONLY  # BitsAndBytesConfig's reading too
        kept = {
            name: value for name, value in fields.items() if name in cls.__dataclass_fields__ and name not in ignored
        }
        if kept.get("bnb_4bit_compute_dtype", "float32") is None:
            kept["bnb_4bit_compute_dtype"] = "float32"  # BitsAndBytesConfig's own reading of None
        if isinstance(kept.get("bnb_4bit_compute_dtype"), str):
            kept["bnb_4bit_compute_dtype"] = kept["bnb_4bit_compute_dtype"].removeprefix("torch.")
        quantization = cls(**kept)
        quantization.validate()
        return quantization

    def validate(self) -> None:
        """Raise :class:`SpecError` naming the first bad value."""
        if self.load_in_8bit is not True and self.load_in_4bit is not True:
            raise _value_error("load_in_4bit", self.load_in_4bit, "true")
        if not isinstance(self.load_in_8bit, bool):
            raise _value_error("load_in_8bit", self.load_in_8bit, Fact("quantization.expected_bool"))
        if self.bnb_4bit_quant_type not in QUANT_TYPES:
            raise _value_error("bnb_4bit_quant_type", self.bnb_4bit_quant_type, " or ".join(QUANT_TYPES))
        if not isinstance(self.bnb_4bit_use_double_quant, bool):
            raise _value_error(
                "bnb_4bit_use_double_quant", self.bnb_4bit_use_double_quant, Fact("quantization.expected_bool")
            )
        if self.bnb_4bit_compute_dtype not in COMPUTE_DTYPES:
            raise _value_error("bnb_4bit_compute_dtype", self.bnb_4bit_compute_dtype, ", ".join(COMPUTE_DTYPES))
        skip = self.llm_int8_skip_modules
        if skip is not None and not (isinstance(skip, tuple) and all(isinstance(name, str) for name in skip)):
            raise _value_error("llm_int8_skip_modules", skip, Fact("quantization.expected_names"))
        if skip is not None and len(skip) > MAX_SKIP_MODULES:
            raise SpecError(
                key="spec.quantization_skip_modules",
                option=Option("llm_int8_skip_modules"),
                count=len(skip),
                limit=MAX_SKIP_MODULES,
            )
        threshold = self.llm_int8_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, float) or not threshold >= 0:
            raise _value_error("llm_int8_threshold", threshold, Fact("quantization.expected_threshold"))
        if self.llm_int8_has_fp16_weight is not False:
            raise SpecError(
                key="spec.quantization_fp16_weight",
                option=Option("llm_int8_has_fp16_weight", self.llm_int8_has_fp16_weight),
            )

    def to_dict(self) -> dict[str, Any]:
        """The fields the base's width reads, as ``BitsAndBytesConfig(**fields)`` takes them (JSON-ready)."""
        names = ("load_in_8bit", *_8BIT_ONLY) if self.bits == 8 else ("load_in_4bit", *_4BIT_ONLY)
        every = asdict(self)
        fields = {name: every[name] for name in (*names, "llm_int8_skip_modules")}
        if self.llm_int8_skip_modules is not None:
            fields["llm_int8_skip_modules"] = list(self.llm_int8_skip_modules)
        return fields

    def bnb_config(self) -> Any:
        """The ``transformers.BitsAndBytesConfig`` of these fields."""
        import torch
        from transformers import BitsAndBytesConfig

        fields = self.to_dict()
        if self.bits == 4:
            fields["bnb_4bit_compute_dtype"] = getattr(torch, self.bnb_4bit_compute_dtype)
        return BitsAndBytesConfig(**fields)


_UNSEEN = object()
# QLoRA's own setting (Dettmers et al. 2023, and the "-bnb-4bit" checkpoints): the app's "4-bit base (QLoRA)" choice.
QLORA = Quantization(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype="bfloat16"
)


def _value_error(name: str, value: object, expected: Fact | str) -> SpecError:
    """``expected``: what the field takes, in words (a fact) or as its values ("nf4 or fp4")."""
    return SpecError(key="spec.quantization_value", option=Option(name, value), expected=expected)


def as_quantization(value: object) -> Quantization | None:
    """A spec's ``quantization`` as given (a :class:`Quantization`, a mapping from JSON, or None), as a Quantization.

    Raises:
        SpecError: as :meth:`Quantization.from_config`.
    """
    if value is None or isinstance(value, Quantization):
        return value
    return Quantization.from_config(value)  # type: ignore[arg-type]


def config_quantization(config: Any) -> Quantization | None:
    """The quantization (4 or 8 bits) a model's config (its config.json's ``quantization_config``) asks for, or None.

    Raises:
        SpecError: a bitsandbytes quantization_config the lab does not take, another quantization method (GPTQ, AWQ,
            FP8, ...: named), or none named (``load_in_4bit`` without ``quant_method``).
    """
    found = getattr(config, "quantization_config", None)
    if found is None:
        return None
    fields = found if isinstance(found, Mapping) else getattr(found, "to_dict", lambda: found)()
    if not isinstance(fields, Mapping):
        raise _value_error("quantization_config", fields, Fact("quantization.expected_object"))
    method = fields.get("quant_method")
    if method is None:
        # transformers reads load_in_4bit/8bit without a method as bitsandbytes', and refuses any other: the lab
        # neither guesses which quantizer made the checkpoint nor runs it as a 16-bit base.
        raise SpecError(
            key="spec.quantization_no_method",
            option=Option("quantization"),
            fields=", ".join(sorted(str(name) for name in fields))[:200],
        )
    if method != "bitsandbytes":  # a str, or transformers' QuantizationMethod (a str enum) from a config object
        # GPTQ, AWQ, FP8, ...: stored in formats whose bytes and kernels the lab does not count. Refused by name:
        # simulated as a 16-bit base it would be another model than the checkpoint.
        raise SpecError(
            key="spec.quantization_method",
            option=Option("quantization"),
            method=str(getattr(method, "value", method))[:60],
        )
    return Quantization.from_config(fields)


def check_installed() -> None:
    """Raise :class:`SpecError` with the pip line where bitsandbytes is not installed (nothing imported)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise SpecError(
            key="spec.quantization_package",
            option=Option("quantization"),
            pip=PIP_LINE,
        )


# -- the model -------------------------------------------------------------------------------------------


def quantize(model: Any, quantization: Quantization) -> int:
    """Quantize ``model``'s linear layers to 4 or 8 bits in place, as transformers' bitsandbytes integration does
    when it loads a model (the modules it keeps in 16 bits stay); fake tensors too (the module docstring).

    Returns:
        The number of layers quantized.
    """
    import_bitsandbytes()  # first: without its Hub kernel lookup (transformers' integration below imports it too)
    import bitsandbytes as bnb
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    from transformers.quantizers.quantizer_bnb_8bit import Bnb8BitHfQuantizer

    config = quantization.bnb_config()
    eight = quantization.bits == 8
    quantizer = Bnb8BitHfQuantizer(config) if eight else Bnb4BitHfQuantizer(config)
    layer_class = bnb.nn.Linear8bitLt if eight else bnb.nn.Linear4bit
    skip = quantizer.get_modules_to_not_convert(model, config.llm_int8_skip_modules, model._keep_in_fp32_modules)
    old = {name: module for name, module in model.named_modules()}
    # The new modules are made on the meta device, outside a FakeTensorMode that would make their weights fake.
    with unset_fake_temporarily(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=config)
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, layer_class) or name not in old or old[name] is module:
            continue
        weight = old[name].weight.data
        if isinstance(old[name], Conv1D):  # GPT-2's projections store (in, out): transposed first, as transformers
            weight = weight.T.contiguous()
        if isinstance(weight, FakeTensor):
            module.weight = (_fake_int8params if eight else _fake_params4bit)(module, weight, bnb)
        elif eight:  # transformers' Bnb8bitQuantize.convert
            attributes = {key: value for key, value in module.weight.__dict__.items() if key != "SCB"}
            int8 = bnb.nn.Int8Params(weight.to("cpu"), requires_grad=False, **attributes)
            module.weight = int8.to(weight.device)  # type: ignore[misc]  # bitsandbytes' overloads of to()
        else:  # transformers' Bnb4bitQuantize.convert
            packed = bnb.nn.Params4bit(weight, requires_grad=False, **module.weight.__dict__)
            module.weight = packed.to(weight.device)  # type: ignore[misc]  # bitsandbytes' overloads of to()
        if old[name].bias is not None:
            module.bias = torch.nn.Parameter(old[name].bias.data, requires_grad=False)
        count += 1
    # transformers' _process_model_after_weight_loading; peft reads it
    setattr(model, "is_loaded_in_8bit" if eight else "is_loaded_in_4bit", True)
    return count


def _fake_params4bit(module: Any, weight: Any, bnb: Any) -> Any:
    """A fake packed weight with ``Params4bit``'s attributes and a quant state from bitsandbytes' ``quantize_4bit``."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    attributes = dict(module.weight.__dict__)
    mode = detect_fake_mode(weight)
    assert mode is not None  # the weight is fake
    with unset_fake_temporarily():  # the dynamic map of the double quantization, made once, for real
        if "dynamic" not in bnb.functional.name2qmap:
            bnb.functional.name2qmap["dynamic"] = bnb.functional.create_dynamic_map()
    allowed, mode.allow_non_fake_inputs = mode.allow_non_fake_inputs, True  # that real map, read on fake storage
    try:
        packed, state = bnb.functional.quantize_4bit(
            weight,
            blocksize=attributes["blocksize"],
            compress_statistics=attributes["compress_statistics"],
            quant_type=attributes["quant_type"],
            quant_storage=attributes["quant_storage"],
        )
    finally:
        mode.allow_non_fake_inputs = allowed
    param = _fake_parameter(packed, attributes)
    param.quant_state, param.bnb_quantized, param.module = state, True, module
    module.quant_state = state
    return param


def _fake_int8params(module: Any, weight: Any, bnb: Any) -> Any:
    """A fake int8 weight with ``Int8Params``' attributes (``CB`` the weight itself, ``SCB`` its row scales), made as
    ``Int8Params._quantize`` makes them: bitsandbytes' ``int8_vectorwise_quant`` of the float16 weight."""
    import torch

    attributes = dict(module.weight.__dict__)
    int8, scales, _ = bnb.functional.int8_vectorwise_quant(weight.contiguous().to(torch.float16))
    param = _fake_parameter(int8, attributes)
    param.CB, param.SCB = param.data, scales
    return param


def _fake_parameter(tensor: Any, attributes: Mapping[str, Any]) -> Any:
    """``tensor`` (fake) as a frozen parameter carrying a bitsandbytes parameter's ``attributes``."""
    import torch

    param: Any = torch.nn.Parameter(tensor, requires_grad=False)  # on a FakeTensor: the fake tensor, as a parameter
    for key, value in attributes.items():
        setattr(param, key, value)
    return param


def prepare(model: Any) -> int:
    """peft's ``prepare_model_for_kbit_training(model)``: freezes the base, casts every float16/bfloat16 parameter
    to float32 (the embeddings and the head too) and turns on reentrant checkpointing on every layer, which the
    lab then replaces with the spec's setting (as Trainer does with ``activation_checkpointing=True``) or turns off.

    peft registers the embeddings' input-gradient hook twice (``enable_input_require_grads`` itself, then through
    ``gradient_checkpointing_enable``), and transformers keeps only the last call's handles: every handle is kept here,
    so that ``disable_input_require_grads`` (checkpointing off) removes both, as a Trainer without checkpointing
    has none (``prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)`` registers none).

    Returns:
        The number of parameters cast to float32.
    """
    import_peft()
    import torch
    from peft import prepare_model_for_kbit_training

    cast = sum(param.numel() for param in model.parameters() if param.dtype in (torch.float16, torch.bfloat16))
    enable = model.enable_input_require_grads
    handles: list[Any] = []

    def enable_keeping_every_handle() -> None:
        enable()
        handles.extend(model._require_grads_hooks)  # transformers' list, replaced at each call

    model.enable_input_require_grads = enable_keeping_every_handle  # the instance's: what peft and transformers call
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated gradient_checkpointing_enable peft calls
            prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    finally:
        del model.enable_input_require_grads
    model._require_grads_hooks = handles
    return cast


def quant_state_tensors(model: Any) -> list[Any]:
    """The tensors of every 4-bit weight's quant state (absmax, their double quantization, the maps) and every 8-bit
    weight's row scales (``SCB``, on the weight until the layer's first forward, then on its ``MatmulLtState``): not
    parameters nor buffers of the model, yet its weights' bytes. Empty for a model without quantized layers. (An
    8-bit weight's ``CB`` is the weight's own storage: a parameter already.)"""
    found: list[Any] = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        for owner in (weight, getattr(module, "state", None)):
            scales = getattr(owner, "SCB", None)
            if scales is not None and hasattr(scales, "untyped_storage"):
                found.append(scales)
        state = getattr(weight, "quant_state", None)
        while state is not None:
            found += [
                tensor
                for tensor in (state.absmax, state.code, getattr(state, "offset", None))
                if tensor is not None and hasattr(tensor, "untyped_storage")
            ]
            state = getattr(state, "state2", None)
    return found


def quantization_notes(quantization: Quantization | None, checkpointing: bool) -> list[Any]:
    """The notes of a step on a quantized base: the values it used, what peft's preparation did to checkpointing, and
    for an 8-bit base which of bitsandbytes' paths the figures count (the module docstring)."""
    if quantization is None:
        return []
    skip = quantization.llm_int8_skip_modules
    prepared = Fact("note.kbit_prepared" if checkpointing else "note.kbit_prepared_off")
    if quantization.bits == 8:
        eight = Fact(
            "note.quantized_base_8bit",
            {
                "threshold": quantization.llm_int8_threshold,
                "skip": "None" if skip is None else ", ".join(skip),
            },
        )
        return [eight, prepared, Fact("note.int8_cpu_path", {"threshold": quantization.llm_int8_threshold})]
    used = Fact(
        "note.quantized_base",
        {
            "quant_type": quantization.bnb_4bit_quant_type,
            "double_quant": quantization.bnb_4bit_use_double_quant,
            "compute_dtype": quantization.bnb_4bit_compute_dtype,
            "skip": "None" if skip is None else ", ".join(skip),
        },
    )
    return [used, prepared]


MAX_FILE_BYTES = 65_536  # a BitsAndBytesConfig JSON is a few hundred bytes
MAX_JSON_DEPTH = 4  # an object holding a list of module names nests two


def load_quantization_file(path: str | os.PathLike[str]) -> Quantization:
    """The :class:`Quantization` of a JSON file of ``BitsAndBytesConfig`` fields, read by ``ckptlab.files``' one reader
    (a FIFO, a device or a directory refused before anything is opened; size and nesting bounded).

    Raises:
        SpecError: no such file, not a JSON object within the bounds, or fields the lab does not take.
    """
    shown = os.fspath(path)
    data = read_json_object(
        path,
        max_bytes=MAX_FILE_BYTES,
        max_depth=MAX_JSON_DEPTH,
        refuse=lambda problem: SpecError(key="spec.quantization_file", path=shown, problem=problem),
        error=SpecError,
    )
    return Quantization.from_config(data)


def model_quantization(model: Any) -> Quantization | None:
    """The setting a model's ``Linear4bit`` or ``Linear8bitLt`` layers were made with (a PeftModel's base too), read
    from the layers themselves; None for a model without one. ``llm_int8_skip_modules`` is not read back (None)."""
    import sys

    bnb = sys.modules.get("bitsandbytes")  # a model with quantized layers has imported it
    if bnb is None:
        return None
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear8bitLt):
            state = module.state
            return Quantization(
                load_in_8bit=True,
                llm_int8_threshold=float(state.threshold),
                llm_int8_has_fp16_weight=bool(state.has_fp16_weights),
            )
        if isinstance(module, bnb.nn.Linear4bit):
            weight = module.weight
            compute = getattr(module, "compute_dtype", None)
            return Quantization(
                bnb_4bit_quant_type=getattr(weight, "quant_type", "fp4"),
                bnb_4bit_use_double_quant=bool(getattr(weight, "compress_statistics", False)),
                bnb_4bit_compute_dtype=str(compute).removeprefix("torch.") if compute is not None else "float32",
            )
    return None
