"""The Exercises page's picker after an answer: *Next* with the label the browser still holds (cheap: no run).

A real browser keeps the label it drew and sends it back as the select box's value; once an exercise was
answered, a label that changed (the old " ✓") was no longer among the options, Streamlit handed the
callback that string, and *Next* raised ``ValueError: '1. ★ …' is not in list``. The measured outcome is
stubbed: the page's picker is what is proven here, not the run.
"""

from __future__ import annotations

import pytest

from ckptlab.lab import lesson_view
from ckptlab.lab.exercises import Outcome
from pages._room import IDS, exercise_label, picked_id
from tests.app.sessions import assert_alive, open_page


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_next_after_an_answer_takes_the_label_the_browser_kept(lang, monkeypatch):
    first = IDS[0]
    answered = {first: Outcome(predicted=40.0, measured=42.0, points=3, verdict="", explanation="")}
    monkeypatch.setattr(lesson_view, "outcomes", lambda *args: answered)  # the first exercise answered and measured
    at = open_page("pages/exercises.py", lang, timeout=30)
    pick = at.selectbox(key="exercise_pick")
    kept = exercise_label(first, lang)  # the label the browser drew before the answer
    if kept not in pick.options:
        pick.options.append(kept)  # today's page relabels an answered exercise: the browser still sends the old one
    pick.set_value(kept)
    at.button(key="exercise_next").click().run()
    assert_alive(at)
    assert at.selectbox(key="exercise_pick").value == IDS[1]
    assert at.session_state["exercise_pick"] == IDS[1]


def test_a_label_the_picker_no_longer_shows_still_names_its_exercise():
    third = exercise_label(IDS[2], "pt-BR") + " ✓"  # a label from another render, in another language
    assert picked_id(third) == IDS[2]
    assert picked_id(IDS[4]) == IDS[4]
    assert picked_id("no such label") == IDS[0]


def test_during_a_round_the_rooms_box_is_the_only_answer_box(measured, monkeypatch):
    """While the instructor's round is open the page leaves out its own copy of the exercises (an answer there
    never reached the room); once the round closes they come back. Runs from the session's measured ones."""
    from ckptlab.lab import classroom
    from ckptlab.lab.exercises import by_id

    room = classroom.Classroom()
    monkeypatch.setattr(classroom, "ROOM", room)
    exercise = by_id("resident_all")
    runs = {n: measured(every_n_layers=n) for n in (1, None)}
    room.open(exercise, runs)
    at = open_page("pages/exercises.py", "en", timeout=60)
    buttons = {button.key for button in at.button}
    assert "classroom_submit" in buttons and "exercise_submit" not in buttons and "exercise_next" not in buttons
    room.close(room.current().number)
    at.run()
    assert_alive(at)
    assert "exercise_submit" in {button.key for button in at.button}
