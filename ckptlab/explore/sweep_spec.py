"""What a sweep measures: one model, its sequence lengths and the settings to try (:class:`SweepSpec`).

:mod:`ckptlab.explore.sweep` runs it; each of its rows is one :class:`~ckptlab.spec.RunSpec`
(:meth:`SweepSpec.run_spec`), so a row is validated and measured as a single run is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import Option, SpecError, check_at_most, check_whole_number, not_one_of
from ..fact import Fact
from ..model.presets import DEFAULT_PRESET
from ..model.quantize import Quantization, as_quantization
from ..model.selective import Selective, selective_key, validate_selective
from ..spec import ORDERS, RECIPE_FIELDS, Order, RunSpec

OffloadChoice = Literal["no", "yes", "both"]
OFFLOAD_CHOICES = ("no", "yes", "both")
# Trainer's side of the step that every row shares, by RunSpec's names.
MAX_SWEEP_LENGTHS = 32  # sequence lengths of one sweep (docs/workshop-server.md, "Limits of one run"): 32 x every setting is already an afternoon
MAX_SWEEP_SETTINGS = 64  # every_n_layers values of one sweep: one per layer of a 64-layer model


@dataclass(frozen=True)
class SweepSpec:
    """What to sweep: one model, its shapes and the settings to try."""

    model: str = DEFAULT_PRESET  # preset name or local directory with config.json
    seq_lens: tuple[int, ...] = (512,)  # one row group per sequence length, in this order
    every_n_layers: tuple[int, ...] | None = None  # settings to try; None: every distinct one, 1 .. layers
    offload: OffloadChoice = "no"  # "no", "yes" (offload rows only) or "both"; offload rows need CUDA
    batch_size: int = 1  # sequences per step
    dtype: str = "auto"  # as RunSpec.dtype
    device: str = "auto"  # as RunSpec.device
    repeats: int = 4  # timed steps per row, as a single run
    warmup: int = 2  # untimed steps before the first row of each sequence length
    warmup_each_row: bool = False  # True: every row warms up as a single run does (slower, see the module doc)
    include_off: bool = True  # measure checkpointing off first: the reference of every ratio
    seed: int = 0  # seeds the random weights and tokens
    optimizer: str = "adamw"  # as RunSpec.optimizer: every row runs the same training step
    optim_args: str | None = None  # as RunSpec.optim_args
    gradient_accumulation_steps: int = 1  # as RunSpec.gradient_accumulation_steps
    max_grad_norm: float = 1.0  # as RunSpec.max_grad_norm
    mixed_precision: str = "none"  # as RunSpec.mixed_precision
    lora_rank: int | None = None  # as RunSpec.lora_rank; None: full fine-tune
    lora_targets: tuple[str, ...] | None = None  # as RunSpec.lora_targets
    timing_order: Order = "interleaved"  # "interleaved": A B C A B C ... (see the module doc); "blocks": A A B B C C
    selective: Selective = "none"  # as RunSpec.selective, for every checkpointed row (the off row has none)
    # The policy axis: each checkpointed setting measured once per policy, in this order ("none" is plain
    # checkpointing); None: the one policy ``selective``.
    policies: tuple[Selective, ...] | None = None
    quantization: Quantization | None = None  # as RunSpec.quantization (a 4-bit base), every row
    attn_implementation: str = "sdpa"  # as RunSpec.attn_implementation, for every row
    # The attention axis (ckptlab.model.attention): every row, the off reference included, measured once per
    # implementation, in this order; None: the one attn_implementation.
    attn_implementations: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantization", as_quantization(self.quantization))
        for name in ("policies", "attn_implementations"):  # JSON and the URL give a list; a tuple stays hashable
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def attention_axis(self) -> tuple[str, ...]:
        """The attention implementations every row is measured with, in order."""
        return self.attn_implementations if self.attn_implementations is not None else (self.attn_implementation,)

    @property
    def policy_axis(self) -> tuple[Selective, ...]:
        """The selective policies every checkpointed setting is measured with, in order."""
        return self.policies if self.policies is not None else (self.selective,)

    def validate(self) -> None:
        """Raise :class:`SpecError` naming the first bad value and its fix."""
        if self.timing_order not in ORDERS:
            raise not_one_of("timing_order", self.timing_order, ORDERS)
        if not self.seq_lens:
            raise SpecError(key="sweep.no_seq_lens")
        check_at_most("the number of seq_lens", len(self.seq_lens), MAX_SWEEP_LENGTHS, Fact("bound.sweep_lengths"))
        check_at_most(
            "the number of every_n_layers values", len(self.every_n_layers or ()), MAX_SWEEP_SETTINGS,
            Fact("bound.sweep_settings"),
        )  # fmt: skip
        for seq_len in self.seq_lens:
            check_whole_number("seq_len", seq_len)
        if self.offload not in OFFLOAD_CHOICES:
            raise not_one_of("offload", self.offload, OFFLOAD_CHOICES)
        if self.every_n_layers is not None and not self.every_n_layers:
            raise SpecError(key="sweep.no_every_n_layers", option=Option("every_n_layers"))
        self._validate_policies()
        axis = self.attention_axis
        if not axis or len(set(axis)) < len(axis):
            raise SpecError(
                key="sweep.attention_axis",
                axis=list(axis),
            )
        for value in self.every_n_layers or ():
            for policy in self.policy_axis:
                self.run_spec(self.seq_lens[0], value, False, selective=policy).validate()
        for attention in axis:  # each with each policy: the attention policy does not go with eager
            self.run_spec(self.seq_lens[0], None, False, attn_implementation=attention).validate()
            for policy in self.policy_axis:
                self.run_spec(self.seq_lens[0], 1, False, selective=policy, attn_implementation=attention).validate()

    def _validate_policies(self) -> None:
        if self.policies is None:
            return
        if not self.policies:
            raise SpecError(key="sweep.no_policies")
        if self.selective != "none":
            raise SpecError(
                key="sweep.selective_and_policies",
                policy=selective_key(self.selective),
                policies=[selective_key(p) for p in self.policies],
            )
        for policy in self.policies:
            validate_selective(policy)
        keys = [selective_key(policy) for policy in self.policies]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise SpecError(key="sweep.policy_twice", policy=repeated)

    def run_spec(
        self,
        seq_len: int,
        every_n_layers: int | None,
        offload: bool,
        warmup: int | None = None,
        selective: Selective | None = None,
        attn_implementation: str | None = None,
    ) -> RunSpec:
        """The single run of one row; ``selective`` is the row's policy and ``attn_implementation`` its attention
        (defaults: the first of each axis)."""
        policy = self.policy_axis[0] if selective is None else selective
        return RunSpec(
            model=self.model,
            seq_len=seq_len,
            batch_size=self.batch_size,
            dtype=self.dtype,
            device=self.device,
            every_n_layers=every_n_layers,
            offload=offload,
            repeats=self.repeats,
            warmup=self.warmup if warmup is None else warmup,
            seed=self.seed,
            optimizer=self.optimizer,
            lora_rank=self.lora_rank,
            lora_targets=self.lora_targets,
            **{name: getattr(self, name) for name in RECIPE_FIELDS},
            selective=policy if every_n_layers is not None else "none",
            quantization=self.quantization,
            attn_implementation=self.attention_axis[0] if attn_implementation is None else attn_implementation,
        )

    @classmethod
    def from_run_spec(cls, spec: RunSpec, **axes: Any) -> SweepSpec:
        """A sweep around ``spec``: its model, batch, dtype, device, repeats, warm-up, seed, optimizer, LoRA,
        selective policy and attention; ``axes`` set the rest."""
        axes.setdefault("seq_lens", (spec.seq_len,))
        return cls(
            model=spec.model,
            batch_size=spec.batch_size,
            dtype=spec.dtype,
            device=spec.device,
            repeats=spec.repeats,
            warmup=spec.warmup,
            seed=spec.seed,
            optimizer=spec.optimizer,
            lora_rank=spec.lora_rank,
            lora_targets=spec.lora_targets,
            **{name: getattr(spec, name) for name in RECIPE_FIELDS},
            selective=spec.selective,
            quantization=spec.quantization,
            attn_implementation=spec.attn_implementation,
            **axes,
        )
