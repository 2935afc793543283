"""Measured step-time model of one executor on one GPU: what the twin predicts a step costs.

The roofline cost model (``StepCostModel``) says how long a step's kernels take on an ideal
engine. A real engine also spends host time per step (building inputs, launching kernels one
by one, syncing for sampled tokens, scheduling), which dominates at small batch. A
``StepProfile`` (inside a ``CalibrationProfile``, written by ``twinfer calibrate``) holds:

- ``category_scale``: one factor per op category (attention, dense GEMMs, expert GEMMs, other),
  fitted on measured steps, by which this engine's kernels are slower than the cost model's
  op times (which already use the profile's per-op efficiency tables when it has them);
  ``D = sum_c scale_c * t_c(batch)``.
- ``host``: launch/host time of the runner's step. An eager step launches every kernel from
  Python: ``H = fixed + per_layer * L + per_request * n + per_token * tokens + per_prefill *
  prefill_sequences``, and host and device work overlap: ``runner step = max(H, D) + overlap *
  min(H, D)`` (0: perfect overlap, 1: they add).
- ``graph_sizes``: decode-only steps (no drafts) whose batch fits a captured CUDA graph replay
  the graph of the smallest captured size ``>= n`` (executor/cuda_graphs.py): the GEMMs and
  experts run on the padded batch, attention on the real rows, and the host only builds the
  inputs before the replay and samples after it: ``runner step = graph_fixed + graph_per_request
  * n + D(padded)`` (the input build does not overlap the replay).
- ``loop``: the engine loop around the runner (schedule, complete, bookkeeping),
  ``fixed + per_request * n + per_token * tokens``; the simulator charges it as the scheduler's
  host overhead (``SchedulerConfig.host_*``), hidden under the device with async overlap.

Everything is fitted by (non-negative) least squares on relative error from measured steps
(``fit_step_profile``); the measured points are kept in the profile so a fit can be redone.
Only numpy and pydantic here: ``ProfiledStepCost`` imports the cost model lazily.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodels.host import partial_overlap

FIT_CATEGORIES = ("attention", "prefill_attention", "dense_gemm", "expert_gemm", "other")
# cost-model categories (costmodels.ops.CATEGORIES order) folded into the fitted ones; the attention core (and
# indexer) of decode rows and of prefill chunks are separate: different kernels (paged MLA decode vs SDPA prefill)
_FOLD = {0: 0, 1: 0, 2: 2, 3: 3, 4: 4, 5: 4}


class StepPoint(BaseModel):
    """One measured step: its batch (decode contexts, prefill chunks) and times (seconds)."""

    model_config = ConfigDict(extra="forbid")
    num_layers: int
    decode_ctx: list[int] = Field(default_factory=list, description="context length of each decode before the step")
    draft_len: int = 0
    prefill: list[tuple[int, int]] = Field(default_factory=list, description="(new tokens, cached context) per prefill chunk")
    wall_s: float = Field(..., gt=0, description="runner step, median of repeats")
    loop_s: float | None = Field(None, description="engine-loop time around the runner step (schedule + complete), when measured")
    repeats: int = 1
    spread: float = Field(0.0, description="(max - min) / median of the repeats")
    graph_bs: int = Field(0, ge=0, description="captured CUDA-graph batch size the step replayed (0: eager)")

    @property
    def num_requests(self) -> int:
        return len(self.decode_ctx) + len(self.prefill)

    @property
    def num_tokens(self) -> int:
        return len(self.decode_ctx) * (1 + self.draft_len) + sum(p[0] for p in self.prefill)


class HostTerms(BaseModel):
    """Runner host/launch time per step (seconds)."""

    model_config = ConfigDict(extra="forbid")
    fixed_s: float = 0.0
    per_layer_s: float = 0.0
    per_request_s: float = 0.0
    per_token_s: float = 0.0
    per_prefill_s: float = 0.0
    graph_fixed_s: float = Field(0.0, description="CUDA-graph decode step: fixed host time (input build, replay launch, sampling)")
    graph_per_request_s: float = Field(0.0, description="CUDA-graph decode step: host time per sequence")

    def __call__(self, num_layers: float, n_req, n_tok, n_prefill):
        """Eager step host time."""
        return (self.fixed_s + self.per_layer_s * num_layers + self.per_request_s * np.asarray(n_req, float)
                + self.per_token_s * np.asarray(n_tok, float) + self.per_prefill_s * np.asarray(n_prefill, float))

    def graph(self, n_req):
        """CUDA-graph decode step host time."""
        return self.graph_fixed_s + self.graph_per_request_s * np.asarray(n_req, float)


class LoopTerms(BaseModel):
    """Engine-loop time per step around the runner (seconds): the simulator's scheduler host overhead."""

    model_config = ConfigDict(extra="forbid")
    fixed_s: float = 0.0
    per_request_s: float = 0.0
    per_token_s: float = 0.0

    def __call__(self, n_req, n_tok):
        return self.fixed_s + self.per_request_s * np.asarray(n_req, float) + self.per_token_s * np.asarray(n_tok, float)


