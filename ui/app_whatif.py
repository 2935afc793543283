"""What-if: change a plan's policies (EP width, PD ratio, async overlap, replay window, MTP length,
prefix hit rate), simulate the plan and the changed plan the same way, and show them side by side."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from twinfer.errors import TwinferError
from ui import app_cache, service

# figures where a rise is good (the rest, latencies, are better when they fall)
_HIGHER_IS_BETTER = {"output tok/s per GPU", "tok/s per user", "goodput (% of requests)", "prefix hit rate (%)", "finished"}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_key(plan: service.PlanView) -> str:
    """A short id of a plan: widget keys carry it, so a new plan starts from its own values
    instead of inheriting the last plan's (an EP width the new layout may not even allow)."""
    import hashlib

    return hashlib.sha256(plan.yaml.encode()).hexdigest()[:10]


def controls(plan: service.PlanView, model: dict) -> dict:
    """The what-if form; returns only the changes that differ from the plan (as last submitted)."""
    k = plan_key(plan)
    main = next(p for p in plan.pools if p.role in ("mixed", "decode"))
    lay, sch = main.layout, main.scheduler
    width = lay["tp"] * lay["dp"]
    disagg = plan.mode == "disaggregated"
    # the PD split as prefill instances beside the decode pool's: exact (a ratio typed to 2 decimals is not: 2 of 3 is
    # 0.67, which reads as a change), and any split the planner makes (41 prefill per decode instance, 1 per 12) fits
    pre0 = next(p for p in plan.pools if p.role == "prefill").instances if disagg else 1
    most_pre = max(pre0, int(service.PD_RATIO_MAX * main.instances))
    trace = plan.plan["workload"].get("kind") == "trace"
    with st.form(f"whatif_{k}"):
        a, b, d = st.columns(3)
        ep = a.selectbox("EP width", _divisors(width), index=_divisors(width).index(lay["ep"]), key=f"wi_ep_{k}",
                         disabled=not model["experts"], help=f"expert-parallel width of the {main.role} pool; divides TP x DP = {width}")
        n_pre = b.number_input(f"prefill instances (PD ratio, per {main.instances:,} decode)", 1, most_pre, pre0, 1,
                               key=f"wi_pd_{k}", disabled=not disagg,
                               help=f"the PD ratio as prefill instances beside the {main.instances:,} decode instances "
                               f"(now {pre0:,}: {pre0 / main.instances:.3g} per decode instance)" if disagg
                               else "this plan is aggregated: no prefill/decode pools to balance")
        overlap = d.toggle("async CPU/GPU overlap", value=bool(sch.get("async_overlap", True)), key=f"wi_async_{k}")
        a, b, d = st.columns(3)
        w0 = service.replay_window(plan.plan)
        replay = a.slider("replay window (tokens)", 0, max(model["sliding_window"], 128), w0 or 0, key=f"wi_replay_{k}",
                          disabled=not model["sliding_window"],
                          help="bounded replay W on every sliding-window layer: a resumed sequence (prefix hit, next prompt "
                          "chunk) recomputes its last W tokens instead of keeping their window KV; 0 keeps it"
                          + ("" if w0 is not None else " (the plan's layers differ: a value other than 0 sets all of them)")
                          if model["sliding_window"] else "this model has no sliding-window layers")
        mtp = b.slider("MTP draft length", 0, max(4, int(sch.get("draft_len", 0))), int(sch.get("draft_len", 0)), key=f"wi_mtp_{k}", disabled=not model["mtp_layers"],
                       help="needs a multi-token-prediction head" if not model["mtp_layers"] else "draft tokens verified per decode step")
        hit = d.slider("prefix hit rate", 0.0, 0.9, 0.0, 0.05, key=f"wi_hit_{k}", disabled=trace,
                       help="share of each prompt that is one shared system prompt (generated workloads)")
        st.form_submit_button("Run what-if")
    changes: dict = {}
    if ep != lay["ep"]:
        changes["ep"] = int(ep)
    if disagg and int(n_pre) != pre0:
        changes["pd_ratio"] = int(n_pre) / main.instances  # service.apply_what_if: round(ratio x decode) = n_pre
    if overlap != bool(sch.get("async_overlap", True)):
        changes["async_overlap"] = bool(overlap)
    if mtp != int(sch.get("draft_len", 0)):
        changes["draft_len"] = int(mtp)
    if hit > 0:
        changes["prefix_hit_rate"] = float(hit)
    if model["sliding_window"] and replay != (w0 or 0):
        changes["replay_window"] = int(replay)
    return changes


def describe_changes(plan: service.PlanView, changes: dict) -> str:
    """The changes as one line: 'async_overlap = False, pd_ratio = 0.667 (2 prefill : 3 decode instances)'."""
    main = next(p for p in plan.pools if p.role in ("mixed", "decode"))
    out = []
    for key, v in changes.items():
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        if key == "pd_ratio":
            text += f" ({max(1, round(v * main.instances)):,} prefill : {main.instances:,} decode instances)"
        out.append(f"{key} = {text}")
    return ", ".join(out)


def cell(v) -> str:
    """A figure as the recommendation shows it (1,116 tok/s, 1.73 s, 42.4 ms): text, so a column that also
    holds the window's name is one type, and the baseline reads as the plan's figure, not 1115.8662702710265."""
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def figure(rows: dict) -> go.Figure:
    """What-if over baseline, per figure, in percent (green: better)."""
    base, new = rows["baseline"], rows["what-if"]
    names = [k for k in base if isinstance(base[k], (int, float)) and base[k] and new.get(k) is not None and k != "GPUs"]
    fig = go.Figure(go.Bar(x=names, y=[100 * (new[k] / base[k] - 1) for k in names],
                           marker_color=["seagreen" if (new[k] >= base[k]) == (k in _HIGHER_IS_BETTER) else "indianred" for k in names]))
    fig.update_layout(yaxis_title="change vs baseline (%)", height=320, margin={"t": 20, "b": 10})
    return fig


def render(plan: service.PlanView, model: dict, num_requests: int, band_label: str) -> None:
    """Form, then baseline and what-if side by side."""
    n = service.what_if_requests(plan.plan, num_requests)
    part = service.plan_run_part(plan.plan)
    scale = "at full scale" if part is None else f"on {part.split(' at ')[0]}"
    whole = "" if part is None else f" · GPUs and tokens/s per GPU: the whole plan's ({plan.gpus:,} GPUs), as the plan counts them"
    st.caption(f"baseline: **{plan.label}** · both simulated {scale} on {n:,} requests (the plan's own run: "
               f"`twinfer simulate --plan`) · figures of the steady window{whole} · {band_label}")
    changes = controls(plan, model)
    if not changes:
        st.info("Change a control and press **Run what-if** to simulate it beside the baseline.")
        return
    try:
        out = app_cache.what_if(plan.plan, changes, num_requests)
    except TwinferError as e:
        st.error(str(e))
        return
    rows = out["rows"]

    def change(k):
        b, n = rows["baseline"][k], rows["what-if"][k]
        return f"{100 * (n / b - 1):+.1f}%" if isinstance(b, (int, float)) and b and n is not None else ""

    st.markdown("**changes:** " + describe_changes(plan, changes))
    st.dataframe([{"figure": k, "baseline": cell(rows["baseline"][k]), "what-if": cell(rows["what-if"][k]), "change": change(k)}
                  for k in rows["baseline"]], hide_index=True)
    st.plotly_chart(figure(rows), key="wi_chart")
