"""ckptlab.CheckpointingCallback in a real Trainer: the report equals ckptlab.measure of the same setting, it warns
about settings that do not do what they seem to, it never stops training, and it leaves no hook behind."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from transformers import Trainer, TrainerCallback, TrainingArguments

import ckptlab
from ckptlab.fact import Fact
from ckptlab.integrations.trainer import REPORT_FILE
from ckptlab.integrations.trainer_setting import requested_setting
from ckptlab.show.i18n import say
from ckptlab.step.observe import StepObserver
from ckptlab.units import mib

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

SEQ = 64


def _hooks(model: torch.nn.Module) -> dict[str, int]:
    """Every hook a module, a parameter or torch's module-global registries holds, by where it is."""
    counts = {
        f"{name or 'model'}.{kind}": len(getattr(module, kind))
        for name, module in model.named_modules()
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
        if getattr(module, kind)
    }
    counts |= {
        f"{name}.grad_hooks": len(p._backward_hooks) for name, p in model.named_parameters() if p._backward_hooks
    }
    modules = torch.nn.modules.module
    counts["global_forward"] = len(modules._global_forward_hooks) + len(modules._global_forward_pre_hooks)
    counts["dispatch_modes"] = len(_get_current_dispatch_mode_stack())
    return counts


class _HookSnapshot(TrainerCallback):
    """Records the model's hooks right before the first step (after Trainer enabled checkpointing)."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self.before = _hooks(model)


def _tokens(count: int, vocab: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(vocab, (SEQ,), generator=generator) for _ in range(count)]
    return [{"input_ids": ids, "labels": ids} for ids in rows]


def _train(tmp_path, model, kwargs, steps=3, activation_checkpointing=True, callbacks=(), **fields):
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=1,
        activation_checkpointing=activation_checkpointing,
        activation_checkpointing_kwargs=kwargs,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        **fields,
    )
    vocab = getattr(getattr(model, "config", None), "vocab_size", 100)
    rows = steps * args.gradient_accumulation_steps
    trainer = Trainer(model=model, args=args, train_dataset=_tokens(rows, vocab), callbacks=list(callbacks))
    trainer.train()
    return trainer


def test_the_report_of_a_three_step_trainer_equals_measure_of_the_same_setting(tmp_path, caplog):
    model, _ = ckptlab.build_model("tiny-llama")
    snapshot, callback = _HookSnapshot(), ckptlab.CheckpointingCallback()
    with caplog.at_level(logging.INFO, logger="ckptlab.trainer"):
        trainer = _train(tmp_path, model, {"every_n_layers": 2}, callbacks=[snapshot, callback])

    report = callback.report
    assert callback.message is None and report is not None
    measured = ckptlab.measure(ckptlab.RunSpec(model="tiny-llama", seq_len=SEQ, every_n_layers=2, repeats=1, warmup=0))
    assert report.observed == [layer.observed for layer in measured.layers] == ["CP", "keep"] * 3
    assert [layer.recompute_calls for layer in report.layers] == [layer.recompute_calls for layer in measured.layers]
    assert report.matches and report.requested.every_n_layers == 2 and report.requested.use_reentrant is False
    assert report.warning_facts == []
    memory = report.memory
    assert memory.baseline_bytes > 0 and memory.after_forward_bytes > 0 and memory.peak_above_baseline_bytes > 0
    assert memory.peak_where.description and memory.breakdown_at_peak
    # A CP layer keeps exactly its input, in the Trainer's step as in the lab's.
    assert [layer.saved_bytes for layer in report.layers if layer.observed == "CP"] == [
        layer.saved_bytes for layer in measured.layers if layer.observed == "CP"
    ]
    (created,) = [fact for fact in report.facts if fact.key == "trainer.optimizer_state_created"]  # AdamW's moments
    assert created.params["mib"] == mib(memory.optimizer_state_bytes) and report.notes == [say(created)]

    text = caplog.text
    assert Fact("trainer.matches") in report.text_facts() and text.count(say(Fact("trainer.matches"))) == 1
    assert "[L6]" in text and "rerun" in text
    saved = json.loads((tmp_path / REPORT_FILE).read_text())
    assert saved["observed"] == report.observed and saved["matches"] is True
    assert saved["notes"] == report.notes and [Fact.from_dict(fact) for fact in saved["facts"]] == report.facts
    assert saved["memory"]["peak_bytes"] == memory.peak_bytes
    logged = [entry for entry in trainer.state.log_history if "ckptlab/plan_matches" in entry]
    assert len(logged) == 1 and logged[0]["step"] == 1 and logged[0]["ckptlab/reran_layers"] == 3
    assert _hooks(model) == snapshot.before  # the hooks of the observed step are all gone


def test_a_step_with_gradient_accumulation_is_observed_and_equals_the_labs_step(tmp_path):
    model, _ = ckptlab.build_model("tiny-llama")
    callback = ckptlab.CheckpointingCallback(observe_step=2)  # a steady-state step: the optimizer's state exists
    # Two steps: the observed one is the last (a third bf16 step on the CPU, seconds of autocast, would add nothing).
    _train(tmp_path, model, {"every_n_layers": 1}, 2, callbacks=[callback], gradient_accumulation_steps=2, bf16=True)
    report = callback.report
    assert callback.message is None and report is not None and report.micro_batches == 2
    assert [layer.recompute_calls for layer in report.layers] == [2] * 6  # one rerun per micro-batch
    assert report.training_args["gradient_accumulation_steps"] == 2 and report.training_args["bf16"] is True
    assert "gradient_accumulation_steps=2" in report.text()
    assert Fact("trainer.micro_batches", {"micro_batches": 2}) in report.facts
    spec = ckptlab.RunSpec.from_training_args(
        report.training_args, model="tiny-llama", seq_len=SEQ, repeats=1, warmup=1
    )
    measured = ckptlab.measure(replace(spec, every_n_layers=1))
    assert report.memory.peak_bytes == pytest.approx(measured.memory.peak_bytes, rel=0.03)


def test_kwargs_without_use_reentrant_are_warned_about(tmp_path, caplog):
    model, _ = ckptlab.build_model("tiny-llama")
    callback = ckptlab.CheckpointingCallback()
    kwargs = {"every_n_layers": 8, "preserve_rng_state": True}
    with caplog.at_level(logging.WARNING, logger="ckptlab.trainer"):
        _train(tmp_path, model, kwargs, steps=1, callbacks=[callback])

    report = callback.report
    assert report.requested.use_reentrant is True
    assert report.requested.use_reentrant_from == Fact(
        "trainer.reentrant_from.torch_default", {"keys": ["preserve_rng_state"]}
    )
    assert report.model_checkpoint_kwargs == {"preserve_rng_state": True}
    assert report.observed == ["CP", "keep", "keep", "keep", "keep", "keep"] and report.matches
    assert [fact.key for fact in report.warning_facts] == ["trainer.warn_reentrant", "note.only_first_layer"]
    assert report.warning_facts[1].params == {"n": 8, "layers": 6}
    assert report.to_dict()["warnings"] == report.warnings == [say(fact) for fact in report.warning_facts]
    assert caplog.text.count("use_reentrant=True (torch's default") == 2  # in the setting asked for and in its warning
    # Who chose the variant is a fact, worded in the report's language like the sentence around it.
    japanese = report.text("ja")
    assert "torch の既定値: あなたの kwargs ['preserve_rng_state']" in japanese and "torch's default" not in japanese
    saved = json.loads((tmp_path / REPORT_FILE).read_text())
    assert saved["requested"]["use_reentrant_from"] == report.requested.use_reentrant_from.to_dict()


@pytest.mark.skipif(torch.accelerator.current_accelerator() is not None, reason="offload applies on an accelerator")
def test_offload_without_an_accelerator_is_warned_before_the_step_that_raises_and_nothing_is_left(tmp_path, caplog):
    model, _ = ckptlab.build_model("tiny-llama")
    snapshot, callback = _HookSnapshot(), ckptlab.CheckpointingCallback()
    with caplog.at_level(logging.WARNING, logger="ckptlab.trainer"), pytest.raises(RuntimeError, match="pin_memory"):
        _train(tmp_path, model, {"offload": True}, steps=1, callbacks=[snapshot, callback])
    warned = say(Fact("trainer.warn_offload_without_accelerator"))
    assert caplog.text.index(warned) < caplog.text.index(callback.message)  # warned before the step that raises
    assert callback.stepped_aside.key == "trainer.aside_forward_raised"
    assert callback.stepped_aside.params["error_type"] == "RuntimeError"
    left = _hooks(model)
    assert left["dispatch_modes"] == 0 and left["global_forward"] == 0
    assert left.pop("model._forward_hooks") == snapshot.before.pop("model._forward_hooks", 0) + 1  # the inert one
    assert left == snapshot.before
    callback.on_train_begin(None, SimpleNamespace(), None, model=model)  # a next train() removes it
    assert "model._forward_hooks" not in _hooks(model)


def test_a_model_without_checkpointable_layers_is_said_once_and_training_goes_on(tmp_path, caplog):
    class Bag(torch.nn.Module):  # no GradientCheckpointingLayer inside
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(100, 8)
            self.head = torch.nn.Linear(8, 100)

        def forward(self, input_ids, labels):
            logits = self.head(self.embed(input_ids))
            return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())}

    model = Bag()
    callback = ckptlab.CheckpointingCallback()
    with caplog.at_level(logging.WARNING, logger="ckptlab.trainer"):
        trainer = _train(tmp_path, model, None, steps=2, activation_checkpointing=False, callbacks=[callback])
    assert trainer.state.global_step == 2
    assert callback.report is None and callback.stepped_aside == Fact("trainer.aside_no_layers", {"type": "Bag"})
    assert caplog.text.count(callback.message) == 1
    assert not (tmp_path / REPORT_FILE).exists()


def test_a_failure_of_the_lab_never_stops_training_and_leaves_no_hook(tmp_path, monkeypatch, caplog):
    def broken(self):
        raise RuntimeError("meter broke")

    monkeypatch.setattr(StepObserver, "finish", broken)
    model, _ = ckptlab.build_model("tiny-llama")
    snapshot, callback = _HookSnapshot(), ckptlab.CheckpointingCallback()
    with caplog.at_level(logging.WARNING, logger="ckptlab.trainer"):
        trainer = _train(tmp_path, model, {}, steps=2, callbacks=[snapshot, callback])
    assert trainer.state.global_step == 2
    assert callback.stepped_aside.key == "trainer.aside_failed"
    assert callback.stepped_aside.params == {"error_type": "RuntimeError", "error": "meter broke"}
    assert caplog.text.count(callback.message) == 1
    assert _hooks(model) == snapshot.before


def test_a_model_it_cannot_read_is_stepped_aside_without_raising():
    callback = ckptlab.CheckpointingCallback()
    state = SimpleNamespace(global_step=0, log_history=[])
    callback.on_step_begin(None, state, None, model="not a model")
    callback.on_step_end(None, state, None, model="not a model")
    assert callback.report is None and callback.stepped_aside == Fact("trainer.aside_not_a_module", {"type": "str"})
    with pytest.raises(ValueError, match="observe_step=0"):
        ckptlab.CheckpointingCallback(observe_step=0)


@pytest.mark.parametrize(
    ("kwargs", "use_reentrant", "who"),
    [
        (None, False, "transformers_default"),
        ({}, False, "transformers_default"),
        ({"every_n_layers": 4, "offload": True}, False, "transformers_default"),
        ({"use_reentrant": True}, True, "your_kwargs"),
        ({"every_n_layers": 2, "use_reentrant": False, "preserve_rng_state": False}, False, "your_kwargs"),
        ({"preserve_rng_state": False}, True, "torch_default"),
        ('{"every_n_layers": 2, "determinism_check": "none"}', True, "torch_default"),
    ],
)
def test_which_checkpoint_trainer_kwargs_end_up_with(kwargs, use_reentrant, who):
    setting = requested_setting(True, kwargs)
    assert setting.use_reentrant is use_reentrant
    assert setting.use_reentrant_from.key == f"trainer.reentrant_from.{who}"
    assert "every_n_layers" not in setting.checkpoint_kwargs and "offload" not in setting.checkpoint_kwargs
    assert requested_setting(False, kwargs).every_n_layers is None


def test_a_users_own_context_fn_is_reported_with_what_it_kept(tmp_path, caplog):
    """A selective policy of the user's, passed through Trainer's kwargs: the callback observes what it kept, and it
    is the bytes the lab's own attention policy keeps in the same step."""
    from functools import partial

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == attention else CheckpointPolicy.PREFER_RECOMPUTE

    model, _ = ckptlab.build_model("tiny-llama")
    snapshot, callback = _HookSnapshot(), ckptlab.CheckpointingCallback()
    kwargs = {
        "every_n_layers": 1,
        "use_reentrant": False,
        "context_fn": partial(create_selective_checkpoint_contexts, policy),
    }
    with caplog.at_level(logging.INFO, logger="ckptlab.trainer"):
        trainer = _train(tmp_path, model, kwargs, steps=1, callbacks=[snapshot, callback])
    report = callback.report
    assert callback.message is None and report is not None and report.matches
    cp = [layer for layer in report.layers if layer.enabled == "CP"]
    assert [layer.selective for layer in cp] == ["context_fn"] * 6
    assert all(layer.kept_ops == {"aten._scaled_dot_product_flash_attention_for_cpu": 1} for layer in cp)
    spec = ckptlab.RunSpec(
        model="tiny-llama", seq_len=SEQ, every_n_layers=1, selective="attention", repeats=1, warmup=0
    )
    lab = ckptlab.measure(spec, timed=False)
    assert report.kept_bytes == sum(layer.kept_bytes for layer in lab.layers) > 0
    assert [sum(layer.reused_ops.values()) for layer in cp] == [sum(layer.reused_ops.values()) for layer in lab.layers]
    (kept,) = [fact for fact in report.text_facts() if isinstance(fact, Fact) and fact.key == "trainer.selective_kept"]
    assert kept.params["bytes"] == report.kept_bytes and say(kept) in caplog.text
    logged = next(entry for entry in trainer.state.log_history if "ckptlab/selective_kept_bytes" in entry)
    assert logged["ckptlab/selective_kept_bytes"] == report.kept_bytes
    assert _hooks(model) == snapshot.before
    first = next(m for m in model.modules() if getattr(m, "gradient_checkpointing", False))
    assert first._gradient_checkpointing_func.keywords["context_fn"] is kwargs["context_fn"]  # the user's, back
