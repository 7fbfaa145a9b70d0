"""Forty participants answer the room's round within a second: every answer is counted, once.

Forty real sessions (AppTest instances of the app, each its own session state and so its own
participant) open the Exercises page and type their prediction; then all forty press the
button together, from forty threads released at once by a barrier. The test waits on the
threads (a generous bound turns a hang into a failure), never on a clock.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from streamlit.runtime.scriptrunner.script_cache import ScriptCache
from streamlit.testing.v1 import AppTest

from ckptlab.lab import classroom
from ckptlab.show import i18n

pytestmark = pytest.mark.slow  # forty sessions of the app and a measured run

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 300
SECRET = "forty at once"
PARTICIPANTS = 40
HANG_S = 600.0  # far beyond forty page runs on 2 busy cores: only a hang reaches it


def test_forty_sessions_answering_together_are_all_counted(monkeypatch):
    monkeypatch.setenv("CKPTLAB_INSTRUCTOR_SECRET", SECRET)
    monkeypatch.setenv("CKPTLAB_WORKERS", "thread")
    room = classroom.Classroom()
    monkeypatch.setattr(classroom, "ROOM", room)
    # One script cache for every session, as a real server has: AppTest compiles the pages again on each run,
    # and forty runs compiling at once break CPython 3.11's compiler ("AST constructor recursion depth mismatch").
    shared = ScriptCache()
    monkeypatch.setattr("streamlit.testing.v1.app_test.ScriptCache", lambda: shared)
    teacher = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    teacher.switch_page("pages/instructor.py").run()
    teacher.text_input(key="classroom_secret").input(SECRET).run()
    teacher.selectbox(key="classroom_exercise").set_value("resident_half").run()
    teacher.button(key="classroom_open").click().run()
    assert not teacher.exception and teacher.button(key="classroom_close")

    values = [5 * (index % 17) for index in range(PARTICIPANTS)]  # 0..80 in steps of 5, repeated
    sessions = []
    for value in values:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        at.switch_page("pages/exercises.py").run()
        at.number_input(key="classroom_pred_1").set_value(value).run()
        sessions.append(at)

    together = threading.Barrier(PARTICIPANTS)
    failures: list[BaseException] = []

    def press(at: AppTest) -> None:
        try:
            together.wait(HANG_S)
            at.button(key="classroom_submit").click().run()
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=press, args=(at,)) for at in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_S)
    assert not any(thread.is_alive() for thread in threads), "a session's answer hangs"
    assert not failures, failures
    for at in sessions:
        assert not at.exception and not at.warning, [str(e.value) for e in (*at.exception, *at.warning)]

    assert room.current().count == PARTICIPANTS
    teacher.run()
    assert next(m.value for m in teacher.metric if m.label == i18n.t("classroom.answers", "en")) == str(PARTICIPANTS)
    teacher.button(key="classroom_close").click().run()
    (figure,) = [c for c in teacher.get("plotly_chart") if c.proto.id.endswith("-instructor_chart")]
    assert Counter(json.loads(figure.proto.spec)["data"][0]["x"]) == Counter(float(v) for v in values)