class FitStats(BaseModel):
    """In-sample quality of a fit."""

    points: int = 0
    mape: float | None = None
    p90_abs_err_s: float | None = None
    max_rel_err: float | None = None
    loop_points: int = 0


class StepProfile(BaseModel):
    """The measured step model of one engine (model, layers, dtype) on one device."""

    model_config = ConfigDict(extra="forbid")
    model: str
    num_layers: int
    dtype: str = "bf16"
    device: str = "cuda"
    hardware_basis: str = Field("H200", description="hardware catalog entry whose ceilings the cost-model op times use")
    use_op_tables: bool = Field(False, description="device terms from the profile's measured op tables (else analytic defaults)")
    op_tables: list[str] = Field(default_factory=list, description="which of the profile's tables (with use_op_tables; empty: all)")
    category_scale: dict[str, float] = Field(default_factory=lambda: {c: 1.0 for c in FIT_CATEGORIES})
    host: HostTerms = Field(default_factory=HostTerms)
    overlap: float = Field(0.0, ge=0.0, le=1.0)
    prefill_token_s: float = Field(0.0, ge=0.0, description="device seconds per prefill token beyond the category terms (eager steps)")
    graph_sizes: list[int] = Field(default_factory=list, description="decode batch sizes the engine replays as CUDA graphs "
                                   "(a batch pads up to the smallest >= n); empty: every step eager")
    loop: LoopTerms = Field(default_factory=LoopTerms)
    fit: FitStats = Field(default_factory=FitStats)
    notes: list[str] = Field(default_factory=list)
    points: list[StepPoint] = Field(default_factory=list, description="measured steps the fit used")

    def scales(self) -> np.ndarray:
        return np.array([self.category_scale.get(c, 1.0) for c in FIT_CATEGORIES])

    def combine(self, host, device):
        """Eager runner step time from host and device terms (vectorised)."""
        return partial_overlap(host, device, self.overlap)

    def graph_bucket(self, num_decodes: int, draft_len: int = 0, num_prefills: int = 0) -> int:
        """Captured batch size a step replays (0: the step runs eager)."""
        if num_prefills or draft_len or num_decodes <= 0:
            return 0
        for s in self.graph_sizes:
            if s >= num_decodes:
                return int(s)
        return 0


# ---------------------------------------------------------------------------------- fitting
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


