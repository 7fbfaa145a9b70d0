"""A browser session without the browser: Streamlit's own websocket protocol, spoken to a `streamlit run` server.

Streamlit's frontend talks to the server through one websocket (``/_stcore/stream``) of
protobuf messages: it sends a ``BackMsg`` asking for a run with its widgets' values
(``ClientState``), the server runs the page in that session and sends ``ForwardMsg`` deltas
back until ``script_finished``. :class:`WireSession` does the same, so a test can hold dozens
of real sessions of a real server where dozens of Chromium tabs would not fit on 2 cores.
Only what the tests need: keyed widgets found by their key, numbers, text, and button presses,
and when each element came (``benchmarks/first_paint.py`` times a page's first paint with it).
:func:`serve` starts the server they talk to.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ClientState_pb2 import ClientState
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[2]
# Debian's Chromium (apt-get install chromium), driven by playwright without a browser download.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# How long a browser test waits for what the page must show: a guard against a hang, never a measure of speed
# (a test waits on the event; on 2 cores shared with other work a measured run took minutes).
HANG_MS = 300_000
EARLY_FOR_RERUN = ForwardMsg.ScriptFinishedStatus.Value("FINISHED_EARLY_FOR_RERUN")


@dataclass
class Page:
    """What one run drew: its elements by type, in order, and the ids of its keyed widgets by key."""

    elements: list[tuple[str, Any]] = field(default_factory=list)  # (element type, its proto)
    arrived: list[float] = field(default_factory=list)  # time.monotonic() when each element came, as ``elements``
    widget_ids: dict[str, str] = field(default_factory=dict)  # user key -> widget id ("$$ID-<hash>-<key>")
    pages: dict[str, str] = field(default_factory=dict)  # url path -> page script hash (from a navigation message)

    def of(self, kind: str) -> list[Any]:
        return [element for name, element in self.elements if name == kind]

    def first(self, kind: str) -> float | None:
        """When the first element of ``kind`` came (``time.monotonic()``), or None when none did."""
        return next((at for (name, _), at in zip(self.elements, self.arrived) if name == kind), None)

    def keyed(self, kind: str, key: str) -> Any | None:
        return next((e for e in self.of(kind) if getattr(e, "id", "").endswith("-" + key)), None)


class WireSession:
    """One session of the server at ``url`` (``http://127.0.0.1:port``), as its websocket sees it; a context manager
    (the websocket is open inside its ``with``)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self._address = url.replace("http://", "ws://") + "/_stcore/stream"
        self._timeout_s = timeout_s  # a bound on one run: generous, so only a hang reaches it
        self._open = ExitStack()
        self.widget_ids: dict[str, str] = {}
        self.pages: dict[str, str] = {}

    def __enter__(self) -> WireSession:
        self._socket = self._open.enter_context(connect(self._address, subprotocols=["streamlit"], max_size=None))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._open.close()

    def run(self, page: str = "", values: dict[str, Any] | None = None, press: str | None = None) -> Page:
        """Ask for a run of ``page`` (its url path; "" the default) with keyed widgets' ``values``, pressing ``press``.

        Values go in as the frontend sends them: ``str`` as text, ``bool`` as a toggle, ``int`` and ``float`` as
        numbers. Keys are resolved to widget ids from earlier runs.
        """
        states = []
        for key, value in (values or {}).items():
            state = WidgetState(id=self.widget_ids[key])
            if isinstance(value, str):
                state.string_value = value
            elif isinstance(value, bool):
                state.bool_value = value
            elif isinstance(value, int):
                state.int_value = value
            else:
                state.double_value = float(value)
            states.append(state)
        if press is not None:
            states.append(WidgetState(id=self.widget_ids[press], trigger_value=True))
        client = ClientState(query_string="", page_name=page)
        if page in self.pages:
            client.page_script_hash = self.pages[page]
        client.widget_states.widgets.extend(states)
        message = BackMsg()
        message.rerun_script.CopyFrom(client)
        self._socket.send(message.SerializeToString())
        drawn = Page()
        while True:
            forward = ForwardMsg.FromString(self._socket.recv(timeout=self._timeout_s))
            kind = forward.WhichOneof("type")
            if kind == "navigation":
                self.pages = {p.url_pathname: p.page_script_hash for p in forward.navigation.app_pages}
                drawn.pages = dict(self.pages)
            elif kind == "delta" and forward.delta.WhichOneof("type") == "new_element":
                element = forward.delta.new_element
                name = element.WhichOneof("type")
                inner = getattr(element, name)
                drawn.elements.append((name, inner))
                drawn.arrived.append(time.monotonic())
                widget_id = getattr(inner, "id", "")
                if widget_id.startswith("$$ID-"):
                    drawn.widget_ids[widget_id.rsplit("-", 1)[-1]] = widget_id
            elif kind == "script_finished" and forward.script_finished != EARLY_FOR_RERUN:
                self.widget_ids.update(drawn.widget_ids)
                return drawn


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve(log_name: str = "streamlit-browser-test.log", env: dict[str, str] | None = None) -> Iterator[str]:
    """`streamlit run app.py` on a free port of 127.0.0.1, with ``env`` added to its environment; yields its URL."""
    port = _free_port()
    (ROOT / "artifacts").mkdir(exist_ok=True)
    log = open(ROOT / "artifacts" / log_name, "w")  # noqa: SIM115 - closed at teardown
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.headless",
            "true",
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--browser.gatherUsageStats",
            "false",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not start (exit code {process.poll()}); see artifacts/{log_name}")
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
