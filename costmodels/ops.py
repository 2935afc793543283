"""Ops of one forward step and the attention geometry behind them.

An op is a kernel (or a group of identical kernels, ``count`` of them, e.g. one per layer of a
kind) with FLOPs and bytes per GPU. Its time is the roofline
``max(flops / (peak * eff_c), bytes / (hbm_bw * eff_m)) + launch overhead`` (see step.py);
communication ops carry their own time from comm.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from costmodels.model_spec import LayerKind, ModelSpec
from costmodels.params import has_indexer

CATEGORIES = ("attention", "indexer", "dense_gemm", "expert_gemm", "communication", "other")
INF = float(2**62)


@dataclass
class OpCost:
    """One op (``count`` identical kernels) of a step, per GPU: FLOPs and bytes are totals over ``count``."""

    name: str
    category: str
    layer_kind: str
    count: int
    flops: float
    bytes: float
    time_s: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepCost:
    """Device time of one step on the busiest GPU, and where it goes."""

    time_s: float
    breakdown: dict[str, float]
    ops: list[OpCost] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"time_s": self.time_s, "breakdown": dict(self.breakdown), "ops": [o.to_dict() for o in self.ops], "notes": list(self.notes)}


@dataclass(frozen=True)
class AttnGeometry:
    """Which past tokens one query of a layer kind reads, and the head dims it multiplies.

    Entries read by a query at position p (1-based, itself included):
    ``min(p, cap) / ratio + (min(p, window) if window else 0)``: ``cap`` is the indexer's
    top-k (in uncompressed tokens) or infinity, ``ratio`` the KV compression, ``window`` the
    uncompressed local window (sliding layers: cap = window, no extra window term).
    """

    kind: str
    cap: float
    ratio: float
    window: float          # 0: none
    index_ratio: float     # 0: no indexer; else keys scored per query = p / index_ratio
    d_qk_decode: int
    d_v_decode: int
    d_qk_prefill: int
    d_v_prefill: int
    prefill_upproj: bool   # MLA prefill in the non-absorbed form: K/V up-projected for all c+n tokens
    index_cap: float = INF  # positions an indexer query scores at most (a two-level index's candidates; INF: all)


def geometry(model: ModelSpec, kind: LayerKind) -> AttnGeometry:
    """Attention geometry of ``kind`` layers of ``model``."""
    topk = model.indexer.topk if (model.indexer and has_indexer(model, kind)) else None
    if model.attention == "mla":
        m = model.mla
        dqk_d = m.kv_lora_rank + m.qk_rope_head_dim  # absorbed: q in latent space + rope
        dv_d = m.kv_lora_rank if m.kv_up_proj else m.kv_lora_rank + m.qk_rope_head_dim
        # sparse (indexed) and V4-style MQA layers run the absorbed form in prefill too
        upproj = m.kv_up_proj and topk is None
        dqk_p, dv_p = ((m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim) if upproj else (dqk_d, dv_d))
    else:
        dqk_d = dv_d = dqk_p = dv_p = model.head_dim
        upproj = False
    window = float(model.sliding_window or 0)
    if kind == "full":
        return AttnGeometry(kind, float(topk) if topk else INF, 1.0, 0.0, 1.0 if topk else 0.0, dqk_d, dv_d, dqk_p, dv_p, upproj)
    if kind == "sliding":
        return AttnGeometry(kind, window, 1.0, 0.0, 0.0, dqk_d, dv_d, dqk_p, dv_p, False)
    ratio = float(model.compress_ratio.get(kind, 1))
    cap = float(topk) * ratio if topk else INF
    w = window if model.window_in_compressed_layers else 0.0
    return AttnGeometry(kind, cap, ratio, w, ratio if topk else 0.0, dqk_d, dv_d, dqk_p, dv_p, False)


def sum_min(c: np.ndarray, n: np.ndarray, cap: float) -> np.ndarray:
    """sum_{j=1..n} min(c + j, cap), elementwise (closed form)."""
    c = c.astype(float)
    n = n.astype(float)
    if cap >= INF:
        return n * c + n * (n + 1) / 2
    m = np.clip(cap - c, 0.0, n)
    return m * c + m * (m + 1) / 2 + (n - m) * cap


def entries_last(g: AttnGeometry, p: np.ndarray) -> np.ndarray:
    """Entries a query at position ``p`` reads (elementwise)."""
    p = p.astype(float)
    a = np.minimum(p, g.cap) / g.ratio
    if g.window:
        a = a + np.minimum(p, g.window)
    return a


def entries_sum(g: AttnGeometry, c: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Entries read by queries at positions c+1..c+n, summed (causal prefill), elementwise."""
    a = sum_min(c, n, g.cap) / g.ratio
    if g.window:
        a = a + sum_min(c, n, g.window)
    return a


class SortedSums:
    """Fast ``sum_i min(x_i + shift, cap)`` for many shifts at once (decode steps of the same requests)."""

    def __init__(self, x: np.ndarray):
        self.raw = x
        self.n = len(x)
        self.total = float(x.sum())
        self.x = None  # sorted values and suffix sums, built on first capped query
        self.lo = float(x.min()) if len(x) else 0.0
        self.memo: dict[float, np.ndarray | float] = {}

    def sum_min(self, shifts: np.ndarray, cap: float):
        if cap >= INF or self.n == 0:
            return self.total + self.n * shifts
        if cap <= self.lo:  # every request already past the cap (e.g. a sliding window): constant
            return self.n * cap
        hit = self.memo.get(cap)
        if hit is not None:
            return hit
        base = self.total + self.n * shifts
        if self.x is None:
            self.x = np.sort(self.raw.astype(float))
            self.suffix = np.concatenate([np.cumsum(self.x[::-1])[::-1], [0.0]])
        idx = np.searchsorted(self.x, cap - shifts, side="right")
        cnt = self.n - idx
        excess = self.suffix[idx] + cnt * (shifts - cap)
        out = base - excess
        self.memo[cap] = out
        return out

    def entries(self, g: AttnGeometry, shifts: np.ndarray) -> np.ndarray:
        """sum_i entries_last(g, x_i + shift) for each shift."""
        a = self.sum_min(shifts, g.cap)
        if g.ratio != 1.0:
            a = a / g.ratio
        if g.window:
            a = a + self.sum_min(shifts, g.window)
        return a
