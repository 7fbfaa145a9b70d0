"""The lab on a real GPU, in one command: what only a CUDA machine can prove.

    python benchmarks/gpu_check.py [--out docs/gpu-results.md]

On one H200-class GPU, in about 5 minutes, with no network and no downloads, it:

1. measures the published offload table's three configurations (transformers PR #48444,
   harness in ckptlab/explore/reference.py) with offload off and on: resident after the forward,
   beside the published figures, and the lab's full measured step (peak, step time) on
   the 8-layer row;
2. puts the simulation of the same specs, and of the lab's step, beside the CUDA
   allocator's figures;
3. times checkpointing off, every_n_layers 1, 2, 4 and offload on a mid-size preset
   (qwen3-0.6b at 4096 tokens), as ratios to the no-checkpointing step (2 warm-ups,
   medians of 5, CUDA events);
4. checks that loss and gradients are equal with and without checkpointing, and with offload;
5. provokes an out-of-memory (a sequence far too long for the card), checks the lab reports
   "does not fit", frees the memory, and that the next run in the same process works;
6. runs ``python -m ckptlab run`` on a real-shape preset (default dtype, bf16 on a GPU) and
   keeps its whole output;
7. checks that every run gave its memory back: ``torch.cuda.memory_allocated()`` after all of
   the above against its value before the first run, and the transformers models still alive;
8. writes all of it as a Markdown report, rewritten after every section, so a run cut off by
   its time limit still leaves what it had. A section that fails is reported with its error
   and the next one runs; ``--budget-s`` skips the sections that would start past it.

Without a CUDA GPU it says so and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transformers

from ckptlab import RunSpec, build_model, compare, measure, simulate
from ckptlab.explore.reference import (
    PR_48444_ROWS,
    measure_resident_after_forward_cuda,
    pr48444_config,
    simulate_resident_after_forward,
)
from ckptlab.units import GIB, MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/gpu-results.md", help="where to write the Markdown report")
    parser.add_argument("--budget-s", type=float, default=540.0, help="start no section after this many seconds")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            f"No CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False): "
            "this check measures what only a GPU can show, so it measured nothing. Run it on a CUDA machine.",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = Report(out)
    started = time.perf_counter()
    torch.cuda.synchronize()
    allocated_at_start = torch.cuda.memory_allocated()
    report.header()
    sections = (offload_table, lab_step_on_the_table, step_time_ratios, equivalence, out_of_memory, cli_run)
    failed = 0
    for section in sections:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            report.line(f"\n(`{section.__name__}` skipped: {elapsed:.0f} s spent of a {args.budget_s:.0f} s budget)")
            continue
        failed += not _run_section(report, section)
    _run_section(report, lambda r: memory_given_back(r, allocated_at_start))
    report.line(f"\nTotal time of the check: {time.perf_counter() - started:.0f} s.")
    print(f"\nwritten to {out}", file=sys.stderr)
    return 1 if failed else 0


def _run_section(report: Report, section) -> bool:
    """Run one section; a failure is written into the report instead of ending the check."""
    section_started = time.perf_counter()
    try:
        section(report)
    except Exception as error:
        report.line(f"\n**This section failed**: `{type(error).__name__}: {str(error)[:500]}`\n")
        report.line("```\n" + "".join(traceback.format_exception(error)[-6:]) + "```")
        return False
    finally:
        report.line(f"\n_(section time {time.perf_counter() - section_started:.0f} s)_")
    return True


class Report:
    """Markdown lines, printed and written to the file as they come so a cut-off run still shows what it had."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        self.lines.append(text)
        print(text, flush=True)
        self.path.write_text(self.text())

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def header(self) -> None:
        props = torch.cuda.get_device_properties(0)
        self.line("# ckptlab on a real GPU")
        self.line()
        self.line(f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}")
        self.line(f"- GPU: {props.name}, {props.total_memory / GIB:.1f} GiB")
        self.line(f"- driver: {_driver_version()}")
        self.line(
            f"- torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
            f"Python {platform.python_version()}"
        )
        self.line("- command: `python benchmarks/gpu_check.py`")


