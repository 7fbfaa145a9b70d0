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
    now = job._started
    assert job.countdown(now).seconds is None  # nothing done yet, nothing predicted: no figure
    job._progress(Fact("progress.starting"), 0.05)  # the first reading, 10 s in (a model built): the pace's origin
    assert job.countdown(now + 10).seconds is None  # one reading is no pace yet
    job._progress(Fact("progress.starting"), 0.25)  # a fifth more of the work in the next ten seconds
    assert job.countdown(now + 20).left(now + 20) == pytest.approx(37.5)  # 0.75 at 0.2 in 10 s


def test_a_countdown_comes_from_measured_progress_and_never_rises_or_stalls_without_saying_why():
    """Issue 58: a sweep's first countdown said 1,335 s (it took 191 s), then 13 s with 85 s to go; a search held
    33-35 s for two minutes. A stubbed sequence of readings (the seconds worked and the clock handed in: no wall
    clock), through the one rule every countdown takes."""
    from ckptlab.lab.jobs import count_down

    # Before the work's own pace is measured: the prediction, less what is done. A model's build (12 s for 1% of the
    # work) is not scaled up into the estimate: the pace is measured from the first reading on.
    first = count_down(0.0, 0.0, 0.0, None, predicted_s=120.0)
    assert (first.seconds, first.basis) == (120.0, "predicted")
    built = count_down(0.01, 12.0, 12.0, first, predicted_s=120.0)
    assert built.basis == "predicted" and built.left(12.0) == pytest.approx(118.8)
    # Between readings it counts down with the clock, and says nothing more.
    assert built.left(22.0) == pytest.approx(108.8) and count_down(0.01, 22.0, 22.0, built).why == ""
    # A new reading: the seconds per share of the work since the first one, times the work left.
    paced = count_down(0.21, 32.0, 32.0, built, predicted_s=120.0)
    assert paced.basis == "so_far" and paced.left(32.0) == pytest.approx(20.0 / 0.2 * 0.79) and paced.why == ""
    # No reading for longer than the figure: it holds at none left and says the work is overdue, never "1 s left".
    late = count_down(0.21, 200.0, 200.0, paced)
    assert late.left(200.0) == 0.0 and late.why == "overdue"
    # A reading above the count down so far rises, and says it was revised; it stays said until the next reading.
    revised = count_down(0.3, 300.0, 300.0, late)
    assert revised.left(300.0) > 0 and revised.why == "revised" and count_down(0.3, 301.0, 301.0, revised).why
    # Waiting for the device queue: the figure holds (the wait is not work) and says why.
    held = count_down(0.3, 310.0, 310.0, revised, waiting=True)
    later = count_down(0.3, 310.0, 400.0, held, waiting=True)
    assert later.why == "waiting" and later.left(400.0) == held.left(310.0) == revised.left(310.0)
    # Back to work at the same fraction: it counts down again from where it was held.
    assert count_down(0.3, 311.0, 410.0, later).left(410.0) == pytest.approx(held.left(310.0) - 10.0)


def test_a_sweeps_fraction_moves_as_its_predicted_time_does():
    """The sweep's parts (each row's memory run, each length's timed rounds) as shares of its predicted time (each
    row's step as the roofline predicted it, handed in), not one share each: the timed rounds of 1,024 tokens are
    most of the work, and the 128-token rows little of it. Without predictions, every step weighs the same."""
    from ckptlab.explore.sweep import plan_sweep, sweep_shares
    from ckptlab.explore.sweep_spec import SweepSpec

    spec = SweepSpec(model="tiny-llama", seq_lens=(128, 1024))
    plan = plan_sweep(spec)
    rows = [
        spec.run_spec(seq, n, offload, selective=policy, attn_implementation=attention)
        for seq, n, offload, policy, attention in plan.rows
    ]
    shares = sweep_shares(spec, plan, {row: row.seq_len / 128 for row in rows})  # 8 times the step at 1,024
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares[("timing", 1024)] == pytest.approx(8 * shares[("timing", 128)])
    short, long = (next(i for i, row in enumerate(plan.rows) if row[0] == seq) for seq in (128, 1024))
    assert shares[("memory", long)] > 3 * shares[("memory", short)]
    counted = sweep_shares(spec, plan)  # no prediction: steps counted
    assert counted[("timing", 1024)] == pytest.approx(counted[("timing", 128)])
