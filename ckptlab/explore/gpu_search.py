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

Two more facts cut what it simulates:

- **The parameter floor.** Parameters, their gradients and the optimizer's state are held at the optimizer step
  whatever the checkpointing (per rank under FSDP2: at least their total over N); a count whose floor
  (:func:`ckptlab.explore.longest.parameter_floor`) does not fit the budget (:func:`~.budget.fit`, the one rule)
  is never simulated (``GpuSearch.floor_refused``).
- **The leanest setting.** A setting that checkpoints every layer another does, offloads where it does and keeps
  no more in its CP layers holds no more memory at any moment of the step (:func:`holds_no_more`); every_n_layers=1
  with offload is such a setting for all the plain ones. Where it does not fit at a count, nothing does.

So, with the settings in cost order:

1. one GPU (where the floor allows it): the cheapest setting first (where it fits it is the answer), then the
   leanest (where it does not fit, one GPU is done), then the middle of the settings still undecided, each
   simulation ruling in or out every setting it holds no more or no less than;
2. otherwise a binary search of the leanest over the counts the floor allows (one simulation a count) gives the
   fewest GPUs where anything fits, and step 1's order finds the cheapest setting there.

Where no setting is the leanest (selective policies alone, no every_n_layers=1), the search goes setting by
setting: simulate each at the largest count below the best found so far, and a binary search below it where it
fits (``by_floor=False`` is that search everywhere, for ``benchmarks/gpu_search.py``). For the Llama 3.1 70B shape
at 8192 tokens on H100s the benchmark prints both. ``tests/explore/test_gpu_search.py`` checks the answer against
simulating every pair, ``tests/explore/test_gpu_search_order.py`` against the search setting by setting.

Numbers are bytes; words and units belong to the front ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from ..errors import SpecError
from ..fact import Fact
from ..model.catalog import ModelInfo
from ..model.plan import planned_roles
from ..model.selective import NONE
from ..model.snippets import (
    ckptlab_run_line,
    fsdp_snippet,
    fsdp_trainer_snippet,
    machines,
    torchrun_line,
    trainer_snippet,
)
from ..results import RunResult
from ..spec import RunSpec, Setting
from ..step.code import training_code
from ..step.stopping import DONE, Cancel, Progress, prefixed, stopper
from ..step.table import TableSimulation
from .budget import fit, fits
from .device import DeviceStep, on_gpu
from .longest import parameter_floor
from .scale import ScaleRequest, recompute_cost

# The counts the lab offers: one GPU, one 8-GPU machine's powers of two, 2 and 8 machines.
GPU_COUNTS = (1, 2, 4, 8, 16, 64)


