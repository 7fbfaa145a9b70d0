"""At scale without the hardware: one model, many checkpointing settings, simulated as one computation.

:func:`scale_settings` picks which settings to simulate (every value of ``every_n_layers``
of an 8B model, each with and without offload, is minutes on a laptop, so by default the
distinct ones), :func:`scale_table` simulates them on fake tensors, one after another but
sharing what they have in common (:class:`ckptlab.step.table.TableSimulation`: each setting is
what :func:`ckptlab.simulate` gives, byte for byte), cancelable between settings (:class:`ckptlab.lab.scalejob.ScaleJob` runs that on a thread
so that a page stays responsive and a Stop keeps what was simulated).
Which settings fit a memory budget is :func:`least_recompute_that_fits`, asking the one rule
(:func:`ckptlab.explore.budget.fits`, importable from here as before); where the GPU's speed is known and the
simulations carry their counted work, :func:`fastest_that_fits` ranks the fitting settings by their predicted
step time instead (the roofline, :mod:`ckptlab.explore.roofline`).

Numbers are bytes; words and units belong to the front ends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..errors import SpecError, check_whole_number, not_one_of
from ..model import catalog
from ..model.catalog import ModelInfo
from ..model.quantize import Quantization
from ..model.selective import NONE, Selective, selective_key, validate_selective
from ..results import RunResult
from ..results.allocations import DeviceTotal
from ..spec import RunSpec, Setting
from ..step.preflight import validate_for_model
from ..step.selective import check_simulated_selective
from ..step.stopping import DONE, Cancel, Progress, label, prefixed, scaled, stopper
from ..step.table import TableSimulation
from .budget import fits
from .device import DeviceStep, expandable_beside, on_gpu
from .roofline import SettingTime, Speed, setting_times

EveryN = Literal["distinct", "all"]
OffloadFor = Literal["n=1", "all", "none"]
SIMULATION_DTYPES = ("bfloat16", "float16", "float32")  # "auto" would be bfloat16, as on a GPU


def every_n_choices(num_layers: int, every: EveryN = "distinct") -> list[int]:
    """The values of ``every_n_layers`` worth simulating for a model of ``num_layers`` layers.

    "distinct": the divisors of the layer count, and always 1, 2 and the layer count. With a
    divisor every checkpointed layer starts an equal stretch of n layers; between two
    divisors the number of checkpointed layers (and so the memory) changes little, and
    beyond the layer count nothing changes at all (only the first layer is checkpointed).
    "all": every value from 1 to the layer count.

    Raises:
        SpecError: ``num_layers`` < 1 or an unknown ``every``.
    """
    check_whole_number("num_layers", num_layers)  # a model to checkpoint has at least one layer
    if every == "all":
        return list(range(1, num_layers + 1))
    if every != "distinct":
        raise not_one_of("every", every, ("distinct", "all"))
    divisors = {n for n in range(1, num_layers + 1) if num_layers % n == 0}
    return sorted(divisors | {1, min(2, num_layers), num_layers})


def scale_settings(
    num_layers: int, every: EveryN = "distinct", offload: OffloadFor = "n=1", policies: Sequence[Selective] = ()
) -> list[Setting]:
    """Checkpointing off, then each chosen ``every_n_layers``, each followed by its selective policies and its
    offload twin where asked.

    Args:
        num_layers: the model's checkpointable layers.
        every: "distinct" (see :func:`every_n_choices`) or "all" values of every_n_layers.
        offload: "n=1" (offload only where it frees the most: every layer checkpointed),
            "all" (beside every n) or "none".
        policies: selective policies (``ckptlab.model.selective``) simulated beside plain checkpointing at
            each n ("none" is plain checkpointing, always there).

    Raises:
        SpecError: a bad ``num_layers``, ``every``, ``offload`` or policy.
    """
    if offload not in ("n=1", "all", "none"):
        raise not_one_of("offload", offload, ("n=1", "all", "none"))
    for policy in policies:
        validate_selective(policy)
    extra = [policy for policy in dict.fromkeys(policies) if policy != NONE]
    settings = [Setting(None)]
    for n in every_n_choices(num_layers, every):
        settings.append(Setting(n))
        settings += [Setting(n, selective=policy) for policy in extra]
        if offload == "all" or (offload == "n=1" and n == 1):
            settings.append(Setting(n, offload=True))
    return settings


@dataclass(frozen=True)
class ScaleRequest:
    """What to simulate: one model at one shape, several settings."""

    model: str  # preset name or local directory with config.json
    seq_len: int  # tokens per sequence
    batch_size: int  # sequences per step
    dtype: str  # one of SIMULATION_DTYPES
    settings: tuple[Setting, ...]  # in the order to simulate them
    optimizer: str = "adamw"  # as RunSpec.optimizer: its state is part of the simulated peak
    lora_rank: int | None = None  # as RunSpec.lora_rank: LoRA adapters on a frozen base; None: full fine-tune
    lora_targets: tuple[str, ...] | None = None  # as RunSpec.lora_targets; None: every projection
    world_size: int = 1  # GPUs; above 1 each is a rank of FSDP2 (fully_shard), and the figures are rank 0's
    gradient_accumulation_steps: int = 1  # as RunSpec: micro-batches a step, gradients alive across them
    max_grad_norm: float = 1.0  # as RunSpec: Trainer's clipping bound
    mixed_precision: str = "none"  # as RunSpec: "bf16"/"fp16" over float32 weights (FSDP2's policy past one GPU)
    attn_implementation: str = "sdpa"  # as RunSpec: the attention the model is built with
    quantization: Quantization | None = None  # as RunSpec: a 4-bit base (QLoRA; needs lora_rank, one GPU)
    alloc_conf: str = ""  # as RunSpec: PYTORCH_CUDA_ALLOC_CONF, which the device totals are replayed under

    @property
    def mixed_precision_via(self) -> str:
        """How the request's steps cast (``RunSpec.mixed_precision_via``): "none", "autocast" or "fsdp2"."""
        return self.spec(Setting(None)).mixed_precision_via

    def spec(self, setting: Setting, world_size: int | None = None) -> RunSpec:
        """The simulation's spec for one setting (timing fields are unused by a simulation).

        Args:
            setting: the checkpointing setting.
            world_size: GPUs, if not the request's own (the GPU search asks for other counts).
        """
        size = self.world_size if world_size is None else world_size
        return RunSpec(
            model=self.model,
            seq_len=self.seq_len,
            batch_size=self.batch_size,
            dtype=self.dtype,
            every_n_layers=setting.every_n_layers,
            offload=setting.offload,
            selective=setting.selective,
            repeats=1,
            warmup=0,
            optimizer=self.optimizer,
            lora_rank=self.lora_rank,
            lora_targets=self.lora_targets,
            world_size=size,
            fsdp=size > 1,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            max_grad_norm=self.max_grad_norm,
            mixed_precision=self.mixed_precision,
            attn_implementation=self.attn_implementation,
            quantization=self.quantization,
            alloc_conf=self.alloc_conf,
        )

    def check(self, info: ModelInfo | None = None) -> ModelInfo:
        """Validate everything a simulation would, without simulating.

        Args:
            info: the model's description when the caller has it (saves describing again).

        Returns:
            The model's :class:`ModelInfo`.

        Raises:
            SpecError, ModelLoadError: the first bad value, with its fix.
        """
        if self.dtype not in SIMULATION_DTYPES:
            raise not_one_of("dtype", self.dtype, SIMULATION_DTYPES)
        if not self.settings:
            raise SpecError(key="scale.no_settings")
        for setting in self.settings:
            self.spec(setting).validate()
            check_simulated_selective(self.spec(setting))
        info = info or catalog.describe(self.model)
        validate_for_model(self.spec(self.settings[0]), info)
        return info


