"""The code the lab shows is the code that does what the lab measured."""

from __future__ import annotations

import ast

import pytest

import ckptlab
from ckptlab.model.snippets import model_snippet, trainer_snippet


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


@pytest.mark.parametrize("optimizer, optim", [("adamw", "adamw_torch"), ("sgd", "sgd")])
def test_the_trainer_arguments_carry_the_optimizer(optimizer, optim):
    keywords = _keywords(trainer_snippet(2, False, optimizer))
    assert keywords["optim"] == optim and keywords["activation_checkpointing_kwargs"]["every_n_layers"] == 2
    assert "optim" not in _keywords(trainer_snippet(2, False, "none"))


def test_the_lora_line_wraps_a_checkpointed_model_with_peft():
    from peft import LoraConfig, get_peft_model

    from ckptlab.model.snippets import lora_snippet

    model, info = ckptlab.build_model("tiny-llama")
    scope = {"model": model, "LoraConfig": LoraConfig, "get_peft_model": get_peft_model}
    exec(model_snippet(2) + "\n" + lora_snippet(4, ["q_proj", "v_proj"]), scope)
    trainable = {name.split(".")[-3] for name, p in scope["model"].named_parameters() if p.requires_grad}
    assert trainable == {"lora_A", "lora_B"}
    assert ckptlab.observed_roles(model) == ckptlab.planned_roles(info.num_layers, 2)
