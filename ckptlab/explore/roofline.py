"""A step's time on a GPU it never ran on: a roofline per op over the step's counted work (issue 59).

The simulation counts every op of a step (:class:`~ckptlab.step.work.StepWork`: FLOPs and bytes per op, by phase
and layer); this module turns those counts into seconds on one device's speed (:class:`Speed`: a
:class:`~ckptlab.explore.gpus.GpuSpec`, or this machine's measured CPU speed) and says the result as one typed
:class:`TimePrediction`, labelled "predicted (roofline, <device>)": never measured, never simulated. It is the lab's
one time predictor: the GPU predictions of the At-scale page and the lesson, and the wait before a run on this
machine (:mod:`ckptlab.explore.step_time`: this CPU's measured speed, or a known GPU's record).

The model (docs/time.md has it with its sources):

- **One op** takes ``max(flops / (peak(dtype) x E_COMPUTE), bytes / (bandwidth x E_MEMORY), LAUNCH_S)``. An op
  with FLOPs is a matmul-like op (torch's ``flop_counter`` registry, and the lab's own formulas, count only
  matmuls, convolutions and attention), so it runs at the tensor-core peak of its dtype; an op without FLOPs
  (elementwise, norms, copies) is bound by memory bandwidth. The launch cost is a *floor*, not an addition: a
  CUDA launch is asynchronous, so while kernels take longer than a launch the host queues the next one behind
  them; a kernel shorter than a launch leaves the GPU waiting for the host. The ops the model's Python issues (the
  forward, the loss and the rerun) have a higher floor than the backward's, which autograd's C++ engine issues
  (``PYTHON_OP_S`` against ``LAUNCH_S``): why a small model's rerun costs more than its ops' GPU time.
- **On a CPU** nothing is asynchronous: the host's time per op *adds* to its arithmetic
  (:attr:`Efficiency.host_adds`), and the host times are this CPU's own, measured (:func:`measured_efficiency`:
  a forward op, a backward op, and a checkpointed layer's rerun op with the checkpoint's saved-tensor hooks,
  which cost about three forward ops on this lab's CPU).
- **float32 matmuls** run at the TF32 tensor-core peak where torch is told to
  (``torch.set_float32_matmul_precision("high")`` or ``"medium"``, i.e. ``allow_tf32``), else on the CUDA cores:
  the lab reads torch's own setting (:func:`float32_matmul`), whose default ("highest") is no TF32: what a
  user's script gets unless it asks, and what Trainer's ``tf32=None`` leaves alone.
- **Offload** (transformers' ``save_on_cpu``): a checkpointed layer's input goes to the host in the forward and
  comes back in the backward, on the compute stream (what this project's H200 run showed: docs/gpu-results.md),
  so its bytes over the host link add to the step.
- **FSDP2's collectives** go over the GPU-to-GPU link; a ring all-gather or reduce-scatter moves (w-1)/w of the
  unsharded bytes per rank. FSDP2 prefetches the next layer's all-gather while this one computes, so **a layer
  costs the larger of its compute and its collectives**, not their sum; only a collective longer than its
  layer's compute shows in the step (the "collective" phase holds that exposed part).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import torch
from torch.utils import _runtime_estimation

from ..errors import SpecError
from ..results import Kind, Provenance
from ..step.provenance import made_now
from ..step.work import PHASES, OpCost, StepWork, WorkItem
from .gpus import Link

if TYPE_CHECKING:
    from ..results import RunResult
    from ..spec import Setting

# --- The efficiency factors: their one home. First values from published measurements (docs/time.md); the fit
# (benchmarks/fit_roofline.py) may move ONE of them, on ONE row: this project's H200 every_n_layers=2 factor
# (x1.24, qwen3-0.6b, 4096 tokens, bf16: docs/gpu-results.md). The other published rows are the check.

# Share of the dense tensor-core peak a model's matmuls reach. The best-shape ceiling measured by ml-engineering's
# MAMF finder is 80.1% on H100 SXM (792 of 989 TFLOP/s), 85.9% on A100 SXM; a model's own shapes sit below it.
E_COMPUTE = 0.70
# Share of the HBM bandwidth a memory-bound kernel reaches: first value in the range 0.8-0.9 (a plain 4 GiB copy
# measured 90.6% of an H100 NVL's datasheet figure in one public probe; torch's unfused kernels reach less).
E_MEMORY = 0.85
# Seconds a kernel takes at least: one op issued from eager PyTorch costs about 5-20 us of host time (4.2 us for
# an op from Python in the same probe; 5-20 us per cudaLaunchKernel commonly quoted). The fit's default constant.
LAUNCH_S = 8e-6
# Seconds of host time an op issued by the model's Python code takes at least: the forward, the loss, and a
# checkpointed layer's rerun (the same Python forward, called again from the backward's unpack hook). Those ops go
# through nn.Module calls, transformers' Python and autograd's recording before their launch, where the backward's
# own ops are issued by autograd's C++ engine (LAUNCH_S). Source: this project's H200 run (docs/gpu-results.md,
# section 6, `ckptlab run` qwen3-0.6b, 4096 tokens, bf16, checkpointing off): the forward with the loss measured
# 41 ms against 27.3 ms on the roofline with LAUNCH_S; the floor that makes its 1,538 counted ops take 41 ms is
# 19.2 us (`python benchmarks/fit_roofline.py --fit host` derives it). Fitted on that off forward's time, not on a
# factor: the H200 factors of every_n_layers 2, 4 and 1 (section 3) stay the check (docs/time.md).
PYTHON_OP_S = 19.2e-6
# The phases whose ops the model's Python issues (PYTHON_OP_S); every other phase's ops have the LAUNCH_S floor.
PYTHON_PHASES = frozenset({"forward", "loss", "rerun"})
# Share of a link's one-direction bandwidth a copy reaches: first values, about 80% as commonly reported for
# pinned host copies over PCIe (CUDA samples' bandwidthTest) and for NCCL's ring collectives over NVLink.
E_HOST_LINK = 0.80
E_GPU_LINK = 0.80
# The CPU's own figures are measured (explore/machine.py), so they need no efficiency, and so are its host times per
# op (machine.host_op_seconds); a record measured before those were pays PyTorch's eager dispatch, about 5 us an op.
CPU_DISPATCH_S = 5e-6

# Ops that launch no kernel: torch's own list of view ops (its runtime estimator skips them too) and prim's
# metadata queries (``prim.device``: the fake step asks it about three times per op that runs a kernel); free.
VIEW_OPS = frozenset(str(packet) for packet in _runtime_estimation._VIEW_OPS)

PREDICTED_KIND: Kind = "predicted-roofline"  # the provenance kind every TimePrediction carries
Float32Matmul = Literal["tf32", "float32"]


@dataclass(frozen=True)
class Efficiency:
    """How far below a device's figures a real step runs: shares of the peak and the floor of one kernel."""

    compute: float = E_COMPUTE
    memory: float = E_MEMORY
    launch_s: float = LAUNCH_S
    python_op_s: float = PYTHON_OP_S  # the floor of an op the model's Python issues (PYTHON_PHASES)
    # A rerun op's: its Python forward again, and the checkpoint's hooks where measured (a CPU); None: python_op_s's.
    rerun_op_s: float | None = None
    host_link: float = E_HOST_LINK
    gpu_link: float = E_GPU_LINK
    # True where the host's time adds to an op's arithmetic (a CPU runs both in turn); False where it is a floor (a
    # GPU's launches are asynchronous: the host queues the next kernel while this one runs).
    host_adds: bool = False


