"""A LoRA rank is bounded by the model's narrowest adapted projection, and counted in the floor checked before a
build: a frozen base has no gradients, the adapters and theirs do, and a refusal names the rank."""

from __future__ import annotations

import pytest
import torch

import ckptlab
from ckptlab import RunSpec
from ckptlab.cli import main
from ckptlab.errors import DoesNotFitError, SpecError
from ckptlab.model.catalog import describe, projection_shapes
from ckptlab.model.lora import adapter_parameters
from ckptlab.step import preflight

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(autouse=True)
def nothing_is_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was built before the rank was checked")

    monkeypatch.setattr(ckptlab.model.catalog, "instantiate", refuse)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--model", "tiny-bert", "--lora-rank", "100000"], "--lora-rank 100000 is more than the lab runs"),
        (["run", "--model", "tiny-bert", "--lora-rank", "1000000"], "at most 65,536"),
        (["run", "--model", "tiny-bert", "--lora-rank", "257"], "tiny-bert's query projection (256 x 256)"),
        (["simulate", "--model", "tiny-gpt2", "--lora-rank", "60000"], "use a rank of at most 256"),
        (["sweep", "--model", "tiny-llama", "--lora-rank", "385"], "use a rank of at most 384"),
    ],
)
def test_a_lora_rank_above_the_narrowest_projection_is_one_line(argv, words, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_the_python_api_refuses_the_rank_with_the_labs_error():
    with pytest.raises(SpecError) as caught:
        ckptlab.measure(RunSpec(model="tiny-bert", lora_rank=257))
    assert caught.value.key == "spec.lora_rank_too_large" and caught.value.params["smallest"] == 256
    with pytest.raises(SpecError, match="more than the lab runs"):
        RunSpec(lora_rank=10**6).validate()


def test_the_floor_counts_the_adapters_and_no_gradients_for_a_frozen_base():
    info = describe("tiny-llama")
    element = 4
    full = preflight.step_floor(RunSpec(model="tiny-llama"), info, torch.float32)
    lora = preflight.step_floor(RunSpec(model="tiny-llama", lora_rank=8), info, torch.float32)
    adapters = adapter_parameters(8, projection_shapes("tiny-llama"))
    assert full - lora == (info.num_params - 2 * adapters) * element  # base gradients out, adapters and theirs in
    narrow = preflight.step_floor(
        RunSpec(model="tiny-llama", lora_rank=8, lora_targets=("q_proj",)), info, torch.float32
    )
    assert narrow < lora  # fewer targets, fewer adapters


def test_a_lora_run_over_the_floor_is_refused_naming_the_rank(monkeypatch):
    room = 40 * 2**20
    monkeypatch.setattr(preflight, "memory_limit", lambda device: (room, "this CPU", "40 MiB"))
    monkeypatch.setattr(preflight, "available_host_bytes", lambda: room)
    checked = preflight.check_spec(RunSpec(model="tiny-llama", lora_rank=384, device="cpu"))
    with pytest.raises(DoesNotFitError) as caught:
        preflight.refuse_beyond_machine(checked)
    assert caught.value.key == "model.step_floor_lora" and "LoRA rank 384" in str(caught.value)
    assert "lora_rank=384" in str(caught.value)  # the simulation it offers keeps the rank
