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

st.set_page_config(page_title="twinfer capacity planner", layout="wide")
st.title("twinfer capacity planner")
st.caption("How many GPUs of which kind, in which layout, for this traffic and this SLO, at what cost: "
           "deployments searched in the twinfer simulator (cost model of the hardware, the serving scheduler).")


THIS_SEARCH = "this search's recommendation"


def _inspected(result: service.SearchResult) -> service.PlanView | None:
    """The plan the breakdown, what-if and export tabs show: this search's, or a pinned one."""
    pinned = app_compare.pinned_plans()
    options = ([THIS_SEARCH] if result.plan is not None else []) + list(pinned)
    if not options:
        return None
    if len(options) == 1:
        return result.plan if options[0] == THIS_SEARCH else pinned[options[0]]
    if st.session_state.get("inspect") not in options:
        st.session_state["inspect"] = options[0]
    name = st.selectbox("inspect plan", options, key="inspect", help="this search's plan, or one pinned in the Compare tab")
    return result.plan if name == THIS_SEARCH else pinned[name]


def main() -> None:
    """Build the page for one rerun."""
    request = app_sidebar.render()
    if request is None:
        st.info("Fix the inputs in the sidebar to search deployments.")
        return
    try:
        result = app_cache.search(request)
    except TwinferError as e:
        st.error(str(e))
        return
    band = service.error_band(request["hardware"])
    app_recommend.render(result, band)
    picker = st.container()  # the plan picker sits above the tabs but is filled after Compare (which may pin)
    tabs = st.tabs(["Pareto", "Where the time goes", "What-if", "Compare", "Export"])
    with tabs[0]:
        app_pareto.render(result, band)
    with tabs[3]:  # before the others: pinning here changes what they can inspect on the next rerun
        app_compare.render(result)
    with picker:
        plan = _inspected(result)
    for tab, draw in ((tabs[1], lambda: app_breakdown.render(plan)),
                      (tabs[2], lambda: app_whatif.render(plan, app_cache.model_info(plan.model), request["sim_requests"],
                                                          app_recommend.band_text(band)))):
        with tab:
            if plan is None:
                st.info("No plan to inspect: nothing meets the SLO (see above).")
            else:
                draw()
    with tabs[4]:
        app_export.render(result, plan)
    with st.expander("assumptions and notes"):
        for n in result.notes:
            st.markdown(f"- {n}")
        t = result.timings
        if t:
            st.caption(f"search: {t.get('total_s', 0):.1f} s ({t.get('runner', '')}); screen {t.get('screen_s', 0):.1f} s, "
                       f"simulation {t.get('simulate_s', 0):.1f} s")


main()
