"""Step times with the serving effects the plain StepCostModel leaves as constants.

``EffectiveStepCost`` has the StepCostModel interface the simulator and the planner use
(``mixed_step_time``, ``decode_times``, ``step_time``, ``memory``, ``notes``) and adds:

- **attention-DP imbalance per step**: a request lives on one attention-DP rank, and the
  step waits for the slowest rank. Where the scheduler assigned ranks (``scheduler.dp_attention``)
  the step is priced at those (``ranks=``); otherwise decodes are spread round-robin over ranks
  (plan order) and each prefill chunk goes to the least-loaded rank (``dp_ranks``, with the one
  placement rule of :mod:`costmodels.dp_ranks`). A rank's work is
  ``tokens * w_tok + kv_tokens_read * w_kv`` (marginal costs measured on the cost model
  itself), and the busiest rank's work over the mean becomes the StepCostModel's
  ``dp_imbalance`` for that step (quantised to 1%, one cached StepCostModel per level).
- **expert load** from :mod:`costmodels.moe_load` (skew, placement, EPLB, sampling noise)
  instead of the constant 1.2 / 1.05 default.
- **host-memory tables** (Engram / n-gram / vocabulary tables, ``ModelSpec.host_table_*``):
  looked up per token from host memory over the host link, or sharded over the instance's
  HBM and read peer-to-peer over scale-up links (which costs HBM: see :func:`fit_with_policies`).
  The lookups depend only on token ids, so with ``table_prefetch`` they are issued ahead and
  hide under the step (DeepSeek's Engram design: deterministic addressing allows prefetch);
  only the part longer than the step shows.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from costmodels.batch import BatchShape, decodes_then_chunks
from costmodels.calibration import CalibrationProfile
from costmodels.dp_ranks import place_largest_first
from costmodels.hardware import Hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import MemoryFit, memory_fit
from costmodels.model_spec import ModelSpec
from costmodels.moe_load import ExpertLoad
from costmodels.step import StepCostModel

# host: host memory, read over the host link (page size: TablePage); hbm: sharded over the instance's GPUs' HBM and
# read peer-to-peer over the scale-up links (NVLink peer shards); local: a whole copy in every GPU's HBM, read at HBM speed
TablePlacement = Literal["host", "hbm", "local"]
TablePage = Literal["2M", "64K"]
# Host-table reads are random rows (DeepSeek-V4.1 Engram: 264 B each) over a table of hundreds of GB. With 64 KB pages
# the GPU's TLB reach (thousands of entries x 64 KB: a few hundred MB) covers well under 1% of it, so nearly every row
# read misses and waits for a page walk; 2 MB pages (32x the reach, one walk level fewer) keep that off the critical
# path. ASSUMPTION (not measured here, no public figure found): 64 KB pages halve the sustained lookup bandwidth.
TABLE_64K_BW_FACTOR = 0.5


# the split the analytic DP pricing assumes; a run whose scheduler assigns ranks explicitly drops it (sim.effects.pricing_notes)
DP_SPLIT_NOTE = "attention-DP: each step waits for its busiest DP rank (decodes round-robin, prefill chunks to the least-loaded rank)"
_TABLE_WHERE = {"host": "host memory", "hbm": "HBM (sharded over the instance, NVLink peer reads)", "local": "HBM (a copy per GPU)"}


class EffectiveStepCost:
    """A StepCostModel family (one per DP-imbalance level) plus per-step effects; same interface."""

    def __init__(
        self,
        model: ModelSpec,
        hw: Hardware,
        layout: ParallelLayout,
        calibration: CalibrationProfile | None = None,
        *,
        expert_load: ExpertLoad | None = None,
        dp_balance: bool = True,
        table_placement: TablePlacement = "host",
        table_prefetch: bool = True,
        table_page: TablePage = "2M",
    ):
        self.model, self.hw, self.layout = model, hw, layout
        self.cal = calibration
        self.expert_load = expert_load
        self.dp_balance = dp_balance and layout.dp > 1
        self.table_placement = table_placement
        self.table_prefetch = table_prefetch
        self.table_page = table_page
        self._models: dict[float, StepCostModel] = {}
        self.base = self._at(1.0)
        self.notes = list(self.base.notes)
        if expert_load is not None and layout.ep > 1:
            self.notes.append(
                f"expert load: busiest EP rank {expert_load.static_imbalance():.2f}x the mean before sampling noise "
                f"({'EPLB' if expert_load.eplb else 'contiguous'} placement, {layout.eplb_redundant_experts} redundant experts)"
            )
        if self.dp_balance:
            self.notes.append(DP_SPLIT_NOTE)
        self._w_tok, self._w_kv = self._marginal_costs() if self.dp_balance else (1.0, 0.0)
        self._table_bw = self._table_bandwidth()
        if self._table_bw:
            self.notes.append(
                f"{model.host_table_bytes / 1e9:.0f} GB lookup tables in {_TABLE_WHERE[table_placement]}"
                + (f" ({table_page}B pages)" if table_placement == "host" else "") + ": "
                f"{model.host_table_bytes_per_token / 1024:.1f} KiB per token at {self._table_bw / 1e9:.0f} GB/s"
                + (", prefetched under the step" if table_prefetch else "")
            )

    # ------------------------------------------------------------------ pieces
    def _at(self, dp_imbalance: float) -> StepCostModel:
        m = self._models.get(dp_imbalance)
        if m is None:
            base = self._models.get(1.0)
            if base is not None:   # the same model as built below (one StepCostModel per level: only its share differs)
                m = base.at_dp_imbalance(dp_imbalance)
            else:
                load = self.expert_load  # an ExpertLoad: callable, with a vectorised ``many``
                m = StepCostModel(self.model, self.hw, self.layout, self.cal, dp_imbalance=dp_imbalance, expert_load=load)
            self._models[dp_imbalance] = m
        return m

    def _marginal_costs(self) -> tuple[float, float]:
        """Seconds per extra token computed and per extra KV token read, on one DP rank (uniform spread)."""
        b = self.base
        dp = self.layout.dp
        n = 8 * dp
        t0 = float(b.decode_times(np.full(n, 2048.0), 1)[0])
        t1 = float(b.decode_times(np.full(n, 6144.0), 1)[0])
        w_kv = max(t1 - t0, 0.0) / (n * 4096.0 / dp)
        base_new = np.full(n, 1, np.int64)
        ctx = np.full(n, 2048, np.int64)
        dec = np.ones(n, bool)

        def mixed(chunk: int) -> float:
            new = np.concatenate([base_new, [chunk]])
            return b.mixed_step_time(new, np.concatenate([ctx, [0]]), np.concatenate([dec, [False]]))

        # one chunk spread evenly over ranks in this uniform model: per-rank tokens = chunk / dp
        w_tok = max(mixed(4096) - mixed(2048), 1e-12) / (2048.0 / dp)
        return w_tok, w_kv

    def _table_bandwidth(self) -> float:
        m, hw = self.model, self.hw
        if m.host_table_bytes <= 0 or m.host_table_bytes_per_token <= 0:
            return 0.0
        if self.table_placement == "host":
            return hw.host_bw * self.base.cal.comm_eff * (TABLE_64K_BW_FACTOR if self.table_page == "64K" else 1.0)
        if self.table_placement == "local":
            return hw.hbm_bw * self.base.cal.mem_eff
        return hw.scaleup_bw * self.base.cal.comm_eff

    def _table_time(self, tokens_rank: float) -> float:
        if not self._table_bw or tokens_rank <= 0:
            return 0.0
        return tokens_rank * self.model.host_table_bytes_per_token / self._table_bw + self.base.cal.p2p_latency_s

    def dp_ranks(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray, work: np.ndarray | None = None) -> np.ndarray:
        """The rank of each request of a batch that carries no ranks of its own: decodes round-robin in
        plan order, then prefill chunks longest first, each to the least-loaded rank (costmodels.dp_ranks).
        ``work``: each request's ``_work`` where the caller already has it."""
        dp = self.layout.dp
        ranks = np.zeros(new.size, np.int64)
        di = np.flatnonzero(dec)
        ranks[di] = np.arange(di.size) % dp
        pi = np.flatnonzero(~dec)
        if pi.size:
            work = self._work(new, ctx) if work is None else work
            load = np.bincount(ranks[di], weights=work[di], minlength=dp).astype(float)
            ranks[pi] = place_largest_first(load, work[pi], size=new[pi])
        return ranks

    def _work(self, new: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """Each request's work on its rank: tokens computed * w_tok + KV tokens read * w_kv."""
        return new * self._w_tok + (ctx + new) * self._w_kv

    def ranked_imbalance(self, new: np.ndarray, ctx: np.ndarray, ranks: np.ndarray, work: np.ndarray | None = None) -> float:
        """Busiest rank's work over the mean when request i runs on rank ``ranks[i]`` (quantised to 1%, at most dp;
        ``work`` as in ``dp_ranks``)."""
        dp = self.layout.dp
        work = np.bincount(ranks, weights=self._work(new, ctx) if work is None else work, minlength=dp)
        mean = work.mean()
        if mean <= 0:
            return 1.0
        return min(float(dp), round(float(work.max() / mean), 2))

    def _ranked(self, new: np.ndarray, ctx: np.ndarray, ranks: np.ndarray) -> float:
        ranks = np.asarray(ranks, np.int64)
        if ranks.shape != new.shape or (ranks.size and (ranks.min() < 0 or ranks.max() >= self.layout.dp)):
            raise ValueError(f"ranks: one rank in [0, {self.layout.dp}) per request, got {ranks.size} for {new.size} requests")
        return self.ranked_imbalance(new, ctx, ranks)

    def dp_imbalance(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray) -> float:
        """Busiest attention-DP rank's work over the mean for this batch, split by ``dp_ranks`` (1.0 when dp == 1)."""
        if not self.dp_balance or new.size == 0:
            return 1.0
        work = self._work(new, ctx)  # once per step: the split and the imbalance read the same per-request work
        return self.ranked_imbalance(new, ctx, self.dp_ranks(new, ctx, dec, work), work)

    # ------------------------------------------------------------------ StepCostModel interface
    def memory(self) -> MemoryFit:
        return fit_with_policies(self.model, self.hw, self.layout, table_placement=self.table_placement)

    def mixed_step_time(self, new_tokens: np.ndarray, context_lens: np.ndarray, is_decode: np.ndarray,
                        ranks: np.ndarray | None = None) -> float:
        """Device time of one step: the busiest DP rank's, plus table lookups that do not hide. ``ranks``: the
        attention-DP rank of each request where the scheduler assigned them (scheduler.dp_attention), else
        the batch is split by ``dp_ranks``."""
        new = np.asarray(new_tokens, dtype=np.int64)
        if new.size == 0:
            return 0.0
        ctx = np.asarray(context_lens, dtype=np.int64)
        dec = np.asarray(is_decode, dtype=bool)
        imb = self.dp_imbalance(new, ctx, dec) if ranks is None else self._ranked(new, ctx, ranks)
        t = self._at(imb).mixed_step_time(new, ctx, dec)
        return self._with_tables(t, float(new.sum()) * imb / self.layout.dp)

    def chunked_step_time(self, decode_context_lens: np.ndarray, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        """``mixed_step_time`` of decodes (1 + draft_len tokens each) followed by prefill chunks (StepCostModel.chunked_step_time)."""
        nd = len(decode_context_lens)
        if self.dp_balance:  # the DP split needs the per-request arrays
            return self.mixed_step_time(*decodes_then_chunks(decode_context_lens, draft_len, prefill_new, prefill_ctx))
        return self._chunked_tables(self.base.chunked_step_time(decode_context_lens, draft_len, prefill_new, prefill_ctx),
                                    nd, draft_len, prefill_new)

    def _chunked_tables(self, t: float, nd: int, draft_len: int, prefill_new: list[int]) -> float:
        """A chunked step's time with the host/peer embedding-table reads of its tokens (if any)."""
        if not self._table_bw:
            return t
        return self._with_tables(t, float(nd * (1 + draft_len) + sum(prefill_new)) * 1.0 / self.layout.dp)

    @property
    def mixed_sum_only(self) -> bool:
        """``chunked_step_time_sum`` is exact (StepCostModel.mixed_sum_only, and no DP split needing the contexts)."""
        return not self.dp_balance and getattr(self.base, "mixed_sum_only", False)

    def chunked_step_time_sum(self, nd: int, dctx_sum: int, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        """``chunked_step_time`` from the decodes' count and context sum (only where ``mixed_sum_only``)."""
        return self._chunked_tables(self.base.chunked_step_time_sum(nd, dctx_sum, draft_len, prefill_new, prefill_ctx),
                                    nd, draft_len, prefill_new)

    def step_time(self, batch: BatchShape) -> float:
        return self.mixed_step_time(batch.new_tokens, batch.context_lens, batch.is_decode)

    def decode_times(self, context_lens: np.ndarray, num_steps: int, draft_len: int = 0,
                     ranks: np.ndarray | None = None) -> np.ndarray:
        """Times of ``num_steps`` decode steps (the DP split of the first step holds for the run; ``ranks``
        as in ``mixed_step_time``)."""
        ctx = np.asarray(context_lens, dtype=float)
        if ctx.size == 0 or num_steps <= 0:
            return np.zeros(max(num_steps, 0))
        g = 1 + draft_len
        new, ctx_i = np.full(ctx.size, g, np.int64), ctx.astype(np.int64)
        if ranks is not None:
            imb = self._ranked(new, ctx_i, ranks)
        else:
            imb = self.dp_imbalance(new, ctx_i, np.ones(ctx.size, bool)) if self.dp_balance else 1.0
        t = np.asarray(self._at(imb).decode_times(ctx, num_steps, draft_len), float)
        lookup = self._table_time(ctx.size * g * imb / self.layout.dp)
        if not lookup:
            return t
        return np.maximum(t, lookup) if self.table_prefetch else t + lookup

    def _with_tables(self, t: float, tokens_rank: float) -> float:
        lookup = self._table_time(tokens_rank)
        if not lookup:
            return t
        return max(t, lookup) if self.table_prefetch else t + lookup


def batch_dp_split(model: ModelSpec, hw: Hardware, layout: ParallelLayout, batch: BatchShape,
                   calibration: CalibrationProfile | None = None,
                   expert_load: ExpertLoad | None = None) -> tuple[float, np.ndarray]:
    """The attention-DP imbalance the simulator prices ``batch`` at where no scheduler assigned ranks, and the rank
    of each request: placed by ``EffectiveStepCost.dp_ranks`` (a request lives on one rank: 1 prompt on 8 ranks is
    8, 64 decodes 1.0). What ``twinfer cost`` and the app's step breakdown take when no imbalance is given."""
    if layout.dp <= 1 or batch.num_requests == 0:
        return 1.0, np.zeros(batch.num_requests, np.int64)
    cost = EffectiveStepCost(model, hw, layout, calibration, expert_load=expert_load)
    new, ctx, dec = batch.new_tokens, batch.context_lens, batch.is_decode
    ranks = cost.dp_ranks(new, ctx, dec)
    return cost.ranked_imbalance(new, ctx, ranks), ranks


def batch_dp_imbalance(model: ModelSpec, hw: Hardware, layout: ParallelLayout, batch: BatchShape,
                       calibration: CalibrationProfile | None = None, expert_load: ExpertLoad | None = None) -> float:
    """``batch_dp_split``'s imbalance (1.0 when dp == 1)."""
    return batch_dp_split(model, hw, layout, batch, calibration, expert_load)[0]


def fit_with_policies(
    model: ModelSpec,
    hw: Hardware,
    layout: ParallelLayout,
    *,
    table_placement: TablePlacement = "host",
    **fit_kw,
) -> MemoryFit:
    """``memory_fit`` with lookup tables in HBM (less room for KV): sharded over the instance's GPUs when
    ``table_placement == 'hbm'``, a whole copy on every GPU when ``'local'``."""
    if table_placement == "host" or model.host_table_bytes <= 0:
        return memory_fit(model, hw, layout, **fit_kw)
    extra = model.host_table_bytes / (layout.gpus if table_placement == "hbm" else 1)
    fit = memory_fit(model, hw, layout, hbm_table_bytes=extra, **fit_kw)
    where = "sharded into" if table_placement == "hbm" else "copied to every GPU in"
    return fit.model_copy(update={"explanation": f"{fit.explanation} (lookup tables {where} HBM)"})