def offload_table(report: Report) -> None:
    report.line("\n## 1-2. The published offload table: measured on CUDA, simulated, published (MiB)\n")
    report.line(
        "| layers x hidden x seq | offload | published | measured (CUDA) | simulated | measured vs published | simulated vs measured |"
    )
    report.line("|---|---|---|---|---|---|---|")
    for row in PR_48444_ROWS:
        config = pr48444_config(row.layers, row.hidden)
        freed = {}
        for offload, published in ((False, row.published_plain_mib), (True, row.published_offload_mib)):
            cuda = measure_resident_after_forward_cuda(config, row.seq_len, offload) / MIB
            simulated = simulate_resident_after_forward(config, row.seq_len, offload) / MIB
            freed[offload] = cuda
            report.line(
                f"| {row.layers} x {row.hidden} x {row.seq_len} | {'on' if offload else 'off'} | {published:.1f} | "
                f"{cuda:.1f} | {simulated:.1f} | {_pct(cuda, published)} | {_pct(simulated, cuda)} |"
            )
        report.line(
            f"| | freed | {row.published_plain_mib - row.published_offload_mib:.1f} | {freed[False] - freed[True]:.1f} | "
            f"{row.formula_freed_bytes / MIB:.1f} (layers x seq x hidden x 2) | | |"
        )


def lab_step_on_the_table(report: Report) -> None:
    report.line(
        "\n## The lab's full step (Qwen3 causal LM, bf16): CUDA allocator against simulation and the CPU tracker's accounting\n"
    )
    report.line(
        "| model | seq | setting | resident after fwd CUDA | simulated | peak CUDA | simulated | where (CUDA) | step ms |"
    )
    report.line("|---|---|---|---|---|---|---|---|---|")
    for every_n_layers, offload in ((None, False), (1, False), (1, True), (2, False)):
        spec = RunSpec(
            model="qwen3-0.6b",
            seq_len=8192,
            every_n_layers=every_n_layers,
            offload=offload,
            device="cuda",
            dtype="bfloat16",
            repeats=3,
            warmup=2,
        )
        run, sim = measure(spec), simulate(spec)
        name = "off" if every_n_layers is None else f"n={every_n_layers}" + (", offload" if offload else "")
        if run.status != "ok":
            report.line(f"| qwen3-0.6b | 8192 | {name} | {run.message} | | | | | |")
            continue
        report.line(
            f"| qwen3-0.6b | 8192 | {name} | {run.memory.after_forward_bytes / MIB:.1f} | {sim.memory.after_forward_bytes / MIB:.1f} "
            f"({_pct(sim.memory.after_forward_bytes, run.memory.after_forward_bytes)}) | {run.memory.peak_bytes / MIB:.1f} | "
            f"{sim.memory.peak_bytes / MIB:.1f} ({_pct(sim.memory.peak_bytes, run.memory.peak_bytes)}) | "
            f"{run.memory.peak_where['description']} | {run.timing.step_s * 1000:.0f} |"
        )
    report.line(
        "\nThe simulation stands for the CUDA path; the allocator rounds blocks to 512 bytes and keeps its own "
        "workspace (cuBLAS), which the simulation does not count. Gaps above 5% are discussed below the tables."
    )


def step_time_ratios(report: Report) -> None:
    report.line(
        "\n## 3. Step time against checkpointing off (qwen3-0.6b, 4096 tokens, bf16; 2 warm-ups, median of 5)\n"
    )
    report.line("| setting | step ms | spread ms | ratio to off | judged | peak MiB |")
    report.line("|---|---|---|---|---|---|")
    base = RunSpec(model="qwen3-0.6b", seq_len=4096, device="cuda", dtype="bfloat16", repeats=5, warmup=2)
    off = measure(replace(base, every_n_layers=None))
    for every_n_layers, offload in ((None, False), (1, False), (2, False), (4, False), (1, True)):
        run = off if every_n_layers is None else measure(replace(base, every_n_layers=every_n_layers, offload=offload))
        comparison = compare(run, off)
        low, high = run.timing.step_spread
        name = "off" if every_n_layers is None else f"n={every_n_layers}" + (", offload" if offload else "")
        report.line(
            f"| {name} | {run.timing.step_s * 1000:.1f} | {low * 1000:.1f}-{high * 1000:.1f} | {comparison.step_ratio:.3f} | "
            f"{'outside the spread' if comparison.step_significant else 'within the spread'} | {run.memory.peak_bytes / MIB:.1f} |"
        )