@dataclass(frozen=True)
class SearchCode:
    """What to copy for the answer of a search: how to launch, and the lines that set it up."""

    launch: str  # torchrun (or python) for a user's train.py
    ckptlab_launch: str  # python -m ckptlab run ...: the same step measured on real GPUs
    model_code: str  # one GPU: the whole code box (ckptlab.step.code); past one: the fully_shard lines
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
    floor_refused: tuple[int, ...] = ()  # counts not simulated: their parameter floor (longest.parameter_floor) is over

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
        if spec.world_size == 1:  # the whole code box of the simulated run, TrainingArguments included
            return SearchCode(
                torchrun_line(1, script),
                run_line,
                training_code(spec, dtype=self.result.dtype),
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
    by_floor: bool = True,
    gpu: str | None = None,
    device: DeviceStep | None = None,
) -> GpuSearch:
    """The fewest GPUs, then the least recompute, whose simulated step fits ``budget_bytes`` on each GPU: what
    nvidia-smi will show (the device total: :func:`~.device.on_gpu`) where the tensors' peak fits.

    Args:
        request: the shape and the settings to search over (:func:`~ckptlab.explore.scale.scale_settings`).
        budget_bytes: one GPU's memory.
        counts: the GPU counts to consider (:data:`GPU_COUNTS`).
        known: results already simulated, by spec: reused, not simulated again.
        on_result: called with each simulation as soon as it exists (a page's cache).
        progress: called with a message and an estimate of the fraction done.
        cancel: a ``threading.Event`` or a function returning True; checked between simulations.
        info: the model's description if the caller has it.
        by_floor: skip the counts the parameter floor refuses and decide each count by its leanest setting first;
            False: the search setting by setting as it was before them (kept for ``benchmarks/gpu_search.py``,
            which compares the two).
        gpu: the GPU's name: its CUDA context (measured or estimated) and cuBLAS workspaces in the device total
            the search decides on; None: a card of the budget's bytes, its context estimated.
        device: what puts each simulation before the fit rule; None: :func:`~.device.on_gpu` of ``gpu`` (a test
            stands a stub in).

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
    quantized_one_gpu = counts != asked  # said with the answer (at_scale_view.search_verdict)
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
    decide = device or on_gpu(gpu)

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
            if on_result is not None:
                on_result(result)
        # The rule decides on the device total where the peak fits (its order recorded once, then kept).
        result = known[spec] = decide(result, budget_bytes)
        tried.append(result)
        return result

    floor_refused: tuple[int, ...] = ()  # set below, once the search has not been stopped before it began

    def answer(result: RunResult | None, cancelled: bool = False) -> GpuSearch:
        report(DONE, 1.0)
        elapsed = time.monotonic() - started
        one_gpu = tuple(s.key for s in settings if not _shardable(request, s)) if counts[-1] > 1 else ()
        return GpuSearch(
            request, budget_bytes, counts, info.num_layers, result, tried, simulated, cancelled, elapsed, one_gpu,
            quantized_one_gpu, floor_refused,
        )  # fmt: skip

    if stopped():
        return answer(None, cancelled=True)
    # A count whose parameters, gradients and optimizer state alone (per rank under FSDP2) do not fit is never
    # simulated: nothing checkpointing does brings a peak below them.
    floor_refused = tuple(
        count for count in counts if by_floor and not _floor_fits(request, settings[0], count, budget_bytes)
    )

    left = [count for count in counts if count not in floor_refused]
    sharded = [count for count in left if count > 1]
    # Selective policies under FSDP2 with an optimizer step are refused (spec.selective_with_fsdp): one GPU
    # only for those, and said (GpuSearch.one_gpu_only).
    shardable = [setting for setting in settings if _shardable(request, setting)] if sharded else []
    leanest = _leanest(shardable, info.num_layers)
    if not by_floor or (sharded and leanest is None):  # setting by setting, as before the leanest
        return _by_setting(settings, shardable, left, run, answer, stopped, budget_bytes)
    if left and left[0] == 1:  # one GPU: no FSDP, its own case
        found, cancelled = _cheapest_at(settings, 1, info.num_layers, run, stopped, budget_bytes)
        if found is not None or cancelled:
            return answer(found, cancelled)
    if leanest is None:
        return answer(None)
    # The leanest fits at a count or nothing does (it holds no more than any other setting), and what fits at N
    # fits at every count above N (per-GPU memory does not grow with the GPUs): the fewest GPUs is a binary
    # search of the leanest over the counts, one simulation a count.
    low, high, fewest = 0, len(sharded) - 1, None
    while low <= high:
        if stopped():
            return answer(None, cancelled=True)
        middle = (low + high) // 2
        result = run(leanest, sharded[middle])
        if fits(result, budget_bytes):
            fewest, high = (sharded[middle], result), middle - 1
        else:
            low = middle + 1
    if fewest is None:
        return answer(None)
    gpus, lean = fewest
    found, cancelled = _cheapest_at(shardable, gpus, info.num_layers, run, stopped, budget_bytes, {leanest: lean})
    return answer(found, cancelled)


def _floor_fits(request: ScaleRequest, setting: Setting, gpus: int, budget_bytes: int) -> bool:
    """Whether ``parameter_floor`` at ``gpus`` (per rank under FSDP2) fits the budget: :func:`~.budget.fit`'s rule."""
    return fit(parameter_floor(request.spec(setting, gpus))[0], budget_bytes).fits


