"""The instructor's room: one round at a time on one exercise, the class's predictions beside one measurement.

The instructor measures the exercise's runs once (one device turn for the room, through the
Learn pages' shared runs) and opens a round with them; every participant's Exercises page then
shows that exercise, and each participant's first answer counts. Until the instructor closes
the round, nobody (the instructor included) sees the answers, only how many arrived; once it
closes, everyone sees them all beside the measured answer.

Anonymous and short-lived: the store keeps, per round, who answered (only to count each
participant once) apart from the answers themselves (in arrival order, linked to nobody), in
this server process's memory alone; nothing is written to disk. The instructor can download a
closed round as CSV (:func:`round_csv`).
"""

from __future__ import annotations

import csv
import io
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import SpecError
from ..results import RunResult
from .exercises import Exercise, by_id, check_runs, measured_answer

Runs = Mapping[int | None, RunResult]  # an exercise's measured runs by every_n_layers (None: checkpointing off)


@dataclass(frozen=True)
class Round:
    """One round as anyone may see it: the answers only once it is closed."""

    number: int  # 1, 2, ... in this server's life: a participant's answer names the round it answers
    exercise_id: str  # the exercise asked (``ckptlab.lab.exercises``)
    is_open: bool  # answers are taken; closed: answers are shown, none taken
    count: int  # answers counted so far (one per participant)
    answers: tuple[float, ...]  # the predictions in arrival order, linked to nobody; () while the round is open
    runs: Runs = field(repr=False)  # the measured runs the answer comes from, measured before the round opened
    measured: float | None  # the measured answer (percent of off, or every_n_layers; None: no choice fits)

    @property
    def exercise(self) -> Exercise:
        return by_id(self.exercise_id)


@dataclass
class _OpenRound:
    """A round's mutable state, touched only under the store's lock."""

    number: int
    exercise_id: str
    runs: Runs
    measured: float | None
    voters: set[str] = field(default_factory=set)  # who answered: only to count each once
    answers: list[float] = field(default_factory=list)  # what they answered, in arrival order, apart from who
    closed: bool = False

    def view(self) -> Round:
        return Round(
            number=self.number,
            exercise_id=self.exercise_id,
            is_open=not self.closed,
            count=len(self.answers),
            answers=tuple(self.answers) if self.closed else (),
            runs=self.runs,
            measured=self.measured,
        )


class Classroom:
    """The process-wide room (one per server: :data:`ROOM`); every method holds one lock, so sessions' threads agree."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._round: _OpenRound | None = None
        self._numbers = 0

    def current(self) -> Round | None:
        """The latest round (open, or closed until the next opens); None before the first."""
        with self._lock:
            return None if self._round is None else self._round.view()

    def open(self, exercise: Exercise, runs: Runs) -> Round:
        """Open a round on ``exercise`` with its measured ``runs``, in place of the last (closed) one.

        Raises:
            SpecError: a round is still open (close it first), or ``runs`` lack one the exercise needs.
        """
        check_runs(exercise, runs)
        answer = measured_answer(exercise, runs)
        with self._lock:
            if self._round is not None and not self._round.closed:
                raise SpecError(
                    key="classroom.still_open",
                    number=self._round.number,
                    current=self._round.exercise_id,
                    exercise=exercise.id,
                )
            self._numbers += 1
            self._round = _OpenRound(self._numbers, exercise.id, MappingProxyType(dict(runs)), answer)
            return self._round.view()

    def answer(self, number: int, participant: str, value: float) -> bool:
        """Count ``participant``'s answer to round ``number``; False (not counted) for a second answer from the same
        participant, a round that is closed or no longer the current one, or a value the exercise's box could not
        send (not a finite number, outside its range, not one of its choices: ``Exercise.accepts``)."""
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        with self._lock:
            current = self._round
            if current is None or current.number != number or current.closed or participant in current.voters:
                return False
            if not by_id(current.exercise_id).accepts(value):
                return False
            current.voters.add(participant)
            current.answers.append(float(value))
            return True

    def close(self, number: int) -> Round:
        """Close round ``number``: no more answers; the answers are shown.

        Raises:
            SpecError: no such round is the current one.
        """
        with self._lock:
            if self._round is None or self._round.number != number:
                raise SpecError(key="classroom.not_current", number=number)
            self._round.closed = True
            return self._round.view()


ROOM = Classroom()  # the server's one room; in memory only, gone with the process


def round_csv(closed: Round) -> str:
    """A closed round as CSV: one row an answer (round, exercise, prediction, the measured answer), no participant.

    Raises:
        SpecError: the round is still open (its answers are not shown yet).
    """
    if closed.is_open:
        raise SpecError(key="classroom.download_open", number=closed.number)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["round", "exercise", "kind", "answer", "prediction", "measured"])
    measured = "" if closed.measured is None else f"{closed.measured:.6g}"
    for index, value in enumerate(closed.answers, start=1):
        writer.writerow([closed.number, closed.exercise_id, closed.exercise.kind, index, f"{value:g}", measured])
    return out.getvalue()
