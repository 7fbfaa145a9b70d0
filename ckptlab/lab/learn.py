"""The Learn pages' measurements: sets of runs through the lab's device queue, one shared model.

Each figure on the Timeline, Lesson and Exercises pages comes from a real run. They ask for
several settings at once (checkpointing off, every_n_layers=1, 2, ...), measured once for the
whole server by :mod:`ckptlab.lab.learnruns` through :func:`ckptlab.lab.run.run_queued`: one
measured run on the device at a time across every session.

The model is kept in one slot (:func:`shared_model`): the settings of a lesson differ only
in checkpointing, so one tiny model serves them all, and no second model stays alive to
count in another session's baseline on a GPU.

One idea is simulated, not measured: "sharding divides parameters, gradients and optimizer
state; checkpointing divides activations" needs several GPUs, so :func:`sharding_idea` runs
FSDP2 on a fake process group (``ckptlab.simulate``) at 1, 2 and 4 GPUs, checkpointing off and on. So is
"4 bits shrink the weights, not the activations" (:func:`qlora_idea`): a simulated CUDA GPU's step of a tiny
preset with LoRA over a 16-bit base beside a 4-bit one, checkpointing off and on. And "the rerun is not the
textbook's one extra forward" (:func:`rerun_idea`): two model sizes at two lengths simulated, their steps' time
predicted on a GPU by the roofline over the operations they ran.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from transformers import PreTrainedModel

from ..alloc_conf import EXPANDABLE
from ..explore.device import SegmentsOverTime, segments_over_time
from ..explore.gpus import GPU_SPECS
from ..explore.roofline import RerunAnatomy, rerun_anatomy, result_tokens, step_work
from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.quantize import QLORA
from ..results import RunResult, memory_of
from ..spec import RunSpec
from ..step.simulate import simulate
from ..step.stopping import Progress
from . import exercises
from .run import ModelKey, build_for_key, reference_spec
from .store import ResultStore, json_bytes, simulated
from .workers import WorkerPool

_lock = threading.Lock()
_slot: dict[ModelKey, tuple[PreTrainedModel, ModelInfo]] = {}

LEARN_SEQ_LENS = (64, 128, 256, 512)  # short enough for ~1 s runs of a tiny preset on 2 CPU cores


def shared_model(key: ModelKey) -> tuple[PreTrainedModel, ModelInfo]:
    """The built model for ``key``, kept until another key is asked for (one model alive at a time)."""
    with _lock:
        if key not in _slot:
            _slot.clear()  # drop the previous model before building the next: one at a time
            _slot[key] = build_for_key(key)
        return _slot[key]


# -- the lesson's parts: what each one draws, the one list the page asks for and the warm-up measures -------------

LESSON_BASE = exercises.QUICK  # tiny-llama, 128 tokens, 3 timed steps: the lesson and the exercises share its runs
LESSON_LONG = exercises.LONG  # 512 tokens, memory only: where the peak moves
# The parts up to "peak" teach activations alone (optimizer "none", from exercises). "shrink" takes the whole step:
# AdamW, full fine-tune and LoRA, at 512 tokens, where the activations weigh enough for the backward to hold the peak.
LESSON_FULL = replace(LESSON_LONG, optimizer="adamw")
LESSON_LORA = replace(LESSON_FULL, lora_rank=8)
STEP_SETTINGS = (None, 1, 2, 3)  # the step-through's settings (None: checkpointing off)


def lesson_at(n: int | None, spec: RunSpec = LESSON_BASE) -> RunSpec:
    """``spec`` with every_n_layers ``n`` (None: checkpointing off, measured as the reference of ``spec``)."""
    return reference_spec(spec) if n is None else replace(spec, every_n_layers=n)


def _eager(spec: RunSpec) -> RunSpec:
    return replace(spec, attn_implementation="eager")


@dataclass(frozen=True)
class LessonPart:
    """One part of the Lesson page: the runs its figures draw, or the simulated idea it shows."""

    name: str  # locale keys live under lesson.<name>.*
    runs: tuple[RunSpec, ...] = ()  # measured, in the order the page draws them
    idea: str | None = None  # simulated instead: "sharding" (sharding_idea), "qlora" (qlora_idea), "rerun" (rerun_idea)

    def asks(self) -> list[RunSpec]:
        """What the shared runs measure for this part (:mod:`ckptlab.lab.learnruns`): each run, a checkpointing-off one
        as the reference of the same run with every_n_layers=1, which ``run_queued`` measures with it (so the off
        and n=1 runs of one shape are one ask, shared with the parts and exercises that draw either)."""
        return list(
            dict.fromkeys(spec if spec.checkpointing else replace(spec, every_n_layers=1) for spec in self.runs)
        )


LESSON_PARTS: tuple[LessonPart, ...] = (
    LessonPart("activation", (lesson_at(None),)),
    LessonPart("trade", (lesson_at(None), lesson_at(1))),
    LessonPart("every_n", tuple(lesson_at(n) for n in (None, 1, 2, 3))),
    LessonPart("keep", (lesson_at(None), lesson_at(1), replace(lesson_at(1), selective="attention"))),
    # eager against SDPA, checkpointing off, at two lengths: the s^2 the fused kernels recompute
    LessonPart(
        "attention",
        tuple(run for s in (LESSON_BASE, LESSON_LONG) for run in (lesson_at(None, s), lesson_at(None, _eager(s)))),
    ),
    LessonPart("offload", (lesson_at(1), lesson_at(1, replace(LESSON_LONG, seq_len=256)), lesson_at(1, LESSON_LONG))),
    LessonPart("peak", (lesson_at(None), lesson_at(1), lesson_at(None, LESSON_LONG), lesson_at(1, LESSON_LONG))),
    LessonPart(
        "shrink",
        (
            lesson_at(None, LESSON_FULL),
            lesson_at(1, LESSON_FULL),
            lesson_at(None, LESSON_LORA),
            lesson_at(1, LESSON_LORA),
        ),
    ),
    LessonPart("qlora", idea="qlora"),
    LessonPart("shard", idea="sharding"),
    LessonPart("allocator", idea="allocator"),
    LessonPart("rerun", idea="rerun"),  # the rerun's cost against the textbook's: predicted over simulated steps
    LessonPart("step", tuple(lesson_at(n) for n in STEP_SETTINGS)),
)


def lesson_part(name: str) -> LessonPart:
    """The part called ``name`` (one of :data:`LESSON_PARTS`)."""
    return next(part for part in LESSON_PARTS if part.name == name)


def cpu_presets() -> list[str]:
    """The presets a CPU runs in seconds (the tiny ones), in the catalog's order."""
    return [preset.name for preset in catalog.list_presets() if preset.cpu_ok]