@dataclass(frozen=True)
class ScaleTable:
    """The simulated results of a :class:`ScaleRequest`, in the order of its settings."""

    request: ScaleRequest
    num_layers: int  # the model's checkpointable layers
    results: list[RunResult]  # one per setting simulated; fewer than the settings when cancelled
    cancelled: bool = False  # stopped before every setting was simulated
    elapsed_s: float = 0.0  # wall time of the whole table
    seconds: dict[str, float] = field(
        default_factory=dict
    )  # Setting.key -> seconds its simulation took (absent when reused)
    # The budget the rows' device totals were decided for (RunResult.device_total, where the tensors' peak fits it),
    # or None: the table was simulated without one (the rule then decides on the tensors' peak).
    budget_bytes: int | None = None
    # Setting.key -> the same step replayed with expandable_segments:True, beside the request's own (torch's
    # defaults): the side by side of explore.device.expandable_beside, where a row has a device total.
    beside: dict[str, DeviceTotal] = field(default_factory=dict)

    @property
    def settings(self) -> list[Setting]:
        """The settings that have a result."""
        return [Setting.of(result.spec) for result in self.results]

    def result_for(self, setting: Setting) -> RunResult | None:
        return next((result for result in self.results if Setting.of(result.spec) == setting), None)


# How much of a CP layer's forward each named policy leaves to its rerun, least first: matmuls keeps every
# matmul and the attention, torchtitan every other mm and the attention, attention the attention alone.
POLICY_RERUN_ORDER = ("matmuls", "torchtitan", "attention", NONE)


