"""The instructor's room with real sessions: one instructor and several participants, each an AppTest of the app.

The room is process-wide (``ckptlab.lab.classroom.ROOM``); each test gets a fresh one. The
sessions talk to it only through the pages: the instructor's page opens and closes a round,
every participant answers from the Exercises page. A page's fragment asks the room on a timer
that AppTest does not run, so a test reruns a session to refresh it.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.lab import classroom, exercises
from ckptlab.lab.run import reference_spec
from ckptlab.show import i18n
from tests.app.sessions import APP, TIMEOUT, assert_alive, open_page

pytestmark = pytest.mark.slow  # real measured runs and the app's pages

SECRET = "heron over the lake"


@pytest.fixture
def room(monkeypatch) -> classroom.Classroom:
    """A fresh room, an instructor's phrase set in the server's environment, jobs in the server's threads."""
    monkeypatch.setenv("CKPTLAB_INSTRUCTOR_SECRET", SECRET)
    monkeypatch.setenv("CKPTLAB_WORKERS", "thread")
    fresh = classroom.Classroom()
    monkeypatch.setattr(classroom, "ROOM", fresh)  # the pages import ROOM on each run
    return fresh


def instructor(lang: str = "en", secret: str = SECRET) -> AppTest:
    at = open_page("pages/instructor.py", lang)
    at.text_input(key="classroom_secret").input(secret).run()
    return at


def open_round(at: AppTest, exercise_id: str) -> None:
    at.selectbox(key="classroom_exercise").set_value(exercise_id).run()
    at.button(key="classroom_open").click().run()
    assert_alive(at)
    assert at.button(key="classroom_close")


def answer(at: AppTest, number: int, value: float) -> None:
    """Answer round ``number`` from a participant's page, refreshed first as its fragment's timer would."""
    at.run()
    key = f"classroom_pred_{number}"
    widget = at.number_input(key=key) if key in [w.key for w in at.number_input] else at.radio(key=key)
    widget.set_value(value).run()
    at.button(key="classroom_submit").click().run()
    assert_alive(at)


def keys(at: AppTest, kind: str) -> set[str]:
    return {element.proto.id.rsplit("-", 1)[-1] for element in at.get(kind)}


def chart(at: AppTest, key: str) -> dict:
    (found,) = [element for element in at.get("plotly_chart") if element.proto.id.endswith("-" + key)]
    return json.loads(found.proto.spec)


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def texts(at: AppTest, kind: str) -> str:
    return "\n".join(str(element.value) for element in getattr(at, kind))


def test_a_round_counts_each_session_once_and_shows_the_room_beside_the_run(room):
    teacher = instructor("en")
    open_round(teacher, "resident_all")
    langs, values = ["en", "pt-BR", "ja", "pt-BR"], [40, 60, 60, 120]
    class_ = [open_page("pages/exercises.py", lang) for lang in langs]
    for at, value in zip(class_, values):
        answer(at, 1, value)
    # Once sent, the button says so and is off: a second answer from the same session cannot be sent (one from a
    # second tab of the same person is not counted, and the page says so: test_two_tabs_of_one_signed_in_person...).
    sent = class_[0].button(key="classroom_submit")
    assert sent.disabled and sent.label == i18n.t("classroom.sent", "en")
    teacher.run()
    assert metric(teacher, i18n.t("classroom.answers", "en")) == str(len(values))
    # While the round is open nobody sees the answers, and no participant has the instructor's controls.
    assert room.current().answers == ()
    for at, lang in zip(class_, langs):
        at.run()
        assert "classroom_chart" not in keys(at, "plotly_chart")
        assert not {"classroom_close", "classroom_open"} & keys(at, "button")
        assert i18n.t("classroom.waiting", lang, count=len(values)) in texts(at, "info")

    teacher.button(key="classroom_close").click().run()
    assert_alive(teacher)
    exercise = exercises.by_id("resident_all")
    results = teacher.session_state["learn_results"]  # the instructor's one measurement for the room
    (spec,) = exercise.specs()
    expected = exercises.percent_of_off(results[spec], results[reference_spec(spec)], "after_forward")
    assert room.current().measured == expected
    histogram = chart(teacher, "instructor_chart")["data"][0]
    assert histogram["type"] == "histogram" and Counter(histogram["x"]) == Counter(float(v) for v in values)
    assert metric(teacher, i18n.t("classroom.measured", "en")) == f"{expected:,.0f}%"
    assert teacher.get("download_button")
    rows = classroom.round_csv(room.current()).splitlines()[1:]
    assert sorted(float(row.split(",")[4]) for row in rows) == sorted(values)
    for at, lang in zip(class_, langs):  # every participant sees the same room, in their language
        at.run()
        assert_alive(at)
        assert Counter(chart(at, "classroom_chart")["data"][0]["x"]) == Counter(float(v) for v in values)
        assert metric(at, i18n.t("classroom.measured", lang)) == f"{expected:,.0f}%"
        runs = {1: results[spec], None: results[reference_spec(spec)]}
        assert exercises.explain(exercise, runs, lang) in texts(at, "markdown")

    # The next round, timed: the same runs (no second measurement), and the verdict on the noise.
    open_round(teacher, "step_time")
    answer(class_[1], 2, 150)
    teacher.button(key="classroom_close").click().run()
    class_[1].run()
    judgement = exercises.time_judgement(exercises.by_id("step_time"), runs)
    verdict = i18n.t(f"noise.verdict_{judgement.value}", "pt-BR")
    assert i18n.t("classroom.noise", "pt-BR", verdict=verdict) in texts(class_[1], "caption")
    assert room.current().measured == exercises.percent_of_off(runs[1], runs[None], "step")


