"""A model named by its Hugging Face Hub repository (``Qwen/Qwen3-8B``): its ``config.json`` and nothing else.

The lab measures shapes, not trained values, so a Hub model is built from its config with random weights, as a
folder holding only ``config.json`` is. The file is fetched through ``huggingface_hub`` (its cache,
``HF_HUB_OFFLINE``, ``HF_ENDPOINT``, ``HF_TOKEN`` and a revision), never a weight and never remote code:
``ckptlab.model.configs`` reads the fetched file as it reads a folder's, and refuses a config that needs the
model's own code.

Which names go to the Hub: an ``owner/name`` (optionally ``owner/name@revision``) that is neither a preset nor
an existing directory. A name that looks like a path (``./x``, ``../x``, ``/x``, ``~/x``) never does: the person
meant a folder, and a typo there must say so rather than ask the internet.

How the Hub is reached is :class:`HubAccess`, process-wide as the models root is (``folder_files.confine``):
``python -m ckptlab`` and ``import ckptlab`` use huggingface_hub's defaults; the app sets the instructor's
(``ckptlab.lab.server``: off unless ``CKPTLAB_HUB=1``, a cache of its own, no token unless the instructor gives
one), and a worker process gets the parent's with each job.

Only the standard library is imported here at module level: ``check_model_named`` asks :func:`is_repo_name`
before the CLI imports the core.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..errors import CkptlabError, ModelLoadError, Option, one_line

HUB = "hub"  # ModelInfo.source and load_config's source for a Hub model
CONFIG_FILE = "config.json"
EXAMPLE_REPO = "Qwen/Qwen3-8B"  # what a name box shows before anything is typed: a repository id as the Hub writes it
# A config.json of a 400B model is a few KiB: anything near this is not a config (kept here, where importing it
# costs no torch, for the Hub's size check before a fetch and folder_checks' before a read).
MAX_CONFIG_BYTES: int = 4 * 2**20
DEFAULT_DEADLINE_S = 30.0  # the lab's own limit on one fetch: huggingface_hub's retries can stall for minutes
# How long the HEAD may take when the cache already holds the config: it only asks whether a branch moved, and a Hub
# that does not answer by then is answered by the cached copy.
DEFAULT_CACHED_HEAD_S = 2.0
# huggingface_hub's rule for a repository id (validate_repo_id): letters, digits, "-", "_", ".", at most 96
# characters, no "--" nor "..", and not starting or ending with "-" or ".". One "/": the owner and the name.
_PART = r"[A-Za-z0-9_](?:[\w.-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_MAX_REPO_ID = 96
_REVISION = re.compile(r"[\w.-]+(?:/[\w.-]+)*")
_PATH_STARTS = ("./", "../", "/", "~", ".\\", "..\\", "\\")


@dataclass(frozen=True)
class HubAccess:
    """How this process reaches the Hub; the defaults are huggingface_hub's own."""

    enabled: bool = True  # False: a Hub name is refused (a shared server without CKPTLAB_HUB=1)
    cache_dir: str | None = None  # None: huggingface_hub's cache (HF_HUB_CACHE)
    endpoint: str | None = None  # None: huggingface_hub's (HF_ENDPOINT, else https://huggingface.co)
    # None: huggingface_hub's own (HF_TOKEN, else the stored login); False: no token sent; a str: that token.
    token: str | bool | None = field(default=None, repr=False)
    offline: bool = False  # the cache only (HF_HUB_OFFLINE=1 says the same for the whole process)
    deadline_s: float = DEFAULT_DEADLINE_S  # seconds one fetch may take before the lab gives up on it
    cached_head_s: float = DEFAULT_CACHED_HEAD_S  # seconds the HEAD may take when the cache holds the config
    # None: the cache is huggingface_hub's to manage (a person's own); bytes: the oldest revisions are evicted past
    # them after each fetch (a shared server's cache, CKPTLAB_HUB_CACHE_MIB).
    cache_max_bytes: int | None = None
    server: bool = False  # set by a shared server: its messages speak of the instructor's settings

    def stamp(self) -> tuple[Any, ...]:
        """What a description of a Hub model depends on besides its config (the token aside: never kept)."""
        return (self.enabled, self.cache_dir, self.endpoint, self.offline, self.server)


