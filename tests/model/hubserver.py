"""A stand-in for the Hugging Face Hub on 127.0.0.1: it answers the file-resolve requests huggingface_hub makes
(``HEAD``/``GET /{owner}/{name}/resolve/{revision}/config.json``) with the headers it reads (``X-Repo-Commit``,
``ETag``, ``Content-Length``, ``X-Error-Code``), so no test touches the real Hub.

Repositories it knows, besides the configs a test hands it (``configs``: repo -> the file's bytes):

- ``GATED``: 401 with ``X-Error-Code: GatedRepo`` unless the request carries ``Bearer`` :data:`TOKEN` (then the
  config a test hands it under that name);
- ``HUGE``: a HEAD announcing a config.json of 64 MiB (its body is never asked for);
- ``NO_CONFIG``: the repository exists and has no config.json (404, ``EntryNotFound``);
- ``SILENT``: never answers, until the server stops (the lab's own deadline must end the wait);
- any other: 401 with ``X-Error-Code: RepoNotFound``, as the Hub answers for a repository that does not exist.

A revision other than ``main`` or :data:`TAG` is 404 ``RevisionNotFound``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GATED = "lab/gated"
HUGE = "lab/huge"
NO_CONFIG = "lab/no-config"
SILENT = "lab/silent"
TOKEN = "hf_test_token"
TAG = "v1"


@dataclass
class FakeHub:
    """The running server: its ``url`` (an ``endpoint=``) and what it was asked."""

    url: str
    configs: dict[str, bytes]
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Authorization)
    released: threading.Event = field(default_factory=threading.Event)  # set when SILENT may stop waiting


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
