"""Plans side by side: candidates of this search, and plans pinned from earlier searches
(e.g. the same traffic on H200 and on B200), kept in the session."""

from __future__ import annotations

import streamlit as st

from ui import service
from ui.app_recommend import tokens


def column(c: service.Candidate, request: dict) -> dict:
    """One plan as a column of the comparison table."""
    name = lambda p: p.rsplit("/", 2)[-2] if "/" in p else p  # noqa: E731 - uploads: show the folder, not the temp path
    return {
        "model": name(request["model"]), "hardware": name(request["hardware"]), "GPUs": str(c.gpus),
        "layout": f"{c.instances} x {c.layout_label}", "PD split": f"{c.pd['prefill']}:{c.pd['decode']}" if c.pd else "aggregated",
        "policies": ", ".join(f"{k}={v}" for k, v in c.policies.items()),
        "output tok/s per GPU": f"{c.output_tps_per_gpu:,.0f}", "tok/s per user": "–" if c.tps_per_user is None else f"{c.tps_per_user:,.1f}",
        "TTFT p90 (s)": "–" if c.ttft_p90_s is None else f"{c.ttft_p90_s:.2f}",
        "TPOT p50 (ms)": "–" if c.tpot_p50_s is None else f"{c.tpot_p50_s * 1e3:.0f}",
        "$ per hour": f"{c.costs.usd_per_hour:,.2f}",
        "$ per M output tokens": "–" if c.costs.usd_per_m_output_tokens is None else f"{c.costs.usd_per_m_output_tokens:,.3f}",
        "tokens per day": tokens(c.costs.tokens_per_day), "meets SLO": "yes" if c.meets_slo else "no",
        "simulated": "yes" if c.simulated else "screen only",
    }


def render(result: service.SearchResult, selected: int) -> None:
    """Pin buttons, a candidate picker, and the table with one column per plan."""
    pinned: list[dict] = st.session_state.setdefault("pinned", [])
    a, b = st.columns(2)
    if a.button("📌 Pin the inspected plan", key="pin"):
        c = result.candidates[selected]
        tag = f"#{len(pinned) + 1} {c.label} · {column(c, result.request)['hardware']}"
        pinned.append({"name": tag, "candidate": c.model_dump(), "request": result.request})
    if b.button("Clear pinned plans", key="unpin", disabled=not pinned):
        pinned.clear()
    labels = [c.label for c in result.candidates]
    default = [labels[i] for i in dict.fromkeys([result.recommended, selected]) if i is not None][:2]
    chosen = st.multiselect("candidates of this search", labels, default=default, key="cmp_pick")
    cols = {f"{p['name']} (pinned)": column(service.Candidate.model_validate(p["candidate"]), p["request"]) for p in pinned}
    for lab in chosen:
        cols[lab] = column(result.candidates[labels.index(lab)], result.request)
    if len(cols) < 2:
        st.info("Pick two or more candidates, or pin plans from different searches (change the hardware, search, pin again).")
    if cols:
        rows = list(next(iter(cols.values())))
        st.dataframe([{"": r, **{k: v[r] for k, v in cols.items()}} for r in rows], hide_index=True)
