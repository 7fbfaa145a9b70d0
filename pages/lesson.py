"""Step-through lesson: one idea at a time, each next to a figure from a real run of a tiny model.

A flat page: the part picked at the top decides which settings to measure (through the
device queue, ``ckptlab.lab.learn``; results kept in the session and shared with the other
Learn pages), then the core's figures are drawn. The last part steps through one training
step event by event, with a slider and a Play button (its state: ``lesson_step_setting``, the setting shown;
``lesson_step``, the event; ``lesson_playing``; ``lesson_last``, the last event's index, for Play at the end to
start over). Words come from the locale files.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

import ckptlab
from ckptlab.lab import learn, lesson_view
from ckptlab.results import RunResult
from ckptlab.show.figures.allocator import segments_figure
from ckptlab.show.figures.breakdown import breakdown_figure, sharding_figure
from ckptlab.show.figures.diagram import diagram_figure, focus_of
from ckptlab.show.figures.rerun import rerun_figure
from ckptlab.show.figures.run import offload_figure, runs_tradeoff_figure
from ckptlab.show.figures.timeline import peak_cause, step_figure, timeline_figure
from ckptlab.show.i18n import number, t
from ckptlab.show.wording import run_message
from ckptlab.units import MIB
from pages._common import language, run_through_app
from pages._learn_runs import measured, simulated_allocator, simulated_qlora, simulated_rerun, simulated_sharding

run_through_app()

state = st.session_state
lang = language()

PARTS = tuple(part.name for part in learn.LESSON_PARTS)
BASE, LONG, FULL, LORA = learn.LESSON_BASE, learn.LESSON_LONG, learn.LESSON_FULL, learn.LESSON_LORA


def need(name: str) -> list[RunResult]:
    """The runs part ``name`` draws (:data:`ckptlab.lab.learn.LESSON_PARTS`: the one list the warm-up measures too),
    in its order; stop the page with a message if they cannot run yet."""
    lesson_part = learn.lesson_part(name)
    results = measured(lesson_part.asks(), lang)
    if results is None:  # being measured (the progress is shown) or failed: the part's words meanwhile
        st.markdown(t(f"lesson.{part}.body", lang))
        st.stop()
    for spec in lesson_part.runs:
        if results[spec].status != "ok":
            st.error(run_message(results[spec], lang))
            st.stop()
    return [results[spec] for spec in lesson_part.runs]


def figure_column() -> DeltaGenerator:
    """The part's words on the left; returns the column on their right, for its figures."""
    text, figure = st.columns([2, 3])
    text.markdown(t(f"lesson.{part}.body", lang))
    return figure


def go_next() -> None:
    state.lesson_part = PARTS[min(PARTS.index(state.lesson_part) + 1, len(PARTS) - 1)]


STEP_SETTINGS = learn.STEP_SETTINGS
PLAY_SECONDS = 0.8  # between two events while playing: slow enough to read on a projector


def toggle_play() -> None:
    state = st.session_state
    playing = not state.get("lesson_playing", False)
    if playing and state.get("lesson_step", 0) >= state.get("lesson_last", 0):
        state.lesson_step = 0  # Play at the end starts over
    state.lesson_playing = playing


