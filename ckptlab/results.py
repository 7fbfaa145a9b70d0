"""The typed result of a run: spec in, raw numbers out, each saying where it came from.

Numbers are bytes and seconds; units are made at the edge (``ckptlab.units``). Every
result carries its :class:`Provenance`, so a figure can always say whether it was
measured on CUDA, measured on the CPU, simulated or predicted.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from .errors import SpecError
from .spec import RunSpec

Kind = Literal["measured-cuda", "measured-cpu", "simulated", "predicted"]
Status = Literal["ok", "does_not_fit"]

# With fewer timed steps a run, a range from fastest to slowest says nothing about the noise.
MIN_SAMPLES_TO_JUDGE = 3


@dataclass(frozen=True)
class Provenance:
    """Where the numbers of a result come from."""

    kind: Kind  # measured-cuda, measured-cpu, simulated or predicted
    device_name: str  # e.g. "NVIDIA H200" or the CPU's name
    torch_version: str
    transformers_version: str
    created_at: str  # ISO 8601, UTC

    @property
    def label(self) -> str:
        """Short words for a figure caption, e.g. "measured on CUDA (NVIDIA H200)"."""
        words = {
            "measured-cuda": "measured on CUDA",
            "measured-cpu": "measured on the CPU",
            "simulated": "simulated (fake tensors)",
            "predicted": "predicted (formula)",
        }[self.kind]
        return f"{words} ({self.device_name})"


@dataclass(frozen=True)
class LayerResult:
    """One checkpointable layer in one step."""

    index: int  # 0-based, as transformers counts for every_n_layers
    name: str  # "L1", "L2", ... as in the diagram (1-based)
    module: str  # the layer's class, e.g. "LlamaDecoderLayer"
    planned: str  # "CP" or "keep" from the every_n_layers rule
    enabled: str  # "CP" or "keep" as read back from the flags transformers set
    forward_calls: int  # forward-phase calls observed in one step
    recompute_calls: int  # reruns observed during that step's backward
    saved_bytes: int  # bytes autograd saved while the layer ran in the forward (deduplicated by storage)
    input_bytes: int  # bytes of the layer's positional inputs (what a CP layer keeps; what offload moves)
    moe: bool = False  # the layer routes tokens to experts
    router_recompute_calls: int = 0  # MoE: reruns of its router observed during the backward
    experts_recompute_calls: int = 0  # MoE: reruns of its experts observed during the backward

    @property
    def observed(self) -> str:
        """The role the step showed: "CP" if the layer was rerun, else "keep"."""
        return "CP" if self.recompute_calls > 0 else "keep"

    @property
    def moe_rerun_complete(self) -> bool:
        """MoE: a rerun recomputed the router and the experts as often as the layer (True for dense layers)."""
        return not self.moe or self.router_recompute_calls == self.experts_recompute_calls == self.recompute_calls


@dataclass(frozen=True)
class TimingResult:
    """Wall time of the timed steps, per phase."""

    method: str  # how it was timed
    forward_s: float  # median forward time (model call including the loss)
    backward_s: float  # median backward time
    step_s: float  # median whole step: forward, backward and the optimizer's step
    optimizer_s: float = 0.0  # median optimizer.step() and zero_grad(); 0 with optimizer "none"
    forward_samples: list[float] = field(default_factory=list)
    backward_samples: list[float] = field(default_factory=list)
    step_samples: list[float] = field(default_factory=list)
    optimizer_samples: list[float] = field(default_factory=list)

    @property
    def step_spread(self) -> tuple[float, float]:
        """Fastest and slowest timed step."""
        return min(self.step_samples), max(self.step_samples)


@dataclass(frozen=True)
class MemoryResult:
    """Memory of one observed step."""

    method: str  # the tool that counted and what it counts
    baseline_bytes: int  # held before the forward: parameters, buffers, anything left from setup
    after_forward_bytes: int  # resident above the baseline once the loss is computed: what the backward will need
    peak_bytes: int  # highest total (baseline included) over the whole step
    peak_where: dict[str, Any]  # the stretch of the step where the peak was reached (phase, layer, rerun, description)
    # By category (meters.CATEGORIES: parameter, buffer, gradient, optimizer_state, activation, temp;
    # on CUDA activation_and_temp holds the last two, which the allocator cannot tell apart).
    breakdown_after_forward: dict[str, int] = field(default_factory=dict)
    breakdown_baseline: dict[str, int] = field(default_factory=dict)  # by category before the forward
    breakdown_at_peak: dict[str, int] = field(default_factory=dict)
    optimizer_state_bytes: int = 0  # the optimizer's state on the device, steady state (after the first step)
    offload_bytes: int = (
        0  # inputs kept by checkpointed layers: moved to host with offload on CUDA, else what it would move
    )
    offload_applied: bool = False  # True only when transformers' offload ran (or was simulated)
    host_offload_bytes: int = 0  # pinned host memory offload held at the end of the forward (simulated runs)
    timeline: list[dict[str, Any]] = field(
        default_factory=list
    )  # memory at each event of the step (probe.TimelinePoint)

    @property
    def peak_above_baseline_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes


@dataclass(frozen=True)
class ModelSummary:
    """The model as run."""

    name: str
    family: str
    task: str
    num_layers: int
    hidden_size: int
    num_params: int
    weights: str  # "random" or "loaded"
    experts_implementation: str | None = None  # transformers' experts setting the step ran (MoE); None: dense
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0  # top_k: experts each token is routed to


@dataclass(frozen=True)
class RankResult:
    """One rank of a run across ranks (FSDP2): its own memory, time and per-layer rows."""

    rank: int  # global rank, 0-based
    memory: MemoryResult | None  # None when the step did not fit on this rank
    timing: TimingResult | None  # None for a simulated rank
    layers: list[LayerResult]

    @property
    def plan_matches(self) -> bool:
        return all(
            layer.planned == layer.enabled == layer.observed and layer.moe_rerun_complete for layer in self.layers
        )


@dataclass(frozen=True)
class RunResult:
    """Everything a run found out, ready for JSON, a table or a figure."""

    spec: RunSpec
    model: ModelSummary
    status: Status  # "ok", or "does_not_fit" when the step ran out of memory
    device: str  # the device used, e.g. "cpu" or "cuda:0"
    dtype: str  # the dtype used
    layers: list[LayerResult]
    memory: MemoryResult | None  # None when the step did not fit
    timing: TimingResult | None
    provenance: Provenance
    notes: list[str] = field(default_factory=list)  # what a reader must know: offload not applied, n > layers, ...
    message: str = ""  # for status "does_not_fit": what did not fit and what to try
    # Across ranks (spec.world_size > 1): every rank measured, or rank 0 simulated; the fields above are rank 0's.
    ranks: list[RankResult] = field(default_factory=list)

    @property
    def plan_matches(self) -> bool:
        """True when the observed reruns, the flags and the rule all agree on every layer."""
        layers_agree = all(
            layer.planned == layer.enabled == layer.observed and layer.moe_rerun_complete for layer in self.layers
        )
        return layers_agree and all(rank.plan_matches for rank in self.ranks)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["plan_matches"] = self.plan_matches
        data["provenance"]["label"] = self.provenance.label
        for row, layer in zip(data["layers"], self.layers):
            row["observed"] = layer.observed
        for rank_data, rank in zip(data["ranks"], self.ranks):
            for row, layer in zip(rank_data["layers"], rank.layers):
                row["observed"] = layer.observed
        if self.memory is not None:
            data["memory"]["peak_above_baseline_bytes"] = self.memory.peak_above_baseline_bytes
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Rebuild a result from :meth:`to_dict` output (derived keys are ignored)."""

        def build(kind: type, values: dict[str, Any] | None) -> Any:
            if values is None:
                return None
            names = {f.name for f in fields(kind)}
            return kind(**{k: v for k, v in values.items() if k in names})

        return cls(
            spec=build(RunSpec, data["spec"]),
            model=build(ModelSummary, data["model"]),
            status=data["status"],
            device=data["device"],
            dtype=data["dtype"],
            layers=[build(LayerResult, row) for row in data["layers"]],
            memory=build(MemoryResult, data["memory"]),
            timing=build(TimingResult, data["timing"]),
            provenance=build(Provenance, data["provenance"]),
            notes=list(data.get("notes", [])),
            message=data.get("message", ""),
            ranks=[
                RankResult(
                    rank=row["rank"],
                    memory=build(MemoryResult, row["memory"]),
                    timing=build(TimingResult, row["timing"]),
                    layers=[build(LayerResult, layer) for layer in row["layers"]],
                )
                for row in data.get("ranks", [])
            ],
        )


