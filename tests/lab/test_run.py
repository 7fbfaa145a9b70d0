"""The Run button's core: a LoRA run leaves the app's cached base model as it found it; the gradient check takes a turn."""

from __future__ import annotations

from dataclasses import replace

import pytest
from peft.tuners.tuners_utils import BaseTunerLayer

from ckptlab.lab.run import (
    ModelKey,
    ResultCache,
    build_for_key,
    check_gradients_queued,
    lora_target_choices,
    run_queued,
)
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.spec import RunSpec

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

LORA = RunSpec(model="tiny-llama", seq_len=32, every_n_layers=1, repeats=1, warmup=0, lora_rank=4)


def test_a_lora_run_leaves_the_cached_model_a_plain_trainable_model():
    cached: dict[ModelKey, object] = {}
    loads = []

    def load(key: ModelKey):
        loads.append(key)
        if key not in cached:
            cached[key] = build_for_key(key)
        return cached[key]

    lab = run_queued(LORA, load=load, queue=DeviceQueue(), cache=ResultCache())
    assert lab.result.status == "ok" and lab.reference.result.status == "ok"
    assert len(cached) == 1 and len(loads) == 2  # the LoRA run and its reference share one base model
    model, _ = next(iter(cached.values()))
    assert not any(isinstance(module, BaseTunerLayer) for module in model.modules())
    assert not any("lora_" in name for name, _ in model.named_modules())
    assert all(param.requires_grad for param in model.parameters())
    # A full fine-tune on the same cached model afterwards trains every parameter again.
    full = run_queued(replace(LORA, lora_rank=None), load=load, queue=DeviceQueue(), cache=ResultCache())
    assert full.result.memory.optimizer_state_bytes > 10 * lab.result.memory.optimizer_state_bytes


def test_lora_target_choices_are_the_models_projections():
    assert {"q_proj", "v_proj", "down_proj"} <= set(lora_target_choices("tiny-llama"))


def test_the_gradient_check_waits_for_its_turn_and_reports_equal():
    queue = DeviceQueue()
    check = check_gradients_queued(LORA, queue=queue)
    assert check.equal and check.gradients_compared > 0


def test_a_first_run_describes_its_model_once(tmp_path, monkeypatch):
    """Validation once: checking the spec, building the model and its checkpointing-off reference share one
    description, so the model is built on the meta device once (an 8B shape takes seconds there)."""
    from ckptlab.model import catalog

    catalog.load_config("tiny-llama")[0].save_pretrained(tmp_path)  # a folder no earlier test has described
    real_build_on_meta = catalog.build_on_meta
    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return real_build_on_meta(*args, **kwargs)

    monkeypatch.setattr(catalog, "build_on_meta", counted)
    spec = RunSpec(model=str(tmp_path), seq_len=16, every_n_layers=1, repeats=1, warmup=0)
    lab = run_queued(spec, queue=DeviceQueue(), cache=ResultCache())
    assert lab.result.status == "ok" and lab.reference is not None and lab.reference.result.status == "ok"
    assert len(calls) == 1
    # A changed folder is described again: the description follows the files.
    config = catalog.load_config(str(tmp_path))[0]
    config.num_hidden_layers = 3
    config.save_pretrained(tmp_path)
    assert catalog.describe(str(tmp_path)).num_layers == 3 and len(calls) == 2
