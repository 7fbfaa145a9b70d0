"""A file the lab (or a loader it calls) is about to open, checked with ``stat`` first; JSON read with bounds.

``open()`` on a FIFO waits for a writer forever, on ``/dev/zero`` reads until memory runs out, on a
directory raises ``IsADirectoryError``: none of them is a message. So every file the lab opens (a
``--training-args`` file, a model folder's config, index and weights) is ``stat``-ed first
(:func:`regular_file_size`), and anything but a regular file is refused with one message saying what
it is. A swap between this check and the open (by someone who can write the folder) stays possible:
the check is about mistakes and hostile names, not about a racing writer (docs/security.md).

Python's ``json`` parses nesting by recursion: 100,000 levels of ``[`` raise ``RecursionError``.
:func:`json_depth` measures the nesting without parsing, so a reader refuses it by a bound first.
:func:`read_json_object` is the one reader of a JSON file of fields (``--training-args``, ``--quantization-config``).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

from .errors import CkptlabError
from .fact import Fact, worded

_KINDS = (  # the kinds of file a path is refused as, the key of each ("errors.file.<key>") and its param
    (stat.S_ISFIFO, "file.fifo", ""),
    (stat.S_ISCHR, "file.device", "character"),
    (stat.S_ISBLK, "file.device", "block"),
    (stat.S_ISDIR, "file.directory", ""),
    (stat.S_ISSOCK, "file.socket", ""),
)


def regular_file_size(path: str | os.PathLike[str], error: type[CkptlabError] = CkptlabError) -> int | None:
    """The size of ``path`` when it is a regular file (symbolic links followed); None when nothing is there.

    Raises:
        error: ``path`` is a FIFO, a device, a directory or a socket (keys ``file.fifo``, ``file.device``,
            ``file.directory``, ``file.socket``, else ``file.special``), naming it and what it is.
    """
    try:
        info = os.stat(path)
    except (OSError, ValueError):  # missing, unreadable, or a NUL in the name: the caller's open says which
        return None
    if stat.S_ISREG(info.st_mode):
        return info.st_size
    shown = os.fspath(path)
    key, kind = next(((key, kind) for test, key, kind in _KINDS if test(info.st_mode)), ("file.special", ""))
    raise error(key=key, file=shown, kind=kind)


def json_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON ``text`` (brackets inside strings do not count), unparsed."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def read_json_object(
    path: str | os.PathLike[str],
    *,
    max_bytes: int,
    max_depth: int,
    refuse: Callable[[Fact | str], CkptlabError],
    error: type[CkptlabError] = CkptlabError,
) -> dict[str, Any]:
    """The JSON object in the file at ``path``: ``stat``-ed first (:func:`regular_file_size`), read to ``max_bytes``
    at most, its nesting bounded by ``max_depth`` before it is parsed, NaN and Infinity refused.

    Args:
        refuse: the caller's keyed error for a problem, which is a fact (``said.file.no_such_file``,
            ``file.over_bytes`` with ``limit``, ``file.nested`` with ``depth``, ``file.not_a_json_number`` with
            ``name``, ``file.not_object`` with ``kind``) or the json library's own words (a str, cut at 200).
        error: the class :func:`regular_file_size` raises for a file that is not a regular one.

    Raises:
        ``refuse(problem)``: no such file, too large, too deep, not JSON, or not an object.
        error: a FIFO, a device, a directory or a socket (keys ``file.*``, :func:`regular_file_size`).
    """
    size = regular_file_size(path, error)
    if size is None:
        raise refuse(Fact("file.no_such_file"))
    over = Fact("file.over_bytes", {"limit": max_bytes})
    if size > max_bytes:
        raise refuse(over)
    try:
        with open(path, "rb") as opened:
            text = opened.read(max_bytes + 1).decode("utf-8")  # bounded even if it grew since the stat
        if len(text) > max_bytes:
            raise _Refused(over)
        if json_depth(text) > max_depth:
            raise _Refused(Fact("file.nested", {"depth": max_depth}))
        data = json.loads(text, parse_constant=_refuse_constant)
    except _Refused as refused:
        raise refuse(refused.reason) from None
    except (ValueError, UnicodeDecodeError, RecursionError, OSError) as error:
        raise refuse(str(error)[:200]) from None  # the library's own words
    if not isinstance(data, dict):
        raise refuse(Fact("file.not_object", {"kind": type(data).__name__}))
    return data


class _Refused(ValueError):
    """Why a JSON text is refused, as a fact (caught in :func:`read_json_object`)."""

    def __init__(self, reason: Fact) -> None:
        super().__init__(worded(reason))
        self.reason = reason


def _refuse_constant(name: str) -> Any:
    raise _Refused(Fact("file.not_a_json_number", {"name": name}))


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)  # a JSON string, its escapes included
_BRACKETS = re.compile(r"[\[\]{}]")
