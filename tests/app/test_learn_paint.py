"""The Learn pages draw their words at once, show the shared runs' progress, and fill in when the runs are there.

The runs are held back by a gate (a stand-in for the device's turn that the test opens), so the
first render is the one a participant sees while the runs are measured; then the real
measurement runs and the page is rerun, as its fragment's timer would, until its figures are drawn.
"""

from __future__ import annotations

import threading

import pytest

import pages._learn_runs as learn_runs
from ckptlab.lab import learnruns
from ckptlab.lab.learnruns import SharedRuns, workshop_specs
from ckptlab.lab.run import Pace, ResultCache, run_queued
from ckptlab.lab.runqueue import DeviceBusyError
from ckptlab.show import i18n
from tests.app.polling import rerun_until
from tests.app.sessions import assert_alive, open_page

pytestmark = pytest.mark.slow  # real steps of a tiny model behind the gate


class GatedRuns:
    """A store of its own whose measurements wait for ``go`` and are counted, then measure for real."""

    def __init__(self) -> None:
        self.go, self.entered, self.asked = threading.Event(), threading.Event(), []
        cache = ResultCache()  # its own: nothing measured by other tests is reused

        def measure(spec, **kwargs):
            self.asked.append(spec)
            self.entered.set()
            assert self.go.wait(600), "the test never opened the gate"
            return run_queued(spec, cache=cache, **kwargs)

        self.runs = SharedRuns(measure=measure, pace=Pace())


@pytest.fixture
def gated(monkeypatch) -> GatedRuns:
    gate = GatedRuns()
    monkeypatch.setattr(learn_runs, "LEARN_RUNS", gate.runs)
    yield gate
    gate.go.set()  # a run still queued ends rather than waiting on the gate


def charts(at) -> int:
    return len(at.get("plotly_chart"))


def test_the_timeline_draws_its_words_at_once_and_its_figures_when_the_run_is_measured(gated):
    at = open_page("pages/timeline.py", "pt-BR")
    lang = "pt-BR"
    assert at.title[0].value == i18n.t("timeline.page_title", lang)
    assert at.markdown[0].value == i18n.t("timeline.intro", lang)
    assert at.get("progress") and charts(at) == 0  # the progress bar stands where the figures will be
    assert gated.entered.wait(60)  # the shared run is being measured (behind the gate) while the page stands
    gated.go.set()
    rerun_until(at, lambda page: charts(page) == 2)
    assert_alive(at)
    assert not at.get("progress") and len(gated.asked) == 1


def test_two_sessions_asking_for_the_same_lesson_run_cause_one_measurement(gated):
    first, second = open_page("pages/lesson.py"), open_page("pages/lesson.py", "ja")
    for at, lang in ((first, "en"), (second, "ja")):
        assert at.subheader[0].value == i18n.t("lesson.activation.title", lang)
        assert i18n.t("lesson.activation.body", lang) in [markdown.value for markdown in at.markdown]
        assert at.get("progress") and charts(at) == 0
    gated.go.set()
    for at in (first, second):
        rerun_until(at, lambda page: charts(page) == 1)
        assert_alive(at)
    assert len(gated.asked) == 1 and gated.runs.measurements == 1


def test_the_warm_up_flag_queues_the_workshops_runs_when_a_first_page_opens(monkeypatch):
    asked = []

    def measure(spec, **_):
        asked.append(spec)
        raise DeviceBusyError(key="queue.busy", seconds=0, ahead=0)

    simulated = {name: threading.Event() for name in learnruns.IDEAS}  # the lesson's ideas, stubbed
    for name, done in simulated.items():
        monkeypatch.setitem(learnruns.IDEAS, name, lambda progress=None, workers=None, done=done: done.set())
    monkeypatch.setattr(learnruns, "_ideas", {})
    runs = SharedRuns(measure=measure, pace=Pace())
    monkeypatch.setattr(learnruns, "LEARN_RUNS", runs)
    monkeypatch.setenv("CKPTLAB_WARM_LEARN", "1")
    open_page("pages/lab.py")
    assert runs.wait(workshop_specs()).settled
    assert asked == workshop_specs()
    assert all(done.wait(60) for done in simulated.values())  # then every simulated part of the lesson