def recompute_cost(setting: Setting, num_layers: int) -> tuple[int, bool, int]:
    """How much a setting adds to the step, as a sort key: the layers it reruns, offload's copies, then how much
    of each layer its selective policy leaves to the rerun.

    Off reruns nothing; every_n_layers=n reruns ceil(layers / n) layers; offload adds a
    device-to-host and a host-to-device copy of each checkpointed input; a policy keeps some op
    outputs, which the rerun takes instead of computing (op names rank beside "attention").
    """
    key = selective_key(setting.selective)
    rank = POLICY_RERUN_ORDER.index(key) if key in POLICY_RERUN_ORDER else POLICY_RERUN_ORDER.index("attention")
    return setting.cp_layers(num_layers), setting.offload, rank


def least_recompute_that_fits(table: ScaleTable, budget_bytes: int) -> RunResult | None:
    """The fitting setting that reruns the fewest layers (offload last: it adds copies), or None."""
    fitting = [result for result in table.results if fits(result, budget_bytes)]
    return min(fitting, key=lambda result: recompute_cost(Setting.of(result.spec), table.num_layers), default=None)


def table_times(table: ScaleTable, speed: Speed) -> list[SettingTime]:
    """Each simulated setting's predicted step time on ``speed`` and its factor over checkpointing off, in the
    table's order (a setting whose result carries no counted work has no prediction)."""
    return setting_times(table.results, speed)


@dataclass(frozen=True)
class Choice:
    """The setting a budget leads to: its result, its predicted time where there is one, and how it was ranked."""

    result: RunResult
    time: SettingTime | None  # None: no speed given, or the fitting results carry no counted work
    ranked_by: Literal["time", "recompute"]  # "time": the fastest predicted; "recompute": the fewest layers rerun


def fastest_that_fits(table: ScaleTable, budget_bytes: int, speed: Speed | None) -> Choice | None:
    """The fitting setting with the shortest predicted step on ``speed``, or None when nothing fits.

    Time decides where it is known: rerunning a layer costs its forward's ops, while offload's copies cross the
    host link on the compute stream and a selective policy saves part of the rerun, so the setting that reruns the
    fewest layers is not always the fastest (an offload twin over PCIe can be slower than rerunning more layers).
    Equal predicted times fall back to the recompute order. Without a speed, or where a fitting result carries no
    counted work (a simulation from before the counting), the choice is :func:`least_recompute_that_fits`'s.
    """
    rows = table_times(table, speed) if speed is not None else []
    by_result = {id(result): row for result, row in zip(table.results, rows)}  # setting_times keeps the order
    fitting = [result for result in table.results if fits(result, budget_bytes)]
    if not fitting:
        return None
    timed = [by_result.get(id(result)) for result in fitting]
    if all(row is not None and row.prediction is not None for row in timed):
        pairs = list(zip(fitting, timed))

        def key(pair: tuple[RunResult, SettingTime | None]) -> tuple[float, tuple[int, bool, int]]:
            result, row = pair
            seconds = row.prediction.seconds if row is not None and row.prediction is not None else math.inf
            return seconds, recompute_cost(Setting.of(result.spec), table.num_layers)

        best, row = min(pairs, key=key)
        return Choice(best, row, "time")
    fewest = least_recompute_that_fits(table, budget_bytes)
    assert fewest is not None  # something fits
    return Choice(fewest, by_result.get(id(fewest)), "recompute")