GPU_EFFICIENCY = Efficiency()


class Speed(Protocol):
    """What the roofline reads of a device: :class:`~ckptlab.explore.gpus.GpuSpec`'s speed fields (a CPU's
    measured record plugs in with the same fields)."""

    @property
    def name(self) -> str: ...

    @property
    def dense_flops(self) -> Mapping[str, float]: ...

    @property
    def memory_bandwidth(self) -> float: ...


@runtime_checkable
class Linked(Protocol):
    """A device with links: offload's copies need a host link, FSDP2's collectives a GPU link."""

    @property
    def host_link(self) -> Link: ...

    @property
    def gpu_link(self) -> Link: ...


class MeasuredCpu(Protocol):
    """The CPU's measured speed as explore/machine.py records it: matmul FLOP/s per dtype and bandwidth."""

    @property
    def matmul_flops(self) -> Mapping[str, float]: ...

    @property
    def memory_bandwidth(self) -> float | None: ...

    @property
    def host_op_s(self) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class SpeedRecord:
    """A device's speed without memory or links: the CPU's, as :class:`Speed` reads it."""

    name: str
    dense_flops: Mapping[str, float]
    memory_bandwidth: float


def cpu_speed(cpu: MeasuredCpu, name: str) -> SpeedRecord:
    """This machine's measured speed (``explore.machine``'s record) as the roofline reads a GPU's.

    Raises:
        SpecError: the record has no measured memory bandwidth (the roofline needs it for every op).
    """
    if cpu.memory_bandwidth is None or cpu.memory_bandwidth <= 0:
        raise SpecError(key="roofline.no_bandwidth", device=name)
    return SpeedRecord(name=name, dense_flops=dict(cpu.matmul_flops), memory_bandwidth=cpu.memory_bandwidth)


