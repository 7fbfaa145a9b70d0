"""The longest sequence that fits: for a spec and a budget, the largest ``seq_len`` whose simulated step fits it.

The question QLoRA users ask ("how long can the sequence be on a 24 GB card?"). A step's peak grows with the
sequence (almost linearly once attention keeps no ``s x s`` matrix), so the search interpolates between a
simulated length that fits and one that does not (regula falsi, halving where interpolation stalls) and
stops when they are one token apart: the answer is a simulated step that fits, next to one a token longer
that does not. Whether a peak fits is :func:`ckptlab.explore.budget.fit`'s one rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..model import catalog
from ..results import RunResult
from ..spec import MAX_TOKENS, RunSpec, Setting
from .budget import fit

MIN_SEQ = 16  # the shortest sequence tried: below it nothing of interest fits that this does not
MAX_SIMULATIONS = 40  # a bound on one search; a near-linear peak needs about six


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


def longest_seq(
    spec: RunSpec, budget_bytes: int, *, simulate: Callable[[RunSpec], RunResult] | None = None
) -> LongestSeq:
    """The longest ``seq_len`` for which ``spec``'s simulated step (its batch, recipe and setting) fits ``budget_bytes``.

    Args:
        spec: what to simulate; its ``seq_len`` is the first guess.
        budget_bytes: the memory it must fit (``ckptlab.explore.budget.budget_bytes`` reads a GPU's name).
        simulate: the simulation (``ckptlab.simulate``; a test may pass another).

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

    low = min(max(spec.seq_len, MIN_SEQ), limit)
    if not fits(low):  # bracket from below: halve until a length fits
        high = low
        while low > MIN_SEQ:
            low = max(MIN_SEQ, low // 2)
            if fits(low):
                break
            high = low
        else:
            return answer(0, high)
    else:  # bracket from above: double until a length does not fit
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
