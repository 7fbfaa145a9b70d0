"""One home for "a job failed" (BackgroundJob._fail): the lab's error kept to be translated, a bug said briefly; its pace."""

from __future__ import annotations

import pytest

from ckptlab.errors import Option, SpecError
from ckptlab.fact import Fact
from ckptlab.lab.jobs import BackgroundJob
from ckptlab.lab.scalejob import ScaleJob
from ckptlab.show import i18n


class _Failing(BackgroundJob):
    """Work that fails at once with ``error``: what a page polls is what _fail kept."""

    def __init__(self, error: Exception, bug_words=None) -> None:
        super().__init__("test-failing")
        self.error, self.bug_words = error, bug_words

    def _run(self) -> None:
        self._fail(self.error, self.bug_words)
        with self._lock:
            self._finished = True


def _failed(error: Exception, bug_words=None) -> _Failing:
    job = _Failing(error, bug_words).start()
    job.join()
    return job  # type: ignore[return-value]


def test_the_labs_own_error_is_kept_as_it_is_for_the_page_to_translate():
    error = SpecError(key="spec.whole_number", option=Option("seq_len", 0), minimum=1)
    job = _failed(error)
    assert job._error == "seq_len=0 is not valid: it must be a whole number >= 1." and job._failure is error
    # Words for a bug are for bugs: the lab's error stays its own sentence.
    assert _failed(error, bug_words=lambda detail: Fact("sweep.failed_rows_kept", {"error": detail}))._failure is error


def test_a_bug_is_its_type_and_message_or_the_jobs_sentence_around_them():
    job = _failed(ZeroDivisionError("division by zero"))
    assert job._error == "ZeroDivisionError: division by zero" and job._failure is None

    def kept(detail: str) -> Fact:
        return Fact("sweep.failed_rows_kept", {"error": detail})

    said = _failed(RuntimeError("boom"), bug_words=kept)._error
    assert said == Fact("sweep.failed_rows_kept", {"error": "RuntimeError: boom"})
    assert i18n.say(said) == "The sweep failed unexpectedly (RuntimeError: boom); the rows measured are kept."
    assert "RuntimeError: boom" in i18n.say(said, "pt-BR") and i18n.say(said, "pt-BR") != i18n.say(said)


def test_a_simulation_job_fails_through_the_same_path(monkeypatch):
    from ckptlab.explore.scale import ScaleRequest, scale_settings
    from ckptlab.lab import workerjobs  # the job's work, on the job's thread without a worker pool

    def broken(*args, **kwargs):
        raise KeyError("no such thing")

    monkeypatch.setattr(workerjobs, "scale_table", broken)
    request = ScaleRequest("tiny-llama", 64, 1, "float32", tuple(scale_settings(2)[:1]))
    job = ScaleJob(request).start()
    job.join()
    state = job.state()
    assert not state.running and state.error == "KeyError: 'no such thing'" and state.failure is None


def test_the_seconds_left_follow_the_jobs_own_pace():
    job = BackgroundJob("pace")
    assert job.left_s() is None  # nothing done yet: no pace to go by
    job._started -= 10.0  # ten seconds ago
    job._progress("halfway", 0.25)
    assert job.left_s() == pytest.approx(30.0, rel=0.05)  # a quarter in ten seconds: three quarters in thirty
