"""The instructor's room as a store: one answer a participant, answers hidden until the round closes, nothing named."""

from __future__ import annotations

import csv
import io

import pytest

from ckptlab.errors import SpecError
from ckptlab.lab import exercises
from ckptlab.lab.classroom import Classroom, round_csv
from ckptlab.lab.server import ServerPolicy, policy_from_environment


def _runs(measured, exercise):
    runs = {n.every_n_layers: measured(every_n_layers=n.every_n_layers, repeats=3) for n in exercise.specs()}
    runs[None] = measured(every_n_layers=None, repeats=3)
    return runs


def test_a_round_counts_each_participant_once_and_shows_the_answers_only_once_closed(measured):
    exercise = exercises.by_id("resident_all")
    runs = _runs(measured, exercise)
    room = Classroom()
    assert room.current() is None
    opened = room.open(exercise, runs)
    assert opened.is_open and opened.number == 1 and opened.count == 0
    assert opened.measured == exercises.percent_of_off(runs[1], runs[None], "after_forward")
    assert room.answer(1, "ana", 40) and room.answer(1, "bo", 60)
    assert not room.answer(1, "ana", 90)  # a second answer from the same participant
    assert not room.answer(2, "cy", 50)  # a round that is not the current one
    assert not room.answer(1, "cy", float("nan"))
    now = room.current()
    assert now is not None and now.count == 2 and now.answers == ()  # hidden while open
    with pytest.raises(SpecError, match="still open"):
        round_csv(now)
    with pytest.raises(SpecError, match="still open"):
        room.open(exercise, runs)
    closed = room.close(1)
    assert not closed.is_open and closed.answers == (40.0, 60.0)
    assert not room.answer(1, "cy", 50)  # closed: no more answers
    rows = list(csv.DictReader(io.StringIO(round_csv(closed))))
    assert [row["prediction"] for row in rows] == ["40", "60"]
    assert {row["exercise"] for row in rows} == {"resident_all"}
    assert all("ana" not in value and "bo" not in value for row in rows for value in row.values())  # anonymous
    assert room.open(exercise, runs).number == 2  # the next round replaces the closed one
    with pytest.raises(SpecError, match="not the current round"):
        room.close(1)


def test_a_round_needs_the_exercise_s_measured_runs(measured):
    exercise = exercises.by_id("budget")
    with pytest.raises(SpecError, match="every_n_layers=2"):
        Classroom().open(exercise, {1: measured(every_n_layers=1), None: measured(every_n_layers=None)})


def test_the_instructor_s_phrase_opens_the_room_only_when_set_and_typed_exactly(monkeypatch):
    assert not ServerPolicy().has_instructor and not ServerPolicy().is_instructor("")
    policy = ServerPolicy(instructor_secret="blue heron")
    assert policy.has_instructor and policy.is_instructor("blue heron")
    assert not any(policy.is_instructor(typed) for typed in ("", "blue", "blue heron ", "Blue heron"))
    assert "blue heron" not in repr(policy)  # never in a log line
    monkeypatch.delenv("CKPTLAB_INSTRUCTOR_SECRET", raising=False)
    assert policy_from_environment({"CKPTLAB_INSTRUCTOR_SECRET": "from secrets.toml"}).is_instructor(
        "from secrets.toml"
    )
    monkeypatch.setenv("CKPTLAB_INSTRUCTOR_SECRET", "from the environment")
    assert policy_from_environment({"CKPTLAB_INSTRUCTOR_SECRET": "x"}).is_instructor("from the environment")
    monkeypatch.setenv("CKPTLAB_INSTRUCTOR_SECRET", "")  # set but empty: no room, not a room anyone opens with ""
    assert not policy_from_environment({}).has_instructor