def measured_efficiency(cpu: MeasuredCpu) -> Efficiency:
    """How a step runs on this CPU: at its measured figures (no share below them), each op's host time added to its
    arithmetic, the host times by phase as ``explore.machine`` measured them (a forward op, a backward op, a rerun
    op with the checkpoint's own cost); :data:`CPU_DISPATCH_S` for a phase a record lacks."""
    host = cpu.host_op_s
    forward = host.get("forward", CPU_DISPATCH_S)
    return Efficiency(
        compute=1.0,
        memory=1.0,
        launch_s=host.get("backward", CPU_DISPATCH_S),
        python_op_s=forward,
        rerun_op_s=host.get("rerun", forward),
        host_link=1.0,
        gpu_link=1.0,
        host_adds=True,
    )


def float32_matmul() -> Float32Matmul:
    """What a float32 matmul runs as under torch's current setting: "tf32" at precision "high" or "medium"."""
    return "float32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_flops(speed: Speed, dtype: str, f32: Float32Matmul = "float32") -> float:
    """The dense peak a matmul in ``dtype`` runs at on ``speed``: float32 as TF32 where ``f32`` says so and the
    device has TF32; a dtype the record lacks (float64, 8-bit) at float32's, the slowest it knows."""
    flops = speed.dense_flops
    if dtype == "float32" and f32 == "tf32" and "tf32" in flops:
        return flops["tf32"]
    return flops.get(dtype, flops["float32"])


def launches_kernel(op: str) -> bool:
    """Whether an op (its aten name, e.g. "aten.view.default") runs a kernel: not a view, not a prim query."""
    return not op.startswith("prim.") and op.rsplit(".", 1)[0] not in VIEW_OPS


def op_seconds(
    cost: OpCost,
    speed: Speed,
    efficiency: Efficiency = GPU_EFFICIENCY,
    f32: Float32Matmul = "float32",
    floor: float | None = None,
) -> float:
    """One op's time: the slower of its compute and its memory traffic, with the host's time ``floor`` (one launch,
    ``efficiency.launch_s``, unless said) as its least (a GPU) or added to it (a CPU, ``efficiency.host_adds``);
    nothing for an op that launches no kernel (a view, a metadata query)."""
    if not launches_kernel(cost.op):
        return 0.0
    compute = cost.flops / (peak_flops(speed, cost.dtype, f32) * efficiency.compute) if cost.flops else 0.0
    memory = cost.bytes / (speed.memory_bandwidth * efficiency.memory)
    host = efficiency.launch_s if floor is None else floor
    return host + max(compute, memory) if efficiency.host_adds else max(compute, memory, host)


def host_floor(phase: str, efficiency: Efficiency = GPU_EFFICIENCY) -> float:
    """The host's time for an op of ``phase``: a rerun op's, the Python-issued one in the forward and the loss
    (:data:`PYTHON_PHASES`), one launch elsewhere."""
    if phase == "rerun" and efficiency.rerun_op_s is not None:
        return efficiency.rerun_op_s
    return efficiency.python_op_s if phase in PYTHON_PHASES else efficiency.launch_s


def copied_bytes(cost: OpCost) -> float:
    """Bytes an offload copy moves over the host link: a copy's ``bytes`` count its read and its write (the
    record's rule: inputs plus outputs), and one of them crosses the link."""
    return cost.bytes / 2


def ring_bytes(cost: OpCost, world_size: int) -> float:
    """Bytes one rank sends in a ring collective of ``world_size`` ranks.

    The record counts a collective's unsharded buffer (``step/opcount``: the larger of what it reads and writes: an
    all-gather's output, a reduce-scatter's input, an all-reduce's tensor). A ring all-gather or reduce-scatter sends
    (w-1)/w of it per rank; a ring all-reduce is a reduce-scatter then an all-gather, 2(w-1)/w.
    """
    if world_size <= 1:
        return 0.0
    w = world_size
    share = cost.bytes * (w - 1) / w
    return 2 * share if "all_reduce" in cost.op else share


