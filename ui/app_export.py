"""Export: the inspected plan as YAML (planner.plan.Plan, as `twinfer plan --out` writes it) and every charted deployment as CSV."""

from __future__ import annotations

import streamlit as st

from ui import service


def render(result: service.SearchResult, plan: service.PlanView | None) -> None:
    """Two download buttons and the YAML itself."""
    a, b = st.columns(2)
    b.download_button("results CSV", service.results_csv(result), file_name="twinfer-candidates.csv", mime="text/csv",
                      key="dl_csv", disabled=not result.points)
    if plan is None:
        a.download_button("plan YAML", "", disabled=True, key="dl_plan", help="no plan: nothing meets the SLO")
        return
    slug = "".join(ch if ch.isalnum() else "-" for ch in plan.label).strip("-").lower()[:60]
    a.download_button("plan YAML", plan.yaml, file_name=f"plan-{slug}.yaml", mime="application/x-yaml", key="dl_plan")
    st.caption(f"plan of **{plan.label}** · the same format as `twinfer plan --out plan.yaml` (planner/plan.py)")
    st.code(plan.yaml, language="yaml")
