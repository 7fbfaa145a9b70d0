"""The answer to "which setting is fastest while still fitting?", from measured sweep rows.

:func:`recommend` takes the rows of a sweep at one sequence length and a memory budget
(bytes, or a GPU from :data:`GPUS`) and picks the fastest row whose measured peak fits,
with the margin left, the reason in words and the transformers code to copy. When
nothing fits it says what would: a shorter sequence, a smaller batch, offload. Those
suggestions are estimates unless a measured row backs them, and say so.

Time is ranked only where it is measurable (:func:`ckptlab.results.judge_time`): when the
fastest row's step time is within the noise of another row that fits, or the machine was too
busy to time, the rows are ranked by the formula's predicted recompute cost instead (the
rerun's share of the forward, :func:`ckptlab.predict`), and the reason says so
(``Recommendation.ranked_by == "predicted"``).

The measured peak is the whole training step's: parameters, their gradients, the
optimizer's state (and its update's temporaries) and the activations; the reason says what
it counts for the rows' optimizer and LoRA, and the code carries both (``optim=...``, and
peft's ``LoraConfig`` after checkpointing is enabled on the base model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..errors import CkptlabError, Option, SpecError, expect_type
from ..fact import Fact, worded
from ..model.snippets import model_snippet, selective_snippet, trainer_snippet, with_attention
from ..results import MIN_SAMPLES_TO_JUDGE, Judgement, judge_time
from ..spec import TRAINER_DEFAULT_OPTIMIZER, Setting
from ..step.code import training_code
from ..units import mib, milliseconds
from .advice import nothing_fits, what_would_fit
from .budget import budget_bytes, fit
from .formula import architecture
from .predict import predict
from .sweep import SweepRow
from .sweep_rows import known_peak, known_step, row_name

RankedBy = Literal["measured", "predicted"]


def counts_message(optimizer: str, lora_rank: int | None) -> Fact:
    """What a measured or simulated peak of the whole training step counts (a key with an optimizer and without, LoRA or not)."""
    lora = lora_rank is not None
    if optimizer == "none":
        return Fact("counts.none_lora" if lora else "counts.none")
    name = TRAINER_DEFAULT_OPTIMIZER if optimizer == "adamw" else optimizer
    return Fact("counts.optimizer_lora" if lora else "counts.optimizer", {"optimizer": name})


@dataclass(frozen=True)
class Recommendation:
    """The fastest setting that fits a budget, or what would fit when none does."""

    budget_bytes: int  # the memory available
    budget_label: str  # e.g. "H100 80 GB" or "512.0 MiB"
    seq_len: int  # the sequence length of the rows considered
    row: SweepRow | None  # the fastest row whose peak fits; None when nothing fits
    margin_bytes: int | None  # budget minus the chosen row's peak
    reasons: tuple[Fact, ...]  # why this row (or why none), sentence by sentence, with the numbers
    # The chosen row's code box (ckptlab.step.code.training_code: the model loaded, prepared and checkpointed, LoRA,
    # and its TrainingArguments); for a row without its run, only transformers' call for its setting ("" if none)
    model_code: str
    trainer_code: str  # TrainingArguments(...) for the chosen row alone, as the box ends ("" if none)
    fitting: list[SweepRow] = field(default_factory=list)  # every row that fits, fastest first
    as_fast: list[str] = field(default_factory=list)  # settings whose step time is within the noise of the fastest's
    advice: tuple[Fact, ...] = ()  # when nothing fits: what would, measured or estimated
    ranked_by: RankedBy = "measured"  # "predicted": the measured times could not tell the settings apart
    recompute: dict[str, float] = field(default_factory=dict)  # predicted rerun share of the forward, by setting

    @property
    def fits(self) -> bool:
        return self.row is not None

    @property
    def reason(self) -> str:
        """The reasons in English, as one paragraph (the command line's)."""
        return " ".join(worded(reason) for reason in self.reasons)

    @property
    def suggestions(self) -> list[str]:
        """The advice in English, one line each (the command line's)."""
        return [worded(advice) for advice in self.advice]


def recommend(rows: Sequence[SweepRow], budget: int | str, seq_len: int | None = None) -> Recommendation:
    """The fastest measured setting whose peak fits ``budget``.

    Args:
        rows: sweep rows (:attr:`ckptlab.explore.sweep.SweepResult.rows`); rows at other lengths
            back the "shorter sequence" suggestion.
        budget: bytes available, or a GPU name from :data:`GPUS`.
        seq_len: the length to recommend for (default: the longest length in ``rows``).

    Returns:
        A :class:`Recommendation`; ``row is None`` and ``suggestions`` filled when nothing fits.

    Raises:
        SpecError: no rows, no rows at ``seq_len``, or a bad budget.
    """
    example = "ckptlab.recommend(ckptlab.sweep(SweepSpec(model='tiny-llama')).rows, '24GiB')"
    expect_type("ckptlab.recommend", "rows", rows, (list, tuple), example)
    for row in rows:
        expect_type("ckptlab.recommend", "each of rows", row, SweepRow, example)
    budget, label = budget_bytes(budget)
    if not rows:
        raise SpecError(key="recommend.no_rows")
    seq_len = max(row.seq_len for row in rows) if seq_len is None else seq_len
    here = [row for row in rows if row.seq_len == seq_len]
    if not here:
        lengths = sorted({row.seq_len for row in rows})
        raise SpecError(
            key="recommend.no_rows_at",
            option=Option("seq_len", seq_len),
            listed=lengths,
            seq_len=seq_len,
            lengths=", ".join(map(str, lengths)),
        )
    measured = [row for row in here if row.status == "ok" and row.peak_bytes is not None and row.step_s is not None]
    fitting = sorted((row for row in measured if fit(known_peak(row), budget).fits), key=known_step)
    if not fitting:
        return Recommendation(
            budget_bytes=budget,
            budget_label=label,
            seq_len=seq_len,
            row=None,
            margin_bytes=None,
            reasons=(nothing_fits(measured, budget, label, seq_len),),
            model_code="",
            trainer_code="",
            advice=tuple(what_would_fit(rows, measured, budget, seq_len)),
        )
    fastest = fitting[0]
    tied = [row for row in fitting[1:] if not _measurably_slower(row, fastest)]
    busy = any(
        row.result is not None and row.result.timing is not None and row.result.timing.too_busy for row in fitting
    )
    best = fastest
    ranked_by: RankedBy = "measured"
    recompute: dict[str, float] = {}
    if tied or busy:
        candidates = fitting if busy else [fastest, *tied]
        recompute = predicted_recompute(candidates)
        best = min(candidates, key=lambda row: (recompute[row.setting], row.offload, row.peak_bytes))
        ranked_by = "predicted"
    as_fast = [row.setting for row in tied]
    spec = best.result.spec if best.result is not None else None
    if best.result is not None:  # the whole code box of the measured run, TrainingArguments included
        model_code = training_code(best.result.spec, dtype=best.result.dtype)
    else:  # a row without its run (made by hand): the setting's lines only
        model_code = with_attention(_model_code(best), best.attn_implementation)
    return Recommendation(
        budget_bytes=budget,
        budget_label=label,
        seq_len=seq_len,
        row=best,
        margin_bytes=fit(known_peak(best), budget).margin_bytes,
        reasons=_reasons(best, fitting, measured, budget, label, as_fast, ranked_by, recompute, busy),
        model_code=model_code,
        trainer_code=trainer_snippet(
            best.every_n_layers,
            best.offload,
            spec.trainer_fields() if spec else None,
            context_fn=best.selective != "none",
        ),
        fitting=fitting,
        as_fast=as_fast,
        ranked_by=ranked_by,
        recompute=recompute,
    )


def _model_code(row: SweepRow) -> str:
    """transformers' call for the row: plain, or with the selective policy's ``context_fn`` (torch's SAC API)."""
    if row.every_n_layers is None or row.selective == "none":
        return model_snippet(row.every_n_layers, row.offload)
    policy = row.result.spec.selective if row.result is not None else row.selective
    return selective_snippet(row.every_n_layers, row.offload, policy)


def _measurably_slower(row: SweepRow, fastest: SweepRow) -> bool:
    """The lab's verdict (judge_time) on the two rows' timed steps; from the rows' ranges when the runs are gone."""
    if row.result is not None and fastest.result is not None and row.result.timing and fastest.result.timing:
        return judge_time(row.result.timing.step_samples, fastest.result.timing.step_samples).measurable
    slowest_of_fastest, fastest_of_row = fastest.step_max_s, row.step_min_s
    if None in (row.step_max_s, fastest.step_min_s) or slowest_of_fastest is None or fastest_of_row is None:
        return False  # nothing to judge by: not a measurable difference
    return fastest_of_row > slowest_of_fastest


def predicted_recompute(rows: Sequence[SweepRow]) -> dict[str, float]:
    """The formula's predicted rerun share of the forward for each row's setting (0 for checkpointing off).

    Predicted from the model's architecture (:func:`ckptlab.predict`); where the rows carry no
    run to name the model, the share of layers checkpointed stands in (the formula's share
    grows with it).
    """
    shares: dict[str, float] = {}
    spec = next((row.result.spec for row in rows if row.result is not None), None)
    if spec is not None:
        settings = sorted({row.every_n_layers for row in rows if row.every_n_layers is not None})
        # A policy keeps what its rerun would compute again: the formula counts the policies it knows
        # (formula.COUNTED_POLICIES); the others fall back to the share of layers checkpointed below.
        for policy in dict.fromkeys(row.selective for row in rows):
            try:
                arch = architecture(spec.model)
                predictions = predict(
                    arch,
                    seq_len=rows[0].seq_len,
                    batch_size=spec.batch_size,
                    every_n_layers=settings or [1],
                    selective=policy,
                )
            except CkptlabError:
                continue
            for prediction in predictions:
                for offload in (False, True):
                    key = Setting(prediction.every_n_layers, offload, policy).key
                    shares[key] = prediction.recompute_fraction
    layers = max((row.result.model.num_layers for row in rows if row.result is not None), default=0)
    return {
        row.setting: shares.get(row.setting, row.cp_layers / layers if layers else float(row.cp_layers)) for row in rows
    }


def _reasons(
    best: SweepRow,
    fitting: list[SweepRow],
    measured: list[SweepRow],
    budget: int,
    label: str,
    as_fast: list[str],
    ranked_by: RankedBy,
    recompute: dict[str, float],
    busy: bool,
) -> tuple[Fact, ...]:
    figures = {
        "setting": best.setting,
        "name": row_name(best),  # the setting in English words; the translations say its key
        "budget": label,
        "seq_len": best.seq_len,
        "step_ms": milliseconds(known_step(best)),
        "peak_mib": mib(known_peak(best)),
        "spare_mib": mib(fit(known_peak(best), budget).margin_bytes),
    }
    if ranked_by == "measured":
        words = [Fact("recommend.fastest", {**figures, "count": len(fitting)})]
    else:
        words = [Fact("recommend.least_recompute", figures)]
    verdict = best.time_verdict
    if verdict is not None and best.every_n_layers is not None:
        too_few = verdict.judgement is Judgement.TOO_FEW
        words.append(
            Fact(
                "recommend.verdict_measurable"
                if verdict.measurable
                else ("recommend.verdict_too_few" if too_few else "recommend.verdict_noise"),
                {"change": verdict.change, "fewest": MIN_SAMPLES_TO_JUDGE},
            )
        )
    if ranked_by == "predicted":
        shares = ", ".join(f"{setting} {share:.0%}" for setting, share in sorted(recompute.items(), key=lambda i: i[1]))
        if busy:
            words.append(Fact("recommend.unranked_busy", {"shares": shares}))
        else:
            tied = ", ".join([fitting[0].setting, *as_fast])
            names = ", ".join([row_name(fitting[0]), *as_fast])
            words.append(Fact("recommend.unranked_noise", {"settings": tied, "names": names, "shares": shares}))
    off = next((row for row in measured if row.every_n_layers is None), None)
    if best.every_n_layers is None:
        words.append(Fact("recommend.off_fits"))
    elif off is not None and not (off_fit := fit(known_peak(off), budget)).fits:
        fewest = min(row.cp_layers for row in fitting)
        needs, over = mib(off_fit.peak_bytes), mib(off_fit.short_bytes)
        words.append(Fact("recommend.off_over", {"peak_mib": needs, "over_mib": over}))
        if best.cp_layers == fewest:
            words.append(Fact("recommend.fewest", {"layers": best.cp_layers}))
        else:
            words.append(Fact("recommend.more_layers_faster", {"layers": best.cp_layers, "fewest": fewest}))
    spec = best.result.spec if best.result is not None else None
    words.append(counts_message(spec.optimizer if spec else "adamw", spec.lora_rank if spec else None))
    return tuple(words)
