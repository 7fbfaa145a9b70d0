"""Pages that draw at once: the Lesson's and the Timeline's first paint with 8 sessions opening them together.

It starts ``streamlit run app.py`` on 127.0.0.1 (headless, the default policy: jobs in worker
processes), lands one session on the app (its entry point, untimed: the server's first run
imports what every page needs), then for each page opens ``--sessions`` new sessions at
once (Streamlit's websocket protocol, ``tests/app/wire.py``; released together by a barrier,
one thread each) and times, for each session:

- first paint: from asking for the page to its title element arriving;
- filled: to its first figure (a Plotly chart) arriving. A waiting page's fragment reruns every
  second in a browser; a wire session has no fragment timer, so it asks for the page again
  each ``POLL_S`` seconds, as that timer would.

It prints the median and the most over the sessions against the goal (5 s to first paint),
and the machine's load average before and after.

    python benchmarks/first_paint.py [--sessions 8] [--warm]

``--warm`` starts the server with ``CKPTLAB_WARM_LEARN=1`` (the shared runs queued by the
first page opened). Exit code 0 when every first paint met the goal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.app.wire import Page, WireSession, serve  # noqa: E402  (after the path: run as a script)

GOAL_S = 5.0
POLL_S = 1.0  # as the Learn pages' fragment timer (pages/_learn_runs.py POLL_S)
HANG_S = 900.0  # a bound on one page run, and on a page's filling: turns a hang into a failure
PAGES = ("lesson", "timeline")


def open_together(url: str, page: str, sessions: int, fill: bool = True) -> list[tuple[float, float | None]]:
    """``sessions`` new sessions ask for ``page`` at once: each one's (first paint, filled) seconds.

    With ``fill`` False a session stops at its first paint (filled is None).
    """
    together = threading.Barrier(sessions)
    times: dict[int, tuple[float, float | None]] = {}
    errors: list[BaseException] = []

    def one(index: int) -> None:
        try:
            with WireSession(url, HANG_S) as session:
                together.wait(HANG_S)
                asked = time.monotonic()
                drawn = session.run(page)
                title = drawn.first("heading")  # st.title: the page's first heading
                if title is None:
                    raise RuntimeError(f"{page}: no title in the first run ({[kind for kind, _ in drawn.elements]})")
                if not fill:
                    times[index] = (title - asked, None)
                    return
                figure = _figure(drawn)
                while figure is None:
                    if time.monotonic() - asked > HANG_S:
                        raise RuntimeError(f"{page} did not fill in {HANG_S:.0f} s")
                    time.sleep(POLL_S)
                    figure = _figure(session.run(page))
                times[index] = (title - asked, figure - asked)
        except BaseException as error:  # reported by the caller
            errors.append(error)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [times[index] for index in range(sessions)]


def _figure(drawn: Page) -> float | None:
    return drawn.first("plotly_chart")


@dataclass(frozen=True)
class PaintFigures:
    """Per page, each session's (first paint, filled) seconds; the entry point's and the load around them."""

    sessions: int
    entry_s: float
    pages: dict[str, list[tuple[float, float | None]]]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    def paint(self, page: str) -> list[float]:
        return [times[0] for times in self.pages[page]]

    def filled(self, page: str) -> list[float]:
        return [times[1] for times in self.pages[page] if times[1] is not None]


def paint_figures(sessions: int = 8, warm: bool = False, fill: bool = True) -> PaintFigures:
    """Start the app and open each page of :data:`PAGES` from ``sessions`` new sessions at once."""
    before = os.getloadavg()
    pages = {}
    with serve("streamlit-first-paint.log", {"CKPTLAB_WARM_LEARN": "1" if warm else "0"}) as url:
        with WireSession(url, HANG_S) as landing:
            began = time.monotonic()
            landing.run()  # the entry point, once: the server's first run of any page
            entry = time.monotonic() - began
        for page in PAGES:
            pages[page] = open_together(url, page, sessions, fill)
    return PaintFigures(sessions, entry, pages, before, os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--warm", action="store_true", help="start the server with CKPTLAB_WARM_LEARN=1")
    args = parser.parse_args()
    figures = paint_figures(args.sessions, args.warm)
    before, after = figures.load_before, figures.load_after
    print(f"{args.sessions} sessions at once; load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}")
    print(f"entry point (the Lab page), one session, untimed in the figures: {figures.entry_s:.1f} s")
    met = True
    for page in PAGES:
        paint, filled = figures.paint(page), figures.filled(page)
        ok = max(paint) <= GOAL_S
        met &= ok
        print(
            f"{page:9s} first paint median {statistics.median(paint):5.2f} s, max {max(paint):5.2f} s "
            f"(goal {GOAL_S:g} s: {'met' if ok else 'MISSED'}); "
            f"filled median {statistics.median(filled):6.1f} s, max {max(filled):6.1f} s"
        )
    print(f"load average after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}; {os.cpu_count()} CPU cores")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
