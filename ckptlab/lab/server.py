"""What a participant may ask of a shared workshop server: the instructor's policy.

``python -m ckptlab`` and ``import ckptlab`` have no such policy: the person at the terminal
owns the machine. The app, which anyone with the URL can use, reads one from its
environment when the server starts (``streamlit run app.py``), each setting from an
environment variable or, beside it, the same name in ``.streamlit/secrets.toml``:

``CKPTLAB_MODELS_ROOT``
    The folder under which participants may pick local model folders (each one a folder
    with a ``config.json``, at most two levels down). Unset: local folders are off, and
    only the presets can be run. Paths are resolved (``..`` and symbolic links followed)
    and must stay inside the root.
``CKPTLAB_RUN_LIMIT_S``
    Seconds a run may hold the device (its measurement and its checkpointing-off
    reference together) before it is stopped, its memory given back and its participant
    told. Default 300.
``CKPTLAB_MAX_TOKENS``
    The largest sequence length x batch a participant may ask for, per model:
    ``"tiny-llama=65536,qwen3-0.6b=256,*=8192"`` (``*``: every model not named). Unset: no limit
    in tokens; time is the run limit's, checked once: a whole Run (warm-up, repeats, memory step,
    its checkpointing-off reference) whose estimate (the roofline over each part's simulated step,
    :func:`ckptlab.lab.run.run_estimate`, scaled by :data:`ckptlab.lab.run.PACE` once this server
    measured some Runs) is past the run limit is refused before it starts, with the command line
    that runs it in a terminal instead: the limit would only stop it part way, its device time
    spent for nothing.
``CKPTLAB_WORKER_MEMORY_GIB``
    Resident memory (GiB) one job's worker process may reach; past it the worker is killed,
    its memory given back and its participant told. Unset: half the machine's physical memory
    (:data:`DEFAULT_WORKER_MEMORY_SHARE`), so that one participant's job (a model described from a
    hostile config, a run) cannot take the server and every other session down with it.
``CKPTLAB_WORKERS``
    ``process`` (the default): every job runs in a worker process (:mod:`ckptlab.lab.workers`),
    so no participant's torch state meets another's and a job past its limit is ended at once.
    ``thread``: jobs run in the server's own threads (one person on a laptop; no hard limits).
``CKPTLAB_INSTRUCTOR_SECRET``
    The phrase that opens the instructor's room (``pages/instructor.py``): typed into its
    password field, never put in a URL (the projector shows it). Unset: the room offers nothing.
``CKPTLAB_WARM_LEARN``
    ``1``: the first page any session opens (the instructor's, before the class arrives) queues
    the runs of every part of the Lesson and of the Exercises, then the Lesson's simulations
    (:func:`ckptlab.lab.learnruns.warm`), measured once for every session in the background. Unset or ``0``: each run is measured when a page first asks.
``CKPTLAB_HUB``
    ``1``: participants may name a Hugging Face Hub repository (``owner/name``), whose
    ``config.json`` the server fetches (never weights nor code: ``ckptlab.model.hub``). Unset or
    ``0``: off, as a server that fetches on a participant's word is the instructor's decision.
``CKPTLAB_HUB_CACHE``
    The server's own cache of fetched configs (default ``~/.cache/ckptlab/hub``): never the
    instructor's Hugging Face cache, whose gated configs a participant must not read through it.
``CKPTLAB_HUB_CACHE_MIB``
    The most that cache holds, in MiB (default 64): after each fetch the oldest revisions are
    evicted past it (``ckptlab.model.hub.evict_oldest``), so participants naming revision after
    revision cannot fill the server's disk.
``CKPTLAB_HUB_TOKEN``
    The token the server sends for a participant's fetch (a gated repository's config). Unset:
    none is sent, whatever ``HF_TOKEN`` or login the server's account has. Never in a repr or a log.
"""

from __future__ import annotations

import hmac
import math
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cli.args import argv_from_spec
from ..errors import CkptlabError, SpecError
from ..fact import Fact
from ..model.catalog import ModelInfo
from ..model.folder_checks import memory_limit
from ..model.hub import HubAccess
from ..spec import RunSpec
from .run import PACE, RESULTS, Pace, PoolSource, ResultCache

DEFAULT_RUN_LIMIT_S = 300.0  # a workshop of 30 participants gets through one run each in well under an hour
FOLDER_DEPTH = 2  # root/model or root/group/model: deep enough for a workshop, shallow enough to list fast
DEFAULT_HUB_CACHE = Path("~/.cache/ckptlab/hub")  # the server's own, apart from huggingface_hub's default cache
# The most the server's Hub cache holds, oldest revisions evicted past it: a config is at most 4 MiB (MAX_CONFIG_BYTES),
# most a few KiB, so 64 MiB keeps hundreds of models and at least 16 of the largest.
DEFAULT_HUB_CACHE_MIB = 64.0
# Of the machine's physical memory, what one job's worker may reach when the instructor sets no cap: one job past it
# is ended, and the other half stays for the server process and the other participants' jobs.
DEFAULT_WORKER_MEMORY_SHARE = 0.5