def draw_step_through(run_at: Callable[[int | None], RunResult], lang: str) -> None:
    """The setting's picker, Play, then the slider and figures of the run ``run_at(every_n_layers)`` measures."""
    state = st.session_state
    st.markdown(t("lesson.step.body", lang))
    state.setdefault("lesson_step_setting", 2)
    setting = st.segmented_control(
        t("lesson.step.setting", lang),
        STEP_SETTINGS,
        key="lesson_step_setting",
        required=True,
        format_func=lambda n: t("setting.off", lang) if n is None else t("setting.on", lang, n=n),
    )
    run = run_at(setting)
    points = run.memory.timeline
    state.lesson_last = len(points) - 1
    state.setdefault("lesson_step", 0)
    state.lesson_step = min(state.lesson_step, len(points) - 1)
    playing = state.get("lesson_playing", False)
    st.button(
        t("lesson.step.pause", lang) if playing else t("lesson.step.play", lang),
        key="lesson_play",
        on_click=toggle_play,
        type="primary",
        icon=":material/pause:" if playing else ":material/play_arrow:",
    )

    @st.fragment(run_every=PLAY_SECONDS if playing else None)
    def stepper() -> None:
        """The slider and the figures; while playing, each timer tick moves one event on."""
        if state.get("lesson_playing", False):
            if state.lesson_step < len(points) - 1:
                state.lesson_step += 1
            else:
                state.lesson_playing = False
                st.rerun()  # a full run, so the fragment's timer stops and the button says Play again
        index = st.select_slider(
            t("lesson.step.slider", lang),
            options=list(range(len(points))),
            key="lesson_step",
            format_func=lambda i: lesson_view.event_option(points, i, lang),
        )
        left, right = st.columns(2)
        left.plotly_chart(step_figure(run, index, lang=lang, height=420), key="lesson_step_chart", theme=None)
        right.plotly_chart(
            timeline_figure(run, lang=lang, cursor=index, height=420), key="lesson_step_timeline", theme=None
        )
        diagram = lesson_view.run_diagram(run, lang, focus=focus_of(points[index]), height=230)
        st.plotly_chart(diagram, key="lesson_step_diagram", theme=None)
        st.caption(t("lesson.step.legend", lang))
        st.caption(lesson_view.source_caption([run], lang))

    stepper()


st.title(t("lesson.page_title", lang), anchor=False)
st.caption(t("lesson.setup", lang))
state.setdefault("lesson_part", PARTS[0])
# The picker has the page's whole width, so its eleven parts wrap onto a second line rather than run on under Next
# (at 1280x720 a [6, 1] column showed parts 1-6 and cut "7. T…" behind the button); Next sits by the part's title.
part = st.segmented_control(
    t("lesson.part", lang),
    PARTS,
    key="lesson_part",
    required=True,
    format_func=lambda name: f"{PARTS.index(name) + 1}. {t('lesson.' + name + '.tab', lang)}",
)
heading, forward = st.columns([6, 1], vertical_alignment="center")
heading.subheader(t(f"lesson.{part}.title", lang), anchor=False)
forward.button(t("lesson.next", lang), key="lesson_next", on_click=go_next, disabled=part == PARTS[-1], width="stretch")

if part == "activation":
    [off] = need(part)
    figure = figure_column()
    figure.plotly_chart(
        step_figure(off, lesson_view.loss_index(off), lang=lang), key="lesson_activation_chart", theme=None
    )
    saved = lesson_view.saved_bytes(off) / MIB
    figure.caption(t("lesson.activation.caption", lang, mib=number(saved, ",.1f", lang), layers=len(off.layers)))
    figure.caption(lesson_view.source_caption([off], lang))

elif part == "trade":
    off, one = need(part)
    figure = figure_column()
    figure.plotly_chart(runs_tradeoff_figure([off, one], lang=lang), key="lesson_trade_chart", theme=None)
    comparison = ckptlab.compare(one, off)
    # A step time inside the repeats' spread is noise on a shared CPU: the caption says so rather than quote it bare.
    caption = "lesson.trade.caption" if comparison.step_significant else "lesson.trade.caption_noise"
    figure.caption(
        t(
            caption,
            lang,
            resident=number(comparison.after_forward_ratio * 100, ".0f", lang),
            step=number(comparison.step_ratio * 100, ".0f", lang),
        )
    )
    figure.plotly_chart(lesson_view.run_diagram(one, lang), key="lesson_trade_diagram", theme=None)
    figure.caption(lesson_view.source_caption([off, one], lang))

elif part == "every_n":
    runs = need(part)  # off, n=1, 2, 3
    figure = figure_column()
    figure.plotly_chart(lesson_view.run_diagram(runs[2], lang), key="lesson_every_n_diagram", theme=None)  # n=2
    figure.plotly_chart(runs_tradeoff_figure(runs, lang=lang), key="lesson_every_n_chart", theme=None)
    figure.caption(t("lesson.every_n.caption", lang))
    figure.caption(lesson_view.source_caption(runs, lang))

