"""Fitting a StepProfile to measured runner steps: non-negative least squares on relative error.

The host terms (``host_features``) and the cost model's category times (``ProfiledStepCost``)
are the columns; the runner's partial host/device overlap (``costmodels.host.partial_overlap``)
is fitted by trying each overlap fraction and alternating host-/device-bound assignments.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from costmodels.calibration import kv_expand_table, linear_tables, moe_layer_table, prefill_chunk_table, sample_table
from costmodels.host import flow_forward, layered_forward, partial_overlap
from costmodels.profiled import ProfiledStepCost, point_after_forward_s, point_categories, point_sample_s
from costmodels.step_profile import (FIT_CATEGORIES, STEP_MODEL_REV, FitStats, HostTerms, LoopTerms, StepPoint, StepProfile,
                                     clip_terms)


def nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """Non-negative least squares ``min |a x - b|, x >= 0`` (Lawson-Hanson active set)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    w = a.T @ (b - a @ x)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0))) * max(m, n)
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=-1.0) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
            if not passive.any():
                break
        w = a.T @ (b - a @ x)
    return x


def host_features(points: Sequence[StepPoint], with_layers: bool, launch_bound: bool = True,
                  piecewise_sizes: Sequence[int] = ()) -> tuple[np.ndarray, list[str]]:
    """Columns of the host term. Eager steps: 1, (L), (requests, tokens), prefill sequences, whether the step holds
    decodes, and (given the engine's ``piecewise_sizes``) whether no token bucket holds it, so it runs wholly eager; CUDA-graph steps (``graph_bs > 0``): their own 1, requests and context tokens (the block tables built per
    step: H200 runs 11-15, the rest of a graph step rose ~0.7 us per thousand context tokens of the batch beyond
    its per-sequence cost), zero in the other step kind's columns.

    On a GPU (``launch_bound``) an eager step's host time is launch-bound: a fixed number of kernels per
    layer, plus per prefill chunk (its attention runs per sequence), plus the decode group's attention path when the
    step holds decodes (issued once per layer for all of them; with piecewise graphs it runs eagerly between the
    pieces: H200 run 10's grid measured a 64-token prefill at 7.7 ms alone and 9.6 ms beside 4 decodes, 1.9 ms where
    the decodes' device work is ~0.2 ms); decode rows and tokens are batched on
    the device, so per-request and per-token eager terms are not fitted (they stay 0): on the H200
    (DeepSeek-V3 5 layers, FP8) they soaked up device time of the packed calibration prefills and
    over-predicted serving's mixed steps (one prefill chunk plus tens of decodes) by ~30%. On a CPU the
    "host" does the arithmetic too, and per-request and per-token terms are fitted. A graph step's host
    time is the input build per sequence before the replay and the sampling after it.
    """
    g = np.array([p.graph_bs > 0 for p in points], float)
    e = 1.0 - g
    cols = [e]
    names = ["fixed_s"]
    if with_layers:
        cols.append(e * np.array([p.num_layers for p in points], float))
        names.append("per_layer_s")
    n = np.array([p.num_requests for p in points], float)
    if not launch_bound:
        cols += [e * n, e * np.array([p.num_tokens for p in points], float)]
        names += ["per_request_s", "per_token_s"]
    kv = np.array([float(sum(p.decode_ctx)) for p in points])
    cols += [e * np.array([len(p.prefill) for p in points], float), e * np.array([len(p.decode_ctx) > 0 for p in points], float),
             g, g * n, g * kv]
    names += ["per_prefill_s", "decode_group_s", "graph_fixed_s", "graph_per_request_s", "graph_per_kv_token_s"]
    if piecewise_sizes:
        # an eager step no token bucket holds (beyond the largest) runs without the pieces: its own issue term
        top = max(piecewise_sizes)
        un = e * np.array([p.num_tokens > top for p in points], float)
        if un.any():
            cols.append(un)
            names.append("unbucketed_s")
    return np.stack(cols, 1), names


def _predict(h: np.ndarray, d: np.ndarray, alpha: float, graph: np.ndarray) -> np.ndarray:
    """Eager steps ``max(H, D) + alpha min(H, D)``; graph steps ``H + D``."""
    return np.where(graph, h + d, partial_overlap(h, d, alpha))


def _solve(hf: np.ndarray, df: np.ndarray, y: np.ndarray, hb: np.ndarray, alpha: float, graph: np.ndarray,
           bounds: tuple[np.ndarray, np.ndarray] | None = None, offset: np.ndarray | None = None) -> np.ndarray:
    """Least squares on relative error for a fixed host-bound assignment ``hb`` and overlap ``alpha`` (graph steps
    add): every coefficient >= 0 (NNLS), or within ``bounds`` (lower, upper per coefficient). ``offset``: seconds
    each point holds beyond the fitted terms (measured, added as is)."""
    wh = np.where(graph | hb, 1.0, alpha)[:, None]
    wd = np.where(graph | ~hb, 1.0, alpha)[:, None]
    a = np.concatenate([hf * wh, df * wd], 1) / y[:, None]
    b = np.ones_like(y) if offset is None else 1.0 - offset / y
    norm = np.linalg.norm(a, axis=0)
    norm[norm == 0] = 1.0
    # the solvers' answers can step outside their bounds by rounding (bvls gave a prefill token term of -3.6e-21 s on
    # a CPU calibration, which StepProfile rejects as negative): clipped back onto them
    if bounds is None:
        return np.maximum(nnls(a / norm, b) / norm, 0.0)
    from scipy.optimize import lsq_linear
    lo, hi = bounds
    return np.clip(lsq_linear(a / norm, b, bounds=(lo * norm, hi * norm), method="bvls").x / norm, lo, hi)