def scale_table(
    model: str,
    seq_len: int,
    batch_size: int,
    dtype: str,
    settings: Iterable[Setting],
    progress: Progress | None = None,
    cancel: Cancel | None = None,
    *,
    known: Mapping[RunSpec, RunResult] | None = None,
    on_result: Callable[[RunResult], None] | None = None,
    info: ModelInfo | None = None,
    optimizer: str = "adamw",
    lora_rank: int | None = None,
    lora_targets: tuple[str, ...] | None = None,
    world_size: int = 1,
    gradient_accumulation_steps: int = 1,
    max_grad_norm: float = 1.0,
    mixed_precision: str = "none",
    quantization: Quantization | None = None,
    alloc_conf: str = "",
    budget_bytes: int | None = None,
    gpu: str | None = None,
    device: DeviceStep | None = None,
) -> ScaleTable:
    """Simulate one model at one shape for each setting, one after another; with ``budget_bytes``, each setting whose
    tensors' peak fits it is given its device total (what nvidia-smi will show: :func:`~.device.on_gpu`), which
    :func:`least_recompute_that_fits` and the page's rows then decide on, and beside it the same step with
    expandable segments.

    Args:
        model, seq_len, batch_size, dtype: the shape (dtype one of :data:`SIMULATION_DTYPES`).
        settings: what to simulate, in order (:func:`scale_settings`).
        progress: called with a message and the fraction of the table done.
        cancel: a ``threading.Event`` or a function returning True to stop; checked between
            simulations. A stopped table keeps the results so far and says ``cancelled``.
        known: results already simulated, by spec; they are reused, not simulated again
            (a simulation is a function of its spec).
        on_result: called with each result as soon as it exists (simulated or reused).
        info: the model's description if the caller has it (describing an 8B model takes seconds).
        optimizer, lora_rank, lora_targets: what the step trains, as in :class:`~ckptlab.RunSpec`.
        gradient_accumulation_steps, max_grad_norm, mixed_precision: Trainer's side of the step, as in ``RunSpec``.
        quantization: a 4-bit base, as in ``RunSpec`` (with LoRA, on one GPU).
        world_size: GPUs; above 1 each setting is simulated under FSDP2 on a fake process group, rank 0's figures.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF``, as in ``RunSpec``: the device totals are replayed under it.
        budget_bytes: one GPU's memory, for the device totals (None: none; the rule decides on the tensors' peak).
        gpu: the GPU's name (its CUDA context and cuBLAS workspaces); None: a card of ``budget_bytes``.
        device: what gives a result its device total (None: :func:`~.device.on_gpu` of ``gpu``; a test's stub).

    Returns:
        A :class:`ScaleTable`.

    Raises:
        SpecError, ModelLoadError: bad input, before anything is simulated.
    """
    started = time.monotonic()
    report = progress or (lambda message, fraction: None)
    stopped = stopper(cancel)
    request = ScaleRequest(
        model,
        seq_len,
        batch_size,
        dtype,
        tuple(settings),
        optimizer,
        lora_rank,
        lora_targets,
        world_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        max_grad_norm=max_grad_norm,
        mixed_precision=mixed_precision,
        quantization=quantization,
        alloc_conf=alloc_conf,
    )
    info = request.check(info)
    decide = device or on_gpu(gpu)
    beside: dict[str, DeviceTotal] = {}
    known = known or {}
    results: list[RunResult] = []
    seconds: dict[str, float] = {}
    total = len(request.settings)
    cancelled = False
    # The settings share their shallow steps: one computation (ckptlab.step.table).
    table = TableSimulation(spec for spec in map(request.spec, request.settings) if spec not in known)
    for index, setting in enumerate(request.settings):
        if stopped():
            cancelled = True
            break
        spec = request.spec(setting)
        result = known.get(spec)
        if result is None:
            began = time.monotonic()
            result = table.result(spec, progress=scaled(report, index, total, label(setting.key)))
            seconds[setting.key] = time.monotonic() - began
        if budget_bytes is not None:  # the rule decides on what nvidia-smi will show where the tensors' peak fits
            result = decide(result, budget_bytes)
            other = expandable_beside(result, budget_bytes if gpu is None else gpu)
            if other is not None:
                beside[setting.key] = other
        results.append(result)
        report(prefixed(label(setting.key), DONE), (index + 1) / total)
        if on_result is not None:
            on_result(result)
    elapsed = time.monotonic() - started
    return ScaleTable(request, info.num_layers, results, cancelled, elapsed, seconds, budget_bytes, beside)