def item_seconds(
    item: WorkItem,
    speed: Speed,
    *,
    world_size: int = 1,
    efficiency: Efficiency = GPU_EFFICIENCY,
    f32: Float32Matmul = "float32",
) -> float:
    """The time of ``item.count`` ops of one cost: over the host link (offload), the GPU link (collective), or
    the roofline (every other phase).

    Raises:
        SpecError: an offload or collective item on a device without links (the CPU).
    """
    if item.phase in ("offload", "collective"):
        if not isinstance(speed, Linked):
            raise SpecError(key="roofline.no_link", device=speed.name, phase=item.phase)
        if item.phase == "offload":
            moved, rate = copied_bytes(item.cost), speed.host_link.bytes_per_s * efficiency.host_link
        else:
            moved, rate = ring_bytes(item.cost, world_size), speed.gpu_link.bytes_per_s * efficiency.gpu_link
        return max(moved / rate, efficiency.launch_s) * item.count
    return op_seconds(item.cost, speed, efficiency, f32, host_floor(item.phase, efficiency)) * item.count


@dataclass(frozen=True)
class TimePrediction:
    """One step's predicted time on one device, from the step's counted work; never a measurement.

    ``by_phase`` sums to ``seconds`` (its "collective" entry is what FSDP2's prefetch could not hide);
    ``by_layer`` is each decoder layer's time, ``outside_layers_s`` the rest (embeddings, head, loss, optimizer).
    MFU follows PaLM's appendix B (Chowdhery et al. 2022, arXiv 2204.02311): the model's FLOPs *without* the
    rerun (a rematerialization is not model work) over the dense peak x the time; here the model's FLOPs are the
    step's counted ones, attention included as PaLM includes it, not the 6 x N x tokens estimate. HFU counts
    the rerun too.
    """

    device: str  # the device's name, e.g. "H100 80 GB"
    seconds: float
    by_phase: dict[str, float]  # every phase of step.work.PHASES, in that order
    by_layer: tuple[float, ...]  # decoder layer i's seconds at [i]
    outside_layers_s: float
    tokens: int  # tokens the step trains on (seq_len x batch x accumulation), per rank
    model_flops: int  # the step's FLOPs without the rerun
    hardware_flops: int  # with it
    peak_flops: float  # the dense peak MFU is over: the dtype that holds most of the step's FLOPs
    peak_dtype: str
    provenance: Provenance  # kind "predicted-roofline", the device's name

    @property
    def rerun_s(self) -> float:
        """Seconds the checkpointed layers' reruns take."""
        return self.by_phase["rerun"]

    @property
    def rerun_share(self) -> float:
        """The rerun's share of the step."""
        return self.rerun_s / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization (PaLM, appendix B): model FLOPs over the dense peak x the step's time."""
        return self.model_flops / (self.peak_flops * self.seconds) if self.seconds else 0.0

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization: the rerun's FLOPs counted too."""
        return self.hardware_flops / (self.peak_flops * self.seconds) if self.seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The prediction as JSON: seconds and counts, the derived shares beside them."""
        data = asdict(self)
        data["by_layer"] = list(self.by_layer)
        data.update(
            rerun_s=self.rerun_s,
            rerun_share=self.rerun_share,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu,
            hfu=self.hfu,
            mfu_convention="PaLM appendix B: model FLOPs without the rerun / (dense peak x time)",
        )
        return data


def predict_time(
    work: StepWork,
    speed: Speed,
    *,
    tokens: int,
    world_size: int = 1,
    efficiency: Efficiency = GPU_EFFICIENCY,
    f32: Float32Matmul | None = None,
) -> TimePrediction:
    """The step's time on ``speed`` from its counted ``work`` (the module's docstring has the model).

    Args:
        work: every op of the step, by phase and layer.
        speed: the device: a :class:`~ckptlab.explore.gpus.GpuSpec`, or :func:`cpu_speed` of this machine.
        tokens: tokens one step trains on (per rank under FSDP2), for tokens/s.
        world_size: ranks, for the ring collectives' share of the bytes.
        efficiency: :data:`GPU_EFFICIENCY` for a datasheet's figures, :func:`measured_efficiency` for this CPU's.
        f32: how float32 matmuls run; None reads torch's setting (:func:`float32_matmul`).
    """
    f32 = float32_matmul() if f32 is None else f32
    compute: dict[int | None, float] = defaultdict(float)
    collective: dict[int | None, float] = defaultdict(float)
    by_phase = dict.fromkeys(PHASES, 0.0)
    flops_by_dtype: dict[str, int] = defaultdict(int)
    for item in work.items:
        seconds = item_seconds(item, speed, world_size=world_size, efficiency=efficiency, f32=f32)
        if item.phase == "collective":
            collective[item.layer] += seconds
        else:
            compute[item.layer] += seconds
            by_phase[item.phase] += seconds
        if item.phase != "rerun":
            flops_by_dtype[item.cost.dtype] += item.cost.flops * item.count
    per_layer: dict[int | None, float] = {}
    for layer in compute.keys() | collective.keys():
        # FSDP2 prefetches: a layer's collectives run beside its compute, and only what is longer shows.
        per_layer[layer] = max(compute[layer], collective[layer])
        by_phase["collective"] += max(0.0, collective[layer] - compute[layer])
    layers = [layer for layer in per_layer if layer is not None]
    by_layer = tuple(per_layer.get(i, 0.0) for i in range(max(layers) + 1)) if layers else ()
    dtype = max(flops_by_dtype, key=lambda d: flops_by_dtype[d]) if flops_by_dtype else "float32"
    peak_dtype = "tf32" if dtype == "float32" and f32 == "tf32" and "tf32" in speed.dense_flops else dtype
    return TimePrediction(
        device=speed.name,
        seconds=sum(per_layer.values()),
        by_phase=by_phase,
        by_layer=by_layer,
        outside_layers_s=per_layer.get(None, 0.0),
        tokens=tokens,
        model_flops=work.flops() - work.flops("rerun"),
        hardware_flops=work.flops(),
        peak_flops=peak_flops(speed, dtype, f32),
        peak_dtype=peak_dtype,
        provenance=made_now(PREDICTED_KIND, speed.name),
    )


# --- The faces' plumbing: several simulated settings of one model on one device.


def step_work(result: RunResult) -> StepWork | None:
    """The counted work a simulated result carries; None where it has none (a measured run, or a simulation
    from before the counting: issue 59's first item adds ``RunResult.work``)."""
    work = getattr(result, "work", None)
    return work if isinstance(work, StepWork) else None


def result_tokens(result: RunResult) -> int:
    """Tokens one step of ``result`` trains on, per rank: a sequence x the batch x the accumulated micro-batches."""
    spec = result.spec
    return spec.seq_len * spec.batch_size * spec.gradient_accumulation_steps


def predict_result(
    result: RunResult, speed: Speed, *, efficiency: Efficiency = GPU_EFFICIENCY
) -> TimePrediction | None:
    """A simulated result's predicted time on ``speed``; None where the result carries no counted work."""
    work = step_work(result)
    if work is None:
        return None
    return predict_time(
        work, speed, tokens=result_tokens(result), world_size=result.spec.world_size, efficiency=efficiency
    )


@dataclass(frozen=True)
class SettingTime:
    """One setting's predicted time and its factor over checkpointing off (None where either has no work)."""

    setting: Setting
    prediction: TimePrediction | None  # None: the result carries no counted work
    factor_over_off: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting.key,
            "predicted": None if self.prediction is None else self.prediction.to_dict(),
            "factor_over_off": self.factor_over_off,
        }


