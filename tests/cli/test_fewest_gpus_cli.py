"""``simulate --fewest-gpus``: the GPU search's command-line face, its simulation stubbed (the search's own
exactness: tests/explore/test_gpu_search.py and test_gpu_search_order.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from ckptlab.cli import main
from ckptlab.explore import gpu_search
from ckptlab.units import MIB


class _Stub:
    """Stands for TableSimulation: 120 MiB shared by the ranks, 5 MiB of activations off and 1 MiB checkpointed."""

    def __init__(self, specs=()):
        pass

    def result(self, spec, progress=None):
        peak = 120 * MIB // spec.world_size + (5 if spec.every_n_layers is None else 1) * MIB
        return SimpleNamespace(spec=spec, memory=SimpleNamespace(peak_bytes=peak), device_total=None)


def test_fewest_gpus_prints_the_answer_its_launch_and_the_counts_the_floor_skipped(monkeypatch, capsys):
    monkeypatch.setattr(gpu_search, "TableSimulation", _Stub)
    monkeypatch.setattr(gpu_search, "on_gpu", lambda gpu=None: lambda result, budget: result)  # the peak decides
    monkeypatch.setattr(gpu_search, "parameter_floor", lambda spec: (100 * MIB // spec.world_size, "bfloat16"))
    argv = ["simulate", "--model", "tiny-llama", "--every-n-layers", "all", "--fewest-gpus", "--budget", "40MiB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "4 GPU(s), off:" in out and "torchrun --nproc-per-node 4 train.py" in out, out
    assert "skipped because parameters, gradients and optimizer state alone do not fit: 1, 2" in out, out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["fewest_gpus"]
    assert (data["gpus"], data["setting"], data["floor_refused"]) == (4, "off", [1, 2])
    assert data["simulations"] == len(data["looked_at"]) and [1, "off"] not in data["looked_at"]


def test_fewest_gpus_without_a_memory_is_one_line(capsys):
    assert main(["simulate", "--model", "tiny-llama", "--fewest-gpus"]) == 2
    err = capsys.readouterr().err
    assert "--fewest-gpus needs a memory to fit on each GPU" in err and err.count("\n") == 1, err