class NotAllowedError(CkptlabError):
    """A participant asked for something the instructor's policy does not allow (a folder, a size)."""


@dataclass(frozen=True)
class ServerPolicy:
    """The instructor's limits for participants of the app."""

    models_root: Path | None = None  # local model folders only inside it; None: no local folders
    run_limit_s: float = DEFAULT_RUN_LIMIT_S  # seconds a run may hold the device
    max_tokens: Mapping[str, int] = field(default_factory=dict)  # model -> seq x batch; "*" for the others
    memory_cap_bytes: int | None = None  # resident memory a job's worker may reach; None: no cap
    workers: bool = True  # jobs in worker processes (CKPTLAB_WORKERS=process) rather than the server's threads
    # The instructor's phrase (CKPTLAB_INSTRUCTOR_SECRET); None: no instructor's room. Never in a repr or a log.
    instructor_secret: str | None = field(default=None, repr=False)
    warm_learn: bool = False  # CKPTLAB_WARM_LEARN=1: queue the Learn pages' shared runs when the server starts
    hub: bool = False  # CKPTLAB_HUB=1: participants may name a Hub repository (its config.json is fetched)
    hub_cache: Path = DEFAULT_HUB_CACHE  # CKPTLAB_HUB_CACHE: the server's own cache of fetched configs
    hub_cache_bytes: int = int(DEFAULT_HUB_CACHE_MIB * 2**20)  # CKPTLAB_HUB_CACHE_MIB: that cache's bound
    # CKPTLAB_HUB_TOKEN: the token sent for a participant's fetch; None: none is sent. Never in a repr or a log.
    hub_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Mapping[str, object]) -> ServerPolicy:
        """The policy from environment-like settings (``os.environ``, ``st.secrets``), checked.

        Raises:
            SpecError: a setting that does not parse, naming it and the fix.
        """
        root = settings.get("CKPTLAB_MODELS_ROOT")
        models_root = None
        if root:
            models_root = Path(str(root)).expanduser().resolve()
            if not models_root.is_dir():
                raise SpecError(key="server.models_root", value=str(root))
        limit = _positive_setting(settings, "CKPTLAB_RUN_LIMIT_S")
        run_limit_s = DEFAULT_RUN_LIMIT_S if limit is None else limit
        gib = _positive_setting(settings, "CKPTLAB_WORKER_MEMORY_GIB")
        memory_cap_bytes = default_memory_cap() if gib is None else int(gib * 2**30)
        mode = _choice_setting(settings, "CKPTLAB_WORKERS", ("process", "thread"))
        max_tokens = parse_max_tokens(str(settings.get("CKPTLAB_MAX_TOKENS") or ""))
        secret = str(settings.get("CKPTLAB_INSTRUCTOR_SECRET") or "") or None
        warm = _choice_setting(settings, "CKPTLAB_WARM_LEARN", ("0", "1"))
        hub = _choice_setting(settings, "CKPTLAB_HUB", ("0", "1"))
        hub_cache = Path(str(settings.get("CKPTLAB_HUB_CACHE") or DEFAULT_HUB_CACHE)).expanduser()
        hub_token = str(settings.get("CKPTLAB_HUB_TOKEN") or "") or None
        cache_mib = _positive_setting(settings, "CKPTLAB_HUB_CACHE_MIB")
        hub_cache_bytes = int((DEFAULT_HUB_CACHE_MIB if cache_mib is None else cache_mib) * 2**20)
        return cls(
            models_root,
            run_limit_s,
            max_tokens,
            memory_cap_bytes,
            mode == "process",
            secret,
            warm == "1",
            hub=hub == "1",
            hub_cache=hub_cache,
            hub_cache_bytes=hub_cache_bytes,
            hub_token=hub_token,
        )

    def hub_access(self) -> HubAccess:
        """How the server reaches the Hub for a participant: off unless the instructor turned it on, its own
        cache, and no token but the one the instructor gave it (``False`` keeps huggingface_hub from sending
        the server account's ``HF_TOKEN`` or login)."""
        return HubAccess(
            enabled=self.hub,
            cache_dir=str(self.hub_cache.expanduser()),
            token=self.hub_token if self.hub_token is not None else False,
            cache_max_bytes=self.hub_cache_bytes,
            server=True,
        )

    # -- the instructor's room ----------------------------------------------------------

    @property
    def has_instructor(self) -> bool:
        """Whether the server set an instructor's phrase: without one, the instructor's room offers nothing."""
        return self.instructor_secret is not None

    def is_instructor(self, typed: str) -> bool:
        """Whether ``typed`` is the instructor's phrase, compared in constant time (False when none is set)."""
        if self.instructor_secret is None or not typed:
            return False
        return hmac.compare_digest(typed.encode("utf-8"), self.instructor_secret.encode("utf-8"))

    # -- local folders ------------------------------------------------------------------

    def model_folders(self) -> list[str]:
        """The model folders under the root a participant may pick (relative paths, sorted); none when off."""
        if self.models_root is None:
            return []
        # By the folder each resolves to: a link to a folder (loop -> .) lists it once, under its own name (one
        # without a link in it) where it has one, else the shortest.
        found: dict[Path, tuple[bool, int, str]] = {}
        for depth in range(1, FOLDER_DEPTH + 1):
            for config in sorted(self.models_root.glob("/".join(["*"] * depth) + "/config.json")):
                folder = config.parent
                if self._inside(folder):  # a symbolic link out of the root is not offered
                    name = folder.relative_to(self.models_root).as_posix()
                    resolved = folder.resolve()
                    rank = (resolved != folder, len(name), name)
                    found[resolved] = min(found.get(resolved, rank), rank)
        return sorted(rank[2] for rank in found.values())

    def local_folder(self, name: str) -> str:
        """The absolute path of the local model folder ``name`` (relative to the root, or absolute inside it).

        Raises:
            NotAllowedError: local folders are off, or the path leads outside the root.
        """
        if self.models_root is None:
            raise NotAllowedError(key="server.folders_off", name=name)
        # An absolute name replaces the root (checked below); a NUL byte names no file (resolve() would raise).
        folder = None if "\x00" in name else (self.models_root / name).resolve()
        if folder is None or not self._inside(folder):
            raise NotAllowedError(key="server.folder_outside", name=name)
        return str(folder)

    def _inside(self, path: Path) -> bool:
        assert self.models_root is not None
        return path.resolve().is_relative_to(self.models_root)

    # -- sizes and time -----------------------------------------------------------------

    def max_tokens_for(self, info: ModelInfo) -> int | None:
        """The largest ``seq_len x batch_size`` a participant may run on ``info``'s model here; None where the
        instructor named no limit (``CKPTLAB_MAX_TOKENS``). Time is not limited in tokens: a Run's predicted time
        is checked against the run limit once, by :meth:`check_run_time` (a limit in tokens predicted from time
        would be a second rule, and would cost a simulation per length tried)."""
        return self.max_tokens.get(info.name, self.max_tokens.get("*"))

    def check(self, spec: RunSpec, info: ModelInfo) -> None:
        """Refuse a run larger than the policy allows, before it queues.

        Raises:
            NotAllowedError: naming the tokens asked for, the limit and the fix.
        """
        tokens, limit = spec.seq_len * spec.batch_size, self.max_tokens_for(info)
        if limit is not None and tokens > limit:
            raise NotAllowedError(
                key="server.too_many_tokens",
                seq=spec.seq_len,
                batch=spec.batch_size,
                tokens=tokens,
                model=info.name,
                limit=limit,
            )

    def check_run_time(
        self,
        spec: RunSpec,
        pace: Pace = PACE,
        cache: ResultCache | None = RESULTS,
        alone: bool = False,
        workers: PoolSource | None = None,
    ) -> None:
        """Refuse a Lab Run (the run, its reference, a policy's plain run) whose estimate is past the run limit,
        before it queues: the limit would stop it part way, its device time spent for nothing. Refused rather than
        shrunk (fewer repeats): the memory step and the reference cost as much as the repeats, so a Run can be past
        the limit at one repeat, and a Run quietly other than the one asked for would not be what the page says.

        Raises:
            NotAllowedError: the estimate, its basis, the limit, and the command line that runs it in a terminal.
        """
        # alone: a sweep's row, one run in its own turn; workers: where the estimate's simulations run (the app's pool)
        seconds, measured = pace.estimate(spec, cache, alone, workers=workers)
        if seconds is not None and seconds > self.run_limit_s:
            raise NotAllowedError(
                key="server.run_too_long",
                seconds=round(seconds),
                limit=round(self.run_limit_s),
                basis=Fact("wait.basis_measured" if measured else "wait.basis_predicted"),
                command=run_line(spec),
            )