# -- the lesson's sharding idea: simulated, not measured --------------------------------------

SHARDING = RunSpec(
    model="qwen3-0.6b", seq_len=1024, batch_size=1, dtype="bfloat16", optimizer="adamw", repeats=1, warmup=0
)
SHARDING_GPUS = (1, 2, 4)  # world sizes; past one, FSDP2 on a fake process group (rank 0's memory)
SHARDING_PARTS = ("parameter", "gradient", "optimizer_state", "activation")  # what the lesson's figure draws


@dataclass(frozen=True)
class ShardingBar:
    """One GPU of one configuration: how many GPUs, which checkpointing, and its memory by part."""

    spec: RunSpec  # world_size and every_n_layers say which configuration
    parts: dict[str, int]  # SHARDING_PARTS -> bytes on one GPU (see per_gpu_parts)
    result: RunResult


@dataclass(frozen=True)
class ShardingIdea:
    """ "Sharding divides parameters, gradients and optimizer state; checkpointing divides activations", in numbers."""

    bars: list[ShardingBar]  # for each GPU count, checkpointing off then every_n_layers=1
    state_ratio: float  # parameters + gradients + optimizer state on one GPU at the most GPUs, over one GPU's (off)
    activation_ratio_gpus: float  # activations on one GPU at the most GPUs over one GPU's (off): sharding leaves them
    activation_ratio_checkpointing: float  # activations with every_n_layers=1 over off, on one GPU
    gathered_bytes: int  # parameters beyond the shard at the most GPUs: the layer at work and the root, gathered

    def bar(self, gpus: int, every_n_layers: int | None) -> ShardingBar:
        return next(b for b in self.bars if (b.spec.world_size, b.spec.every_n_layers) == (gpus, every_n_layers))


def per_gpu_parts(result: RunResult) -> dict[str, int]:
    """One GPU's memory by part, each taken where it says the most about the idea.

    Parameters: the shard held between steps (before the forward; FSDP gathers the layer at work on
    top, see :attr:`ShardingIdea.gathered_bytes`). Optimizer state: its steady state. Gradients and
    activations: the most the step held at any moment (activations peak at the end of the forward,
    gradients in the backward).
    """
    memory = memory_of(result)
    most: dict[str, int] = {}
    for point in memory.timeline:
        for part, value in point.region_peak_breakdown.items():
            most[part] = max(most.get(part, 0), value)
    baseline = memory.breakdown_baseline
    return {
        "parameter": baseline.get("parameter", 0) + baseline.get("buffer", 0),
        "gradient": most.get("gradient", 0),
        "optimizer_state": memory.optimizer_state_bytes,
        "activation": most.get("activation", 0) + most.get("activation_and_temp", 0),
    }


