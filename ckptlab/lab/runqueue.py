"""One measured run on a device at a time, across every session of the process.

A workshop puts many browser sessions on one server. Two runs on the same device at once
would disturb each other's memory (a CUDA peak counts every tensor on the device) and
time (both share the cores), so every run takes a turn in one process-wide FIFO queue:

    with DEVICE_QUEUE.turn(on_wait=lambda ahead: show(f"{ahead} runs ahead")):
        result = measure(spec)

A waiting ticket wakes up every ``poll_s`` seconds and calls ``on_wait`` with the number
of runs ahead of it. That call is also how an abandoned wait ends: Streamlit stops a
closed or rerun session by raising ``StopException`` / ``RerunException`` from the next
``st.*`` call that session makes, and the ``finally`` of :meth:`DeviceQueue.turn` then
gives the place (or the device) back. No lock is held while user code runs, so a slow
or failing session cannot block the others from joining or leaving the queue.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import CkptlabError

OnWait = Callable[[int], None]  # called with the number of runs ahead (the one running included)

DEFAULT_TIMEOUT_S = 900.0  # a workshop of 30 runs of ~10 s each still gets through
POLL_S = 0.5  # how often a waiter re-reports its position (and notices it was abandoned)
HISTORY = 256  # turns remembered for tests and for "who used the device"


class DeviceBusyError(CkptlabError):
    """The device stayed busy for longer than the caller was willing to wait."""


class SupersededError(CkptlabError):
    """A waiting turn replaced by a newer request of the same owner (a browser session)."""


@dataclass(frozen=True)
class Turn:
    """One use of the device, as the queue saw it."""

    ticket: int  # increasing with the time the ticket joined the queue
    label: str  # what ran, for people (e.g. the spec)
    enqueued_at: float  # time.monotonic() when it joined
    started_at: float  # time.monotonic() when it got the device
    ended_at: float  # time.monotonic() when it gave the device back


@dataclass
class _Ticket:
    number: int
    label: str
    thread: int
    enqueued_at: float
    owner: str | None = None
    superseded: bool = False  # a newer request of the same owner took its place
    started_at: float = 0.0


class DeviceQueue:
    """A first-in, first-out queue for one device, safe across threads.

    Args:
        poll_s: seconds between two ``on_wait`` calls of a waiting ticket.
        log_path: a file to append one JSON line to as each turn starts and ends (``None``:
            no log). The instructor's record of who used the device, and how a load test
            run against a real server (benchmarks/workshop_load.py) sees the queue.
    """

    def __init__(self, poll_s: float = POLL_S, log_path: str | None = None) -> None:
        self.poll_s = poll_s
        self.log_path = log_path
        self._cond = threading.Condition()
        self._waiting: deque[_Ticket] = deque()
        self._holder: _Ticket | None = None
        self._numbers = itertools.count(1)
        self._history: deque[Turn] = deque(maxlen=HISTORY)

    @contextmanager
    def turn(
        self,
        on_wait: OnWait | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        label: str = "",
        owner: str | None = None,
    ) -> Iterator[Turn]:
        """Wait for the device, hold it for the ``with`` block, then give it to the next in line.

        Args:
            on_wait: called about every ``poll_s`` seconds while waiting, with the number
                of runs ahead; an exception it raises abandons the wait.
            timeout: seconds to wait at most (``None``: forever).
            label: what this turn is for, kept in :meth:`history`.
            owner: who asks (the app passes its browser session's id). An owner has at most
                one place in the line: a newer request replaces its waiting one, which ends with
                :class:`SupersededError`, and joins at the back, so a participant never stacks
                runs ahead of the others. Replaced rather than refused: in Streamlit the older
                request is the orphan of a rerun (a click while a run waits or runs leaves the
                old script thread finishing), and the newer one is what the participant asked
                for. A run the owner already holds the device with is not touched (it stops
                at its own next check). ``None``: no such rule (tests, the CLI).

        Yields:
            The :class:`Turn` (``ended_at`` is 0 until the block ends).

        Raises:
            DeviceBusyError: still not served after ``timeout`` seconds.
            SupersededError: a newer request of the same ``owner`` took this one's place.
            RuntimeError: the same thread asks for a turn while it holds one (it would wait forever).
        """
        me = threading.get_ident()
        with self._cond:
            if owner is not None:
                for older in self._waiting:
                    if older.owner == owner:
                        older.superseded = True
                self._cond.notify_all()  # the replaced one leaves at once
            if self._holder is not None and self._holder.thread == me:
                raise RuntimeError("this thread already holds the device; a nested turn would wait for itself")
            ticket = _Ticket(next(self._numbers), label, me, time.monotonic(), owner)
            self._waiting.append(ticket)
        deadline = None if timeout is None else ticket.enqueued_at + timeout
        try:
            while True:
                with self._cond:
                    self._leave_if_superseded(ticket)
                    if self._try_take(ticket):
                        break
                    ahead = self._ahead(ticket)
                if on_wait is not None:
                    on_wait(ahead)  # outside the lock: it may be slow, or raise to abandon the wait
                with self._cond:
                    self._leave_if_superseded(ticket)
                    if self._try_take(ticket):
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise DeviceBusyError(key="queue.busy", seconds=timeout, ahead=self._ahead(ticket))
                    self._cond.wait(self.poll_s if remaining is None else min(self.poll_s, remaining))
            yield Turn(ticket.number, label, ticket.enqueued_at, ticket.started_at, 0.0)
        finally:
            with self._cond:
                if self._holder is ticket:
                    self._holder = None
                    self._log("end", ticket)
                    self._history.append(
                        Turn(ticket.number, label, ticket.enqueued_at, ticket.started_at, time.monotonic())
                    )
                elif ticket in self._waiting:
                    self._waiting.remove(ticket)
                self._cond.notify_all()

    def _leave_if_superseded(self, ticket: _Ticket) -> None:
        # Caller holds the lock.
        if ticket.superseded:
            raise SupersededError(key="queue.superseded")

    def _try_take(self, ticket: _Ticket) -> bool:
        # Caller holds the lock. Only the head of the line may take a free device: FIFO. A replaced
        # ticket at the head does not hold the line up while its thread is busy elsewhere.
        while self._waiting and self._waiting[0].superseded:
            self._waiting.popleft()
        if self._holder is None and self._waiting and self._waiting[0] is ticket:
            self._waiting.popleft()
            ticket.started_at = time.monotonic()
            self._holder = ticket
            self._log("start", ticket)
            return True
        return False

    def _log(self, event: str, ticket: _Ticket) -> None:
        # Caller holds the lock, so lines never interleave. Times are time.monotonic() of this process.
        if self.log_path is None:
            return
        line = {"event": event, "ticket": ticket.number, "label": ticket.label, "owner": ticket.owner}
        line.update({"enqueued_at": ticket.enqueued_at, "started_at": ticket.started_at, "at": time.monotonic()})
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")

    def _ahead(self, ticket: _Ticket) -> int:
        # Caller holds the lock.
        return self._waiting.index(ticket) + (1 if self._holder is not None else 0)

    def busy(self) -> tuple[bool, int]:
        """(a run holds the device, how many are waiting), for a status line."""
        with self._cond:
            return self._holder is not None, len(self._waiting)

    def history(self) -> list[Turn]:
        """The last turns that ended, oldest first."""
        with self._cond:
            return list(self._history)


# Process-wide: every Streamlit session of one server runs in this process.
DEVICE_QUEUE = DeviceQueue(log_path=os.environ.get("CKPTLAB_QUEUE_LOG") or None)