elif part == "keep":  # inside a checkpointed layer: plain checkpointing beside keeping the attention
    off, plain, kept = need(part)
    figure = figure_column()
    figure.plotly_chart(diagram_figure(kept, lang=lang), key="lesson_keep_diagram", theme=None)
    bars = [
        (t("setting.short_off", lang), off),
        (t("lesson.keep.bar_plain", lang), plain),
        (t("lesson.keep.bar_kept", lang), kept),
    ]
    figure.plotly_chart(breakdown_figure(bars, lang=lang, height=380), key="lesson_keep_chart", theme=None)
    figure.caption(lesson_view.keep_caption(plain, kept, lang))
    figure.caption(lesson_view.source_caption([off, plain, kept], lang))

elif part == "attention":  # eager against SDPA, checkpointing off, at two lengths: the s^2 the fused kernels recompute
    runs = need(part)  # SDPA, eager at the short length, then at the long one
    figure = figure_column()
    figure.plotly_chart(lesson_view.attention_figure(runs, lang), key="lesson_attention_chart", theme=None)
    figure.caption(lesson_view.attention_shown(runs[0], runs[1], lang))
    figure.caption(lesson_view.attention_caption([(runs[0], runs[1]), (runs[2], runs[3])], lang))
    figure.caption(lesson_view.source_caption(runs, lang))

elif part == "offload":
    chosen = need(part)
    figure = figure_column()
    figure.plotly_chart(offload_figure(chosen, lang=lang), key="lesson_offload_chart", theme=None)
    figure.caption(
        t(
            "lesson.offload.caption",
            lang,
            mib=number(chosen[-1].memory.offload_bytes / MIB, ",.1f", lang),
            seq=LONG.seq_len,
        )
    )
    figure.caption(lesson_view.source_caption(chosen, lang))

elif part == "peak":
    short_off, short_on, long_off, long_on = need(part)
    st.markdown(t("lesson.peak.body", lang))
    short, long = st.columns(2)
    short.plotly_chart(
        timeline_figure(short_on, [short_off], lang=lang, height=430), key="lesson_peak_short", theme=None
    )
    short.caption(t("lesson.peak.caption", lang, seq=BASE.seq_len, cause=peak_cause(short_on, lang)))
    long.plotly_chart(timeline_figure(long_on, [long_off], lang=lang, height=430), key="lesson_peak_long", theme=None)
    long.caption(t("lesson.peak.caption", lang, seq=LONG.seq_len, cause=peak_cause(long_on, lang)))
    ratios = [ckptlab.compare(on, off).peak_ratio for on, off in ((short_on, short_off), (long_on, long_off))]
    st.markdown(
        t(
            "lesson.peak.numbers",
            lang,
            short=number(ratios[0] * 100, ".0f", lang),
            long=number(ratios[1] * 100, ".0f", lang),
            seq_short=BASE.seq_len,
            seq_long=LONG.seq_len,
        )
    )
    st.caption(lesson_view.source_caption([short_off, short_on, long_off, long_on], lang))

elif part == "shrink":
    full_off, full_on, lora_off, lora_on = need(part)
    figure = figure_column()
    off_words = t("setting.short_off", lang)
    bars = [
        (t("lesson.shrink.bar_full", lang, setting=off_words), full_off),
        (t("lesson.shrink.bar_full", lang, setting="n=1"), full_on),
        (t("lesson.shrink.bar_lora", lang, rank=LORA.lora_rank, setting=off_words), lora_off),
        (t("lesson.shrink.bar_lora", lang, rank=LORA.lora_rank, setting="n=1"), lora_on),
    ]
    figure.plotly_chart(breakdown_figure(bars, lang=lang, height=480), key="lesson_shrink_chart", theme=None)
    shares = [number(lesson_view.activation_share(off) * 100, ".0f", lang) for off in (full_off, lora_off)]
    ratios = [ckptlab.compare(on, off).peak_ratio for on, off in ((full_on, full_off), (lora_on, lora_off))]
    figure.caption(
        t(
            "lesson.shrink.caption",
            lang,
            seq=FULL.seq_len,
            full=number(ratios[0] * 100, ".0f", lang),
            lora=number(ratios[1] * 100, ".0f", lang),
            full_share=shares[0],
            lora_share=shares[1],
        )
    )
    figure.caption(lesson_view.source_caption([full_off, full_on, lora_off, lora_on], lang))