def sharding_specs(base: RunSpec = SHARDING, gpus: Sequence[int] = SHARDING_GPUS) -> list[RunSpec]:
    """For each GPU count, checkpointing off then every_n_layers=1 (FSDP2 past one GPU)."""
    return [
        replace(base, world_size=count, fsdp=count > 1, every_n_layers=n, offload=False)
        for count in gpus
        for n in (None, 1)
    ]


def sharding_idea(
    base: RunSpec = SHARDING,
    gpus: Sequence[int] = SHARDING_GPUS,
    progress: Progress | None = None,
    workers: WorkerPool | None = None,
) -> ShardingIdea:
    """Simulate :func:`sharding_specs` (or reuse them: kept for the process) and put the idea in numbers.

    ``workers``: simulate in this pool's worker process (the app's simulation pool), not in this thread.

    Raises:
        SpecError, ModelLoadError: a bad ``base``.
    """
    specs = sharding_specs(base, gpus)
    results = simulated(specs, progress, workers)
    bars = [ShardingBar(spec, per_gpu_parts(results[spec]), results[spec]) for spec in specs]
    by_config = {(b.spec.world_size, b.spec.every_n_layers): b for b in bars}
    off_one, off_most, on_one = by_config[min(gpus), None], by_config[max(gpus), None], by_config[min(gpus), 1]
    state = ("parameter", "gradient", "optimizer_state")
    held = max((breakdown.get("parameter", 0) for breakdown in _most_parts(off_most.result)), default=0)
    return ShardingIdea(
        bars=bars,
        state_ratio=sum(off_most.parts[p] for p in state) / sum(off_one.parts[p] for p in state),
        activation_ratio_gpus=off_most.parts["activation"] / off_one.parts["activation"],
        activation_ratio_checkpointing=on_one.parts["activation"] / off_one.parts["activation"],
        gathered_bytes=max(held - off_most.parts["parameter"], 0),
    )


def _most_parts(result: RunResult) -> list[dict[str, int]]:
    return [point.region_peak_breakdown for point in memory_of(result).timeline]


# -- the lesson's 4-bit idea: simulated, not measured -----------------------------------------

# tiny-llama, LoRA rank 8 with AdamW, 512 tokens, bfloat16 on a simulated CUDA GPU (where QLoRA runs).
QLORA_LESSON = RunSpec(
    model="tiny-llama", seq_len=512, batch_size=1, dtype="bfloat16", optimizer="adamw", lora_rank=8, repeats=1, warmup=0
)


@dataclass(frozen=True)
class QloraIdea:
    """ "4 bits shrink the weights; the activations, the logits and the adapters' state stay; checkpointing buys the
    sequence", in simulated numbers: LoRA over a 16-bit base, then over a 4-bit one, each checkpointing off and on."""

    bars: list[ShardingBar]  # 16-bit off, 16-bit every_n_layers=1, 4-bit off, 4-bit every_n_layers=1 (per_gpu_parts)
    logits_bytes: int  # the float32 logits alive at the 4-bit step's peak, checkpointing off (transformers' loss)

    def bar(self, quantized: bool, every_n_layers: int | None) -> ShardingBar:
        return next(
            b
            for b in self.bars
            if (b.spec.quantization is not None, b.spec.every_n_layers) == (quantized, every_n_layers)
        )


def qlora_specs(base: RunSpec = QLORA_LESSON) -> list[RunSpec]:
    """LoRA over the base in ``base.dtype``, then over QLoRA's 4-bit base; each checkpointing off, then every layer."""
    return [replace(base, quantization=q, every_n_layers=n) for q in (None, QLORA) for n in (None, 1)]


def qlora_idea(
    base: RunSpec = QLORA_LESSON, progress: Progress | None = None, workers: WorkerPool | None = None
) -> QloraIdea:
    """Simulate :func:`qlora_specs` (or reuse them: kept for the process) and put the idea in numbers.

    Raises:
        SpecError, ModelLoadError: a bad ``base`` (bitsandbytes missing among them: its pip line).
    """
    specs = qlora_specs(base)
    results = simulated(specs, progress, workers)
    bars = [ShardingBar(spec, per_gpu_parts(results[spec]), results[spec]) for spec in specs]
    logits = memory_of(results[specs[2]]).logits_bytes_at_peak or 0
    return QloraIdea(bars=bars, logits_bytes=logits)


# -- the lesson's allocator idea: simulated, then the caching allocator replayed -----------------

