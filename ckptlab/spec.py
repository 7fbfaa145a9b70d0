"""What to run: :class:`RunSpec` (one model, one shape, one checkpointing setting) and its choices.

:class:`Setting` is the checkpointing pair alone (``every_n_layers``, ``offload``) and the one
home of its short key ("off", "n=2", "n=1+offload"), the id that tables, JSON rows, progress
messages and figures share. Words for a setting in a language belong to ``ckptlab.show``.

A spec goes into the core (measure, simulate, sweep, predict) and comes back inside every
result; the front ends build one from widgets, a URL or command-line flags.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from .errors import (
    CHECKPOINTING_OFF,
    Command,
    Option,
    SpecError,
    UnsupportedModelError,
    check_at_most,
    check_whole_number,
    expect_type,
    not_one_of,
)
from .fact import Fact
from .model.attention import check_attn_implementation
from .model.plan import planned_roles, validate_every_n_layers
from .model.presets import DEFAULT_PRESET, ModelInfo
from .model.quantize import Quantization, as_quantization, check_installed
from .model.selective import Selective, check_selective, selective_key
from .spec_fields import (  # noqa: F401 (the choices and bounds live with their fields; these names stay here too)
    DEVICES,
    DTYPES,
    FIELD,
    FIELDS,
    MAX_ACCUMULATION_STEPS,
    MAX_LORA_RANK,
    MAX_REPEATS,
    MAX_SEED,
    MAX_TOKENS,
    MAX_WARMUP,
    MAX_WORLD_SIZE,
    MIXED_PRECISIONS,
    OPTIMIZERS,
    closed_choices,
    split_names,
)
from .training_args import read_training_args

# The optimizers that need a package of their own: its import name and pip line.
LOW_BIT_PACKAGES = {
    "adamw_torch_8bit": ("torchao", "pip install torchao"),
    "adamw_torch_4bit": ("torchao", "pip install torchao"),
    "adamw_bnb_8bit": ("bitsandbytes", "pip install bitsandbytes"),
    "adamw_8bit": ("bitsandbytes", "pip install bitsandbytes"),  # Trainer's other name of adamw_bnb_8bit
    "paged_adamw_8bit": ("bitsandbytes", "pip install bitsandbytes"),
    "paged_adamw_32bit": ("bitsandbytes", "pip install bitsandbytes"),
}
# bitsandbytes' optimizers: their state is plain tensors made with torch.zeros_like and their step one custom op with
# a fake kernel (bitsandbytes/_ops.py's register_fake), so a simulation and the CPU's meter count them as they are
# stored. torchao's compile their step (ckptlab.step.training.check_optimizer_runs).
BITSANDBYTES_OPTIMIZERS = frozenset(
    name for name, (package, _) in LOW_BIT_PACKAGES.items() if package == "bitsandbytes"
)
TRAINER_DEFAULT_OPTIMIZER = "adamw_torch_fused"  # what "adamw" means: TrainingArguments.optim's default
# Trainer's side of the step besides the optimizer's name: a sweep's rows share them, settings timed together too.
RECIPE_FIELDS = ("optim_args", "gradient_accumulation_steps", "max_grad_norm", "mixed_precision")
# How timed steps of several settings are ordered (ckptlab.step.rounds): "interleaved" A B C A B C ..., "blocks" A A B B.
Order = Literal["interleaved", "blocks"]
ORDERS: tuple[Order, ...] = ("interleaved", "blocks")
MAX_OPTIM_ARGS = 1000  # characters of optim_args: a few key=value pairs
_OPTIM_WORDS = {"true", "false", "yes", "no"}  # Trainer reads nesterov=..., centered=... as these


def optim_args_problem(text: str) -> Fact | None:
    """What is wrong with ``optim_args`` as Trainer parses it (``key=value`` pairs, each value a finite number, a
    yes/no word or a torch dtype's name), or None. Trainer splits on "=" and calls ``float()`` on the values, so
    ``"====="`` or ``"momentum=abc"`` would end in a traceback inside the step."""
    if len(text) > MAX_OPTIM_ARGS:
        return Fact("optim_args.too_long", {"limit": MAX_OPTIM_ARGS})
    for pair in text.replace(" ", "").split(","):
        key, equals, value = pair.partition("=")
        if not key or not equals or "=" in value or not value:
            return Fact("optim_args.not_a_pair", {"pair": pair[:40]})
        if value.lower() in _OPTIM_WORDS or (key.endswith("_dtype") and value.isidentifier()):
            continue
        try:
            number = float(value)
        except ValueError:
            return Fact("optim_args.not_a_number", {"key": key[:40], "value": value[:40]})
        if number != number or number in (float("inf"), float("-inf")):
            return Fact("optim_args.not_finite", {"key": key[:40], "value": value[:40]})
    return None


def check_declared_bound(name: str, value: int | float) -> None:
    """Refuse ``value`` above the bound ``spec_fields`` declares for the field ``name`` (its ``high``), with what the
    bound protects (its ``why``): every bound of a spec through one refusal (``errors.check_at_most``).

    Raises:
        SpecError: ``spec.at_most``, naming the field, the value, the bound and why.
    """
    declared = FIELD[name]
    assert declared.high is not None and declared.why is not None, f"{name} declares no bound"
    check_at_most(name, value, declared.high, declared.why)


def check_lora(rank: int | None, targets: Sequence[str] | None) -> None:
    """Raise :class:`SpecError` for a LoRA rank that is not a whole number >= 1, or for targets without a rank.

    Raises:
        SpecError: ``spec.lora_rank`` or ``spec.lora_targets_without_rank``, naming the fix.
    """
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise SpecError(key="spec.lora_rank", option=Option("lora_rank", rank), value=rank)
    if rank is not None:
        check_declared_bound("lora_rank", rank)
    if targets is not None and rank is None:
        raise SpecError(
            key="spec.lora_targets_without_rank",
            option=Option("lora_targets", list(targets)),
            rank=Option("lora_rank"),
            targets=list(targets),
        )


@dataclass(frozen=True)
class RunSpec:
    """What to run: one model, one shape, one checkpointing setting."""

    # A preset name (python -m ckptlab models), a local directory with config.json, or a Hugging Face Hub repository
    # "owner/name" ("owner/name@revision"): its config.json only, random weights (ckptlab.model.hub).
    model: str = DEFAULT_PRESET
    seq_len: int = 512  # tokens per sequence; 512 makes the recompute cost of the default preset visible on 2 CPU cores
    batch_size: int = 1  # sequences per step
    dtype: str = "auto"  # the weights: "auto" (float32 on the CPU or with mixed precision, else bfloat16 on CUDA), "float32", ...
    device: str = "auto"  # "auto" (CUDA when present), "cpu" or "cuda"
    every_n_layers: int | None = 1  # checkpoint layers whose 0-based index is a multiple of this; None: off
    offload: bool = False  # transformers' offload of checkpointed inputs to pinned host memory (CUDA only)
    repeats: int = 4  # timed steps, after the warm-up; medians are quoted
    warmup: int = 2  # untimed steps first: the first backwards are slow (allocator, kernels, caches)
    seed: int = 0  # seeds the random weights and the random tokens
    optimizer: str = "adamw"  # TrainingArguments.optim's name (OPTIMIZERS); "adamw" is Trainer's default, fused AdamW
    lora_rank: int | None = None  # LoRA adapters of this rank on a frozen base (peft); None: full fine-tune
    lora_targets: tuple[str, ...] | None = None  # modules LoRA adapts; None: every attention and MLP projection
    world_size: int = 1  # ranks the step runs on: launched processes (run) or a fake process group (simulate)
    fsdp: bool = False  # shard with FSDP2's fully_shard, every decoder layer and then the root; needs world_size > 1
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step, as Trainer's; gradients live across them
    max_grad_norm: float = 1.0  # Trainer's clip_grad_norm_ bound; <= 0 still computes the norm (an infinite bound)
    # "bf16"/"fp16": autocast over float32 weights, as TrainingArguments(bf16=True); with fsdp, FSDP2's
    # MixedPrecisionPolicy(param_dtype=bf16/fp16, reduce_dtype=float32) instead (mixed_precision_via).
    mixed_precision: str = "none"
    optim_args: str | None = None  # TrainingArguments.optim_args, e.g. "momentum=0.9" (SGD's momentum is state)
    # Selective checkpointing (ckptlab.model.selective): what a CP layer keeps besides its input. "none", a
    # policy ("attention", "matmuls", "torchtitan") or, from Python, a tuple of op names such as ("aten.mm",).
    selective: Selective = "none"
    # A 4-bit base (QLoRA): BitsAndBytesConfig's fields (ckptlab.model.quantize); a mapping of them is read as one.
    # None: the base in `dtype` (a model folder whose config.json has a bitsandbytes quantization_config uses it).
    quantization: Quantization | None = None
    # The attention kernel the model is built with (ckptlab.model.attention): "sdpa" (transformers' default),
    # "eager" (keeps each layer's heads x seq^2 probabilities), "flash_attention_2" (CUDA, the flash-attn package).
    attn_implementation: str = "sdpa"
    # The caching allocator's settings, as PYTORCH_CUDA_ALLOC_CONF says them ("expandable_segments:True"); "": torch's
    # defaults. A simulation's device total replays the step's allocations under them (ckptlab.explore.device).
    alloc_conf: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantization", as_quantization(self.quantization))
        # A text is names as the flag and the link write them ("q_proj,v_proj"), not its characters; empty: none.
        if isinstance(self.lora_targets, str):
            object.__setattr__(self, "lora_targets", split_names(self.lora_targets) or None)
        # JSON and the URL give a list; a tuple keeps the spec hashable (results are cached by spec).
        elif self.lora_targets is not None and not isinstance(self.lora_targets, tuple):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        if isinstance(self.selective, list):  # op names, read back from JSON
            object.__setattr__(self, "selective", tuple(self.selective))

    def validate(self) -> None:
        """Raise :class:`SpecError` naming the first bad value and its fix."""
        model_example = "RunSpec(model='tiny-llama') or RunSpec(model='/path/to/folder')"
        expect_type("RunSpec", "model", self.model, (str, os.PathLike), model_example)
        for name in ("seq_len", "batch_size", "repeats"):
            check_whole_number(name, getattr(self, name))
        check_whole_number("warmup", self.warmup, minimum=0)
        check_whole_number("seed", self.seed, minimum=0)
        for name in ("repeats", "warmup", "seed"):
            check_declared_bound(name, getattr(self, name))
        check_at_most("seq_len x batch_size", self.seq_len * self.batch_size, MAX_TOKENS, Fact("bound.tokens"))
        if self.every_n_layers is not None:
            validate_every_n_layers(self.every_n_layers)
        for flag in ("offload", "fsdp"):
            expect_type("RunSpec", flag, getattr(self, flag), bool, f"RunSpec({flag}=True)")
        for field in closed_choices():  # dtype, device, optimizer, mixed_precision
            if getattr(self, field.name) not in field.choices:
                raise not_one_of(field.name, getattr(self, field.name), field.choices)
        self._validate_recipe()
        check_lora(self.lora_rank, self.lora_targets)
        self._validate_quantization()
        self._validate_ranks()
        check_selective(self.selective, self.every_n_layers)
        check_attn_implementation(self.attn_implementation, self.selective)
        for declared in FIELDS:  # the fields whose declaration names their own check (alloc_conf)
            if declared.check is not None:
                declared.check(getattr(self, declared.name))
        if self.offload and self.every_n_layers is None:
            raise SpecError(
                key="spec.offload_without_checkpointing",
                offload=Option("offload", True),
                off=CHECKPOINTING_OFF,
                every_n_layers=Option("every_n_layers"),
                dropped=Option("offload"),
            )

    def _validate_recipe(self) -> None:
        """Trainer's side of the step: accumulation, the clipping bound, mixed precision against the dtype."""
        check_whole_number("gradient_accumulation_steps", self.gradient_accumulation_steps)
        check_declared_bound("gradient_accumulation_steps", self.gradient_accumulation_steps)
        norm = self.max_grad_norm
        if isinstance(norm, bool) or not isinstance(norm, (int, float)) or norm != norm:  # NaN != NaN
            raise SpecError(key="spec.max_grad_norm", value=norm)
        if self.mixed_precision != "none" and self.dtype == "float16":
            raise SpecError(
                key="spec.mixed_precision_dtype",
                option=Option("mixed_precision", self.mixed_precision),
                dtype=Option("dtype", "float16"),
                mixed_precision=self.mixed_precision,
            )
        package = LOW_BIT_PACKAGES.get(self.optimizer)
        if package is not None and importlib.util.find_spec(package[0]) is None:
            raise SpecError(
                key="spec.optimizer_package",
                option=Option("optimizer", self.optimizer),
                optimizer=self.optimizer,
                package=package[0],
                pip=package[1],
            )
        if self.optim_args is not None and (
            not isinstance(self.optim_args, str) or optim_args_problem(self.optim_args) is not None
        ):
            problem = (
                Fact("optim_args.not_text")
                if not isinstance(self.optim_args, str)
                else optim_args_problem(self.optim_args)
            )
            raise SpecError(
                key="spec.optim_args", value=repr(self.optim_args)[:120], problem=problem, optim_args=self.optim_args
            )

    def _validate_quantization(self) -> None:
        """A 4-bit base: its fields, LoRA (Trainer refuses to train a purely quantized model), bitsandbytes here."""
        if self.quantization is None:
            return
        self.quantization.validate()
        if self.lora_rank is None:
            raise SpecError(
                key="spec.quantization_without_lora",
                option=Option("quantization"),
                rank=Option("lora_rank"),
            )
        check_installed()

    def check_model_limits(self, info: ModelInfo) -> None:
        """Check this spec against the limits its model's description states, which need no model built (a preset's are
        stored: ``presets.stored_fact``, so a command refuses before it imports torch).

        Raises:
            UnsupportedModelError: checkpointing asked of a class transformers cannot checkpoint.
            SpecError: a sequence longer than the model's positions.
        """
        if self.checkpointing and not info.supports_checkpointing:
            raise UnsupportedModelError(
                key="model.no_checkpointing_support",
                option=Option("every_n_layers", self.every_n_layers),
                off=Option("every_n_layers", None),
                name=info.name,
                family=info.family,
                every_n_layers=self.every_n_layers,
            )
        if info.max_positions is not None and self.seq_len > info.max_positions:
            raise SpecError(
                key="spec.seq_too_long",
                option=Option("seq_len", self.seq_len),
                seq_len=self.seq_len,
                model=info.name,
                positions=info.max_positions,
            )

    def checkpointing_off(self) -> RunSpec:
        """The same run with checkpointing off (no offload, no selective policy): the reference runs are compared with."""
        return replace(self, every_n_layers=None, offload=False, selective="none")

    @property
    def trainer_optimizer(self) -> str | None:
        """The TrainingArguments.optim name this spec's optimizer is ("adamw" -> Trainer's default); None for "none"."""
        if self.optimizer == "none":
            return None
        return TRAINER_DEFAULT_OPTIMIZER if self.optimizer == "adamw" else self.optimizer

    def _validate_ranks(self) -> None:
        size = self.world_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SpecError(key="spec.world_size", option=Option("world_size", size), value=size, limit=MAX_WORLD_SIZE)
        check_declared_bound("world_size", size)
        if self.fsdp and size < 2:
            raise SpecError(
                key="spec.fsdp_one_rank",
                fsdp=Option("fsdp", True),
                one_rank=Option("world_size", 1),
                launch=Command("measure", (Option("world_size", 2), Option("fsdp", True))),
                simulate=Command("simulate", (Option("world_size", 8), Option("fsdp", True))),
            )
        if size > 1 and not self.fsdp:
            raise SpecError(
                key="spec.ranks_without_fsdp",
                option=Option("world_size", size),
                fsdp_on=Option("fsdp", True),
                one_rank=Option("world_size", 1),
                value=size,
            )
        if self.fsdp and self.quantization is not None:  # before LoRA's: QLoRA has its own reason and fix
            raise SpecError(
                key="spec.fsdp_with_quantization",
                fsdp=Option("fsdp", True),
                option=Option("quantization"),
                one_rank=Option("world_size", 1),
            )
        if self.fsdp and self.lora_rank is not None:
            raise SpecError(
                key="spec.fsdp_with_lora",
                fsdp=Option("fsdp", True),
                option=Option("lora_rank", self.lora_rank),
                rank=self.lora_rank,
            )

    @classmethod
    def from_training_args(cls, args: Any, **overrides: Any) -> RunSpec:
        """The spec of the step a ``transformers.Trainer`` runs for ``args`` (a ``TrainingArguments`` or a mapping
        of its fields, as in a JSON file); ``overrides`` set any field on top (the model, the sequence length, ...).

        Fields the arguments leave out take Trainer's defaults (batch 8 per device);
        ``ckptlab.training_args.read_training_args`` says which.

        Raises:
            SpecError: unknown or ill-typed fields, fields TrainingArguments refuses, or checkpointing kwargs the
                lab's steps do not run (``TrainingArgsReading.check_runnable``: ``use_reentrant=True``, a context_fn).
        """
        reading = read_training_args(args)
        reading.check_runnable()  # never dropped in silence: the spec would run another checkpoint than the file's
        return cls(**{**reading.changes, **overrides})

    def trainer_fields(self) -> dict[str, Any]:
        """The ``TrainingArguments`` fields, beside checkpointing, whose Trainer step is this spec's (the inverse of
        :meth:`from_training_args`); without an optimizer ("none") only the batch, which has no Trainer twin else, and
        ``use_cpu`` for a spec whose device is "cpu".
        ``attn_implementation`` is none of them: a model keyword (``from_pretrained(..., attn_implementation=...)``),
        not a TrainingArguments field (ckptlab.model.snippets writes it in the model's line)."""
        fields: dict[str, Any] = {"per_device_train_batch_size": self.batch_size}
        if self.device == "cpu":  # from_training_args reads it back as the device; bf16=True raises without it on a CPU
            fields["use_cpu"] = True
        if self.trainer_optimizer is None:
            return fields
        fields |= {"gradient_accumulation_steps": self.gradient_accumulation_steps, "optim": self.trainer_optimizer}
        if self.optim_args:
            fields["optim_args"] = self.optim_args
        fields["max_grad_norm"] = self.max_grad_norm
        if self.mixed_precision != "none":
            fields[self.mixed_precision] = True
        return fields

    @property
    def mixed_precision_via(self) -> str:
        """How the step casts: "none", "autocast" (one device) or "fsdp2" (FSDP2's MixedPrecisionPolicy, across ranks).

        Across ranks the lab casts as torchtitan does (its default ``mixed_precision_param="bfloat16"``,
        ``mixed_precision_reduce="float32"``): ``fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=bf16,
        reduce_dtype=float32))`` keeps the float32 master shards, all-gathers each unit's parameters once in
        16 bits (half the all-gather bytes and half the unsharded layer) and reduce-scatters the gradients in
        float32. Autocast on top of FSDP2 would all-gather float32 and then cast every weight again at each
        matmul: a float32 and a 16-bit copy of the layer at work, which no sharded recipe runs.
        """
        if self.mixed_precision == "none":
            return "none"
        return "fsdp2" if self.fsdp else "autocast"

    @property
    def checkpointing(self) -> bool:
        return self.every_n_layers is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Setting:
    """One checkpointing setting: ``every_n_layers`` (None: off), offload and the CP layers' selective policy.

    Not ordered: off (None) against a number, or a tuple of op names against a named policy, has no order that
    means anything; code that ranks settings says by what (``ckptlab.explore.scale.recompute_cost``).
    """

    every_n_layers: int | None  # None: checkpointing off
    offload: bool = False  # checkpointed inputs to pinned host memory
    selective: Selective = "none"  # as RunSpec.selective: what a CP layer keeps besides its input

    @property
    def key(self) -> str:
        """A short stable id, e.g. "off", "n=2", "n=1+offload", "n=1+attention" (for tables, JSON rows, widgets,
        figures); plain checkpointing's keys are the ones they were before policies existed."""
        if self.every_n_layers is None:
            return "off"
        policy = "" if self.selective == "none" else "+" + selective_key(self.selective)
        return f"n={self.every_n_layers}" + ("+offload" if self.offload else "") + policy

    def cp_layers(self, num_layers: int) -> int:
        """How many layers this setting checkpoints (each reruns its forward in the backward)."""
        return planned_roles(num_layers, self.every_n_layers).count("CP")

    @classmethod
    def of(cls, spec: RunSpec) -> Setting:
        return cls(spec.every_n_layers, spec.offload, spec.selective)
