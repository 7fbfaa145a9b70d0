"""A stand-in for the Hugging Face Hub on 127.0.0.1: it answers the file-resolve requests huggingface_hub makes
(``HEAD``/``GET /{owner}/{name}/resolve/{revision}/config.json``) with the headers it reads (``X-Repo-Commit``,
``ETag``, ``Content-Length``, ``X-Error-Code``), so no test touches the real Hub.

Repositories it knows, besides the configs a test hands it (``configs``: repo -> the file's bytes):

- ``GATED``: 401 with ``X-Error-Code: GatedRepo`` unless the request carries ``Bearer`` :data:`TOKEN` (then the
  config a test hands it under that name);
- ``HUGE``: a HEAD announcing a config.json of 64 MiB (its body is never asked for);
- ``NO_CONFIG``: the repository exists and has no config.json (404, ``EntryNotFound``);
- ``SILENT``: never answers, until the server stops (the lab's own deadline must end the wait);
- hostile transfers, each announcing a config of :data:`ANNOUNCED` bytes in its HEAD: ``STREAM`` sends bytes
  forever (no ``Content-Length``); ``DRIP`` one byte every 10 ms; ``MUTE`` its headers and then nothing; ``RESET``
  a few bytes and a TCP reset; ``SHORT`` fewer bytes than its ``Content-Length``; ``MISMATCH`` a ``Content-Length``
  other than the HEAD's; ``GZIP`` a body marked gzip that is not;
- any other: 401 with ``X-Error-Code: RepoNotFound``, as the Hub answers for a repository that does not exist.

A revision other than ``main`` or :data:`TAG` is 404 ``RevisionNotFound``. ``FakeHub.silent`` set: every request is
recorded and never answered (a Hub that accepts connections and never answers).
"""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GATED = "lab/gated"
HUGE = "lab/huge"
NO_CONFIG = "lab/no-config"
SILENT = "lab/silent"
STREAM = "lab/stream"
DRIP = "lab/drip"
MUTE = "lab/mute"
RESET = "lab/reset"
SHORT = "lab/short"
MISMATCH = "lab/mismatch"
GZIP = "lab/gzip"
HOSTILE = (STREAM, DRIP, MUTE, RESET, SHORT, MISMATCH, GZIP)
ANNOUNCED = 100  # the size the hostile repositories' HEAD announces
TOKEN = "hf_test_token"
TAG = "v1"


@dataclass
class FakeHub:
    """The running server: its ``url`` (an ``endpoint=``) and what it was asked."""

    url: str
    configs: dict[str, bytes]
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Authorization)
    released: threading.Event = field(default_factory=threading.Event)  # set when SILENT may stop waiting
    silent: threading.Event = field(default_factory=threading.Event)  # set: no request is answered any more
    sent: dict[str, int] = field(default_factory=dict)  # a hostile body's bytes written before the client left
    ended: threading.Event = field(default_factory=threading.Event)  # set when a hostile body's handler ends


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: pytest shows what a test prints
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            auth = self.headers.get("Authorization")
            hub.requests.append((self.command, self.path, auth))
            if hub.silent.is_set():
                hub.released.wait(60)
                return None
            parts = self.path.split("?")[0].strip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                return self._error(404, "EntryNotFound")
            repo, revision, filename = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
            if repo == SILENT:
                hub.released.wait(60)  # the client gives up first; the server's close releases it
                return None
            if repo == GATED and auth != f"Bearer {TOKEN}":
                return self._error(401, "GatedRepo")
            if repo == HUGE:
                return self._file(b"", body=False, size=64 * 2**20)
            if repo == NO_CONFIG:
                return self._error(404, "EntryNotFound", commit=True)
            if repo in HOSTILE:
                if not body:
                    return self._file(b"", body=False, size=ANNOUNCED, commit=_commit(repo))
                return self._hostile(repo)
            content = hub.configs.get(repo)
            if content is None:
                return self._error(401, "RepoNotFound")
            if revision not in ("main", TAG) and revision != _commit(repo):
                return self._error(404, "RevisionNotFound")
            if filename != "config.json":
                return self._error(404, "EntryNotFound", commit=True)
            return self._file(content, body=body, commit=_commit(repo))

        def _file(self, content: bytes, body: bool, size: int | None = None, commit: str | None = None) -> None:
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit or "0" * 40)
            self.send_header("ETag", f'"{hashlib.sha1(content).hexdigest()}"')
            self.send_header("Content-Length", str(len(content) if size is None else size))
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            if body:
                self.wfile.write(content)

        def _hostile(self, repo: str) -> None:
            self.send_response(200)
            if repo != STREAM:  # a stream has no length: its body ends when the connection does
                length = {SHORT: ANNOUNCED, MISMATCH: ANNOUNCED + 50, GZIP: 8, DRIP: ANNOUNCED, MUTE: ANNOUNCED}
                self.send_header("Content-Length", str(length.get(repo, ANNOUNCED)))
            if repo == GZIP:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.flush()
            hub.sent[repo] = 0
            try:
                if repo == STREAM:
                    while True:
                        self.wfile.write(b" " * 4096)
                        hub.sent[repo] += 4096
                elif repo == DRIP:
                    for _ in range(ANNOUNCED):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        hub.sent[repo] += 1
                        if hub.released.wait(0.01):
                            break
                elif repo == MUTE:
                    hub.released.wait(60)
                elif repo == RESET:
                    self.wfile.write(b"{" * 10)
                    self.wfile.flush()
                    # SO_LINGER 0: close() sends a TCP reset, not an orderly end
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                elif repo == SHORT:
                    self.wfile.write(b"{" * (ANNOUNCED // 2))
                elif repo == MISMATCH:
                    self.wfile.write(b" " * (ANNOUNCED + 50))
                elif repo == GZIP:
                    self.wfile.write(b"not gzip")
            except OSError:  # the client stopped reading and closed: what a bounded fetch does
                pass
            self.close_connection = True
            hub.ended.set()

        def _error(self, status: int, code: str, commit: bool = False) -> None:
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            if commit:
                self.send_header("X-Repo-Commit", "1" * 40)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


def _commit(repo: str) -> str:
    return hashlib.sha1(repo.encode()).hexdigest()


@contextmanager
def fake_hub(configs: Mapping[str, bytes]) -> Iterator[FakeHub]:
    """A :class:`FakeHub` serving ``configs`` for the duration of the block."""
    hub = FakeHub(url="", configs=dict(configs))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll: shutdown() waits for it, at the end of every test that starts a server.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.released.set()
        server.shutdown()
        server.server_close()
