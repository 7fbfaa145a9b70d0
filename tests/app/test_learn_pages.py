"""The Learn pages (timeline, lesson, exercises) in every language, driven headless with AppTest.

Runs go through the process-wide result cache, so each setting is measured once for the
whole suite; every language after the first reuses them.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from ckptlab.lab.exercises import by_id
from ckptlab.lab.learn import SHARDING, sharding_idea
from ckptlab.lab.learnruns import IdeaJob, qlora_job
from ckptlab.show import i18n
from tests.app.polling import learned
from tests.app.sessions import assert_alive, open_page

pytestmark = pytest.mark.slow  # real steps, subprocesses or the app: `pytest -m 'not slow'` skips them

LANGS = list(i18n.LANGUAGES)


@pytest.mark.parametrize("lang", LANGS)
def test_timeline_page_draws_the_step_and_follows_the_slider(lang):
    at = learned(open_page("pages/timeline.py", lang))
    assert at.title[0].value == i18n.t("timeline.page_title", lang)
    assert len(at.get("plotly_chart")) == 2  # the timeline and the diagram under it
    slider = at.select_slider(key="timeline_event")
    learned(slider.set_value(len(slider.options) - 4).run())
    assert_alive(at)
    assert i18n.t("timeline.at_event", lang).split("**")[1] in at.markdown[1].value
    assert len(at.get("plotly_chart")) == 2


@pytest.mark.parametrize("lang", LANGS)
def test_lesson_page_shows_a_live_figure_for_each_part(lang):
    at = open_page("pages/lesson.py", lang)
    seen = []
    for part in ("activation", "trade", "every_n", "offload", "peak", "shrink", "step"):
        learned(at.segmented_control(key="lesson_part").set_value(part).run())
        assert_alive(at)
        assert at.subheader[0].value == i18n.t(f"lesson.{part}.title", lang)
        seen.append(len(at.get("plotly_chart")))
    assert all(count >= 1 for count in seen), seen
    # The step-through: the slider moves through the events and the figures follow.
    learned(at.select_slider(key="lesson_step").set_value(10).run())
    assert_alive(at)
    assert len(at.get("plotly_chart")) == 3
    assert at.button(key="lesson_play").label == i18n.t("lesson.step.play", lang)


@pytest.mark.parametrize("lang", LANGS)
def test_exercise_records_a_prediction_and_shows_the_measurement(lang):
    at = open_page("pages/exercises.py", lang)

    def score() -> str:
        return next(metric.value for metric in at.metric if metric.label == i18n.t("exercises.score", lang))

    assert score() == "0 / 0"
    at.number_input(key="exercise_pred_resident_all").set_value(40).run()
    learned(at.button(key="exercise_submit").click().run())
    assert_alive(at)
    assert at.session_state["exercise_answers"] == {"resident_all": 40.0}
    assert at.number_input(key="exercise_pred_resident_all").disabled  # the first answer counts
    assert len(at.get("plotly_chart")) == 2  # the setting's diagram, the prediction beside the measurement
    assert at.subheader[1].value == i18n.t("exercises.result_title", lang)
    points = next(metric.value for metric in at.metric if metric.label == i18n.t("exercises.points", lang))
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


# The shard part draws a smaller idea: tiny-llama's on one and two GPUs, in the page's simulation workers (4 simulations
# of about 1.4 s of CPU, not 6 of 2.3). The lesson's own (qwen3-0.6b at 1024 tokens on 1, 2 and 4 GPUs) is
# tests/lab/test_learn_sharding.py's, which proves each thing it says.
TINY_SHARDING = replace(SHARDING, model="tiny-llama", seq_len=128)
TINY_GPUS = (1, 2)


@pytest.fixture
def tiny_sharding(monkeypatch):
    """The server's sharding job, of :data:`TINY_SHARDING` on :data:`TINY_GPUS` (its simulations kept for the process, as
    the lesson's)."""
    import pages._learn_runs

    jobs: list[IdeaJob] = []

    def sharding_job(workers=None) -> IdeaJob:
        if not jobs:
            jobs.append(IdeaJob("sharding", partial(sharding_idea, TINY_SHARDING, TINY_GPUS), workers).start())
        return jobs[0]

    monkeypatch.setattr(pages._learn_runs, "sharding_job", sharding_job)
    return sharding_job