elif part == "shard":  # simulated (it needs several GPUs), kept for the process: the next participant waits for nothing
    idea = simulated_sharding(lang)
    if idea is None:  # being simulated (the progress is shown) or failed: the part's words meanwhile
        st.markdown(t("lesson.shard.body", lang))
        st.stop()
    figure = figure_column()
    labels = lesson_view.shard_labels(idea, lang)
    spec = idea.bars[0].spec
    subtitle = t("lesson.shard.subtitle", lang, model=spec.model, seq=number(spec.seq_len, ",", lang))
    figure.plotly_chart(
        sharding_figure([(label, b.parts) for label, b in zip(labels, idea.bars)], subtitle, lang=lang),
        key="lesson_shard_chart",
        theme=None,
    )
    figure.caption(lesson_view.shard_caption(idea, lang))
    figure.caption(lesson_view.source_caption([bar.result for bar in idea.bars], lang))

elif part == "qlora":  # simulated (QLoRA runs on a GPU), kept for the process: 4 bits shrink the weights alone
    qlora = simulated_qlora(lang)
    if qlora is None:  # being simulated (the progress is shown) or failed: the part's words meanwhile
        st.markdown(t("lesson.qlora.body", lang))
        st.stop()
    figure = figure_column()
    spec = qlora.bars[0].spec
    subtitle = t(
        "lesson.qlora.subtitle", lang, model=spec.model, seq=number(spec.seq_len, ",", lang), rank=spec.lora_rank
    )
    figure.plotly_chart(
        sharding_figure([(label, b.parts) for label, b in zip(lesson_view.qlora_labels(qlora, lang), qlora.bars)],
                        subtitle, lang=lang),
        key="lesson_qlora_chart",
        theme=None,
    )  # fmt: skip
    figure.caption(lesson_view.qlora_caption(qlora, lang))
    figure.caption(lesson_view.source_caption([bar.result for bar in qlora.bars], lang))

elif part == "allocator":  # simulated, then the caching allocator replayed twice: why nvidia-smi shows more
    allocator = simulated_allocator(lang)
    if allocator is None:  # being simulated (the progress is shown) or failed: the part's words meanwhile
        st.markdown(t("lesson.allocator.body", lang))
        st.stop()
    figure = figure_column()
    spec = allocator.result.spec
    subtitle = t("lesson.allocator.subtitle", lang, model=spec.model, seq=number(spec.seq_len, ",", lang))
    figure.plotly_chart(
        segments_figure(allocator.default, allocator.expandable, subtitle, lang=lang),
        key="lesson_allocator_chart",
        theme=None,
    )
    figure.caption(lesson_view.allocator_caption(allocator, lang))

elif part == "rerun":  # simulated steps of two sizes at two lengths, their time predicted by the roofline
    rerun = simulated_rerun(lang)
    if rerun is None:  # being simulated (the progress is shown) or failed: the part's words meanwhile
        st.markdown(t("lesson.rerun.body", lang))
        st.stop()
    figure = figure_column()
    figure.plotly_chart(
        rerun_figure(
            list(zip(lesson_view.rerun_labels(rerun, lang), (case.anatomy for case in rerun.cases))),
            t("lesson.rerun.subtitle", lang, gpu=rerun.gpu),
            lang=lang,
        ),
        key="lesson_rerun_chart",
        theme=None,
    )
    figure.caption(lesson_view.rerun_caption(rerun, lang))

else:  # the step-through
    draw_step_through(lambda n: need(part)[STEP_SETTINGS.index(n)], lang)
