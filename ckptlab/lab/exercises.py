"""Predict, then measure: the workshop's exercises, their scoring and the explanation of each gap.

An exercise names a setting and a question about it (a percentage of the
checkpointing-off run, which every_n_layers fits a budget, or how many KiB a selective policy keeps). The participant predicts,
the lab measures the runs :meth:`Exercise.specs` lists (through the same device queue as
the lab page), and :func:`evaluate` puts the prediction beside the measurement, scores it
and explains the gap in one line computed from the measured numbers. Words come from the
locale files; this module only chooses the key and the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from ..errors import Option, SpecError
from ..explore.budget import fit
from ..model import catalog
from ..model.plan import planned_roles
from ..results import Judgement, RunResult, compare, measurements, memory_of, timing_of
from ..show.i18n import number, t
from ..show.labels import event_label
from ..spec import RunSpec
from ..units import mib

Kind = Literal["percent", "choice", "kept"]
Metric = Literal["after_forward", "peak", "step"]

MAX_POINTS = 3
# Percentage points off -> points: within 10 is a hit, within 25 close, within 50 the right idea.
PERCENT_BANDS = ((10.0, 3), (25.0, 2), (50.0, 1))
# Three timed steps: a time difference needs a spread to be judged (results.MIN_SAMPLES_TO_JUDGE).
# optimizer="none": the exercises (and the lesson parts that share these runs) are about activations alone.
QUICK = RunSpec(model="tiny-llama", seq_len=128, every_n_layers=1, repeats=3, warmup=1, optimizer="none")
LONG = RunSpec(
    model="tiny-llama", seq_len=512, every_n_layers=1, repeats=1, warmup=0, optimizer="none"
)  # memory only: where the peak moves


# The range of a number to predict, by the exercise's kind: the page's box holds these and the room counts no other.
ANSWER_RANGES = {"percent": (0, 400), "kept": (0, 10_000_000)}


@dataclass(frozen=True)
class Exercise:
    """One question about one setting, in growing order of difficulty."""

    id: str  # locale keys live under exercise.<id>.*
    level: int  # 1 (warm-up) .. 3 (hard)
    # "percent": a number, as % of checkpointing off; "choice": pick an every_n_layers; "kept": the KiB a selective
    # policy keeps in the CP layers besides their inputs (observed in the memory step)
    kind: Kind
    spec: RunSpec  # the setting asked about (for "choice": the model and shape; every_n_layers is the answer)
    metric: Metric = "after_forward"  # what a "percent" exercise asks for
    choices: tuple[int, ...] = ()  # every_n_layers to choose from ("choice")
    budget_fraction: float = (
        0.0  # "choice": the budget, as a fraction of what checkpointing off holds after the forward
    )

    def accepts(self, value: float) -> bool:
        """Whether ``value`` is an answer the exercise's box could send: a finite number in its range
        (:data:`ANSWER_RANGES`), or one of its choices. A websocket can send anything; the room counts only these."""
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        if self.kind == "choice":
            return value in self.choices
        low, high = ANSWER_RANGES[self.kind]
        return low <= value <= high

    def specs(self) -> list[RunSpec]:
        """The runs to measure (each one's checkpointing-off reference comes with it from ``run_queued``)."""
        if self.kind == "choice":
            return [replace(self.spec, every_n_layers=n) for n in self.choices]
        return [self.spec]

    def question_values(self) -> dict[str, object]:
        """The numbers a question's text is filled with (for "kept", the model's shape too)."""
        values: dict[str, object] = {
            "n": self.spec.every_n_layers,
            "seq": self.spec.seq_len,
            "model": self.spec.model,
            "budget": round(self.budget_fraction * 100),
            "choices": ", ".join(str(n) for n in self.choices),
        }
        if self.kind == "kept":
            info = catalog.describe(self.spec.model)
            cp = planned_roles(info.num_layers, self.spec.every_n_layers).count("CP")
            values |= {"layers": info.num_layers, "cp": cp, "heads": info.num_attention_heads,
                       "head_dim": info.hidden_size // info.num_attention_heads, "batch": self.spec.batch_size}  # fmt: skip
        return values


EXERCISES: tuple[Exercise, ...] = (
    Exercise("resident_all", 1, "percent", QUICK, metric="after_forward"),
    Exercise("resident_half", 1, "percent", replace(QUICK, every_n_layers=2), metric="after_forward"),
    Exercise("step_time", 2, "percent", QUICK, metric="step"),
    Exercise("peak_short", 2, "percent", QUICK, metric="peak"),
    Exercise("keep_attention", 2, "kept", replace(QUICK, selective="attention")),
    Exercise("budget", 3, "choice", QUICK, choices=(1, 2, 3, 6), budget_fraction=0.6),
    Exercise("peak_long", 3, "percent", LONG, metric="peak"),
)


@dataclass(frozen=True)
class Outcome:
    """A prediction beside the measurement."""

    predicted: float  # the participant's number (percent) or every_n_layers
    measured: float  # the measured percent of off, or the every_n_layers that answers the question
    points: int  # 0 .. possible
    verdict: str  # one line: how far off, in the page's language
    explanation: str  # one line: why the measurement is what it is, from the measured numbers
    # What the answer could score: MAX_POINTS, or 0 where it is not measurable here now (a machine too busy to time
    # a step), so that an answer the verdict says "scores no points" is not counted in the total either.
    possible: int = MAX_POINTS


def by_id(exercise_id: str) -> Exercise:
    """The exercise with that id.

    Raises:
        SpecError: no such exercise.
    """
    for exercise in EXERCISES:
        if exercise.id == exercise_id:
            return exercise
    raise SpecError(key="api.no_exercise", exercise_id=exercise_id, exercises=", ".join(e.id for e in EXERCISES))


def percent_of_off(run: RunResult, off: RunResult, metric: Metric) -> float:
    """The run's ``metric`` as a percentage of the checkpointing-off run's."""
    comparison = compare(run, off)
    ratio = {
        "after_forward": comparison.after_forward_ratio,
        "peak": comparison.peak_ratio,
        "step": comparison.step_ratio,
    }[metric]
    return 100.0 * ratio


def percent_points(predicted: float, measured: float) -> int:
    """Points for a percentage prediction: 3 within 10 points, 2 within 25, 1 within 50, else 0."""
    gap = abs(predicted - measured)
    return next((points for limit, points in PERCENT_BANDS if gap <= limit), 0)


def budget_answer(exercise: Exercise, runs: Mapping[int | None, RunResult]) -> int | None:
    """The fastest choice that fits: the largest every_n_layers whose resident memory is within the budget.

    Fewer checkpointed layers means fewer reruns, so among the settings that fit, the one
    with the largest ``every_n_layers`` is the fastest. ``None`` when none fits.
    """
    # Whole bytes: a byte count is within a fractional budget exactly when it is within its floor.
    budget = int(exercise.budget_fraction * memory_of(runs[None]).after_forward_bytes)
    fitting = [n for n in exercise.choices if fit(memory_of(runs[n]).after_forward_bytes, budget).fits]
    return max(fitting) if fitting else None


def measured_answer(exercise: Exercise, runs: Mapping[int | None, RunResult]) -> float | None:
    """The exercise's answer from measured runs: the percent of off, or the fastest every_n_layers that fits.

    ``None`` for a choice none of whose settings fits the budget. ``runs`` as :func:`evaluate` takes them.
    """
    if exercise.kind == "choice":
        answer = budget_answer(exercise, runs)
        return None if answer is None else float(answer)
    if exercise.kind == "kept":
        return kept_kib(runs[exercise.spec.every_n_layers])
    return percent_of_off(runs[exercise.spec.every_n_layers], runs[None], exercise.metric)


def explain(exercise: Exercise, runs: Mapping[int | None, RunResult], lang: str = "en") -> str:
    """The one line on why the measurement is what it is, from the measured numbers, in ``lang``."""
    if exercise.kind == "choice":
        return _explain_budget(exercise, runs, budget_answer(exercise, runs), lang)
    if exercise.kind == "kept":
        return _explain_kept(runs[exercise.spec.every_n_layers], lang)
    explain_metric = {"after_forward": _explain_resident, "peak": _explain_peak, "step": _explain_step}
    return explain_metric[exercise.metric](runs[exercise.spec.every_n_layers], runs[None], lang)


def time_judgement(exercise: Exercise, runs: Mapping[int | None, RunResult]) -> Judgement | None:
    """For a timed exercise, the lab's verdict on its step time against off (:func:`compare`); None for the others."""
    if exercise.metric != "step" or exercise.kind != "percent":
        return None
    return compare(runs[exercise.spec.every_n_layers], runs[None]).step.judgement


def too_busy_to_time(exercise: Exercise, runs: Mapping[int | None, RunResult]) -> bool:
    """True for a timed exercise whose runs the lab judged too busy to time (``TimingResult.too_busy``): its answer
    is not measurable on this machine now, and scores no points."""
    if exercise.metric != "step" or exercise.kind != "percent":
        return False
    return any(run.timing is not None and run.timing.too_busy for run in runs.values())


def evaluate(exercise: Exercise, predicted: float, runs: Mapping[int | None, RunResult], lang: str = "en") -> Outcome:
    """Score a prediction against measured runs and explain the gap.

    Args:
        exercise: the question.
        predicted: a percentage ("percent") or an every_n_layers ("choice").
        runs: measured results by every_n_layers, ``None`` for checkpointing off; must hold
            every spec of :meth:`Exercise.specs` and the off run.
        lang: language of the verdict and the explanation.

    Raises:
        SpecError: a needed run is missing or has no measurements.
    """
    check_runs(exercise, runs)
    measured = measured_answer(exercise, runs)
    if exercise.kind == "kept":
        return _evaluate_kept(exercise, predicted, runs, lang)
    if exercise.kind == "choice":
        answer = None if measured is None else int(measured)
        points = MAX_POINTS if answer is not None and int(predicted) == answer else 0
        verdict = t("verdict.right" if points else "verdict.wrong", lang, answer=answer if answer is not None else "-")
        return Outcome(predicted, float(answer or 0), points, verdict, explain(exercise, runs, lang))
    assert measured is not None  # a percent always has one
    if too_busy_to_time(exercise, runs):  # its time says more about the other work than about checkpointing
        return Outcome(predicted, measured, 0, t("verdict.busy", lang), explain(exercise, runs, lang), possible=0)
    points = percent_points(predicted, measured)
    gap = predicted - measured
    if abs(gap) <= PERCENT_BANDS[0][0]:
        verdict = t("verdict.close", lang, gap=number(abs(gap), ".0f", lang))
    else:
        verdict = t("verdict.high" if gap > 0 else "verdict.low", lang, gap=number(abs(gap), ".0f", lang))
    return Outcome(predicted, measured, points, verdict, explain(exercise, runs, lang))


def check_runs(exercise: Exercise, runs: Mapping[int | None, RunResult]) -> None:
    """Refuse runs that lack one the exercise needs, or its measurements.

    Raises:
        SpecError: naming the exercise and the every_n_layers missing.
    """
    needed = [spec.every_n_layers for spec in exercise.specs()] + [None]
    for n in needed:
        if n not in runs or runs[n].memory is None or runs[n].timing is None:
            raise SpecError(
                key="api.exercise_needs_run", exercise=repr(exercise.id), option=Option("every_n_layers", n)
            )


def kept_kib(run: RunResult) -> float:
    """KiB the run's selective policy kept in its CP layers (SAC's cache, observed in the memory step)."""
    return sum(layer.kept_bytes for layer in run.layers if layer.enabled == "CP") / 1024


def _evaluate_kept(exercise: Exercise, predicted: float, runs: Mapping[int | None, RunResult], lang: str) -> Outcome:
    """A prediction of the KiB kept, scored on its distance from the measurement as a share of it."""
    measured = kept_kib(runs[exercise.spec.every_n_layers])
    gap = 100.0 * (predicted - measured) / measured if measured else float("inf")
    points = percent_points(gap, 0.0) if measured else 0
    if abs(gap) <= PERCENT_BANDS[0][0]:
        verdict = t("selective.verdict_close", lang, gap=number(abs(gap), ".0f", lang))
    else:
        verdict = t(
            "selective.verdict_high" if gap > 0 else "selective.verdict_low", lang, gap=number(abs(gap), ".0f", lang)
        )
    return Outcome(predicted, measured, points, verdict, explain(exercise, runs, lang))


def _explain_kept(run: RunResult, lang: str) -> str:
    """What the CP layers' policy kept (KiB, ops) and what their rerun ran again or took from the cache."""
    measured = kept_kib(run)
    cp = [layer for layer in run.layers if layer.enabled == "CP"]
    ops = sorted({name for layer in cp for name in layer.kept_ops})
    rerun = sum(sum(layer.rerun_ops.values()) for layer in cp)
    reused = sum(sum(layer.reused_ops.values()) for layer in cp)
    return t(
        "selective.explain_kept",
        lang,
        layers=len(cp),
        per_layer=number(measured / max(len(cp), 1), ",.1f", lang),
        kib=number(measured, ",.1f", lang),
        ops=", ".join(ops) or "-",
        seq=run.spec.seq_len,
        rerun=number(rerun, ",", lang),
        reused=number(reused, ",", lang),
    )


def _explain_resident(run: RunResult, off: RunResult, lang: str) -> str:
    cp = [layer for layer in run.layers if layer.observed == "CP"]
    cp_off = sum(off.layers[layer.index].saved_bytes for layer in cp)
    kept = sum(layer.input_bytes for layer in cp)
    rest = max(memory_of(run).after_forward_bytes - kept, 0)
    # With every layer CP there are no keep layers to name among the rest.
    key = "explain.after_forward_all_cp" if len(cp) == len(run.layers) else "explain.after_forward"
    return t(key, lang, k=len(cp), kept=mib(kept, lang), off=mib(cp_off, lang), rest=mib(rest, lang))


def _explain_peak(run: RunResult, off: RunResult, lang: str) -> str:
    ratio = percent_of_off(run, off, "peak")
    memory, off_memory = memory_of(run), memory_of(off)
    point = next(p for p in memory.timeline if p.region_peak_bytes == memory.peak_bytes)
    where = event_label(point, lang)
    values = {
        "where": where,
        "seq": run.spec.seq_len,
        "off": mib(off_memory.peak_above_baseline_bytes, lang),
        "run": mib(memory.peak_above_baseline_bytes, lang),
        "grad": mib(point.region_peak_breakdown.get("gradient", 0), lang),
        "freed": mib(max(off_memory.after_forward_bytes - memory.after_forward_bytes, 0), lang),
    }
    return t("explain.peak_unmoved" if ratio >= 90 else "explain.peak_moved", lang, **values)


def _explain_step(run: RunResult, off: RunResult, lang: str) -> str:
    comparison = compare(run, off)
    (_, timing), (_, off_timing) = measurements(run), measurements(off)
    cp = sum(layer.observed == "CP" for layer in run.layers)
    key = "explain.step" if comparison.step.measurable else "explain.step_noise"  # results.judge_time's verdict
    return t(
        key,
        lang,
        k=cp,
        forward=number(timing.forward_s * 1000, ",.0f", lang),
        backward_off=number(off_timing.backward_s * 1000, ",.0f", lang),
        backward=number(timing.backward_s * 1000, ",.0f", lang),
        ratio=number(comparison.step_ratio * 100, ".0f", lang),
    )


def _explain_budget(exercise: Exercise, runs: Mapping[int | None, RunResult], answer: int | None, lang: str) -> str:
    budget = exercise.budget_fraction * memory_of(runs[None]).after_forward_bytes
    held = ", ".join(f"n={n}: {mib(memory_of(runs[n]).after_forward_bytes, lang)}" for n in exercise.choices)
    if answer is None:
        return t("explain.budget_none", lang, budget=mib(budget, lang), held=held)
    # The speed is said from the measured ranking beside it, never assumed: on a busy machine the chart can show
    # a setting with more reruns faster, and the words must not contradict the chart.
    fitting = [n for n in exercise.choices if fit(memory_of(runs[n]).after_forward_bytes, int(budget)).fits]
    fastest = min(fitting, key=lambda n: timing_of(runs[n]).step_s)
    ms = {n: number(timing_of(runs[n]).step_s * 1000, ",.0f", lang) for n in (answer, fastest)}
    if fastest == answer:
        speed = t("explain.budget_fastest", lang, n=answer, ms=ms[answer])
    else:
        speed = t("explain.budget_not_fastest", lang, n=answer, ms=ms[answer], other=fastest, other_ms=ms[fastest])
    return t("explain.budget", lang, budget=mib(budget, lang), held=held, n=answer) + " " + speed


def total_points(answers: Mapping[str, Outcome]) -> tuple[int, int]:
    """(points scored, points possible) over the exercises answered so far; one not measurable here counts in neither."""
    return sum(outcome.points for outcome in answers.values()), sum(outcome.possible for outcome in answers.values())
