"""The typed result of a run: spec in, raw numbers out, each saying where it came from; and its JSON.

Numbers are bytes and seconds; units are made at the edge (``ckptlab.units``). Every
result carries its :class:`Provenance`, so a figure can always say whether it was
measured on CUDA, measured on the CPU, simulated or predicted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from ..errors import SpecError
from ..fact import Fact, worded
from ..model.selective import selective_key
from ..spec import RunSpec
from .allocations import AllocationTrace, DeviceTotal
from .work import StepWork

# "predicted-roofline": a step's time from its counted ops on a device's speed (explore/roofline), not the formula.
Kind = Literal["measured-cuda", "measured-cpu", "simulated", "predicted", "predicted-roofline"]
BusyReason = Literal["load", "spread", "shared"]
Status = Literal["ok", "does_not_fit"]

# The probe's events (ckptlab.step.probe.EVENTS) whose stretch is the loss: its forward, and the backward through it.
LOSS_REGIONS = ("loss", "backward")
# With fewer timed steps a run, a range from fastest to slowest says nothing about the noise.
MIN_SAMPLES_TO_JUDGE = 3
# Identical steps whose fastest-to-slowest range exceeds this share of their median: the machine is too
# busy to time (on an idle 2-core machine tiny-llama's steps stay within about 10%; under a second job, 30-90%).
BUSY_SPREAD = 0.25


# How a number was counted or timed: ``MemoryResult.method`` and ``TimingResult.method`` hold one of these keys,
# never a sentence; its words are ``said.method.<key>`` in the reader's language (:data:`METHOD_FACTS`).
CUDA_MEMORY_METHOD = "memory_cuda"  # the CUDA caching allocator's statistics
CPU_MEMORY_METHOD = "memory_cpu"  # MemTracker on a separate untimed step
OBSERVED_MEMORY_METHOD = "memory_observed"  # MemTracker on the user's own training step (integrations)
SIMULATED_MEMORY_METHOD = "memory_simulated"  # fake tensors accounted by MemTracker
CUDA_TIME_METHOD = "time_cuda"  # CUDA events
CPU_TIME_METHOD = "time_cpu"  # time.perf_counter
METHOD_FACTS = {
    CUDA_MEMORY_METHOD: Fact("method.memory_cuda"),
    CPU_MEMORY_METHOD: Fact("method.memory_cpu"),
    OBSERVED_MEMORY_METHOD: Fact("method.memory_observed"),
    SIMULATED_MEMORY_METHOD: Fact("method.memory_simulated"),
    CUDA_TIME_METHOD: Fact("method.time_cuda"),
    CPU_TIME_METHOD: Fact("method.time_cpu"),
}

# Where a simulation ran, in the place of a device's name (a page says it in its language: show.labels).
NO_GPU = Fact("provenance.no_gpu")
AS_ON_CPU = Fact("provenance.as_on_cpu")  # a simulation asked for with device "cpu": the CPU's kernels and dtype


@dataclass(frozen=True)
class Provenance:
    """Where the numbers of a result come from."""

    kind: Kind  # measured-cuda, measured-cpu, simulated, predicted or predicted-roofline
    device_name: str  # e.g. "NVIDIA H200" or the CPU's name
    torch_version: str
    transformers_version: str
    created_at: str  # ISO 8601, UTC

    @property
    def label(self) -> str:
        """Short words for a figure caption, e.g. "measured on CUDA (NVIDIA H200)"."""
        if self.kind == "predicted-roofline":
            return f"predicted (roofline, {self.device_name})"
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
    # Selective checkpointing (ckptlab.model.selective), observed in the memory step:
    selective: str = "none"  # the policy the layer's checkpoint ran with (its key); "none": plain, or a keep layer
    kept_bytes: int = 0  # bytes of the op outputs the policy kept (SAC's cache, not autograd's saved tensors)
    kept_ops: dict[str, int] = field(default_factory=dict)  # op -> outputs kept in the forward, e.g. {"aten.mm": 7}
    rerun_ops: dict[str, int] = field(default_factory=dict)  # op -> times it ran again in the backward's rerun
    reused_ops: dict[str, int] = field(default_factory=dict)  # op -> times the rerun took its output from the cache
    # A keep layer nested in a checkpointed one (Zamba2's mamba_decoder): the index of the layer inside whose rerun
    # it reruns; None for every other layer.
    rerun_inside: int | None = None
    # Of saved_bytes, what the layer's attention kept: the probabilities under eager attention, the output and
    # logsumexp under SDPA's fused kernels (ckptlab.step.probe.kept_by_attention); 0 in a CP layer.
    attention_bytes: int = 0

    def selective_as(self, policy: str) -> bool:
        """A CP layer ran with ``policy`` (a key) and it kept something; any other layer: True."""
        return self.enabled != "CP" or policy == "none" or (self.selective == policy and bool(self.kept_ops))

    @property
    def observed(self) -> str:
        """The role the step showed: "CP" if the layer was rerun, else "keep"."""
        return "CP" if self.recompute_calls > 0 else "keep"

    @property
    def expected(self) -> str:
        """The role the plan gives the backward: the rule's, or CP for a layer that reruns inside its parent's rerun."""
        return "CP" if self.rerun_inside is not None else self.planned

    @property
    def as_planned(self) -> bool:
        """The layer did what was planned: the every_n_layers rule and the flag transformers set agree, and the
        layer reran as the plan says (inside its parent's rerun, for a nested keep layer). A layer the step never
        ran (Gemma 3's vision tower on a text batch: transformers counts its layers all the same) has nothing to
        rerun, and contradicts no plan."""
        return self.planned == self.enabled and (self.expected == self.observed or self.forward_calls == 0)

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

    # The machine while it timed (None where unknown, e.g. a result saved before these fields existed):
    load_average: float | None = None  # the highest 1-minute load average read around the timed steps
    cores: int | None = None  # CPU cores this process may run on
    threads: int | None = None  # torch's intra-op threads of the timed steps (torchstate.thread_plan where measured)
    shared_cores: bool = False  # a shared server's simulations ran on the same cores while this was timed

    @property
    def step_spread(self) -> tuple[float, float]:
        """Fastest and slowest timed step."""
        return min(self.step_samples), max(self.step_samples)

    @property
    def relative_spread(self) -> float | None:
        """Fastest-to-slowest range of the timed steps over their median; None with fewer than 2 steps."""
        if len(self.step_samples) < 2 or self.step_s <= 0:
            return None
        low, high = self.step_spread
        return (high - low) / self.step_s

    @property
    def busy_reasons(self) -> tuple[BusyReason, ...]:
        """Why this machine was too busy to time, if it was: "load" (more runnable tasks than cores: the load counts
        the step's own ``threads``, so a one-thread step beside one other task on two cores is not busy, where torch's
        default of a thread a core made it so),
        "spread" (identical steps differed by more than :data:`BUSY_SPREAD` of their median) and/or
        "shared" (a shared server ran simulations on the same cores meanwhile: ``shared_cores``)."""
        reasons: list[BusyReason] = []
        if self.load_average is not None and self.cores and self.load_average > self.cores:
            reasons.append("load")
        spread = self.relative_spread
        if spread is not None and len(self.step_samples) >= MIN_SAMPLES_TO_JUDGE and spread > BUSY_SPREAD:
            reasons.append("spread")
        if self.shared_cores:
            reasons.append("shared")
        return tuple(reasons)

    @property
    def too_busy(self) -> bool:
        """True when the timings are not to be trusted: see :attr:`busy_reasons`."""
        return bool(self.busy_reasons)


@dataclass(frozen=True)
class Region:
    """A stretch of the step between two probe events; a result's peak says in which one it was reached.

    Its JSON (:meth:`to_dict`) has the keys kind, phase, layer, rerun and description, those of the plain dict
    it replaced; in Python its fields are attributes (``region.description``).
    """

    kind: str  # the probe event that starts the stretch (ckptlab.step.probe.EVENTS); "" when unknown
    phase: str  # "forward", "loss", "backward" or "optimizer"; "" when unknown
    layer: int | None = None  # 0-based index of the layer the stretch belongs to, None outside the layers
    rerun: bool = False  # True while the backward recomputes a checkpointed layer
    description: str = ""  # for people, e.g. "backward of L3: its rerun, then its gradients"
    micro_batch: int = 0  # 0-based micro-batch of a step with gradient accumulation (0 without it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Region:
        """Rebuild from :meth:`to_dict` output; a key missing from an older result takes its "unknown" value."""
        return cls(
            kind=data.get("kind") or "",
            phase=data.get("phase") or "",
            layer=data.get("layer"),
            rerun=bool(data.get("rerun")),
            description=data.get("description") or "",
            micro_batch=data.get("micro_batch") or 0,
        )


@dataclass(frozen=True)
class TimelinePoint:
    """Memory at one event of the step, and how high it rose before the next event.

    The events are the probe's (``ckptlab.step.probe.EVENTS``); ``ckptlab.step.timeline`` reads a
    list of these (order, positions, what each layer holds). Its JSON has the keys of the plain dict it
    replaced; in Python its fields are attributes (``point.kind``).
    """

    order: int  # position in the step, from 0
    kind: str  # what the event is (probe.EVENTS)
    phase: str  # "forward", "loss", "backward" or "optimizer" (the gradient norm's event too)
    layer: int | None  # 0-based layer index, None outside the layers
    rerun: bool  # the backward is recomputing a checkpointed layer
    event: str  # the stretch that starts here, for people
    current_bytes: int  # memory in use at this event
    region_peak_bytes: int = 0  # highest memory between this event and the next
    region_peak_breakdown: dict[str, int] = field(default_factory=dict)  # by category at that high point, where told
    micro_batch: int = 0  # 0-based micro-batch of a step with gradient accumulation (0 without it)
    region_peak_logits_bytes: int | None = None  # float32 logits at that high point (MemoryResult.logits_bytes_at_peak)

    @property
    def region(self) -> Region:
        """The stretch this event starts."""
        return Region(self.kind, self.phase, self.layer, self.rerun, self.event, self.micro_batch)

    @property
    def rise_bytes(self) -> int:
        """How far memory rose above its level at this event before the next one (never below 0)."""
        return max(self.region_peak_bytes - self.current_bytes, 0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimelinePoint:
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})


@dataclass(frozen=True)
class MemoryResult:
    """Memory of one observed step."""

    method: str  # the tool that counted and what it counts
    baseline_bytes: int  # held before the forward: parameters, buffers, anything left from setup
    after_forward_bytes: int  # resident above the baseline once the loss is computed: what the backward will need
    peak_bytes: int  # highest total (baseline included) over the whole step
    peak_where: Region  # the stretch of the step where the peak was reached
    # By category (memory_meters.CATEGORIES: parameter, buffer, gradient, optimizer_state, activation, temp;
    # on CUDA activation_and_temp holds the last two, which the allocator cannot tell apart).
    breakdown_after_forward: dict[str, int] = field(default_factory=dict)
    breakdown_baseline: dict[str, int] = field(default_factory=dict)  # by category before the forward
    breakdown_at_peak: dict[str, int] = field(default_factory=dict)
    optimizer_state_bytes: int = 0  # the optimizer's state on the device, steady state (after the first step)
    # Inputs kept by checkpointed layers: moved to host with offload on CUDA, else what it would move.
    offload_bytes: int = 0
    offload_applied: bool = False  # True only when transformers' offload ran (or was simulated)
    host_offload_bytes: int = 0  # pinned host memory offload held at the end of the forward (simulated runs)
    timeline: list[TimelinePoint] = field(default_factory=list)  # memory at each event of the step
    # Bytes at the peak in float32 tensors of the logits' size (tokens x vocab): transformers' upcast copy of the
    # logits, cross-entropy's log-softmax and their gradients, outside every layer, so no checkpointing setting
    # frees them. None where the meter cannot tell (the CUDA allocator's counters see blocks, not tensors).
    logits_bytes_at_peak: int | None = None

    @property
    def peak_above_baseline_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes

    @property
    def logits_set_the_peak(self) -> bool:
        """The peak is in the loss (its forward or the start of the backward) and float32 logits are part of it."""
        return bool(self.logits_bytes_at_peak) and self.peak_where.kind in LOSS_REGIONS


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
        return all(layer.as_planned and layer.moe_rerun_complete for layer in self.layers)


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
    notes: list[Fact] = field(default_factory=list)  # what a reader must know: offload not applied, n > layers, ...
    reason: Fact | None = None  # for status "does_not_fit": what did not fit and what to try (``message``: its English)
    # Across ranks (spec.world_size > 1): every rank measured, or rank 0 simulated; the fields above are rank 0's.
    ranks: list[RankResult] = field(default_factory=list)
    # A simulation's births and frees in order (``simulate(..., allocations=True)``), for the caching allocator's
    # replay; not in the JSON (100k events on a deep model): the JSON carries what the replay answers.
    allocations: AllocationTrace | None = field(default=None, repr=False, compare=False)
    # What nvidia-smi will show on a GPU (``ckptlab.explore.device.device_total``), term by term, where asked.
    device_total: DeviceTotal | None = None
    # A simulation's ops, counted as they ran (FLOPs, bytes, kernels by phase and layer; ckptlab.step.opcount), rank 0's
    # under FSDP2; None for a measured run. Its JSON is a summary by phase and by layer (StepWork.summary).
    work: StepWork | None = None

    @property
    def message(self) -> str:
        """Why the run has no figures, in English (``reason`` worded through ``en.json``); "" when it has them."""
        return "" if self.reason is None else worded(self.reason)

    @property
    def plan_matches(self) -> bool:
        """True when the observed reruns, the flags and the rule all agree on every layer."""
        layers_agree = all(layer.as_planned and layer.moe_rerun_complete for layer in self.layers)
        return layers_agree and self.selective_matches and all(rank.plan_matches for rank in self.ranks)

    @property
    def selective_matches(self) -> bool:
        """True when every CP layer ran with the spec's selective policy and it kept something there."""
        policy = selective_key(self.spec.selective)
        layers = [*self.layers, *(layer for rank in self.ranks for layer in rank.layers)]
        return all(layer.selective_as(policy) for layer in layers)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(replace(self, allocations=None))
        del data["allocations"]
        data["work"] = None if self.work is None else self.work.summary()
        data["plan_matches"] = self.plan_matches
        data["mixed_precision_via"] = self.spec.mixed_precision_via  # "none", "autocast" or "fsdp2"
        data["provenance"]["label"] = self.provenance.label
        data["notes"] = [worded(note) for note in self.notes]  # English, as JSON always had them
        data["facts"] = [note.to_dict() for note in self.notes]  # the same notes, typed
        # The reason in English where "message" always was, and typed beside the facts.
        data = {("message" if k == "reason" else k): (self.message if k == "reason" else v) for k, v in data.items()}
        data["reason"] = None if self.reason is None else self.reason.to_dict()
        for row, layer in zip(data["layers"], self.layers):
            row["observed"] = layer.observed
        for rank_data, rank in zip(data["ranks"], self.ranks):
            for row, layer in zip(rank_data["layers"], rank.layers):
                row["observed"] = layer.observed
        if self.memory is not None:
            data["memory"]["peak_above_baseline_bytes"] = self.memory.peak_above_baseline_bytes
        if self.device_total is not None:
            data["device_total"]["cached_bytes"] = self.device_total.cached_bytes
            data["device_total"]["total_bytes"] = self.device_total.total_bytes
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Rebuild a result from :meth:`to_dict` output (derived keys are ignored, and so is ``work``: its JSON is a
        summary, not the items; the rebuilt result has none)."""

        def build(kind: type, values: dict[str, Any] | None) -> Any:
            if values is None:
                return None
            names = {f.name for f in fields(kind)}
            kept = {k: v for k, v in values.items() if k in names}
            if kind is MemoryResult:
                kept["peak_where"] = Region.from_dict(kept.get("peak_where") or {})
                kept["timeline"] = [TimelinePoint.from_dict(point) for point in kept.get("timeline", [])]
            return kind(**kept)

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
            notes=[Fact.from_dict(fact) for fact in data["facts"]],
            reason=Fact.from_dict(data["reason"]) if data.get("reason") else None,
            device_total=build(DeviceTotal, data.get("device_total")),
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


def measurements(result: RunResult) -> tuple[MemoryResult, TimingResult]:
    """A measured run's memory and time figures.

    Raises:
        SpecError: the run has none (it did not fit), or no time (a simulation).
    """
    if result.memory is None or result.timing is None:
        raise SpecError(key="api.no_measurements", status=result.status)
    return result.memory, result.timing


def timing_of(result: RunResult) -> TimingResult:
    """A measured run's time figures.

    Raises:
        SpecError: the run has none (it did not fit, or was simulated).
    """
    if result.timing is None:
        raise SpecError(key="api.no_time_figures", status=result.status, kind=result.provenance.kind)
    return result.timing


def memory_of(result: RunResult) -> MemoryResult:
    """A run's memory figures, measured or simulated.

    Raises:
        SpecError: the run has none (it did not fit).
    """
    if result.memory is None:
        raise SpecError(key="api.no_memory_figures", status=result.status, message=result.message)
    return result.memory
