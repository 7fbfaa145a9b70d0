"""Exercises: scoring, the measured answer and the one-line explanation of the gap."""

from __future__ import annotations

import pytest

from ckptlab.errors import SpecError
from ckptlab.lab import exercises
from ckptlab.show import i18n


def _runs(measured, exercise):
    runs = {
        spec.every_n_layers: measured(every_n_layers=spec.every_n_layers, seq_len=spec.seq_len)
        for spec in exercise.specs()
    }
    runs[None] = measured(every_n_layers=None, seq_len=exercise.spec.seq_len)
    return runs


def test_points_by_distance():
    assert [exercises.percent_points(50, m) for m in (55, 70, 95, 150)] == [3, 2, 1, 0]


def test_exercises_grow_in_difficulty_and_have_words_in_every_language():
    levels = [exercise.level for exercise in exercises.EXERCISES]
    assert levels == sorted(levels) and len(set(levels)) == 3
    for exercise in exercises.EXERCISES:
        for lang in i18n.LANGUAGES:
            assert i18n.t(f"exercise.{exercise.id}.question", lang, **exercise.question_values())
    with pytest.raises(SpecError):
        exercises.by_id("nope")


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_resident_prediction_beside_the_measurement(measured, lang):
    exercise = exercises.by_id("resident_all")
    runs = _runs(measured, exercise)
    outcome = exercises.evaluate(exercise, 50, runs, lang)
    expected = 100 * runs[1].memory.after_forward_bytes / runs[None].memory.after_forward_bytes
    assert outcome.measured == pytest.approx(expected)
    assert outcome.points == exercises.percent_points(50, expected)
    assert outcome.verdict and outcome.explanation and "MiB" in outcome.explanation
    # every_n_layers=1: every layer is CP, so the explanation names no keep layers among the rest (the words of
    # every language call them "keep"); at every_n_layers=2 it does.
    assert "keep" not in outcome.explanation
    half = exercises.by_id("resident_half")
    assert "keep" in exercises.evaluate(half, 50, _runs(measured, half), lang).explanation
    close = exercises.evaluate(exercise, expected, runs, lang)
    assert close.points == exercises.MAX_POINTS and close.verdict == i18n.t("verdict.close", lang, gap="0")


def test_peak_at_a_short_sequence_is_explained_from_where_it_is(measured):
    exercise = exercises.by_id("peak_short")
    runs = _runs(measured, exercise)
    outcome = exercises.evaluate(exercise, 40, runs, "en")
    assert outcome.measured > 90  # at 128 tokens the gradients hold the peak: checkpointing does not lower it
    assert "cannot lower it" in outcome.explanation and outcome.verdict.endswith("below the measurement.")


def test_the_budget_answer_is_the_largest_n_that_fits(measured):
    exercise = exercises.by_id("budget")
    runs = _runs(measured, exercise)
    answer = exercises.budget_answer(exercise, runs)
    budget = exercise.budget_fraction * runs[None].memory.after_forward_bytes
    assert runs[answer].memory.after_forward_bytes <= budget
    assert all(runs[n].memory.after_forward_bytes > budget for n in exercise.choices if n > answer)
    assert exercises.evaluate(exercise, answer, runs, "ja").points == exercises.MAX_POINTS
    wrong = exercises.evaluate(exercise, 6 if answer != 6 else 1, runs, "pt-BR")
    assert wrong.points == 0 and f"every_n_layers={answer}" in wrong.verdict
    assert exercises.total_points({"a": wrong}) == (0, exercises.MAX_POINTS)


def test_the_exercises_and_the_lessons_on_activations_run_forward_and_backward_only():
    """Their figures and expected answers are about activations alone: no optimizer step in their runs."""
    assert exercises.QUICK.optimizer == exercises.LONG.optimizer == "none"
    assert all(spec.optimizer == "none" for exercise in exercises.EXERCISES for spec in exercise.specs())


