"""The step a user's recipe runs: a real ``transformers.Trainer`` step against the lab's for the same
TrainingArguments, gradient accumulation, the gradient norm, mixed precision and Trainer's optimizers."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from transformers import TrainingArguments

from benchmarks.trainer_step import trainer_peaks
from ckptlab import RunSpec, SpecError, build_model, list_presets, measure, simulate
from ckptlab.cli import main
from ckptlab.step.training import Recipe, check_optimizer_runs, make_optimizer, optimizer_state_bytes, prime_state
from ckptlab.training_args import read_training_args
from tests.cases import covering

pytestmark = pytest.mark.slow  # real steps and a real Trainer: `pytest -m 'not slow'` skips them

SEQ = 64
TINY = [preset.name for preset in list_presets() if preset.cpu_ok]


@pytest.mark.parametrize(
    "fields",
    [
        {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"every_n_layers": 2}},
        {
            "optim": "adamw_torch",
            "gradient_accumulation_steps": 2,
            "per_device_train_batch_size": 1,
            "activation_checkpointing": True,
        },
        {"bf16": True, "max_grad_norm": 0.5, "per_device_train_batch_size": 1, "activation_checkpointing": True},
    ],
    ids=["defaults-n2", "adamw_torch-accumulation2-full", "bf16-clip0.5"],
)
def test_the_lab_peak_equals_a_real_trainer_step_within_3_percent(tmp_path, fields):
    peaks = trainer_peaks("tiny-llama", fields, SEQ, str(tmp_path))
    # From its second step on, a Trainer step holds the optimizer's state: the steady state the lab measures.
    assert peaks[1] == peaks[2]
    spec = RunSpec.from_training_args(fields, model="tiny-llama", seq_len=SEQ, repeats=1, warmup=1)
    result = measure(spec)
    assert result.memory.peak_bytes == pytest.approx(peaks[-1], rel=0.03)


def test_a_file_that_leaves_fields_out_takes_trainers_defaults_and_says_which():
    reading = read_training_args({"bf16": True, "learning_rate": 1e-4})
    assert reading.changes["batch_size"] == 8 and reading.changes["optimizer"] == "adamw_torch_fused"
    assert reading.changes["mixed_precision"] == "bf16" and reading.changes["every_n_layers"] is None
    assert reading.defaulted["per_device_train_batch_size"] == 8 and "bf16" not in reading.defaulted
    assert reading.unused == ("learning_rate",)
    # A GPU file (bf16=True) is read on a machine without one, and a TrainingArguments object too.
    assert RunSpec.from_training_args(TrainingArguments(optim="sgd", use_cpu=True)).optimizer == "sgd"


def test_flags_given_on_the_command_line_win_over_the_file(tmp_path, capsys):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}))
    assert (
        main(
            [
                "simulate",
                "--model",
                "tiny-llama",
                "--seq-len",
                "32",
                "--training-args",
                str(path),
                "--batch-size",
                "1",
                "--json",
            ]
        )
        == 0
    )
    spec = json.loads(capsys.readouterr().out)["spec"]
    assert spec["batch_size"] == 1 and spec["gradient_accumulation_steps"] == 2 and spec["every_n_layers"] is None
    assert main(["simulate", "--model", "tiny-llama", "--seq-len", "32", "--training-args", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Trainer's defaults: max_grad_norm=1.0, optim='adamw_torch_fused', bf16=False" in out
    assert "batch 4" in out


def test_with_accumulation_at_batch_1_full_checkpointing_lowers_the_peak():
    base = RunSpec(model="tiny-llama", seq_len=256, batch_size=1, gradient_accumulation_steps=2, repeats=1, warmup=1)
    off, full = measure(RunSpec(**{**base.to_dict(), "every_n_layers": None})), measure(base)
    # The gradients of the first micro-batch are held while the second one's activations are.
    assert full.memory.peak_bytes < off.memory.peak_bytes
    assert full.memory.peak_where.micro_batch == off.memory.peak_where.micro_batch == 1


def test_the_timeline_shows_the_micro_batches_and_the_norm_and_the_categories_add_up():
    result = measure(RunSpec(model="tiny-llama", seq_len=SEQ, gradient_accumulation_steps=3, repeats=1, warmup=1))
    kinds = [point.kind for point in result.memory.timeline]
    assert kinds.count("micro_batch") == 2 and kinds.count("grad_norm") == 1
    assert kinds.index("grad_norm") < kinds.index("optimizer")
    assert {point.micro_batch for point in result.memory.timeline} == {0, 1, 2}
    assert [layer.forward_calls for layer in result.layers] == [3] * 6
    assert [layer.recompute_calls for layer in result.layers] == [3] * 6
    assert sum(result.memory.breakdown_at_peak.values()) == result.memory.peak_bytes


OPTIONS = {
    "accumulation2": {"gradient_accumulation_steps": 2},
    "bf16": {"mixed_precision": "bf16"},
    "fp16": {"mixed_precision": "fp16"},
    "norm0": {"max_grad_norm": 0.0},
    "sgd-momentum": {"optimizer": "sgd", "optim_args": "momentum=0.9"},
    "adafactor": {"optimizer": "adafactor"},
    # bitsandbytes' 8-bit AdamW (the name unsloth's and peft's QLoRA notebooks train with): its uint8 moments, their
    # block maxima and quantization maps, counted on fake tensors as the CPU's meter counts them in a real step.
    "adamw_8bit": {"optimizer": "adamw_8bit"},
}


# Each new option on one model in turn; the base (AdamW in float32, every_n_layers=2) on every model is
# tests/step/test_training.py's test_simulated_equals_measured_for_every_category ("adamw": this spec, its warm-up
# the timed step, the same assertions).
NEW_OPTIONS = covering(TINY, ["adamw", *OPTIONS])[len(TINY) :]


@pytest.mark.parametrize(("model", "option"), NEW_OPTIONS)
def test_simulated_equals_measured_for_every_category_with_each_new_option(model, option):
    spec = RunSpec(model=model, seq_len=SEQ, every_n_layers=2, dtype="float32", repeats=1, warmup=1, **OPTIONS[option])
    measured, simulated = measure(spec), simulate(spec)
    for name in ("baseline_bytes", "after_forward_bytes", "peak_bytes", "optimizer_state_bytes"):
        assert getattr(simulated.memory, name) == pytest.approx(getattr(measured.memory, name), rel=0.03), name
    for key, value in measured.memory.breakdown_at_peak.items():
        assert simulated.memory.breakdown_at_peak.get(key, 0) == pytest.approx(value, rel=0.03, abs=4096), key
    assert simulated.memory.peak_where.kind == measured.memory.peak_where.kind


def test_a_simulation_takes_the_multi_tensor_optimizer_cuda_runs_where_the_cpu_loops():
    model, _ = build_model("tiny-llama")
    spec = RunSpec(model="tiny-llama", optimizer="adamw_torch")
    on_cpu, on_cuda = make_optimizer(spec, model), make_optimizer(spec, model, simulated_cuda=True)
    assert on_cpu is not None and on_cuda is not None
    assert on_cpu.defaults["foreach"] is None and on_cuda.defaults["foreach"] is True
    # Trainer's default is fused: no foreach to choose.
    fused = make_optimizer(RunSpec(model="tiny-llama"), model, simulated_cuda=True)
    assert fused is not None and fused.defaults["fused"] is True and not fused.defaults["foreach"]
    # Trainer's two parameter groups: with weight decay and without (norms and biases).
    assert [len(group["params"]) > 0 for group in fused.param_groups] == [True, True]


@pytest.mark.parametrize("name", ["adamw", "adamw_torch", "adafactor", "sgd", "adagrad", "rmsprop", "paged_adamw_8bit"])
def test_every_optimizers_state_bytes_are_exact(name):
    model, _ = build_model("tiny-llama")
    recipe = Recipe.for_spec(RunSpec(model="tiny-llama", optimizer=name), model)
    prime_state(recipe)
    state = recipe.optimizer.state if recipe.optimizer is not None else {}
    storages = {  # each storage once: bitsandbytes' quantization maps are one pair shared by every parameter
        value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()
        for per_param in state.values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor)
    }
    expected = sum(storages.values())
    assert optimizer_state_bytes(recipe.optimizer) == expected
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = {"adamw": 2, "adamw_torch": 2, "adagrad": 1, "rmsprop": 1, "sgd": 0}
    if name in moments:  # two, one or no tensors the size of each parameter, plus a small step counter
        assert moments[name] * params <= expected <= moments[name] * params + 8 * 4 * len(state)
    if name == "paged_adamw_8bit":  # bitsandbytes' Optimizer2State.init_state, counted by hand
        sizes = [p.numel() for p in model.parameters()]
        eight_bit = [n for n in sizes if n >= 4096]  # min_8bit_size: smaller tensors keep two float32 moments
        blocks = sum(-(-n // 256) for n in eight_bit)  # one float32 absmax a 256-element block, for each moment
        maps = 2 * 256 * 4  # the signed and unsigned dynamic maps, one pair shared by every parameter
        assert expected == 2 * sum(eight_bit) + 2 * 4 * blocks + maps + 2 * 4 * sum(n for n in sizes if n < 4096)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--optimizer", "lion"], "invalid choice: 'lion' (choose from 'adamw', 'adamw_torch_fused'"),
        (
            ["--optimizer", "adamw_torch_8bit"],
            "needs the package torchao, which is not installed here. Install it (pip install torchao)",
        ),
        (["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps 0 is not valid"),
        (["--gradient-accumulation-steps", "100000"], "--gradient-accumulation-steps 100000 is more than the lab runs"),
        (["--max-grad-norm", "nan"], "max_grad_norm=nan is not valid"),
        (["--mixed-precision", "bf16", "--dtype", "float16"], "float16 weights cannot be trained with it"),
    ],
)
def test_bad_recipe_input_is_one_message_and_exit_2(argv, words, capsys):
    if "torchao" in words and importlib.util.find_spec("torchao") is not None:
        pytest.skip("torchao is installed here: the message for a missing package cannot be met")
    with pytest.raises(SystemExit) as exited:  # argparse's own refusals exit; the lab's return 2
        raise SystemExit(main(["simulate", "--model", "tiny-llama", *argv]))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ({"per_device_train_batchsize": 4}, "fields TrainingArguments does not have: per_device_train_batchsize"),
        (
            {"bf16": "yes", "gradient_accumulation_steps": 1.5},
            "gradient_accumulation_steps=1.5 (expected int); bf16='yes' (expected bool)",
        ),
        ({"optim": "nope"}, "TrainingArguments refused the training args: nope is not a valid OptimizerNames"),
        ({"optim": "lion_8bit"}, "'lion_8bit' is not one of adamw, adamw_torch_fused"),
        ([1, 2], "holds a list, not a JSON object"),
        ("{not json", "is not JSON"),
        ('{"max_grad_norm": NaN}', "is not JSON (NaN is not a number JSON allows"),
    ],
)
def test_a_bad_training_args_file_is_one_message_naming_the_fields_and_exit_2(tmp_path, capsys, content, words):
    path = tmp_path / "args.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    code = main(["simulate", "--model", "tiny-llama", "--training-args", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "Traceback" not in err, err


def test_from_training_args_refuses_what_is_not_training_args():
    with pytest.raises(SpecError, match="neither a TrainingArguments nor a mapping"):
        RunSpec.from_training_args(["bf16"])


def test_a_low_bit_optimizer_is_refused_where_its_step_cannot_be_counted():
    # torchao's AdamW8bit compiles its step with fullgraph=True, which found no frame under the CPU's MemTracker here.
    spec = RunSpec(optimizer="adamw_torch_8bit")  # not validated: the package may be missing on this machine
    with pytest.raises(SpecError, match=r"cannot be simulated: its step \(torchao"):
        check_optimizer_runs(spec, device_type="cuda", simulated=True)
    with pytest.raises(SpecError, match="is measured on CUDA only"):
        check_optimizer_runs(spec, device_type="cpu")
    check_optimizer_runs(spec, device_type="cuda")  # the CUDA allocator's counters need no dispatch mode
    check_optimizer_runs(RunSpec(optimizer="adafactor"), device_type="cpu", simulated=True)
    for name in ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit"):  # bitsandbytes': both
        check_optimizer_runs(RunSpec(optimizer=name), device_type="cpu", simulated=True)
        check_optimizer_runs(RunSpec(optimizer=name), device_type="cpu")
