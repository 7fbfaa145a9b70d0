"""The fewest-GPUs search on a 70B shape: the search setting by setting beside the search that skips what the
parameter floor refuses and decides each count by its leanest setting, in one run.

    python benchmarks/gpu_search.py [--seq-len 8192] [--gpu H100] [--counts 1,2,4,8,16,64]

The shape is Llama 3.1 70B's (80 layers, hidden 8192, MLP 28672, 64 heads, 8 KV heads, vocabulary 128,256),
written as a model folder from the llama-3.1-8b preset's config; bf16, Trainer's AdamW, the At-scale page's
settings (off, the distinct every_n_layers, n=1 with offload: ``scale_settings``). Printed for each search: its
answer (GPUs and setting), the simulations it ran (and how many on one GPU), the counts the floor refused, and its
CPU seconds (``time.process_time``: the load of a shared machine does not inflate it). The answers must be the
same (issue 61: with at most half of the 27 simulations of the search before).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ckptlab.explore.budget import budget_bytes  # noqa: E402  (after the path)
from ckptlab.explore.gpu_search import GPU_COUNTS, GpuSearch, cheapest_that_fits  # noqa: E402
from ckptlab.explore.longest import parameter_floor  # noqa: E402
from ckptlab.explore.scale import ScaleRequest, scale_settings  # noqa: E402
from ckptlab.model.catalog import load_config  # noqa: E402
from ckptlab.model.configs import config_with  # noqa: E402
from ckptlab.spec import Setting  # noqa: E402
from ckptlab.units import GIB  # noqa: E402

LLAMA_70B = {  # meta-llama/Llama-3.1-70B's config.json, on the 8B's (same vocabulary, rope and norms)
    "num_hidden_layers": 80,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}


def llama_70b(folder: str) -> str:
    """A model folder with Llama 3.1 70B's config (no weights: a simulation builds it on fake tensors)."""
    config, _, _ = load_config("llama-3.1-8b")
    config_with(config, LLAMA_70B).save_pretrained(folder)
    return folder


def describe(name: str, search: GpuSearch, seconds: float) -> str:
    answer = f"{search.gpus} GPUs, {search.setting.key}" if search.setting else "nothing fits"
    peak = f"{search.result.memory.peak_bytes / GIB:.1f} GiB" if search.result is not None else "-"
    one = sum(result.spec.world_size == 1 for result in search.tried)
    refused = ",".join(map(str, search.floor_refused)) or "-"
    return f"{name:<26}{answer:<22}{peak:>10}{search.simulated:>7}{one:>9}{refused:>16}{seconds:>10.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--counts", default=",".join(map(str, GPU_COUNTS)))
    args = parser.parse_args()
    counts = tuple(int(count) for count in args.counts.split(","))
    budget, label = budget_bytes(args.gpu)
    with tempfile.TemporaryDirectory() as folder:
        request = ScaleRequest(llama_70b(folder), args.seq_len, 1, "bfloat16", tuple(scale_settings(80)))
        floor = parameter_floor(request.spec(Setting(None)))[0]
        print(f"Llama 3.1 70B shape, {args.seq_len} tokens, bf16, AdamW, {label} ({budget / GIB:.0f} GiB) a GPU;")
        print(f"parameter floor {floor / GIB:.1f} GiB on one GPU, about {floor / GIB:.1f}/N a rank under FSDP2")
        print(f"{'search':<26}{'answer':<22}{'peak':>10}{'sims':>7}{'one GPU':>9}{'floor refused':>16}{'CPU s':>10}")
        rows = []
        for name, by_floor in (("setting by setting", False), ("floor, leanest first", True)):
            started = time.process_time()
            search = cheapest_that_fits(request, budget, counts=counts, by_floor=by_floor)
            rows.append(search)
            print(describe(name, search, time.process_time() - started), flush=True)
    before, after = rows
    same = (before.gpus, before.setting) == (after.gpus, after.setting)
    print(f"same answer: {same}; simulations {before.simulated} -> {after.simulated}")


if __name__ == "__main__":
    main()
