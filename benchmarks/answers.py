"""Issue 29's three figures in one run, each against its goal: the table, the CLI's answers, the pages' first paint.

    python benchmarks/answers.py [--model qwen3-8b] [--seq-len 8192] [--rounds 5] [--sessions 8] [--filled]

1. The At-scale table against one simulation, in this process and as whole processes
   (``simulate_table.table_figures``; goal: at most 2x).
2. ``--help``, ``models`` and argument errors as fresh processes against a bare
   ``import torch, transformers`` (``cli_startup.startup_figures``; goal: at most a quarter).
3. The Lesson's and the Timeline's first paint with ``--sessions`` sessions opening each at once
   (``first_paint.paint_figures``; goal: 5 s for the slowest session). ``--filled`` also waits
   for each page's first figure (its runs), which takes minutes on a busy machine.

The figures are measured in that order, one after another, so they do not load each other; the
machine's load average is printed before each. Exit code 0 when every goal is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks, as modules

import cli_startup
import first_paint
import simulate_table


def _verdict(met: bool) -> str:
    return "yes" if met else "NO"


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b", help="the table's model")
    parser.add_argument("--seq-len", type=int, default=8192, help="the table's tokens per sequence")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes per CLI command")
    parser.add_argument("--sessions", type=int, default=8, help="sessions opening each page at once")
    parser.add_argument("--filled", action="store_true", help="also wait for each page's first figure")
    args = parser.parse_args()
    met: list[bool] = []

    print(f"1. The At-scale table against one simulation ({_load()})")
    table = simulate_table.table_figures(args.model, args.seq_len)
    print(f"   {args.model}, seq_len {args.seq_len}, bf16, {len(table.settings)} settings")
    for name, one, whole in (
        ("in-process", table.one_s, table.table_s),
        ("processes", table.one_process_s, table.table_process_s),
    ):
        ratio = whole / one
        met.append(ratio <= simulate_table.GOAL)
        print(
            f"   {name:<11} table {whole:6.2f} s, one simulation {one:6.2f} s: {ratio:5.2f}x "
            f"(goal <= {simulate_table.GOAL:g}x: {_verdict(met[-1])})"
        )

    print(f"2. The CLI's answers against a bare import ({_load()})")
    medians = cli_startup.startup_figures(args.rounds)
    bare = medians[cli_startup.BARE]
    print(f"   {cli_startup.BARE}: {bare:.3f} s (median of {args.rounds} fresh processes)")
    for name, median in medians.items():
        if name in cli_startup.BASELINES:
            continue
        ratio = median / bare
        met.append(ratio <= cli_startup.GOAL)
        print(f"   {name:<30} {median:6.3f} s: {ratio:5.2f}x (goal <= {cli_startup.GOAL:g}x: {_verdict(met[-1])})")

    print(f"3. First paint with {args.sessions} sessions opening a page at once ({_load()})")
    paint = first_paint.paint_figures(args.sessions, fill=args.filled)
    for page in first_paint.PAGES:
        times = paint.paint(page)
        met.append(max(times) <= first_paint.GOAL_S)
        filled = paint.filled(page)
        fill = f"; filled median {statistics.median(filled):.1f} s, max {max(filled):.1f} s" if filled else ""
        print(
            f"   {page:<9} median {statistics.median(times):5.2f} s, max {max(times):5.2f} s "
            f"(goal <= {first_paint.GOAL_S:g} s: {_verdict(met[-1])}){fill}"
        )
    print(f"   ({_load()} after)")
    print(f"goals met: {sum(met)} of {len(met)}")
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main())