@pytest.mark.parametrize("lang", LANGS)
def test_the_shard_part_draws_one_gpus_memory_from_simulations(lang, tiny_sharding):
    at = open_page("pages/lesson.py", lang)
    learned(at.segmented_control(key="lesson_part").set_value("shard").run())
    assert_alive(at)
    assert at.subheader[0].value == i18n.t("lesson.shard.title", lang)
    assert len(at.get("plotly_chart")) == 1
    idea = tiny_sharding().idea  # the server's one simulation, shared by every session
    caption = "\n".join(str(element.value) for element in at.caption)
    assert (
        f"**{idea.state_ratio * 100:.0f}%**" in caption
        and f"**{idea.activation_ratio_checkpointing * 100:.0f}%**" in caption
    )
    assert {bar.result.provenance.kind for bar in idea.bars} == {"simulated"}


# -- selective checkpointing: the lesson part "what to keep" and its exercise, with no English left ------------
ENGLISH = json.loads((Path(__file__).resolve().parents[2] / "ckptlab/locales/en.json").read_text(encoding="utf-8"))
# The words of the two: every English fragment of their templates (placeholders and markup cut out).
KEEP_KEYS = [
    key
    for key in ENGLISH
    if key.startswith(("lesson.keep.", "exercise.keep_attention.", "selective.verdict_", "selective.explain_kept",
                       "selective.prediction_kib", "selective.diagram_"))
]  # fmt: skip
FRAGMENTS = sorted(
    {
        part.strip()
        for key in KEEP_KEYS
        for part in re.split(r"\{[^}]*\}|\*\*|`[^`]*`|<br>|\n|[():;,.]", ENGLISH[key])
        if len(part.strip()) >= 12
    }
)


def _shown(at) -> str:
    """Every word the page shows: its texts, widgets' labels and the figures' JSON (titles, boxes, hovers)."""
    texts = [str(element.value) for kind in ("markdown", "caption", "subheader", "title", "success", "info",
                                             "warning") for element in getattr(at, kind)]  # fmt: skip
    texts += [str(widget.label) for widget in [*at.number_input, *at.button, *at.metric, *at.selectbox]]
    texts += [chart.proto.spec for chart in at.get("plotly_chart")]
    return "\n".join(texts)


def _no_english(at, lang: str) -> None:
    assert KEEP_KEYS and FRAGMENTS
    shown = _shown(at)
    left = [fragment for fragment in FRAGMENTS if fragment in shown]
    if lang == "en":
        assert left  # the check sees the English words where they belong: it can fail
    else:
        assert not left, left


@pytest.mark.parametrize("lang", LANGS)
def test_the_lesson_part_what_to_keep_is_in_the_pages_language(lang):
    at = open_page("pages/lesson.py", lang)
    learned(at.segmented_control(key="lesson_part").set_value("keep").run())
    assert_alive(at)
    assert at.subheader[0].value == i18n.t("lesson.keep.title", lang)
    assert len(at.get("plotly_chart")) == 2  # the diagram of what each CP layer kept, the memory beside plain and off
    results = at.session_state["learn_results"]
    kept = next(r for spec, r in results.items() if spec.selective == "attention" and spec.seq_len == 128)
    kib = sum(layer.kept_bytes for layer in kept.layers if layer.enabled == "CP") / 1024
    assert kib > 0 and f"**{i18n.number(kib, ',.1f', lang)} KiB**" in "\n".join(str(c.value) for c in at.caption)
    _no_english(at, lang)