def run_line(spec: RunSpec) -> str:
    """The ``python -m ckptlab run`` line of ``spec``: its model and every flag whose value is not the default."""
    defaults = _flag_groups(argv_from_spec(RunSpec()))
    groups = [group for group in _flag_groups(argv_from_spec(spec)) if group[0] == "--model" or group not in defaults]
    return shlex.join(["python", "-m", "ckptlab", "run", *(word for group in groups for word in group)])


def _flag_groups(argv: list[str]) -> list[list[str]]:
    """``["--a", "1", "--b"]`` -> ``[["--a", "1"], ["--b"]]``: each flag with its value."""
    groups: list[list[str]] = []
    for word in argv:
        if word.startswith("--") or not groups:
            groups.append([word])
        else:
            groups[-1].append(word)
    return groups


# A setting's error's key (its words in the app: errors.server.* in the locale files).
SETTING_KEYS = {
    "CKPTLAB_RUN_LIMIT_S": "server.run_limit",
    "CKPTLAB_WORKER_MEMORY_GIB": "server.worker_memory",
    "CKPTLAB_WORKERS": "server.workers",
    "CKPTLAB_WARM_LEARN": "server.warm_learn",
    "CKPTLAB_HUB": "server.hub",
    "CKPTLAB_HUB_CACHE_MIB": "server.hub_cache_mib",
}


