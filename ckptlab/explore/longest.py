"""The longest sequence that fits: for a spec and a budget, the largest ``seq_len`` whose simulated step fits it.

The question QLoRA users ask ("how long can the sequence be on a 24 GB card?"). At a fixed setting a step's peak
is a line in the sequence length wherever attention keeps no ``s x s`` matrix and nothing saturates, so the search
first draws that line through two simulated lengths (the first guess and its double, or its half when the guess
does not fit) and simulates the length the line answers and the next one: when the answer fits and the next does
not (:func:`ckptlab.explore.budget.fit`, the one rule, decides both), four simulations answer. Where the line misses
(MoE routing, a sliding window that saturates, FSDP2 shards' rounding, eager attention's ``s x s``), the search goes
on as it did before the line, from the lengths already simulated: it brackets (doubling or halving) and narrows
the bracket by interpolation (regula falsi, halving where interpolation stalls) until a simulated length that fits
sits next to one a token longer that does not. ``simulations`` counts every distinct length simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..errors import Option, RunStoppedError, SpecError
from ..fact import Fact
from ..model import catalog
from ..model.catalog import ModelInfo
from ..results import RunResult
from ..spec import MAX_TOKENS, TRAINER_DEFAULT_OPTIMIZER, RunSpec, Setting
from ..step.preflight import simulated_dtype
from ..step.simulate import simulated_device_type
from ..step.stopping import DONE, Cancel, Progress, label, prefixed, stopper
from ..step.table import TableSimulation
from ..units import GIB
from .budget import fit
from .predict_training import STATE_TENSORS, training_bytes
from .scale import ScaleRequest

MIN_SEQ = 16  # the shortest sequence tried: below it nothing of interest fits that this does not
MAX_SIMULATIONS = 40  # a bound on one search; a linear peak needs four


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

    @property
    def spare_bytes(self) -> int | None:
        """What the longest length leaves of the budget (the fit rule's margin; None when nothing fits): with
        :attr:`over_bytes`, why this length fits and the next does not where both peaks round to the same GiB."""
        return None if self.peak_bytes is None else fit(self.peak_bytes, self.budget_bytes).margin_bytes

    @property
    def over_bytes(self) -> int | None:
        """By how much the shortest length that does not fit is over the budget (the fit rule's short bytes; None
        when the model's limit fits)."""
        return None if self.over_peak_bytes is None else fit(self.over_peak_bytes, self.budget_bytes).short_bytes


def longest_seq(
    spec: RunSpec,
    budget_bytes: int,
    *,
    simulate: Callable[[RunSpec], RunResult] | None = None,
    by_line: bool = True,
) -> LongestSeq:
    """The longest ``seq_len`` for which ``spec``'s simulated step (its batch, recipe and setting) fits ``budget_bytes``.

    Args:
        spec: what to simulate; its ``seq_len`` is the first guess.
        budget_bytes: the memory it must fit (``ckptlab.explore.budget.budget_bytes`` reads a GPU's name).
        simulate: the simulation (``ckptlab.simulate``; a test may pass another).
        by_line: draw the peak's line through two lengths first and confirm its answer (four simulations where
            the peak is linear); False: bracket and narrow from the first guess alone, the search before the line
            (kept for ``benchmarks/longest_search.py``, which compares the two).

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

    def peak(seq_len: int) -> int:
        if seq_len not in peaks:
            memory = simulate(replace(spec, seq_len=seq_len)).memory
            assert memory is not None  # a simulation always has its memory
            peaks[seq_len] = memory.peak_bytes
        return peaks[seq_len]

    def fits(seq_len: int) -> bool:
        return fit(peak(seq_len), budget_bytes).fits

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
        )

    start = min(max(spec.seq_len, MIN_SEQ), limit)
    fits(start)  # the first guess is simulated first either way: both searches start from it
    if by_line:
        found = _by_line(start, limit, peak, fits, budget_bytes)
        if found is not None:
            return answer(*found)
    # The bracketing search, from every length simulated so far: the shortest that does not fit, the longest below it
    # that does (a monotone peak has no fitting length above one that does not).
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
        margin = fit(peak(low), budget_bytes).margin_bytes  # what the fitting length leaves to spare
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


def _by_line(
    start: int, limit: int, peak: Callable[[int], int], fits: Callable[[int], bool], budget_bytes: int
) -> tuple[int, int | None] | None:
    """(longest, next length) read from the line through two simulated lengths and confirmed by the fit rule at
    the line's answer and the next length; None where the line's answer does not hold (the caller searches on
    from the lengths simulated). ``start`` is already simulated."""
    if fits(start) and start == limit:
        return limit, None
    if not fits(start) and start == MIN_SEQ:
        return 0, MIN_SEQ
    other = min(limit, 2 * start) if fits(start) else max(MIN_SEQ, start // 2)
    rise, run = peak(other) - peak(start), other - start
    if rise * run <= 0:  # flat or falling (the optimizer step's peak, not the activations'): no line to read
        return None
    # The longest length whose line stays within the budget, in whole bytes and tokens (no float rounding).
    longest = start + fit(peak(start), budget_bytes).margin_bytes * run // rise  # floor: the line's last fitting token
    if longest >= limit:
        return (limit, None) if fits(limit) else None
    if longest < MIN_SEQ:
        return (0, MIN_SEQ) if not fits(MIN_SEQ) else None
    if fits(longest) and not fits(longest + 1):
        return longest, longest + 1
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
                # A search takes four simulations where the line holds, six to twelve where it does not: each
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
            rows.append(longest_seq(request.spec(setting), budget_bytes, simulate=simulate))
        except RunStoppedError:
            break
        report(prefixed(label(setting.key), DONE), (index + 1) / len(settings))
    cancelled = len(rows) < len(settings)
    return LongestTable(
        request, budget_bytes, tuple(rows), tuple(settings), cancelled, time.monotonic() - started, simulated
    )