def setting_times(
    results: Sequence[RunResult], speed: Speed, *, efficiency: Efficiency = GPU_EFFICIENCY
) -> list[SettingTime]:
    """Each simulated setting's predicted time on ``speed`` and its factor over the off setting among ``results``."""
    from ..spec import Setting

    return over_off(
        [(Setting.of(result.spec), predict_result(result, speed, efficiency=efficiency)) for result in results]
    )


def over_off(predictions: Sequence[tuple[Setting, TimePrediction | None]]) -> list[SettingTime]:
    """Each setting's factor over the off setting's predicted time (off itself: 1.0; no off with a prediction among
    them, or none for the setting: None)."""
    off = next((p for setting, p in predictions if setting.every_n_layers is None and p is not None), None)
    return [
        SettingTime(setting, p, None if p is None or off is None or not off.seconds else p.seconds / off.seconds)
        for setting, p in predictions
    ]


# --- Why the rerun costs more or less than the textbook's one extra forward (the lesson's part on time).

# The textbook's step: a backward costs two forwards (the 2N + 4N FLOPs a token of Kaplan et al. 2020's 6N), and
# checkpointing every layer adds "one extra forward" (Chen et al. 2016): three forwards' time becomes four, x4/3.
TEXTBOOK_FACTOR = 4 / 3


