"""The At-scale table as one computation against one simulation, in one process and as whole processes.

    python benchmarks/simulate_table.py [--model qwen3-8b] [--seq-len 8192] [--skip-old] [--every all]

The table is the At-scale page's default: off, the distinct every_n_layers and n=1 with offload
(``scale_settings``), simulated by ``scale_table`` (shared shallow steps, ``ckptlab.step.table``).
One simulation is ``ckptlab.simulate`` of n=1, the page's first checkpointed setting. Printed:
seconds of each, in this process (after a warm-up) and as a fresh ``python`` process each (imports
and model description included), their ratio (goal: at most 2), and, unless ``--skip-old``, the
table simulated setting by setting as before (``simulate`` per setting) and whether every setting's
bytes are the same. ``--every all`` takes every value of every_n_layers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ckptlab import RunSpec, simulate  # noqa: E402  (after the path)
from ckptlab.explore.scale import ScaleRequest, ScaleTable, scale_settings, scale_table  # noqa: E402
from ckptlab.model import catalog  # noqa: E402
from ckptlab.spec import Setting  # noqa: E402

ONE = "from ckptlab import RunSpec, simulate; simulate(RunSpec(model={model!r}, seq_len={seq}, every_n_layers=1))"
TABLE = (
    "from ckptlab.explore.scale import scale_settings, scale_table; from ckptlab.model import catalog; "
    "scale_table({model!r}, {seq}, 1, 'bfloat16', scale_settings(catalog.describe({model!r}).num_layers, {every!r}))"
)


GOAL = 2.0  # issue 29: the table in at most twice one simulation's time


@dataclass(frozen=True)
class TableFigures:
    """Seconds of one simulation and of the whole table, in this process and as fresh processes."""

    model: str
    seq_len: int
    settings: list[Setting]
    one_s: float
    table_s: float
    one_process_s: float
    table_process_s: float
    table: ScaleTable

    @property
    def in_process_ratio(self) -> float:
        return self.table_s / self.one_s

    @property
    def process_ratio(self) -> float:
        return self.table_process_s / self.one_process_s


def _seconds(function) -> tuple[float, object]:
    start = time.perf_counter()
    value = function()
    return time.perf_counter() - start, value


def _process_seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start


def table_figures(model: str = "qwen3-8b", seq_len: int = 8192, every: str = "distinct") -> TableFigures:
    """The table's time against one simulation's, measured side by side (in-process after a warm-up, then processes)."""
    info = catalog.describe(model)
    settings = scale_settings(info.num_layers, every)
    simulate(RunSpec(model="tiny-llama", seq_len=64))  # first-call costs (imports, fake-mode caches) not charged
    one_s, _ = _seconds(lambda: simulate(RunSpec(model=model, seq_len=seq_len, every_n_layers=1)))
    table_s, table = _seconds(lambda: scale_table(model, seq_len, 1, "bfloat16", settings, info=info))
    code = {"model": model, "seq": seq_len, "every": every}
    one_p = _process_seconds(ONE.format(**code))
    table_p = _process_seconds(TABLE.format(**code))
    return TableFigures(model, seq_len, settings, one_s, table_s, one_p, table_p, cast(ScaleTable, table))


def print_table_figures(figures: TableFigures) -> None:
    print(f"{'':<14}{'one simulation s':>18}{'whole table s':>15}{'ratio':>8}  goal <= {GOAL:g}")
    for name, one, whole in (
        ("in-process", figures.one_s, figures.table_s),
        ("processes", figures.one_process_s, figures.table_process_s),
    ):
        print(f"{name:<14}{one:>18.2f}{whole:>15.2f}{whole / one:>8.2f}  {'yes' if whole / one <= GOAL else 'NO'}")


def _figures(result) -> tuple:
    memory = result.memory
    return memory.peak_bytes, memory.after_forward_bytes, memory.peak_where, memory.timeline, result.layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--skip-old", action="store_true", help="do not simulate the table setting by setting too")
    parser.add_argument("--every", choices=("distinct", "all"), default="distinct", help="the values of every_n_layers")
    args = parser.parse_args()

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    figures = table_figures(args.model, args.seq_len, args.every)
    settings = figures.settings
    print(f"{args.model}, seq_len {args.seq_len}, bf16, {len(settings)} settings: {', '.join(s.key for s in settings)}")
    print_table_figures(figures)
    request = ScaleRequest(args.model, args.seq_len, 1, "bfloat16", tuple(settings))
    if args.skip_old:
        return
    old_s, old = _seconds(lambda: [simulate(request.spec(setting)) for setting in settings])
    same = all(_figures(a) == _figures(b) for a, b in zip(figures.table.results, old))
    print(
        f"setting by setting (simulate each, as before): {old_s:.2f} s, {old_s / figures.table_s:.2f}x the table's "
        f"time; one setting {old_s / len(settings):.2f} s on average, "
        f"the table {figures.table_s / (old_s / len(settings)):.2f}x that"
    )
    print(f"every setting's bytes, timeline and rows the same as simulate's: {same}")


if __name__ == "__main__":
    main()