def default_memory_cap() -> int | None:
    """The worker memory cap of a server whose instructor set none: :data:`DEFAULT_WORKER_MEMORY_SHARE` of the
    machine's physical memory (None where it cannot be read), as the size rule reads it."""
    machine = memory_limit(torch.device("cpu"))
    return None if machine is None else int(machine[0] * DEFAULT_WORKER_MEMORY_SHARE)


def _positive_setting(settings: Mapping[str, object], name: str) -> float | None:
    """The setting ``name`` as a finite number > 0, or None when unset.

    Raises:
        SpecError: naming the setting and what to use instead (``errors.<SETTING_KEYS[name]>``).
    """
    text = settings.get(name)
    if text in (None, ""):
        return None
    try:
        value = float(str(text))
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise SpecError(key=SETTING_KEYS[name], value=text)
    return value


def _choice_setting(settings: Mapping[str, object], name: str, choices: tuple[str, ...]) -> str:
    """The setting ``name`` as one of ``choices`` (any case; unset: the first).

    Raises:
        SpecError: naming the setting and what to use instead (``errors.<SETTING_KEYS[name]>``).
    """
    value = str(settings.get(name) or choices[0]).strip().lower()
    if value not in choices:
        raise SpecError(key=SETTING_KEYS[name], value=value)
    return value


def parse_max_tokens(text: str) -> dict[str, int]:
    """``"tiny-llama=65536,*=8192"`` as a dict.

    Raises:
        SpecError: a part that is not ``name=whole number >= 1``.
    """
    table: dict[str, int] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, _, number = part.partition("=")
        if not name.strip() or not number.strip().isdigit() or int(number) < 1:
            raise SpecError(key="server.max_tokens", part=part)
        table[name.strip()] = int(number)
    return table


def policy_from_environment(secrets: Mapping[str, object] | None = None) -> ServerPolicy:
    """The server's policy: environment variables first, then the same names in ``secrets``."""
    settings: dict[str, object] = dict(secrets or {})
    settings.update({key: value for key, value in os.environ.items() if key.startswith("CKPTLAB_")})
    return ServerPolicy.from_settings(settings)


PHRASE_DELAY_FIRST_S = 1.0  # the wait after a session's first wrong phrase; it doubles with each one after
PHRASE_DELAY_MAX_S = 300.0  # and stops growing at five minutes


@dataclass
class PhraseDelay:
    """A session's wait before its next try of the instructor's phrase: none at first, then 1 s, 2 s, 4 s, ... (at
    most :data:`PHRASE_DELAY_MAX_S`) after each wrong one, so guessing it from one session is slow. A try during
    the wait is not checked at all. Kept in the session's state: a new session starts at none (docs/security.md)."""

    wrong: int = 0  # wrong phrases since the last right one
    until: float = 0.0  # time.monotonic() before which no phrase is checked

    def wait_s(self, now: float) -> float:
        """Seconds left before a phrase is checked again (0: check it now)."""
        return max(0.0, self.until - now)

    def failed(self, now: float) -> float:
        """A wrong phrase at ``now``: the wait grows; returns it in seconds."""
        self.wrong += 1
        wait = min(PHRASE_DELAY_FIRST_S * 2 ** min(self.wrong - 1, 32), PHRASE_DELAY_MAX_S)
        self.until = now + wait
        return wait

    def passed(self) -> None:
        """The right phrase: no wait any more."""
        self.wrong, self.until = 0, 0.0
