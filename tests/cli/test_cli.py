"""The command line and the Python API on bad input: one clear message, exit status 2, no traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from transformers import OpenAIGPTConfig

from ckptlab import DoesNotFitError, ModelLoadError, RunSpec, SpecError, UnsupportedModelError, diagram, measure
from ckptlab.cli import main
from tests.conftest import FAST

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

QUICK = ["--seq-len", "64", "--repeats", "1", "--warmup", "0"]

DESIGN_DIAGRAM = """\
every_n_layers=2
Forward:   input  -> [L1] -> [L2] -> [L3] -> [L4] -> [L5] -> [L6]
                      CP     keep     CP     keep     CP     keep
Backward:  output <- [L6] <- [L5] <- [L4] <- [L3] <- [L2] <- [L1]
                     keep   rerun    keep   rerun    keep   rerun"""


def test_text_diagram_is_the_one_in_design_md():
    roles = ["CP", "keep"] * 3
    assert diagram(roles, ["rerun" if r == "CP" else "keep" for r in roles], "every_n_layers=2") == DESIGN_DIAGRAM


def test_run_prints_the_diagram_and_the_measurements(capsys):
    assert main(["run", "--every-n-layers", "2", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "Forward:   input  -> [L1] -> [L2]" in out
    assert "Backward:  output <- [L6] <- [L5]" in out
    assert "CP     keep" in out and "rerun" in out
    for words in ("baseline before the forward", "resident after the forward", "peak over the step", "reached in:"):
        assert words in out
    assert "measured on the CPU" in out
    assert "Against checkpointing off" in out  # the comparison run, with the spread judged


def test_run_json_holds_what_the_issue_lists(capsys):
    assert main(["run", "--json", "--every-n-layers", "3", *QUICK]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"spec", "layers", "memory", "timing", "provenance"} <= data.keys()
    for layer in data["layers"]:
        assert {"index", "planned", "forward_calls", "recompute_calls", "saved_bytes"} <= layer.keys()
    assert [layer["planned"] for layer in data["layers"]] == ["CP", "keep", "keep", "CP", "keep", "keep"]
    assert {"baseline_bytes", "after_forward_bytes", "peak_bytes", "method", "peak_where"} <= data["memory"].keys()
    assert {"forward_s", "backward_s", "step_s"} <= data["timing"].keys()
    assert data["provenance"]["kind"] == "measured-cpu"


def test_models_lists_presets_as_text_and_json(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "tiny-llama" in text and "qwen3-8b" in text and "8.19B" in text
    # No column runs into the next (the longest names, tiny-qwen3-moe and qwen3_moe, ran together once).
    table = [line for line in text.splitlines() if line and not line.startswith("default:")]
    assert all(len(re.split(r"\s{2,}", line.strip())) == 7 for line in table), table
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"name", "family", "num_layers", "hidden_size", "num_params", "cpu_ok"} <= rows[0].keys()


@pytest.fixture
def no_config_dir(tmp_path):
    folder = tmp_path / "no-config"
    folder.mkdir()
    (folder / "README.txt").write_text("no config here")
    return folder


@pytest.fixture
def no_layers_dir(tmp_path):
    folder = tmp_path / "openai-gpt"
    OpenAIGPTConfig(n_layer=2, n_embd=32, n_head=2, vocab_size=100).save_pretrained(folder)
    return folder


@pytest.fixture
def little_memory(monkeypatch):
    """Pretend the machine has 16 GiB free, so an 8B model is refused on any CI machine."""
    monkeypatch.setattr(sys.modules["ckptlab.step.preflight"], "available_host_bytes", lambda: 16 * 2**30)


BAD_INPUTS = [
    # (spec changes, CLI arguments, exception, words the message must hold, the same words on the command line)
    ({"every_n_layers": 0}, ["--every-n-layers", "0"], SpecError, "every_n_layers=0", "--every-n-layers 0"),
    ({"every_n_layers": -2}, ["--every-n-layers", "-2"], SpecError, "every_n_layers=-2", "--every-n-layers -2"),
    (
        {"seq_len": 4096},
        ["--seq-len", "4096"],
        SpecError,
        "seq_len=4096 is longer than tiny-llama accepts (2048",
        "--seq-len 4096 is longer than tiny-llama accepts (2048",
    ),
    ({"seq_len": 0}, ["--seq-len", "0"], SpecError, "seq_len=0", "--seq-len 0"),
    ({"batch_size": 0}, ["--batch-size", "0"], SpecError, "batch_size=0", "--batch-size 0"),
    ({"model": "no-such-model"}, ["--model", "no-such-model"], ModelLoadError, "no-such-model", "no-such-model"),
    (
        {"model": "qwen3-8b"},
        ["--model", "qwen3-8b"],
        DoesNotFitError,
        "does not fit on this CPU",
        "does not fit on this CPU",
    ),
]


@pytest.mark.parametrize("changes, args, error, words, cli_words", BAD_INPUTS)
def test_bad_input_through_the_api(changes, args, error, words, cli_words, little_memory):
    with pytest.raises(error) as raised:
        measure(replace(FAST, **changes))
    assert words in str(raised.value)


@pytest.mark.parametrize("changes, args, error, words, cli_words", BAD_INPUTS)
def test_bad_input_through_the_command_line(changes, args, error, words, cli_words, little_memory, capsys):
    assert main(["run", *QUICK, *args]) == 2
    err = capsys.readouterr().err
    assert cli_words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, value",
    [(["--dtype", "float64"], "'float64'"), (["--optimizer", "adam"], "'adam'"), (["--device", "tpu"], "'tpu'")],
)
def test_a_bad_choice_is_one_line_naming_the_value_and_the_choices(args, value, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["run", *args])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and value in lines[0] and "choose from" in lines[0]
    assert "usage:" not in captured.err and captured.out == ""


def test_messages_speak_flags_on_the_command_line_and_widgets_in_the_app(no_config_dir, monkeypatch):
    """The same errors as Python, the command line and the app read them: fields, flags, widgets (show/wording)."""
    from ckptlab.cli import build_parser
    from ckptlab.cli.args import option_flags
    from ckptlab.show.wording import app_message, cli_message
    from ckptlab.step import preflight

    flags = option_flags(build_parser())
    with pytest.raises(SpecError) as every_n:
        RunSpec(every_n_layers=0).validate()
    assert str(every_n.value).startswith("every_n_layers=0 is not valid")
    cli = cli_message(every_n.value, flags)
    assert cli.startswith("--every-n-layers 0 is not valid")
    assert cli.endswith("To run without checkpointing, use --no-checkpointing instead.")
    with pytest.raises(SpecError) as offload:
        RunSpec(every_n_layers=None, offload=True).validate()
    assert cli_message(offload.value, flags).startswith("--offload with --no-checkpointing")
    monkeypatch.setattr(preflight.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpecError) as cuda:
        preflight.resolve_device("cuda")
    assert cli_message(cuda.value, flags).startswith("--device 'cuda' but torch sees no CUDA device here")
    with pytest.raises(ModelLoadError) as no_config:
        measure(replace(FAST, model=str(no_config_dir)))
    assert "point --model at a folder" in cli_message(no_config.value, flags)
    assert "point “Model” at a folder" in app_message(no_config.value, "en")


def test_directories_without_config_or_checkpointable_layers(no_config_dir, no_layers_dir, capsys):
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        measure(replace(FAST, model=str(no_config_dir)))
    with pytest.raises(UnsupportedModelError, match="GradientCheckpointingLayer"):
        measure(replace(FAST, model=str(no_layers_dir)))
    assert main(["run", "--model", str(no_config_dir), *QUICK]) == 2
    assert str(no_config_dir) in capsys.readouterr().err
    assert main(["run", "--model", str(no_layers_dir), *QUICK]) == 2
    assert "GradientCheckpointingLayer" in capsys.readouterr().err


def test_offload_without_checkpointing_is_refused():
    with pytest.raises(SpecError, match="offload=True with checkpointing off"):
        RunSpec(every_n_layers=None, offload=True).validate()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_requested_without_a_gpu(capsys):
    assert main(["run", "--device", "cuda", *QUICK]) == 2
    assert "--device 'cuda'" in capsys.readouterr().err


def test_a_step_that_does_not_fit_exits_2_and_says_so(monkeypatch, capsys):
    import torch

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(sys.modules["ckptlab.step.measure"], "train_step", out_of_memory)
    assert main(["run", *QUICK]) == 2
    captured = capsys.readouterr()
    assert "Does not fit" in captured.out and "Traceback" not in captured.err


def test_python_dash_m_entry_point_exits_2_without_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "ckptlab", "run", "--every-n-layers", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "--every-n-layers 0" in done.stderr and "Traceback" not in done.stderr
