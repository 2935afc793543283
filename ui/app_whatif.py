"""What-if: change one candidate's policies (EP width, PD ratio, async overlap, replay window, MTP
length, prefix hit rate), simulate it, and show the result beside the unchanged baseline."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from twinfer.errors import TwinferError
from ui import app_cache, service

# figures where a rise is good (the rest, latencies, are better when they fall)
_HIGHER_IS_BETTER = {"output tok/s per GPU", "tok/s per user", "goodput (% of requests)", "prefix hit rate (%)", "finished"}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def controls(c: service.Candidate, model: dict, trace: bool) -> dict:
    """The what-if form; returns only the changes that differ from the baseline."""
    lay, pol = c.layout, c.policies
    width = lay["tp"] * lay["dp"]
    with st.form("whatif"):
        a, b, d = st.columns(3)
        ep = a.selectbox("EP width", _divisors(width), index=_divisors(width).index(lay["ep"]), key="wi_ep",
                         disabled=not model["experts"], help="expert-parallel width; must divide TP x DP of the instance")
        b.slider("PD ratio (prefill : decode)", 0.25, 4.0, 1.0, 0.25, key="wi_pd", disabled=True,
                 help=service.UNSUPPORTED_WHATIF["pd_ratio"])
        overlap = d.toggle("async CPU/GPU overlap", value=bool(pol.get("async_overlap", True)), key="wi_async")
        a, b, d = st.columns(3)
        a.slider("replay window (tokens)", 0, max(model["sliding_window"], 128), 0, key="wi_replay", disabled=True,
                 help=service.UNSUPPORTED_WHATIF["replay_window"])
        mtp = b.slider("MTP draft length", 0, 4, int(pol.get("draft_len", 0)), key="wi_mtp", disabled=not model["mtp_layers"],
                       help="needs a multi-token-prediction head" if not model["mtp_layers"] else "draft tokens verified per decode step")
        hit = d.slider("prefix hit rate", 0.0, 0.9, 0.0, 0.05, key="wi_hit", disabled=trace,
                       help="share of each prompt that is a shared system prompt (generated workloads only)")
        st.form_submit_button("Run what-if")
    changes: dict = {}
    if ep != lay["ep"]:
        changes["ep"] = int(ep)
    if overlap != bool(pol.get("async_overlap", True)):
        changes["async_overlap"] = bool(overlap)
    if mtp != int(pol.get("draft_len", 0)):
        changes["draft_len"] = int(mtp)
    if hit > 0:
        changes["prefix_hit_rate"] = float(hit)
    return changes


def figure(rows: dict) -> go.Figure:
    """What-if over baseline, per figure, in percent."""
    base, new = rows["baseline"], rows["what-if"]
    names = [k for k in base if isinstance(base[k], (int, float)) and base[k] and new.get(k) is not None and k != "GPUs"]
    fig = go.Figure(go.Bar(x=names, y=[100 * (new[k] / base[k] - 1) for k in names],
                           marker_color=["seagreen" if (new[k] >= base[k]) == (k in _HIGHER_IS_BETTER) else "indianred" for k in names]))
    fig.update_layout(yaxis_title="change vs baseline (%)", height=320, margin={"t": 20, "b": 10})
    return fig


def render(result: service.SearchResult, index: int, model: dict, band_label: str) -> None:
    """Form, then baseline and what-if side by side."""
    c = result.candidates[index]
    st.caption(f"baseline: **{c.label}** · simulated figures {band_label}")
    changes = controls(c, model, c.scenario["workload"].get("kind") == "trace")
    if not changes:
        st.info("Change a control and press **Run what-if** to simulate it beside the baseline.")
        return
    try:
        out = app_cache.what_if(c.scenario, changes)
    except TwinferError as e:
        st.error(str(e))
        return
    rows = out["rows"]
    table = [{"figure": k, "baseline": rows["baseline"][k], "what-if": rows["what-if"][k],
              "change": (f"{100 * (rows['what-if'][k] / rows['baseline'][k] - 1):+.1f}%"
                         if isinstance(rows["baseline"][k], (int, float)) and rows["baseline"][k] and rows["what-if"][k] is not None else "")}
             for k in rows["baseline"]]
    st.markdown("**changes:** " + ", ".join(f"{k} = {v}" for k, v in changes.items()))
    st.dataframe(table, hide_index=True)
    st.plotly_chart(figure(rows), key="wi_chart")