def equivalence(report: Report) -> None:
    report.line("\n## 4. Loss and gradients with and without checkpointing, on the GPU\n")
    reference, _ = build_model("tiny-llama", device="cuda", seed=0, config_overrides={"attention_dropout": 0.1})
    ids = torch.randint(0, 4096, (2, 256), generator=torch.Generator().manual_seed(1)).cuda()
    base_loss, base_grads = _loss_and_grads(reference, ids)
    report.line("| setting | loss equal | largest gradient difference |")
    report.line("|---|---|---|")
    for every_n_layers, offload in ((1, False), (2, False), (1, True)):
        model, _ = build_model("tiny-llama", device="cuda", seed=0, config_overrides={"attention_dropout": 0.1})
        model.activation_checkpointing_enable(every_n_layers=every_n_layers, offload=offload)
        loss, grads = _loss_and_grads(model, ids)
        worst = max((grads[name] - base_grads[name]).abs().max().item() for name in grads)
        report.line(
            f"| n={every_n_layers}{', offload' if offload else ''} | {torch.equal(loss, base_loss)} | {worst:.3g} |"
        )


def out_of_memory(report: Report) -> None:
    report.line("\n## 5. Out of memory: reported, released, and the next run works\n")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    spec = RunSpec(
        model="llama-3.2-1b",
        seq_len=131072,
        batch_size=8,
        every_n_layers=None,
        device="cuda",
        dtype="bfloat16",
        repeats=1,
        warmup=0,
    )
    result = measure(spec)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    follow = measure(RunSpec(model="tiny-llama", seq_len=512, device="cuda", repeats=1, warmup=0))
    report.line(f"- status: `{result.status}`; message: {result.message}")
    report.line(f"- allocated before {before / MIB:.1f} MiB, after the failed run {after / MIB:.1f} MiB")
    report.line(
        f"- the next run in the same process: status `{follow.status}`, peak {follow.memory.peak_bytes / MIB:.1f} MiB"
    )


def cli_run(report: Report) -> None:
    report.line("\n## 6. `python -m ckptlab run` on a real-shape preset (default dtype: bfloat16 on a GPU)\n")
    for model, seq_len in (("qwen3-0.6b", 4096), ("llama-3.2-1b", 8192)):
        command = [
            sys.executable,
            "-m",
            "ckptlab",
            "run",
            "--model",
            model,
            "--seq-len",
            str(seq_len),
            "--every-n-layers",
            "2",
        ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=240,
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        report.line(
            f"`python -m ckptlab run --model {model} --seq-len {seq_len} --every-n-layers 2` (exit {done.returncode}):\n"
        )
        report.line(
            "```\n" + done.stdout.rstrip() + ("\n" + done.stderr.rstrip() if done.stderr.strip() else "") + "\n```"
        )


def memory_given_back(report: Report, allocated_at_start: int) -> None:
    report.line("\n## 7. Every run gave its memory back (same process, after all sections above)\n")
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after = torch.cuda.memory_allocated()
    alive = sum(isinstance(o, transformers.PreTrainedModel) for o in gc.get_objects())
    report.line(
        f"- `torch.cuda.memory_allocated()` before the first run {allocated_at_start / MIB:.1f} MiB, "
        f"after the last {after / MIB:.1f} MiB ({(after - allocated_at_start) / MIB:+.1f} MiB)"
    )
    report.line(f"- transformers models still alive: {alive}")
    # cuBLAS keeps one workspace per thread that ran a matmul (the forward's and autograd's
    # backward thread), allocated through the caching allocator: not a run's leftovers.
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
        torch.cuda.empty_cache()
        report.line(f"- after clearing cuBLAS's workspaces: {torch.cuda.memory_allocated() / MIB:.1f} MiB")


def _loss_and_grads(model, ids):
    model.train()
    torch.manual_seed(0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def _pct(value: float, reference: float) -> str:
    return f"{(value / reference - 1) * 100:+.1f}%" if reference else "n/a"


def _driver_version() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return done.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown (nvidia-smi not found)"


if __name__ == "__main__":
    sys.exit(main())
