"""``python -m ckptlab``'s own process: no collection while it imports, and an end without the interpreter's teardown
(issue 61: together about a sixth of a plain ``simulate`` process's CPU seconds)."""

from __future__ import annotations

import atexit
import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ckptlab.cli import end_process
from ckptlab.torchstate import freeze_what_is_loaded, pause_collection

ROOT = Path(__file__).resolve().parents[2]

# A process that ends through end_process: an object whose finalizer says when the interpreter tears it down, an
# atexit handler, and an answer left in stdout's buffer (block-buffered: the pipe, PYTHONUNBUFFERED unset).
ENDS = """
import atexit, os, sys
from ckptlab.cli import end_process
class Witness:
    def __del__(self, write=os.write):
        write(2, b"torn down")
witness = Witness()
atexit.register(print, "atexit ran")
sys.stdout.write("answer, ")
end_process(3)
"""


def _python(code: str, *argv: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_command_ends_after_its_handlers_and_its_output_without_the_teardown():
    done = _python(ENDS)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "answer, atexit ran\n"  # the buffer flushed after the handlers, as Python's own exit does
    assert "torn down" not in done.stderr, "the interpreter tore down what the process loaded"
    # The witness does speak at an ordinary exit: its silence above is the skipped teardown.
    ordinary = _python(ENDS.replace("end_process(3)", "sys.exit(3)"))
    assert (ordinary.returncode, ordinary.stderr) == (3, "torn down")


def test_a_thread_still_running_gets_the_ordinary_exit(monkeypatch):
    """Python waits for a thread that is not a daemon before it exits; ``os._exit`` would cut it off."""

    class Ended(Exception):
        pass

    def cut(status: int) -> None:
        raise Ended(status)

    handlers: list[bool] = []
    monkeypatch.setattr(os, "_exit", cut)
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: handlers.append(True))
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(SystemExit) as exit_:
            end_process(3)
    finally:
        release.set()
        worker.join()
    assert exit_.value.code == 3 and handlers == []


# `python -m ckptlab` run as it is, watched from the start: whether the collector runs as the lab's CLI starts to
# load, and how many collections the command made from there to its end (`models` loads no core: with the collector
# paused, none; the package's own `__init__` loads before `__main__` can pause it).
WATCHED = """
import atexit, gc, json, runpy, sys
count = [0]
gc.callbacks.append(lambda phase, info: count.__setitem__(0, count[0] + (phase == "start")))
seen = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "ckptlab.cli":
            seen.update(collector_on_as_the_cli_loads=gc.isenabled(), before=count[0])
        return None
sys.meta_path.insert(0, Watch())
atexit.register(lambda: print(json.dumps({**seen, "collections_since": count[0] - seen["before"]}), file=sys.stderr))
sys.argv = ["ckptlab", *sys.argv[1:]]
runpy.run_module("ckptlab", run_name="__main__", alter_sys=True)
"""


def test_the_command_collects_nothing_while_it_imports():
    done = _python(WATCHED, "models", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["name"]
    seen = json.loads(done.stderr.strip().splitlines()[-1])
    assert (seen["collector_on_as_the_cli_loads"], seen["collections_since"]) == (False, 0)


def test_freezing_what_is_loaded_collects_again_after_the_pause(monkeypatch):
    """The CLI's ``core_loaded`` freezes after the core's imports: from there on, steps are collected as before."""
    monkeypatch.setattr(gc, "freeze", lambda: None)  # this test process keeps what it has where it is
    was_on = gc.isenabled()
    try:
        pause_collection()
        assert not gc.isenabled()
        freeze_what_is_loaded()
        assert gc.isenabled()
    finally:
        (gc.enable if was_on else gc.disable)()
