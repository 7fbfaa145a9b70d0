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

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ModelLoadError, Option

HUB = "hub"  # ModelInfo.source and load_config's source for a Hub model
CONFIG_FILE = "config.json"
EXAMPLE_REPO = "Qwen/Qwen3-8B"  # what a name box shows before anything is typed: a repository id as the Hub writes it
# A config.json of a 400B model is a few KiB: anything near this is not a config (kept here, where importing it
# costs no torch, for the Hub's size check before a fetch and folder_checks' before a read).
MAX_CONFIG_BYTES: int = 4 * 2**20
DEFAULT_DEADLINE_S = 30.0  # the lab's own limit on one fetch: huggingface_hub's retries can stall for minutes
# huggingface_hub's rule for a repository id (validate_repo_id): letters, digits, "-", "_", ".", at most 96
# characters, no "--" nor "..", and not starting or ending with "-" or ".". One "/": the owner and the name.
_PART = r"[A-Za-z0-9_](?:[\w.-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_MAX_REPO_ID = 96
_REVISION = re.compile(r"[\w.-]+(?:/[\w.-]+)*")
_PATH_STARTS = ("./", "../", "/", "~", ".\\", "..\\", "\\")

T = TypeVar("T")


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
    # A branch, tag or commit (refs/pr/1 too); huggingface_hub keeps a branch's commit under refs/<revision> in its
    # cache, so a revision must not climb out of it.
    if revision is not None and (_REVISION.fullmatch(revision) is None or ".." in revision.split("/")):
        return False
    return len(repo) <= _MAX_REPO_ID and _REPO_ID.fullmatch(repo) is not None and "--" not in repo and ".." not in repo


def config_file(name: str) -> str:
    """The local path of Hub model ``name``'s ``config.json``, fetched into the cache unless it is there.

    Args:
        name: ``owner/name`` or ``owner/name@revision`` (:func:`is_repo_name`).

    Returns:
        The file in huggingface_hub's cache (``.../snapshots/<commit>/config.json``).

    Raises:
        ModelLoadError: one line for each way it fails: the Hub off on this server, not reachable and nothing
            cached, no such repository, a gated one without a token, no such revision, no config.json, a config
            too large, the lab's deadline passed, or another answer of the Hub.
    """
    hub = access()
    if not hub.enabled:
        raise ModelLoadError(key="hub.off", name=repr(name))
    repo, revision = split_revision(name)
    return _within_deadline(lambda: _fetch(repo, revision, hub), hub.deadline_s, name)


def _fetch(repo: str, revision: str | None, hub: HubAccess) -> str:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = repo if revision is None else f"{repo}@{revision}"
    options: dict[str, Any] = {
        "revision": revision,
        "cache_dir": hub.cache_dir,
        "endpoint": hub.endpoint,
        "token": hub.token,
        "local_files_only": hub.offline,
        # One HEAD's own limit; the lab's deadline (_within_deadline) bounds the whole fetch.
        "etag_timeout": _head_timeout(hub),
    }
    try:
        if not (hub.offline or constants.is_offline_mode()):
            size = _remote_size(repo, revision, hub)
            if size is None:  # the Hub not reached: the cache answers, or says it cannot
                options["local_files_only"] = True
            elif size > MAX_CONFIG_BYTES:  # refused before a config.json of gigabytes fills the cache
                raise ModelLoadError(
                    key="hub.config_too_large",
                    name=repr(name),
                    size=f"{size / 2**20:,.1f}",
                    limit=f"{MAX_CONFIG_BYTES // 2**20}",
                )
        # By the revision as named: huggingface_hub then notes which commit the branch is at (refs/main), which is
        # how HF_HUB_OFFLINE=1 finds the file later. The size is checked again when the file is read
        # (folder_checks.read_config_json).
        path = hf_hub_download(repo, CONFIG_FILE, **options)
        assert isinstance(path, str)
        return path
    except GatedRepoError as exc:
        raise _gated(name, hub) from exc
    except RepositoryNotFoundError as exc:
        raise ModelLoadError(key="hub.not_found", name=repr(name), repo=repr(repo)) from exc
    except RevisionNotFoundError as exc:
        raise ModelLoadError(key="hub.no_revision", repo=repr(repo), revision=repr(revision)) from exc
    except RemoteEntryNotFoundError as exc:
        raise ModelLoadError(key="hub.no_config", repo=repr(repo)) from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        raise ModelLoadError(key="hub.unreachable", name=repr(name)) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise ModelLoadError(key="hub.http_error", name=repr(name), status=str(status)) from exc


def _head_timeout(hub: HubAccess) -> float:
    return min(10.0, hub.deadline_s)


def _remote_size(repo: str, revision: str | None, hub: HubAccess) -> int | None:
    """The size of the repository's config.json from one HEAD, or None when the Hub was not reached.

    Asked once and without retries: hf_hub_download, finding nothing cached after a failed HEAD, retries it five
    times with backoff (23 s and more without a network), where a lab with no network should say so at once.

    Raises:
        huggingface_hub's errors for the Hub's own answers (no such repository, gated, no such revision or file).
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    url = hf_hub_url(repo, CONFIG_FILE, revision=revision, endpoint=hub.endpoint)
    try:
        metadata = get_hf_file_metadata(url, token=hub.token, timeout=_head_timeout(hub), endpoint=hub.endpoint)
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else 0
        if status >= 500:  # the Hub is down: the cache may still hold the file
            return None
        raise
    # The transport's own errors (no network, a refused connection, a timeout), whichever HTTP client the
    # installed huggingface_hub uses: the Hub was not reached.
    except Exception:
        return None
    return metadata.size or 0


def _gated(name: str, hub: HubAccess) -> ModelLoadError:
    if hub.server and hub.token is False:
        return ModelLoadError(key="hub.gated_server", name=repr(name))
    return ModelLoadError(key="hub.gated", name=repr(name), model=Option("model"))


def _within_deadline(call: Callable[[], T], deadline_s: float, name: str) -> T:
    """``call()`` within ``deadline_s`` seconds, else a one-line error.

    huggingface_hub retries a HEAD that timed out, with a longer timeout and backoff, when nothing is cached:
    its own timeouts do not bound the whole call. So the call runs in a daemon thread the lab stops waiting for
    (left to end by itself, it holds no lock of ours and writes only to the cache, atomically).
    """
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the caller's thread, raised there
            outcome["error"] = error
        finally:
            done.set()

    started = time.monotonic()
    threading.Thread(target=run, name="ckptlab-hub-fetch", daemon=True).start()
    finished = done.wait(deadline_s)
    # A failure that came after the deadline is the deadline's too: on a loaded machine this thread may wake
    # after the fetch gave up on its own (its HEAD's timeout is the deadline), and the answer must not depend on
    # which thread the scheduler ran first.
    if not finished or ("error" in outcome and time.monotonic() - started >= deadline_s):
        raise ModelLoadError(key="hub.timeout", name=repr(name), seconds=f"{deadline_s:g}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def with_revision(name: str, revision: str | None) -> str:
    """``name`` pinned to ``revision`` (``owner/name@revision``); ``name`` itself when ``revision`` is None.

    Raises:
        ModelLoadError: ``name`` is not a Hub repository's name (a preset, a folder, a path), or already has one.
    """
    if revision is None:
        return name
    pinned = f"{name}@{revision}"
    if os.path.isdir(name) or "@" in name or not is_repo_name(pinned):
        raise ModelLoadError(key="hub.revision_not_hub", revision=Option("revision", revision), name=repr(name))
    return pinned