def is_attention(op: str) -> bool:
    """Whether an op is a fused attention kernel (SDPA's flash, memory-efficient or CPU flash path, cuDNN's)."""
    return "attention" in op


@dataclass(frozen=True)
class RerunAnatomy:
    """Where checkpointing every layer's time goes, against the textbook's one extra forward, on one device.

    From two predictions of the same step: checkpointing off and every_n_layers=1. ``head_s`` is what the forward
    runs outside the decoder layers plus the loss (embeddings, final norm, lm head, the float32 loss): the rerun never
    runs it. ``attention_s`` is the rerun's time in the attention kernel, which grows with the square of the
    sequence while the rest grows with it. ``launch_bound_s`` is the step's time in ops at the launch floor: a small
    model's kernels are shorter than a launch, so its time follows the op count, not the FLOPs.
    """

    off: TimePrediction
    every_layer: TimePrediction
    head_s: float  # off's forward outside the layers plus its loss phase: never rerun
    attention_s: float  # every_n_layers=1's rerun time in attention kernels
    launch_bound_s: float  # off's step time in ops that cost one launch (their work is shorter)

    @property
    def forward_s(self) -> float:
        """Off's whole forward, the loss included: the textbook's "one forward"."""
        return self.off.by_phase["forward"] + self.off.by_phase["loss"]

    @property
    def factor(self) -> float:
        """every_n_layers=1's predicted step over off's."""
        return self.every_layer.seconds / self.off.seconds if self.off.seconds else 0.0

    @property
    def rerun_of_forward(self) -> float:
        """The rerun's time over the forward's: below 1 by the head and the loss, never rerun."""
        return self.every_layer.rerun_s / self.forward_s if self.forward_s else 0.0

    @property
    def head_share(self) -> float:
        """The head's and the loss's share of the forward."""
        return self.head_s / self.forward_s if self.forward_s else 0.0

    @property
    def skipped_share(self) -> float:
        """The share of the forward that is in the layers yet not rerun: torch's non-reentrant checkpoint stops its
        recompute once every tensor the backward saved is back, so a layer's last matmul (the MLP's down projection,
        whose output nothing saves) is not run again (docs/simulation.md)."""
        return max(0.0, 1.0 - self.rerun_of_forward - self.head_share)

    @property
    def attention_share(self) -> float:
        """The attention kernels' share of the rerun."""
        return self.attention_s / self.every_layer.rerun_s if self.every_layer.rerun_s else 0.0

    @property
    def launch_share(self) -> float:
        """The share of off's step spent in ops bound by the launch floor."""
        return self.launch_bound_s / self.off.seconds if self.off.seconds else 0.0


def rerun_anatomy(
    off: StepWork,
    every_layer: StepWork,
    speed: Speed,
    *,
    tokens: int,
    efficiency: Efficiency = GPU_EFFICIENCY,
    f32: Float32Matmul = "float32",
) -> RerunAnatomy:
    """The :class:`RerunAnatomy` of a step's counted work with checkpointing off and every_n_layers=1 on ``speed``."""

    def seconds(items: Sequence[WorkItem]) -> float:
        return sum(item_seconds(item, speed, efficiency=efficiency, f32=f32) for item in items)

    head = [item for item in off.items if item.phase == "loss" or (item.phase == "forward" and item.layer is None)]
    attention = [item for item in every_layer.items if item.phase == "rerun" and is_attention(item.cost.op)]
    launch_bound = [
        item
        for item in off.items
        if item.phase not in ("offload", "collective")
        and launches_kernel(item.cost.op)
        and op_seconds(item.cost, speed, efficiency, f32) == efficiency.launch_s
    ]
    return RerunAnatomy(
        off=predict_time(off, speed, tokens=tokens, efficiency=efficiency, f32=f32),
        every_layer=predict_time(every_layer, speed, tokens=tokens, efficiency=efficiency, f32=f32),
        head_s=seconds(head),
        attention_s=seconds(attention),
        launch_bound_s=seconds(launch_bound),
    )
