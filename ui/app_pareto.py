"""The headline chart: output throughput per GPU against tokens/s per user (InferenceMAX-style),
with the SLO region shaded, the frontier drawn, the pick starred; clicking a point shows it."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from ui import service


_COLORS = {"aggregated": "#1f77b4", "disaggregated": "#ff7f0e"}


def _miss(p: service.Point) -> str:
    """What a point's label adds when it misses the SLO (at full scale: its slice met it, the plan's run did not)."""
    if p.meets_slo:
        return ""
    return " — misses the SLO at full scale" if p.full_scale is False else " — misses the SLO"


def figure(result: service.SearchResult, band: float | None) -> go.Figure:
    """The Pareto figure of a search result (pure: tests build it without a browser)."""
    req = result.request
    pts = result.points
    fig = go.Figure()
    slo_x = 1.0 / req["tpot_s"]
    x_max = max([p.tps_per_user for p in pts] + [slo_x]) * 1.15
    # 1 / TPOT target: x is the mean tokens/s per user while the SLO bounds a TPOT percentile, so the
    # shading is a guide; whether a point meets the SLO is its colour (computed at the percentile)
    pct = req.get("slo_percentile", 90)
    fig.add_vrect(x0=slo_x, x1=x_max, fillcolor="green", opacity=0.08, line_width=0,
                  annotation_text=f"1 / TPOT target ({req['tpot_s'] * 1e3:g} ms at p{pct}; colour says who meets it)",
                  annotation_position="top left")
    groups: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(pts):
        groups.setdefault((p.mode, p.source), []).append(i)
    for (mode, source), idx in sorted(groups.items()):
        ps = [pts[i] for i in idx]
        sim = source == "simulation"
        err = None
        if band is not None and sim:  # an error band only where a validation measured one
            err = {"type": "data", "array": [band * p.output_tps_per_gpu for p in ps], "visible": True}
        fig.add_trace(go.Scatter(
            x=[p.tps_per_user for p in ps], y=[p.output_tps_per_gpu for p in ps], mode="markers",
            name=f"{mode}, {source}", customdata=idx, error_y=err,
            marker={"size": 13 if sim else 10, "symbol": ("circle" if mode == "aggregated" else "diamond") + ("" if sim else "-open"),
                    # red: the deployment misses the SLO (e.g. the simulator disagreed with the screen)
                    "color": [_COLORS[mode] if p.meets_slo else "crimson" for p in ps],
                    "line": {"width": 2, "color": "black" if sim else None}},
            text=[p.label + _miss(p) for p in ps],
            hovertemplate="%{text}<br>%{x:.1f} tok/s per user<br>%{y:,.0f} tok/s per GPU<extra></extra>",
        ))
    front = sorted((p for p in pts if p.on_frontier), key=lambda p: p.tps_per_user)
    if front:
        fig.add_trace(go.Scatter(x=[p.tps_per_user for p in front], y=[p.output_tps_per_gpu for p in front], mode="lines",
                                 name="Pareto frontier (simulated, meets the SLO)", line={"dash": "dot", "color": "gray"},
                                 hoverinfo="skip"))
    for p in pts:
        if p.recommended:
            fig.add_trace(go.Scatter(x=[p.tps_per_user], y=[p.output_tps_per_gpu], mode="markers", name="recommended",
                                     marker={"symbol": "star", "size": 22, "color": "gold", "line": {"width": 1, "color": "black"}},
                                     hovertemplate=p.label + "<extra>recommended</extra>"))
    band_s = f"±{100 * band:.0f}%" if band is not None else "no calibration: ±?"
    fig.update_layout(
        xaxis_title="tokens/s per user (interactivity)", yaxis_title="output tokens/s per GPU",
        height=480, margin={"l": 10, "r": 10, "t": 40, "b": 10}, legend={"orientation": "h", "y": -0.2},
        title=f"{result.request['model'].rsplit('/', 2)[-2] if '/' in result.request['model'] else result.request['model']} · "
              f"{len(pts)} deployments · {max((p.gpus for p in pts), default=0)} GPUs max · simulated figures {band_s}",
    )
    fig.update_xaxes(range=[0, x_max])
    return fig


def clicked(result: service.SearchResult) -> service.Point | None:
    """The point the user last clicked on the chart (its event is in st.session_state['pareto'])."""
    points = ((st.session_state.get("pareto") or {}).get("selection") or {}).get("points") or []
    for p in reversed(points):
        cd = p.get("customdata")
        cd = cd[0] if isinstance(cd, list) and cd else cd
        if isinstance(cd, (int, float)) and 0 <= int(cd) < len(result.points):
            return result.points[int(cd)]
    return None


def render(result: service.SearchResult, band: float | None) -> None:
    """Draw the chart, the clicked point's details, and the table of every charted deployment."""
    if not result.points:
        st.info("Nothing to chart: no layout fits (see above).")
        return
    st.plotly_chart(figure(result, band), key="pareto", on_select="rerun", selection_mode="points")
    p = clicked(result)
    pct = result.request.get("slo_percentile", 90)
    if p is not None:
        c = p.costs
        st.info(f"**{p.label}** ({p.mode}, {p.source}): {p.gpus} GPUs, {p.output_tps_per_gpu:,.0f} tok/s per GPU, "
                f"{p.tps_per_user:,.1f} tok/s per user, TTFT p{pct} {p.ttft_s:.2f} s, TPOT p{pct} {p.tpot_s * 1e3:.1f} ms, "
                f"{p.request_rate:,.2f} req/s" + (f", ${c.usd_per_m_output_tokens:,.3f} per M output tokens" if c and c.usd_per_m_output_tokens else "")
                + _miss(p))
    st.caption("Click a point for its figures. Filled: simulated; open: analytic screen. Circles (blue): aggregated; "
               "diamonds (orange): prefill/decode disaggregated; red: misses the SLO. Shaded: the TPOT SLO region.")
    q = f"p{result.request.get('slo_percentile', 90)}"  # the percentile the figures are at (the CLI's "TTFT p90 s")
    rows = [{"": "★" if p.recommended else "", "deployment": p.label, "mode": p.mode, "GPUs": p.gpus,
             "tok/s per GPU": round(p.output_tps_per_gpu, 1), "tok/s per user": round(p.tps_per_user, 1),
             f"TTFT {q} (s)": round(p.ttft_s, 3), f"TPOT {q} (ms)": round(p.tpot_s * 1e3, 2), "req/s": round(p.request_rate, 2),
             "$/M out": None if not p.costs or p.costs.usd_per_m_output_tokens is None else round(p.costs.usd_per_m_output_tokens, 4),
             "meets SLO": p.meets_slo, "from": p.source, "frontier": p.on_frontier} for p in result.points]
    st.dataframe(rows, hide_index=True)