def test_the_kept_bytes_exercise_scores_on_the_share_of_the_measurement(measured):
    exercise = exercises.by_id("keep_attention")
    run = measured(every_n_layers=1, selective="attention")
    runs = {1: run, None: measured(every_n_layers=None)}
    kib = sum(layer.kept_bytes for layer in run.layers if layer.enabled == "CP") / 1024
    assert kib > 0
    exact = exercises.evaluate(exercise, kib, runs)
    assert exact.measured == kib and exact.points == exercises.MAX_POINTS and exact.verdict.startswith("Close: 0%")
    high = exercises.evaluate(exercise, kib * 1.3, runs)
    assert high.points == 1 and high.verdict == "30% above the measurement."
    assert f"{kib:,.1f} KiB in all" in high.explanation
    # What the instructor's room shows for it: the same answer and explanation, no timed verdict.
    assert exercises.measured_answer(exercise, runs) == kib
    assert exercises.explain(exercise, runs) == high.explanation and exercises.time_judgement(exercise, runs) is None
    # The question's shape is the model's: tiny-llama, 6 layers of 6 heads of 64.
    values = exercise.question_values()
    assert (values["layers"], values["heads"], values["head_dim"], values["cp"]) == (6, 6, 64, 6)


def _timed(run, **machine):
    """``run`` as if timed on a machine with ``machine`` (load_average, cores, shared_cores)."""
    from dataclasses import replace

    return replace(run, timing=replace(run.timing, **machine))


@pytest.mark.parametrize("lang", list(i18n.LANGUAGES))
def test_a_timed_exercise_on_a_machine_too_busy_to_time_scores_nothing_and_says_why(measured, lang):
    exercise = exercises.by_id("step_time")
    runs = _runs(measured, exercise)
    idle = {n: _timed(run, load_average=0.1, cores=64, shared_cores=False) for n, run in runs.items()}
    busy = {**idle, 1: _timed(idle[1], load_average=99.0)}  # more tasks waiting than cores
    answer = exercises.measured_answer(exercise, idle)
    assert exercises.evaluate(exercise, answer, idle, lang).points > 0 or any(
        run.timing.too_busy
        for run in idle.values()  # identical steps that differed too much: busy anyway
    )
    outcome = exercises.evaluate(exercise, answer, busy, lang)
    assert outcome.points == 0 and outcome.verdict == i18n.t("verdict.busy", lang)
    # "scores no points" holds in the total too: the busy answer adds nothing to the points possible
    assert exercises.total_points({"busy": outcome}) == (0, 0)
    assert exercises.too_busy_to_time(exercise, busy) and not exercises.too_busy_to_time(
        exercises.by_id("resident_all"), busy
    )  # memory is unaffected by a busy machine


def test_the_budget_explanation_says_the_speed_the_chart_shows(measured):
    """Exercise 6's words come from the measured ranking: when a setting with more reruns was measured faster (a
    busy machine), the explanation says so instead of "fastest" beside a chart that shows otherwise."""
    from dataclasses import replace

    exercise = exercises.by_id("budget")
    runs = _runs(measured, exercise)
    answer = exercises.budget_answer(exercise, runs)
    fitting = [n for n in exercise.choices if n <= answer]
    assert len(fitting) > 1  # a setting with more reruns fits too: there is a ranking to say

    def step_ms(run, ms):
        return replace(run, timing=replace(run.timing, step_s=ms / 1000))

    slow = {**runs, answer: step_ms(runs[answer], 762), fitting[0]: step_ms(runs[fitting[0]], 397)}
    text = exercises.explain(exercise, slow, "en")
    assert "was not the fastest: 762 ms" in text and f"397 ms for every_n_layers={fitting[0]}" in text
    fast = {**runs, **{n: step_ms(runs[n], 900 - 100 * i) for i, n in enumerate(fitting)}}
    assert exercises.explain(exercise, fast, "en").endswith(
        f"the fastest that fits: {900 - 100 * (len(fitting) - 1)} ms a step."
    )