@dataclass(frozen=True)
class Comparison:
    """A run's time and memory against a reference run (usually checkpointing off)."""

    step_ratio: float  # median step time of the run over the reference's
    step_significant: bool | None  # False when the step-time ranges overlap (noise); None with too few repeats to tell
    peak_ratio: float  # peak memory above baseline, run over reference
    after_forward_ratio: float  # resident activations after the forward, run over reference

    def describe_step(self) -> str:
        change = f"{(self.step_ratio - 1) * 100:+.0f}%"
        if self.step_significant is None:
            return f"step time {change}, from fewer than {MIN_SAMPLES_TO_JUDGE} timed steps a run: too few to tell an effect from noise"
        if self.step_significant:
            return f"step time {change} (outside the spread of both runs)"
        return f"step time {change}, within the spread of the repeats: not a measurable difference"


def compare(run: RunResult, reference: RunResult) -> Comparison:
    """Ratios of ``run`` to ``reference``, with the step-time difference judged against the spread.

    The two step-time ranges (fastest to slowest repeat) must not overlap for the
    difference to count; on a shared 2-core machine a small model's recompute cost
    can be smaller than the noise, and then the lab says so instead of reporting it.
    With fewer than ``MIN_SAMPLES_TO_JUDGE`` repeats a run there is no judgement (None).

    Raises:
        SpecError: if either run has no measurements (it did not fit).
    """
    for result in (run, reference):
        if result.memory is None or result.timing is None:
            raise SpecError(f"cannot compare a run with status {result.status!r}: it has no measurements.")
    low, high = run.timing.step_spread
    ref_low, ref_high = reference.timing.step_spread
    overlap = low <= ref_high and ref_low <= high
    enough = min(len(run.timing.step_samples), len(reference.timing.step_samples)) >= MIN_SAMPLES_TO_JUDGE
    return Comparison(
        step_ratio=run.timing.step_s / reference.timing.step_s,
        step_significant=(not overlap) if enough else None,
        peak_ratio=_ratio(run.memory.peak_above_baseline_bytes, reference.memory.peak_above_baseline_bytes),
        after_forward_ratio=_ratio(run.memory.after_forward_bytes, reference.memory.after_forward_bytes),
    )


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")


def median(samples: list[float]) -> float:
    return statistics.median(samples)
