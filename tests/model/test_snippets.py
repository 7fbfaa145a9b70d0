"""The code the lab shows is the code that does what the lab measured."""

from __future__ import annotations

import ast
from dataclasses import replace

import pytest

import ckptlab
from ckptlab.model.snippets import (
    ckptlab_run_line,
    fsdp_snippet,
    fsdp_trainer_snippet,
    model_snippet,
    torchrun_line,
    trainer_snippet,
)
from ckptlab.spec import RunSpec


@pytest.mark.parametrize("every_n_layers", [1, 2, 4, 7])
def test_the_model_line_sets_the_planned_layers_on_a_real_model(every_n_layers):
    model, info = ckptlab.build_model("tiny-llama")
    exec(model_snippet(every_n_layers, offload=False), {"model": model})
    assert ckptlab.observed_roles(model) == ckptlab.planned_roles(info.num_layers, every_n_layers)


def test_the_model_line_for_off_disables_checkpointing():
    model, info = ckptlab.build_model("tiny-llama")
    model.activation_checkpointing_enable()
    exec(model_snippet(None), {"model": model})
    assert ckptlab.observed_roles(model) == ["keep"] * info.num_layers


def test_model_line_text():
    assert model_snippet(2, True) == "model.activation_checkpointing_enable(every_n_layers=2, offload=True)"
    assert model_snippet(None) == "model.activation_checkpointing_disable()"


def _keywords(source: str) -> dict:
    call = ast.parse(source, mode="eval").body
    assert isinstance(call, ast.Call) and call.func.id == "TrainingArguments"
    return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}


@pytest.mark.parametrize("every_n_layers, offload", [(1, False), (3, True)])
def test_the_trainer_arguments_carry_the_setting(every_n_layers, offload):
    source = trainer_snippet(every_n_layers, offload)
    assert _keywords(source) == {
        "output_dir": "out",
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"every_n_layers": every_n_layers, "offload": offload},
    }
    assert '{"every_n_layers": ' in source  # JSON-style quotes, as in the docs


def test_the_trainer_arguments_for_off():
    assert _keywords(trainer_snippet(None)) == {"output_dir": "out", "activation_checkpointing": False}


def test_the_keyword_names_exist_in_this_transformers():
    import dataclasses

    from transformers import TrainingArguments

    names = {field.name for field in dataclasses.fields(TrainingArguments)}
    assert {"activation_checkpointing", "activation_checkpointing_kwargs"} <= names


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"optimizer": "sgd", "optim_args": "momentum=0.9"},
        {"gradient_accumulation_steps": 4, "mixed_precision": "bf16"},
    ],
)
def test_the_trainer_arguments_reproduce_the_step_they_came_from(changes):
    """Written from a spec, read back by RunSpec.from_training_args: the same step (a TrainingArguments that runs)."""
    from transformers import TrainingArguments

    spec = RunSpec(model="tiny-llama", every_n_layers=2, batch_size=2, **changes)
    keywords = _keywords(trainer_snippet(spec.every_n_layers, spec.offload, spec.trainer_fields()))
    assert (
        keywords["optim"] == spec.trainer_optimizer
        and keywords["activation_checkpointing_kwargs"]["every_n_layers"] == 2
    )
    # "adamw" is the lab's short name of Trainer's default; TrainingArguments spell it out.
    assert RunSpec.from_training_args(keywords, model="tiny-llama") == replace(spec, optimizer=spec.trainer_optimizer)
    TrainingArguments(**{**keywords, "bf16": False, "use_cpu": True})  # accepted by transformers (bf16 needs a GPU)
    assert "optim" not in _keywords(trainer_snippet(2, False, RunSpec(optimizer="none").trainer_fields()))


def test_the_lora_line_wraps_a_checkpointed_model_with_peft():
    from peft import LoraConfig, get_peft_model

    from ckptlab.model.snippets import lora_snippet

    model, info = ckptlab.build_model("tiny-llama")
    scope = {"model": model, "LoraConfig": LoraConfig, "get_peft_model": get_peft_model}
    exec(model_snippet(2) + "\n" + lora_snippet(4, ["q_proj", "v_proj"]), scope)
    trainable = {name.split(".")[-3] for name, p in scope["model"].named_parameters() if p.requires_grad}
    assert trainable == {"lora_A", "lora_B"}
    assert ckptlab.observed_roles(model) == ckptlab.planned_roles(info.num_layers, 2)


# -- past one GPU ------------------------------------------------------------------------------


@pytest.mark.parametrize("every_n_layers, offload", [(None, False), (1, False), (2, False), (1, True)])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "none"])
def test_the_fsdp_lines_are_python_and_shard_after_enabling(every_n_layers, offload, optimizer):
    source = fsdp_snippet(every_n_layers, offload, optimizer)
    compile(source, "fsdp_snippet", "exec")
    lines = source.splitlines()
    enable = next(i for i, line in enumerate(lines) if line.startswith("model.activation_checkpointing_"))
    layers = next(i for i, line in enumerate(lines) if line.startswith("    fully_shard(layer)"))
    root = lines.index("fully_shard(model)  # then the root: embeddings, final norm, head")
    assert enable < layers < root  # checkpointing first, every decoder layer, then the root
    assert lines[enable].split("  #")[0] == model_snippet(every_n_layers, offload)
    optimizer_lines = [i for i, line in enumerate(lines) if line.startswith("optimizer = ")]
    assert optimizer_lines == ([] if optimizer == "none" else [len(lines) - 1])  # made after sharding


