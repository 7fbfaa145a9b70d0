"""The files a model folder may lead to: resolved, and inside the models root, before any loader opens one.

A folder a shared server offers lies under its models root (``CKPTLAB_MODELS_ROOT``), but the
files in it need not: ``config.json`` or ``model.safetensors`` can be a symbolic link to any
file of the server, and a ``model.safetensors.index.json`` can name any path as a shard
(transformers joins it to the folder, and an absolute name replaces the folder). The loaders
would open them: transformers in Python, safetensors in Rust, where no Python audit hook sees it.

So :func:`check_folder` runs first, on every local load (:func:`ckptlab.model.configs.load_config`,
which ``describe``, ``build_model`` and ``simulate`` all start with): every entry of the folder
(any of them may be opened: config, weights, generation config, an adapter's config) and every
shard its index files name is resolved (``..`` and symbolic links followed) and must lie inside
the root; otherwise one message names the file. A shard name must also be a plain relative
name. Without a root (``python -m ckptlab``, ``import ckptlab``: the person at the terminal owns
the machine) links are followed wherever they go, as the Hugging Face cache's links into its
blobs need, and only the shard names are checked.

The root is process-wide, as the server's policy is: the app sets it from its policy
(:func:`confine`), and a worker process gets the parent's with each job (``ckptlab.lab.workers``).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ..errors import ModelLoadError
from ..files import regular_file_size

INDEX_SUFFIX = ".index.json"  # model.safetensors.index.json, pytorch_model.bin.index.json
MAX_INDEX_BYTES = 16 * 2**20  # an index of a 400B model's shards is a few MiB
# The names transformers, safetensors and torch open in a model folder: configs, indexes, weights.
LOADED_SUFFIXES = (".json", ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".gguf")

_ROOT: Path | None = None
_ROOT_LOCK = threading.Lock()


def confine(root: str | os.PathLike[str] | None) -> None:
    """Every model folder this process loads from now on must keep its files inside ``root`` (None: no root)."""
    global _ROOT
    with _ROOT_LOCK:
        _ROOT = None if root is None else Path(root).resolve()


def confined_root() -> Path | None:
    """The models root of this process (:func:`confine`), or None."""
    with _ROOT_LOCK:
        return _ROOT


def check_folder(folder: str) -> None:
    """Refuse a model folder any of whose files leads outside the models root, or whose index names a bad shard.

    Raises:
        ModelLoadError: naming the file (``folder.file_outside_root``, ``folder.bad_shard_name``).
    """
    root = confined_root()
    if "\x00" in folder:
        return  # no such folder can exist: load_config says it is not found
    if root is not None:
        _inside(Path(folder), folder, root)
    try:
        with os.scandir(folder) as listing:
            entries = sorted(entry.path for entry in listing)
    except (OSError, ValueError):  # no such folder, or a NUL in its name: load_config says so
        return
    for path in entries:
        if root is not None:
            _inside(Path(path), path, root)
        _check_kind(path)
        if path.endswith(INDEX_SUFFIX) and os.path.isfile(path):
            for shard in _shards(path):
                if root is not None:
                    _inside(Path(folder) / shard, os.path.join(folder, shard), root)
                regular_file_size(os.path.join(folder, shard), ModelLoadError)


def _check_kind(path: str) -> None:
    """Refuse an entry a loader could open that is not a regular file: any FIFO, device or socket, and a
    directory bearing the name of a file a loader opens (a folder of checkpoints beside the weights is fine)."""
    if os.path.isdir(path) and not path.endswith(LOADED_SUFFIXES):
        return
    regular_file_size(path, ModelLoadError)


def _inside(path: Path, shown: str, root: Path) -> None:
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ModelLoadError(key="folder.file_outside_root", file=shown, root=str(root))


def _shards(index_file: str) -> list[str]:
    """The shard names of an index file's ``weight_map``, each a plain relative name."""
    if (regular_file_size(index_file, ModelLoadError) or 0) > MAX_INDEX_BYTES:
        raise _bad_index(index_file)
    try:
        with open(index_file, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError, RecursionError):
        return []  # not JSON: transformers' own error says so when it loads the weights
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return []
    # A value that is not a text (a list, an object) is no shard's name: refused below, never hashed.
    shards = {value if isinstance(value, str) else repr(value)[:80] for value in weight_map.values()}
    bad = [value for value in weight_map.values() if not isinstance(value, str)]
    for shard in [*bad[:1], *sorted(shards)]:
        if (
            not isinstance(shard, str)
            or not shard
            or os.path.isabs(shard)
            or ".." in Path(shard).parts
            or "\x00" in shard
            or shard.startswith("~")
        ):
            raise ModelLoadError(key="folder.bad_shard_name", file=index_file, shard=repr(shard)[:80])
    return sorted(shards)


def _bad_index(index_file: str) -> ModelLoadError:
    return ModelLoadError(key="folder.index_too_large", file=index_file, limit=f"{MAX_INDEX_BYTES // 2**20}")
