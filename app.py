"""ckptlab in the browser: ``streamlit run app.py``.

The entry point only sets up navigation and the language; each page is a flat script in
``pages/``. The language selector is kept in the URL (``?lang=ja``), so a shared link
opens in the same language, and every page reads it from ``st.session_state.app_lang``.
"""

# Imported here, by the first page a session opens, not lazily by the first figure or table each page draws:
# with jobs in worker processes nothing in the server imported pandas before, and eight sessions drawing at
# once imported it together ("partially initialized module 'pandas'", benchmarks/workshop_load.py's mixed round).
import pandas  # noqa: F401
import plotly.io  # noqa: F401
import streamlit as st

from ckptlab.lab.learnruns import warm
from ckptlab.show import i18n
from pages._learn_runs import learn_how
from pages._server import job_workers, server_policy

# The tab title is set before the selector exists, so it reads the URL's language directly.
st.set_page_config(
    page_title=i18n.t("app.page_title", i18n.normalize(st.query_params.get("lang"))), page_icon="🧪", layout="wide"
)

state = st.session_state
if "app_lang" not in state:  # a new session: the link decides
    state.app_lang = i18n.normalize(st.query_params.get("lang"))


def _pick_language() -> None:
    state.app_lang = state.app_lang_select


# The choice lives in app_lang, a plain session key: widget keys are dropped when the page changes.
# (Not bind="query-params" either: that writes the option's label, "日本語", into the URL, not its code.)
state.app_lang_select = state.app_lang
st.sidebar.selectbox(
    "Language · Idioma · 言語",
    list(i18n.LANGUAGES),
    key="app_lang_select",
    format_func=i18n.LANGUAGES.get,
    on_change=_pick_language,
)
lang = state.app_lang
# Keep ?lang= in the URL (pages may rewrite their own parameters); English, the default, leaves it out.
if lang == i18n.DEFAULT:
    if "lang" in st.query_params:
        del st.query_params["lang"]
elif st.query_params.get("lang") != lang:
    st.query_params["lang"] = lang

if server_policy()[0].warm_learn:  # CKPTLAB_WARM_LEARN=1: queued by the first page opened, a no-op after
    warm(learn_how(), simulation=job_workers(server_policy()[0], "simulation"))

navigation = st.navigation(
    {
        i18n.t("nav.lab", lang): [
            st.Page("pages/lab.py", title=i18n.t("nav.lab_page", lang), icon=":material/science:", default=True)
        ],
        i18n.t("nav.explore", lang): [
            st.Page("pages/tradeoffs.py", title=i18n.t("nav.tradeoffs_page", lang), icon=":material/query_stats:"),
            st.Page("pages/at_scale.py", title=i18n.t("nav.at_scale_page", lang), icon=":material/memory:"),
        ],
        i18n.t("nav.learn", lang): [
            st.Page("pages/lesson.py", title=i18n.t("nav.lesson_page", lang), icon=":material/school:"),
            st.Page("pages/timeline.py", title=i18n.t("nav.timeline_page", lang), icon=":material/timeline:"),
            st.Page("pages/exercises.py", title=i18n.t("nav.exercises_page", lang), icon=":material/quiz:"),
            st.Page("pages/instructor.py", title=i18n.t("classroom.nav_page", lang), icon=":material/co_present:"),
        ],
    }
)
navigation.run()
