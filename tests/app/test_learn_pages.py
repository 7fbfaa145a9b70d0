"""The Learn pages (timeline, lesson, exercises) in every language, driven headless with AppTest.

Runs go through the process-wide result cache, so each setting is measured once for the
whole suite; every language after the first reuses them.
"""

from __future__ import annotations

import pytest

from ckptlab.lab.learnruns import sharding_job
from ckptlab.show import i18n
from tests.app.polling import learned
from tests.app.sessions import assert_alive, open_page

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

LANGS = list(i18n.LANGUAGES)


@pytest.mark.parametrize("lang", LANGS)
def test_timeline_page_draws_the_step_and_follows_the_slider(lang):
    at = learned(open_page("pages/timeline.py", lang))
    tr = i18n.translator(lang)
    assert at.title[0].value == tr("timeline.page_title")
    assert len(at.get("plotly_chart")) == 2  # the timeline and the diagram under it
    slider = at.select_slider(key="timeline_event")
    learned(slider.set_value(len(slider.options) - 4).run())
    assert_alive(at)
    assert tr("timeline.at_event").split("**")[1] in at.markdown[1].value
    assert len(at.get("plotly_chart")) == 2


@pytest.mark.parametrize("lang", LANGS)
def test_lesson_page_shows_a_live_figure_for_each_part(lang):
    at = open_page("pages/lesson.py", lang)
    tr = i18n.translator(lang)
    seen = []
    for part in ("activation", "trade", "every_n", "offload", "peak", "shrink", "step"):
        learned(at.segmented_control(key="lesson_part").set_value(part).run())
        assert_alive(at)
        assert at.subheader[0].value == tr(f"lesson.{part}.title")
        seen.append(len(at.get("plotly_chart")))
    assert all(count >= 1 for count in seen), seen
    # The step-through: the slider moves through the events and the figures follow.
    learned(at.select_slider(key="lesson_step").set_value(10).run())
    assert_alive(at)
    assert len(at.get("plotly_chart")) == 3
    assert at.button(key="lesson_play").label == tr("lesson.step.play")


@pytest.mark.parametrize("lang", LANGS)
def test_exercise_records_a_prediction_and_shows_the_measurement(lang):
    at = open_page("pages/exercises.py", lang)
    tr = i18n.translator(lang)

    def score() -> str:
        return next(metric.value for metric in at.metric if metric.label == tr("exercises.score"))

    assert score() == "0 / 0"
    at.number_input(key="exercise_pred_resident_all").set_value(40).run()
    learned(at.button(key="exercise_submit").click().run())
    assert_alive(at)
    assert at.session_state["exercise_answers"] == {"resident_all": 40.0}
    assert at.number_input(key="exercise_pred_resident_all").disabled  # the first answer counts
    assert len(at.get("plotly_chart")) == 2  # the setting's diagram, the prediction beside the measurement
    assert at.subheader[1].value == tr("exercises.result_title")
    points = next(metric.value for metric in at.metric if metric.label == tr("exercises.points"))
    assert score() == points  # the session's score in the sidebar: this answer's points, of 3
    # The next exercise, a choice: answer and measure.
    at.button(key="exercise_next").click().run()
    at.selectbox(key="exercise_pick").set_value("budget").run()
    at.radio(key="exercise_choice_budget").set_value(2).run()
    learned(at.button(key="exercise_submit").click().run())
    assert_alive(at)
    assert set(at.session_state["exercise_answers"]) == {"resident_all", "budget"}
    assert score().endswith("/ 6")


def test_the_shrink_part_shows_checkpointing_shrinks_lora_more_than_a_full_fine_tune():
    at = open_page("pages/lesson.py", "en")
    learned(at.segmented_control(key="lesson_part").set_value("shrink").run())
    assert_alive(at)
    assert len(at.get("plotly_chart")) == 1
    caption = "\n".join(str(element.value) for element in at.caption)
    assert "Peak with every_n_layers=1 as a share of checkpointing off" in caption
    results = at.session_state["learn_results"]
    lora = {spec.every_n_layers: result for spec, result in results.items() if spec.lora_rank is not None}
    full = {
        spec.every_n_layers: result
        for spec, result in results.items()
        if spec.optimizer == "adamw" and spec.lora_rank is None
    }
    ratio = {
        name: runs[1].memory.peak_bytes / runs[None].memory.peak_bytes
        for name, runs in (("lora", lora), ("full", full))
    }
    assert ratio["lora"] < ratio["full"]  # with LoRA, activations are most of the step: checkpointing shrinks more
    for runs in (lora, full):  # never the parameters or the optimizer state
        off, on = (runs[n].memory.breakdown_at_peak for n in (None, 1))
        assert on["parameter"] == off["parameter"] and on["optimizer_state"] == off["optimizer_state"]


@pytest.mark.parametrize("lang", LANGS)
def test_the_shard_part_draws_one_gpus_memory_from_simulations(lang):
    at = open_page("pages/lesson.py", lang)
    tr = i18n.translator(lang)
    learned(at.segmented_control(key="lesson_part").set_value("shard").run())
    assert_alive(at)
    assert at.subheader[0].value == tr("lesson.shard.title")
    assert len(at.get("plotly_chart")) == 1
    idea = sharding_job().idea  # the server's one simulation, shared by every session
    caption = "\n".join(str(element.value) for element in at.caption)
    assert (
        f"**{idea.state_ratio * 100:.0f}%**" in caption
        and f"**{idea.activation_ratio_checkpointing * 100:.0f}%**" in caption
    )
    assert {bar.result.provenance.kind for bar in idea.bars} == {"simulated"}
