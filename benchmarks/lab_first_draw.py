"""How long the Lab page takes to draw after a person picks a new sequence length, and when the Run's estimate is there.

    python benchmarks/lab_first_draw.py [--model tiny-llama] [--lengths 640,768,896] [--workers thread]

The page is driven headless (Streamlit's AppTest, the Lab page of ``app.py``): one first run at a length that warms
what a server has warm (the imports, this CPU's speed record, the simulation workers), then for each length the
sequence box set to it and the script's run timed: "first draw" is that run, the time from the new length to the
page drawn. Since the Lab's Run estimate is the roofline over a simulated step, a length the shared store has not
seen needs a simulation: where the page computes it in the background (``lab_estimate`` in the session), "estimate"
is the time until that job has ended and the page's next run has drawn the Run button enabled; where the page
computes it before drawing, the two figures are one run. The machine's load is printed: other work on the cores makes
every figure longer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streamlit.testing.v1 import AppTest  # noqa: E402

TIMEOUT_S = 300  # AppTest's default 3 s is far too short for a page that simulates before it draws


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def settle(at: AppTest) -> float:
    """The seconds until the estimate of the page's spec has arrived and the page has drawn again (0 where the page
    drew it in its own run): the session's background job joined, then one more run."""
    started = time.perf_counter()
    try:
        job = at.session_state["lab_estimate"]
    except KeyError:  # a page that keeps no estimate job: it checked the Run's time in its own run
        job = None
    if job is None or job.finished:
        return 0.0
    job.join()
    at.run()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--lengths", default="640,768,896")
    parser.add_argument("--workers", default="", help="CKPTLAB_WORKERS for the page (the server's default: process)")
    args = parser.parse_args()
    if args.workers:
        os.environ["CKPTLAB_WORKERS"] = args.workers
    print(f"before: {load()}")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT_S)
    at.query_params.update({"model": args.model, "seq": "512"})
    started = time.perf_counter()
    at.run()
    warm = time.perf_counter() - started + settle(at)
    print(f"first page of the session (warm-up, {args.model} at 512 tokens): {warm:.2f} s")
    print("| tokens | first draw, s | Run enabled at the first draw | estimate there after, s |")
    print("|---|---|---|---|")
    for length in (int(n) for n in args.lengths.split(",")):
        at.number_input(key="lab_seq").set_value(length)
        started = time.perf_counter()
        at.run()
        first = time.perf_counter() - started
        assert not at.exception, [element.value for element in at.exception]
        enabled = not at.button(key="lab_run").disabled
        after = settle(at)
        assert not at.button(key="lab_run").disabled or at.error, "the Run button stayed disabled"
        print(f"| {length} | {first:.3f} | {'yes' if enabled else 'no'} | {first + after:.3f} |", flush=True)
    print(f"after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