def test_a_choice_is_drawn_as_bars_whose_heights_are_the_answers(room):
    teacher = instructor("ja")
    open_round(teacher, "budget")
    picks = [1, 2, 2, 6, 3]
    class_ = [open_page("pages/exercises.py") for _ in picks]
    for at, value in zip(class_, picks):
        answer(at, 1, value)
    teacher.button(key="classroom_close").click().run()
    assert_alive(teacher)
    bars = chart(teacher, "instructor_chart")["data"][0]
    assert bars["type"] == "bar"
    exercise = exercises.by_id("budget")
    assert list(bars["y"]) == [Counter(picks)[n] for n in exercise.choices]
    runs = room.current().runs
    assert room.current().measured == exercises.budget_answer(exercise, runs)
    # A participant who has read the result hides it; the others still see it.
    class_[0].run()
    class_[0].button(key="classroom_hide").click().run()
    assert "classroom_chart" not in keys(class_[0], "plotly_chart")
    class_[1].run()
    assert list(chart(class_[1], "classroom_chart")["data"][0]["y"]) == list(bars["y"])


def test_two_tabs_of_one_signed_in_person_are_one_participant(room):
    teacher = instructor()
    open_round(teacher, "resident_all")
    tabs = []
    for _ in range(2):
        tab = AppTest.from_file(APP, default_timeout=TIMEOUT)
        tab.user = {"is_logged_in": True, "email": "ana@example.org"}
        tab.run()
        tab.switch_page("pages/exercises.py").run()
        tabs.append(tab)
    answer(tabs[0], 1, 40)
    answer(tabs[1], 1, 90)
    assert i18n.t("classroom.not_counted", "en") in texts(tabs[1], "warning")
    assert room.close(1).answers == (40.0,)


@pytest.mark.parametrize(
    "query",
    [{}, {"classroom_secret": SECRET}, {"secret": SECRET, "instructor": "1"}, {"classroom_close": "1"}],
)
def test_without_the_phrase_no_instructor_control_is_reachable(room, monkeypatch, query):
    # Without a phrase set, the page says how to set one and offers nothing, whatever the URL says.
    monkeypatch.delenv("CKPTLAB_INSTRUCTOR_SECRET")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for name, value in query.items():
        at.query_params[name] = value
    at.run()
    at.switch_page("pages/instructor.py").run()
    assert_alive(at)
    assert i18n.t("classroom.no_secret", "en") in texts(at, "info")
    assert not at.text_input and not keys(at, "button")
    # With one set, a wrong phrase (or the right one in the URL only) opens nothing either.
    monkeypatch.setenv("CKPTLAB_INSTRUCTOR_SECRET", SECRET)
    at.run()
    assert i18n.t("classroom.enter_secret", "en") in texts(at, "info") and not keys(at, "button")
    at.text_input(key="classroom_secret").input("heron over the lake ").run()
    assert i18n.t("classroom.wrong_secret", "en") in texts(at, "error")
    assert not keys(at, "button") and not at.selectbox
    assert room.current() is None


def test_a_participant_cannot_close_a_round_or_see_its_answers_before_it_closes(room):
    teacher = instructor()
    open_round(teacher, "resident_all")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["classroom_close"] = "1"
    at.run()
    at.switch_page("pages/exercises.py").run()
    answer(at, 1, 55)
    assert not {"classroom_close", "classroom_open"} & keys(at, "button")
    assert "classroom_chart" not in keys(at, "plotly_chart") and room.current().is_open
    at.switch_page("pages/instructor.py").run()  # the participant finds the instructor's page: a phrase to type
    assert not keys(at, "button") and room.current().is_open and room.current().answers == ()


def test_a_stale_instructor_tab_closes_only_the_round_it_showed(room):
    first, second = instructor(), instructor("pt-BR")
    open_round(first, "resident_all")
    second.run()  # shows round 1 open, with its close button
    first.button(key="classroom_close").click().run()
    open_round(first, "resident_all")  # round 2, on the runs already measured
    second.button(key="classroom_close").click().run()
    assert i18n.t("errors.classroom.not_current", "pt-BR", number=1) in texts(second, "error")
    assert room.current().number == 2 and room.current().is_open


def test_the_phrase_may_come_from_secrets_toml(room, monkeypatch):
    monkeypatch.delenv("CKPTLAB_INSTRUCTOR_SECRET")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.secrets["CKPTLAB_INSTRUCTOR_SECRET"] = "from secrets.toml"
    at.run()
    at.switch_page("pages/instructor.py").run()
    at.text_input(key="classroom_secret").input("from secrets.toml").run()
    assert_alive(at)
    assert at.button(key="classroom_open") and at.selectbox(key="classroom_exercise")
