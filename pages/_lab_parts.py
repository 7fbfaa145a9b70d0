"""The Lab page's parts: its widgets from a link, Run (the device queue, a status box, Cancel), the gradient
check, the code. Not a page.

The words and numbers come from :mod:`ckptlab.lab.labpage`; here they are drawn. The outcome is
kept in the session (``lab_last``, ``lab_error``, ``lab_grads``) for the page to draw on each rerun
(``pages/_lab_result.py``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st

import ckptlab
from ckptlab.lab import labpage
from ckptlab.lab import run as labrun
from ckptlab.lab.query import spec_from_query
from ckptlab.lab.run import Loader, check_gradients_queued
from ckptlab.lab.server import ServerPolicy
from ckptlab.model import snippets
from ckptlab.show.i18n import say, t
from ckptlab.show.wording import app_message
from ckptlab.spec import RunSpec
from pages._common import estimate_text, preset_infos
from pages._server import job_workers, offered_folder, server_policy, session_owner, sharing_workers

STOP_CHECK_S = 0.3  # how often a run in flight looks for a Cancel (each look is one Streamlit message)


def load_widgets(devices: tuple[str, ...], policy: ServerPolicy, lang: str) -> None:
    """Fill the widgets from the link, or from this session's last settings; warnings go to ``lab_query_warnings``.

    A link to a folder this server does not offer opens the default preset, and says why.
    """
    state = st.session_state
    if st.query_params:
        spec, ignored = spec_from_query(st.query_params.to_dict(), devices=devices)
        state.lab_query_warnings = [say(fact, lang) for fact in ignored]
    else:
        spec, state.lab_query_warnings = state.get("lab_saved", RunSpec()), []
    folder = ""
    if spec.model not in preset_infos():
        folder, why_not = offered_folder(policy, spec.model, lang)
        if why_not:
            state.lab_query_warnings = [*state.get("lab_query_warnings", []), why_not]
        if not folder:  # a link to a folder this server does not offer: the default preset
            spec = replace(spec, model=RunSpec().model)
    state.update(labpage.widget_values(spec, folder))


def run_and_keep(spec: RunSpec, load: Loader, policy: ServerPolicy, lang: str) -> None:
    """Run through the device queue with progress; keep the outcome in the session."""
    state = st.session_state
    state.lab_query_warnings = []
    state.lab_error = None
    # A click reruns the page, and Streamlit interrupts this run at its next message: the stop
    # check below sends one every STOP_CHECK_S, from inside the step (ckptlab.step.stopping).
    # Outside the status box, which folds its contents away as it updates.
    cancel = st.empty()  # emptied once the run ends: a Cancel after the end would cancel nothing
    cancel.button(t("lab.cancel", lang), key="lab_cancel", help=t("lab.cancel_help", lang))
    with st.status(t("lab.status_waiting", lang), expanded=True) as status:
        bar = st.progress(0.0, text=t("lab.queued", lang))
        looked = [time.monotonic()]

        def should_stop() -> bool:
            if time.monotonic() - looked[0] >= STOP_CHECK_S:
                looked[0] = time.monotonic()
                status.update()  # a message to the browser: where a pending Cancel interrupts the run
            return False

        try:
            total_s, measured_pace = labrun.PACE.estimate(spec)  # the run and its reference, as the formula sees them
        except ckptlab.CkptlabError:  # a model that cannot be described: run_queued's own check says why
            total_s, measured_pace = None, False
        basis = "measured" if measured_pace else "predicted"

        def progress(message: str, fraction: float) -> None:
            fraction, message = min(max(fraction, 0.0), 1.0), say(message, lang)
            status.update(label=t("lab.status_running", lang, pct=f"{fraction:.0%}", message=message))
            left = "" if total_s is None else " · " + estimate_text(total_s * (1 - fraction), basis, lang)
            bar.progress(fraction, text=message + left)

        def on_wait(ahead: int) -> None:
            status.update(
                label=t(
                    "lab.status_ahead",
                    lang,
                    ahead=ahead,
                    runs=t("lab.runs_one" if ahead == 1 else "lab.runs_many", lang),
                )
            )

        try:
            lab = labrun.run_queued(  # looked up on each Run: tests replace it
                spec,
                load=load,
                progress=progress,
                on_wait=on_wait,
                should_stop=should_stop,
                owner=session_owner(),
                limit_s=policy.run_limit_s,
                workers=job_workers(policy, "device"),
                sharing=sharing_workers(),
                memory_cap_bytes=policy.memory_cap_bytes,
            )
            cancel.empty()
        except ckptlab.CkptlabError as error:
            cancel.empty()
            status.update(label=t("lab.could_not_run", lang), state="error", expanded=False)
            state.lab_error = (spec, app_message(error, lang), None)
            return
        except Exception as error:  # a bug, not bad input: say so briefly, keep the page alive
            cancel.empty()
            status.update(label=t("lab.run_failed", lang), state="error", expanded=False)
            state.lab_error = (spec, t("lab.run_failed_long", lang), f"{type(error).__name__}: {error}")
            return
        status.update(label=labpage.status_label(lab, lang), state="complete", expanded=False)
        state.lab_last = lab
    if state.get("lab_check_grads") and spec.checkpointing and lab.result.status == "ok":
        _check_gradients(spec, lang)


def _check_gradients(spec: RunSpec, lang: str) -> None:
    """Two more steps, checkpointing off and on (dropout on): are the gradients the same bits?"""
    state = st.session_state
    with st.spinner(t("lab.grads_checking", lang)):
        try:
            policy = server_policy()[0]
            checked = check_gradients_queued(spec, workers=job_workers(policy, "device"), limit_s=policy.run_limit_s)
            state.lab_grads = (spec, checked, "")
        except Exception as error:  # the run itself succeeded: say the check failed, keep its result
            state.lab_grads = (spec, None, f"{type(error).__name__}: {error}")


def draw_code(spec: RunSpec, lang: str) -> None:
    """The transformers lines for the current settings (not the last run's)."""
    st.subheader(t("lab.code_title", lang), anchor=False)
    st.caption(t("lab.on_a_model", lang))
    code = snippets.model_snippet(spec.every_n_layers, spec.offload)
    if spec.every_n_layers is not None and spec.selective != "none":  # torch's policy through transformers' call
        code = snippets.selective_snippet(spec.every_n_layers, spec.offload, spec.selective)
    st.code(code, language="python")
    st.caption(t("lab.with_trainer", lang))
    context_fn = spec.every_n_layers is not None and spec.selective != "none"
    trainer = snippets.trainer_snippet(spec.every_n_layers, spec.offload, spec.trainer_fields(), context_fn=context_fn)
    st.code(trainer, language="python")
