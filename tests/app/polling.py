"""Waiting for a page's background job in AppTest: on the job's thread, with no time limit a loaded machine can hit.

A page that runs a job (a sweep, a simulated table, a search) polls it from a fragment on a
timer; AppTest has no timer, so a test reruns the page itself. Between reruns it waits on
the job's own thread (``join``), which returns the moment the job ends. The only clock is
``HANG_S``, far beyond any honest run on a busy machine: it turns a hung job into a failure
instead of a CI run that never ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from streamlit.testing.v1 import AppTest

HANG_S = 1800.0
BETWEEN_RERUNS_S = 0.3  # a waiting rerun's pause, as the page's fragment timer (0.5 s) would


def rerun_until(at: AppTest, until: Callable[[AppTest], bool], job_key: str | None = None) -> AppTest:
    """Rerun ``at`` until ``until(at)``; between reruns, wait on the session's job ``job_key`` if it has one."""
    hung_at = time.monotonic() + HANG_S
    while not until(at):
        assert not at.exception, "\n".join(str(element.value) for element in at.exception)
        assert time.monotonic() < hung_at, f"the page's job did not end in {HANG_S:.0f} s: it hangs"
        job = at.session_state[job_key] if job_key is not None and job_key in at.session_state else None
        if job is not None:
            job.join(BETWEEN_RERUNS_S)  # returns at once when the job has ended
        else:
            time.sleep(BETWEEN_RERUNS_S)
        at.run()
    return at


def learned(at: AppTest) -> AppTest:
    """Rerun a Learn page until the server's shared runs it asked for are drawn (its progress bar gone).

    Each rerun is the one the page's fragment timer would make; between them the shared runs are measured on
    their own thread.
    """
    return rerun_until(at, lambda page: not page.get("progress"))
