"""Plans side by side: this search's recommendation, plans pinned from earlier searches (the same
traffic on H200 and on B200, or at two budgets), and any charted deployment of this search."""

from __future__ import annotations

import streamlit as st

from planner.slo import SLOSpec
from ui import service
from ui.app_recommend import pd_split, policies_text, tokens


def _short(path_or_name: str) -> str:
    """Uploads are stored as .../<name>/config.json or .../<name>.yaml: show the name, not the temp path."""
    if "/" not in path_or_name:
        return path_or_name
    parts = path_or_name.rstrip("/").split("/")
    return parts[-2] if parts[-1] == "config.json" else parts[-1].rsplit(".", 1)[0]


def plan_column(p: service.PlanView) -> dict:
    """One plan as a column of the comparison table (all strings: one dtype per column)."""
    pr, c = p.predicted, p.costs
    return {
        "model": _short(p.model), "hardware": _short(p.hardware), "GPUs": str(p.gpus),
        "layout": " + ".join(f"{x.instances} x {x.layout_label} ({x.role})" for x in p.pools), "PD split": pd_split(p),
        "policies": policies_text(p),
        "output tok/s per GPU": f"{pr.get('output_tokens_per_s_per_gpu', 0):,.0f}",
        "tok/s per user": f"{pr.get('tokens_per_s_per_user', 0):,.1f}",
        # at the plan's own SLO percentile (pinned plans may differ), as the CLI's "TTFT p90 s"
        "TTFT (s)": f"{pr.get('ttft_s', 0):.2f} (p{p.plan.get('slo_percentile', 90)})",
        "TPOT (ms)": f"{pr.get('tpot_s', 0) * 1e3:.1f} (p{p.plan.get('slo_percentile', 90)})",
        "requests/s": f"{pr.get('request_rate', 0):,.2f}", "$ per hour": f"{c.usd_per_hour:,.2f}",
        "$ per M output tokens": "–" if c.usd_per_m_output_tokens is None else f"{c.usd_per_m_output_tokens:,.3f}",
        "tokens per day": tokens(c.tokens_per_day), "meets SLO": plan_meets(p), "figures from": pr.get("source", "?"),
    }


def plan_meets(p: service.PlanView) -> str:
    """Whether a plan's predicted latencies meet the SLO it was planned for (pinned plans may carry different SLOs)."""
    slo = p.plan.get("slo") or {}
    if "ttft_s" not in slo or "tpot_s" not in slo:
        return "–"
    spec = SLOSpec(ttft_s=slo["ttft_s"], tpot_s=slo["tpot_s"], percentile=int(p.plan.get("slo_percentile", 90)))
    ok = spec.meets(p.predicted.get("ttft_s"), p.predicted.get("tpot_s"))
    return f"{'yes' if ok else 'no'} ({spec.text()})"


def point_column(p: service.Point, request: dict) -> dict:
    """A charted deployment (figures only, no pools) as a comparison column."""
    c = p.costs
    return {
        "model": _short(request["model"]), "hardware": _short(request["hardware"]), "GPUs": str(p.gpus),
        "layout": p.label, "PD split": p.mode, "policies": "(in the label)",
        "output tok/s per GPU": f"{p.output_tps_per_gpu:,.0f}", "tok/s per user": f"{p.tps_per_user:,.1f}",
        "TTFT (s)": f"{p.ttft_s:.2f} (p{request.get('slo_percentile', 90)})",
        "TPOT (ms)": f"{p.tpot_s * 1e3:.1f} (p{request.get('slo_percentile', 90)})", "requests/s": f"{p.request_rate:,.2f}",
        "$ per hour": "–" if c is None else f"{c.usd_per_hour:,.2f}",
        "$ per M output tokens": "–" if c is None or c.usd_per_m_output_tokens is None else f"{c.usd_per_m_output_tokens:,.3f}",
        "tokens per day": "–" if c is None else tokens(c.tokens_per_day),
        "meets SLO": f"{'yes' if p.meets_slo else 'no'} (p{request.get('slo_percentile', 90)})", "figures from": p.source,
    }


def pin(plan: service.PlanView) -> None:
    """Keep ``plan`` in this session under a name that says what and where."""
    pinned: list[dict] = st.session_state.setdefault("pinned", [])
    name = f"#{len(pinned) + 1} {plan.gpus} x {_short(plan.hardware)}: {' + '.join(x.layout_label for x in plan.pools)}"
    pinned.append({"name": name, "plan": plan.model_dump()})


def pinned_plans() -> dict[str, service.PlanView]:
    """Pinned plans by name."""
    return {p["name"]: service.PlanView.model_validate(p["plan"]) for p in st.session_state.get("pinned", [])}


def render(result: service.SearchResult) -> None:
    """Pin buttons, a picker for charted deployments, and the table with one column per plan."""
    a, b = st.columns(2)
    if a.button("Pin this search's plan", key="pin", disabled=result.plan is None):
        pin(result.plan)
    if b.button("Clear pinned plans", key="unpin", disabled=not st.session_state.get("pinned")):
        st.session_state["pinned"] = []
    labels = [p.label for p in result.points if not p.recommended]
    chosen = st.multiselect("also compare deployments from this search's chart", labels, key="cmp_pick")
    cols = {f"{name} (pinned)": plan_column(p) for name, p in pinned_plans().items()}
    if result.plan is not None:
        cols["this search (recommended)"] = plan_column(result.plan)
    for lab in chosen:
        cols[lab] = point_column(next(p for p in result.points if p.label == lab), result.request)
    if len(cols) < 2:
        st.info("Pin this plan, change the inputs (another GPU, another budget), and the plans line up here; "
                "or pick deployments from the chart.")
    if cols:
        rows = list(next(iter(cols.values())))
        # tall enough for every row: a comparison is read across, not scrolled
        st.dataframe([{"": r, **{k: v[r] for k, v in cols.items()}} for r in rows], hide_index=True, height=36 * (len(rows) + 1) + 3)
