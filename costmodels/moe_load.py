"""Per-expert load: skew, placement over EP ranks, EPLB replication, drift, and the straggler it causes.

A MoE layer's step waits for its busiest EP rank. How busy that rank is depends on

- the **skew** of expert popularity (a few hot experts take a large share of the tokens),
- the **placement** of experts on ranks (contiguous ids, or EPLB's balanced packing with
  redundant replicas of the hot experts), and
- **sampling noise**: a step routes only ``T * top_k`` token-expert assignments, so at small
  batches the busiest rank is busier than its expected share.

:class:`ExpertLoad` turns these into ``imbalance(assignments)``: the busiest rank's expected
assignments over the mean, averaged over sampled layers (every layer has its own hot experts;
the step sums layers, so the mean of per-layer maxima is what adds up).

Default skew (``zipf_s = 0.63``) is fitted to a measurement: TensorRT-LLM's large-EP blog
(NVIDIA, "Scaling Expert Parallelism in TensorRT-LLM", part 1, offline EPLB section) reports
DeepSeek-R1 at EP32 on GB200 with a busiest-rank load of 2.56x the mean (``imbalance-ratio``
1.56, averaged over MoE layers) without EPLB, and 1.12x at EP36 with 32 redundant experts.
A Zipf(0.63) popularity over 256 experts, randomly permuted per layer and placed contiguously,
gives 2.53x at EP32 (65,536 assignments a step: local batch 256 x 32 ranks x top-8); EPLB
packing with 32 replicas at EP36 gives 1.05x (the blog: 1.12x; tests check both).
"""

from __future__ import annotations

import functools
import heapq
import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

SkewKind = Literal["uniform", "zipf", "histogram"]

# Layers sampled to average the per-layer straggler (each layer gets its own hot experts).
SAMPLED_LAYERS = 12


