"""Forty participants answer the room's round within a second on a real server: every answer is counted, once.

`streamlit run app.py` on 127.0.0.1 and forty real sessions of it, each a websocket that speaks
Streamlit's own protocol (``tests/app/wire.py``), as forty browser tabs would: each opens the
Exercises page and types its prediction, then all forty press the button together, released at
once by a barrier, each in its own thread, and the server runs forty scripts at once against
its one room. The instructor is a forty-first session. The test waits on the sessions' replies
(a generous bound turns a hang into a failure), never on a clock.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from contextlib import ExitStack

import pytest

from tests.app.wire import serve

pytest.importorskip("websockets.sync.client", reason="websockets (a dependency of streamlit) is missing")
from tests.app.wire import WireSession

pytestmark = pytest.mark.slow  # a server, forty sessions and a measured run

SECRET = "forty at once"
PARTICIPANTS = 40
HANG_S = 600.0  # a bound on any one reply: far beyond a measured run and forty page runs on 2 busy cores


def test_forty_sessions_answering_together_are_all_counted():
    env = {"CKPTLAB_INSTRUCTOR_SECRET": SECRET, "CKPTLAB_WORKERS": "thread"}
    with serve("streamlit-classroom-forty.log", env) as url, ExitStack() as sessions_open:
        teacher = sessions_open.enter_context(WireSession(url, HANG_S))
        teacher.run()  # the entry point first, once on this server: app.py's navigation names the pages
        teacher.run("instructor")
        phrase = {"classroom_secret": SECRET}
        assert teacher.run("instructor", phrase).keyed("button", "classroom_open") is not None
        opened = teacher.run("instructor", phrase, press="classroom_open")  # measures, then opens round 1
        assert opened.keyed("button", "classroom_close") is not None, [e for k, e in opened.elements if k == "alert"]

        values = [5 * (index % 17) for index in range(PARTICIPANTS)]  # 0..80 in steps of 5, repeated
        sessions = []
        for value in values:
            participant = sessions_open.enter_context(WireSession(url, HANG_S))
            assert participant.run("exercises").keyed("button", "classroom_submit") is not None
            participant.run("exercises", {"classroom_pred_1": value})
            sessions.append(participant)

        together = threading.Barrier(PARTICIPANTS)
        replies: dict[int, object] = {}

        def press(index: int) -> None:
            try:
                together.wait(HANG_S)
                replies[index] = sessions[index].run(
                    "exercises", {"classroom_pred_1": values[index]}, "classroom_submit"
                )
            except BaseException as error:  # reported by the main thread
                replies[index] = error

        threads = [threading.Thread(target=press, args=(index,)) for index in range(PARTICIPANTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_S)
        assert not any(thread.is_alive() for thread in threads), "a session's answer hangs"
        for index, reply in sorted(replies.items()):
            assert not isinstance(reply, BaseException), (index, reply)
            captions = [element.body for element in reply.of("markdown")]
            assert f"Your answer: {values[index]}" in captions, (index, captions)
            assert not reply.of("exception") and not [a for a in reply.of("alert") if "not counted" in a.body]
        assert len(replies) == PARTICIPANTS

        counted = teacher.run("instructor", phrase)
        (answered,) = [m for m in counted.of("metric") if m.label == "Participants who answered"]
        assert answered.body == str(PARTICIPANTS)
        closed = teacher.run("instructor", phrase, press="classroom_close")
        figure = json.loads(closed.keyed("plotly_chart", "instructor_chart").spec)
        assert Counter(figure["data"][0]["x"]) == Counter(float(v) for v in values)
