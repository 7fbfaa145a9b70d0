"""torch's private internals the lab leans on (``ckptlab/step/torch_workarounds.py``), tied to the torch version
each workaround was written for: a torch upgrade fails here first, so that whoever upgrades re-checks them."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.distributed._tools import mod_tracker
from torch.distributed._tools.mem_tracker import MemTracker

from ckptlab.step import torch_workarounds
from ckptlab.step.torch_workarounds import LeanMemTracker

# Each workaround -> where it lives, and the torch (major.minor) it was written for and last checked against. On a
# new torch: read torch's code the workaround relies on, run the tests of the module it lives in, then set the version
# here. The lab's own module of torch internals is step/torch_workarounds.py; two stand-ins live beside the code they
# serve: the simulation's (installed and restored as one set with transformers', under one count) and peft's on fake
# tensors (ckptlab.model, a layer below ckptlab.step).
WRITTEN_FOR = {
    "LeanMemTracker (overrides MemTracker's private methods, reads its private fields)": (
        "ckptlab/step/torch_workarounds.py",
        "2.13",
    ),
    "removing_mod_tracker_grad_hooks (replaces mod_tracker.register_multi_grad_hook)": (
        "ckptlab/step/torch_workarounds.py",
        "2.13",
    ),
    "fsdp_stream_now (reads FSDPModule._get_fsdp_state()._comm_ctx's streams; where FSDP2 allocates on them)": (
        "ckptlab/step/torch_workarounds.py",
        "2.13",
    ),
    "the simulation's torch.nn.functional.dropout and DTensor _sharding_prop.detect_fake_mode": (
        "ckptlab/step/simulate.py",
        "2.13",
    ),
    "nn.Module.to while peft adapts a model on fake tensors (_fake_safe)": ("ckptlab/model/lora.py", "2.13"),
}

# The private methods of MemTracker that LeanMemTracker overrides, and the private fields it reads.
OVERRIDDEN = ("_track_module_params_and_buffers", "_update_peak_stats", "_track", "_update_snap")
FIELDS = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap", "_WINFO", "_param_to_grad_hook_handles")


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


@pytest.mark.parametrize("workaround", sorted(WRITTEN_FOR))
def test_each_workaround_was_written_for_the_installed_torch(workaround):
    (where, written_for), installed = WRITTEN_FOR[workaround], _major_minor(torch.__version__)
    assert installed == written_for, (
        f"torch is {torch.__version__}, and {workaround} in {where} was written for torch {written_for}: "
        f"re-check it against this torch, then set its version in {__file__}"
    )


def test_the_private_names_the_workarounds_use_are_still_there():
    for name in OVERRIDDEN:
        base, ours = inspect.signature(getattr(MemTracker, name)), inspect.signature(getattr(LeanMemTracker, name))
        assert list(base.parameters) == list(ours.parameters), f"MemTracker.{name} is now {base}"
    tracker = MemTracker()
    assert [field for field in FIELDS if not hasattr(tracker, field)] == []
    # fsdp_stream_now: the root's state and the comm context's streams, by the names FSDP2 makes them under.
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext

    made = inspect.getsource(FSDPCommContext.lazy_init)
    assert hasattr(FSDPModule, "_get_fsdp_state")
    assert [name for name in torch_workarounds.FSDP_STREAMS if f"self.{name} = " not in made] == []
    assert "_fake_mode_on_entry" in inspect.getsource(MemTracker.__enter__)
    assert callable(getattr(mod_tracker, "register_multi_grad_hook", None))


def test_the_mod_tracker_patch_keeps_handles_only_inside_a_watched_step():
    leaf = torch.ones(1, requires_grad=True)
    with torch_workarounds.removing_mod_tracker_grad_hooks() as kept:
        mod_tracker.register_multi_grad_hook([leaf * 2], lambda grads: None)
        assert len(kept) == 1
    assert kept == []  # removed on the way out
    outside = mod_tracker.register_multi_grad_hook([leaf * 2], lambda grads: None)
    outside.remove()