class ExpertLoadSpec(BaseModel):
    """How tokens spread over experts, and how that changes over time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    skew: SkewKind = Field("zipf", description="uniform | zipf (popularity ~ rank^-zipf_s) | histogram (measured)")
    zipf_s: float = Field(0.63, ge=0.0, le=4.0, description="Zipf exponent of expert popularity (0.63 fits TensorRT-LLM's DeepSeek-R1 EP32 data)")
    histogram: tuple[float, ...] = Field((), description="measured tokens per expert (any scale), one entry per routed expert")
    drift_fraction_per_min: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of experts whose popularity swaps with another expert's per minute (0: stable, as TensorRT-LLM observed over hundreds of steps)",
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="which experts are hot, and how they drift")

    @model_validator(mode="after")
    def _check(self) -> "ExpertLoadSpec":
        if self.skew == "histogram":
            if not self.histogram:
                raise ValueError("histogram: required when skew is 'histogram' (tokens per expert)")
            if any(x < 0 or not math.isfinite(x) for x in self.histogram) or sum(self.histogram) <= 0:
                raise ValueError("histogram: entries must be finite, >= 0 and not all zero")
        elif self.histogram:
            raise ValueError(f"histogram: only used when skew is 'histogram' (skew is {self.skew!r})")
        return self

    def base_popularity(self, n_experts: int) -> np.ndarray:
        """Popularity of each expert (sums to 1), hottest first, before any permutation."""
        if self.skew == "uniform":
            return np.full(n_experts, 1.0 / n_experts)
        if self.skew == "zipf":
            p = np.arange(1, n_experts + 1, dtype=float) ** -self.zipf_s
            return p / p.sum()
        h = np.asarray(self.histogram, float)
        if h.size != n_experts:
            from twinfer.errors import TwinferError

            raise TwinferError(f"histogram: has {h.size} entries, the model has {n_experts} routed experts")
        return np.sort(h)[::-1] / h.sum()


# ----------------------------------------------------------------------------- placement
def contiguous_placement(n_experts: int, ep: int) -> list[np.ndarray]:
    """Expert ids per rank without EPLB: consecutive ids, ``n_experts / ep`` per rank."""
    return [a for a in np.array_split(np.arange(n_experts), ep)]


def eplb_placement(popularity: np.ndarray, ep: int, redundant: int) -> list[np.ndarray]:
    """DeepSeek EPLB-style placement: replicate the hottest experts, then pack replicas onto ranks.

    Replication: each extra replica goes to the expert with the largest load per replica.
    Packing: replicas sorted by load, heaviest first, each onto the least-loaded rank that
    still has a free slot (every rank holds ``(E + redundant) / ep`` slots, as in
    github.com/deepseek-ai/EPLB ``balanced_packing``). Deterministic: ties go to lower ids.
    """
    n = popularity.size
    copies = np.ones(n, np.int64)
    heap = [(-float(popularity[e]), e) for e in range(n)]
    heapq.heapify(heap)
    for _ in range(redundant):
        _, e = heapq.heappop(heap)
        copies[e] += 1
        heapq.heappush(heap, (-float(popularity[e]) / copies[e], e))
    items = []
    for e in range(n):
        items.extend([(float(popularity[e]) / copies[e], e)] * int(copies[e]))
    items.sort(key=lambda x: (-x[0], x[1]))
    slots = [len(a) for a in np.array_split(np.arange(n + redundant), ep)]
    load = [0.0] * ep
    ranks: list[list[int]] = [[] for _ in range(ep)]
    open_heap = [(0.0, r) for r in range(ep)]
    for w, e in items:
        while True:
            l, r = heapq.heappop(open_heap)
            if len(ranks[r]) < slots[r]:
                break
        ranks[r].append(e)
        load[r] = l + w
        if len(ranks[r]) < slots[r]:
            heapq.heappush(open_heap, (load[r], r))
    return [np.asarray(sorted(x), np.int64) for x in ranks]


def _per_replica(popularity: np.ndarray, placement: list[np.ndarray]) -> np.ndarray:
    """Each expert's share of all assignments per replica of it (replicas split their expert's load evenly)."""
    copies = np.zeros(popularity.size)
    for ids in placement:
        np.add.at(copies, ids, 1.0)
    return popularity / np.maximum(copies, 1.0)


def rank_shares(popularity: np.ndarray, placement: list[np.ndarray]) -> np.ndarray:
    """Share of all token-expert assignments each rank receives (replicas split their expert's load evenly)."""
    per_replica = _per_replica(popularity, placement)
    return np.array([per_replica[ids].sum() for ids in placement])


def slot_shares(popularity: np.ndarray, placement: list[np.ndarray]) -> np.ndarray:
    """``[ranks, slots]``: the share of all assignments each expert slot of each rank receives (replicas split their
    expert's load evenly), zero-padded where a rank holds fewer slots."""
    per_replica = _per_replica(popularity, placement)
    out = np.zeros((len(placement), max(len(ids) for ids in placement)))
    for r, ids in enumerate(placement):
        out[r, :len(ids)] = per_replica[ids]
    return out


def expected_touched(shares: np.ndarray, assignments) -> np.ndarray:
    """Expected distinct slots touched on the rank that reads the most experts, for ``assignments`` token-expert
    assignments (each lands on a slot with that slot's share of all assignments): ``max_rank sum_slots 1 - (1 - q)^n``,
    mean over layers. ``shares`` is ``[ranks, slots]`` or ``[layers, ranks, slots]`` (zero-padded); a uniform spread
    over E experts gives ``slots * (1 - (1 - 1/E)^n)``. Under skew the rank with the hot experts takes the most tokens
    but reads fewer distinct experts than a rank of lukewarm ones: a decode step's weight reads wait for the latter."""
    q = np.clip(np.asarray(shares, float), 0.0, 1.0)
    q = q[None] if q.ndim == 2 else q
    n = np.maximum(np.asarray(assignments, float), 0.0)
    flat = n.reshape(-1)
    # 1 - (1 - q)^v = -expm1(v log1p(-q)): one multiply and one expm1 a count; empty slots (q = 0) give 0
    with np.errstate(divide="ignore"):
        log_miss = np.log1p(-q)
    out = np.zeros(flat.size)
    # counts in chunks: [chunk, layers, ranks, slots] stays under ~4M elements at any shape and batch
    chunk = max(1, (1 << 22) // max(q.size, 1))
    live = np.flatnonzero(flat > 0)          # no assignment touches nothing (and 0 * log(0) is not a number)
    for lo in range(0, live.size, chunk):
        idx = live[lo:lo + chunk]
        hit = -np.expm1(flat[idx, None, None, None] * log_miss[None])
        out[idx] = hit.sum(axis=3).max(axis=2).mean(axis=1)
    return out.reshape(n.shape)


def expected_max_share(shares: np.ndarray, assignments: float) -> np.ndarray | float:
    """E[max over ranks of assignments received] / assignments, with binomial sampling noise.

    ``shares`` is one rank-share vector ``[ep]`` or a stack ``[layers, ep]`` (one result per
    layer). Each rank's count is ~ Normal(N q, N q (1 - q)) (independent ranks: a slight
    overestimate of the noise, since counts are negatively correlated); E[max] is integrated
    numerically from the largest mean up: ``E[max] ~= lo + int_lo^hi (1 - F(x)) dx``.
    """
    from scipy.special import ndtr

    q = np.atleast_2d(np.asarray(shares, float))
    n = float(assignments)
    if n <= 0:
        out = q.max(axis=1)
    else:
        mu = n * q
        sd = np.sqrt(np.maximum(n * q * (1.0 - q), 1e-12))
        lo = mu.max(axis=1)
        hi = (mu + 8.0 * sd).max(axis=1)
        t = np.linspace(0.0, 1.0, 65)
        x = lo[:, None] + (hi - lo)[:, None] * t[None, :]                   # [layers, grid]
        z = (x[:, :, None] - mu[:, None, :]) / sd[:, None, :]                # [layers, grid, ep]
        cdf = np.exp(np.log(np.maximum(ndtr(z), 1e-300)).sum(axis=2))
        tail = np.trapezoid(1.0 - cdf, x, axis=1)
        out = (lo + tail) / n
    return out if np.ndim(shares) == 2 else float(out[0])


# ----------------------------------------------------------------------------- the load model
class ExpertLoad:
    """Expert popularity per sampled layer at one moment, its placement, and the straggler it causes.

    ``popularity[l]`` is layer l's per-expert share; ``placement[l]`` its expert ids per rank.
    Build one with :meth:`initial`, then :meth:`drifted` for a later moment and
    :meth:`rebalanced` for EPLB's new placement.
    """

    def __init__(self, popularity: np.ndarray, placements: list[list[np.ndarray]], ep: int, redundant: int, eplb: bool):
        self.popularity = popularity      # [layers, experts]
        self.placements = placements      # per layer: expert ids per rank
        self.ep, self.redundant, self.eplb = ep, redundant, eplb
        self.shares = np.array([rank_shares(p, pl) for p, pl in zip(popularity, placements)])  # [layers, ep]
        self.slot_shares = np.stack([slot_shares(p, pl) for p, pl in zip(popularity, placements)])  # [layers, ep, slots]
        self._memo: dict[int, float] = {}
        self._touched_memo: dict[float, float] = {}

    @staticmethod
    def initial(spec: ExpertLoadSpec, n_experts: int, ep: int, redundant: int = 0, eplb: bool | None = None) -> "ExpertLoad":
        """The load at time 0: each sampled layer's popularity is the spec's shape, randomly permuted."""
        eplb = redundant > 0 if eplb is None else eplb
        base = spec.base_popularity(n_experts)
        rng = np.random.default_rng([spec.seed, 0x4D6F45])
        pop = np.stack([base[rng.permutation(n_experts)] for _ in range(SAMPLED_LAYERS)])
        return ExpertLoad(pop, _place(pop, ep, redundant, eplb), ep, redundant, eplb)

    def drifted(self, spec: ExpertLoadSpec, minutes: float, step_index: int) -> "ExpertLoad":
        """The popularity ``minutes`` later: a share of experts swap popularity (placement unchanged)."""
        frac = min(1.0, spec.drift_fraction_per_min * minutes)
        if frac <= 0:
            return self
        rng = np.random.default_rng([spec.seed, 0x445249, step_index])
        pop = self.popularity.copy()
        n = pop.shape[1]
        k = int(round(frac * n))
        for layer in range(pop.shape[0]):
            movers = rng.choice(n, size=k, replace=False)
            targets = rng.permutation(n)[:k]
            for a, b in zip(movers.tolist(), targets.tolist()):
                pop[layer, a], pop[layer, b] = pop[layer, b], pop[layer, a]
        return ExpertLoad(pop, self.placements, self.ep, self.redundant, self.eplb)

    def rebalanced(self) -> "ExpertLoad":
        """EPLB's new placement for the current popularity (the statistics it has just collected)."""
        return ExpertLoad(self.popularity, _place(self.popularity, self.ep, self.redundant, True), self.ep, self.redundant, True)

    def moved_slots(self, other: "ExpertLoad") -> float:
        """Busiest rank's expert slots that changed between ``other``'s placement and this one, per layer (mean over layers)."""
        moved = []
        for new, old in zip(self.placements, other.placements):
            moved.append(max(len(set(a.tolist()) - set(b.tolist())) for a, b in zip(new, old)))
        return float(np.mean(moved))

    def imbalance(self, assignments: float) -> float:
        """Busiest rank's assignments over the mean (>= 1), mean over sampled layers, for a step routing ``assignments``."""
        if self.ep <= 1:
            return 1.0
        # memo on a 5% geometric grid of the assignment count: the value varies smoothly with it
        key = int(round(math.log(max(assignments, 1.0)) / math.log(1.05)))
        v = self._memo.get(key)
        if v is None:
            n = 1.05 ** key
            v = float(np.mean(expected_max_share(self.shares, n))) * self.ep
            v = max(v, 1.0)
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[key] = v
        return v

    def __call__(self, assignments: float) -> float:
        """``imbalance(assignments)``: an ExpertLoad is the ``expert_load`` callable StepCostModel takes."""
        return self.imbalance(assignments)

    def many(self, assignments: np.ndarray) -> np.ndarray:
        """``imbalance`` at each element (the same 5% grid memo, one computation per distinct grid point)."""
        a = np.maximum(np.asarray(assignments, float), 1.0)
        keys = np.rint(np.log(a) / math.log(1.05)).astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        vals = np.array([self.imbalance(1.05 ** int(k)) for k in uniq.tolist()])
        return vals[inv] if self.ep > 1 else np.ones_like(a)

    def touched(self, assignments: np.ndarray) -> np.ndarray:
        """Expected distinct expert slots read by the rank that reads the most, at each element of ``assignments``
        (mean over sampled layers; :func:`expected_touched`)."""
        a = np.asarray(assignments, float)
        uniq, inv = np.unique(a, return_inverse=True)
        memo = self._touched_memo
        todo = [v for v in uniq.tolist() if v not in memo]
        new = dict(zip(todo, expected_touched(self.slot_shares, np.array(todo)).tolist())) if todo else {}
        vals = np.array([new[v] if v in new else memo[v] for v in uniq.tolist()])
        if len(memo) + len(new) > 4096:
            memo.clear()
        memo.update(new)
        return vals[inv].reshape(a.shape)

    def static_imbalance(self) -> float:
        """The imbalance from popularity and placement alone (infinitely many assignments)."""
        return max(1.0, float(self.shares.max(axis=1).mean()) * self.ep)


def _place(pop: np.ndarray, ep: int, redundant: int, eplb: bool) -> list[list[np.ndarray]]:
    n = pop.shape[1]
    if not eplb:
        fixed = contiguous_placement(n, ep)
        return [fixed for _ in range(pop.shape[0])]
    return [eplb_placement(p, ep, redundant) for p in pop]


@functools.lru_cache(maxsize=256)
def cached_initial(spec: ExpertLoadSpec, n_experts: int, ep: int, redundant: int, eplb: bool) -> ExpertLoad:
    """:meth:`ExpertLoad.initial`, memoised (specs are frozen, so they hash)."""
    return ExpertLoad.initial(spec, n_experts, ep, redundant, eplb)
