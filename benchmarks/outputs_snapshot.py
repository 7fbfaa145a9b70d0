"""The lab's outputs, written to a folder, to compare two commits: a refactor must leave them as they were.

    python benchmarks/outputs_snapshot.py OUT_DIR
    diff -r BEFORE_DIR AFTER_DIR

It writes: the JSON of 6 measured and 12 simulated results (tiny presets measured on this CPU; real shapes simulated),
the command line's text for ``run``, ``sweep`` and ``simulate`` (and ``simulate`` with a GPU and the whole table), and
the data of the figures the pages draw from them, in English, Japanese and Portuguese. What a clock or this machine
decides (seconds, samples, the load, dates, the host, library versions) is masked as "~", so two runs of one commit
on one machine write the same files and a difference is a difference in what the lab says.
Run it from the repository root, at each commit (``git worktree add`` a second checkout for the "before").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ckptlab
from ckptlab import RunSpec
from ckptlab.explore.scale import scale_settings, scale_table
from ckptlab.show.figures.breakdown import breakdown_figure
from ckptlab.show.figures.diagram import diagram_figure
from ckptlab.show.figures.run import comparison_figure
from ckptlab.show.figures.scale import scale_peak_figure
from ckptlab.units import GIB

LANGS = ("en", "ja", "pt-BR")
MEASURED = [
    RunSpec(model="tiny-llama", seq_len=128, repeats=2, warmup=0),
    RunSpec(model="tiny-llama", seq_len=128, every_n_layers=1, repeats=2, warmup=0),
    RunSpec(model="tiny-llama", seq_len=128, every_n_layers=2, offload=True, repeats=2, warmup=0),
    RunSpec(model="tiny-llama", seq_len=128, every_n_layers=1, lora_rank=8, repeats=2, warmup=0),
    RunSpec(model="tiny-llama", seq_len=128, every_n_layers=1, selective="matmuls", repeats=2, warmup=0),
    RunSpec(model="tiny-qwen3-moe", seq_len=64, every_n_layers=1, repeats=2, warmup=0),
]
SIMULATED = [
    RunSpec(model="qwen3-8b", seq_len=8192, dtype="bfloat16"),
    RunSpec(model="qwen3-8b", seq_len=8192, dtype="bfloat16", every_n_layers=1),
    RunSpec(model="qwen3-8b", seq_len=8192, dtype="bfloat16", every_n_layers=2),
    RunSpec(model="qwen3-8b", seq_len=8192, dtype="bfloat16", every_n_layers=1, offload=True),
    RunSpec(model="llama-3.2-1b", seq_len=4096, dtype="bfloat16", every_n_layers=1, attn_implementation="eager"),
    RunSpec(model="llama-3.2-1b", seq_len=4096, dtype="bfloat16", every_n_layers=1, selective="matmuls"),
    RunSpec(model="llama-3.2-1b", seq_len=4096, dtype="bfloat16", every_n_layers=1, gradient_accumulation_steps=2),
    RunSpec(model="llama-3.2-1b", seq_len=4096, mixed_precision="bf16", every_n_layers=2),
    RunSpec(model="llama-3.2-1b", seq_len=2048, dtype="bfloat16", every_n_layers=1, world_size=2, fsdp=True),
    RunSpec(model="llama-3.1-8b", seq_len=4096, dtype="bfloat16", lora_rank=16, every_n_layers=1),
    RunSpec(model="qwen3-0.6b", seq_len=4096, dtype="bfloat16", every_n_layers=4),
    RunSpec(model="tiny-qwen3-moe", seq_len=512, dtype="bfloat16", every_n_layers=1),
]
CLI = {
    "run": [
        "run",
        "--model",
        "tiny-llama",
        "--seq-len",
        "128",
        "--every-n-layers",
        "2",
        "--repeats",
        "2",
        "--warmup",
        "0",
    ],
    "sweep": ["sweep", "--model", "tiny-llama", "--seq-len", "64", "128", "--repeats", "2", "--warmup", "0"],
    "simulate": ["simulate", "--model", "qwen3-8b", "--seq-len", "8192"],
    "simulate_gpu": ["simulate", "--model", "qwen3-8b", "--seq-len", "8192", "--gpu", "h100-80"],
    "simulate_all": ["simulate", "--model", "llama-3.2-1b", "--seq-len", "4096", "--every-n-layers", "all"],
}
# What a clock or this machine decides: masked in JSON by key, in text by the lines that say it.
VOLATILE_KEYS = re.compile(r"(_s|_samples|samples|load_average|threads|created|timestamp|date|host|hostname|"
                           r"version|versions|elapsed|seconds|cpu|platform|python|busy.*|spread)$")  # fmt: skip
# A number a clock decides, in the command line's text: "1,488 ms", "2.3 s", "spread 75-120", "load 3.2".
CLOCKED = re.compile(
    r"[0-9][0-9,.]*(?= ?(ms|s|µs)\b)|(?<=spread )[0-9,.]+-[0-9,.]+|(?<=load )[0-9.]+|(?<=load average )[0-9.]+"
)


def masked(value: Any, key: str = "") -> Any:
    """``value`` with what a clock or this machine decides replaced by "~"."""
    if VOLATILE_KEYS.search(key):
        return "~"
    if isinstance(value, dict):
        return {k: masked(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, key) for v in value]
    return value


def write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(masked(data), indent=1, sort_keys=True, default=str)
    path.write_text(text + "\n", encoding="utf-8")


def figure_data(figure: Any) -> dict:
    """A figure's traces and layout text (what it draws and says), not Plotly's version or template."""
    data = figure.to_plotly_json()
    layout = data.get("layout", {})
    layout.pop("template", None)
    return {"data": data.get("data", []), "layout": layout}


def main(out: Path, parts: str = "results,figures,cli") -> None:
    if "cli" in parts and parts == "cli":
        return write_cli(out)
    measured = {f"measured_{i}": ckptlab.measure(spec) for i, spec in enumerate(MEASURED)}
    simulated = {f"simulated_{i}": ckptlab.simulate(spec) for i, spec in enumerate(SIMULATED)}
    for name, result in {**measured, **simulated}.items():
        write(out / "results" / f"{name}.json", result.to_dict())
    off, on = measured["measured_0"], measured["measured_1"]
    table = scale_table("qwen3-8b", 8192, 1, "bfloat16", scale_settings(36, "distinct", "n=1"))
    for lang in LANGS:
        figures = {
            "diagram": diagram_figure(on, lang),
            "breakdown": breakdown_figure([("off", off), ("n=1", on)], lang),
            "comparison": comparison_figure(on, off, lang),
            "diagram_simulated": diagram_figure(simulated["simulated_2"], lang),
        }
        for name, figure in figures.items():
            write(out / "figures" / lang / f"{name}.json", figure_data(figure))
        write(
            out / "figures" / lang / "scale_peak.json",
            figure_data(scale_peak_figure(table, 80 * GIB, "H100", lang=lang)),
        )
    write_cli(out)


def write_cli(out: Path) -> None:
    """The command line's text for each of :data:`CLI`, a clock's numbers masked."""
    for name, argv in CLI.items():
        done = subprocess.run([sys.executable, "-m", "ckptlab", *argv], capture_output=True, text=True, timeout=900)
        write(out / "cli" / f"{name}.txt", f"exit {done.returncode}\n{unclocked(done.stdout + done.stderr)}")


def unclocked(text: str) -> str:
    """``text`` with a clock's numbers masked: those :data:`CLOCKED` finds, and every number of a time table (from a
    line that says "ms" in its heading to the next blank line)."""
    lines, in_times = [], False
    for line in text.splitlines():
        in_times = (in_times or " ms" in line) and bool(line.strip())
        lines.append(re.sub(r"[0-9][0-9,.]*", "~", line) if in_times else CLOCKED.sub("~", line))
    return "\n".join(lines)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
