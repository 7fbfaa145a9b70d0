"""Every run gives back what it took: no model, hook or memory outlives measure, sweep, simulate or a job.

The lab runs many steps in one process (a notebook, the app's sessions, a sweep), and every
run's baseline is the memory in use when it starts: whatever an earlier run left behind
would be counted in the next one's figures, and on a GPU would fill the device.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import weakref
from dataclasses import replace

import pytest
import torch
import torch.nn.modules.module as nn_module
from transformers import PreTrainedModel

from ckptlab import RunSpec, SweepSpec, load_model, measure, simulate, sweep
from ckptlab.explore.scale import ScaleRequest, Setting
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.lab.scalejob import ScaleJob
from ckptlab.lab.sweepjob import SweepJob
from tests.conftest import requires_cuda

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

PRESETS = ("tiny-llama", "tiny-qwen3", "tiny-gpt2", "tiny-bert")
SETTINGS = (None, 1, 2, 3)


def mixed_specs(count: int, **fields) -> list[RunSpec]:
    """``count`` fast runs, cycling through presets, settings, two lengths, two batch sizes and LoRA."""
    return [
        RunSpec(
            model=PRESETS[index % len(PRESETS)],
            seq_len=(64, 128)[index // 16 % 2],
            batch_size=1 + (index % 7 == 6),
            every_n_layers=SETTINGS[(index + index // 4) % len(SETTINGS)],  # every preset meets every setting
            lora_rank=4 if index % 5 == 4 else None,  # LoRA wrappers (peft) among the AdamW full fine-tunes
            repeats=1,
            warmup=0,
            **fields,
        )
        for index in range(count)
    ]


def models_alive() -> int:
    """PreTrainedModel objects in the process after a full collection.

    ``issubclass(type(o), ...)`` is ``isinstance`` without reading ``o.__class__``, which on
    some torch objects warns of a deprecation.
    """
    gc.collect()
    return sum(issubclass(type(o), PreTrainedModel) for o in gc.get_objects())


def rss_bytes() -> int | None:
    """Resident memory of this process (Linux /proc), None elsewhere."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def _hook_names(hooks) -> list[str]:
    return sorted(getattr(hook, "__qualname__", type(hook).__name__) for hook in (hooks or {}).values())


def model_state(model: torch.nn.Module) -> dict:
    """Everything a run could leave on a model: modes, checkpointing attributes, hooks on modules and parameters."""
    missing = "(class default)"
    return {
        name: {
            "training": module.training,
            "gradient_checkpointing": module.__dict__.get("gradient_checkpointing", missing),
            "_gradient_checkpointing_func": module.__dict__.get("_gradient_checkpointing_func", missing),
            "hooks": {attribute: _hook_names(getattr(module, attribute, None)) for attribute in HOOK_DICTS},
            "parameters": [
                (param_name, param.requires_grad, _hook_names(param._backward_hooks), param.grad is None)
                for param_name, param in module.named_parameters(recurse=False)
            ],
        }
        for name, module in model.named_modules()
    }


def process_hooks() -> dict:
    """Hooks that are not on a model: torch's global module hooks and the default saved-tensors hooks."""
    top_saved = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", lambda ignore: None)(False)
    return {
        "module_globals": {
            name: len(value)
            for name, value in vars(nn_module).items()
            if name.startswith("_global_") and isinstance(value, dict)
        },
        "saved_tensors_hooks": top_saved,
    }


# -- measure --------------------------------------------------------------------------------


def test_thirty_runs_leave_no_model_alive_and_memory_where_it_was():
    specs = mixed_specs(30)
    assert len(set(specs)) == 30 and {spec.model for spec in specs} == set(PRESETS)
    before = models_alive()
    hooks = process_hooks()
    started = time.monotonic()
    result = measure(specs[0])
    assert result.status == "ok"
    del result
    assert models_alive() == before
    rss_after_first = rss_bytes()
    for spec in specs[1:]:
        result = measure(spec)
        assert result.status == "ok", (spec, result.message)
        del result
    alive = models_alive()
    rss_after_last = rss_bytes()
    elapsed = time.monotonic() - started
    assert alive == before, f"{alive - before} PreTrainedModel objects outlived 30 runs"
    assert process_hooks() == hooks
    if rss_after_first is not None:
        grown = rss_after_last - rss_after_first
        allowed = max(0.10 * rss_after_first, 50 * 2**20)
        assert grown <= allowed, (
            f"RSS grew {grown / 2**20:.0f} MiB over 29 runs (from {rss_after_first / 2**20:.0f} MiB, "
            f"{elapsed:.0f} s), more than the {allowed / 2**20:.0f} MiB allowed"
        )


