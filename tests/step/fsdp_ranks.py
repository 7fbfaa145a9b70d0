"""Launched by tests (``torchrun --standalone --nproc-per-node 2 tests/step/fsdp_ranks.py OUT SPEC_JSON...``).

Each rank joins the group once, as a training script does, and runs
:func:`ckptlab.step.fsdp.measure_ranks` for every spec in turn (one launch for all presets:
starting ranks costs more than a tiny step); rank 0 writes the results to OUT as JSON.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from ckptlab import RunSpec
from ckptlab.step.fsdp import COLLECTIVE_TIMEOUT_S, measure_ranks


def main(out: str, *specs: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        results = [measure_ranks(RunSpec(**json.loads(text))) for text in specs]
    finally:
        dist.destroy_process_group()
    if results[0] is not None:
        Path(out).write_text(json.dumps([result.to_dict() for result in results]))


if __name__ == "__main__":
    main(*sys.argv[1:])