def test_the_fsdp_lines_shard_the_layers_transformers_checkpoints():
    """The loop's filter, run on a real model: it finds exactly the layers the plan counts."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model, info = ckptlab.build_model("tiny-qwen3")
    loop = next(line for line in fsdp_snippet(2).splitlines() if line.startswith("for layer in "))
    found = eval(
        loop.removeprefix("for layer in ").removesuffix(":"),
        {"model": model, "GradientCheckpointingLayer": GradientCheckpointingLayer},
    )
    assert len(found) == info.num_layers


@pytest.mark.parametrize("every_n_layers, offload", [(None, False), (1, False), (3, False), (2, True)])
def test_the_fsdp_trainer_arguments_are_fsdp2_with_transformers_checkpointing(every_n_layers, offload):
    source = fsdp_trainer_snippet(every_n_layers, offload, RunSpec().trainer_fields())
    compile(source, "fsdp_trainer_snippet", "exec")
    keywords = _keywords(source)  # the comments after the call are no code
    assert keywords["fsdp"] is True and keywords["fsdp_config"] == {"version": 2}  # FSDP2; no FSDP checkpointing too
    assert keywords["optim"] == "adamw_torch_fused"  # Trainer's default
    if every_n_layers is None:
        assert keywords["activation_checkpointing"] is False
    else:
        assert keywords["activation_checkpointing"] is True
        assert keywords["activation_checkpointing_kwargs"] == {"every_n_layers": every_n_layers, "offload": offload}
        assert "ValueError" in source  # says why fsdp_config's activation_checkpointing stays unset


def test_the_fsdp_trainer_arguments_are_accepted_by_transformers():
    """TrainingArguments reads them into accelerate's FSDP2 plugin arguments (no GPU needed to build them)."""
    from transformers import TrainingArguments

    args = eval(fsdp_trainer_snippet(2, False, RunSpec().trainer_fields()), {"TrainingArguments": TrainingArguments})
    assert args.fsdp_plugin_args["fsdp_version"] == 2
    assert "activation_checkpointing" not in args.fsdp_plugin_args  # transformers' own checkpointing does it
    assert args.activation_checkpointing_kwargs == {"every_n_layers": 2, "offload": False}


@pytest.mark.parametrize(
    "gpus, launch, run",
    [
        (1, "python train.py", "python -m ckptlab run --model m"),
        (8, "torchrun --nproc-per-node 8 train.py", "python -m ckptlab run --nproc-per-node 8 --fsdp --model m"),
        (
            64,
            "torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 train.py",
            "python -m ckptlab run --nnodes 8 --nproc-per-node 8 --rdzv-endpoint HOST:29500 --fsdp --model m",
        ),
    ],
)
def test_the_launch_lines(gpus, launch, run):
    assert torchrun_line(gpus).startswith(launch)
    line = ckptlab_run_line(gpus, "m", 4096, 1, "bfloat16", 2, True, "adamw")
    assert line.startswith(run) and line.split("  #")[0].endswith(
        "--seq-len 4096 --batch-size 1 --dtype bfloat16 --every-n-layers 2 --offload --optimizer adamw"
    )
    for bad in (0, 12):
        with pytest.raises(ValueError):
            torchrun_line(bad)


def test_the_ckptlab_line_parses_as_the_cli_reads_it():
    """The options the line writes are the ones `python -m ckptlab run` takes, and give back the setting."""
    import argparse
    import shlex

    from ckptlab.cli.run import add_run_command

    parser = argparse.ArgumentParser()
    add_run_command(parser.add_subparsers())
    line = ckptlab_run_line(4, "tiny-llama", 256, 2, "bfloat16", 3, False, "sgd")
    args = parser.parse_args(shlex.split(line.removeprefix("python -m ckptlab ")))
    assert (args.nproc_per_node, args.fsdp, args.every_n_layers, args.seq_len, args.batch_size) == (4, True, 3, 256, 2)
    assert (args.optimizer, args.dtype, args.offload, args.no_checkpointing) == ("sgd", "bfloat16", False, False)


def _backward_ops(selective: str | None) -> dict[str, int]:
    """The ops tiny-llama's backward dispatches, set up by the selective snippet (None: plain checkpointing)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from ckptlab.model import catalog
    from ckptlab.model.selective import op_name
    from ckptlab.model.snippets import selective_snippet

    class Counted(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[op_name(func)] = self.ops.get(op_name(func), 0) + 1
            return func(*args, **(kwargs or {}))

    model, _ = catalog.build_model("tiny-llama", dtype=torch.float32, device=torch.device("cpu"), seed=0)
    model.train()
    if selective is None:
        model.activation_checkpointing_enable(every_n_layers=1)
    else:
        exec(selective_snippet(1, False, selective), {"model": model})
    ids = torch.randint(100, (1, 32))
    loss = model(input_ids=ids, labels=ids).loss
    with Counted() as counted:
        loss.backward()
    return counted.ops


# (policy, op, how many fewer times tiny-llama's 6 reruns run it than plain checkpointing's)
SKIPPED = [
    ("attention", "aten._scaled_dot_product_flash_attention_for_cpu", 6),  # each rerun's one attention
    ("matmuls", "aten.mm", 36),  # the 6 projections each rerun runs before it stops (down_proj is not needed)
    ("torchtitan", "aten.mm", 18),  # every other one of the 7 is kept: 1st, 3rd, 5th (the 7th is not rerun)
]


@pytest.mark.slow
@pytest.mark.parametrize("selective, op, fewer", SKIPPED)
def test_the_selective_snippet_runs_and_its_reruns_skip_what_it_keeps(selective, op, fewer):
    plain, kept = _backward_ops(None), _backward_ops(selective)
    assert plain[op] - kept.get(op, 0) == fewer
    assert kept["aten.silu"] == plain["aten.silu"] == 6  # SiLU is kept by none: every rerun runs it
