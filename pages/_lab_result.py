"""The Lab page's last run drawn: diagram, breakdown, metrics, comparison, notes and downloads. Not a page.

The words and numbers come from :mod:`ckptlab.lab.labpage`; here they are drawn. The run to draw
is the session's ``lab_last``; the gradient check's outcome is ``lab_grads`` (``pages/_lab_parts.py``).
"""

from __future__ import annotations

import streamlit as st

from ckptlab.lab import labpage
from ckptlab.lab.run import LabRun
from ckptlab.results import MIN_SAMPLES_TO_JUDGE
from ckptlab.show import i18n
from ckptlab.show.export import layer_rows, result_csv
from ckptlab.show.figures.breakdown import breakdown_figure
from ckptlab.show.figures.diagram import diagram_figure
from ckptlab.show.figures.run import comparison_figure
from ckptlab.show.labels import method_label, provenance_label, setting_label
from ckptlab.show.noise import timing_busy_message
from ckptlab.show.peak_words import logits_sentence
from ckptlab.show.wording import run_message
from ckptlab.spec import RunSpec
from pages._common import download_buttons


def draw_result(lab: LabRun, spec: RunSpec, lang: str) -> None:
    """The last run: diagram, measurements against checkpointing off, notes, downloads."""
    result = lab.result
    if not draw_measurements(lab, spec, lang):
        return

    said = labpage.offload_box(spec, result, lang)
    if said is not None:
        getattr(st, said[0])(said[1])
    if not result.plan_matches:  # decided on the layers' fields; the diagram shows where, the notes the details
        st.error(i18n.t("lab.plan_mismatch", lang))
    for note in labpage.notes_to_show(result):  # what the box above says is left out, in the page's words
        st.caption(i18n.say(note, lang))

    with st.expander(i18n.t("lab.per_layer", lang)):
        st.dataframe(layer_rows(result), hide_index=True)
        st.caption(
            i18n.t(
                "lab.methods",
                lang,
                memory=method_label(result.memory.method, lang),
                time=method_label(result.timing.method, lang),
            )
        )

    download_buttons(
        labpage.file_stem(result),
        [
            (i18n.t("lab.download_json", lang), result.to_json(), "json", "lab_download_json"),
            (i18n.t("lab.download_csv", lang), result_csv(result), "csv", "lab_download_csv"),
        ],
    )


def draw_gradients(spec: RunSpec, lang: str) -> None:
    """One line when the check agrees; loud when it does not (checkpointing changed what is learned)."""
    found = st.session_state.get("lab_grads")
    if not found or found[0] != spec:
        return
    _, outcome, problem = found
    kind, text = labpage.gradients_message(outcome, problem, lang)
    getattr(st, kind)(text)


def draw_metrics(lab: LabRun, lang: str) -> None:
    """st.metric figures with deltas against checkpointing off, and what they mean."""
    result, comparison = lab.result, lab.comparison
    base = labpage.reference_run(lab)
    columns = st.columns(2)
    for index, metric in enumerate(labpage.metrics(lab, lang)):  # left, right, left, ...
        columns[index % 2].metric(metric.label, metric.value, **metric.delta, help=metric.help)
    st.markdown(labpage.peak_line(result.memory, lang))
    if logits_sentence(result.memory, lang):
        st.caption(logits_sentence(result.memory, lang))
    if comparison is not None and base is not None:
        st.markdown(labpage.time_sentence(comparison, MIN_SAMPLES_TO_JUDGE, lang))
        freed = labpage.freed_sentence(result.memory, base.memory, comparison, lang)
        if freed:
            st.markdown(freed)
    if lab.reference is not None and lab.reference.result.status != "ok":
        st.warning(i18n.t("lab.baseline_no_fit", lang, message=run_message(lab.reference.result, lang)))
    st.caption(labpage.medians_caption(result, lang))


def draw_measurements(lab: LabRun, spec: RunSpec, lang: str) -> bool:
    """The last run's diagram, breakdown, metrics and comparison; False when it did not run (its error shown)."""
    result = lab.result
    base = lab.reference.result if lab.reference else None
    if result.spec != spec:
        st.info(labpage.settings_changed(result, lang))
    when = i18n.t("lab.reused_at" if lab.run.reused else "lab.measured_at", lang, clock=labpage.clock(lab.run))
    st.caption(f"{provenance_label(result.provenance, lang)} · {when}")
    busy = timing_busy_message(result.timing, lang) or (base is not None and timing_busy_message(base.timing, lang))
    if busy:
        st.warning(busy)
    if result.status != "ok":
        st.error(run_message(result, lang))
        st.plotly_chart(diagram_figure(result, lang=lang), key="lab_diagram", theme=None)
        return False
    diagram, where = st.columns([3, 2])
    diagram.plotly_chart(diagram_figure(result, lang=lang), key="lab_diagram", theme=None)
    label = setting_label(result.spec.every_n_layers, result.spec.offload, lang)
    bars = [(label, result)]
    if lab.plain is not None and lab.plain.result.status == "ok":  # a selective policy beside plain checkpointing
        policy = labpage.policy_label(str(result.spec.selective), lang)
        bars = [
            (i18n.t("selective.bar_full", lang), lab.plain.result),
            (i18n.t("selective.bar_policy", lang, policy=policy), result),
        ]
    if base is not None and base is not result and base.status == "ok":
        bars.insert(0, (i18n.t("setting.off", lang), base))
    where.plotly_chart(breakdown_figure(bars, lang=lang, height=380), key="lab_breakdown", theme=None)
    where.caption(i18n.t("lab.breakdown_caption", lang))
    draw_gradients(result.spec, lang)
    draw_selective(lab, lang)

    numbers, chart = st.columns([2, 3])
    with numbers:
        draw_metrics(lab, lang)
    with chart:
        st.plotly_chart(comparison_figure(result, base, lang=lang), key="lab_comparison", theme=None)
        st.caption(i18n.t("lab.comparison_caption", lang, provenance=provenance_label(result.provenance, lang)))
    return True


def draw_selective(lab: LabRun, lang: str) -> None:
    """With a selective policy: what it kept (observed), and the run beside plain checkpointing and off."""
    line = labpage.kept_line(lab.result, lang)
    if not line:
        return
    st.subheader(i18n.t("selective.title", lang), anchor=False)
    st.markdown(line)
    rows = labpage.selective_rows(lab, lang)
    if rows:
        st.dataframe(rows, hide_index=True, key="lab_selective_table")
        st.caption(i18n.t("selective.table_caption", lang, provenance=provenance_label(lab.result.provenance, lang)))