@pytest.mark.parametrize("lang", LANGS)
def test_the_exercise_keeping_the_attention_is_in_the_pages_language(lang):
    at = open_page("pages/exercises.py", lang)
    at.selectbox(key="exercise_pick").set_value("keep_attention").run()
    assert at.subheader[0].value == i18n.t("exercise.keep_attention.name", lang)
    values = by_id("keep_attention").question_values()
    assert f"**{i18n.t('exercise.keep_attention.question', lang, **values)}**" in [m.value for m in at.markdown]
    at.number_input(key="exercise_pred_keep_attention").set_value(1000).run()
    learned(at.button(key="exercise_submit").click().run())
    assert_alive(at)
    assert at.session_state["exercise_answers"]["keep_attention"] == 1000.0
    results = at.session_state["learn_results"]
    kept = next(r for spec, r in results.items() if spec.selective == "attention" and spec.seq_len == 128)
    kib = sum(layer.kept_bytes for layer in kept.layers if layer.enabled == "CP") / 1024
    explanation = "\n".join(m.value for m in at.markdown)
    assert f"{i18n.number(kib, ',.1f', lang)} KiB" in explanation  # the measured bytes, in the explanation
    _no_english(at, lang)


def test_the_lesson_part_on_the_attention_matrix_shows_eager_beside_sdpa_at_two_lengths():
    at = open_page("pages/lesson.py", "pt-BR")
    learned(at.segmented_control(key="lesson_part").set_value("attention").run())
    assert_alive(at)
    assert at.subheader[0].value == i18n.t("lesson.attention.title", "pt-BR")
    assert len(at.get("plotly_chart")) == 1  # four bars: SDPA and eager at 128 and 512 tokens, measured
    runs = {
        (spec.attn_implementation, spec.seq_len): result
        for spec, result in at.session_state["learn_results"].items()
        if spec.every_n_layers is None and spec.optimizer == "none"
    }
    # tiny-llama: eager keeps 6 heads x seq^2 float32 probabilities a layer; SDPA a logsumexp of 6 x seq instead.
    for seq in (128, 512):
        extra = runs["eager", seq].memory.after_forward_bytes - runs["sdpa", seq].memory.after_forward_bytes
        assert extra == 6 * 6 * (seq * seq - seq) * 4, seq
    per_layer = f"**{6 * (512 * 512 - 512) * 4 / 2**20:,.2f} MiB**"
    assert per_layer in "\n".join(str(caption.value) for caption in at.caption)


def test_the_4_bit_part_shows_the_weights_shrink_and_the_activations_do_not_simulated():
    """QLoRA's lesson part (issue 46), in pt-BR: four simulated steps of tiny-llama with LoRA, a bf16 base beside a
    4-bit one, checkpointing off and every layer; the caption's figures are those simulations'."""
    at = open_page("pages/lesson.py", "pt-BR")
    learned(at.segmented_control(key="lesson_part").set_value("qlora").run())
    assert_alive(at)
    assert at.subheader[0].value == i18n.t("lesson.qlora.title", "pt-BR")
    assert len(at.get("plotly_chart")) == 1
    idea = qlora_job().idea  # the server's one simulation, shared by every session
    assert {bar.result.provenance.kind for bar in idea.bars} == {"simulated"}
    sixteen, four, four_on = idea.bar(False, None).parts, idea.bar(True, None).parts, idea.bar(True, 1).parts
    assert four["parameter"] < 0.8 * sixteen["parameter"]  # the weights shrink (the embeddings and head stay)
    assert four["activation"] >= 0.9 * sixteen["activation"]  # the activations do not
    assert four["optimizer_state"] == sixteen["optimizer_state"]  # nor the adapters' AdamW state
    assert four_on["activation"] < four["activation"] / 2  # checkpointing does
    caption = "\n".join(str(element.value) for element in at.caption)
    assert f"**{i18n.number(four['parameter'] / 2**20, ',.1f', 'pt-BR')} MiB**" in caption, caption
