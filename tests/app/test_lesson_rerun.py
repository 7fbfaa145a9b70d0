"""The lesson's part on the rerun's cost (issue 59): its figure and caption from the idea the server simulates once,
here made by hand from counted work so the page is driven without simulating four 8B-sized steps."""

from __future__ import annotations

import pytest

from ckptlab.explore.gpus import GPU_SPECS
from ckptlab.explore.roofline import rerun_anatomy
from ckptlab.lab import learnruns, lesson_view
from ckptlab.lab.learn import RERUN_GPU, RERUN_LENGTHS, RERUN_MODELS, RerunCase, RerunIdea
from ckptlab.show import i18n
from ckptlab.step.work import OpCost, StepWork, WorkItem
from tests.app.polling import learned
from tests.app.sessions import assert_alive, open_page


def _work(hidden: int, seq: int, rerun: bool) -> StepWork:
    """A one-layer step: two matmuls and an attention in the layer, a head matmul and a loss outside it, a backward of
    twice the layer's work; the rerun repeats the layer's forward."""
    mm = OpCost("aten.mm.default", "bfloat16", 2 * seq * hidden * hidden, 6 * seq * hidden)
    attention = OpCost("aten._scaled_dot_product_flash_attention_for_cpu.default", "bfloat16", 4 * seq * seq * hidden,
                       8 * seq * hidden)  # fmt: skip
    head = OpCost("aten.mm.default", "bfloat16", 2 * seq * hidden * 32_000, 2 * seq * 32_000)
    loss = OpCost("aten._log_softmax.default", "float32", 0, 8 * seq * 32_000)
    tiny = OpCost("aten.mul.Tensor", "bfloat16", 0, 64)
    layer = [WorkItem("forward", 0, mm, 2), WorkItem("forward", 0, attention, 1), WorkItem("forward", 0, tiny, 20)]
    items = [*layer, WorkItem("forward", None, head, 1), WorkItem("loss", None, loss, 1)]
    items += [WorkItem("backward", 0, mm, 4), WorkItem("backward", 0, attention, 2)]
    if rerun:
        items += [WorkItem("rerun", 0, item.cost, item.count) for item in layer]
    return StepWork(tuple(items))


def hand_idea() -> RerunIdea:
    speed = GPU_SPECS[RERUN_GPU]
    cases = []
    for model, hidden in zip(RERUN_MODELS, (1024, 4096)):
        for seq in RERUN_LENGTHS:
            anatomy = rerun_anatomy(_work(hidden, seq, False), _work(hidden, seq, True), speed, tokens=seq)
            cases.append(RerunCase(model, seq, anatomy))
    return RerunIdea(RERUN_GPU, cases)


def test_the_caption_says_the_predicted_factors_the_head_never_rerun_and_attention_growing_with_the_length():
    idea = hand_idea()
    large = RERUN_MODELS[1]
    short, long = (idea.case(large, seq).anatomy for seq in RERUN_LENGTHS)
    assert long.attention_share > short.attention_share  # the square of the length against the length
    caption = lesson_view.rerun_caption(idea, "en")
    assert caption.startswith(f"Predicted on an {RERUN_GPU}") and "not measured" in caption
    assert f"the textbook says ×{4 / 3:,.2f}" in caption
    assert f"×{idea.cases[0].anatomy.factor:,.2f} for {RERUN_MODELS[0]} at 1,024" in caption
    assert f"Attention is {short.attention_share * 100:,.0f}% of {large}'s rerun at 1,024 tokens" in caption
    assert "1.024 tokens" in lesson_view.rerun_caption(idea, "pt-BR")  # the language's own number form


@pytest.mark.slow  # the app's page, driven headless
def test_the_lesson_part_on_the_reruns_cost_draws_the_servers_idea(monkeypatch):
    monkeypatch.setitem(learnruns.IDEAS, "rerun", lambda progress=None, workers=None: hand_idea())
    at = open_page("pages/lesson.py", "ja")
    learned(at.segmented_control(key="lesson_part").set_value("rerun").run())
    assert_alive(at)
    assert at.subheader[0].value == i18n.t("lesson.rerun.title", "ja")
    assert len(at.get("plotly_chart")) == 1
    caption = "\n".join(str(element.value) for element in at.caption)
    assert lesson_view.rerun_caption(learnruns.rerun_job().idea, "ja") in caption
