"""Where a decode step's time goes (attention, indexer, experts, communication, host) and what fills a GPU's memory."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from ui import app_cache, service

CONTEXTS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
GIB = 2**30  # memory in GiB, as the hardware catalog, `twinfer cost` and the memory-fit caption below the chart show it


def figures(bd: dict) -> tuple[go.Figure, go.Figure]:
    """A step-time bar and a memory bar from ``service.step_breakdown`` (pure, for tests)."""
    t = go.Figure()
    for name, s in bd["breakdown_s"].items():
        t.add_trace(go.Bar(y=["step"], x=[s * 1e3], name=name, orientation="h",
                           hovertemplate=f"{name}: %{{x:.2f}} ms<extra></extra>"))
    t.update_layout(barmode="stack", height=230, xaxis_title="ms per decode step", margin={"t": 40, "b": 10},
                    title=f"{bd['step_s'] * 1e3:.1f} ms per step at batch {bd['batch']}, context {bd['context']:,}"
                          + (f", MTP {bd['draft_len']}" if bd["draft_len"] else ""))
    m = go.Figure()
    for name, b in bd["memory_bytes"].items():
        m.add_trace(go.Bar(y=["per GPU"], x=[b / GIB], name=name, orientation="h",
                           hovertemplate=f"{name}: %{{x:.1f}} GiB<extra></extra>"))
    m.update_layout(barmode="stack", height=230, xaxis_title="GiB per GPU", margin={"t": 40, "b": 10},
                    title=f"HBM {bd['hbm_bytes'] / GIB:.0f} GiB per GPU")
    return t, m


def render(plan: service.PlanView) -> None:
    """Pool and batch-shape controls, then the two bars and the cost model's notes."""
    from ui.app_whatif import plan_key

    k = plan_key(plan)  # per-plan widget keys: a new plan starts from its own batch range
    pools = {f"{p.role}: {p.instances} x {p.layout_label}": p for p in plan.pools}
    pool = pools[st.radio("pool", list(pools), horizontal=True, key=f"bd_pool_{k}")] if len(pools) > 1 else next(iter(pools.values()))
    seats = int(pool.scheduler.get("max_num_seqs", 64))
    a, b = st.columns(2)
    batch = a.slider("decode batch (requests in the instance)", 1, max(seats, 2), min(seats, 64), key=f"bd_batch_{k}")
    context = b.select_slider("context length (tokens)", CONTEXTS, value=4096, key=f"bd_context_{k}")
    bd = app_cache.step_breakdown(plan.model, plan.hardware, pool.layout, pool.scheduler, int(batch), int(context),
                                  plan.plan.get("effects"))
    t, m = figures(bd)
    st.plotly_chart(t, key="bd_time")
    st.plotly_chart(m, key="bd_mem")
    st.caption(bd["fit"])
    with st.expander("weights per GPU by kind, and the cost model's assumptions"):
        st.dataframe([{"kind": k, "GiB": round(v / GIB, 2)} for k, v in bd["weights_by_kind"].items()], hide_index=True)
        for n in bd["notes"]:
            st.markdown(f"- {n}")
