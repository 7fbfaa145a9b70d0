"""ckptlab in the browser: ``streamlit run app.py``.

The entry point only sets up navigation; each page is a flat script in ``pages/``.
Sections leave room for the pages later issues add (explore: the trade-off explorer and
simulation; learn: the timeline and the lesson).
"""

import streamlit as st

st.set_page_config(page_title="ckptlab: activation checkpointing, measured", page_icon="🧪", layout="wide")

navigation = st.navigation(
    {
        "Lab": [st.Page("pages/lab.py", title="Measure a step", icon=":material/science:", default=True)],
        "Explore": [
            st.Page("pages/tradeoffs.py", title="Trade-off explorer", icon=":material/query_stats:"),
            st.Page("pages/at_scale.py", title="At scale, simulated", icon=":material/memory:"),
        ],
    }
)
navigation.run()
