"""Many measured runs in one process leave no model alive, no hook behind and the memory where it was.

The lab runs many steps in one process (a notebook, the app's sessions, a sweep), and every run's
baseline is the memory in use when it starts: whatever an earlier run left behind would be counted
in the next one's figures. This script measures ``--runs`` fast runs cycling through the tiny presets,
the settings (off, n=1, 2, 3), two lengths, two batch sizes and LoRA, then prints how many
``PreTrainedModel`` objects outlived them, whether torch's global hooks changed, and how much the
resident set grew after the first run. The test suite runs the same check on one run per preset
(``tests/step/test_release.py``); this is the load version.

    python benchmarks/release.py [--runs 30]

Exit code 0 when nothing outlived the runs and the resident set grew by at most 10% (or 50 MiB), 1 otherwise.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.modules.module as nn_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import PreTrainedModel

from ckptlab import RunSpec, measure

PRESETS = ("tiny-llama", "tiny-qwen3", "tiny-gpt2", "tiny-bert")
SETTINGS = (None, 1, 2, 3)
RSS_GROWTH_ALLOWED = 0.10  # of the resident set after the first run ...
RSS_GROWTH_FLOOR = 50 * 2**20  # ... or this many bytes, whichever is more: allocator slack on a small process


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


@dataclass(frozen=True)
class ReleaseReport:
    runs: int
    models_outliving: int  # PreTrainedModel objects alive after the runs that were not there before
    hooks_changed: bool  # torch's global module hooks or saved-tensors hooks differ from before
    rss_after_first: int | None  # bytes resident after the first run (None off Linux)
    rss_after_last: int | None
    failed: tuple[str, ...]  # the specs whose run did not end "ok", with their message
    elapsed_s: float

    @property
    def rss_grown(self) -> int:
        if self.rss_after_first is None or self.rss_after_last is None:
            return 0
        return self.rss_after_last - self.rss_after_first

    @property
    def rss_allowed(self) -> int:
        return max(int(RSS_GROWTH_ALLOWED * (self.rss_after_first or 0)), RSS_GROWTH_FLOOR)

    @property
    def released(self) -> bool:
        return not self.failed and self.models_outliving == 0 and not self.hooks_changed


def many_runs(specs: list[RunSpec]) -> ReleaseReport:
    """Measure ``specs`` one after the other in this process and report what they left behind."""
    before, hooks = models_alive(), process_hooks()
    started = time.monotonic()
    failed: list[str] = []
    rss_after_first = None
    for index, spec in enumerate(specs):
        result = measure(spec)
        if result.status != "ok":
            failed.append(f"{spec}: {result.message}")
        del result
        if index == 0:
            rss_after_first = rss_bytes()
    return ReleaseReport(
        runs=len(specs),
        models_outliving=models_alive() - before,
        hooks_changed=process_hooks() != hooks,
        rss_after_first=rss_after_first,
        rss_after_last=rss_bytes(),
        failed=tuple(failed),
        elapsed_s=time.monotonic() - started,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="measured runs in one process (default 30)")
    args = parser.parse_args()
    report = many_runs(mixed_specs(args.runs))
    mib = 2**20
    print(f"runs: {report.runs} in {report.elapsed_s:.0f} s, failed: {len(report.failed)}")
    for failure in report.failed:
        print(f"  {failure}")
    print(f"models outliving the runs: {report.models_outliving}; global hooks changed: {report.hooks_changed}")
    if report.rss_after_first is not None:
        print(
            f"resident set: {report.rss_after_first / mib:.0f} MiB after the first run, "
            f"{report.rss_grown / mib:+.0f} MiB after the last (at most {report.rss_allowed / mib:.0f} MiB allowed)"
        )
    return 0 if report.released and report.rss_grown <= report.rss_allowed else 1


if __name__ == "__main__":
    sys.exit(main())
