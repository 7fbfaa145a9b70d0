"""A model folder under the models root cannot lead a loader outside it: links and shard names, refused by name.

safetensors opens its files in Rust, where Python's audit hook sees nothing, so the proof is at the
loaders' doors: every path handed to ``safe_open``, ``torch.load`` or Python's ``open`` is recorded,
and none may lie outside the root.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import safetensors
import torch
import transformers.modeling_utils

from ckptlab.errors import ModelLoadError
from ckptlab.model import catalog, folder_files
from tests.model.test_folders import weights_folder

_OPENED: list[str] | None = None  # paths Python opened while a test records


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # an audit hook cannot be removed: it records only while _OPENED is a list


@pytest.fixture
def opened(monkeypatch):
    """Every path a loader was handed while the test ran: Python's opens, and safetensors' and torch's own."""
    global _OPENED
    _OPENED = paths = []

    def recording(function):
        def wrapper(path, *args, **kwargs):
            paths.append(os.fspath(path))
            return function(path, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(transformers.modeling_utils, "safe_open", recording(transformers.modeling_utils.safe_open))
    monkeypatch.setattr(safetensors, "safe_open", recording(safetensors.safe_open))
    monkeypatch.setattr(torch, "load", recording(torch.load))
    yield paths
    _OPENED = None


@pytest.fixture
def tree(tmp_path):
    """models/ (the root) and outside/ (a real model beside it, which nothing may open)."""
    root, outside = tmp_path / "models", tmp_path / "outside"
    root.mkdir()
    weights_folder(outside)
    config_text = (outside / "config.json").read_text()  # read now: once the test records, nothing opens outside/
    folder_files.confine(root)
    yield root, outside, config_text
    folder_files.confine(None)


def _refused(folder: Path, opened: list[str], outside: Path, key: str, names: str) -> None:
    for load in (lambda: catalog.describe(str(folder)), lambda: catalog.build_model(str(folder))):
        with pytest.raises(ModelLoadError) as raised:
            load()
        assert raised.value.key == key and names in str(raised.value)
    assert not [path for path in opened if Path(path).resolve().is_relative_to(outside.resolve())], opened


def _copy_config(config_text: str, folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text(config_text)


def test_a_config_json_linked_outside_the_root_is_refused_naming_it(tree, opened):
    root, outside, _config_text = tree
    folder = root / "linked-config"
    folder.mkdir()
    (folder / "config.json").symlink_to(outside / "config.json")
    _refused(folder, opened, outside, "folder.file_outside_root", "config.json")


def test_weights_linked_outside_the_root_are_refused_naming_them(tree, opened):
    root, outside, config_text = tree
    folder = root / "linked-weights"
    _copy_config(config_text, folder)
    (folder / "model.safetensors").symlink_to(outside / "model.safetensors")
    _refused(folder, opened, outside, "folder.file_outside_root", "model.safetensors")


def test_a_folder_linked_outside_the_root_is_refused(tree, opened):
    root, outside, _config_text = tree
    (root / "linked-folder").symlink_to(outside, target_is_directory=True)
    _refused(root / "linked-folder", opened, outside, "folder.file_outside_root", "linked-folder")


@pytest.mark.parametrize("shard", ["absolute", "../outside/model.safetensors"])
def test_an_index_naming_a_shard_outside_the_folder_is_refused_naming_it(tree, opened, shard):
    root, outside, config_text = tree
    folder = root / "indexed"
    _copy_config(config_text, folder)
    name = str(outside / "model.safetensors") if shard == "absolute" else shard
    index = {"metadata": {}, "weight_map": {"transformer.wte.weight": name}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(folder, opened, outside, "folder.bad_shard_name", "model.safetensors.index.json")


def test_a_folder_inside_the_root_loads_and_opens_only_its_own_files(tree, opened):
    root, outside, _config_text = tree
    folder = root / "whole"
    weights_folder(folder)
    _model, info = catalog.build_model(str(folder))
    assert info.weights == "loaded"
    assert opened and all(
        not Path(path).resolve().is_relative_to(outside.resolve()) for path in opened if os.path.isabs(path)
    )


def test_without_a_root_links_are_followed_as_the_hub_cache_needs(tmp_path):
    outside = weights_folder(tmp_path / "blobs")
    folder = tmp_path / "snapshot"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).symlink_to(outside / name)
    assert folder_files.confined_root() is None
    assert catalog.describe(str(folder)).weights == "loaded"