# tiny-llama, AdamW, 2,048 tokens, bfloat16 on a simulated CUDA GPU, every layer checkpointed: the step whose order of
# allocations the caching allocator is replayed over, with torch's defaults and with expandable segments.
ALLOCATOR_LESSON = RunSpec(
    model="tiny-llama", seq_len=2048, batch_size=1, dtype="bfloat16", optimizer="adamw", repeats=1, warmup=0
)


@dataclass(frozen=True)
class AllocatorIdea:
    """ "nvidia-smi shows more than your tensors": one simulated step's allocated bytes inside its reserved bytes
    (the caching allocator replayed), with torch's defaults and with ``expandable_segments:True``."""

    result: RunResult  # the simulated step, with its order of allocations
    default: SegmentsOverTime  # replayed under torch's defaults
    expandable: SegmentsOverTime  # replayed with expandable_segments:True


def allocator_idea(
    base: RunSpec = ALLOCATOR_LESSON, progress: Progress | None = None, workers: WorkerPool | None = None
) -> AllocatorIdea:
    """Simulate ``base`` with its order of allocations (or reuse it: kept for the process) and replay the caching
    allocator over it twice: torch's defaults and expandable segments.

    Raises:
        SpecError, ModelLoadError: a bad ``base``.
    """
    result = _recorded.get(base)
    if result is None:
        report = progress or (lambda message, fraction: None)
        if workers is None:
            result = simulate(base, progress=report, allocations=True)
        else:
            result = workers.run("ckptlab.lab.workerjobs:simulate_allocations", base, progress=report)
        result = _recorded.put(base, result)
    return AllocatorIdea(result, segments_over_time(result, ""), segments_over_time(result, EXPANDABLE))


# The allocator idea's step, with its order of allocations: kept for the process in a bounded store of its own (the
# shared SIMULATIONS' results carry no order).
_recorded: ResultStore[RunSpec, RunResult] = ResultStore(json_bytes)

# -- the lesson's time idea: simulated steps, their time predicted by the roofline -------------------------------

# Two model sizes at two lengths, forward and backward alone (no optimizer: the rerun's cost against the step that
# reruns, as this project's H200 row), bfloat16 on the GPU most people decide for. A small model at a short length is
# bound by launches; the attention's share of the rerun grows with the length.
RERUN_MODELS = ("qwen3-0.6b", "qwen3-8b")
RERUN_LENGTHS = (1024, 8192)
RERUN_GPU = "H100 80 GB"
RERUN_LESSON = RunSpec(
    model=RERUN_MODELS[0], seq_len=RERUN_LENGTHS[0], batch_size=1, dtype="bfloat16", optimizer="none", repeats=1,
    warmup=0,
)  # fmt: skip


@dataclass(frozen=True)
class RerunCase:
    """One model at one length: checkpointing off and every layer, their predicted times' anatomy."""

    model: str
    seq_len: int
    anatomy: RerunAnatomy


@dataclass(frozen=True)
class RerunIdea:
    """ "The rerun is not the textbook's one extra forward", in predicted numbers over simulated steps."""

    gpu: str  # the GPU whose speed the times are predicted on
    cases: list[RerunCase]  # RERUN_MODELS x RERUN_LENGTHS, in that order

    def case(self, model: str, seq_len: int) -> RerunCase:
        return next(case for case in self.cases if (case.model, case.seq_len) == (model, seq_len))


def rerun_specs(base: RunSpec = RERUN_LESSON) -> list[RunSpec]:
    """Each model at each length, checkpointing off then every layer (what the time part simulates)."""
    return [
        replace(base, model=model, seq_len=seq_len, every_n_layers=n)
        for model in RERUN_MODELS
        for seq_len in RERUN_LENGTHS
        for n in (None, 1)
    ]


def rerun_idea(
    base: RunSpec = RERUN_LESSON, progress: Progress | None = None, workers: WorkerPool | None = None
) -> RerunIdea:
    """Simulate :func:`rerun_specs` (or reuse them: kept for the process) and predict their time on
    :data:`RERUN_GPU` (:func:`ckptlab.explore.roofline.rerun_anatomy`)."""
    specs = rerun_specs(base)
    results = simulated(specs, progress, workers)
    speed = GPU_SPECS[RERUN_GPU]
    cases = []
    for off_spec, on_spec in zip(specs[::2], specs[1::2]):
        off, on = step_work(results[off_spec]), step_work(results[on_spec])
        assert off is not None and on is not None  # a simulation counts its work
        anatomy = rerun_anatomy(off, on, speed, tokens=result_tokens(results[off_spec]))
        cases.append(RerunCase(off_spec.model, off_spec.seq_len, anatomy))
    return RerunIdea(gpu=RERUN_GPU, cases=cases)
