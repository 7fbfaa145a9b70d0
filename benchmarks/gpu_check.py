"""The lab on a real GPU, in one command: what only a CUDA machine can prove.

    python benchmarks/gpu_check.py [--out docs/gpu-results-latest.md]

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
4b. selective checkpointing on qwen3-0.6b at 4096 tokens: step-time ratios off / full / attention /
   matmuls (interleaved rounds, the lab's noise verdict), what each policy kept per CP layer beside the
   simulation and the formula, the attention's reruns (none), offload leaving the kept outputs on the
   device, and gradients with and without it;
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

from ckptlab import RunSpec, compare, load_model, measure, predict, simulate
from ckptlab.explore.reference import (
    PR_48444_ROWS,
    measure_resident_after_forward_cuda,
    pr48444_config,
    simulate_resident_after_forward,
)
from ckptlab.results import judge_time
from ckptlab.step.equivalence import check_gradients
from ckptlab.step.rounds import time_settings
from ckptlab.units import GIB, MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/gpu-results-latest.md", help="where to write the Markdown report")
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
    sections = (offload_table, lab_step_on_the_table, step_time_ratios, equivalence, selective, out_of_memory, cli_run)
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


# (label, every_n_layers, offload, optimizer, lora_rank) of the lab's whole step on a real-shape preset
LAB_STEPS = (
    ("off", None, False, "adamw", None),
    ("n=1", 1, False, "adamw", None),
    ("n=1, offload", 1, True, "adamw", None),
    ("n=2", 2, False, "adamw", None),
    ("n=1, no optimizer", 1, False, "none", None),
    ("off, LoRA r=16", None, False, "adamw", 16),
    ("n=1, LoRA r=16", 1, False, "adamw", 16),
)


def lab_step_on_the_table(report: Report) -> None:
    report.line(
        "\n## 2. The lab's whole training step (qwen3-0.6b causal LM, 8192 tokens, bf16, AdamW unless said): "
        "CUDA allocator against simulation (MiB)\n"
    )
    report.line(
        "| setting | resident after fwd CUDA | simulated | peak CUDA | simulated | optimizer state CUDA | simulated "
        "| where (CUDA) | step ms | optimizer ms |"
    )
    report.line("|---|---|---|---|---|---|---|---|---|---|")
    breakdowns = []
    for label, every_n_layers, offload, optimizer, lora_rank in LAB_STEPS:
        spec = RunSpec(
            model="qwen3-0.6b",
            seq_len=8192,
            every_n_layers=every_n_layers,
            offload=offload,
            optimizer=optimizer,
            lora_rank=lora_rank,
            device="cuda",
            dtype="bfloat16",
            repeats=3,
            warmup=2,
        )
        run, sim = measure(spec), simulate(spec)
        if run.status != "ok":
            report.line(f"| {label} | {run.message} | | | | | | | | |")
            continue
        m, sm = run.memory, sim.memory
        report.line(
            f"| {label} | {m.after_forward_bytes / MIB:.1f} | {sm.after_forward_bytes / MIB:.1f} "
            f"({_pct(sm.after_forward_bytes, m.after_forward_bytes)}) | {m.peak_bytes / MIB:.1f} | "
            f"{sm.peak_bytes / MIB:.1f} ({_pct(sm.peak_bytes, m.peak_bytes)}) | {m.optimizer_state_bytes / MIB:.1f} | "
            f"{sm.optimizer_state_bytes / MIB:.1f} | {m.peak_where.description} | {run.timing.step_s * 1000:.0f} | "
            f"{run.timing.optimizer_s * 1000:.1f} |"
        )
        breakdowns.append((label, m.breakdown_at_peak, sm.breakdown_at_peak))
    report.line("\nAt the peak, by category (MiB; CUDA cannot split activations from temporaries):\n")
    report.line("| setting | measured on CUDA | simulated |")
    report.line("|---|---|---|")
    for label, cuda, simulated in breakdowns:
        report.line(f"| {label} | {_parts(cuda)} | {_parts(simulated)} |")
    report.line(
        "\nThe simulation stands for the CUDA path. The allocator rounds blocks to 512 bytes and keeps cuBLAS's "
        "workspaces (32 MiB a thread on Hopper) that the simulation does not count; AdamW's step counters are host "
        "tensors on CUDA but counted on the simulated device (4 bytes a parameter tensor)."
    )


def step_time_ratios(report: Report) -> None:
    report.line(
        "\n## 3. Step time against checkpointing off (qwen3-0.6b, 4096 tokens, bf16; forward and backward only, "
        "as in the lessons; 2 warm-ups, median of 5)\n"
    )
    report.line("| setting | step ms | spread ms | ratio to off | judged | peak MiB |")
    report.line("|---|---|---|---|---|---|")
    base = RunSpec(
        model="qwen3-0.6b", seq_len=4096, device="cuda", dtype="bfloat16", repeats=5, warmup=2, optimizer="none"
    )
    off = measure(replace(base, every_n_layers=None))
    for every_n_layers, offload in ((None, False), (1, False), (2, False), (4, False), (1, True)):
        run = off if every_n_layers is None else measure(replace(base, every_n_layers=every_n_layers, offload=offload))
        comparison = compare(run, off)
        low, high = run.timing.step_spread
        name = "off" if every_n_layers is None else f"n={every_n_layers}" + (", offload" if offload else "")
        report.line(
            f"| {name} | {run.timing.step_s * 1000:.1f} | {low * 1000:.1f}-{high * 1000:.1f} | "
            f"{comparison.step_ratio:.3f} | "
            f"{'outside the spread' if comparison.step_significant else 'within the spread'} | "
            f"{run.memory.peak_bytes / MIB:.1f} |"
        )


def equivalence(report: Report) -> None:
    report.line(
        "\n## 4. Loss and gradients with and without checkpointing, on the GPU "
        "(`ckptlab.step.equivalence.check_gradients`, tiny-llama float32, dropout 0.1)\n"
    )
    report.line("| setting | loss equal | gradients compared | largest gradient difference |")
    report.line("|---|---|---|---|")
    for label, changes in (
        ("n=1", {"every_n_layers": 1}),
        ("n=2", {"every_n_layers": 2}),
        ("n=1, offload", {"every_n_layers": 1, "offload": True}),
        ("n=1, LoRA r=8", {"every_n_layers": 1, "lora_rank": 8}),
    ):
        check = check_gradients(RunSpec(model="tiny-llama", seq_len=256, batch_size=2, device="cuda", **changes))
        report.line(f"| {label} | {check.loss_equal} | {check.gradients_compared} | {check.max_abs_difference:.3g} |")


# (label, every_n_layers, selective) of the selective section: off, full checkpointing and two policies
SELECTIVE_SETTINGS = (
    ("off", None, "none"),
    ("full", 1, "none"),
    ("attention", 1, "attention"),
    ("matmuls", 1, "matmuls"),
)


def selective(
    report: Report,
    *,
    model: str = "qwen3-0.6b",
    seq_len: int = 4096,
    device: str = "cuda",
    dtype: str = "bfloat16",
    repeats: int = 5,
    gradients_model: str = "tiny-gpt2",
) -> None:
    """Selective checkpointing on the device: time, kept bytes (measured, simulated, predicted), offload, gradients.

    The keyword arguments let ``tests/benchmarks/test_gpu_check.py`` run this section on the CPU, small.
    """
    report.line(
        f"\n## 4b. Selective checkpointing ({model}, {seq_len} tokens, {dtype}; forward and backward only; "
        f"interleaved rounds, 1 warm-up round, median of {repeats})\n"
    )
    base = RunSpec(
        model=model, seq_len=seq_len, device=device, dtype=dtype, repeats=repeats, warmup=1, optimizer="none"
    )
    specs = [replace(base, every_n_layers=n, selective=policy) for _, n, policy in SELECTIVE_SETTINGS]
    built, info = load_model(base)
    timed = time_settings(specs, built, info, warmup_rounds=1)
    off, full = timed.timings[0], timed.timings[1]
    report.line(
        "| setting | step ms | x off | judged | x full | judged | resident after fwd MiB | kept MiB measured | "
        "simulated | predicted | attention op rerun in L1 | from the cache in L1 |"
    )
    report.line("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (label, n, policy), spec, timing in zip(SELECTIVE_SETTINGS, specs, timed.timings):
        run = measure(spec, model=built, info=info, timed=False)
        kept = sum(layer.kept_bytes for layer in run.layers)
        simulated = sum(layer.kept_bytes for layer in simulate(spec).layers)
        predicted = next(
            row.kept_bytes
            for row in predict(model, seq_len=seq_len, dtype=dtype, device=device, every_n_layers=[1], selective=policy)
            if row.every_n_layers == n
        )
        to_off, to_full = (
            judge_time(timing.step_samples, off.step_samples),
            judge_time(timing.step_samples, full.step_samples),
        )
        first = run.layers[0]
        attention_reruns = sum(count for op, count in first.rerun_ops.items() if "attention" in op)
        report.line(
            f"| {label} | {timing.step_s * 1000:.1f} | {to_off.ratio:.3f} | {to_off.judgement.value} | "
            f"{to_full.ratio:.3f} | {to_full.judgement.value} | {run.memory.after_forward_bytes / MIB:.1f} | "
            f"{kept / MIB:.2f} | {simulated / MIB:.2f} | {predicted / MIB:.2f} | "
            f"{attention_reruns if policy != 'none' else '-'} | {_ops(first.reused_ops) or '-'} |"
        )
        if not run.plan_matches:
            report.line(f"\nPLAN MISMATCH ({label}): {' '.join(run.notes)}\n")
    if device == "cuda":
        plain_offload = measure(replace(specs[1], offload=True), model=built, info=info, timed=False)
        kept_offload = measure(replace(specs[2], offload=True), model=built, info=info, timed=False)
        kept = sum(layer.kept_bytes for layer in kept_offload.layers)
        report.line(
            f"\nWith offload (save_on_cpu): resident after the forward {plain_offload.memory.after_forward_bytes / MIB:.1f}"
            f" MiB without a policy, {kept_offload.memory.after_forward_bytes / MIB:.1f} MiB keeping the attention: "
            f"{(kept_offload.memory.after_forward_bytes - plain_offload.memory.after_forward_bytes) / MIB:.2f} MiB "
            f"more on the device, the {kept / MIB:.2f} MiB the policy kept (offload moves only the inputs)."
        )
    del built
    report.line("\n| gradients against off | loss equal | gradients compared | largest difference |")
    report.line("|---|---|---|---|")
    for policy in ("attention", "matmuls"):
        check = check_gradients(
            RunSpec(
                model=gradients_model, seq_len=256, batch_size=2, device=device, every_n_layers=1, selective=policy
            ),
            attention_dropout=0.0,
        )
        report.line(
            f"| {policy} (dropout 0.1 in the MLP and residual) | {check.loss_equal} | {check.gradients_compared} | "
            f"{check.max_abs_difference:.3g} |"
        )


def _ops(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{count}" for op, count in sorted(counts.items()))


def _parts(breakdown: dict[str, int]) -> str:
    return ", ".join(f"{name} {value / MIB:,.1f}" for name, value in sorted(breakdown.items(), key=lambda kv: -kv[1]))


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
    for model, seq_len, extra in (("qwen3-0.6b", 4096, []), ("llama-3.2-1b", 8192, ["--lora-rank", "16"])):
        command = [sys.executable, "-m", "ckptlab", "run", "--model", model, "--seq-len", str(seq_len)]
        command += ["--every-n-layers", "2", *extra]
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