def _cp_layers(setting: Setting, num_layers: int) -> frozenset[int]:
    return frozenset(i for i, role in enumerate(planned_roles(num_layers, setting.every_n_layers)) if role == "CP")


def holds_no_more(lean: Setting, other: Setting, num_layers: int) -> bool:
    """Whether ``lean`` holds no more device memory than ``other`` at every moment of a step, so its peak is no
    higher: it checkpoints every layer ``other`` does (a CP layer keeps its input where a keep layer keeps all
    its activations, and the rerun rebuilds one layer's at a time, which a keep layer holds all along), offloads
    where ``other`` does, and keeps no more in its CP layers (plain checkpointing, or ``other``'s own policy)."""
    return (
        _cp_layers(lean, num_layers) >= _cp_layers(other, num_layers)
        and (lean.offload or not other.offload)
        and (lean.selective == NONE or lean.selective == other.selective)
    )


def _leanest(settings: list[Setting], num_layers: int) -> Setting | None:
    """The setting that holds no more than any other (every_n_layers=1 with offload, among plain ones), or None."""
    return next((lean for lean in settings if all(holds_no_more(lean, other, num_layers) for other in settings)), None)


def _cheapest_at(
    settings: list[Setting],
    gpus: int,
    num_layers: int,
    run: Callable[[Setting, int], RunResult],
    stopped: Callable[[], bool],
    budget_bytes: int,
    simulated: dict[Setting, RunResult] | None = None,
) -> tuple[RunResult | None, bool]:
    """(the cheapest of ``settings``, in cost order, that fits at ``gpus``, or None; whether it was stopped).

    A setting that does not fit rules out every setting it holds no more than (:func:`holds_no_more`); one that
    fits rules in every setting that holds no more than it. The simulations: the cheapest first (where it fits it
    is the answer at once), then the leanest (where it does not fit, nothing does: one simulation decides the
    count), then the middle of the settings still undecided before the cheapest ruled in, so that a failure rules
    out a whole chain of settings at once where they nest (every_n_layers' divisors). ``simulated``: the settings
    already simulated at ``gpus``.
    """
    simulated = dict(simulated or {})

    def known(setting: Setting) -> bool | None:
        for other, result in simulated.items():
            fitting = fits(result, budget_bytes)
            if fitting and holds_no_more(setting, other, num_layers):
                return True
            if not fitting and holds_no_more(other, setting, num_layers):
                return False
        return None

    leanest = _leanest(settings, num_layers)
    first_probes = [settings[0]] + ([leanest] if leanest is not None else [])
    while True:
        status = [known(setting) for setting in settings]
        cheapest = next((index for index, state in enumerate(status) if state is not False), None)
        if cheapest is None:
            return None, False
        if status[cheapest] is True:  # the answer; ruled in without a simulation, it is simulated for its figures
            answer = simulated.get(settings[cheapest])
            if answer is None:
                if stopped():
                    return None, True
                answer = run(settings[cheapest], gpus)
            return answer, False
        ruled_in = status.index(True) if True in status else len(status)
        undecided = [setting for setting, state in zip(settings[:ruled_in], status, strict=False) if state is None]
        probes = [setting for setting in first_probes if known(setting) is None]
        probe = probes[0] if probes else undecided[len(undecided) // 2]
        if stopped():
            return None, True
        simulated[probe] = run(probe, gpus)


def _by_setting(
    settings: list[Setting],
    shardable: list[Setting],
    counts: list[int],
    run: Callable[[Setting, int], RunResult],
    answer: Callable[..., GpuSearch],
    stopped: Callable[[], bool],
    budget_bytes: int,
) -> GpuSearch:
    """The search setting by setting (before the floor and the leanest; still where no setting is the leanest): one
    GPU in cost order, then each setting at the most GPUs that could beat the best so far and a binary search below
    it where it fits."""
    sharded = [count for count in counts if count > 1]
    best: RunResult | None = None
    if counts and counts[0] == 1:
        for setting in settings:
            if stopped():
                return answer(None, cancelled=True)
            result = run(setting, 1)
            if fits(result, budget_bytes):
                return answer(result)
    for setting in shardable:
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