def fit_runner_model(hf: np.ndarray, df: np.ndarray, y: np.ndarray,
                     alphas: Sequence[float] = tuple(np.linspace(0.0, 1.0, 11)),
                     graph: np.ndarray | None = None,
                     bounds: tuple[np.ndarray, np.ndarray] | None = None,
                     offset: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Fit ``y = max(H, D) + alpha min(H, D)`` (eager steps) and ``y = H + D`` (``graph`` steps) with
    ``H = hf @ h``, ``D = df @ k`` (h, k >= 0).

    For each alpha: alternate between a linear NNLS fit for a fixed assignment of eager points to
    'host-bound' (H >= D) or 'device-bound' and re-assigning from the fitted terms, from three
    starting assignments; keep the lowest sum of squared relative errors.
    ``bounds``: (lower, upper) for the coefficients (host terms then device columns); None: each >= 0.
    ``offset``: measured seconds added to each point's prediction as they are (the serial host of eager steps).
    Returns (h, k, alpha, sse).
    """
    off = np.zeros(len(y)) if offset is None else np.asarray(offset, float)
    graph = np.zeros(len(y), bool) if graph is None else np.asarray(graph, bool)
    nh = hf.shape[1]
    best = (np.zeros(nh), np.ones(df.shape[1]), 1.0, np.inf)
    d0 = df.sum(1)
    starts = [d0 < np.median(d0), np.ones(len(y), bool), np.zeros(len(y), bool)]
    for alpha in (alphas if (~graph).any() else (1.0,)):
        for hb in starts:
            hb = hb.copy()
            seen = set()
            for _ in range(40):
                x = _solve(hf, df, y, hb, alpha, graph, bounds, off)
                h, d = hf @ x[:nh], df @ x[nh:]
                pred = off + _predict(h, d, alpha, graph)
                sse = float(np.sum(((pred - y) / y) ** 2))
                if sse < best[3]:
                    best = (x[:nh], x[nh:], float(alpha), sse)
                new = h >= d
                key = new.tobytes()
                if key in seen:
                    break
                seen.add(key)
                hb = new
    return best


def nnls_abs(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients >= 0 of ``a @ x ~ y`` by least squares on absolute error, columns normalised for conditioning
    (the loop's, the serial host's and admission's small, noisy seconds: relative weights would chase the tiniest)."""
    norm = np.linalg.norm(a, axis=0)
    norm[norm == 0] = 1.0
    return nnls(a / norm, y) / norm


def fit_loop(points: Sequence[StepPoint]) -> LoopTerms:
    """Engine-loop terms by NNLS on the points that measured them."""
    pts = [p for p in points if p.loop_s is not None]
    if not pts:
        return LoopTerms()
    y = np.array([max(p.loop_s, 1e-7) for p in pts])
    a = np.stack([np.ones(len(pts)), [p.num_requests for p in pts], [p.num_tokens for p in pts]], 1).astype(float)
    if len(pts) < 3:
        return LoopTerms(**clip_terms(LoopTerms, {"fixed_s": float(np.median(y))})[0])
    x = nnls_abs(a, y)   # absolute least squares: loop gaps are small and noisy
    return LoopTerms(**clip_terms(LoopTerms, {"fixed_s": float(x[0]), "per_request_s": float(x[1]), "per_token_s": float(x[2])})[0])


SERIAL_NAMES = ("serial_s", "serial_per_request_s", "serial_per_prefill_s", "serial_per_token_s")


def fit_serial(points: Sequence[StepPoint], sampler_s: np.ndarray, min_points: int = 8) -> dict[str, float]:
    """The serial host of steps that are not decode-graph replays, from what the calibration measured directly: each
    such point's wall less its forward (``forward_s``, CUDA events around the forward) less the device work after it
    (``sampler_s``: the sampler's table, and the logits GEMM where the table did not time it), over 1, requests and
    prefill chunks and prefill tokens (NNLS, absolute error). The input build before the forward and the bookkeeping after it: in a synchronous step the
    device idles through them, so the whole-step fit's max(host, device) cannot hide them (H200 run 15: 0.42 ms +
    7.7 us a request + 54 us a chunk; a 128-token prefill beside 48 decodes measured 12.2 ms where the step model
    without it said 11.3, the forward's own device time). {} (no term) with fewer than ``min_points`` such points."""
    sel = [i for i, p in enumerate(points) if p.graph_bs == 0 and p.forward_s and p.wall_s > p.forward_s]
    if len(sel) < min_points:
        return {}
    y = np.array([points[i].wall_s - points[i].forward_s - sampler_s[i] for i in sel])
    a = np.array([[1.0, points[i].num_requests, len(points[i].prefill), sum(n for n, _ in points[i].prefill)] for i in sel])
    x = nnls_abs(a, np.maximum(y, 0.0))
    return dict(zip(SERIAL_NAMES, (float(v) for v in x)))


def fit_sample_issue(points: Sequence[StepPoint], min_points: int = 8) -> dict[str, float]:
    """The sampler's host issue from what the calibration measured directly: each point's 'sample' host phase (the
    runner's logits GEMM and sampling calls, from the forward's return to theirs, ``host_phases``, recorded since H200
    run 28) over 1 and its sampled rows (NNLS, absolute error). The sampler's table times it eagerly, issue and device
    work overlapping, so its eager seconds less its device work (~0.05 ms) is not its issue (0.5-0.9 ms + ~8 us a row
    on the H200, runs 31-36); a pipelined loop pays the issue on the host of every launch (run 36: prompt steps'
    launches 0.8-1.6 ms longer than the model without it). {} (no term) with fewer than ``min_points`` such points."""
    sel = [i for i, p in enumerate(points) if p.host_phases and np.isfinite(p.host_phases.get("sample", np.nan))
           and p.host_phases["sample"] > 0]
    if len(sel) < min_points:
        return {}
    y = np.array([points[i].host_phases["sample"] for i in sel])
    a = np.array([[1.0, len(points[i].decode_ctx) * (1 + points[i].draft_len) + len(points[i].prefill)] for i in sel], float)
    x = nnls_abs(a, y)
    return {"sample_issue_s": float(x[0]), "sample_issue_per_row_s": float(x[1])}


def _split_points(points: Sequence[StepPoint]) -> list[int]:
    """Eager points whose forward was measured apart into host issue and device work (``queued_host_s``,
    ``queued_forward_s``) without a wait inside it (an issue that outlasted the unheld step timed the spin)."""
    return [i for i, p in enumerate(points)
            if p.graph_bs == 0 and p.queued_host_s is not None and p.queued_forward_s and p.queued_host_s < p.wall_s]


def fit_issue_host(points: Sequence[StepPoint], hf: np.ndarray, names: Sequence[str], min_points: int = 8) -> dict[int, float]:
    """The eager host terms from what the calibration measured directly: each eager grid step's forward issued with
    the GPU held busy by a spin kernel (``StepPoint.queued_host_s``: the forward call's host seconds with no launch
    waiting for the device), over the eager host columns of ``hf`` (``host_features``: 1, prefill chunks, whether the
    step holds decodes; per layer where fitted), NNLS on absolute error. Returns {column index: seconds}, or {} with
    fewer than ``min_points`` such points. A point whose issue took as long as its whole unheld step waited for the
    device inside its forward (a host sync: the spin, not the issue, was timed) and is left out. Held fixed in the
    whole-step fit, the host side of ``max(H, D)`` is then measured, not inferred from which steps look host-bound."""
    sel = _split_points(points)
    if len(sel) < min_points:
        return {}
    cols = [j for j, n in enumerate(names) if not n.startswith("graph_") and hf[sel, j].any()]
    y = np.array([points[i].queued_host_s for i in sel])
    x = nnls_abs(hf[np.ix_(sel, cols)], y)
    out = {j: 0.0 for j, n in enumerate(names) if not n.startswith("graph_")}
    out.update({j: float(v) for j, v in zip(cols, x)})
    return out


def fit_eager_device(points: Sequence[StepPoint], cats: np.ndarray, scale_bounds: tuple[float, float] | None,
                     pin_prefill_attention: bool, min_points: int = 8) -> dict | None:
    """The device terms of steps that are not decode-graph replays, fitted to what their forwards measured alone
    (``queued_forward_s``: the spin-held forward's CUDA events), least squares on relative error: one scale for the
    categories' op times (``cats``: one row per point at scale 1, prefill attention at 1 when ``pin_prefill_attention``
    (measured per chunk as the executor runs it) or at its own scale), seconds per prefill token, and seconds for
    holding decodes (the decode group's attention path run eagerly between the pieces). The scale stays within
    ``scale_bounds``. Returns {eager_scale, prefill_attention, prefill_token_s, eager_decode_group_s, mape, n}, or
    None with fewer than ``min_points`` measured points.

    H200 run 20 (54 points): the piecewise forwards' device work ran 0.82-0.99x the graph forwards' scale times their
    op times, lowest for small prefills; a decode group added 1.0-1.9 ms to a 64-128-token prefill's device work where
    its attention's tables price ~0.15 ms."""
    sel = _split_points(points)
    if len(sel) < min_points:
        return None
    rest, pa_s, tok, dec = _eager_device_columns(points, cats, sel)
    y = np.array([points[i].queued_forward_s for i in sel])
    tok = tok * 1e-6    # microseconds per token, for conditioning
    cols = [rest, tok, dec] + ([] if pin_prefill_attention else [pa_s])
    off = pa_s if pin_prefill_attention else np.zeros(len(sel))
    a = np.stack(cols, 1) / y[:, None]
    b = 1.0 - off / y
    norm = np.linalg.norm(a, axis=0)
    norm[norm == 0] = 1.0
    lo = np.zeros(a.shape[1])
    hi = np.full(a.shape[1], np.inf)
    if scale_bounds is not None:
        lo[0], hi[0] = scale_bounds
    from scipy.optimize import lsq_linear
    x = lsq_linear(a / norm, b, bounds=(lo * norm, hi * norm), method="bvls").x / norm
    terms = {"eager_scale": float(x[0]), "prefill_token_s": float(x[1]) * 1e-6, "eager_decode_group_s": float(x[2]),
             "prefill_attention": 1.0 if pin_prefill_attention else float(x[3])}
    pred = eager_device_column(points, cats, terms, sel)
    return {**terms, "mape": float(np.mean(np.abs(pred / y - 1))), "n": len(sel)}


def _eager_device_columns(points: Sequence[StepPoint], cats: np.ndarray, sel: Sequence[int]):
    """For the points ``sel``: the op times but prefill attention's (at scale 1), prefill attention's, the prefill
    tokens, and whether the step holds decodes: what ``fit_eager_device``'s terms multiply."""
    ja = FIT_CATEGORIES.index("prefill_attention")
    c = cats[list(sel)]
    return (np.delete(c, ja, axis=1).sum(1), c[:, ja], np.array([sum(a for a, _ in points[i].prefill) for i in sel], float),
            np.array([bool(points[i].decode_ctx) for i in sel], float))


def eager_device_column(points: Sequence[StepPoint], cats: np.ndarray, eag: dict,
                        sel: Sequence[int] | None = None) -> np.ndarray:
    """Forward device seconds by ``fit_eager_device``'s terms: of the points ``sel``, or of every point (0 for the
    decode-graph ones) when None."""
    idx = [i for i, p in enumerate(points) if p.graph_bs == 0] if sel is None else list(sel)
    rest, pa, tok, dec = _eager_device_columns(points, cats, idx)
    d = (rest * eag["eager_scale"] + pa * eag["prefill_attention"] + tok * eag["prefill_token_s"]
         + dec * eag["eager_decode_group_s"])
    if sel is not None:
        return d
    out = np.zeros(len(points))
    out[idx] = d
    return out


def fit_eager_overlap(points: Sequence[StepPoint], min_points: int = 8) -> float | None:
    """The overlap fraction of ``max(H, D) + overlap x min(H, D)`` from measurements alone: each split point's unheld
    forward (``forward_s``) against its measured issue H (``queued_host_s``) and device work D (``queued_forward_s``),
    least squares on relative error over 0..1 in steps of 0.01. None with fewer than ``min_points`` such points. H200
    run 20: the unheld forwards ran 0.1-0.5 ms past their device work with 2-3.5 ms of issue (a launch the device
    waits for at the forward's start and at the eager attention between the pieces)."""
    sel = [i for i in _split_points(points) if points[i].forward_s]
    if len(sel) < min_points:
        return None
    h = np.array([points[i].queued_host_s for i in sel])
    d = np.array([points[i].queued_forward_s for i in sel])
    f = np.array([points[i].forward_s for i in sel])
    grid = np.linspace(0.0, 1.0, 101)
    sse = [float(np.sum((partial_overlap(h, d, a) / f - 1) ** 2)) for a in grid]
    return float(grid[int(np.argmin(sse))])


def fit_layer_flow(points: Sequence[StepPoint], fractions: dict[int, np.ndarray], min_points: int = 8,
                   max_overlap: float = 0.5) -> tuple[float, float] | None:
    """The layered forward's two shares, from measurements alone: ``early``, the share of a layer's device work that
    starts with its issue (``costmodels.host.layered_forward``), and ``overlap``, the share of min(issue, device) the
    forward pays beyond the layer flow (its start and end: input copies, the first launches, the last layer's wait).
    Each split point's unheld forward (``forward_s``) against its measured issue (``queued_host_s``) and device work
    (``queued_forward_s``, shared over the layers by ``fractions[i]``), least squares on relative error: ``early`` over
    0..1 in steps of 0.01, ``overlap`` in closed form for each, within [0, ``max_overlap``]. None with fewer than
    ``min_points`` such points. H200 runs 20-21: (0.71, 0.11) and (0.43, 0.06); the grid's forwards within 1.0-1.1%
    (MAPE), where max(H, D) + overlap x min(H, D) left the small mixed steps 12-17% short."""
    sel = [i for i in _split_points(points) if points[i].forward_s and i in fractions]
    if len(sel) < min_points:
        return None
    f = np.array([points[i].forward_s for i in sel])
    m = np.array([min(points[i].queued_host_s, points[i].queued_forward_s) for i in sel]) / f
    best = None
    for e in np.linspace(0.0, 1.0, 101):
        lay = np.array([layered_forward(points[i].queued_host_s, points[i].queued_forward_s * fractions[i], e) for i in sel]) / f
        a = float(np.clip(np.sum(m * (1.0 - lay)) / max(float(np.sum(m * m)), 1e-30), 0.0, max_overlap))
        sse = float(np.sum((lay + a * m - 1.0) ** 2))
        if best is None or sse < best[0] - 1e-15:
            best = (sse, float(e), a)
    return best[1], best[2]


def errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    """MAPE, p90 absolute error and max relative error of predictions (seconds)."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    if meas.size == 0:
        return {"n": 0, "mape": None, "p90_abs_err_s": None, "max_rel_err": None, "bias": None}
    rel = (pred - meas) / meas
    return {"n": int(meas.size), "mape": float(np.mean(np.abs(rel))), "p90_abs_err_s": float(np.percentile(np.abs(pred - meas), 90)),
            "max_rel_err": float(np.max(np.abs(rel))), "bias": float(np.mean(rel))}


# Category scales a GPU fit may use: the cost model prices the GPU it runs on (hardware_basis) from op tables of the
# kernels the engine ran, so a scale says by how much a family of its op times is off, and it stays near 1. Unbounded,
# the H200 fits set dense GEMMs to 0 and "other" to 22-46x (the fixed time of a graph step): in-sample fine, but the
# K/V up-projection over cached context then cost nothing and agentic prefix-hit steps came out 17-25% fast. Bounded
# to [0.5, 2] they still sat at the bounds; with the engine's own GEMM library priced and per-request sampling seeds
# (H200 run 7), refits from the calibration points alone at [0.8, 1.25] match [0.5, 2] in-sample (4.92 vs 4.90%)
# and on the held-out classes (worst TPOT p50 -10.7 vs -10.4%, TTFT p90 +25.7 vs +26.1%; run 5: equal or better):
# the data do not identify scales far from 1, so the fit may not use them. A scale at a bound is named in the notes.
# A CPU fit prices the reference kernels with an H200 model: there the scales are conversion factors, unbounded.
GPU_SCALE_BOUNDS = (0.8, 1.25)
# tables that time the executor's own code at a step's exact shapes (executor.calibrate.bench_ops): always used
ALWAYS_TABLES = ("attn_prefill_chunk", "moe_layer", "sample", "kv_expand")


def fit_step_profile(profile, points: Sequence[StepPoint], *, model: str, dtype: str, device: str,
                     hardware_basis: str = "H200", try_op_tables: bool = True, graph_sizes: Sequence[int] = (),
                     scale_bounds: tuple[float, float] | None | str = "auto", piecewise_sizes: Sequence[int] = ()) -> StepProfile:
    """Fit a StepProfile to measured points (runner steps, and loop gaps where measured).

    The device terms come from the cost model with the profile's op tables and, separately,
    with the analytic defaults; the variant with the lower relative error wins (recorded in
    ``use_op_tables``). The per-layer host term is fitted only when the points span two or more
    layer counts; otherwise it is folded into the fixed term (and said so). Points that replayed a
    CUDA graph (``graph_bs > 0``) get their own host terms and add host to device time;
    ``graph_sizes`` (the engine's captured sizes) is what predictions pad to; ``piecewise_sizes`` (its piecewise-graph
    token buckets) what prefill/mixed steps pad their GEMM rows to, points and predictions alike. ``scale_bounds``: (lower, upper) for
    every category scale ("auto": ``GPU_SCALE_BOUNDS`` on a GPU, none on a CPU; None: only >= 0); host terms and
    the per-prefill-token term stay >= 0 only.
    """
    if scale_bounds == "auto":
        scale_bounds = GPU_SCALE_BOUNDS if device == "cuda" else None
    pts = [p for p in points if p.wall_s > 0]
    if len(pts) < 4:
        raise ValueError(f"need at least 4 measured steps to fit a step profile, got {len(pts)}")
    layers = sorted({p.num_layers for p in pts})
    with_layers = len(layers) > 1
    # the wholly eager steps' own issue term only where the issue was measured (inferred from wall times alone, H200
    # run 18's fit put 28 ms of host on them)
    split = any(p.queued_host_s is not None for p in pts)
    hf, hnames = host_features(pts, with_layers, launch_bound=device == "cuda", piecewise_sizes=piecewise_sizes if split else ())
    issue = fit_issue_host(pts, hf, hnames)   # eager host terms measured apart from the device (spin kernel first)
    y = np.array([p.wall_s for p in pts])
    graph = np.array([p.graph_bs > 0 for p in pts], bool)
    # one device column beyond the categories: seconds per prefill token (in microseconds, for conditioning). The
    # categories' shapes come from the roofline cost model; on the H200 their linear-in-tokens part could not follow
    # the measured prefill (~20 us/token for 5 layers, linear from 1k to 8k tokens) and big packed prefills came out
    # 8-12% fast, most of the end-to-end error at saturation (Nov 29 runs 5-6).
    ptok = np.array([0.0 if p.graph_bs > 0 else sum(a for a, _ in p.prefill) * 1e-6 for p in pts])
    # a table of the executor's own function at the step's exact shapes (not an efficiency curve of a kernel
    # family) is the op's time: every variant uses it
    always = sorted(n for n in ALWAYS_TABLES if n in profile.tables) if try_op_tables else []
    pw = sorted({int(x) for x in piecewise_sizes if x > 0})
    variants: list[tuple[bool, list[str]]] = [(bool(always), always)]
    if try_op_tables and profile.tables:
        # the measured tables, all and in subsets (GEMMs alone, GEMMs plus each attention/expert table): a table can
        # describe its kernel well and still fit the whole step worse than the analytic term it replaces
        names = sorted(n for n in profile.tables if n not in always)
        gemm = [n for n in names if n.startswith("gemm_")]
        subsets = [names] + ([gemm] if gemm else []) + [gemm + [n] for n in names if n not in gemm]
        seen: set[tuple[str, ...]] = set()
        for sub in subsets:
            if sub and tuple(sub) not in seen:
                seen.add(tuple(sub))
                variants.append((True, sorted(sub + always)))
    best = None
    for use_tables, sub in variants:
        df = np.zeros((len(pts), len(FIT_CATEGORIES)))
        smp = np.zeros(len(pts))   # the measured sampler's seconds (a table, priced as measured: coefficient 1)
        after = np.zeros(len(pts))  # device work after the forward (sampler, and the logits GEMM where not in its table)
        fw = np.zeros_like(df)    # graph points that timed their forward: the graph's own ops (no logits, no sampling)
        frac: dict[int, np.ndarray] = {}   # eager points: each layer's share of the device work (layer_fractions)
        for L in layers:
            st = StepProfile(model=model, num_layers=L, dtype=dtype, device=device, hardware_basis=hardware_basis, use_op_tables=use_tables,
                             op_tables=sub, model_rev=STEP_MODEL_REV, piecewise_sizes=pw)
            cost = ProfiledStepCost(profile, st)
            for i, p in enumerate(pts):
                if p.num_layers == L:
                    df[i] = point_categories(cost, p)
                    smp[i] = point_sample_s(cost, p)
                    after[i] = point_after_forward_s(cost, p)
                    if p.graph_bs > 0 and p.forward_s and p.decode_ctx and not p.prefill and not p.draft_len:
                        fw[i] = cost.graph_categories(np.asarray(p.decode_ctx, np.int64), p.graph_bs, logits=False)
                    if p.graph_bs == 0:
                        rows = st.piecewise_bucket(p.num_tokens) or p.num_tokens
                        frac[i] = cost.layer_fractions(float(rows), df[i])
        df = np.concatenate([df, ptok[:, None], smp[:, None]], 1)
        nc = len(FIT_CATEGORIES)
        lo = np.concatenate([np.zeros(hf.shape[1]), np.full(nc, float(scale_bounds[0]) if scale_bounds else 0.0), [0.0, 1.0]])
        hi = np.concatenate([np.full(hf.shape[1], np.inf), np.full(nc, float(scale_bounds[1]) if scale_bounds else np.inf),
                             [np.inf, 1.0 + 1e-9]])
        # one device scale for every category, the measured MoE layer's included: H200 run 11's graph forwards ran
        # 1.10-1.23x the sum of their op times with the MoE from its measured table (its own CUDA graph, alone), and
        # 1.2-1.74x, rising with batch, the rest alone with the MoE kept at its measured time (scale 1): the MoE pays
        # the forward's factor too
        pinned, replay = forward_fit(pts, fw, scale_bounds or (0.0, np.inf))
        if "attn_prefill_chunk" in sub or "kv_expand" in sub:
            # the measured per-chunk attention is priced as measured (the chunk runs eagerly between the graph pieces,
            # not inside a graph, so the graph forwards' factor is not its). Left free it went to its 0.8 bound in H200
            # runs 11-14 (unbounded 0.69 in run 14, whose table is device time): it absorbed the single device scale's
            # over-price of 1k-token steps' other ops, and under-priced serving's long-context chunks (run 14 longctx
            # TTFT p90 -16.2% refitted free, -9.3% at 1)
            pinned[FIT_CATEGORIES.index("prefill_attention")] = 1.0
        for j, v in pinned.items():          # device scales the graph forwards measured: fixed for the whole fit
            lo[hf.shape[1] + j], hi[hf.shape[1] + j] = v, v * (1 + 1e-9) + 1e-12
        for j, v in issue.items():           # eager host terms the spin-held issue measured: fixed likewise
            lo[j], hi[j] = v, v * (1 + 1e-9) + 1e-12
        bounds = (lo, hi) if scale_bounds is not None or pinned or smp.any() or issue else None
        serial = fit_serial(pts, after)   # measured, not fitted to whole steps: held fixed like the pinned scales
        # a graph replay's fixed device cost (forward_fit), measured: held like the serial host terms
        off = np.array([replay if p.graph_bs > 0 else HostTerms(**serial).serial(p.num_requests, len(p.prefill), sum(n for n, _ in p.prefill)) for p in pts])
        pin_pa = "attn_prefill_chunk" in sub or "kv_expand" in sub
        eag = fit_eager_device(pts, df[:, :nc], scale_bounds, pin_pa)
        alphas = tuple(np.linspace(0.0, 1.0, 11))
        if eag is not None:
            # the eager steps' device side measured: their categories and per-token column give way to one column of
            # seconds from the measured fit (coefficient 1), so the category scales stay the graph forwards'; the
            # overlap is the one their measured forwards, issues and device work show
            col = eager_device_column(pts, df[:, :nc], eag)
            df = df.copy()
            df[~graph, : nc + 1] = 0.0
            df = np.concatenate([df, col[:, None]], 1)
            bounds = (np.append(lo, 1.0), np.append(hi, 1.0 + 1e-9))
        flow = fit_layer_flow(pts, frac) if eag is not None and graph.sum() >= 4 else None
        early = None if flow is None else flow[0]
        if eag is not None and flow is None:
            a_meas = fit_eager_overlap(pts)
            if a_meas is not None:
                alphas = (a_meas,)
        if flow is None:
            h, k, alpha, sse = fit_runner_model(hf, df, y, alphas=alphas, graph=graph, bounds=bounds, offset=off)
            pred = off + _predict(hf @ h, df @ k, alpha, graph)
        else:
            # the eager steps' host and device sides are measured and their forward is the layered one: the wall
            # fit is left the graph steps' host terms alone, and every point is predicted as the cost model will
            g = graph
            h, k, alpha, _ = fit_runner_model(hf[g], df[g], y[g], alphas=(0.0,), graph=g[g], bounds=bounds, offset=off[g])
            pred = off + _predict(hf @ h, df @ k, alpha, graph)
            ns = nc + 1
            alpha = flow[1]
            for i in np.flatnonzero(~graph):
                hv, dv = float(hf[i] @ h), float(df[i, -1])
                pred[i] = off[i] + flow_forward(hv, dv, frac[i], early, alpha) + df[i, ns] * k[ns]
        sse = float(np.sum(((pred - y) / y) ** 2))
        if best is None or sse < best[4] - 1e-12:
            best = (use_tables, h, k, alpha, sse, df, sub, fw, serial, off, eag, early, pred, replay)
    use_tables, h, k, alpha, _, df, sub, fw, serial, off, eag, early, pred, replay = best
    host_vals, clipped = clip_terms(HostTerms, {**{n: float(v) for n, v in zip(hnames, h)}, **serial, **fit_sample_issue(pts)})
    host = HostTerms(**host_vals)
    main_l = max(layers, key=lambda L: sum(p.num_layers == L for p in pts))
    notes = []
    if clipped:
        notes.append(f"host terms past their bounds held at them (costmodels.step_profile): {', '.join(clipped)}")
    if scale_bounds is not None:
        at = [c for c, v in zip(FIT_CATEGORIES, k) if min(abs(v - b) for b in scale_bounds) < 1e-6 * max(1.0, v)]
        notes.append(f"category scales bounded to [{scale_bounds[0]:g}, {scale_bounds[1]:g}]"
                     + (f"; at a bound: {', '.join(at)}" if at else ""))
    if not with_layers:
        notes.append(f"one layer count ({main_l}) measured: the per-layer host term is folded into the fixed term")
    fwd = graph_forward_ratio(pts, fw)
    if fwd is not None:
        notes.append(fwd)
    smp_tab = profile.tables.get("sample")

    def sample_device(rows: float) -> float | None:   # the sampler table's device work (None: not timed apart)
        d = smp_tab.device([rows]) if smp_tab is not None else None
        return None if d is None else float(d[0])
    launch = fit_launch_device(pts, sample_device)
    launch_rows = launch_device_table(pts, sample_device) if launch is not None else []
    if launch is not None:
        notes.append(f"pipelined launch of a decode graph: {launch[0] * 1e3:.3f} ms + {launch[1] * 1e6:.2f} us per row of "
                     "device work beyond its forward and sampler (held launch spans less held forwards and the sampler table)"
                     + "; priced per row count as measured: " + ", ".join(f"{r} rows {v * 1e3:+.3f} ms" for r, v in launch_rows))
    if replay > 0:
        notes.append(f"decode-graph replay: {replay * 1e3:.3f} ms of device work beyond its ops' times at scale {k[0]:.3f}, "
                     "fitted with it to the forwards timed with the GPU held")
    if issue:
        notes.append(f"eager host terms measured: the forward's issue with the GPU held by a spin kernel, {len(_split_points(pts))} grid steps "
                     f"({', '.join(f'{hnames[j]} {v * 1e3:.3f} ms' for j, v in issue.items())}); fixed in the fit")
    ns = len(FIT_CATEGORIES) + 1    # the sampler's column (coefficient 1): after the forward
    dev = eager_device_ratio(pts, df @ k - df[:, ns] * k[ns])
    if dev is not None:
        notes.append(dev)
    scales = {c: float(v) for c, v in zip(FIT_CATEGORIES, k)}
    eager_kw: dict = {"prefill_token_s": float(k[len(FIT_CATEGORIES)]) * 1e-6}
    if eag is not None:
        scales["prefill_attention"] = eag["prefill_attention"]
        eager_kw = {"prefill_token_s": eag["prefill_token_s"], "eager_scale": eag["eager_scale"],
                    "eager_decode_group_s": eag["eager_decode_group_s"], "layer_early": early}
        notes.append(f"eager device terms fitted to {eag['n']} grid steps' measured device work (spin-held forwards): scale "
                     f"{eag['eager_scale']:.3f} (graph forwards {k[0]:.3f}), {eag['prefill_token_s'] * 1e9:.0f} ns per prefill token, "
                     f"decode group {eag['eager_decode_group_s'] * 1e3:.3f} ms; MAPE {eag['mape'] * 100:.1f}%; "
                     + (f"forward layer by layer in order, {early:.2f} of each layer's device work starting with its issue, "
                        f"+ {alpha:.2f} x min(issue, device)" if early is not None else f"overlap {alpha:.2f}")
                     + ", from their unheld forwards")
    prof = StepProfile(model=model, num_layers=main_l, dtype=dtype, device=device, hardware_basis=hardware_basis, model_rev=STEP_MODEL_REV,
                       use_op_tables=use_tables, op_tables=sub, category_scale=scales, host=host, overlap=alpha, graph_replay_s=replay,
                       **({} if launch is None else {"launch_device_s": launch[0], "launch_device_per_row_s": launch[1],
                                                     "launch_device_rows": launch_rows}),
                       graph_sizes=sorted({int(x) for x in graph_sizes if x > 0}),
                       piecewise_sizes=pw, loop=fit_loop(pts), notes=notes, points=list(points), **eager_kw)
    e = errors(pred, y)
    prof.fit = FitStats(points=len(pts), mape=e["mape"], p90_abs_err_s=e["p90_abs_err_s"], max_rel_err=e["max_rel_err"],
                        loop_points=sum(p.loop_s is not None for p in pts))
    return prof


def _graph_forwards(points: Sequence[StepPoint], cats: np.ndarray, min_held: int = 8) -> tuple[list[int], np.ndarray]:
    """The CUDA-graph points that timed their forward (with op times to compare): their indices, and each one's
    measured forward over the sum of its op times in ``cats``. Where at least ``min_held`` of them also timed it with
    the GPU held busy (``queued_forward_s``: calibrations since ae91d90), those points and those forwards: the device
    work alone, as a pipelined loop runs it. The forward timed on an idle GPU also holds the GPU's wait for the
    launch (0.11-0.15 ms on the H200 at 1-64 rows, benchmarks/gpu/graph_launch_gap.py), which is host work: the
    whole-step fit's graph host terms take it up for a synchronous loop (H200 run 34: serving's pipelined decode
    steps ran 6-16% under the idle grid; pinned to the held forwards, TPOT p50 within 1.8% where it was +5.6%)."""
    sel = [i for i, p in enumerate(points) if p.graph_bs > 0 and p.forward_s and cats[i].sum() > 0]
    held = [i for i in sel if points[i].queued_forward_s and not points[i].prefill]
    if len(held) >= min_held:
        return held, np.array([points[i].queued_forward_s / cats[i].sum() for i in held])
    return sel, np.array([points[i].forward_s / cats[i].sum() for i in sel])


def forward_scales(points: Sequence[StepPoint], cats: np.ndarray, scale_bounds: tuple[float, float],
                   min_points: int = 8) -> dict[int, float]:
    """The device scales of ``forward_fit`` alone: {category index: scale}."""
    return forward_fit(points, cats, scale_bounds, min_points)[0]


def forward_fit(points: Sequence[StepPoint], cats: np.ndarray, scale_bounds: tuple[float, float],
                min_points: int = 8, replay_cap: float = 0.1) -> tuple[dict[int, float], float]:
    """Device scale fitted to device time alone: the CUDA-graph points' measured forwards (``forward_s``, the
    replay's CUDA events: no host work in it) against the sum of the graph's own op times (``cats``, one row per point:
    no logits GEMM, no sampling, which run after the replay), least squares on relative error within ``scale_bounds``.
    Returns ``({category index: scale}, replay seconds)`` for the categories the graph forwards exercise; ({}, 0) where
    fewer than ``min_points`` graph points recorded a forward (profiles before run 9). The whole-step fit then keeps
    these fixed, so host-bound eager steps cannot move device scales to absorb host time. H200 run 9: the graph
    forwards run 1.16x their op times (p10 1.10, p90 1.25), the in-graph cost of ~170 small kernels a layer beyond the
    tables.

    Where the forwards were timed with the GPU held (``queued_forward_s``: device work alone, no wait for the launch)
    a replay's fixed device cost is fitted with the scale, forward = scale x op times + replay (``graph_replay_s``),
    the replay within [0, ``replay_cap`` x the smallest held forward] and the scale within its bounds, else the scale
    alone: the graph's chain of small kernels pays its ramps and tails once a replay whatever the batch. H100 run 45
    (51 held forwards, 1-128 rows): the scale alone left the one-row forwards 3.9% under and the 48-128-row ones 1-2%
    over (rms 2.2%); with the replay term (0.17 ms, scale 1.073) rms 1.4%, every batch within 2%. On an idle GPU's
    forwards the launch wait (host work) would pass for it: the scale alone there. H100 runs 51-52, the MoE layer timed
    at 2-48 tokens as well: the fit takes no replay term (1.044-1.046 x op times + 0), where the same runs' points at 1 /
    8 / 64 tokens alone give 0.22-0.24 ms: what the term took up on runs 45-50 was mostly the MoE table interpolated
    between 1 and 8 tokens. The two are nearly collinear over the grid's forwards (2.6-12 ms), so the term is a
    stand-in, not a measured replay cost."""
    sel, r = _graph_forwards(points, cats)
    if len(sel) < min_points:
        return {}, 0.0
    used = [j for j in range(cats.shape[1]) if cats[sel, j].max() > 0]
    q = 1.0 / r     # op-time sum over the measured forward
    # one scale for all of them: attention and the row-wise ops are a few percent of a decode forward and move
    # together with the GEMMs, so separate scales are not identified (fitted apart they sit at opposite bounds)
    k = float(np.clip(np.sum(q) / np.sum(q * q), *scale_bounds))   # min sum (k q - 1)^2: relative error of (op sum) x k
    replay = 0.0
    if all(points[i].queued_forward_s for i in sel):
        y = np.array([points[i].queued_forward_s for i in sel])
        cap = replay_cap * float(y.min())
        a = np.stack([q, 1.0 / y], 1)   # min sum ((k x + c) / y - 1)^2 over (k, c)
        k2, c2 = np.linalg.lstsq(a, np.ones_like(y), rcond=None)[0]
        if c2 > cap:   # at the cap: the scale given it
            c2 = cap
            k2 = float(np.sum(q * (1.0 - c2 / y)) / np.sum(q * q))
        if c2 > 0 and scale_bounds[0] <= k2 <= scale_bounds[1]:
            k, replay = float(k2), float(c2)
    return {j: k for j in used}, replay


def fit_launch_device(points: Sequence[StepPoint], sample_device, min_points: int = 8) -> tuple[float, float] | None:
    """Device seconds a pipelined launch of a decode graph holds beyond its forward and its sampler, as
    ``launch_device_s + launch_device_per_row_s x rows``: the grid's held launch spans (``queued_launch_s``) less their
    held forwards (``queued_forward_s``) and the sampler table's device work at their rows (``sample_device(rows)``),
    least squares, both terms >= 0. What the copies around a replay cost on the device (the inputs', the sampled ids'
    read-back, the rows' gather), which serving's device span holds and the forward and the sampler timed apart do not
    (H100 run 46: serving's decode steps 0.04-0.13 ms over the model of the two at 1-16 rows). None with fewer than
    ``min_points`` such points (calibrations before 2026-12-06) or without the sampler's device table."""
    got = _launch_beyond(points, sample_device)
    if got is None or len(got) < min_points:
        return None
    n = np.array([float(x) for x, _ in got])
    r = np.array([v for _, v in got])
    a = np.stack([np.ones_like(n), n], 1)
    c0, c1 = np.linalg.lstsq(a, r, rcond=None)[0]
    if c1 < 0:
        c0, c1 = float(np.mean(r)), 0.0
    if c0 < 0:
        c0, c1 = 0.0, max(float(np.sum(r * n) / np.sum(n * n)), 0.0)
    return max(float(c0), 0.0), float(c1)


def launch_device_table(points: Sequence[StepPoint], sample_device) -> list[tuple[int, float]]:
    """``fit_launch_device``'s residuals as measured at each row count of the grid: ``[(rows, median of the held
    launch spans less their held forwards and the sampler table's device work at those rows)]``, by rows. The line
    cannot follow what the sampler table, interpolated between the row counts it timed, misses at single counts (H100
    run 47: 0.105-0.118 ms at 2 rows, -0.006-0.015 at 1 and 0.000-0.013 at 4; serving's decode steps ran 0.11 ms over
    the model at 2 rows, 0.01-0.04 at 1). Empty where a row count lacks the sampler's device work."""
    by: dict[int, list[float]] = {}
    for n, v in _launch_beyond(points, sample_device) or []:
        by.setdefault(n, []).append(v)
    return [(n, float(np.median(v))) for n, v in sorted(by.items())]


def _launch_beyond(points: Sequence[StepPoint], sample_device) -> list[tuple[int, float]] | None:
    """Each decode-graph point's held launch span less its held forward and the sampler table's device work at its
    rows, as ``(rows, seconds)``: what ``fit_launch_device`` and ``launch_device_table`` price. None where a point's
    rows lack the sampler's device work."""
    out = []
    for p in points:
        if p.graph_bs > 0 and not p.prefill and p.queued_launch_s and p.queued_forward_s:
            n = len(p.decode_ctx)
            d = sample_device(float(n))
            if d is None:
                return None
            out.append((n, p.queued_launch_s - p.queued_forward_s - d))
    return out


def graph_forward_ratio(points: Sequence[StepPoint], cats: np.ndarray) -> str | None:
    """How well the op times alone describe the CUDA-graph decode forwards: each graph point's measured forward
    (``StepPoint.forward_s``, the replay's CUDA-event time) over the sum of the graph's own cost-model op times at
    scale 1 (``cats``: one row per point, no logits or sampling). A note, or None where no graph point recorded its
    forward (before run 9)."""
    r = _graph_forwards(points, cats)[1]
    if r.size < 3:
        return None
    lo, med, hi = np.percentile(r, [10, 50, 90])
    return (f"CUDA-graph decode forwards / sum of the graph's cost-model op times at scale 1 (logits and sampling "
            f"excluded): median {med:.3f}, p10 {lo:.3f}, p90 {hi:.3f} over {r.size} points; the rest of a graph step "
            f"(inputs, logits, sampling) is the graph host term plus the logits GEMM")


def eager_device_ratio(points: Sequence[StepPoint], d_forward: np.ndarray) -> str | None:
    """How well the fitted device terms describe the eager grid steps' measured device work: each point's
    ``queued_forward_s`` (the forward's CUDA events with the host's issue hidden behind a spin kernel) over its
    fitted device seconds without the sampler (``d_forward``, one per point: the forward alone). A note, or None
    where fewer than 3 points measured it."""
    sel = [i for i, p in enumerate(points) if p.graph_bs == 0 and p.queued_forward_s]
    if len(sel) < 3:
        return None
    d = np.asarray(d_forward, float)[sel]
    ok = d > 0
    if ok.sum() < 3:
        return None
    r = np.array([points[i].queued_forward_s for i in sel])[ok] / d[ok]
    lo, med, hi = np.percentile(r, [10, 50, 90])
    return (f"eager forwards' measured device work (spin-held) / the fitted device terms less the sampler: median "
            f"{med:.3f}, p10 {lo:.3f}, p90 {hi:.3f} over {r.size} points")


def refit_profile(profile, scale_bounds: str = "auto"):
    """``profile`` with its step model re-fitted from its own calibration points (no validation data) at this
    revision of the step model: the offline scripts' ``--refit auto|none|LO,HI`` (``scale_bounds``: "auto", "none"
    for unbounded, or "LO,HI")."""
    st = profile.step
    if not profile.op_table_libs:   # calibrated before op_table_libs (runs <= 6): its measured Linear says which library
        profile = profile.model_copy(update={"op_table_libs": type(profile).measured_libs(profile.op_points, st.dtype)})
    lt = linear_tables(profile.op_points, getattr(st, "hardware_basis", None) or profile.measured_on)   # device seconds where the points have them
    if lt:
        profile = profile.model_copy(update={"tables": {**profile.tables, **lt}})
    ct = prefill_chunk_table(profile.op_points)   # this revision's chunk table (device seconds where the points have them)
    if ct is not None:
        profile = profile.model_copy(update={"tables": {**profile.tables, "attn_prefill_chunk": ct}})
    smp = sample_table(profile.op_points)   # the sampler's measured time (every CUDA calibration timed it)
    if smp is not None:
        profile = profile.model_copy(update={"tables": {**profile.tables, "sample": smp}})
    kvx = kv_expand_table(profile.op_points)   # the chunk's key/value expansion (calibrations since it was timed)
    if kvx is not None:
        profile = profile.model_copy(update={"tables": {**profile.tables, "kv_expand": kvx}})
    if "moe_layer" not in profile.tables:   # run 11 timed its MoE points' device time before the table was built from them
        mt = moe_layer_table(profile.op_points, st.model, st.dtype)
        if mt is not None:
            profile = profile.model_copy(update={"tables": {**profile.tables, "moe_layer": mt}})
    b = scale_bounds if scale_bounds == "auto" else None if scale_bounds == "none" else tuple(float(x) for x in scale_bounds.split(","))
    st2 = fit_step_profile(profile, st.points, model=st.model, dtype=st.dtype, device=st.device, graph_sizes=st.graph_sizes, hardware_basis=getattr(st, "hardware_basis", None) or "H200",
                           scale_bounds=b, piecewise_sizes=st.piecewise_sizes)
    # admission is measured apart from the step points (executor.calibrate.measure_admission): kept as measured
    st2.loop = st2.loop.model_copy(update={"admit_s": st.loop.admit_s, "admit_per_token_s": st.loop.admit_per_token_s})
    st2.host = st2.host.model_copy(update={"after_eager_s": st.host.after_eager_s,
                                           "after_eager_decode_s": list(st.host.after_eager_decode_s),
                                           "after_eager_decode_by_tokens": list(st.host.after_eager_decode_by_tokens)})
    return profile.model_copy(update={"step": st2})


def idle_graph_forwards(prof):
    """A copy of a calibration profile without the CUDA-graph points' forwards timed with the GPU held busy
    (``queued_forward_s``), so that a refit pins the device scale to the forwards timed on an idle GPU (``forward_s``)
    as fits did before 2026-12-04 (``_graph_forwards``): for comparing the two on a run's own data. Returns ``(copy, how
    many points changed)``."""
    pts, n = [], 0
    for p in prof.step.points:
        if p.graph_bs > 0 and p.queued_forward_s and not p.prefill:
            p = p.model_copy(update={"queued_forward_s": None})
            n += 1
        pts.append(p)
    return prof.model_copy(update={"step": prof.step.model_copy(update={"points": pts})}), n


# the sampler's batches and the MoE layer's token counts calibrations timed before d9e76bd (2026-12-06), which added
# every row count of a 1-16-row decode step and 2-48 tokens: ``run_profile(..., sparse_tables=True)`` sets the others
# aside, to compare the two on one run
SPARSE_SAMPLE_ROWS = (1, 4, 16, 32, 64, 128)
SPARSE_MOE_TOKENS = (1, 8, 64, 128, 256, 384, 512, 1024, 2047, 2048, 4096, 8192)


def sparse_table_points(points: list[dict]) -> list[dict]:
    """``points`` without the sampler and MoE points at row and token counts outside the tables' earlier grid."""
    return [p for p in points if not (p.get("op") == "sample" and float(p.get("batch", 0)) not in SPARSE_SAMPLE_ROWS)
            and not (p.get("op") == "moe_experts" and float(p.get("tokens", 0)) not in SPARSE_MOE_TOKENS)]


def run_profile(run, scale_bounds: str | None = None, linear_eager: bool = False, own_gemms: bool = True,
                idle_graph: bool = False, sparse_tables: bool = False):
    """The one calibration profile a validation-matrix run folder keeps (``calibration_*.json``), re-fitted from its
    own calibration points when ``scale_bounds`` is given (``refit_profile``): what the offline scripts start from.
    ``linear_eager``: the refit's dense GEMM tables from the Linear's eager seconds (its points' ``device_s`` set aside).
    ``own_gemms`` False: the calibration's own GEMM points (``gemm``, its shapes at the token buckets) set aside, so the
    committed op table prices the FP8 GEMMs as before they were timed. ``idle_graph``: the graph points' forwards timed
    with the GPU held busy set aside (``idle_graph_forwards``; needs a refit, ``scale_bounds``). ``sparse_tables``: the
    sampler and MoE tables from their earlier row and token counts alone (``sparse_table_points``; needs a refit)."""
    from pathlib import Path

    from costmodels.calibration import CalibrationProfile
    prof = CalibrationProfile.load(next(Path(run).glob("calibration_*.json")))
    if linear_eager:
        pts = [{k: v for k, v in p.items() if k != "device_s"} if p.get("op") == "linear" else p for p in prof.op_points]
        prof = prof.model_copy(update={"op_points": pts})
    if not own_gemms:
        prof = prof.model_copy(update={"op_points": [p for p in prof.op_points if p.get("op") != "gemm"]})
    if sparse_tables:
        if scale_bounds is None:
            raise ValueError("the sparse tables change the fit's input: give a refit (scale_bounds, e.g. 'auto')")
        pts = sparse_table_points(prof.op_points)
        if len(pts) == len(prof.op_points):
            raise ValueError("this run's calibration timed the sampler and the MoE layer at the earlier counts only")
        tables = {k: v for k, v in prof.tables.items() if k not in ("sample", "moe_layer")}   # rebuilt by the refit
        prof = prof.model_copy(update={"op_points": pts, "tables": tables})
    if idle_graph:
        if scale_bounds is None:
            raise ValueError("setting the held graph forwards aside changes the fit's input: give a refit (scale_bounds, e.g. 'auto')")
        prof, n = idle_graph_forwards(prof)
        if n == 0:
            raise ValueError(f"{run}: no CUDA-graph point timed its forward with the GPU held (calibrations since ae91d90): "
                             "its fit already uses the idle forwards")
    return prof if scale_bounds is None else refit_profile(prof, scale_bounds)


def loop_scheduler_terms(step: StepProfile) -> dict:
    """SchedulerConfig host-overhead fields that make the simulator charge the measured engine loop."""
    return {"host_step_s": float(step.loop.fixed_s), "host_per_request_s": min(float(step.loop.per_request_s), 0.01),
            "host_per_token_s": min(float(step.loop.per_token_s), 0.001),
            "host_admit_s": min(float(step.loop.admit_s), 0.01), "host_admit_per_token_s": min(float(step.loop.admit_per_token_s), 1e-5),
            "host_after_eager_s": min(float(step.host.after_eager_s), 0.01),
            "host_after_eager_decode_s": [min(max(float(x), 0.0), 0.01) for x in step.host.after_eager_decode_s[:16]],
            "host_after_eager_decode_by_tokens": [(max(1, int(t)), [min(max(float(x), 0.0), 0.01) for x in v[:16]])
                                                  for t, v in step.host.after_eager_decode_by_tokens[:8]]}
