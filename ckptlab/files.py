"""A file the lab (or a loader it calls) is about to open, checked with ``stat`` first; JSON read with bounds.

``open()`` on a FIFO waits for a writer forever, on ``/dev/zero`` reads until memory runs out, on a
directory raises ``IsADirectoryError``: none of them is a message. So every file the lab opens (a
``--training-args`` file, a model folder's config, index and weights) is ``stat``-ed first
(:func:`regular_file_size`), and anything but a regular file is refused with one message saying what
it is. A swap between this check and the open (by someone who can write the folder) stays possible:
the check is about mistakes and hostile names, not about a racing writer (docs/security.md).

Python's ``json`` parses nesting by recursion: 100,000 levels of ``[`` raise ``RecursionError``.
:func:`json_depth` measures the nesting without parsing, so a reader refuses it by a bound first.
"""

from __future__ import annotations

import os
import re
import stat

from .errors import CkptlabError

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


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)  # a JSON string, its escapes included
_BRACKETS = re.compile(r"[\[\]{}]")