def test_a_model_passed_in_is_given_back_as_it_came():
    spec = RunSpec(model="tiny-llama", seq_len=64, repeats=1, warmup=0)
    model, info = load_model(spec)
    as_built, hooks = model_state(model), process_hooks()
    for every_n_layers, offload in ((2, False), (None, False), (1, True)):
        result = measure(replace(spec, every_n_layers=every_n_layers, offload=offload), model=model, info=info)
        assert result.status == "ok" and result.plan_matches
        assert model_state(model) == as_built, f"every_n_layers={every_n_layers} left the model changed"
        assert process_hooks() == hooks

    # A caller's own setup survives too: eval mode, checkpointing every 3rd layer, the input-grads hook.
    model.eval()
    model.activation_checkpointing_enable(every_n_layers=3)
    assert model.get_input_embeddings()._forward_hooks
    callers = model_state(model)
    result = measure(replace(spec, every_n_layers=1), model=model, info=info)
    assert [layer.observed for layer in result.layers] == ["CP"] * info.num_layers  # the run's own setting
    assert model_state(model) == callers
    assert [module.gradient_checkpointing for module in model.model.layers] == [True, False, False] * 2

    # The lab keeps no reference: the model goes when the caller drops it.
    alive = weakref.ref(model)
    del model, result
    gc.collect()
    assert alive() is None


def test_a_run_that_does_not_fit_gives_the_model_back_too(monkeypatch):
    measure_module = sys.modules["ckptlab.step.measure"]  # the module; ckptlab.measure is the function
    spec = RunSpec(model="tiny-bert", seq_len=64, every_n_layers=1, repeats=1, warmup=0)
    model, info = load_model(spec)
    as_built = model_state(model)

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(measure_module, "train_step", out_of_memory)
    assert measure(spec, model=model, info=info).status == "does_not_fit"
    assert model_state(model) == as_built


# -- sweep, simulate and the app's background jobs --------------------------------------------


def test_a_sweep_leaves_no_model_alive():
    before = models_alive()
    result = sweep(SweepSpec(model="tiny-bert", seq_lens=(64,), every_n_layers=(1, 2), repeats=1, warmup=0))
    assert [row.status for row in result.rows] == ["ok"] * 3
    del result
    assert models_alive() == before


def test_a_sweep_on_the_callers_model_gives_it_back():
    spec = SweepSpec(model="tiny-gpt2", seq_lens=(64,), every_n_layers=(1, 3), repeats=1, warmup=0)
    model, info = load_model(spec.run_spec(64, None, False))
    as_built = model_state(model)
    sweep(spec, load=lambda run_spec: (model, info))
    assert model_state(model) == as_built


@pytest.mark.parametrize("fast", [True, False])
def test_a_simulation_leaves_no_model_alive(fast):
    before = models_alive()
    hooks = process_hooks()
    for every_n_layers in (None, 1, 2):
        result = simulate(RunSpec(model="tiny-llama", seq_len=64, every_n_layers=every_n_layers), fast=fast)
        assert result.status == "ok"
        del result
    assert models_alive() == before
    assert process_hooks() == hooks


def _finished(job, timeout: float = 300):
    job.join(timeout)
    state = job.state()
    assert not state.running, state
    return state


def test_the_background_jobs_leave_no_model_alive():
    before = models_alive()
    sweep_job = SweepJob(
        SweepSpec(model="tiny-gpt2", seq_lens=(64,), every_n_layers=(2,), repeats=1, warmup=0),
        queue=DeviceQueue(poll_s=0.05),
    ).start()
    state = _finished(sweep_job)
    assert state.error == "" and len(state.result.rows) == 2
    scale_job = ScaleJob(ScaleRequest("tiny-gpt2", 64, 1, "bfloat16", (Setting(None), Setting(1)))).start()
    state = _finished(scale_job)
    assert state.error == "" and len(state.table.results) == 2
    del sweep_job, scale_job, state
    assert models_alive() == before


# -- CUDA ----------------------------------------------------------------------------------------


def _cuda_allocated() -> int:
    """Bytes in live CUDA tensors once nothing is pending, as torch's own leak check reads them.

    cuBLAS keeps a workspace per handle and stream in the caching allocator, made on first use
    (the backward's device thread has its own); torch's tests clear them before reading.
    """
    gc.collect()
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    return torch.cuda.memory_allocated()


@requires_cuda
def test_cuda_memory_is_back_where_it_started_after_runs():
    specs = mixed_specs(12, device="cuda")
    before_models = models_alive()
    before = _cuda_allocated()
    for spec in specs:
        result = measure(spec)
        assert result.status == "ok", (spec, result.message)
        del result
    assert models_alive() == before_models
    assert _cuda_allocated() == before
