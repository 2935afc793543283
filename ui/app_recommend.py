"""The recommended deployment: GPUs, layout, PD split, policies, costs, and why it won."""

from __future__ import annotations

import streamlit as st

from ui import service


def band_text(band: float | None) -> str:
    """How far a simulated figure may be off: the validation band, or an honest '±?'."""
    return f"±{100 * band:.0f}% (validated)" if band is not None else "no calibration: ±?"


def _fmt(x: float | None, spec: str, scale: float = 1.0, unit: str = "") -> str:
    return "–" if x is None else f"{x * scale:{spec}}{unit}"


def tokens(x: float) -> str:
    """A token count as people say it: 920 M, 1.4 B."""
    for div, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k")):
        if x >= div:
            return f"{x / div:,.3g}{suffix}"
    return f"{x:,.0f}"


def render(result: service.SearchResult, band: float | None) -> None:
    """Headline metrics of the recommended candidate (or the closest ones when none meets the SLO)."""
    if result.recommended is None:
        st.warning(result.reason)
        return
    c = result.candidates[result.recommended]
    # one stable line the browser test (and a reader) can find: what is recommended, on how many GPUs
    st.subheader(f"Recommended: {c.gpus} GPUs as {c.label}")
    st.caption(result.reason)
    cols = st.columns(4)
    cols[0].metric("GPUs", f"{c.gpus}", help=f"{c.instances} instance(s) of {c.gpus_per_instance} GPUs")
    cols[1].metric("layout", c.layout_label, help="tensor / data / expert parallel of one instance")
    cols[2].metric("output tok/s per GPU", _fmt(c.output_tps_per_gpu, ",.0f"), help=band_text(band))
    cols[3].metric("tok/s per user", _fmt(c.tps_per_user, ",.1f"), help=band_text(band))
    cols = st.columns(4)
    cols[0].metric("$ per GPU-hour", f"${c.costs.usd_per_gpu_hour:,.2f}", help=f"cluster ${c.costs.usd_per_hour:,.2f}/hour")
    cols[1].metric("$ per M output tokens", _fmt(c.costs.usd_per_m_output_tokens, ",.3f", unit=""), help=band_text(band))
    cols[2].metric("tokens per day", tokens(c.costs.tokens_per_day), help="output tokens, whole cluster")
    cols[3].metric("TTFT p90 / TPOT p50", f"{_fmt(c.ttft_p90_s, '.2f', unit=' s')} / {_fmt(c.tpot_p50_s, '.0f', 1e3, ' ms')}")
    if c.costs.revenue_per_gpu_hour is not None:
        st.caption(f"revenue ${c.costs.revenue_per_gpu_hour:,.2f} per GPU-hour at the given token prices "
                   f"(margin ${c.costs.revenue_per_gpu_hour - c.costs.usd_per_gpu_hour:,.2f})")
    pd = f"prefill {c.pd['prefill']} : decode {c.pd['decode']}" if c.pd else "aggregated (prefill and decode share instances)"
    pol = ", ".join(f"{k}={v}" for k, v in c.policies.items())
    st.markdown(f"**PD split:** {pd}  \n**policies:** {pol}  \n**simulated figures:** {band_text(band)}")
