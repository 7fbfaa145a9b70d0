"""Memory timeline: memory through one real training step, two settings overlaid, the layer at work highlighted.

A flat page: read the widgets, measure the setting and checkpointing off through the
device queue (``ckptlab.lab.learn``), draw the core's figures. Every word comes from the
locale files in the language the app's selector put in the URL.
"""

from __future__ import annotations

import streamlit as st

from ckptlab.lab import learn as learnrun
from ckptlab.lab import lesson_view
from ckptlab.lab.run import reference_spec
from ckptlab.show.figures.diagram import focus_of
from ckptlab.show.figures.timeline import peak_cause, timeline_figure
from ckptlab.show.i18n import number, t
from ckptlab.show.labels import event_label, method_label, run_label
from ckptlab.show.wording import run_message
from ckptlab.spec import RunSpec
from ckptlab.step import timeline as tl
from ckptlab.units import MIB
from pages._common import language, preset_infos, run_through_app
from pages._learn_runs import measured

run_through_app()

state = st.session_state
lang = language()
st.title(t("timeline.page_title", lang), anchor=False)
st.markdown(t("timeline.intro", lang))

counts = {name: preset_infos()[name].num_layers for name in learnrun.cpu_presets()}  # the CPU-sized presets
# Defaults through the session, not value=: the page also moves these keys (range clamps), and both would warn.
state.setdefault("timeline_seq", 512)  # long enough for activations to lead: memory rises, then falls
state.setdefault("timeline_n", 2)
state.setdefault("timeline_overlay", True)
state.setdefault("timeline_event", 0)
with st.sidebar:
    st.header(t("common.settings", lang), anchor=False)
    model = st.selectbox(t("common.model", lang), list(counts), key="timeline_model")
    seq_len = st.select_slider(t("common.seq_len", lang), options=learnrun.LEARN_SEQ_LENS, key="timeline_seq")
    state.timeline_n = min(state.timeline_n, counts[model])  # a model with fewer layers: keep the slider in range
    every_n = st.slider(
        "every_n_layers", 1, max(counts[model], 2), key="timeline_n", help=t("common.every_n_help", lang)
    )
    overlay = st.toggle(t("timeline.overlay_off", lang), key="timeline_overlay")

# Forward and backward alone: the timeline teaches what activations do during a step.
spec = RunSpec(model=model, seq_len=int(seq_len), every_n_layers=int(every_n), repeats=1, warmup=0, optimizer="none")
results = measured([spec], lang)
if results is None:
    st.stop()
run, off = results[spec], results.get(reference_spec(spec))
if run.status != "ok":
    st.error(run_message(run, lang))
    st.stop()

points = run.memory.timeline
state.timeline_event = min(state.timeline_event, len(points) - 1)  # a shorter timeline than the last setting's
index = st.select_slider(
    t("timeline.slider", lang),
    options=list(range(len(points))),
    key="timeline_event",
    format_func=lambda i: lesson_view.event_option(points, i, lang),
)
point = points[index]
others = [off] if overlay and off is not None and off.status == "ok" else []
st.plotly_chart(timeline_figure(run, others, lang=lang, cursor=index), key="timeline_chart", theme=None)

now, high = lesson_view.above_baseline(run, point)
st.markdown(
    t(
        "timeline.at_event",
        lang,
        event=event_label(point, lang),
        now=number(now / MIB, ",.1f", lang),
        high=number(high / MIB, ",.1f", lang),
    )
)
st.plotly_chart(lesson_view.run_diagram(run, lang, focus=focus_of(point)), key="timeline_diagram", theme=None)
st.caption(t("timeline.diagram_caption", lang))

st.subheader(t("timeline.read_title", lang), anchor=False)
st.markdown(t("timeline.peak_line", lang, setting=run_label(run, lang), cause=peak_cause(run, lang)))
if others:
    st.markdown(t("timeline.peak_line", lang, setting=run_label(off, lang), cause=peak_cause(off, lang)))
bumps = lesson_view.bump_line(points, lang)
if bumps:
    st.markdown(bumps)
problems = tl.check_order(points, [layer.enabled for layer in run.layers])
if problems:
    st.error(t("timeline.order_problem", lang, problems="; ".join(problems)))
st.caption(t("timeline.how_measured", lang, method=method_label(run.memory.method, lang)))
