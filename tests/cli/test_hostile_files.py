"""Files that would hang, exhaust or mislead a loader: each refused with one line and exit 2, nothing opened.

Most cases run in-process through ``main([...])`` (no model is built: a refusal comes before); two run as
subprocesses under a 4 GiB address-space cap, where a hang or a read of ``/dev/zero`` would show as a
timeout or a MemoryError rather than a message.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import ckptlab
from ckptlab.cli import main
from ckptlab.errors import CkptlabError, ModelLoadError, SpecError
from ckptlab.files import json_depth, regular_file_size
from ckptlab.model.catalog import describe
from tests.model.test_folders import config_folder

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def nothing_is_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the file was refused")

    monkeypatch.setattr(ckptlab.model.catalog, "instantiate", refuse)
    monkeypatch.setattr(ckptlab.model.catalog.AutoModelForCausalLM, "from_pretrained", refuse)


def _one_line(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"accelerator_config": "/dev/zero"}, "set accelerator_config: a file or a DeepSpeed"),
        ({"fsdp": "full_shard", "fsdp_config": "/dev/zero"}, "set fsdp_config"),
        ({"accelerator_config": "/etc/passwd"}, "nothing it names was opened"),
        ({"deepspeed": "ds_config.json"}, "set deepspeed"),
        ({"deepspeed": {"zero_optimization": {"stage": 3}}}, "set deepspeed"),
        ({"fsdp_config": {"min_num_params": 1}}, "set fsdp_config"),
        ({"activation_checkpointing_kwargs": "[1,2]"}, "not a JSON object of keyword arguments (a JSON list"),
        (  # transformers honours it; the lab's steps run the non-reentrant variant: refused by name, never dropped
            {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": True}},
            "set use_reentrant=True in activation_checkpointing_kwargs, which the lab does not run",
        ),
        (
            {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": '{"context_fn": "os.system"}'},
            "set context_fn='os.system' in gradient_checkpointing_kwargs, which the lab does not run",
        ),
        ({"gradient_checkpointing_kwargs": "{" * 50 + "}" * 50}, "nested over 16 deep"),
        ({"lr_scheduler_kwargs": "[" * 5000 + "]" * 5000}, "set lr_scheduler_kwargs to the text"),
        ({"bf16": True, "fp16": True}, "both bf16 and fp16"),
        ({"optim": "sgd", "optim_args": "=====;;;"}, "is not one key=value pair"),
        ({"optim": "sgd", "optim_args": "momentum=abc"}, "momentum=abc is not a number"),
        ({f"no_such_field_{i}": 1 for i in range(5000)}, "and 4,990 more"),
        ({"per_device_train_batch_size": "x" * 100_000}, "(expected int)"),
    ],
)
def test_a_training_args_field_that_names_a_file_or_is_malformed_is_one_line(tmp_path, capsys, fields, words):
    path = tmp_path / "args.json"
    path.write_text(json.dumps(fields))
    err = _one_line(["simulate", "--model", "tiny-llama", "--training-args", str(path)], capsys)
    assert words in err and len(err) < 1200, err


def test_fields_read_not_counted_are_named_and_never_opened(tmp_path, monkeypatch):
    # output_dir on a device and a scheduler's kwargs as JSON text: read, named as not counted, nothing opened.
    fields = {"output_dir": "/dev/zero", "learning_rate": 1e-4, "lr_scheduler_kwargs": '{"power": 2}'}
    path = tmp_path / "args.json"
    path.write_text(json.dumps(fields))
    spec = ckptlab.RunSpec.from_training_args(ckptlab.training_args.load_training_args_file(path), model="tiny-llama")
    assert spec.batch_size == 8
    reading = ckptlab.training_args.read_training_args(fields)
    assert reading.unused == ("learning_rate", "lr_scheduler_kwargs", "output_dir")
    # What the lab runs is taken: transformers' own default, spelled out.
    kwargs = {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}}
    assert ckptlab.RunSpec.from_training_args(kwargs).every_n_layers == 1


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: os.mkfifo(p), "is a FIFO (a named pipe)"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.symlink_to("/dev/null"), "is a character device"),
        (lambda p: p.write_text("[" * 1000 + "]" * 1000), "levels deep"),
        (lambda p: p.write_bytes(b"\xff\xfe{}"), "'utf-8' codec"),
        (lambda p: p.write_text('{"x": NaN}'), "NaN is not a number JSON allows"),
    ],
)
@pytest.mark.parametrize("flag", ["--training-args", "--quantization-config"])  # one reader: ckptlab.files
def test_a_json_path_that_is_not_a_regular_json_file_is_one_line(tmp_path, capsys, make, words, flag):
    path = tmp_path / "args.json"
    make(path)
    err = _one_line(["sweep", "--model", "tiny-llama", flag, str(path)], capsys)
    assert words in err, err


def _weights(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    ("name", "make", "words"),
    [
        ("model.safetensors", os.mkfifo, "is a FIFO"),
        ("pytorch_model.bin", os.mkfifo, "is a FIFO"),
        ("config.json.fifo", os.mkfifo, "is a FIFO"),  # any FIFO in a model folder, whatever its name
        ("model.safetensors", os.mkdir, "is a directory"),
        ("generation_config.json", lambda p: os.symlink("/dev/zero", p), "is a character device"),
        (
            "model.safetensors",
            lambda p: Path(p).write_bytes(
                _weights(b'{"w": {"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 4]}}')
            ),
            "not a valid safetensors table",
        ),
        (
            "model.safetensors",
            lambda p: Path(p).write_bytes(
                _weights(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, Infinity]}}')
            ),
            "not a valid safetensors table",
        ),
        (
            "model.safetensors.index.json",
            lambda p: Path(p).write_text(json.dumps({"weight_map": {"a": ["x"], "b": {"c": 1}}})),
            "names the shard ['x']",
        ),
        (
            "model.safetensors.index.json",
            lambda p: (
                Path(p).write_text(json.dumps({"weight_map": {"a": "s.safetensors"}})),
                os.mkfifo(Path(p).parent / "s.safetensors"),
            ),
            "s.safetensors' is a FIFO",
        ),
    ],
)
def test_a_model_folder_file_that_is_not_a_regular_file_or_is_malformed_is_one_line(
    tmp_path, capsys, name, make, words
):
    folder = config_folder(tmp_path / "m")
    make(str(folder / name))
    err = _one_line(["simulate", "--model", str(folder), "--seq-len", "16"], capsys)
    assert words in err, err


def test_the_python_api_raises_the_labs_error_for_the_same_files(tmp_path):
    folder = config_folder(tmp_path / "m")
    os.mkfifo(folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="is a FIFO") as caught:
        describe(str(folder))
    assert caught.value.key == "file.fifo"
    with pytest.raises(SpecError, match="set deepspeed"):
        ckptlab.RunSpec.from_training_args({"deepspeed": "/dev/zero"})
    with pytest.raises(SpecError, match="optim_args='lr=abc' is not valid"):
        ckptlab.RunSpec(optim_args="lr=abc").validate()
    assert regular_file_size(tmp_path / "missing") is None
    with pytest.raises(CkptlabError, match="is a directory"):
        regular_file_size(tmp_path)
    assert json_depth('{"a": "[[[[\\"[", "b": [[1]]}') == 3


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))


def test_under_a_4_gib_cap_a_fifo_weight_file_a_dev_zero_config_and_a_huge_rank_answer_at_once(tmp_path):
    folder = config_folder(tmp_path / "m")
    os.mkfifo(folder / "model.safetensors")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"accelerator_config": "/dev/zero"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv, words in (
        (["simulate", "--model", str(folder)], "is a FIFO"),
        (["run", "--model", "tiny-bert", "--training-args", str(args)], "set accelerator_config"),
        (["run", "--model", "tiny-bert", "--lora-rank", "1000000"], "--lora-rank 1000000 is more than the lab runs"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "ckptlab", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_capped,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
