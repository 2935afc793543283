"""twinfer capacity planner (Streamlit): `twinfer ui`, or `streamlit run ui/app.py`.

The page: the sidebar asks the question (ui.app_sidebar), a cached search answers it
(ui.app_cache -> ui.service -> planner/sim/costmodels), the recommendation heads the page and
tabs show the Pareto chart, where a step's time and memory go, what-if runs, plans side by
side, and the exports. Every user error (TwinferError) is shown with st.error, never a traceback.
"""

from __future__ import annotations

import streamlit as st

from twinfer.errors import TwinferError
from ui import app_breakdown, app_cache, app_compare, app_export, app_pareto, app_recommend, app_sidebar, app_whatif, service

st.set_page_config(page_title="twinfer capacity planner", page_icon="🧮", layout="wide")
st.title("twinfer capacity planner")
st.caption("How many GPUs of which kind, in which layout, for this traffic and this SLO, at what cost: "
           "deployments searched in the twinfer simulator (cost model of the hardware, the serving scheduler).")


def _inspected(result: service.SearchResult) -> int:
    """The candidate the tabs show: the last point clicked on the chart, else the picker, else the pick."""
    labels = [c.label for c in result.candidates]
    default = result.recommended if result.recommended is not None else 0
    clicked = ((st.session_state.get("pareto") or {}).get("selection") or {}).get("points") or []
    token = repr(clicked)
    if clicked and token != st.session_state.get("_last_click"):  # a new click, not the same selection replayed
        st.session_state["_last_click"] = token
        cd = clicked[-1].get("customdata")
        cd = cd[0] if isinstance(cd, list) and cd else cd
        if isinstance(cd, (int, float)) and 0 <= int(cd) < len(labels):
            st.session_state["inspect"] = labels[int(cd)]
    if st.session_state.get("inspect") not in labels:  # a new search: start from its recommendation
        st.session_state["inspect"] = labels[default]
    return labels.index(st.selectbox("inspect candidate", labels, key="inspect",
                                     help="the recommended one, or click a point on the Pareto chart"))


def main() -> None:
    """Build the page for one rerun."""
    request = app_sidebar.render()
    if request is None:
        st.info("Fix the inputs in the sidebar to search deployments.")
        return
    try:
        result = app_cache.search(request)
        model = app_cache.model_info(request["model"])
    except TwinferError as e:
        st.error(str(e))
        return
    band = service.error_band(request["hardware"])
    app_recommend.render(result, band)
    if not result.candidates:
        return
    selected = _inspected(result)
    tabs = st.tabs(["Pareto", "Where the time goes", "What-if", "Compare", "Export"])
    with tabs[0]:
        app_pareto.render(result, band, selected)
    with tabs[1]:
        app_breakdown.render(result, selected)
    with tabs[2]:
        app_whatif.render(result, selected, model, app_recommend.band_text(band))
    with tabs[3]:
        app_compare.render(result, selected)
    with tabs[4]:
        app_export.render(result, selected)
    with st.expander("assumptions and notes"):
        for n in result.notes:
            st.markdown(f"- {n}")
        st.markdown(f"- search backend: `{result.backend}`")


main()
