"""Widget values no box sends, forged over the websocket: the page's one-line refusal, never a stack trace.

A browser's message carries each widget's value in a field of Streamlit's ``WidgetState`` proto; a person can put
anything there (a NaN for a number box, a number for a select box, a string for a list). These tests send such
messages through AppTest's own runner: the widget states the page's last run drew, with one value forged.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from ckptlab.lab import classroom, exercises
from tests.app.sessions import APP, open_page

pytestmark = pytest.mark.slow  # the app's pages

NAN = float("nan")
SECRET = "heron over the lake"


def forged(at: AppTest, key: str, field: str, value: object) -> AppTest:
    """Run ``at`` with the widget ``key``'s value sent in the proto field ``field`` as ``value``."""
    states = at._tree.get_widget_states()
    (widget,) = [widget for widget in states.widgets if widget.id.endswith("-" + key)]
    if field.endswith("_array_value"):
        getattr(widget, field).data[:] = value
    else:
        setattr(widget, field, value)
    return at._run(states)


def shown(at: AppTest) -> str:
    return "\n".join(str(element.value) for element in [*at.warning, *at.error])


def assert_refused(at: AppTest, key: str) -> None:
    assert not at.exception, [str(e.value) for e in at.exception]
    assert f"The value sent for {key} (" in shown(at), shown(at)


LAB_FORGERIES = [
    ("lab_model", "double_value", NAN),
    ("lab_model", "string_value", "no-such-model"),
    ("lab_seq", "double_value", NAN),  # int(nan) in Streamlit's own reading, before the page ran
    ("lab_seq", "string_value", "long"),
    ("lab_optimizer", "int_value", 3),
    ("lab_lora_targets", "string_value", "q_proj"),  # one value where the box holds a list
    ("lab_lora_targets", "double_value", NAN),
    ("lab_lora_rank", "double_value", NAN),
]


def test_forged_lab_widgets_are_refused_in_one_line_and_the_page_goes_on():
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["lora"] = "8"
    at.run()
    for key, field, value in LAB_FORGERIES:
        forged(at, key, field, value)
        assert_refused(at, key)
        assert at.button(key="lab_run") and not at.button(key="lab_run").disabled  # the last settings, runnable
    assert at.selectbox(key="lab_model").value == "tiny-llama" and at.number_input(key="lab_seq").value > 0


@pytest.fixture
def one_round(monkeypatch) -> classroom.Classroom:
    """A room with round 1 open on "resident_all", its runs not measured (the answers' path needs none)."""
    monkeypatch.setenv("CKPTLAB_INSTRUCTOR_SECRET", SECRET)
    monkeypatch.setattr(classroom, "check_runs", lambda exercise, runs: None)
    monkeypatch.setattr(classroom, "measured_answer", lambda exercise, runs: None)
    room = classroom.Classroom()
    room.open(exercises.by_id("resident_all"), {})
    monkeypatch.setattr(classroom, "ROOM", room)
    return room


def test_out_of_range_room_answers_are_refused_by_name_never_stored(one_round):
    at = open_page("pages/exercises.py")
    box = at.number_input(key="classroom_pred_1")
    for value, said in [(401, "401"), (-3, "-3"), (1e18, "1e+18"), (1e308, "1e+308"), (NAN, "None")]:
        box.set_value(value).run()  # the number as the websocket sends it: no bound of the box's clamps it first
        at.button(key="classroom_submit").click().run()
        assert not at.exception, [str(e.value) for e in at.exception]
        assert f"{said} was not counted: the answer to this question is a number from 0 to 400." in shown(at)
        assert one_round.current().count == 0
        box = at.number_input(key="classroom_pred_1")
    forged(at, "classroom_pred_1", "string_value", "forty")
    assert_refused(at, "classroom_pred_1")
    at.number_input(key="classroom_pred_1").set_value(40).run()
    at.button(key="classroom_submit").click().run()
    assert one_round.current().count == 1 and "was not counted" not in shown(at)


def test_a_forged_phrase_box_is_refused_in_one_line(one_round):
    at = open_page("pages/instructor.py")
    forged(at, "classroom_secret", "double_value", NAN)  # was compared as the phrase: AttributeError, a trace
    assert_refused(at, "classroom_secret")
    assert not at.button  # no instructor control for it
