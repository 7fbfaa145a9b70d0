"""A workshop's rush on one server: browser sessions pressing Run within a second, some with bad input.

It starts ``streamlit run app.py`` as an instructor would, opens ``--sessions`` tabs of
Debian's Chromium (through playwright), and has them press Run together, round after
round, until about ``--runs`` presses were made; every fourth session's first press has
bad input. The server logs each device turn (``CKPTLAB_QUEUE_LOG``), which is how this
script sees the queue from outside. It prints the figures docs/workshop-server.md
quotes and checks what a workshop needs:

- every session ends each press with a result or a message;
- no two runs used the device at once, and no turn is left open at the end;
- the server's memory (resident set) after all runs is within 10% of where it was
  after one warm-up run.

A mixed round (``--round mixed``) puts the At-scale page beside the Lab: half the sessions press
Simulate (qwen3-8b at 8192 tokens: minutes of fake-tensor work, in the server's simulation
workers) while the other half press Run, with the server's run limit at 40 s. It checks that
no session fails (each ends with a result, a table or the limit's message), that no two
device turns overlap, that no turn lasts over 45 s, and that each measured run's bytes (the
page's "Result as JSON") equal the same spec measured alone, in this process, afterwards.

    python benchmarks/workshop_load.py [--sessions 8] [--runs 30] [--round plain|mixed|both]

Exit code 0 when all of it holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
CHROMIUM_ARGS += ["--disable-sync", "--no-first-run", "--disable-quic"]
# Eight tabs of one browser, most of them in the background for minutes while the others open and wait: Chromium
# throttles a background tab's timers (to one wake-up a minute after five minutes), and a tab that answers its
# server that late can lose its session. A workshop's participants each look at their own tab, in the front.
CHROMIUM_ARGS += ["--disable-background-timer-throttling", "--disable-backgrounding-occluded-windows"]
CHROMIUM_ARGS += ["--disable-renderer-backgrounding"]
BAD_INPUT = "model=tiny-gpt2&seq=4096"  # longer than the model's positions: a message, Run disabled
BAD_EVERY = 4
PRESS_TIMEOUT_MS = 600_000  # one press may wait for every other session's run
RESULT = "Peak reached in:"
SESSION_TTL_S = 2
RSS_GROWTH_LIMIT = 0.10  # the server's memory after the load, against after its warm-up run: at most 10% more


@dataclass(frozen=True)
class LoadReport:
    sessions: int
    outcomes: dict[str, int]  # "result" / "message" / "nothing" -> presses
    turns: int  # device turns taken (a Run and its baseline share one)
    overlaps: int  # turns that started before the previous one ended: must be 0
    open_turns: int  # turns started and never ended: must be 0
    total_s: float
    longest_wait_s: float
    rss_before_mib: float  # the server's, after one warm-up run
    rss_after_mib: float

    @property
    def rss_change(self) -> float:
        return self.rss_after_mib / self.rss_before_mib - 1

    @property
    def holds(self) -> bool:
        return (
            not self.outcomes.get("nothing")
            and not self.overlaps
            and not self.open_turns
            and self.rss_change < RSS_GROWTH_LIMIT
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc: the load test needs Linux")


def _start_server(
    port: int, queue_log: Path, session_ttl_s: float = SESSION_TTL_S, **settings: str
) -> subprocess.Popen:
    command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true"]
    command += ["--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"]
    # A closed tab's session (its state, its figures) is dropped this long after it disconnects (default 120 s).
    command += ["--server.disconnectedSessionTTL", str(session_ttl_s)]
    env = {**os.environ, "CKPTLAB_QUEUE_LOG": str(queue_log), **settings}
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as reply:
                if reply.status == 200:
                    return server
        except OSError:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.3)
    server.kill()
    raise RuntimeError(f"streamlit did not start on port {port}")


def _open(page, url: str) -> None:
    page.goto(url)
    page.get_by_role("button", name="Run", exact=True).wait_for(timeout=PRESS_TIMEOUT_MS)
    page.get_by_text("every_n_layers", exact=True).first.wait_for(timeout=PRESS_TIMEOUT_MS)


def _outcome(page) -> str:
    """Wait until the page shows a result or a message; which one it was."""
    found = page.get_by_text(RESULT).or_(page.locator(".stAlert [data-testid='stAlertContentError']"))
    try:
        found.first.wait_for(timeout=PRESS_TIMEOUT_MS)
    except Exception:
        return "nothing"
    return "result" if page.get_by_text(RESULT).count() else "message"


def _query(session: int, press: int) -> str:
    if session % BAD_EVERY == 0 and press == 0:
        return BAD_INPUT
    # A length no other press uses: each press measures, none is reused from the server's cache.
    return f"seq={64 + 8 * (session * 16 + press)}&n=2&repeats=1&warmup=0"


def _turns(queue_log: Path) -> list[dict]:
    if not queue_log.exists():
        return []
    return [json.loads(line) for line in queue_log.read_text().splitlines() if line.strip()]


def load_test(sessions: int = 8, runs: int = 30) -> LoadReport:
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as scratch:
        queue_log = Path(scratch) / "queue.jsonl"
        server = _start_server(port, queue_log)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                warm = browser.new_page()
                _open(warm, f"{url}/?seq=56&n=2&repeats=1&warmup=0")
                warm.get_by_role("button", name="Run", exact=True).click()
                _outcome(warm)  # imports, the model, the page's caches: memory is compared from here
                warm.close()
                time.sleep(SESSION_TTL_S + 8.0)  # as after the load: the warm-up tab's session is gone too
                rss_before = resident_mib(server.pid)
                warm_turns = len(_turns(queue_log))
                pages = [browser.new_page(viewport={"width": 1200, "height": 900}) for _ in range(sessions)]
                outcomes = {"result": 0, "message": 0, "nothing": 0}
                started = time.monotonic()
                for press in range(max(1, -(-runs // sessions))):
                    for session, page in enumerate(pages):
                        _open(page, f"{url}/?{_query(session, press)}")
                    for page in pages:  # all within a second: clicks only, nothing waited for between them
                        run = page.get_by_role("button", name="Run", exact=True)
                        if run.is_enabled():
                            run.click()
                    for page in pages:
                        outcomes[_outcome(page)] += 1
                    print(f"round {press + 1}: {outcomes} after {time.monotonic() - started:.0f} s", flush=True)
                total_s = time.monotonic() - started
                browser.close()
            # The closed tabs' sessions are dropped on the server within Streamlit's TTL (and slack for a loaded
            # machine): the memory is read until it is back within RSS_GROWTH_LIMIT of where it was, or that time is up.
            dropped_by = time.monotonic() + SESSION_TTL_S + 8.0
            rss_after = resident_mib(server.pid)
            while rss_after / rss_before - 1 >= RSS_GROWTH_LIMIT and time.monotonic() < dropped_by:
                time.sleep(0.5)
                rss_after = resident_mib(server.pid)
            turns = _turns(queue_log)[warm_turns:]
        finally:
            server.terminate()
            server.wait(30)
    starts = [turn for turn in turns if turn["event"] == "start"]
    ends = {turn["ticket"]: turn for turn in turns if turn["event"] == "end"}
    spans = sorted((turn["started_at"], ends[turn["ticket"]]["at"]) for turn in starts if turn["ticket"] in ends)
    return LoadReport(
        sessions=sessions,
        outcomes=outcomes,
        turns=len(starts),
        overlaps=sum(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)),
        open_turns=len(starts) - len(spans),
        total_s=total_s,
        longest_wait_s=max((turn["started_at"] - turn["enqueued_at"] for turn in starts), default=0.0),
        rss_before_mib=rss_before,
        rss_after_mib=rss_after,
    )


# -- the mixed round: Simulate beside Run -----------------------------------------------------

MIXED_RUN_LIMIT_S = 40  # the server's CKPTLAB_RUN_LIMIT_S in the mixed round
MIXED_TURN_BOUND_S = 45  # no device turn may last longer (the limit, and the worker's kill, and slack)
SIMULATE = "model=qwen3-8b&seq=8192"
SIMULATED = "The numbers"  # the At-scale page's table header, once a table is shown
ERROR = ".stAlert [data-testid='stAlertContentError']"


@dataclass(frozen=True)
class MixedReport:
    sessions: int
    outcomes: dict[str, int]  # "result" (Run), "table" (Simulate), "message", "nothing" -> presses
    messages: list[str]  # what the sessions that ended with a message said
    turns: int
    overlaps: int
    open_turns: int
    longest_turn_s: float
    total_s: float
    bytes_checked: int  # measured runs whose bytes were compared with the same run alone
    bytes_differ: list[str]  # those whose bytes differed

    @property
    def holds(self) -> bool:
        failed = [message for message in self.messages if "stopped after" not in message]  # the limit's own words
        return (
            not self.outcomes.get("nothing")
            and not failed
            and not self.overlaps
            and not self.open_turns
            and self.longest_turn_s <= MIXED_TURN_BOUND_S
            and self.bytes_checked > 0
            and not self.bytes_differ
        )


def _ended(page, done: str) -> str:
    """Wait until the page shows ``done`` or an error; "done", "message" or "nothing"."""
    found = page.get_by_text(done).or_(page.locator(ERROR))
    try:
        found.first.wait_for(timeout=PRESS_TIMEOUT_MS)
    except Exception:
        return "nothing"
    return "done" if page.get_by_text(done).count() else "message"


def _measured_json(page) -> dict:
    button = page.locator(".st-key-lab_download_json button")
    button.wait_for(timeout=PRESS_TIMEOUT_MS)
    with page.expect_download(timeout=60_000) as download:
        button.click()
    return json.loads(Path(download.value.path()).read_text())


def mixed_round(sessions: int = 8) -> MixedReport:
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    outcomes = {"result": 0, "table": 0, "message": 0, "nothing": 0}
    messages: list[str] = []
    measured: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        queue_log = Path(scratch) / "queue.jsonl"
        # Streamlit's own TTL: no memory is checked after this round, and a loaded machine's tab that
        # reconnects late must find its session (and its job) still there.
        server = _start_server(port, queue_log, session_ttl_s=120, CKPTLAB_RUN_LIMIT_S=str(MIXED_RUN_LIMIT_S))
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                pages = [browser.new_page(viewport={"width": 1200, "height": 900}) for _ in range(sessions)]
                simulating = [index % 2 == 0 for index in range(sessions)]
                for index, page in enumerate(pages):
                    if simulating[index]:
                        page.goto(f"{url}/at_scale?{SIMULATE}")
                        page.get_by_role("button", name="Simulate", exact=True).wait_for(timeout=PRESS_TIMEOUT_MS)
                    else:
                        _open(page, f"{url}/?seq={64 + 8 * index}&n=2&repeats=1&warmup=0")
                started = time.monotonic()
                for index, page in enumerate(pages):  # all within a second
                    page.get_by_role("button", name="Simulate" if simulating[index] else "Run", exact=True).click()
                for index, page in enumerate(pages):
                    outcome = _ended(page, SIMULATED if simulating[index] else RESULT)
                    if outcome == "done":
                        outcomes["table" if simulating[index] else "result"] += 1
                        if not simulating[index]:
                            measured.append(_measured_json(page))
                    else:
                        outcomes[outcome] += 1
                        if outcome == "message":
                            details = page.locator("[data-testid='stExpander'] code")  # a failure's details, folded
                            shown = page.locator(ERROR).first.inner_text()
                            if details.count():
                                shown += f" ({details.first.text_content()})"
                            messages.append(shown)
                    said = f": {' '.join(messages[-1].split())[:160]}" if outcome == "message" else ""
                    print(f"session {index}: {outcome} after {time.monotonic() - started:.0f} s{said}", flush=True)
                total_s = time.monotonic() - started
                browser.close()
            turns = _turns(queue_log)
        finally:
            server.terminate()
            server.wait(30)
    starts = [turn for turn in turns if turn["event"] == "start"]
    ends = {turn["ticket"]: turn for turn in turns if turn["event"] == "end"}
    spans = sorted((turn["started_at"], ends[turn["ticket"]]["at"]) for turn in starts if turn["ticket"] in ends)
    differ = _bytes_alone_differ(measured)
    return MixedReport(
        sessions=sessions,
        outcomes=outcomes,
        messages=messages,
        turns=len(starts),
        overlaps=sum(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)),
        open_turns=len(starts) - len(spans),
        longest_turn_s=max((end - start for start, end in spans), default=0.0),
        total_s=total_s,
        bytes_checked=len(measured),
        bytes_differ=differ,
    )


def _bytes_alone_differ(measured: list[dict]) -> list[str]:
    """The measured runs whose memory differs from the same spec measured alone, here and now."""
    sys.path.insert(0, str(ROOT))
    from ckptlab import RunSpec, measure

    differ = []
    for data in measured:
        spec = RunSpec(**data["spec"])
        alone = measure(spec).memory
        shown = data["memory"]
        figures = ("baseline_bytes", "after_forward_bytes", "peak_bytes")
        if any(shown[name] != getattr(alone, name) for name in figures):
            differ.append(f"{spec}: {[(shown[n], getattr(alone, n)) for n in figures]}")
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--runs", type=int, default=30, help="presses of Run in all (about)")
    parser.add_argument("--round", choices=("plain", "mixed", "both"), default="both")
    args = parser.parse_args()
    holds = True
    if args.round in ("plain", "both"):
        report = load_test(args.sessions, args.runs)
        print(f"{report.sessions} browser sessions, {sum(report.outcomes.values())} presses of Run: {report.outcomes}")
        print(f"device turns: {report.turns}, overlapping: {report.overlaps}, left open: {report.open_turns}")
        print(f"total {report.total_s:.1f} s, longest wait for the device {report.longest_wait_s:.1f} s")
        print(
            f"server memory (RSS) after a warm-up run {report.rss_before_mib:,.0f} MiB, after all "
            f"{report.rss_after_mib:,.0f} MiB ({report.rss_change:+.1%})"
        )
        print("holds" if report.holds else "DOES NOT HOLD")
        holds = holds and report.holds
    if args.round in ("mixed", "both"):
        mixed = mixed_round(args.sessions)
        print(f"mixed round, {mixed.sessions} sessions (half Simulate {SIMULATE}, half Run): {mixed.outcomes}")
        for message in mixed.messages:
            print(f"  message: {' '.join(message.split())[:200]}")
        print(
            f"device turns: {mixed.turns}, overlapping: {mixed.overlaps}, left open: {mixed.open_turns}, "
            f"longest {mixed.longest_turn_s:.1f} s (run limit {MIXED_RUN_LIMIT_S} s, bound {MIXED_TURN_BOUND_S} s)"
        )
        print(
            f"measured bytes equal to the run alone: {mixed.bytes_checked - len(mixed.bytes_differ)} of {mixed.bytes_checked}"
        )
        for line in mixed.bytes_differ:
            print(f"  differs: {line}")
        print(f"total {mixed.total_s:.1f} s; " + ("holds" if mixed.holds else "DOES NOT HOLD"))
        holds = holds and mixed.holds
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
