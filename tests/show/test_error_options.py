"""Core errors name the settings they are about as typed references (Option, Command); each edge words them.

The command line says flags and command lines, the app its widgets and pages (never a ``--`` flag),
Python the API's own words; the core's messages hold no flag (ARCHITECTURE.md: the core does not know
the CLI). These tests decide on the references and on the flags the CLI's parser has, not on sentences.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from ckptlab import RunSpec
from ckptlab.cli import build_parser
from ckptlab.cli.args import option_flags
from ckptlab.errors import UNSET, CkptlabError, Command, Option, SpecError
from ckptlab.explore.predict_training import training_bytes
from ckptlab.explore.sweep import SweepSpec
from ckptlab.model.presets import check_model_named
from ckptlab.show import i18n
from ckptlab.show.wording import app_message, cli_flag, cli_line, cli_message
from ckptlab.step import preflight
from ckptlab.step.fake_experts import unsupported_moe_error
from ckptlab.step.fsdp import launched_group
from ckptlab.step.training import check_optimizer_runs
from tests.test_errors import keyed_errors

FLAGS = option_flags(build_parser())


def _raised(action) -> CkptlabError:
    with pytest.raises(CkptlabError) as caught:
        action()
    return caught.value


def _option_errors(tmp_path, monkeypatch) -> list[CkptlabError]:
    """The errors whose params hold an Option or a Command, each raised by the code that raises it."""
    specs = [
        RunSpec(world_size=2),
        RunSpec(world_size=0),
        RunSpec(fsdp=True),
        RunSpec(fsdp=True, world_size=2, lora_rank=4),
        RunSpec(mixed_precision="bf16", dtype="float16"),
        RunSpec(gradient_accumulation_steps=0),
        RunSpec(selective="attention", every_n_layers=None),
        RunSpec(repeats=10**9),
    ]
    found = [_raised(spec.validate) for spec in specs]
    low_bit = RunSpec(optimizer="adamw_torch_8bit")
    found.append(_raised(lambda: check_optimizer_runs(low_bit, device_type="cpu", simulated=True)))
    found.append(_raised(lambda: check_optimizer_runs(low_bit, device_type="cpu")))
    found.append(_raised(lambda: training_bytes("tiny-llama", torch.float32, optimizer="adafactor")))
    found.append(_raised(lambda: training_bytes("tiny-llama", torch.float32, lora_targets=["q_proj"])))
    found.append(_raised(SweepSpec(every_n_layers=()).validate))
    a_file = tmp_path / "weights.bin"
    a_file.write_text("")
    found.append(_raised(lambda: check_model_named(str(a_file))))
    found.append(unsupported_moe_error("tiny-moe", "moe", RuntimeError("nonzero")))

    def outside_a_launcher() -> None:
        with launched_group("cpu"):
            pass

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    found.append(_raised(outside_a_launcher))
    monkeypatch.setattr(preflight.torch.cuda, "is_available", lambda: False)
    found.append(_raised(lambda: preflight.resolve_device("cuda")))
    found += keyed_errors(tmp_path)
    return [error for error in found if _references(error)]


def _references(error: CkptlabError) -> list[Option | Command]:
    return [value for value in error.params.values() if isinstance(value, Option | Command)]


def test_every_option_bearing_error_speaks_flags_on_the_command_line_and_widgets_in_the_app(tmp_path, monkeypatch):
    errors = _option_errors(tmp_path, monkeypatch)
    keys = {error.key for error in errors}
    assert {"spec.every_n_layers", "spec.fsdp_one_rank", "model.is_a_file", "spec.no_cuda"} <= keys, keys
    for error in errors:
        cli = cli_message(error, FLAGS)
        for reference in _references(error):
            if isinstance(reference, Command):
                assert cli_line(reference, FLAGS).startswith("python -m ckptlab ") and cli_line(reference, FLAGS) in cli
                continue
            flag = cli_flag(reference, FLAGS, "run")
            assert flag in cli, (error.key, reference)
            if reference.field in FLAGS["run"] or f"{reference.field}={reference.value!r}" in FLAGS["run"]:
                assert flag.startswith("--"), (error.key, reference)  # a setting the CLI has a flag for is its flag
        for lang in i18n.LANGUAGES:
            assert "--" not in app_message(error, lang), (lang, error.key, app_message(error, lang))
        assert str(error) == error.worded()  # Python reads the API's words
        assert "--" not in str(error), error.key


def test_an_error_keeps_its_references_through_pickling(tmp_path, monkeypatch):
    """A worker process's error crosses back whole: its page still words its options as widgets."""
    for error in _option_errors(tmp_path, monkeypatch):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and back.params == error.params and back.key == error.key
        assert str(back) == str(error) and cli_message(back, FLAGS) == cli_message(error, FLAGS)
        assert app_message(back, "ja") == app_message(error, "ja")
    assert pickle.loads(pickle.dumps(Option("lora_rank"))).value is UNSET


def test_a_flag_is_the_parsers_and_the_command_decides_the_ranks_flag():
    assert cli_flag(Option("every_n_layers", 0), FLAGS, "run") == "--every-n-layers 0"
    assert cli_flag(Option("every_n_layers", None), FLAGS, "run") == "--no-checkpointing"
    assert (
        cli_flag(Option("offload", True), FLAGS, "run")
        == cli_flag(Option("offload", True), FLAGS, "sweep")
        == "--offload"
    )
    assert cli_flag(Option("world_size", 2), FLAGS, "run") == "--nproc-per-node 2"
    assert cli_flag(Option("world_size", 2), FLAGS, "simulate") == "--world-size 2"
    assert cli_flag(Option("no_such_field", 3), FLAGS, "run") == "no_such_field=3"  # no flag: Python's words
    assert cli_line(Command("simulate", (Option("model", "a b"),)), FLAGS) == "python -m ckptlab simulate --model 'a b'"


def test_an_error_is_a_key_and_params_worded_from_the_locale_files_and_a_param_keeps_its_braces():
    error = SpecError(key="spec.whole_number", option=Option("seq_len", 0), minimum=1)
    assert str(error) == "seq_len=0 is not valid: it must be a whole number >= 1."
    assert cli_message(error, FLAGS) == "--seq-len 0 is not valid: it must be a whole number >= 1."
    assert str(SpecError(key="spec.not_a_size", name="a {brace}", value="'x'")).startswith("a {brace} 'x' is not")
    with pytest.raises(TypeError):
        SpecError("a sentence written where it is raised")  # type: ignore[misc]
