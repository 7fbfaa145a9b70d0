"""What to run: :class:`RunSpec` (one model, one shape, one checkpointing setting) and its choices.

:class:`Setting` is the checkpointing pair alone (``every_n_layers``, ``offload``) and the one
home of its short key ("off", "n=2", "n=1+offload"), the id that tables, JSON rows, progress
messages and figures share. Words for a setting in a language belong to ``ckptlab.show``.

A spec goes into the core (measure, simulate, sweep, predict) and comes back inside every
result; the front ends build one from widgets, a URL or command-line flags.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from .errors import SpecError, check_at_most, check_whole_number, expect_type, not_one_of
from .model.catalog import DEFAULT_PRESET
from .model.plan import planned_roles, validate_every_n_layers

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("adamw", "sgd", "none")  # "none": forward and backward only, for lessons on activations alone
MAX_WORLD_SIZE = 1024  # the most ranks a spec may name (a simulation's fake process group goes this far)
# Bounds that keep one run finite (README, "Limits"): each refused with one message naming it.
MAX_REPEATS = 1000  # timed steps: a median of a thousand is as good as it gets
MAX_WARMUP = 100  # untimed steps: the allocator and caches settle within a few
MAX_TOKENS = 2**24  # seq_len x batch_size of one step (16,777,216: 128 sequences of 128k tokens)
MAX_SEED = 2**32 - 1 - MAX_WORLD_SIZE  # rank r seeds with seed + r, which must stay a 32-bit seed (numpy's range)


@dataclass(frozen=True)
class RunSpec:
    """What to run: one model, one shape, one checkpointing setting."""

    model: str = DEFAULT_PRESET  # preset name (python -m ckptlab models) or a local directory with config.json
    seq_len: int = 512  # tokens per sequence; 512 makes the recompute cost of the default preset visible on 2 CPU cores
    batch_size: int = 1  # sequences per step
    dtype: str = "auto"  # "auto" (float32 on the CPU, bfloat16 on CUDA), "float32", "bfloat16" or "float16"
    device: str = "auto"  # "auto" (CUDA when present), "cpu" or "cuda"
    every_n_layers: int | None = 1  # checkpoint layers whose 0-based index is a multiple of this; None: off
    offload: bool = False  # transformers' offload of checkpointed inputs to pinned host memory (CUDA only)
    repeats: int = 4  # timed steps, after the warm-up; medians are quoted
    warmup: int = 2  # untimed steps first: the first backwards are slow (allocator, kernels, caches)
    seed: int = 0  # seeds the random weights and the random tokens
    optimizer: str = (
        "adamw"  # "adamw" (torch.optim.AdamW, as Trainer), "sgd" (no state) or "none" (forward + backward only)
    )
    lora_rank: int | None = None  # LoRA adapters of this rank on a frozen base (peft); None: full fine-tune
    lora_targets: tuple[str, ...] | None = None  # modules LoRA adapts; None: every attention and MLP projection
    world_size: int = 1  # ranks the step runs on: launched processes (run) or a fake process group (simulate)
    fsdp: bool = False  # shard with FSDP2's fully_shard, every decoder layer and then the root; needs world_size > 1

    def __post_init__(self) -> None:
        # JSON and the URL give a list; a tuple keeps the spec hashable (results are cached by spec).
        if self.lora_targets is not None and not isinstance(self.lora_targets, tuple):
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))

    def validate(self) -> None:
        """Raise :class:`SpecError` naming the first bad value and its fix."""
        model_example = "RunSpec(model='tiny-llama') or RunSpec(model='/path/to/folder')"
        expect_type("RunSpec", "model", self.model, (str, os.PathLike), model_example)
        for name in ("seq_len", "batch_size", "repeats"):
            check_whole_number(name, getattr(self, name))
        check_whole_number("warmup", self.warmup, minimum=0)
        check_whole_number("seed", self.seed, minimum=0)
        check_at_most("repeats", self.repeats, MAX_REPEATS, "a median of that many timed steps is as good as it gets")
        check_at_most("warmup", self.warmup, MAX_WARMUP, "the allocator and caches settle within a few steps")
        check_at_most(
            "seed", self.seed, MAX_SEED, f"each rank seeds with seed + rank, a 32-bit seed up to {2**32 - 1:,}"
        )
        check_at_most(
            "seq_len x batch_size", self.seq_len * self.batch_size, MAX_TOKENS, "a step of more tokens is not one run"
        )
        if self.every_n_layers is not None:
            validate_every_n_layers(self.every_n_layers)
        for name, choices in (("dtype", DTYPES), ("device", DEVICES), ("optimizer", OPTIMIZERS)):
            if getattr(self, name) not in choices:
                raise not_one_of(name, getattr(self, name), choices)
        if self.lora_rank is not None and (
            isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 1
        ):
            raise SpecError(
                f"lora_rank={self.lora_rank!r} is not valid: a LoRA rank is a whole number >= 1 (8 or 16 are "
                "common). Leave it unset for a full fine-tune.",
                key="spec.lora_rank",
                value=self.lora_rank,
            )
        if self.lora_targets is not None and self.lora_rank is None:
            raise SpecError(
                f"lora_targets={list(self.lora_targets)} without lora_rank: targets only mean something with LoRA. "
                "Set lora_rank (for example 8) or drop the targets.",
                key="spec.lora_targets_without_rank",
                targets=list(self.lora_targets),
            )
        self._validate_ranks()
        if self.offload and self.every_n_layers is None:
            raise SpecError(
                "offload=True with checkpointing off: offload moves the inputs that checkpointed layers "
                "keep, so there is nothing to move. Set every_n_layers (for example 1) or drop offload.",
                key="spec.offload_without_checkpointing",
            )

    def _validate_ranks(self) -> None:
        size = self.world_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_WORLD_SIZE:
            raise SpecError(
                f"world_size={size!r} is not valid: it must be a whole number from 1 to {MAX_WORLD_SIZE}.",
                key="spec.world_size",
                value=size,
                limit=MAX_WORLD_SIZE,
            )
        if self.fsdp and size < 2:
            raise SpecError(
                "fsdp=True with world_size=1: FSDP shards over ranks, and one rank holds everything. Launch 2 or "
                "more (python -m ckptlab run --nproc-per-node 2 --fsdp) or simulate them (--world-size 8 --fsdp).",
                key="spec.fsdp_one_rank",
            )
        if size > 1 and not self.fsdp:
            raise SpecError(
                f"world_size={size} without fsdp: across ranks the lab measures FSDP2 sharding only (plain data "
                "parallel is not measured). Add fsdp (--fsdp), or use world_size=1.",
                key="spec.ranks_without_fsdp",
                value=size,
            )
        if self.fsdp and self.lora_rank is not None:
            raise SpecError(
                f"fsdp=True with lora_rank={self.lora_rank}: LoRA under FSDP2 is not supported by the lab yet (the "
                "adapters would have to be added before sharding). Drop one of the two.",
                key="spec.fsdp_with_lora",
                rank=self.lora_rank,
            )

    @property
    def checkpointing(self) -> bool:
        return self.every_n_layers is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, order=True)
class Setting:
    """One checkpointing setting: ``every_n_layers`` (None: off) and offload."""

    every_n_layers: int | None  # None: checkpointing off
    offload: bool = False  # checkpointed inputs to pinned host memory

    @property
    def key(self) -> str:
        """A short stable id, e.g. "off", "n=2", "n=1+offload" (for tables, JSON rows, widgets, figures)."""
        if self.every_n_layers is None:
            return "off"
        return f"n={self.every_n_layers}" + ("+offload" if self.offload else "")

    def cp_layers(self, num_layers: int) -> int:
        """How many layers this setting checkpoints (each reruns its forward in the backward)."""
        return planned_roles(num_layers, self.every_n_layers).count("CP")

    @classmethod
    def of(cls, spec: RunSpec) -> Setting:
        return cls(spec.every_n_layers, spec.offload)
