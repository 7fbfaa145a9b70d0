"""What nvidia-smi will show under a RunSpec's allocator setting (``RunSpec.alloc_conf``), and the side by side with
expandable segments: hand-made orders of allocations, no simulation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ckptlab.errors import SpecError
from ckptlab.explore.device import device_total, expandable_beside
from ckptlab.explore.gpus import GPU_SPECS
from ckptlab.results.allocations import COMPUTE, WHOLE_STEP, AllocationTrace
from ckptlab.spec import RunSpec

MIB = 2**20
GPU = "H100 80 GB"
# 12 MiB born and freed, then 14 MiB: torch's defaults cache the 12 MiB segment (get_allocation_size: a request of
# 10 MiB or more is its own segment, rounded to 2 MiB), which cannot serve 14 MiB, so a 14 MiB segment is added:
# 26 MiB reserved. With expandable_segments:True the large pool maps 20 MiB pages: one page serves both, 20 MiB.
TRACE = AllocationTrace(sizes=(12 * MIB, 14 * MIB), streams=(COMPUTE, COMPUTE), events=(0, ~0, 1, ~1), how=WHOLE_STEP)


def _step(alloc_conf: str) -> SimpleNamespace:
    """A simulated step as the device total reads it: its spec, its tensors' peak and its order of allocations."""
    return SimpleNamespace(
        spec=RunSpec(alloc_conf=alloc_conf),
        memory=SimpleNamespace(peak_bytes=14 * MIB),
        allocations=TRACE,
        device_total=None,
    )


def test_the_specs_alloc_conf_is_what_the_replay_runs_under():
    context = GPU_SPECS[GPU].context_bytes
    default = device_total(_step(""), GPU)  # type: ignore[arg-type]
    expandable = device_total(_step("expandable_segments:True"), GPU)  # type: ignore[arg-type]
    assert (default.reserved_bytes, default.alloc_conf) == (26 * MIB, "")
    assert (expandable.reserved_bytes, expandable.alloc_conf) == (20 * MIB, "expandable_segments:True")
    assert expandable.total_bytes == 20 * MIB + context


def test_expandable_segments_beside_torchs_defaults_replays_the_same_order():
    step = _step("")
    step.device_total = device_total(step, GPU)  # type: ignore[arg-type]
    beside = expandable_beside(step, GPU)  # type: ignore[arg-type]
    assert beside is not None and (beside.reserved_bytes, beside.alloc_conf) == (20 * MIB, "expandable_segments:True")
    named = _step("max_split_size_mb:128")
    named.device_total = device_total(named, GPU)  # type: ignore[arg-type]
    assert expandable_beside(named, GPU) is None  # a setting named is the one asked for: nothing beside it


@pytest.mark.parametrize(
    ("text", "key"),
    [("expandable_segments:true", "allocator.conf_not_a_bool"), ("max_split_size:128", "allocator.conf_unknown_key")],
)
def test_runspec_validates_alloc_conf_as_torch_reads_it(text, key):
    with pytest.raises(SpecError) as caught:
        RunSpec(alloc_conf=text).validate()
    assert caught.value.key == key and caught.value.params["option"].field == "alloc_conf"
    RunSpec(alloc_conf="expandable_segments:True,max_split_size_mb:128").validate()
