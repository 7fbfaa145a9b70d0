"""How many GPUs, and which checkpointing: the cheapest (GPUs, every_n_layers, offload) that fits a per-GPU budget.

"Cheapest" is fewest GPUs first, then the least recompute (:func:`~ckptlab.explore.scale.recompute_cost`:
fewest layers rerun, offload last). GPUs come first because they are the hardware one has to
get: each one more is a whole device held for the run and more all-gather / reduce-scatter
traffic per step, while checkpointing costs at most one more forward of the layers it reruns
(about a third of a step at every_n_layers=1) and no hardware. With as many GPUs, the setting
that reruns the fewest layers is the fastest (the every_n_layers rows of a sweep say how much).

The search simulates (:func:`ckptlab.simulate`, fake tensors and, past one GPU, FSDP2 on a fake
process group; the figures are rank 0's; the settings at one GPU count share their shallow steps,
:mod:`ckptlab.step.table`) only what it needs, and it is exact because of one fact:

**With FSDP2 (2 GPUs and more), per-GPU memory never grows with the number of GPUs**, for a
fixed setting and per-GPU batch. At every moment of the step a rank holds two kinds of bytes:
those FSDP shards (parameters, gradients and optimizer state at rest: ``ceil(rows / N)`` rows
of each, padding included, which never grows with N) and those that do not depend on N (its
own batch's activations, the layer being gathered for its forward or rerun, the root,
the reduce-scatter input of one layer). Each event's memory is a sum of the two, so it does not
grow with N, and neither does the peak, their maximum. One GPU runs no FSDP at all, so it is
searched as its own case, never inferred from two.

So, with the settings in cost order:

1. one GPU: simulate the settings in order and stop at the first that fits (it is the answer);
2. otherwise, for each setting in order, with ``best`` the fewest GPUs found so far: only
   fewer GPUs than ``best`` can beat it (same or more recompute otherwise). Simulate it at the
   largest such count: if it does not fit there it fits at none below (the fact above); if it
   does, a binary search over the counts below finds the fewest where it fits.

Each setting costs one simulation, plus at most ``ceil(log2(len(counts)))`` more each time the
answer improves (at most ``len(counts) - 1`` times): for 11 settings and 6 counts, under 30
simulations where every pair would be 66, and results already simulated (the page's table) are
reused. ``tests/explore/test_gpu_search.py`` checks the answer against simulating every pair.

Numbers are bytes; words and units belong to the front ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ..errors import SpecError
from ..fact import Fact
from ..model.catalog import ModelInfo
from ..model.selective import NONE
from ..model.snippets import (
    ckptlab_run_line,
    fsdp_snippet,
    fsdp_trainer_snippet,
    machines,
    model_snippet,
    qlora_snippet,
    selective_snippet,
    torchrun_line,
    trainer_snippet,
    with_attention,
)
from ..results import RunResult
from ..spec import RunSpec, Setting
from ..step.stopping import DONE, Cancel, Progress, prefixed, stopper
from ..step.table import TableSimulation
from .budget import fits
from .scale import ScaleRequest, recompute_cost

# The counts the lab offers: one GPU, one 8-GPU machine's powers of two, 2 and 8 machines.
GPU_COUNTS = (1, 2, 4, 8, 16, 64)


@dataclass(frozen=True)
class SearchCode:
    """What to copy for the answer of a search: how to launch, and the lines that set it up."""

    launch: str  # torchrun (or python) for a user's train.py
    ckptlab_launch: str  # python -m ckptlab run ...: the same step measured on real GPUs
    model_code: str  # activation_checkpointing_enable(...), with the fully_shard lines past one GPU
    trainer_code: str  # TrainingArguments(...), with fsdp=True and fsdp_config past one GPU


@dataclass(frozen=True)
class GpuSearch:
    """The answer of :func:`cheapest_that_fits`, and every simulation it looked at."""

    request: ScaleRequest  # the shape and the settings searched (its world_size is not used)
    budget_bytes: int  # memory of one GPU
    counts: tuple[int, ...]  # the GPU counts searched, ascending
    num_layers: int  # the model's checkpointable layers
    result: RunResult | None  # the cheapest fitting simulation (its spec has the GPUs and the setting); None: none fits
    tried: list[RunResult] = field(default_factory=list)  # every simulation looked at, in the order looked at
    simulated: int = 0  # how many of them were simulated here (the rest were reused)
    cancelled: bool = False  # stopped before the search could answer
    elapsed_s: float = 0.0  # wall time of the search
    one_gpu_only: tuple[str, ...] = ()  # settings (keys) searched on one GPU alone (spec.selective_with_fsdp)
    quantized_one_gpu: bool = False  # a 4-bit base: searched on one GPU alone (spec.fsdp_with_quantization)

    @property
    def fits(self) -> bool:
        return self.result is not None

    @property
    def gpus(self) -> int | None:
        return None if self.result is None else self.result.spec.world_size

    @property
    def setting(self) -> Setting | None:
        return None if self.result is None else Setting.of(self.result.spec)

    def lowest(self) -> RunResult | None:
        """When nothing fits: the smallest peak at the most GPUs searched (what comes closest)."""
        most = [
            (result.memory.peak_bytes, result)
            for result in self.tried
            if result.spec.world_size == self.counts[-1] and result.memory
        ]
        return min(most, key=lambda pair: pair[0], default=(0, None))[1]

    def code(self, script: str = "train.py") -> SearchCode | None:
        """The launch lines and the code for the answer; None when nothing fits."""
        if self.result is None:
            return None
        spec = self.result.spec
        n, offload, optimizer, policy = spec.every_n_layers, spec.offload, spec.optimizer, spec.selective
        run_line = ckptlab_run_line(
            spec.world_size, spec.model, spec.seq_len, spec.batch_size, spec.dtype, n, offload, optimizer,
            selective=policy, attn_implementation=spec.attn_implementation,
        )  # fmt: skip
        context_fn = n is not None and policy != "none"  # the policy's context_fn, made in the model lines
        if spec.world_size == 1:
            model_code = model_snippet(n, offload)
            if n is not None and policy != "none":
                model_code = selective_snippet(n, offload, policy)
            if spec.quantization is not None:  # the 4-bit base is loaded and prepared first (QLoRA: one GPU)
                model_code = qlora_snippet(spec.quantization.to_dict(), spec.model) + "\n" + model_code
            return SearchCode(
                torchrun_line(1, script),
                run_line,
                with_attention(model_code, spec.attn_implementation),
                trainer_snippet(n, offload, spec.trainer_fields(), context_fn=context_fn),
            )
        return SearchCode(
            torchrun_line(spec.world_size, script),
            run_line,
            fsdp_snippet(n, offload, optimizer, selective=policy, attn_implementation=spec.attn_implementation),
            fsdp_trainer_snippet(n, offload, spec.trainer_fields(), context_fn=context_fn),
        )


def _shardable(request: ScaleRequest, setting: Setting) -> bool:
    """Whether the lab simulates ``setting`` under FSDP2 (not a selective policy with an optimizer step:
    ``ckptlab.step.selective.check_simulated_selective``)."""
    return setting.selective == NONE or request.optimizer == "none"


def check_counts(counts: tuple[int, ...]) -> tuple[int, ...]:
    """``counts`` sorted, each a GPU count the launch lines can write.

    Raises:
        SpecError: none given, or a count below 1 or not a whole number of 8-GPU machines past 8.
    """
    if not counts:
        raise SpecError(key="search.no_counts")
    for count in counts:
        try:
            machines(count)
        except ValueError as error:
            raise SpecError(
                key="search.bad_count", count=count, error=error, counts=", ".join(map(str, GPU_COUNTS))
            ) from None
    return tuple(sorted(set(counts)))


def searched_counts(request: ScaleRequest, counts: tuple[int, ...]) -> tuple[int, ...]:
    """The GPU counts a search of ``request`` looks at: ``counts``, or one GPU alone for a 4-bit base (QLoRA runs on
    one GPU here: spec.fsdp_with_quantization) when one GPU is among them (else the spec's own error says why)."""
    if request.quantization is not None and 1 in counts:
        return (1,)
    return counts


def cheapest_that_fits(
    request: ScaleRequest,
    budget_bytes: int,
    *,
    counts: tuple[int, ...] = GPU_COUNTS,
    known: Mapping[RunSpec, RunResult] | None = None,
    on_result: Callable[[RunResult], None] | None = None,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
    info: ModelInfo | None = None,
) -> GpuSearch:
    """The fewest GPUs, then the least recompute, whose simulated per-GPU peak fits ``budget_bytes``.

    Args:
        request: the shape and the settings to search over (:func:`~ckptlab.explore.scale.scale_settings`).
        budget_bytes: one GPU's memory.
        counts: the GPU counts to consider (:data:`GPU_COUNTS`).
        known: results already simulated, by spec: reused, not simulated again.
        on_result: called with each simulation as soon as it exists (a page's cache).
        progress: called with a message and an estimate of the fraction done.
        cancel: a ``threading.Event`` or a function returning True; checked between simulations.
        info: the model's description if the caller has it.

    Returns:
        A :class:`GpuSearch`; ``result`` is None when nothing fits at any count (or the search was stopped).

    Raises:
        SpecError, ModelLoadError: bad input (a budget that is not a positive number of bytes, bad
        counts, a request that cannot be simulated, LoRA past one GPU), before anything is simulated.
    """
    started = time.monotonic()
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise SpecError(key="search.bad_budget", value=budget_bytes)
    asked = check_counts(tuple(counts))
    counts = searched_counts(request, asked)
    quantized_one_gpu = counts != asked  # said with the answer (scalepage.search_verdict)
    info = request.check(info)
    for count in counts:  # LoRA under FSDP is refused here, not halfway through the search
        request.spec(replace(request.settings[0], selective=NONE), count).validate()
    report = progress or (lambda message, fraction: None)
    stopped = stopper(cancel)
    known = dict(known or {})
    settings = sorted(request.settings, key=lambda setting: recompute_cost(setting, info.num_layers))
    tried: list[RunResult] = []
    simulated = 0
    budget_guess = max(len(settings) * 2, 1)  # for the progress bar only: most searches end well before
    # The settings at one GPU count share their shallow steps (ckptlab.step.table).
    table = TableSimulation(request.spec(setting, count) for count in counts for setting in settings)

    def run(setting: Setting, gpus: int) -> RunResult:
        nonlocal simulated
        spec = request.spec(setting, gpus)
        result = known.get(spec)
        if result is None:
            prefix = Fact(
                "progress.gpus_many" if gpus > 1 else "progress.gpus_one", {"gpus": gpus, "setting": setting.key}
            )
            done = len(tried)
            result = table.result(
                spec,
                progress=lambda message, fraction: report(
                    prefixed(prefix, message), min((done + fraction) / budget_guess, 0.99)
                ),
            )
            simulated += 1
            known[spec] = result
            if on_result is not None:
                on_result(result)
        tried.append(result)
        return result

    def answer(result: RunResult | None, cancelled: bool = False) -> GpuSearch:
        report(DONE, 1.0)
        elapsed = time.monotonic() - started
        one_gpu = tuple(s.key for s in settings if not _shardable(request, s)) if counts[-1] > 1 else ()
        return GpuSearch(
            request, budget_bytes, counts, info.num_layers, result, tried, simulated, cancelled, elapsed, one_gpu,
            quantized_one_gpu,
        )  # fmt: skip

    best: RunResult | None = None
    if counts[0] == 1:  # one GPU: no FSDP, its own case; the cheapest setting that fits is the answer
        for setting in settings:
            if stopped():
                return answer(None, cancelled=True)
            result = run(setting, 1)
            if fits(result, budget_bytes):
                return answer(result)
    sharded = [count for count in counts if count > 1]
    # Selective policies under FSDP2 with an optimizer step are refused (spec.selective_with_fsdp): one GPU
    # only for those, and said (GpuSearch.one_gpu_only).
    one_gpu = tuple(setting.key for setting in settings if not _shardable(request, setting)) if sharded else ()
    for setting in [setting for setting in settings if setting.key not in one_gpu]:
        below = [count for count in sharded if best is None or count < best.spec.world_size]
        if not below:
            break  # best is already the fewest GPUs searched; later settings only cost more recompute
        if stopped():
            return answer(best, cancelled=True)
        top = run(setting, below[-1])
        if not fits(top, budget_bytes):
            continue  # per-GPU memory does not grow with the GPUs: it fits at none of the counts below either
        low, high, found = 0, len(below) - 1, top  # below[high] fits; find the fewest that does
        while low < high:
            if stopped():
                return answer(best, cancelled=True)
            middle = (low + high) // 2
            result = run(setting, below[middle])
            if fits(result, budget_bytes):
                high, found = middle, result
            else:
                low = middle + 1
        best = found
    return answer(best)
