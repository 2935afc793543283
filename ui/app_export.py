"""Export: the inspected plan as YAML (what `twinfer simulate` and later `serve --plan` take) and every candidate as CSV."""

from __future__ import annotations

import streamlit as st

from twinfer.errors import TwinferError
from ui import service


def render(result: service.SearchResult, selected: int) -> None:
    """Two download buttons and the YAML itself."""
    c = result.candidates[selected]
    try:
        text = service.plan_yaml(result, selected)
    except TwinferError as e:
        st.error(str(e))
        return
    slug = "".join(ch if ch.isalnum() else "-" for ch in c.label).strip("-").lower()
    a, b = st.columns(2)
    a.download_button("⬇ plan YAML", text, file_name=f"plan-{slug}.yaml", mime="application/x-yaml", key="dl_plan")
    b.download_button("⬇ results CSV", service.results_csv(result), file_name="twinfer-candidates.csv", mime="text/csv", key="dl_csv")
    st.caption(f"plan of **{c.label}**" + (" (recommended)" if selected == result.recommended else ""))
    st.code(text, language="yaml")
