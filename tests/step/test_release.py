"""Every run gives back what it took: no model, hook or memory outlives measure, sweep, simulate or a job.

The lab runs many steps in one process (a notebook, the app's sessions, a sweep), and every
run's baseline is the memory in use when it starts: whatever an earlier run left behind
would be counted in the next one's figures, and on a GPU would fill the device.
"""

from __future__ import annotations

import gc
import sys
import weakref
from dataclasses import replace

import pytest
import torch

from ckptlab import RunSpec, SweepSpec, load_model, measure, simulate, sweep
from ckptlab.explore.scale import ScaleRequest, Setting
from ckptlab.lab.runqueue import DeviceQueue
from ckptlab.lab.scalejob import ScaleJob
from ckptlab.lab.sweepjob import SweepJob
from tests.benchmarks import load_benchmark
from tests.conftest import requires_cuda

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them


def _benchmark():
    return load_benchmark("release")


release = _benchmark()
mixed_specs, models_alive, process_hooks = release.mixed_specs, release.models_alive, release.process_hooks


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


# -- measure --------------------------------------------------------------------------------


def test_a_run_of_each_preset_leaves_no_model_alive_no_hook_and_memory_where_it_was():
    """The suite's version of benchmarks/release.py (30 runs there): one run of each preset, LoRA among them."""
    specs = mixed_specs(5)  # the four presets, then a LoRA run
    assert {spec.model for spec in specs} == set(release.PRESETS) and specs[4].lora_rank is not None
    report = release.many_runs(specs)
    assert report.failed == ()
    assert report.models_outliving == 0, f"{report.models_outliving} PreTrainedModel objects outlived the runs"
    assert not report.hooks_changed
    assert report.rss_grown <= report.rss_allowed, (report.rss_after_first, report.rss_after_last)


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
