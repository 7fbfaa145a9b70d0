"""A model folder's weight files, checked before the model is allocated (step 3 of ``ckptlab.model.folder_checks``).

Safetensors headers and ``pytorch_model.bin`` pickles are read on the ``meta`` device (no
tensor data), so a truncated file, an absurd header, a pickle that is not plain tensors or
a shape that does not match the config is refused by :func:`check_weights` before the
model is allocated; :func:`weights_error` turns what transformers' own loading raised into
one message. Every message names the file and the tensor, and says how to fix it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
from collections.abc import Iterable
from typing import Any

import torch
from safetensors import SafetensorError

from ..errors import ModelLoadError, one_line
from ..fact import Fact

# safetensors itself refuses headers above 100 MB ("header too large").
MAX_SAFETENSORS_HEADER: int = 100_000_000


def check_weights(files: Iterable[str], meta_model: torch.nn.Module, config: Any) -> None:
    """Read the headers of ``files`` (no tensor data) and compare their shapes with ``meta_model``.

    Only tensors whose name the model has are compared; names transformers renames on
    loading are left to it, and quantized checkpoints (``quantization_config``) are not
    compared at all, since their stored shapes are packed.

    Raises:
        ModelLoadError: a truncated or corrupt file, a pickle that is not plain tensors,
            or a tensor whose shape the config contradicts.
    """
    expected = {name: tuple(t.shape) for name, t in meta_model.state_dict().items()}
    compare = getattr(config, "quantization_config", None) is None
    for file in sorted(files):
        shapes = _safetensors_shapes(file) if file.endswith(".safetensors") else _bin_shapes(file)
        if not compare or shapes is None:
            continue
        wrong = [
            (name, shape, expected[name])
            for name, shape in shapes.items()
            if name in expected and shape != expected[name]
        ]
        if wrong:
            name, stored, built = wrong[0]
            text = config.get_text_config().to_dict()
            fields = [
                f"{key}={value}"
                for key, value in text.items()
                if type(value) is int and value in set(built) - set(stored)
            ][:3]
            raise ModelLoadError(
                key="weights.shapes",
                file=repr(file),
                tensor=name,
                stored=str(list(stored)),
                built=str(list(built)),
                fields=f" ({', '.join(fields)})" if fields else "",
                more=Fact("weights.more_differ", {"count": len(wrong) - 1}) if len(wrong) > 1 else "",
            )


def _safetensors_shapes(file: str) -> dict[str, tuple[int, ...]]:
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad_weights(
                file,
                Fact("weights.too_short", {"size": size}),
            )
        (header_len,) = struct.unpack("<Q", head)
        if header_len > MAX_SAFETENSORS_HEADER:
            raise _bad_weights(
                file,
                Fact("weights.header_over_limit", {"header": header_len, "limit": MAX_SAFETENSORS_HEADER}),
            )
        if 8 + header_len > size:
            raise _bad_weights(
                file,
                Fact("weights.header_cut", {"header": header_len, "size": size}),
            )
        header = f.read(header_len)
    try:
        entries = json.loads(header)
        if not isinstance(entries, dict):
            raise TypeError  # not an object: the header is not a table (said below)
        shapes, end = {}, 0
        for name, entry in entries.items():
            if name != "__metadata__":
                shapes[name] = tuple(int(d) for d in entry["shape"])
                end = max(end, int(entry["data_offsets"][1]))
    # OverflowError: int(Infinity), which Python's json reads from a header's "shape" or "data_offsets".
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError):
        raise _bad_weights(file, Fact("weights.bad_header")) from None
    data = size - 8 - header_len
    if end > data:
        raise _bad_weights(
            file,
            Fact("weights.data_cut", {"end": end, "data": data}),
        )
    return shapes


def _bin_shapes(file: str) -> dict[str, tuple[int, ...]] | None:
    """Shapes in a ``torch.save`` zip file, loaded onto ``meta``; None for the legacy format (left to transformers)."""
    with open(file, "rb") as f:
        if f.read(2) != b"PK":
            if os.path.getsize(file) == 0:
                raise _bad_weights(file, Fact("weights.empty"))
            return None
    try:
        state = torch.load(file, map_location="meta", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        raise _refused_pickle(file, exc) from None
    except (RuntimeError, OSError) as exc:  # torch's zip reader: RuntimeError, or OSError under mmap
        raise _bad_weights(file, Fact("weights.unreadable", {"error": _first_sentence(exc)})) from None
    if not isinstance(state, dict):
        raise _bad_weights(file, Fact("weights.not_a_state_dict", {"kind": type(state).__name__}))
    return {name: tuple(t.shape) for name, t in state.items() if isinstance(t, torch.Tensor)}


def _first_sentence(exc: BaseException) -> str:
    return one_line(exc, 160).split(". ")[0].rstrip(".")


def _bad_weights(file: str, problem: Fact) -> ModelLoadError:
    return ModelLoadError(key="weights.bad", file=file, problem=problem)


def _refused_pickle(file: str, exc: BaseException) -> ModelLoadError:
    blocked = re.search(r"GLOBAL (\S+)", str(exc))
    what = f" ({blocked.group(1)})" if blocked else ""
    return ModelLoadError(key="weights.pickle", file=file, what=what)


def weights_error(path: str, exc: BaseException) -> ModelLoadError | None:
    """One line for what ``from_pretrained`` raised on the weights of ``path``; None if it is not about them."""
    if isinstance(exc, pickle.UnpicklingError):
        return _refused_pickle(os.path.join(path, "pytorch_model.bin"), exc)
    if isinstance(exc, SafetensorError):
        return _bad_weights(
            os.path.join(path, "model.safetensors"),
            Fact("weights.safetensors_unreadable", {"error": _first_sentence(exc)}),
        )
    text = str(exc)
    if "ignore_mismatched_sizes" in text:
        return ModelLoadError(key="weights.mismatch", path=path)
    if "PytorchStreamReader" in text or "zip archive" in text:
        return _bad_weights(
            os.path.join(path, "pytorch_model.bin"), Fact("weights.unreadable", {"error": _first_sentence(exc)})
        )
    return None