def host_features(points: Sequence[StepPoint], with_layers: bool, launch_bound: bool = True) -> tuple[np.ndarray, list[str]]:
    """Columns of the host term. Eager steps: 1, (L), (requests, tokens), prefill sequences; CUDA-graph steps
    (``graph_bs > 0``): their own 1 and requests (zero in the other step kind's columns).

    On a GPU (``launch_bound``) an eager step's host time is launch-bound: a fixed number of kernels per
    layer, plus per prefill chunk (its attention runs per sequence); decode rows and tokens are batched on
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
    cols += [e * np.array([len(p.prefill) for p in points], float), g, g * n]
    names += ["per_prefill_s", "graph_fixed_s", "graph_per_request_s"]
    return np.stack(cols, 1), names


def _predict(h: np.ndarray, d: np.ndarray, alpha: float, graph: np.ndarray) -> np.ndarray:
    """Eager steps ``max(H, D) + alpha min(H, D)``; graph steps ``H + D``."""
    return np.where(graph, h + d, partial_overlap(h, d, alpha))


def _solve(hf: np.ndarray, df: np.ndarray, y: np.ndarray, hb: np.ndarray, alpha: float, graph: np.ndarray) -> np.ndarray:
    """NNLS on relative error for a fixed host-bound assignment ``hb`` and overlap ``alpha`` (graph steps add)."""
    wh = np.where(graph | hb, 1.0, alpha)[:, None]
    wd = np.where(graph | ~hb, 1.0, alpha)[:, None]
    a = np.concatenate([hf * wh, df * wd], 1) / y[:, None]
    norm = np.linalg.norm(a, axis=0)
    norm[norm == 0] = 1.0
    return nnls(a / norm, np.ones_like(y)) / norm


def fit_runner_model(hf: np.ndarray, df: np.ndarray, y: np.ndarray,
                     alphas: Sequence[float] = tuple(np.linspace(0.0, 1.0, 11)),
                     graph: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Fit ``y = max(H, D) + alpha min(H, D)`` (eager steps) and ``y = H + D`` (``graph`` steps) with
    ``H = hf @ h``, ``D = df @ k`` (h, k >= 0).

    For each alpha: alternate between a linear NNLS fit for a fixed assignment of eager points to
    'host-bound' (H >= D) or 'device-bound' and re-assigning from the fitted terms, from three
    starting assignments; keep the lowest sum of squared relative errors.
    Returns (h, k, alpha, sse).
    """
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
                x = _solve(hf, df, y, hb, alpha, graph)
                h, d = hf @ x[:nh], df @ x[nh:]
                pred = _predict(h, d, alpha, graph)
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


def fit_loop(points: Sequence[StepPoint]) -> LoopTerms:
    """Engine-loop terms by NNLS on the points that measured them."""
    pts = [p for p in points if p.loop_s is not None]
    if not pts:
        return LoopTerms()
    y = np.array([max(p.loop_s, 1e-7) for p in pts])
    a = np.stack([np.ones(len(pts)), [p.num_requests for p in pts], [p.num_tokens for p in pts]], 1).astype(float)
    if len(pts) < 3:
        return LoopTerms(fixed_s=float(np.median(y)))
    # absolute least squares: loop gaps are small and noisy; relative weights would chase the tiniest
    norm = np.linalg.norm(a, axis=0)
    x = nnls(a / norm, y) / norm
    return LoopTerms(fixed_s=float(x[0]), per_request_s=float(x[1]), per_token_s=float(x[2]))


def errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    """MAPE, p90 absolute error and max relative error of predictions (seconds)."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    if meas.size == 0:
        return {"n": 0, "mape": None, "p90_abs_err_s": None, "max_rel_err": None, "bias": None}
    rel = (pred - meas) / meas
    return {"n": int(meas.size), "mape": float(np.mean(np.abs(rel))), "p90_abs_err_s": float(np.percentile(np.abs(pred - meas), 90)),
            "max_rel_err": float(np.max(np.abs(rel))), "bias": float(np.mean(rel))}


# ---------------------------------------------------------------------------------- the twin's step cost
def reduced_model(name: str, num_layers: int | None = None):
    """The catalog model ``name`` cut to its first ``num_layers`` layers (what ``--num-layers`` runs)."""
    from costmodels.catalog import get_model

    spec = get_model(name)
    if num_layers is None or num_layers == spec.num_layers:
        return spec
    kinds = spec.layer_kinds[:num_layers] if spec.layer_kinds else []
    return spec.model_copy(update={"num_layers": num_layers, "layer_kinds": kinds})


class ProfiledStepCost:
    """Runner step time of a measured engine: the StepCost interface the simulator uses.

    ``mixed_step_time`` / ``chunked_step_time`` / ``decode_times`` return the *runner* step
    (``max(H, D) + overlap * min(H, D)``); the engine loop's own time (``profile.loop``) is left to
    the scheduler's host-overhead terms, as for any simulated engine (``loop_scheduler_terms``).
    Single GPU, no parallelism: the layout is TP1 in the profile's dtype.
    """

    def __init__(self, profile, step: StepProfile | None = None, num_layers: int | None = None):
        from costmodels.calibration import CalibrationProfile
        from costmodels.hardware import get_hardware
        from costmodels.layout import ParallelLayout
        from costmodels.step import StepCostModel

        self.step = step or profile.step
        if self.step is None:
            raise ValueError("the calibration profile has no measured step model (run twinfer calibrate)")
        st = self.step
        self.num_layers = num_layers or st.num_layers
        self.model = reduced_model(st.model, self.num_layers)
        dtype = st.dtype if st.dtype in ("bf16", "fp8", "fp4") else "bf16"
        self.layout = ParallelLayout(tp=1, weight_dtype=dtype, kv_dtype="bf16")
        cal = CalibrationProfile.default(get_hardware(st.hardware_basis))
        if st.use_op_tables:
            cal = profile if not st.op_tables else profile.model_copy(
                update={"tables": {**cal.tables, **{n: t for n, t in profile.tables.items() if n in st.op_tables}}})
        self.base = StepCostModel(self.model, get_hardware(st.hardware_basis), self.layout, cal)
        self.k = st.scales()
        self.notes = [
            f"step times from the measured profile of {st.model} ({st.num_layers} layers, {st.dtype}) on {profile.measured_on}: "
            f"runner = max(host, device) + {st.overlap:.2f} min(host, device); fit MAPE "
            + (f"{st.fit.mape * 100:.1f}%" if st.fit.mape is not None else "n/a")
        ]
        if self.num_layers != st.num_layers:
            self.notes.append(f"profile measured at {st.num_layers} layers, applied to {self.num_layers}: host terms scale only through per_layer_s")
        self._dec: dict[tuple[int, int, int], tuple[np.ndarray, float]] = {}

    # --- category times from the cost model
    def category_times(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray) -> np.ndarray:
        """Cost-model op time per fitted category (attention, dense, experts, other) for one batch."""
        b = self.base
        new = np.asarray(new, np.int64)
        ctx = np.asarray(ctx, np.int64)
        dec = np.asarray(dec, bool)
        out = np.zeros(len(FIT_CATEGORIES))
        if new.size == 0:
            return out
        draft = b._draft(new, dec)
        v = b._nonattn(*b._summary(new, ctx, dec, draft), 1.0)
        for i in range(6):
            out[_FOLD[i]] += v[i]
        if dec.any():
            a = b._attn(new[dec], ctx[dec], dec[dec], draft, 1.0, None)
            out[0] += a[0] + a[1]
        if not dec.all():
            a = b._attn(new[~dec], ctx[~dec], dec[~dec], 0, 1.0, None)
            out[1] += a[0] + a[1]
        return out

    def _decode_base(self, n: int, draft_len: int, pad: int = 0) -> tuple[np.ndarray, float]:
        """Non-attention category times of a decode batch of ``n`` (run as ``pad`` rows when a graph pads it;
        logits only for the real rows) and their sum."""
        pad = max(pad, n)
        key = (n, draft_len, pad)
        got = self._dec.get(key)
        if got is None:
            g = 1 + draft_len
            v = self.base._nonattn(float(pad * g), float(pad * g), float(n * g), float(pad), float(draft_len), 0.0, 1.0)
            cats = np.zeros(len(FIT_CATEGORIES))
            for i in range(6):
                cats[_FOLD[i]] += v[i]
            got = (cats, float(v[:6].sum()))
            self._dec[key] = got
        return got

    def host_time(self, n_req: int, n_tok: int, n_prefill: int) -> float:
        return float(self.step.host(self.num_layers, n_req, n_tok, n_prefill))

    def graph_categories(self, ctx: np.ndarray, pad: int) -> np.ndarray:
        """Category times of a decode-only batch replayed as the CUDA graph of ``pad`` rows: the GEMMs and
        experts on ``pad`` rows, attention on the real rows (padding rows read one null-page token)."""
        ctx = np.asarray(ctx, np.int64)
        n = ctx.size
        cats = self._decode_base(n, 0, pad)[0]
        att = float(self.base.decode_times(ctx.astype(float), 1, 0)[0]) - self._decode_base(n, 0)[1]
        out = cats.copy()
        out[0] += att
        return out

    # --- StepCost interface
    def mixed_step_time(self, new_tokens, context_lens, is_decode) -> float:
        new = np.asarray(new_tokens, np.int64)
        if new.size == 0:
            return 0.0
        dec = np.asarray(is_decode, bool)
        if dec.all() and (new == 1).all():
            pad = self.step.graph_bucket(new.size)
            if pad:
                d = float(self.graph_categories(context_lens, pad) @ self.k)
                return float(self.step.host.graph(new.size)) + d
        d = float(self.category_times(new, context_lens, dec) @ self.k) + self.step.prefill_token_s * float(new[~dec].sum())
        h = self.host_time(new.size, int(new.sum()), int((~dec).sum()))
        return float(self.step.combine(h, d))

    def chunked_step_time(self, decode_context_lens, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        nd = len(decode_context_lens)
        new = np.concatenate([np.full(nd, 1 + draft_len, np.int64), np.asarray(prefill_new, np.int64)])
        ctx = np.concatenate([np.asarray(decode_context_lens, np.int64), np.asarray(prefill_ctx, np.int64)])
        dec = np.zeros(new.size, bool)
        dec[:nd] = True
        return self.mixed_step_time(new, ctx, dec)

    def decode_times(self, context_lens, num_steps: int, draft_len: int = 0) -> np.ndarray:
        ctx = np.asarray(context_lens, float)
        n = ctx.size
        if n == 0 or num_steps <= 0:
            return np.zeros(max(num_steps, 0))
        pad = self.step.graph_bucket(n, draft_len)
        total = self._decode_base(n, draft_len)[1]
        cats = self._decode_base(n, draft_len, pad)[0]
        att = np.asarray(self.base.decode_times(ctx, num_steps, draft_len), float) - total  # attention (+ indexer) per step
        d = float(cats[1:] @ self.k[1:]) + (cats[0] + att) * self.k[0]
        if pad:
            return float(self.step.host.graph(n)) + d
        h = self.host_time(n, n * (1 + draft_len), 0)
        return self.step.combine(h, d)

    def point_time(self, p: StepPoint) -> float:
        """Predicted runner time of a measured point."""
        return self.chunked_step_time(np.asarray(p.decode_ctx, np.int64), p.draft_len, [a for a, _ in p.prefill], [c for _, c in p.prefill])

    def memory(self):
        return self.base.memory()


def point_categories(cost: ProfiledStepCost, p: StepPoint) -> np.ndarray:
    """Cost-model category times of a measured point (as the step ran: padded to its graph size if it replayed one)."""
    nd = len(p.decode_ctx)
    if p.graph_bs > 0 and nd and not p.prefill and not p.draft_len:
        return cost.graph_categories(np.asarray(p.decode_ctx, np.int64), p.graph_bs)
    new = np.concatenate([np.full(nd, 1 + p.draft_len, np.int64), np.array([a for a, _ in p.prefill], np.int64)])
    ctx = np.concatenate([np.asarray(p.decode_ctx, np.int64), np.array([c for _, c in p.prefill], np.int64)])
    dec = np.zeros(new.size, bool)
    dec[:nd] = True
    return cost.category_times(new, ctx, dec)


def fit_step_profile(profile, points: Sequence[StepPoint], *, model: str, dtype: str, device: str,
                     hardware_basis: str = "H200", try_op_tables: bool = True, graph_sizes: Sequence[int] = ()) -> StepProfile:
    """Fit a StepProfile to measured points (runner steps, and loop gaps where measured).

    The device terms come from the cost model with the profile's op tables and, separately,
    with the analytic defaults; the variant with the lower relative error wins (recorded in
    ``use_op_tables``). The per-layer host term is fitted only when the points span two or more
    layer counts; otherwise it is folded into the fixed term (and said so). Points that replayed a
    CUDA graph (``graph_bs > 0``) get their own host terms and add host to device time;
    ``graph_sizes`` (the engine's captured sizes) is what predictions pad to.
    """
    pts = [p for p in points if p.wall_s > 0]
    if len(pts) < 4:
        raise ValueError(f"need at least 4 measured steps to fit a step profile, got {len(pts)}")
    layers = sorted({p.num_layers for p in pts})
    with_layers = len(layers) > 1
    hf, hnames = host_features(pts, with_layers, launch_bound=device == "cuda")
    y = np.array([p.wall_s for p in pts])
    graph = np.array([p.graph_bs > 0 for p in pts], bool)
    # one device column beyond the categories: seconds per prefill token (in microseconds, for conditioning). The
    # categories' shapes come from the roofline cost model; on the H200 their linear-in-tokens part could not follow
    # the measured prefill (~20 us/token for 5 layers, linear from 1k to 8k tokens) and big packed prefills came out
    # 8-12% fast, most of the end-to-end error at saturation (Nov 29 runs 5-6).
    ptok = np.array([0.0 if p.graph_bs > 0 else sum(a for a, _ in p.prefill) * 1e-6 for p in pts])
    variants: list[tuple[bool, list[str]]] = [(False, [])]
    if try_op_tables and profile.tables:
        # the measured tables, all and in subsets (GEMMs alone, GEMMs plus each attention/expert table): a table can
        # describe its kernel well and still fit the whole step worse than the analytic term it replaces
        names = sorted(profile.tables)
        gemm = [n for n in names if n.startswith("gemm_")]
        subsets = [names] + ([gemm] if gemm else []) + [gemm + [n] for n in names if n not in gemm]
        seen: set[tuple[str, ...]] = set()
        for sub in subsets:
            if sub and tuple(sub) not in seen:
                seen.add(tuple(sub))
                variants.append((True, sorted(sub)))
    best = None
    for use_tables, sub in variants:
        df = np.zeros((len(pts), len(FIT_CATEGORIES)))
        for L in layers:
            st = StepProfile(model=model, num_layers=L, dtype=dtype, device=device, hardware_basis=hardware_basis, use_op_tables=use_tables,
                             op_tables=sub)
            cost = ProfiledStepCost(profile, st)
            for i, p in enumerate(pts):
                if p.num_layers == L:
                    df[i] = point_categories(cost, p)
        df = np.concatenate([df, ptok[:, None]], 1)
        h, k, alpha, sse = fit_runner_model(hf, df, y, graph=graph)
        if best is None or sse < best[4] - 1e-12:
            best = (use_tables, h, k, alpha, sse, df, sub)
    use_tables, h, k, alpha, _, df, sub = best
    host = HostTerms(**{n: float(v) for n, v in zip(hnames, h)})
    main_l = max(layers, key=lambda L: sum(p.num_layers == L for p in pts))
    notes = []
    if not with_layers:
        notes.append(f"one layer count ({main_l}) measured: the per-layer host term is folded into the fixed term")
    prof = StepProfile(model=model, num_layers=main_l, dtype=dtype, device=device, hardware_basis=hardware_basis,
                       use_op_tables=use_tables, op_tables=sub, category_scale={c: float(v) for c, v in zip(FIT_CATEGORIES, k)},
                       prefill_token_s=float(k[len(FIT_CATEGORIES)]) * 1e-6, host=host, overlap=alpha, graph_sizes=sorted({int(x) for x in graph_sizes if x > 0}),
                       loop=fit_loop(pts), notes=notes, points=list(points))
    pred = _predict(hf @ h, df @ k, alpha, graph)
    e = errors(pred, y)
    prof.fit = FitStats(points=len(pts), mape=e["mape"], p90_abs_err_s=e["p90_abs_err_s"], max_rel_err=e["max_rel_err"],
                        loop_points=sum(p.loop_s is not None for p in pts))
    return prof


def loop_scheduler_terms(step: StepProfile) -> dict:
    """SchedulerConfig host-overhead fields that make the simulator charge the measured engine loop."""
    return {"host_step_s": float(step.loop.fixed_s), "host_per_request_s": min(float(step.loop.per_request_s), 0.01),
            "host_per_token_s": min(float(step.loop.per_token_s), 0.001)}
