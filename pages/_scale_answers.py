"""The At-scale page's answers drawn: the GPU search's, and the table of simulations with its figures. Not a page.

Words, rows and verdicts come from :mod:`ckptlab.lab.scalepage`; here they are drawn. The setting whose
diagram is drawn is the session's ``at_scale_show``: the verdict's, until the person picks another.
"""

from __future__ import annotations

import streamlit as st

from ckptlab.explore.gpu_search import GpuSearch
from ckptlab.explore.scale import ScaleRequest, ScaleTable, Setting
from ckptlab.lab import scalepage
from ckptlab.show.figures.diagram import diagram_figure
from ckptlab.show.figures.scale import resident_figure, scale_peak_figure
from ckptlab.show.i18n import t
from ckptlab.show.labels import training_label
from ckptlab.show.peak_words import logits_sentence


def draw_search(found: GpuSearch, request: ScaleRequest, budget: int, budget_label: str, lang: str) -> None:
    """The GPU search's answer, and the launch and model code for it when something fits."""
    st.subheader(t("at_scale.search_header", lang), anchor=False)
    if not scalepage.search_is_for(found, request, budget):
        st.info(t("at_scale.search_changed", lang))
    answer = scalepage.search_verdict(found, budget_label, lang)
    getattr(st, answer.kind)(answer.text)
    code = found.code()
    if code is not None:
        launch, setup = st.columns(2)
        launch.caption(t("at_scale.code_launch", lang))
        launch.code(scalepage.launch_code(code, lang), language="bash", wrap_lines=True)
        launch.caption(t("at_scale.code_trainer", lang))
        launch.code(code.trainer_code, language="python", wrap_lines=True)
        setup.caption(t("at_scale.code_model", lang) if found.gpus == 1 else t("at_scale.code_fsdp", lang))
        setup.code(code.model_code, language="python", wrap_lines=True)


def draw_table(
    table: ScaleTable,
    budget: int,
    budget_label: str,
    lang: str,
) -> None:
    """The verdict, the peak and resident figures, one setting's diagram and the table; raises if drawing fails."""
    state = st.session_state
    verdict = scalepage.verdict(table, budget, budget_label, lang)
    getattr(st, verdict.kind)(verdict.text)
    pick = verdict.result
    st.caption(t("at_scale.optimizer", lang, training=training_label(table.results[0].spec, lang)))
    # The drawn setting follows the verdict whenever the table or the budget changes; the person may pick another.
    keys = [setting.key for setting in table.settings]
    if state.get("at_scale_show_for") != (id(table), budget) or state.get("at_scale_show") not in keys:
        state.at_scale_show_for = (id(table), budget)
        state.at_scale_show = Setting.of(pick.spec).key
    selected = next(setting for setting in table.settings if setting.key == state.at_scale_show)

    st.subheader(scalepage.peak_header(table.request.world_size, lang), anchor=False)
    st.plotly_chart(
        scale_peak_figure(table, budget, budget_label, selected=selected, lang=lang), key="at_scale_peak", theme=None
    )
    shown = table.result_for(selected)
    logits = logits_sentence(shown.memory if shown is not None else None, lang)
    if logits:
        st.caption(logits)
    st.subheader(t("at_scale.resident_header", lang), anchor=False)
    st.plotly_chart(resident_figure(table, selected=selected, lang=lang), key="at_scale_resident", theme=None)
    st.caption(t("at_scale.resident_caption", lang))

    st.subheader(t("at_scale.diagram_header", lang), anchor=False)
    st.selectbox(t("at_scale.show", lang), keys, key="at_scale_show")
    st.plotly_chart(diagram_figure(table.result_for(selected), lang=lang), key="at_scale_diagram", theme=None)

    st.subheader(t("at_scale.table_header", lang), anchor=False)
    rows = scalepage.rows(table, budget, budget_label, lang)
    st.dataframe(rows, hide_index=True, key="at_scale_table_view", height=scalepage.table_height(len(rows)))