_ACCESS = HubAccess()
_ACCESS_LOCK = threading.Lock()


def configure(access: HubAccess) -> None:
    """How every later fetch of this process reaches the Hub (the app: the instructor's policy)."""
    global _ACCESS
    with _ACCESS_LOCK:
        _ACCESS = access


def access() -> HubAccess:
    """How this process reaches the Hub now (:func:`configure`)."""
    with _ACCESS_LOCK:
        return _ACCESS


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is written as a path (``./``, ``../``, ``/``, ``~``): such a name never goes to the Hub."""
    return name.startswith(_PATH_STARTS) or os.path.isabs(name)


def split_revision(name: str) -> tuple[str, str | None]:
    """``("owner/name", "revision")`` from ``"owner/name@revision"``; the revision is None without an ``@``."""
    repo, at, revision = name.partition("@")
    return repo, (revision if at else None)


def is_repo_name(name: str) -> bool:
    """Whether ``name`` reads as a Hub repository (``owner/name`` or ``owner/name@revision``), not as a path.

    Says nothing of whether the repository exists, nor of a folder of that name: a preset and an existing
    directory win over it (``ckptlab.model.configs.load_config``).
    """
    if looks_like_path(name):
        return False
    repo, revision = split_revision(name)
    if revision is not None and not _revision_ok(revision):
        return False
    return len(repo) <= _MAX_REPO_ID and _REPO_ID.fullmatch(repo) is not None and "--" not in repo and ".." not in repo


def _revision_ok(revision: str) -> bool:
    # A branch, tag or commit (refs/pr/1 too). Its parts are path segments twice: huggingface_hub keeps a branch's
    # commit under refs/<revision> in its cache, and "." in the resolve URL is dropped on the way (resolve/./config.json
    # asks resolve/config.json): none may be empty, "." or "..".
    return _REVISION.fullmatch(revision) is not None and not {".", ".."} & set(revision.split("/"))


def check_revision(name: str) -> None:
    """Raise when ``name`` is a Hub repository's name with a revision no repository can have (empty, ``.``,
    ``../x``): the revision is what is wrong, and the message names it, not the repository.

    Raises:
        ModelLoadError: ``hub.bad_revision``.
    """
    if looks_like_path(name):
        return
    repo, revision = split_revision(name)
    if revision is not None and is_repo_name(repo) and not _revision_ok(revision):
        raise ModelLoadError(key="hub.bad_revision", revision=repr(revision), name=repr(repo))


def config_file(name: str) -> str:
    """The local path of Hub model ``name``'s ``config.json``, fetched into the cache unless it is there.

    Fetched once per process, way to the Hub and revision: a later call answers from the first fetch (while the
    file is still in the cache), and a call made while that fetch runs waits for it rather than sending its own.
    One fetch is one HEAD (huggingface_hub's) and, unless the cache holds the file at the commit it names, one GET.

    Args:
        name: ``owner/name`` or ``owner/name@revision`` (:func:`is_repo_name`).

    Returns:
        The file in huggingface_hub's cache (``.../snapshots/<commit>/config.json``).

    Raises:
        ModelLoadError: one line for each way it fails: the Hub off on this server, not reachable and nothing
            cached, no such repository, a gated one without a token, no such revision, no config.json, a config
            too large, more bytes than announced, a broken transfer, the lab's deadline passed, or another answer
            of the Hub.
    """
    hub = access()
    if not hub.enabled:
        raise ModelLoadError(key="hub.off", name=repr(name))
    repo, revision = split_revision(name)
    key = (hub.stamp(), _token_key(hub.token), repo, revision)
    started = time.monotonic()
    with _FETCH_LOCK:
        known = _FETCHED.get(key)
        if known is not None and os.path.isfile(known):  # a server's bounded cache may have evicted it since
            return known
        fetch = _IN_FLIGHT.get(key)
        if fetch is None:
            fetch = _Fetch(deadline=started + hub.deadline_s)
            _IN_FLIGHT[key] = fetch
            worker = threading.Thread(target=_run, args=(key, fetch, repo, revision, hub), name=FETCH_THREAD)
            worker.daemon = True
            worker.start()
    return _awaited(fetch, started, hub.deadline_s, name)


FETCH_THREAD = "ckptlab-hub-fetch"  # the name of the thread a fetch runs in (a test waits for it to end)


@dataclass
class _Fetch:
    """One fetch of a config, in its own thread; every caller that asks for the same config meanwhile waits on it."""

    deadline: float  # time.monotonic() past which the transfer stops (_bounded_progress)
    done: threading.Event = field(default_factory=threading.Event)
    path: str | None = None
    error: BaseException | None = None


_FETCH_LOCK = threading.Lock()
_FETCHED: dict[tuple[Any, ...], str] = {}  # each config this process fetched: the process's one fetch of it
_IN_FLIGHT: dict[tuple[Any, ...], _Fetch] = {}


def _token_key(token: str | bool | None) -> Any:
    """What of the token keys a fetch: a gated config fetched with one token is no answer for another. A digest,
    so the token itself is not kept."""
    return hashlib.sha256(token.encode()).hexdigest() if isinstance(token, str) else token


def _run(key: tuple[Any, ...], fetch: _Fetch, repo: str, revision: str | None, hub: HubAccess) -> None:
    try:
        fetch.path = _fetch(repo, revision, hub, fetch.deadline)
    except BaseException as error:  # handed to the callers' threads, raised there
        fetch.error = error
    finally:
        with _FETCH_LOCK:
            _IN_FLIGHT.pop(key, None)
            if fetch.path is not None:  # a failure is not kept: a later call asks again
                _FETCHED[key] = fetch.path
        fetch.done.set()


def _awaited(fetch: _Fetch, started: float, deadline_s: float, name: str) -> str:
    """The fetch's answer within ``deadline_s`` of ``started``, else a one-line error.

    The caller stops waiting at the deadline; the transfer itself stops at its next chunk or read past it
    (:func:`_download`), its partial file removed.
    """
    finished = fetch.done.wait(max(0.0, started + deadline_s - time.monotonic()))
    # A failure that came after the deadline is the deadline's too: on a loaded machine this thread may wake
    # after the fetch gave up on its own (its HEAD's timeout is the deadline), and the answer must not depend on
    # which thread the scheduler ran first.
    if not finished or (fetch.error is not None and time.monotonic() - started >= deadline_s):
        raise ModelLoadError(key="hub.timeout", name=repr(name), seconds=deadline_s)
    if fetch.error is not None:
        raise fetch.error
    assert fetch.path is not None
    return fetch.path


def _fetch(repo: str, revision: str | None, hub: HubAccess, deadline: float) -> str:
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache

    name = repo if revision is None else f"{repo}@{revision}"
    try:
        if hub.offline or constants.is_offline_mode():
            path = hf_hub_download(repo, CONFIG_FILE, revision=revision, cache_dir=hub.cache_dir, local_files_only=True)
            assert isinstance(path, str)
            return path
        cached = try_to_load_from_cache(repo, CONFIG_FILE, cache_dir=hub.cache_dir, revision=revision)
        path = _fetched(repo, revision, hub, deadline, cached if isinstance(cached, str) else None)
    except Exception as error:
        failure = _failure(error, name, repo, revision, hub)
        if failure is None:  # neither the Hub's answer nor the transport's: a bug, with its traceback
            raise
        raise failure from error
    if hub.cache_max_bytes is not None:
        evict_oldest(hub.cache_dir, hub.cache_max_bytes, keep=path)
    return path


def _fetched(repo: str, revision: str | None, hub: HubAccess, deadline: float, cached: str | None) -> str:
    """The config from one HEAD (huggingface_hub's ``get_hf_file_metadata``, never retried) and, unless the cache
    holds the file at the commit the HEAD names, one GET (:func:`_download`); ``cached``: the cache's copy at
    ``revision``, which answers when the Hub does not."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError

    name = repo if revision is None else f"{repo}@{revision}"
    url = hf_hub_url(repo, CONFIG_FILE, revision=revision, endpoint=hub.endpoint)
    # With the file cached the HEAD only asks whether a branch moved: a Hub that does not answer soon is answered
    # by the cache. Without it, one HEAD's own limit within the deadline.
    timeout = min(hub.cached_head_s if cached else 10.0, max(deadline - time.monotonic(), 0.01))
    try:
        metadata = get_hf_file_metadata(url, token=hub.token, timeout=timeout, endpoint=hub.endpoint)
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else 0
        if status < 500:  # the Hub's own answer: no such repository, gated, no such revision or file
            raise
        if cached:  # the Hub is down: the cache answers
            return cached
        raise ModelLoadError(key="hub.unreachable", name=repr(name)) from error
    except _transport_errors() as error:  # no network, a refused connection, no answer in time
        if cached:
            return cached
        raise ModelLoadError(key="hub.unreachable", name=repr(name)) from error
    if metadata.commit_hash is None or metadata.etag is None:  # not a Hub (a proxy's page, a captive portal)
        if cached:
            return cached
        raise ModelLoadError(key="hub.not_a_hub", name=repr(name))
    if metadata.size is not None and metadata.size > MAX_CONFIG_BYTES:  # refused before it fills the cache
        raise _too_large(name, metadata.size)
    at_commit = try_to_load_from_cache(repo, CONFIG_FILE, cache_dir=hub.cache_dir, revision=metadata.commit_hash)
    if isinstance(at_commit, str):
        _note_ref(hub.cache_dir, repo, revision, metadata.commit_hash)
        return at_commit
    return _download(repo, revision, hub, deadline, metadata.commit_hash, metadata.etag, metadata.size)


def _download(
    repo: str, revision: str | None, hub: HubAccess, deadline: float, commit: str, etag: str, size: int | None
) -> str:
    """``config.json`` at ``commit`` into huggingface_hub's cache, bounded by the HEAD's ``size`` (else
    :data:`MAX_CONFIG_BYTES`) and the deadline; a partial file is removed.

    huggingface_hub's own download cannot be bounded so: it reads 10 MiB before it hands over a byte, retries a
    broken stream five times, and a slow one past any deadline. The lab sends the GET through huggingface_hub's
    session and headers (its token, its user agent; httpx drops the token on a redirect to another host), and files
    the few KiB in huggingface_hub's documented cache layout (blobs/, snapshots/, refs/) for it to find later.
    """
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    name = repo if revision is None else f"{repo}@{revision}"
    storage = _storage(hub.cache_dir, repo)
    blob = os.path.join(storage, "blobs", etag)
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    partial = f"{blob}.{uuid.uuid4().hex[:8]}.incomplete"
    limit = MAX_CONFIG_BYTES if size is None else size
    headers = build_hf_headers(token=hub.token)
    headers["Accept-Encoding"] = "identity"  # the bytes the HEAD counted
    url = hf_hub_url(repo, CONFIG_FILE, revision=commit, endpoint=hub.endpoint)  # the commit the HEAD named
    received = 0
    try:
        with open(partial, "wb") as file:
            # Each read waits at most what is left of the deadline: a server that stops sending ends the transfer.
            wait = max(deadline - time.monotonic(), 0.01)
            with get_session().stream("GET", url, headers=headers, timeout=wait, follow_redirects=True) as response:
                hf_raise_for_status(response)
                for chunk in response.iter_bytes():  # as the bytes arrive (decoded, should a server compress anyway)
                    received += len(chunk)
                    if received > limit:
                        raise ModelLoadError(key="hub.overlong", name=repr(name), size=limit)
                    if time.monotonic() > deadline:
                        raise ModelLoadError(key="hub.timeout", name=repr(name), seconds=hub.deadline_s)
                    file.write(chunk)
        if size is not None and received != size:
            raise ModelLoadError(key="hub.short", name=repr(name), received=received, size=size)
        os.replace(partial, blob)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    pointer = os.path.join(storage, "snapshots", commit, CONFIG_FILE)
    os.makedirs(os.path.dirname(pointer), exist_ok=True)
    if not os.path.exists(pointer):
        try:  # as huggingface_hub links a snapshot's file to its blob; a copy where links are not allowed
            os.symlink(os.path.relpath(blob, os.path.dirname(pointer)), pointer)
        except OSError:
            shutil.copyfile(blob, pointer)
    _note_ref(hub.cache_dir, repo, revision, commit)
    return pointer


def _storage(cache_dir: str | None, repo: str) -> str:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return os.path.join(cache_dir or constants.HF_HUB_CACHE, repo_folder_name(repo_id=repo, repo_type="model"))


def _note_ref(cache_dir: str | None, repo: str, revision: str | None, commit: str) -> None:
    """Which commit a branch or tag is at, where huggingface_hub looks for it (refs/<revision>): how the cache
    answers that revision later, offline or with the Hub silent."""
    named = revision or "main"
    if named == commit:
        return
    ref = os.path.join(_storage(cache_dir, repo), "refs", *named.split("/"))
    os.makedirs(os.path.dirname(ref), exist_ok=True)
    with open(ref, "w", encoding="utf-8") as file:
        file.write(commit)


def _too_large(name: str, size: int) -> ModelLoadError:
    return ModelLoadError(
        key="hub.config_too_large",
        name=repr(name),
        size=size,
        limit=MAX_CONFIG_BYTES,
    )


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The transport's own errors: the installed huggingface_hub's HTTP client's (a refusal, a reset, a broken or
    undecodable body, a timeout) and ``OSError``."""
    errors: list[type[BaseException]] = [OSError]
    for client in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(client)
        except ImportError:
            continue
        errors.append(module.HTTPError)
    return tuple(errors)


def _failure(error: Exception, name: str, repo: str, revision: str | None, hub: HubAccess) -> CkptlabError | None:
    """The one line for ``error``, raised by a fetch; None for what is neither the Hub's answer nor the
    transport's (a bug)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, CkptlabError):
        return error
    if isinstance(error, GatedRepoError):
        return _gated(name, hub)
    if isinstance(error, RepositoryNotFoundError):
        return ModelLoadError(key="hub.not_found", name=repr(name), repo=repr(repo))
    if isinstance(error, RevisionNotFoundError):
        return ModelLoadError(key="hub.no_revision", repo=repr(repo), revision=repr(revision))
    if isinstance(error, RemoteEntryNotFoundError):
        return ModelLoadError(key="hub.no_config", repo=repr(repo))
    if isinstance(error, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return ModelLoadError(key="hub.unreachable", name=repr(name))
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return ModelLoadError(key="hub.http_error", name=repr(name), status=str(error.response.status_code))
    if isinstance(error, _transport_errors()):  # a reset, a broken body, a read that timed out, a full disk
        detail = one_line(f"{type(error).__name__}: {error}", 200)
        return ModelLoadError(key="hub.transfer", name=repr(name), detail=detail)
    return None


def evict_oldest(cache_dir: str | None, max_bytes: int, keep: str) -> None:
    """The oldest revisions (by when they were fetched) deleted from huggingface_hub's cache at ``cache_dir`` until
    it holds at most ``max_bytes``, through huggingface_hub's own cache API (``scan_cache_dir``,
    ``delete_revisions``); the revision that holds ``keep`` stays. A cache another process is changing meanwhile is
    left as it is, for the next fetch to bound.
    """
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    with _EVICT_LOCK:
        try:
            cache = scan_cache_dir(cache_dir)
            size = cache.size_on_disk
            doomed = []
            for revision in sorted((r for repo in cache.repos for r in repo.revisions), key=lambda r: r.last_modified):
                if size <= max_bytes:
                    break
                if os.path.commonpath([str(revision.snapshot_path), keep]) == str(revision.snapshot_path):
                    continue
                doomed.append(revision.commit_hash)
                size -= revision.size_on_disk
            if doomed:
                cache.delete_revisions(*doomed).execute()
        except (OSError, CacheNotFound, CorruptedCacheException):
            return


_EVICT_LOCK = threading.Lock()


def _gated(name: str, hub: HubAccess) -> ModelLoadError:
    if hub.server and hub.token is False:
        return ModelLoadError(key="hub.gated_server", name=repr(name))
    return ModelLoadError(key="hub.gated", name=repr(name), model=Option("model"))


def with_revision(name: str, revision: str | None) -> str:
    """``name`` pinned to ``revision`` (``owner/name@revision``); ``name`` itself when ``revision`` is None.

    Raises:
        ModelLoadError: ``name`` is not a Hub repository's name (a preset, a folder, a path), or already has one
            (``hub.revision_not_hub``); ``revision`` is none a repository can have (``hub.bad_revision``).
    """
    if revision is None:
        return name
    if os.path.isdir(name) or "@" in name or not is_repo_name(name):
        raise ModelLoadError(key="hub.revision_not_hub", revision=Option("revision", revision), name=repr(name))
    pinned = f"{name}@{revision}"
    check_revision(pinned)
    return pinned
