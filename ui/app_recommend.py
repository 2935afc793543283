"""The recommended deployment: GPUs, layout, PD split, policies, costs, and why it won
(or, when nothing works, the planner's explanation and the closest options)."""

from __future__ import annotations

import streamlit as st

from ui import service


def band_text(band: float | None) -> str:
    """How far a simulated figure may be off: the validation band, or an honest '±?'."""
    return f"±{100 * band:.0f}% (validated)" if band is not None else "no calibration: ±?"


def tokens(x: float) -> str:
    """A token count as people say it: 920 M, 1.4 B."""
    for div, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if x >= div:
            return f"{x / div:,.3g}{suffix}"
    return f"{x:,.0f}"


def pd_split(plan: service.PlanView) -> str:
    """'prefill 2 x DEP8 : decode 3 x DEP16' or 'aggregated'."""
    if plan.mode != "disaggregated":
        return "aggregated (prefill and decode share instances)"
    pre = next(p for p in plan.pools if p.role == "prefill")
    dec = next(p for p in plan.pools if p.role == "decode")
    return f"prefill {pre.instances} x {pre.layout_label} : decode {dec.instances} x {dec.layout_label}"


def policies_text(plan: service.PlanView) -> str:
    """'max batch 512, ..., async overlap on, EPLB on': switches as on/off, as the CLI says them."""
    return ", ".join(f"{k} {({True: 'on', False: 'off'}[v] if isinstance(v, bool) else v)}" for k, v in plan.policies.items())


def render(result: service.SearchResult, band: float | None) -> None:
    """Headline metrics of the recommended plan, or why there is none."""
    plan = result.plan
    if plan is None:
        st.warning(f"**No deployment recommended** ({result.status.replace('_', ' ')}): {result.message}")
        if result.closest:
            st.markdown("**Closest options:**\n" + "\n".join(f"- {c}" for c in result.closest))
        return
    pred = plan.predicted
    # one stable line the browser test (and a reader) can find: what is recommended, on how many GPUs
    st.subheader(f"Recommended: {plan.gpus} GPUs as {plan.label}")
    st.caption(result.reason)
    pct = result.request["slo_percentile"]
    cols = st.columns(4)
    cols[0].metric("GPUs", f"{plan.gpus}", help=f"of a budget of {plan.gpus_budget}")
    # short enough for a metric tile: "2P + 3D" (prefill + decode instances) or "1 x 8 GPUs"
    shape = " + ".join(f"{p.instances}{p.role[0].upper()}" if plan.mode == "disaggregated" else f"{p.instances} x {p.gpus // p.instances} GPUs"
                       for p in plan.pools)
    cols[1].metric("instances", shape, help=" + ".join(f"{p.instances} x {p.layout_label} ({p.role})" for p in plan.pools))
    cols[2].metric("output tok/s per GPU", f"{pred.get('output_tokens_per_s_per_gpu', 0):,.0f}", help=band_text(band))
    cols[3].metric("tok/s per user", f"{pred.get('tokens_per_s_per_user', 0):,.1f}", help=band_text(band))
    c = plan.costs
    cols = st.columns(4)
    cols[0].metric("$ per GPU-hour", f"${c.usd_per_gpu_hour:,.2f}", help=f"cluster ${c.usd_per_hour:,.2f}/hour; {c.price_source}")
    cols[1].metric("$ per M output tokens", "–" if c.usd_per_m_output_tokens is None else f"${c.usd_per_m_output_tokens:,.3f}",
                   help=band_text(band))
    cols[2].metric("tokens per day", tokens(c.tokens_per_day), help="output tokens, whole cluster, at the planned rate")
    cols[3].metric(f"TTFT / TPOT p{pct}", f"{pred.get('ttft_s', 0):.2f} s / {pred.get('tpot_s', 0) * 1e3:.1f} ms",
                   help=f"{pred.get('source', '?')} figures; planned for {pred.get('request_rate', 0):,.2f} requests/s")
    if c.revenue_per_gpu_hour is not None:
        st.caption(f"revenue ${c.revenue_per_gpu_hour:,.2f} per GPU-hour at the token prices, margin ${c.margin_per_gpu_hour:,.2f}")
    pol = policies_text(plan)
    st.markdown(f"**layout:** {' + '.join(f'{p.instances} x {p.layout_label} ({p.role})' for p in plan.pools)}  \n"
                f"**PD split:** {pd_split(plan)}  \n**policies:** {pol}  \n"
                f"**figures from:** {pred.get('source', '?')}, {band_text(band)}")
    with st.expander("why it won"):
        for w in plan.why:
            st.markdown(f"- {w}")
