"""The longest sequence that fits: for a spec and a budget, the largest ``seq_len`` whose simulated step fits it.

The question QLoRA users ask ("how long can the sequence be on a 24 GB card?"). At a fixed setting the high point
of each stretch of a step (the timeline's regions: the optimizer step, the backward, ...) is a line in the sequence
length wherever attention keeps no ``s x s`` matrix, and the step's peak is the highest of them. So the search
first draws each stretch's line through two simulated lengths (the first guess and its double, or its half when the
guess does not fit), simulates the length where the first of them leaves the budget, then draws the lines again
through the two simulated lengths nearest that answer and simulates the next length: when the answer fits and the
next does not (:func:`ckptlab.explore.budget.fit`, the one rule, decides both), four simulations answer. Where the
lines miss (a peak that curves: eager attention's ``s x s`` scores; a Gemma 3 sliding-window shape, a little), the
lines through the lengths nearest the answer close in on it; after ``MAX_LINES`` lines the search goes on as it did
before the lines, from the lengths already simulated: it brackets (doubling or halving) and narrows the bracket by
interpolation (regula falsi, halving where interpolation stalls) until a simulated length that fits sits next to
one a token longer that does not. ``simulations`` counts every distinct length simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..errors import Option, RunStoppedError, SpecError
from ..fact import Fact
from ..model import catalog
from ..model.catalog import ModelInfo
from ..results import MemoryResult, Region, RunResult
from ..results.allocations import DeviceTotal
from ..results.work import StepWork
from ..spec import MAX_TOKENS, TRAINER_DEFAULT_OPTIMIZER, RunSpec, Setting
from ..step.preflight import simulated_dtype
from ..step.simulate import simulated_device_type
from ..step.stopping import DONE, Cancel, Progress, label, prefixed, stopper
from ..step.table import TableSimulation
from ..units import GIB
from .budget import fit
from .device import DeviceStep, on_gpu
from .predict_training import STATE_TENSORS, training_bytes
from .scale import ScaleRequest

MIN_SEQ = 16  # the shortest sequence tried: below it nothing of interest fits that this does not
MAX_SIMULATIONS = 40  # a bound on one search; a linear peak needs four
MAX_LINES = 4  # lines drawn before the search falls back to bracketing (a peak without its stretches may need four)


@dataclass(frozen=True)
class LongestSeq:
    """The longest sequence of one setting within a budget, and the simulated steps either side of it."""

    setting: str  # Setting.key: "off", "n=1", ...
    seq_len: int  # the longest that fits; 0 when even MIN_SEQ does not
    peak_bytes: int | None  # the simulated peak at seq_len (None when nothing fits)
    over_seq_len: int | None  # the shortest simulated length that does not fit (None: the model's limit fits)
    over_peak_bytes: int | None  # its peak
    budget_bytes: int
    simulations: int  # simulated steps the search ran
    limit: int  # the longest the search could answer: the model's positions (or the lab's token bound)
    # What nvidia-smi will show at seq_len and at over_seq_len (explore.device.on_gpu), where the rule decided on it
    # (None: the tensors' peak alone was over the budget, or no device total was asked).
    device: DeviceTotal | None = None
    over_device: DeviceTotal | None = None
    # The counted work of the simulated step at ``seq_len`` (None when nothing fits, or a simulation without it): its
    # predicted time on a GPU is the roofline's (explore.roofline), asked by whoever knows the GPU. Not in the JSON.
    work: StepWork | None = field(default=None, repr=False, compare=False)

    @property
    def spare_bytes(self) -> int | None:
        """What the longest length leaves of the budget (the fit rule's margin; None when nothing fits): with
        :attr:`over_bytes`, why this length fits and the next does not where both peaks round to the same GiB."""
        return None if self.peak_bytes is None else fit(self.peak_bytes, self.budget_bytes, self.device).margin_bytes

    @property
    def over_bytes(self) -> int | None:
        """By how much the shortest length that does not fit is over the budget (the fit rule's short bytes; None
        when the model's limit fits)."""
        if self.over_peak_bytes is None:
            return None
        return fit(self.over_peak_bytes, self.budget_bytes, self.over_device).short_bytes


def longest_seq(
    spec: RunSpec,
    budget_bytes: int,
    *,
    simulate: Callable[[RunSpec], RunResult] | None = None,
    by_line: bool = True,
    gpu: str | None = None,
    device: DeviceStep | None = None,
) -> LongestSeq:
    """The longest ``seq_len`` for which ``spec``'s simulated step (its batch, recipe and setting) fits ``budget_bytes``.

    Args:
        spec: what to simulate; its ``seq_len`` is the first guess.
        budget_bytes: the memory it must fit (``ckptlab.explore.budget.budget_bytes`` reads a GPU's name).
        simulate: the simulation (``ckptlab.simulate``; a test may pass another).
        by_line: draw the peak's line through two lengths first and confirm its answer (four simulations where
            the peak is linear); False: bracket and narrow from the first guess alone, the search before the line
            (kept for ``benchmarks/longest_search.py``, which compares the two).
        gpu: the GPU's name, for the device total each fitting length is decided on (its CUDA context, cuBLAS's
            workspaces); None: a card of ``budget_bytes``, its context estimated.
        device: what gives a simulated length its device total (None: :func:`~.device.on_gpu` of ``gpu``; a test's
            stub). Only lengths whose tensors' peak fits are given one (a simulation that records the order of
            allocations); the lines aim at the budget less what the device total added at the longest such length.

    Returns:
        A :class:`LongestSeq`.

    Raises:
        SpecError, ModelLoadError: as the simulation.

    Example:
        >>> from ckptlab.explore.budget import budget_bytes
        >>> spec = RunSpec(model="tiny-llama", every_n_layers=1)
        >>> longest_seq(spec, budget_bytes("64MiB")[0]).seq_len > 0  # doctest: +SKIP
        True
    """
    if simulate is None:
        from ..step.simulate import simulate as simulate_step

        simulate = simulate_step
    info = catalog.describe(spec.model)
    limit = min(info.max_positions or MAX_TOKENS, MAX_TOKENS // spec.batch_size)
    peaks: dict[int, int] = {}
    stretches: dict[int, _Stretches] = {}
    results: dict[int, RunResult] = {}
    totals: dict[int, DeviceTotal | None] = {}
    works: dict[int, StepWork | None] = {}
    decide = device or on_gpu(gpu)

    def peak(seq_len: int) -> int:
        if seq_len not in peaks:
            result = results[seq_len] = simulate(replace(spec, seq_len=seq_len))
            memory = result.memory
            assert memory is not None  # a simulation always has its memory
            works[seq_len] = getattr(result, "work", None)  # a test's stand-in simulation may carry none
            peaks[seq_len] = memory.peak_bytes
            stretches[seq_len] = _stretches(memory)
        return peaks[seq_len]

    def fits(seq_len: int) -> bool:
        # The one rule on what nvidia-smi will show; a peak over the budget is over it on the total too (no order).
        if not fit(peak(seq_len), budget_bytes).fits:
            return False
        if seq_len not in totals:
            totals[seq_len] = decide(results[seq_len], budget_bytes).device_total
        return fit(peaks[seq_len], budget_bytes, totals[seq_len]).fits

    def aim() -> int:
        """The budget the lines aim the tensors' peak at: less what the device total added (the allocator's cache,
        the context, cuBLAS) at the longest length that has one."""
        known = [seq_len for seq_len, total in totals.items() if total is not None]
        if not known:
            return budget_bytes
        longest = max(known)
        # The tensors' peak there plus what the total left of the budget (the rule's margin on the device total).
        return peaks[longest] + fit(peaks[longest], budget_bytes, totals[longest]).margin_bytes

    def answer(seq_len: int, over: int | None) -> LongestSeq:
        return LongestSeq(
            Setting.of(spec).key,
            seq_len,
            peaks.get(seq_len),
            over,
            None if over is None else peaks[over],
            budget_bytes,
            len(peaks),
            limit,
            totals.get(seq_len),
            None if over is None else totals.get(over),
            works.get(seq_len),
        )

    start = min(max(spec.seq_len, MIN_SEQ), limit)
    fits(start)  # the first guess is simulated first either way: both searches start from it
    if by_line:
        found = _by_line(start, limit, peaks, stretches, fits, aim)
        if found is not None:
            return answer(*found)
    # The bracketing search, from every length simulated so far: the shortest that does not fit, the longest below it
    # that does (a monotone peak has no fitting length above one that does not). The lines end here where no stretch
    # rises between the two lengths (nothing to read), and where MAX_LINES lines have not met the peak: one that
    # curves over the bracket, where each line's answer creeps in from one side (regula falsi's stall) and this
    # search halves instead. A simulation's MoE step is a line (the routing, which fake tensors cannot decide,
    # changes no byte: tiny-qwen3-moe takes four). FSDP2's shards and a device total's allocator segments (once the
    # search decides by it) are not measured here: where they bend the peak, the search ends here.
    over = [seq_len for seq_len in peaks if not fits(seq_len)]
    high = min(over, default=None)
    fitting = [seq_len for seq_len in peaks if fits(seq_len) and (high is None or seq_len < high)]
    if not fitting:  # bracket from below: halve until a length fits
        assert high is not None  # a length was simulated, and it did not fit
        low = high
        while low > MIN_SEQ:
            low = max(MIN_SEQ, low // 2)
            if fits(low):
                break
            high = low
        else:
            return answer(0, high)
    else:
        low = max(fitting)
        if high is None:  # bracket from above: double until a length does not fit
            high = low
            while high < limit:
                high = min(limit, high * 2)
                if not fits(high):
                    break
                low = high
            else:
                return answer(limit, None)
    while high - low > 1 and len(peaks) < MAX_SIMULATIONS:
        width = high - low
        slope = (peak(high) - peak(low)) / width
        margin = fit(peak(low), aim()).margin_bytes  # what the fitting length leaves to spare
        guess = low + int(margin / slope) if slope > 0 else (low + high) // 2
        guess = min(max(guess, low + 1), high - 1)
        # The neighbour too: where interpolation is close (a near-linear peak), the pair is the answer at once.
        if fits(guess):
            low = guess
            if guess + 1 < high:
                low, high = (guess + 1, high) if fits(guess + 1) else (low, guess + 1)
        else:
            high = guess
            if guess - 1 > low:
                low, high = (guess - 1, high) if fits(guess - 1) else (low, guess - 1)
        if high - low > width // 2 and high - low > 1:  # interpolation stalled: halve instead
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
    return answer(low, high)


# A step's stretches (the timeline's regions, in order) and the high point of each.
_Stretches = tuple[tuple[Region, ...], tuple[int, ...]]


def _stretches(memory: MemoryResult) -> _Stretches:
    """The stretches of the step and each one's high point, when the highest of them is the step's peak (the
    timeline accounts for it); else none, and the search reads the step's peak alone."""
    regions = tuple(point.region for point in memory.timeline)
    highs = tuple(point.region_peak_bytes for point in memory.timeline)
    return (regions, highs) if highs and max(highs) == memory.peak_bytes else ((), ())


def _aligned(low: _Stretches, high: _Stretches, low_peak: int, high_peak: int) -> tuple[Sequence[int], Sequence[int]]:
    """The high points to draw lines through at two lengths: stretch by stretch where both steps ran the same
    stretches (the same spec at another length does), else the two step peaks."""
    if low[0] and low[0] == high[0]:
        return low[1], high[1]
    return (low_peak,), (high_peak,)


def _line_answer(low: int, high: int, lows: Sequence[int], highs: Sequence[int], budget_bytes: int) -> int | None:
    """The longest length at which every rising line through (``low``, ``lows[i]``) and (``high``, ``highs[i]``)
    stays within the budget (:func:`~.budget.fit`'s margin), in whole bytes and tokens, no float rounding: the floor,
    the line's last fitting token (a negative margin floors back from ``low``); None when no line rises."""
    run = high - low
    answers = [
        low + fit(at_low, budget_bytes).margin_bytes * run // (at_high - at_low)
        for at_low, at_high in zip(lows, highs, strict=True)
        if at_high > at_low
    ]
    return min(answers, default=None)


def _by_line(
    start: int,
    limit: int,
    peaks: Mapping[int, int],
    stretches: Mapping[int, _Stretches],
    fits: Callable[[int], bool],
    aim: Callable[[], int],
) -> tuple[int, int | None] | None:
    """(longest, next length) read from lines through simulated lengths, confirmed by the fit rule at the answer and
    the next length; None where the lines do not meet the peak within ``MAX_LINES`` (the caller searches on from the
    lengths simulated). ``start`` is already simulated; ``peaks`` holds every length simulated so far; ``aim()`` is
    the budget the tensors' peak is aimed at (the budget less what the device total adds, as measured so far).

    The first line goes through ``start`` and its double (its half where it does not fit). Each next line goes
    through the two simulated lengths nearest the answer: the longest that fits and the shortest that does not once
    both exist (the answer lies between them), else the two longest that fit (or the two shortest that do not).
    Where the peak is a line the second line passes through the first one's answer and gives it again, and its next
    length confirms it: four simulations.

    A line is drawn per stretch of the step (:func:`_stretches`), and the answer is the shortest at which one of
    them leaves the budget: the step's peak is the highest of its stretches', and where the stretch that holds it
    changes between the two lengths the peak bends although each stretch's own high point is a line. llama-3.2-1b
    in 24 GiB from 512 tokens: the peak is the optimizer step's (parameters, gradients and state, flat in the
    length) up to about 2,048 tokens, the backward's beyond; the step peak's line through 512 and 1,024 rises 8
    bytes a token and answers past the model's positions, the backward's answers 11,321, the length itself."""
    if fits(start) and start == limit:
        return limit, None
    if not fits(start) and start == MIN_SEQ:
        return 0, MIN_SEQ
    fits(min(limit, 2 * start) if fits(start) else max(MIN_SEQ, start // 2))
    for lines in range(MAX_LINES + 1):  # the last round only reads the pair the last line's answer completed
        over = min((seq_len for seq_len in peaks if not fits(seq_len)), default=None)
        fitting = sorted(seq_len for seq_len in peaks if fits(seq_len) and (over is None or seq_len < over))
        longest = fitting[-1] if fitting else None
        if longest is not None and (longest == limit or over == longest + 1):
            return longest, over
        if longest is None and over == MIN_SEQ:
            return 0, MIN_SEQ
        if lines == MAX_LINES:
            return None
        if longest is not None and over is not None:
            low, high = longest, over  # the bracket: the answer lies between its ends
        elif over is None:
            low, high = fitting[-2], fitting[-1]  # everything fits: on along the two longest
        else:
            low, high = sorted(peaks)[:2]  # nothing fits: back along the two shortest
        guess = _line_answer(low, high, *_aligned(stretches[low], stretches[high], peaks[low], peaks[high]), aim())
        if guess is None:  # nothing rises (the optimizer step's peak, not the activations'): no line to read
            return None
        if longest is not None:
            guess = max(guess, longest)  # a length that fits is not read again: its next length is the question
        if over is not None:
            guess = min(guess, over - 1)
        guess = min(max(guess, MIN_SEQ), limit)
        fits(guess + 1 if guess == longest else guess)
    return None


def parameter_floor(spec: RunSpec) -> tuple[int, str]:
    """(bytes, dtype name): what ``spec``'s step holds on one GPU at any sequence length and any checkpointing: its
    parameters, their gradients and the optimizer's state, counted on the meta device
    (``predict_training.training_bytes``). Under FSDP2 (``spec.fsdp``, ``world_size`` N) a rank holds ``ceil(rows /
    N)`` rows of each of them, padding included, so at least the total over N: the floor is that. An optimizer the
    formula does not count (Adafactor, the low-bit ones) adds no state here: still a floor. The longest-sequence
    search refuses a budget under it (:func:`refuse_over_floor`); the fewest-GPUs search skips each GPU count whose
    floor is over the budget (``gpu_search.cheapest_that_fits``)."""
    device = simulated_device_type(spec)
    dtype = simulated_dtype(spec)
    named = TRAINER_DEFAULT_OPTIMIZER if spec.optimizer == "adamw" else spec.optimizer
    counted = training_bytes(
        spec.model,
        dtype,
        optimizer=spec.optimizer if named in STATE_TENSORS else "none",
        lora_rank=spec.lora_rank,
        lora_targets=spec.lora_targets,
        device=device,
        quantization=spec.quantization,
    )
    floor = counted.parameter_bytes + counted.gradient_bytes + counted.optimizer_state_bytes
    if spec.fsdp and spec.world_size > 1:
        floor //= spec.world_size  # every rank's shard is at least its share; a lower bound stays one
    return floor, str(dtype).removeprefix("torch.")


def refuse_over_floor(spec: RunSpec, budget_bytes: int) -> None:
    """Refuse a search whose :func:`parameter_floor` does not fit ``budget_bytes`` (:func:`~.budget.fit`, the one
    rule), before anything is simulated: a search would otherwise halve the sequence down to MIN_SEQ, simulating a
    large model at every length (llama-3.1-8b in 1 GiB: over 300 s) to answer "nothing fits".

    Raises:
        SpecError: ``longest.floor_over_budget``, naming the floor, the budget and what would lower the floor.
    """
    floor, dtype = parameter_floor(spec)
    if fit(floor, budget_bytes).fits:
        return
    raise SpecError(
        key="longest.floor_over_budget",
        name=str(spec.model),
        floor_gib=floor / GIB,
        budget_gib=budget_bytes / GIB,
        floor_bytes=floor,
        budget_bytes=budget_bytes,
        dtype=dtype,
        optimizer=spec.optimizer,
        lora_rank=Option("lora_rank"),
        option=Option("optimizer", "sgd"),
    )


@dataclass(frozen=True)
class LongestTable:
    """The longest sequence of each of a request's settings within one budget (the At-scale page's search)."""

    request: ScaleRequest  # the shape, the recipe and the GPUs searched (its seq_len: every search's first guess)
    budget_bytes: int
    rows: tuple[LongestSeq, ...]  # one per setting searched, in the order asked
    settings: tuple[Setting, ...]  # the settings asked for (more than ``rows`` when stopped)
    cancelled: bool  # stopped before every setting was searched
    elapsed_s: float
    simulated: int  # simulations run now (the others reused)


def check_budget(budget_bytes: object) -> int:
    """``budget_bytes`` when it is a whole number of bytes above 0: the memory a search needs to fit.

    Raises:
        SpecError: no budget (None, 0, a negative or a non-integer).
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise SpecError(key="longest.no_budget", option=Option("budget_bytes", budget_bytes))
    return budget_bytes


def longest_table(
    request: ScaleRequest,
    budget_bytes: int,
    settings: Sequence[Setting],
    *,
    known: Mapping[RunSpec, RunResult] | None = None,
    on_result: Callable[[RunResult], None] | None = None,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
    info: ModelInfo | None = None,
    gpu: str | None = None,
) -> LongestTable:
    """:func:`longest_seq` for each of ``settings`` at ``request``'s shape and recipe, one after another.

    Args:
        request: the model, batch, dtype, recipe and GPUs (``request.spec(setting)``); its seq_len is the first guess.
        budget_bytes: one GPU's memory (:func:`check_budget`).
        settings: the checkpointing settings to search.
        known: results already simulated, by spec (a page's cache); reused, not simulated again.
        on_result: called with each result simulated now.
        progress: called with a message and the fraction of the settings done.
        cancel: a ``threading.Event`` or a function returning True to stop; asked before each simulation. A
            stopped table keeps the settings searched to their end and says ``cancelled``.
        info: the model's description if the caller has it.
        gpu: the GPU's name, for the device totals each search decides on (:func:`longest_seq`); None: a card of
            ``budget_bytes``.

    Returns:
        A :class:`LongestTable`.

    Raises:
        SpecError, ModelLoadError: bad input, before anything is simulated.
    """
    started = time.monotonic()
    check_budget(budget_bytes)
    request.check(info)
    if settings:  # the floor is the same for every setting: parameters, gradients and state do not checkpoint
        refuse_over_floor(request.spec(settings[0]), budget_bytes)
    report = progress or (lambda message, fraction: None)
    stopped = stopper(cancel)
    known = known or {}
    table = TableSimulation()  # the settings share their shallow steps at each length tried
    rows: list[LongestSeq] = []
    simulated = 0
    for index, setting in enumerate(settings):
        tried: list[int] = []

        def simulate(spec: RunSpec, index: int = index, tried: list[int] = tried) -> RunResult:
            nonlocal simulated
            if stopped():
                raise RunStoppedError(key="run.stopped")
            result = known.get(spec)
            if result is None:
                prefix = Fact("progress.longest_try", {"setting": Setting.of(spec).key, "seq_len": spec.seq_len})
                # A search takes four simulations where the lines hold, five to twelve where they do not: each
                # takes a third of the setting's share left.
                before, after = 1 - 0.67 ** len(tried), 1 - 0.67 ** (len(tried) + 1)

                def within(message: Fact, fraction: float) -> None:
                    done = index + before + (after - before) * fraction
                    report(prefixed(prefix, message), done / len(settings))

                result = table.result(spec, progress=within)
                simulated += 1
                if on_result is not None:
                    on_result(result)
            tried.append(spec.seq_len)
            return result

        try:
            rows.append(longest_seq(request.spec(setting), budget_bytes, simulate=simulate, gpu=gpu))
        except RunStoppedError:
            break
        report(prefixed(label(setting.key), DONE), (index + 1) / len(settings))
    cancelled = len(rows) < len(settings)
    return LongestTable(
        request, budget_bytes, tuple(rows), tuple(settings), cancelled, time.monotonic() - started, simulated
    )
