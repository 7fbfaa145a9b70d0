"""The At-scale page's parts: widgets from a link, the buttons and the job, its progress. Not a page.

Words, rows and verdicts come from :mod:`ckptlab.lab.scalepage`; here they are drawn, and the
answers in ``pages/_scale_answers.py``. The page
keeps its job and what it produced in the session (``at_scale_job``, ``at_scale_table``,
``at_scale_found``, ``at_scale_error``).
"""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

import ckptlab
from ckptlab.explore.gpu_search import GPU_COUNTS
from ckptlab.explore.scale import ScaleRequest
from ckptlab.lab import scalepage
from ckptlab.lab.query import gpus_from_query, spec_from_query
from ckptlab.lab.scalejob import ScaleJob, SearchJob, remember
from ckptlab.lab.scalepage import DEFAULT, SEQ_LIMIT
from ckptlab.lab.server import ServerPolicy
from ckptlab.model.catalog import ModelInfo
from ckptlab.results import RunResult
from ckptlab.show import i18n
from ckptlab.show.wording import app_message
from ckptlab.spec import RunSpec
from pages._common import estimate_text, preset_infos
from pages._server import job_workers, offered_folder, session_alive

# The shape's keys in a link (gpu= aside), Trainer's step among them.
LINK_KEYS = ("model", "seq", "batch", "dtype", "opt", "lora", "targets", "accum", "mp", "clip")
POLL_S = 0.5  # how often the progress bar looks at a running job


def load_widgets(policy: ServerPolicy, lang: str) -> list[str]:
    """Fill the widgets from the link, or from this session's last settings; returns warnings."""
    state = st.session_state
    saved = state.get("at_scale_saved")
    if saved and not st.query_params:
        state.update(saved)
        return []
    params = st.query_params.to_dict()
    spec, ignored = spec_from_query({k: v for k, v in params.items() if k in LINK_KEYS}, default=DEFAULT)
    state.at_scale_gpus, ignored_gpus = gpus_from_query(params.get("gpus", "1"), GPU_COUNTS)
    warnings = [i18n.say(fact, lang) for fact in ignored + ignored_gpus]
    if spec.seq_len > SEQ_LIMIT:
        warnings.append(i18n.t("at_scale.seq_clamped", lang, seq=spec.seq_len, limit=SEQ_LIMIT))
        spec = replace(spec, seq_len=SEQ_LIMIT)
    infos = preset_infos()
    folder, why_not = ("", "") if spec.model in infos else offered_folder(policy, spec.model, lang)
    if why_not:  # a link to a folder this server does not offer: the default preset
        warnings.append(why_not)
        spec = replace(spec, model=DEFAULT.model)
    state.update(scalepage.widget_values(spec, folder, not folder and infos[spec.model].cpu_ok))
    state.at_scale_selective, unknown = scalepage.policies_from_link(params.get("selective", ""))
    if unknown:
        warnings.append(i18n.t("at_scale.selective_unknown", lang, names=", ".join(unknown)))
    gpu = params.get("gpu", "").strip()
    if gpu:
        chosen = scalepage.gpu_from_link(gpu)
        if chosen is None:
            warnings.append(i18n.t("at_scale.gpu_unknown", lang, gpu=gpu, default=scalepage.DEFAULT_GPU))
        else:
            state.at_scale_gpu, state.at_scale_budget_gib = chosen
    return warnings


def poll(running: bool, lang: str) -> None:
    """While the job runs: a bar that moves with each simulation; when it ends, one full rerun to draw."""

    @st.fragment(run_every=POLL_S if running else None)
    def progress() -> None:
        state = st.session_state
        job = state.get("at_scale_job")
        if job is None:
            return
        snapshot = job.state()
        if snapshot.running:
            total = None if isinstance(job, SearchJob) else len(job.request.settings)
            done = len(snapshot.results)
            text = scalepage.progress_words(done, total, snapshot.message, snapshot.stop_requested, lang)
            left = job.left_s()
            if left is not None and not snapshot.stop_requested:
                text += " · " + estimate_text(left, "so_far", lang)
            st.progress(min(max(snapshot.fraction, 0.0), 1.0), text=text)
            return
        if state.get("at_scale_shown") is not job:
            state.at_scale_shown = job
            if snapshot.table is not None:
                state.at_scale_table = snapshot.table
            if snapshot.search is not None:
                state.at_scale_found = snapshot.search
            if snapshot.error:  # the lab's own error in the page's language; a bug's words as they are
                state.at_scale_error = app_message(snapshot.failure, lang) if snapshot.failure else snapshot.error
            st.rerun()

    progress()


@st.cache_resource(show_spinner=False)
def simulation_cache() -> dict[RunSpec, RunResult]:
    """Simulations by spec, shared by every session: a workshop that asks for the same 8B shape simulates it once."""
    return {}


def draw_buttons(
    request: ScaleRequest,
    budget: int,
    info: ModelInfo,
    problem: bool,
    policy: ServerPolicy,
    lang: str,
) -> bool:
    """Simulate, Search GPUs and Stop, and the last start's error; returns whether a job is running.

    ``policy``: the server's; a job past its seconds per run is ended (in a worker process, at once; in
    this process, between two simulations), and so is a job whose session is gone.
    """
    state = st.session_state

    def start(search: bool = False) -> None:
        """Simulate every setting (``search``: look for the fewest GPUs that fit) on a thread; :func:`poll` polls."""
        cache = simulation_cache()
        limit_s, workers = policy.run_limit_s, job_workers(policy, "simulation")
        ending = {"workers": workers, "alive": session_alive(), "memory_cap_bytes": policy.memory_cap_bytes}
        try:
            if search:
                job = SearchJob(
                    replace(request, world_size=1),
                    budget,
                    known=cache,
                    on_result=lambda r: remember(cache, r),
                    info=info,
                    limit_s=limit_s,
                    **ending,
                )
            else:
                job = ScaleJob(
                    request, known=cache, on_result=lambda r: remember(cache, r), info=info, limit_s=limit_s, **ending
                )
        except ckptlab.CkptlabError as error:
            state.at_scale_error = app_message(error, lang)
            return
        state.at_scale_error = ""
        state.at_scale_job = job.start()

    def stop() -> None:
        job = state.get("at_scale_job")
        if job is not None:
            job.stop()

    job: ScaleJob | None = state.get("at_scale_job")
    running = job is not None and job.state().running
    start_column, search_column, stop_column, _ = st.columns([1, 1, 1, 3])
    start_column.button(
        i18n.t("at_scale.simulate", lang),
        type="primary",
        key="at_scale_run",
        on_click=start,
        disabled=running or problem,
        width="stretch",
    )
    search_column.button(
        i18n.t("at_scale.search", lang),
        key="at_scale_search",
        on_click=start,
        args=(True,),
        disabled=running or problem,
        help=i18n.t("at_scale.search_help", lang),
        width="stretch",
    )
    stop_column.button(
        i18n.t("at_scale.stop", lang), key="at_scale_stop", on_click=stop, disabled=not running, width="stretch"
    )
    if state.get("at_scale_error"):
        st.error(i18n.t("at_scale.failed", lang, error=state.at_scale_error))
    return running
