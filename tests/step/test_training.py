"""The whole training step: the optimizer's state, LoRA on a frozen base, simulated against measured."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_layers import GradientCheckpointingLayer

from ckptlab import RunSpec, SpecError, UnsupportedModelError, build_model, list_presets, measure, simulate
from ckptlab.explore.budget import budget_bytes
from ckptlab.model.lora import adapted, linear_module_names, resolve_targets
from ckptlab.step.equivalence import check_gradients
from ckptlab.step.training import gradient_bytes, trainable_parameters
from tests.cases import covering

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

TINY = [preset.name for preset in list_presets() if preset.cpu_ok]
# One timed step creates the optimizer's state before the memory step, as a warm-up would.
STEP = RunSpec(seq_len=64, repeats=1, warmup=0, every_n_layers=2, dtype="float32")
CATEGORIES_COMPARED = ("baseline_bytes", "after_forward_bytes", "peak_bytes", "optimizer_state_bytes")


def _trainable_bytes_and_tensors(spec: RunSpec) -> tuple[int, int]:
    model, _ = build_model(spec.model, dtype=getattr(torch, spec.dtype))
    with adapted(model, spec.lora_rank, spec.lora_targets) as trained:
        params = trainable_parameters(trained)
        return sum(p.numel() * p.element_size() for p in params), len(params)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adamw_state_is_two_moments_of_every_trained_parameter_plus_step_counters(dtype):
    spec = RunSpec(**{**STEP.to_dict(), "dtype": dtype})
    result = measure(spec)
    trained_bytes, tensors = _trainable_bytes_and_tensors(spec)
    # exp_avg and exp_avg_sq in the parameter's dtype; one float32 step counter per parameter.
    assert result.memory.optimizer_state_bytes == 2 * trained_bytes + 4 * tensors
    assert result.memory.breakdown_after_forward["optimizer_state"] == result.memory.optimizer_state_bytes


def test_sgd_and_no_optimizer_hold_no_state():
    for optimizer in ("sgd", "none"):
        result = measure(RunSpec(**{**STEP.to_dict(), "optimizer": optimizer}))
        assert result.memory.optimizer_state_bytes == 0
        assert "optimizer_state" not in result.memory.breakdown_at_peak


def test_no_optimizer_keeps_the_forward_and_backward_step_of_the_lessons():
    result = measure(RunSpec(**{**STEP.to_dict(), "optimizer": "none"}))
    assert result.timing.optimizer_samples == [] and result.timing.optimizer_s == 0.0
    assert all(point.phase != "optimizer" for point in result.memory.timeline)


def test_adamw_step_time_and_timeline_include_the_optimizer():
    result = measure(STEP)
    assert len(result.timing.optimizer_samples) == 1 and result.timing.optimizer_s > 0
    assert result.timing.step_s == pytest.approx(
        result.timing.forward_s + result.timing.backward_s + result.timing.optimizer_s
    )
    assert result.memory.timeline[-1].kind == "optimizer"


def test_lora_trains_only_the_adapters_and_keeps_the_plan():
    spec = RunSpec(**{**STEP.to_dict(), "lora_rank": 4})
    model, _ = build_model(spec.model)
    with adapted(model, 4, None) as trained:
        batch = {"input_ids": torch.randint(100, (1, 32))}
        trained(**batch, labels=batch["input_ids"]).loss.backward()
        adapters = trainable_parameters(trained)
        assert gradient_bytes(trained) == sum(p.numel() * p.element_size() for p in adapters)
        assert all(p.grad is None for p in trained.parameters() if not p.requires_grad)
    result = measure(spec)
    assert result.plan_matches
    assert [layer.observed for layer in result.layers] == ["CP", "keep"] * 3


def test_lora_gives_back_the_model_it_was_given():
    model, _ = build_model("tiny-llama")
    names = [name for name, _ in model.named_modules()]
    with adapted(model, 4, ["q_proj"]):
        pass
    assert [name for name, _ in model.named_modules()] == names
    assert all(param.requires_grad for param in model.parameters())


TRAINING = {"adamw": {}, "sgd": {"optimizer": "sgd"}, "lora-adamw": {"lora_rank": 4}}


@pytest.mark.parametrize(("model", "option"), covering(TINY, list(TRAINING)))
def test_simulated_equals_measured_for_every_category(model, option):
    spec = RunSpec(**{**STEP.to_dict(), "model": model, **TRAINING[option]})
    measured, simulated = measure(spec), simulate(spec)
    for name in CATEGORIES_COMPARED:
        assert getattr(simulated.memory, name) == pytest.approx(getattr(measured.memory, name), rel=0.03), name
    for key, value in measured.memory.breakdown_at_peak.items():
        assert simulated.memory.breakdown_at_peak.get(key, 0) == pytest.approx(value, rel=0.03, abs=4096), key
    assert simulated.memory.peak_where.kind == measured.memory.peak_where.kind


@pytest.mark.parametrize(
    "changes",
    [
        {"every_n_layers": 1},
        {"every_n_layers": 2},
        {"every_n_layers": 1, "lora_rank": 4},
        {"every_n_layers": 2, "lora_rank": 4},
    ],
)
def test_gradients_are_equal_with_checkpointing_on_and_off_with_dropout(changes):
    check = check_gradients(RunSpec(model="tiny-llama", seq_len=64, **changes))
    assert check.dropout > 0 and check.gradients_compared > 0
    assert check.equal, check


def test_gradient_check_counts_a_trained_parameter_the_loss_never_reaches(monkeypatch):
    # Its grad stays None after backward (found by mypy): compared as zeros, it was an AttributeError.
    from ckptlab.model import catalog

    real_build = catalog.build_model

    def build_with_unused(*args, **kwargs):
        model, info = real_build(*args, **kwargs)
        model.register_parameter("unused", torch.nn.Parameter(torch.ones(3)))
        return model, info

    monkeypatch.setattr(catalog, "build_model", build_with_unused)
    spec = RunSpec(model="tiny-llama", seq_len=16, every_n_layers=1)
    check = check_gradients(spec)
    model, _ = build_with_unused(spec.model)
    assert check.gradients_compared == len(trainable_parameters(model))
    assert check.equal, check


def test_qwen3_8b_full_fine_tune_counts_adamw_in_the_verdict():
    """bf16 AdamW: two bf16 moments (4 bytes a parameter) and a step counter per tensor, all in the peak."""
    adamw = simulate(RunSpec(model="qwen3-8b", seq_len=8192, every_n_layers=1))
    params = adamw.model.num_params
    tensors = 36 * 11 + 3  # per layer: 7 projections, 2 norms, q/k norms; embeddings, final norm, head
    assert adamw.memory.optimizer_state_bytes == 4 * params + 4 * tensors
    # Trainer's fused AdamW makes no temporaries: the peak is the backward's, at the loss (the float32 logits).
    assert adamw.memory.peak_where.phase == "backward"
    assert adamw.memory.peak_bytes >= 2 * params + adamw.memory.optimizer_state_bytes
    # The multi-tensor AdamW of CUDA (adamw_torch) peaks in its step: parameters, gradients, the state, a copy.
    foreach = simulate(RunSpec(model="qwen3-8b", seq_len=8192, every_n_layers=1, optimizer="adamw_torch"))
    assert foreach.memory.peak_where.phase == "optimizer"
    assert foreach.memory.peak_bytes >= 2 * params + 2 * params + foreach.memory.optimizer_state_bytes
    assert foreach.memory.breakdown_at_peak["temp"] == pytest.approx(2 * params, rel=0.001)  # sqrt(exp_avg_sq)
    assert foreach.memory.peak_bytes - adamw.memory.peak_bytes > 14 * 2**30  # the verdict moves by 14 GiB
    no_optimizer = simulate(RunSpec(model="qwen3-8b", seq_len=8192, every_n_layers=1, optimizer="none"))
    assert adamw.memory.peak_bytes - no_optimizer.memory.peak_bytes >= adamw.memory.optimizer_state_bytes
    budget, _ = budget_bytes("h100-80")
    assert no_optimizer.memory.peak_bytes < budget / 2 < adamw.memory.peak_bytes


def test_bad_training_input_names_the_value_and_the_fix():
    with pytest.raises(SpecError, match="lora_rank=0"):
        RunSpec(lora_rank=0).validate()
    with pytest.raises(SpecError, match="optimizer='adam'"):
        RunSpec(optimizer="adam").validate()
    with pytest.raises(SpecError, match="without lora_rank"):
        RunSpec(lora_targets=("q_proj",)).validate()
    model, _ = build_model("tiny-llama")
    with pytest.raises(SpecError, match=r"qproj.*q_proj, k_proj"):
        resolve_targets(model, ["qproj"])
    assert linear_module_names(model) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_lora_on_layers_without_projections_is_refused():
    class NormOnly(GradientCheckpointingLayer):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(4)

    model = torch.nn.Sequential(NormOnly())
    with pytest.raises(UnsupportedModelError, match="no linear projections"):
        resolve_targets(model, None)
