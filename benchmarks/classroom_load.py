"""Participants answer the room's round together on a real server: every answer is counted, once.

`streamlit run app.py` on 127.0.0.1 and ``--participants`` real sessions of it (forty by default), each a websocket
that speaks Streamlit's own protocol (``tests/app/wire.py``), as browser tabs would: each opens the Exercises page and
types its prediction, then all press the button together, released at once by a barrier, each in its own thread, and
the server runs their scripts at once against its one room. The instructor is one more session. It waits on the
sessions' replies (a generous bound turns a hang into a failure), never on a clock.

    python benchmarks/classroom_load.py [--participants 40]

``tests/app/test_classroom_load.py`` runs it with three participants. Exit code 0 when every answer was counted once.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.app.wire import WireSession, serve

SECRET = "forty at once"
HANG_S = 600.0  # a bound on any one reply: far beyond a measured run and forty page runs on 2 busy cores


def answer_together(participants: int) -> float:
    """``participants`` sessions answer one round at once; every check a failed ``assert``. Returns the seconds
    from the barrier's release to the last reply."""
    env = {"CKPTLAB_INSTRUCTOR_SECRET": SECRET, "CKPTLAB_WORKERS": "thread"}
    with serve("streamlit-classroom-load.log", env) as url, ExitStack() as sessions_open:
        teacher = sessions_open.enter_context(WireSession(url, HANG_S))
        teacher.run()  # the entry point first, once on this server: app.py's navigation names the pages
        teacher.run("instructor")
        phrase = {"classroom_secret": SECRET}
        assert teacher.run("instructor", phrase).keyed("button", "classroom_open") is not None
        opened = teacher.run("instructor", phrase, press="classroom_open")  # measures, then opens round 1
        assert opened.keyed("button", "classroom_close") is not None, [e for k, e in opened.elements if k == "alert"]

        values = [5 * (index % 17) for index in range(participants)]  # 0..80 in steps of 5, repeated
        sessions = []
        for value in values:
            participant = sessions_open.enter_context(WireSession(url, HANG_S))
            assert participant.run("exercises").keyed("button", "classroom_submit") is not None
            participant.run("exercises", {"classroom_pred_1": value})
            sessions.append(participant)

        together = threading.Barrier(participants)
        replies: dict[int, object] = {}

        def press(index: int) -> None:
            try:
                together.wait(HANG_S)
                replies[index] = sessions[index].run(
                    "exercises", {"classroom_pred_1": values[index]}, "classroom_submit"
                )
            except BaseException as error:  # reported by the main thread
                replies[index] = error

        started = time.monotonic()
        threads = [threading.Thread(target=press, args=(index,)) for index in range(participants)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_S)
        answered_s = time.monotonic() - started
        assert not any(thread.is_alive() for thread in threads), "a session's answer hangs"
        for index, reply in sorted(replies.items()):
            assert not isinstance(reply, BaseException), (index, reply)
            captions = [element.body for element in reply.of("markdown")]
            assert f"Your answer: {values[index]}" in captions, (index, captions)
            assert not reply.of("exception") and not [a for a in reply.of("alert") if "not counted" in a.body]
        assert len(replies) == participants

        counted = teacher.run("instructor", phrase)
        (answered,) = [m for m in counted.of("metric") if m.label == "Participants who answered"]
        assert answered.body == str(participants)
        closed = teacher.run("instructor", phrase, press="classroom_close")
        figure = json.loads(closed.keyed("plotly_chart", "instructor_chart").spec)
        assert Counter(figure["data"][0]["x"]) == Counter(float(v) for v in values)
    return answered_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=40, help="sessions answering at once (default 40)")
    args = parser.parse_args()
    seconds = answer_together(args.participants)
    print(
        f"{args.participants} participants answered together: all counted once, the last reply {seconds:.1f} s after the release"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
