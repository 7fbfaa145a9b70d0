"""The room counts only answers its boxes could send, and a session's wrong phrases make it wait longer each time."""

from __future__ import annotations

import pytest

from ckptlab.lab import classroom, exercises
from ckptlab.lab.server import PHRASE_DELAY_MAX_S, PhraseDelay


@pytest.fixture
def opened(monkeypatch):
    """A room with a round open on ``exercise_id``, its runs taken as given (the answers are what is checked)."""
    monkeypatch.setattr(classroom, "check_runs", lambda exercise, runs: None)
    monkeypatch.setattr(classroom, "measured_answer", lambda exercise, runs: 50.0)

    def room(exercise_id: str) -> classroom.Classroom:
        fresh = classroom.Classroom()
        fresh.open(exercises.by_id(exercise_id), {})
        return fresh

    return room


@pytest.mark.parametrize("value", [401, -3, 10**18, 1e308, -1e308, float("nan"), float("inf"), True, "50"])
def test_an_answer_outside_the_exercises_range_is_refused(opened, value):
    room = opened("resident_all")  # a percent: 0 to 400
    assert not room.answer(1, "ana", value)
    assert room.answer(1, "ana", 400) and room.current().count == 1


def test_a_choice_is_one_of_the_exercises_choices(opened):
    budget = exercises.by_id("budget")
    room = opened("budget")
    assert not room.answer(1, "ana", 5) and not room.answer(1, "ana", 2.5)
    assert room.answer(1, "ana", budget.choices[1])


def test_the_wait_after_a_wrong_phrase_doubles_and_is_capped():
    delay = PhraseDelay()
    assert delay.wait_s(100.0) == 0
    assert [delay.failed(100.0) for _ in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert delay.wait_s(100.0) == 8.0 and delay.wait_s(108.0) == 0
    for _ in range(100):
        delay.failed(0.0)
    assert delay.wait_s(0.0) == PHRASE_DELAY_MAX_S
    delay.passed()
    assert delay.wait_s(0.0) == 0 and delay.wrong == 0
