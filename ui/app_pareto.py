"""The headline chart: output throughput per GPU against tokens/s per user (InferenceMAX-style),
with the SLO region shaded, the frontier drawn, the pick starred; clicking a point selects it."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from ui import service


def figure(result: service.SearchResult, band: float | None, selected: int | None = None) -> go.Figure:
    """The Pareto figure of a search result (pure: tests build it without a browser)."""
    req = result.request
    fig = go.Figure()
    xs = [c.tps_per_user or 0.0 for c in result.candidates]
    x_max = max(xs + [1.0 / req["tpot_s"]]) * 1.15
    # SLO region: a user needs at least 1 / TPOT tokens per second
    fig.add_vrect(x0=1.0 / req["tpot_s"], x1=x_max, fillcolor="green", opacity=0.08, line_width=0,
                  annotation_text=f"meets TPOT ≤ {req['tpot_s'] * 1e3:g} ms", annotation_position="top left")
    groups: dict[tuple[str, bool], list[int]] = {}
    for i, c in enumerate(result.candidates):
        groups.setdefault((c.layout_label, c.simulated), []).append(i)
    for (label, simulated), idx in sorted(groups.items()):
        cs = [result.candidates[i] for i in idx]
        err = None
        if band is not None and simulated:  # an error band only where a calibration measured one
            err = {"type": "data", "array": [band * c.output_tps_per_gpu for c in cs], "visible": True}
        fig.add_trace(go.Scatter(
            x=[c.tps_per_user or 0.0 for c in cs], y=[c.output_tps_per_gpu for c in cs], mode="markers",
            name=f"{label} ({'simulated' if simulated else 'screened'})", customdata=idx, error_y=err,
            marker={"size": 12 if simulated else 8, "symbol": "circle" if simulated else "circle-open",
                    "line": {"width": [3 if i == selected else 0 for i in idx]}},
            text=[c.label + ("" if c.meets_slo else " (misses SLO)") for c in cs],
            hovertemplate="%{text}<br>%{x:.1f} tok/s per user<br>%{y:,.0f} tok/s per GPU<extra></extra>",
        ))
    front = sorted((c for c in result.candidates if c.on_frontier), key=lambda c: c.tps_per_user or 0.0)
    if front:
        fig.add_trace(go.Scatter(x=[c.tps_per_user or 0.0 for c in front], y=[c.output_tps_per_gpu for c in front],
                                 mode="lines", name="Pareto frontier", line={"dash": "dot", "color": "gray"}, hoverinfo="skip"))
    if result.recommended is not None:
        c = result.candidates[result.recommended]
        fig.add_trace(go.Scatter(x=[c.tps_per_user or 0.0], y=[c.output_tps_per_gpu], mode="markers", name="recommended",
                                 marker={"symbol": "star", "size": 20, "color": "gold", "line": {"width": 1, "color": "black"}},
                                 hovertemplate=c.label + "<extra>recommended</extra>"))
    fig.update_layout(
        xaxis_title="tokens/s per user (interactivity)", yaxis_title="output tokens/s per GPU",
        height=480, margin={"l": 10, "r": 10, "t": 30, "b": 10}, legend={"orientation": "h", "y": -0.2},
        title=f"{len(result.candidates)} candidates · simulated figures {'±%.0f%%' % (100 * band) if band is not None else 'no calibration: ±?'}",
    )
    fig.update_xaxes(range=[0, x_max])
    return fig


def render(result: service.SearchResult, band: float | None, selected: int) -> None:
    """Draw the chart (clicks select a candidate: ui.app reads the event) and the candidate table."""
    st.plotly_chart(figure(result, band, selected), key="pareto", on_select="rerun", selection_mode="points")
    st.caption("Click a point to inspect it in the other tabs. Open circles: analytic screen only; "
               "filled: simulated. Shaded: the TPOT SLO region.")
    rows = [{"": "★" if i == result.recommended else "", "candidate": c.label, "GPUs": c.gpus,
             "tok/s per GPU": round(c.output_tps_per_gpu, 1), "tok/s per user": None if c.tps_per_user is None else round(c.tps_per_user, 1),
             "TTFT p90 (s)": c.ttft_p90_s, "TPOT p50 (ms)": None if c.tpot_p50_s is None else c.tpot_p50_s * 1e3,
             "$/M out": c.costs.usd_per_m_output_tokens, "meets SLO": c.meets_slo, "simulated": c.simulated,
             "frontier": c.on_frontier} for i, c in enumerate(result.candidates)]
    st.dataframe(rows, hide_index=True)
