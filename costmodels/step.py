"""Device time of one forward step of a batch under a parallel layout: the StepCostModel.

The ops and their assumptions are in :mod:`costmodels.step_ops`; here they are summed. A step's
non-attention time is a sum of op families each depending on one token count, so it is read
from tables of those families over every integer count (``_fill``: the table is the model);
attention reads per-request contexts and is summed in closed form per chunk (``_attn_fast``) or
per decode step (``StepOps.attention_decode_steps``). ``step`` (the breakdown, with the op list)
evaluates the same families at the batch's one point.

Two micro-batches (``layout.two_micro_batch`` with ep > 1): each half's EP all-to-all hides
under the other half's compute: ``max(2 Tc, 2 Tm) + min(Tc, Tm) / layers`` with Tc, Tm the
compute and all-to-all time of one half (weights are read once per half), Tc slowed where it runs beside
the all-to-all by the SMs DeepEP's kernels hold (``StepOps.tbo_time``).
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_right
from typing import Callable

import numpy as np

from costmodels.batch import BatchShape, decodes_then_chunks
from costmodels.calibration import CalibrationProfile
from costmodels.memory import MemoryFit, memory_fit
from costmodels.ops import CATEGORIES, INF, AttnGeometry, OpCost, SortedSums, StepCost
from costmodels.step_ops import A2A, KV_UP, SAMPLED, StepOps

# tables of the fast path (see StepCostModel._fill): which op families each one sums
_T_MAIN, _T_KV, _T_SAMPLED, _T_MTP, _T_LOGITS, _T_MAIN_PF = range(6)  # _T_MAIN_PF: main terms of a step with prefill (EP normal dispatch)
_T_DEC, _T_DEC_PF = 6, 7  # a CED model: _T_MAIN(_PF) hold its encoder layers (+ embedding), these its decoder layers
_T_KV_PF = 8  # _T_KV in small blocks: the K/V up-projected tokens of a step with prefill (its cached context included)
_TBL_BITS = 9
_TBL = 1 << _TBL_BITS  # points per lazily built table block
_TBL_MASK = _TBL - 1
_ZEROS = [0.0] * _TBL
# Steps with prefill land far apart (a chunk's tokens, or its cached context, move the count by thousands), so a
# block of theirs serves one or two lookups: those kinds are filled in blocks of _PF_TBL points (a fill costs mostly
# numpy's per-call overhead, plus a part per point). Every point's value is the same at any block size (elementwise).
_PF_BITS = 4
_PF_TBL = 1 << _PF_BITS
_PF_MASK = _PF_TBL - 1
_SMALL = (_T_MAIN_PF, _T_KV_PF)


class StepCostModel(StepOps):
    """Step times of ``model`` on ``hw`` under ``layout``; everything that depends only on those is built once here."""

    def _post_init(self) -> None:
        """The notes, caches and fast-path tables (``StepOps.__init__`` takes the arguments and calls this last)."""
        hw, layout = self.hw, self.layout
        self.notes = list(self.cal.notes)
        self.notes += [n for n in (self.gemm_table_note(), self.expert_note(), self.mhc_note(), self.attention_table_note(), self.exp_bound_note()) if n]
        if hw.name.lower() != self.cal.measured_on.lower() and not any("scaled" in n for n in self.notes):
            self.notes.append(f"efficiencies measured on {self.cal.measured_on}, applied to {hw.name} datasheet ceilings (scaled by datasheet ratios)")
        if not hw.supports(layout.experts_dtype) or not hw.supports(layout.weight_dtype):
            self.notes.append(f"{hw.name} has no FP4 tensor cores: FP4 weights are read as FP4 but multiplied at the FP8 rate")
        if layout.kv_dtype == "fp4" and not hw.supports("fp4"):
            self.notes.append(f"an FP4 KV cache on {hw.name}, which has no FP4 tensor cores: priced as the bytes it reads "
                              "(engines that serve one, TensorRT-LLM's NVFP4 KV cache, need Blackwell)")
        self._cache: dict = {}
        self._fit: MemoryFit | None = None
        self._build_fast()

    def at_dp_imbalance(self, dp_imbalance: float) -> "StepCostModel":
        """This model at another attention-DP imbalance: equal to ``StepCostModel(model, hw, layout, cal,
        dp_imbalance=..., expert_load=...)`` with this one's arguments, without rebuilding what does not depend on
        it. Only ``share`` does (StepOps.__init__); the ops, geometry, GEMM/attention tables and their memos are
        shared, and the per-level caches (step memo, table blocks) start empty."""
        m = copy.copy(self)
        m.dp_imbalance = max(1.0, dp_imbalance) if self.layout.dp > 1 else 1.0
        m.share = m.dp_imbalance / self.layout.dp
        m._cache = {}
        m._tables = {}
        m._pf_tables = {}
        m._fit = None
        m.notes = list(self.notes)
        return m

    # ------------------------------------------------------------------ public API
    def memory(self) -> MemoryFit:
        """Memory fit of this model/hardware/layout with default reserves."""
        if self._fit is None:
            self._fit = memory_fit(self.model, self.hw, self.layout)
        return self._fit

    def step(self, batch: BatchShape) -> StepCost:
        """Full cost of one step: time, breakdown by category, and the op list."""
        new, ctx, dec = batch.new_tokens, batch.context_lens, batch.is_decode
        if batch.num_requests == 0:
            return StepCost(0.0, {c: 0.0 for c in CATEGORIES}, [], list(self.notes))
        draft = self.draft_of(new, dec)
        ops: list[OpCost] = []
        tbo = self.tbo_applies(batch.num_requests)
        f = 0.5 if tbo else 1.0
        v = self.nonattn(*self.counts(new, ctx, dec, draft), f, ops, dec_total=self.ced_tokens(new, dec)) \
            + self.attention(new, ctx, dec, draft, f, ops)
        t, breakdown = self._combine(v, tbo, bool((~dec).any()))
        if tbo:
            for o in ops:
                o.count *= 2
                o.flops *= 2
                o.bytes *= 2
                o.time_s *= 2
        t = self.prefetch_into(t, breakdown, ops)  # offloaded weights (costmodels.offload); t itself without
        ops.sort(key=lambda o: -o.time_s)
        notes = list(self.notes)
        if tbo:
            notes.append("two micro-batches: op times are two halves; all-to-all hidden under compute is subtracted from 'communication'")
            slow = self.comm_sm_slowdown(bool((~dec).any()))
            if slow > 1.0:
                notes.append(f"compute beside DeepEP's normal kernels runs on {self.hw.sm_count - self.cal.deepep_normal_sms} of "
                             f"{self.hw.sm_count} SMs (x{slow:.2f} where it overlaps the other half's all-to-all; the added "
                             "time shows under 'communication')")
        return StepCost(t, breakdown, ops, notes)

    def step_time(self, batch: BatchShape) -> float:
        """Step time only (no op list)."""
        return self.mixed_step_time(batch.new_tokens, batch.context_lens, batch.is_decode)

    def mixed_step_time(self, new_tokens: np.ndarray, context_lens: np.ndarray, is_decode: np.ndarray) -> float:
        """Step time of a batch given as arrays (same model as ``step``).

        Computed from batch summaries (token totals, context sums, the prefill chunks) with
        tabulated non-attention times (``_fast_time``); equal to the op-by-op evaluation
        (``_mixed_step_time_reference``) up to float rounding.
        """
        new = np.asarray(new_tokens, dtype=np.int64)
        n = new.size
        if n == 0:
            return 0.0
        ctx = np.asarray(context_lens, dtype=np.int64)
        dec = np.asarray(is_decode, dtype=bool)
        nd = int(np.count_nonzero(dec))
        if nd == n:
            dnew, dctx, pn, pc = new, ctx, [], []
        elif nd == 0:
            return self._fast_time(0, 0, None, 0, new.tolist(), ctx.tolist()) if new.min() >= 0 and new.any() else self._mixed_step_time_reference(new, ctx, dec)
        elif self.gqa_walks and not dec[:nd].all():
            # a GQA varlen call hands its tiles out in batch order (StepOps.gqa_chain_floor's ``work``): a batch
            # whose chunks come before its decodes is priced in its own order; the summaries below are decodes first
            return self._mixed_step_time_reference(new, ctx, dec)
        else:
            pre = ~dec
            dnew, dctx, pn, pc = new[dec], ctx[dec], new[pre].tolist(), ctx[pre].tolist()
        g = int(dnew.max())
        if g < 1 or int(dnew.sum()) != nd * g or (pn and min(pn) < 0):
            # decodes verifying different draft lengths (or odd inputs): the op-by-op evaluation
            return self._mixed_step_time_reference(new, ctx, dec)
        return self._fast_time(nd, g - 1, dctx, int(dctx.sum()), pn, pc)

    def chunked_step_time(self, decode_context_lens: np.ndarray, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        """``mixed_step_time`` of decodes (1 + draft_len new tokens each, contexts ``decode_context_lens``)
        followed by prefill chunks (``prefill_new`` tokens on ``prefill_ctx`` cached ones): no arrays to build."""
        nd = len(decode_context_lens)
        if nd == 0:
            if not prefill_new:
                return 0.0
            if sum(prefill_new) <= 0:
                return self.mixed_step_time(prefill_new, prefill_ctx, np.zeros(len(prefill_new), bool))
            return self._fast_time(0, 0, None, 0, prefill_new, prefill_ctx)
        return self._fast_time(nd, draft_len, decode_context_lens, int(np.add.reduce(decode_context_lens)), prefill_new, prefill_ctx)

    @property
    def mixed_sum_only(self) -> bool:
        """True when a step with prefill chunks depends on the decodes' contexts only through their sum
        (every layer kind reads every cached entry, no measured prefill table, no FlashAttention-3 key walk: its
        longest walk reads each decode's context): ``chunked_step_time_sum``."""
        return self._attn_simple and not self._pre_table and not self.gqa_walks

    def chunked_step_time_sum(self, nd: int, dctx_sum: int, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        """``chunked_step_time`` from the number of decodes and their context sum (only where ``mixed_sum_only``)."""
        if nd == 0:
            return self.chunked_step_time(np.zeros(0, np.int64), draft_len, prefill_new, prefill_ctx)
        return self._fast_time(nd, draft_len, None, dctx_sum, prefill_new, prefill_ctx)   # (contexts unused: simple attention)

    def _mixed_step_time_reference(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray) -> float:
        """``mixed_step_time`` op by op (the ``step`` arithmetic without the op list): the fast path's reference."""
        if new.size == 0:
            return 0.0
        draft = self.draft_of(new, dec)
        tbo = self.tbo_applies(new.size)
        f = 0.5 if tbo else 1.0
        key = self.counts(new, ctx, dec, draft) + (f,)
        dtot = self.ced_tokens(new, dec)
        if dtot is not None:
            key = key + (dtot,)
        v = self._cache.get(key)
        if v is None:
            v = self.nonattn(*key[:7], dec_total=dtot)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = v
        v = v + self.attention(new, ctx, dec, draft, f, None)
        return self.prefetched(self._combine(v, tbo, bool((~dec).any()))[0])

    def decode_times(self, context_lens: np.ndarray, num_steps: int, draft_len: int = 0) -> np.ndarray:
        """Times of ``num_steps`` consecutive decode steps of the same requests, context growing by 1 + draft_len a step.

        Equal to calling ``step_time`` once per step; only attention and the indexer depend on
        the context, so everything else is read from the tables once and the attention terms are
        evaluated for all steps at once.
        """
        ctx = np.asarray(context_lens, dtype=float)
        n = ctx.size
        if n == 0 or num_steps <= 0:
            return np.zeros(max(num_steps, 0))
        g = 1 + draft_len
        tbo = self.layout.two_micro_batch and self.layout.ep > 1 and n >= 2
        f = 0.5 if tbo else 1.0
        t, tm = self._tabulated(f, n * g, n * g, n * g, n, draft_len, False)
        shifts = np.arange(0.0, num_steps * g, g)[:num_steps]
        sums = SortedSums(ctx + g)
        s = self.share * f
        geos = self.att_groups
        if draft_len and self.att_mtp is not None:
            geos = geos + [(self.att_mtp, draft_len * self.model.mtp_layers)]
        att = self.attention_decode_steps(geos, sums, shifts, g, s)
        if not tbo:
            return self.prefetched(t + att)
        compute = (t - tm) + att
        return self.prefetched(self.tbo_time(compute, tm, False))

    # ------------------------------------------------------------------ pieces
    def tbo_applies(self, n_requests: int) -> bool:
        """Whether two micro-batches overlap a step of ``n_requests`` requests: the layout asks for them, there is an
        EP exchange to hide, and the step has two requests to split."""
        return bool(self.layout.two_micro_batch and self.layout.ep > 1 and n_requests >= 2)

    @staticmethod
    def draft_of(new: np.ndarray, dec: np.ndarray) -> int:
        """Draft tokens the batch's decodes verify (the most of any)."""
        return int(new[dec].max()) - 1 if dec.any() else 0

    def counts(self, new, ctx, dec, draft) -> tuple:
        """What the non-attention ops depend on (``nonattn``'s arguments): token counts of the whole instance."""
        total = float(new.sum())
        n_dec = int(dec.sum())
        pre = ~dec
        if self.model.attention == "mla" and self.model.mla.kv_up_proj and self.model.indexer is None:
            kv_up = float(new[dec].sum() + (ctx[pre] + new[pre]).sum())
        else:
            kv_up = total
        sampled = float(new[dec].sum() + pre.sum())
        has_prefill = float(pre.any())
        return (total, kv_up, sampled, float(n_dec), float(draft), has_prefill)

    def _combine(self, v: np.ndarray, tbo: bool, prefill: bool = False) -> tuple[float, dict[str, float]]:
        """Step time and breakdown from category times (of one half-batch when ``tbo``; ``prefill``: the step has
        prefill, so DeepEP's normal kernels run and hold SMs beside the compute, ``StepOps.tbo_time``)."""
        if not tbo:
            return float(v[:6].sum()), {c: float(v[i]) for i, c in enumerate(CATEGORIES)}
        tm = float(v[A2A])
        tc = float(v[:6].sum()) - tm
        t = float(self.tbo_time(tc, tm, prefill))
        bd = {c: 2.0 * float(v[i]) for i, c in enumerate(CATEGORIES)}
        hidden = 2 * tc + 2 * tm - t
        bd["communication"] = max(0.0, bd["communication"] - hidden)
        return t, bd

    # ------------------------------------------------------------------ tables and the fast path
    # A step's non-attention time is a sum of op families each depending on one token count: the
    # instance's tokens (GEMMs on every token, routed experts, norms, TP/EP communication), the
    # K/V up-projected tokens, the sampled tokens, the MTP passes' tokens and the tokens whose
    # logits are sampled (StepOps.main_terms, gemms, mtp_terms, sampling). Each is tabulated at
    # every integer count (exact: the counts are integers), in blocks of _TBL built on first use
    # by evaluating the families over the block. Attention reads only sums of contexts (closed
    # forms per chunk). A step then costs a few table lookups and scalar math.
    def _build_fast(self) -> None:
        m, lay, cal = self.model, self.layout, self.cal
        self._tables: dict[tuple, tuple[list[float], list[float]]] = {}
        self._pf_tables: dict[tuple, tuple[list[float], list[float]]] = {}   # the _SMALL kinds' blocks
        self._tbo_on = bool(lay.two_micro_batch and lay.ep > 1)
        self._kv_up_ctx = bool(m.attention == "mla" and m.mla.kv_up_proj and m.indexer is None)
        self._kv_rows = bool(self._src_rows[KV_UP].size)
        self._mtp_on = bool(m.mtp_layers)
        self._attn_t = _attn_timer(cal, self.hw.hbm_bw)
        self._attn_pre_t = _attn_timer(cal, self.hw.hbm_bw, streaming=self.decode_stream is not None)
        # a measured per-length prefill-attention table prices each chunk on its own: the op-by-op path does that
        self._pre_table = "attn_prefill_compute" in cal.tables or "attn_prefill_chunk" in cal.tables
        # steps with prefill price EP with DeepEP's normal kernels (per destination rank or node), decodes with the
        # low-latency ones, and measured routed experts with the contiguous grouped layout, decodes with the masked
        # one: separate tables whenever either applies (equal counts can still price apart)
        self._ep_split = bool(m.moe and (lay.ep > 1 or self.e_table is not None))
        h_loc = self.heads_local

        def consts(geo: AttnGeometry, count: float) -> tuple:
            return (count, geo.cap, geo.ratio, geo.window, geo.index_ratio,
                    2.0 * h_loc * (geo.d_qk_decode + geo.d_v_decode),
                    2.0 * h_loc * (geo.d_qk_prefill + geo.d_v_prefill),
                    geo.d_qk_prefill + geo.d_v_prefill, geo.prefill_upproj,
                    self.mla_table is not None and self.mla_covers(geo),   # decode one query each: the FlashMLA table
                    geo.index_cap,
                    self.att_den(geo.d_qk_decode, geo.d_v_decode),         # math rates: tensor peak or the SFU exponentials
                    self.att_den(geo.d_qk_prefill, geo.d_v_prefill),
                    geo if self.gqa_covers(geo) else None)                 # prefill chunks: the GQA table's

        self._geo_fast = [consts(geo, c) for geo, c in self.att_groups]
        self._geo_dec = list(self.att_dec)  # CED decoder groups: prefill chunks reach them as their tails
        self._geo_mtp = consts(self.att_mtp, 0) if self.att_mtp is not None else None
        # every layer kind reads every cached entry: attention depends on the decodes' contexts only through their sum
        self._attn_simple = all(g[1] >= INF and not g[3] and not g[4] for g in self._geo_fast + [self._geo_mtp] if g is not None)

    def _fast_time(self, nd: int, draft: int, dctx, dctx_sum: int, pn: list, pc: list) -> float:
        """Step time of ``nd`` decodes of 1 + draft tokens (contexts ``dctx``, summing to ``dctx_sum``) and prefill chunks (pn, pc)."""
        npre = len(pn)
        if npre and self._pre_table:
            return self._mixed_step_time_reference(*decodes_then_chunks(dctx if nd else None, draft, pn, pc))
        f = 0.5 if self._tbo_on and nd + npre >= 2 else 1.0
        g = draft + 1
        dnew = nd * g
        if npre == 1:
            pre_new, pre_ctx = pn[0], pc[0]
        elif npre:
            pre_new, pre_ctx = sum(pn), sum(pc)
        else:
            pre_new = pre_ctx = 0
        dec_total = None
        if self.ced and npre:
            tail = self.ced_tail
            dec_total = dnew + sum(n if n < tail else tail for n in pn)
        t, a2a = self._tabulated(f, dnew + pre_new, dnew + pre_new + pre_ctx if self._kv_up_ctx else dnew + pre_new, dnew + npre,
                                 nd, draft, bool(npre and self._ep_split), dec_total)
        t += self._attn_fast(nd, g, dctx, dctx_sum + dnew, pn, pc, pre_ctx + pre_new, self.share * f, draft)
        if f == 1.0:
            return self.prefetched(t)
        return self.prefetched(float(self.tbo_time(t - a2a, a2a, bool(npre))))

    def _tabulated(self, f: float, total: int, kv_up: int, sampled: int, nd: int, draft: int, prefill: bool,
                   dec_total: int | None = None) -> tuple[float, float]:
        """(seconds, all-to-all part) of everything but attention: a table lookup per token count (``_look``, inlined).
        A CED model's decoder layers are looked up at ``dec_total`` tokens (None: ``total``)."""
        tabs = self._tables
        if prefill:
            blk = self._pf_tables.get((_T_MAIN_PF, f, 0, total >> _PF_BITS)) or self._fill(_T_MAIN_PF, f, 0, total >> _PF_BITS)
            j = total & _PF_MASK
        else:
            blk = tabs.get((_T_MAIN, f, 0, total >> _TBL_BITS)) or self._fill(_T_MAIN, f, 0, total >> _TBL_BITS)
            j = total & _TBL_MASK
        t, a2a = blk[0][j], blk[1][j]
        if self.ced:
            td, ad = self._look(_T_DEC_PF if prefill else _T_DEC, f, 0, total if dec_total is None else int(dec_total))
            t, a2a = t + td, a2a + ad
        if self._kv_rows:
            if prefill:
                blk = self._pf_tables.get((_T_KV_PF, f, 0, kv_up >> _PF_BITS)) or self._fill(_T_KV_PF, f, 0, kv_up >> _PF_BITS)
                t += blk[0][kv_up & _PF_MASK]
            else:
                blk = tabs.get((_T_KV, f, 0, kv_up >> _TBL_BITS)) or self._fill(_T_KV, f, 0, kv_up >> _TBL_BITS)
                t += blk[0][kv_up & _TBL_MASK]
        if draft and nd:
            t += self._look(_T_SAMPLED, f, -1, sampled)[0]
            # sampling and the logits gather cover the sampled tokens and each decode's drafts
            t += self._look(_T_LOGITS, f, draft, sampled + nd * draft)[0]
            if self._mtp_on:
                tm, am = self._look(_T_MTP, f, draft, nd)
                t += tm
                a2a += am
        else:
            blk = tabs.get((_T_SAMPLED, f, 0, sampled >> _TBL_BITS)) or self._fill(_T_SAMPLED, f, 0, sampled >> _TBL_BITS)
            t += blk[0][sampled & _TBL_MASK]
        return t, a2a

    def _attn_fast(self, nd: int, g: int, dctx, dpos_sum: int, pn: list, pc: list, ends_all: int, s: float, draft: int) -> float:
        """Attention + indexer time of all layers (``StepOps.attention`` from sums): decodes at positions ctx + g,
        MTP passes (one query per decode at the end of its verified context), then the chunks (``ends_all``: their
        cached plus new tokens)."""
        attn_t, eb = self._attn_t, self.att_entry_bytes
        stream = self.decode_stream is not None   # decode rows off the FlashMLA table stream as its kernel does
        geos = self._geo_fast
        mtp = None
        if draft and nd and self._geo_mtp is not None:
            mtp = (draft * self.model.mtp_layers,) + self._geo_mtp[1:]
            geos = geos + [mtp]
        scored_all = walk_seqs = None
        out = 0.0
        shift, n_q = 0, g
        enc_chunks = (pn, pc, ends_all)
        dec_chunks = None
        if self.ced and pn:
            tail = self.ced_tail
            tn = [n if n < tail else tail for n in pn]
            dec_chunks = (tn, [c + n - t for c, n, t in zip(pc, pn, tn)], ends_all)
        for i, geo in enumerate(geos):
            if geo is mtp:
                shift, n_q = 1, 1
            elif dec_chunks is not None:
                pn, pc, ends_all = dec_chunks if self._geo_dec[i] else enc_chunks
                scored_all = walk_seqs = None
            count, cap, ratio, window, ir, cf_dec, cf_pre, dpre, upproj, table, icap, den_dec, den_pre, gqa = geo
            ta = ti = over_d = 0.0
            if nd:
                last = (dpos_sum + shift * nd if cap >= INF else self._dsum(dctx, g + shift, cap)) / ratio
                if window:
                    last += self._dsum(dctx, g + shift, window)
                if table:
                    ta = self.mla_for(n_q).at(nd * s, last / nd, cf_dec * (n_q * last) * s, last * eb * s)
                else:
                    fl, by = cf_dec * (n_q * last) * s, last * eb * s
                    if stream and (fl > 0 or by > 0):
                        a, b = fl / den_dec, self.stream_time(nd * s, by)
                        ta = a if a >= b else b   # the measured kernel's time holds its launch (attn_roofline)
                        if gqa is not None:   # its time over the roofline, shared with the chunks' (one varlen call)
                            over_d = self.gqa_decode_over(ta, fl, by, den_dec)
                    else:
                        ta = attn_t(fl, by, den_dec)
                if ir:
                    keys = ((dpos_sum + shift * nd) if icap >= INF else self._dsum(dctx, g + shift, icap)) / ir
                    ti = self._indexer_t(n_q * keys, keys, s)
            if pn and not shift:
                if cap >= INF and not window:  # every cached entry: closed forms of the whole chunk list
                    es = 0.0
                    for c, n in zip(pc, pn):
                        es += n * c + n * (n + 1) / 2
                    es /= ratio
                    ends = ends_all / ratio
                else:
                    es = ends = 0.0
                    for c, n in zip(pc, pn):
                        es += _sum_min_s(c, n, cap) / ratio + (_sum_min_s(c, n, window) if window else 0.0)
                        p = c + n
                        ends += min(p, cap) / ratio + (min(p, window) if window else 0.0)
                if gqa is not None:   # measured FlashAttention-3 chunks in one varlen kernel (StepOps.gqa_chunks_seconds)
                    t_c, parts = self.gqa_chunks_call(gqa, pn, pc, s, over_d)
                    if nd + len(pn) > 1 and self.gqa_walks:   # the longest key walk bounds the call (gqa_chain_floor)
                        if walk_seqs is None:   # the call's sequences, the same for every layer kind
                            keys = [c + n for c, n in zip(pc, pn)]
                            walk_seqs = (np.concatenate((np.full(nd, g), pn)), np.concatenate((dctx + g, keys))) \
                                if nd else (pn, keys)
                        # each sequence's walk starts after the work ahead of it (decodes first: their time under
                        # the roofline by the keys each reads, then the chunks' parts)
                        if nd:   # (no measured decode kernel: the decodes' work is not counted, as op by op)
                            dk = np.asarray(dctx, float) + g
                            work = np.concatenate((self.gqa_decode_work(ta, over_d, dk) if stream else 0.0 * dk, parts))
                        else:
                            work = parts
                        ta += t_c
                        fl = self.gqa_chain_floor(gqa, *walk_seqs, work)
                        ta = fl if fl > ta else ta
                    else:
                        ta += t_c
                else:
                    byts = float(ends_all) * self.heads_local * dpre * 2.0 if upproj else ends * eb
                    ta += self._attn_pre_t(cf_pre * es * s, byts * s, den_pre)
                if ir and icap < INF:  # a two-level index: each query scores at most icap candidates
                    scored = sum(_sum_min_s(c, n, icap) for c, n in zip(pc, pn))
                    ti += self._indexer_t(scored / ir, sum(min(c + n, icap) for c, n in zip(pc, pn)) / ir, s)
                elif ir:
                    if scored_all is None:
                        scored_all = sum(n * c + n * (n + 1) / 2 for c, n in zip(pc, pn))
                    ti += self._indexer_t(scored_all / ir, ends_all / ir, s)
            out += count * ta + count * ti
        return out

    def _indexer_t(self, scored: float, keys: float, s: float) -> float:
        """Indexer scoring of ``scored`` query-key pairs over ``keys`` keys, then its top-k kernel."""
        return self._attn_t(self._idx_coef * scored * s, (keys * self.idx_key_bytes + scored * 4.0 * 2) * s, self._idx_den) + self._lo

    @staticmethod
    def _dsum(dctx, shift: int, cap: float) -> float:
        """Sum over decodes of min(ctx + shift, cap)."""
        return float(np.minimum(dctx + shift, cap).sum())

    def _look(self, kind: int, f: float, draft: int, x: int) -> tuple[float, float]:
        """(time, all-to-all part) of table ``kind`` at integer token count ``x``."""
        b, j = divmod(x, _TBL)
        blk = self._tables.get((kind, f, draft, b))
        if blk is None:
            blk = self._fill(kind, f, draft, b)
        return blk[0][j], blk[1][j]

    def _fill(self, kind: int, f: float, draft: int, b: int) -> tuple[list[float], list[float]]:
        n = _PF_TBL if kind in _SMALL else _TBL
        x = np.arange(b * n, (b + 1) * n, dtype=float) * f  # token counts as nonattn scales them
        if kind in (_T_MAIN, _T_MAIN_PF) and self.ced:
            fams = self.part_terms(x, kind == _T_MAIN_PF, "enc")
        elif kind in (_T_DEC, _T_DEC_PF):
            fams = self.part_terms(x, kind == _T_DEC_PF, "dec")
        elif kind in (_T_MAIN, _T_MAIN_PF):
            fams = self.main_terms(x, prefill=kind == _T_MAIN_PF)
        elif kind == _T_MTP:
            fams = self.mtp_terms(x, draft)
        elif kind in (_T_KV, _T_KV_PF):
            fams = [self.gemms(KV_UP, x)]
        elif kind == _T_SAMPLED:  # draft -1: the lm_head only; 0: with sampling and the logits gather of draft 0
            fams = [self.gemms(SAMPLED, x)] + ([self.sampling(x * self.share, 0)] if draft == 0 else [])
        else:
            fams = [self.sampling(x * self.share, draft)]
        t = fams[0].total()
        for fam in fams[1:]:
            t = t + fam.total()
        parts = [p for p in (fam.a2a_total() for fam in fams) if p is not None]
        a = None
        for p in parts:
            a = p if a is None else a + p
        blk = (t.tolist(), _ZEROS if a is None else a.tolist())
        tables, most = (self._pf_tables, 8192) if kind in _SMALL else (self._tables, 1024)
        if len(tables) >= most:  # a bound on memory (~30 MB + ~10 MB); values never depend on what is kept
            tables.clear()
        tables[(kind, f, draft, b)] = blk
        return blk

def _sum_min_s(c: int, n: int, cap: float) -> float:
    """sum_{j=1..n} min(c + j, cap) for scalars (ops.sum_min)."""
    if cap >= INF:
        return n * c + n * (n + 1) / 2
    k = min(max(cap - c, 0.0), n)
    return k * c + k * (k + 1) / 2 + (n - k) * cap


def _attn_timer(cal: CalibrationProfile, hbm_bw: float, streaming: bool = False) -> Callable[[float, float, float], float]:
    """``StepOps.attn_roofline`` for floats in plain Python (a mixed step calls it a few times: numpy per call would
    cost more than the rest of the step), ``peak * attn_compute()`` given as ``den``
    (``cal.attn_mem`` evaluated with numpy.interp's arithmetic when it is a table; ``streaming``: ``cal.gemm_mem``,
    the prefill kernels' rate where decode streams as the measured kernel, ``StepOps.prefill_mem_eff``)."""
    table = None if streaming else cal.tables.get("attn_decode_mem")
    if table is None:
        table = cal.tables.get("gemm_mem")
    lo = cal.launch_overhead_s
    if table is None:
        eff, half = cal.mem_eff, cal.gemm_mem_half_bytes

        def attn_t(flops: float, byts: float, den: float) -> float:
            if flops <= 0 and byts <= 0:
                return 0.0
            a, b = flops / den, byts / (hbm_bw * (eff * byts / (byts + half + 1e-30)))
            return (a if a >= b else b) + lo

        return attn_t
    lx, y = [float(v) for v in table._lx], [float(v) for v in table._y]
    slope = [(y[j + 1] - y[j]) / (lx[j + 1] - lx[j]) for j in range(len(lx) - 1)]
    lo_x, hi_x, y0, y1 = lx[0], lx[-1], y[0], y[-1]
    log = math.log

    def attn_t(flops: float, byts: float, den: float) -> float:
        if flops <= 0 and byts <= 0:
            return 0.0
        x = log(byts if byts > 1e-30 else 1e-30)
        if x <= lo_x:
            e = y0
        elif x >= hi_x:
            e = y1
        else:
            j = bisect_right(lx, x) - 1
            e = y[j] if lx[j] == x else slope[j] * (x - lx[j]) + y[j]
        a, b = flops / den, byts / (hbm_bw * e)
        return (a if a >= b else b) + lo

    return attn_t
