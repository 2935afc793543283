"""Device time of one forward step of a batch under a parallel layout: the StepCostModel.

Assumptions (also in docs/costmodel.md):

- The time is that of the busiest GPU. Attention, dense layers and the shared expert run on
  one attention-DP rank's share of the requests: ``dp_imbalance / dp`` of the batch (requests
  assumed spread evenly; ``dp_imbalance`` >= 1 is the hook for uneven spreading). Routed
  experts see the whole instance's tokens spread over ``ep`` ranks, the busiest rank getting
  ``expert_imbalance`` times the mean (default 1.2 without EPLB redundancy, falling to 1.05
  with at least ``ep`` redundant experts: an assumption, not a measurement).
- Expert weights read per EP rank: the experts actually touched, expected
  ``E_local * (1 - (1 - 1/E)^(T * top_k))`` for ``T`` tokens routed uniformly.
- Pipeline stages run one after another within a step (no intra-step pipelining), plus one
  send per stage boundary.
- Decode MLA uses the absorbed form (attention reads only the latent cache); prefill uses
  the up-projected form unless the layer is sparse (indexer) or V4-style MQA.
- A decode request with ``new_tokens = 1 + d`` verifies d draft tokens; the MTP head then
  drafts ``d`` tokens for the next step: ``d`` passes of the MTP layer + lm_head.
- Two micro-batches (``layout.two_micro_batch`` with ep > 1): each half's EP all-to-all
  hides under the other half's compute: ``max(2 Tc, 2 Tm) + min(Tc, Tm) / layers`` with
  Tc, Tm the compute and all-to-all time of one half (weights are read once per half).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Callable

import numpy as np

from costmodels.batch import BatchShape
from costmodels.calibration import CalibrationProfile
from costmodels.calibration_source import profile_for
from costmodels.comm import dispatch_rows_per_token, allgather_time, allreduce_time, allreduce_time_vec, alltoall_time, alltoall_time_vec, p2p_time
from costmodels.hardware import Hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import MemoryFit, kv_bytes_per_token_layer, kv_shard_divisor, memory_fit, mtp_kind, indexer_kv_bytes_per_token
from costmodels.model_spec import ModelSpec
from costmodels.ops import CATEGORIES, INF, AttnGeometry, OpCost, SortedSums, StepCost, entries_last, entries_sum, geometry
from costmodels.params import WEIGHT_BYTES, attention_linears, ffn_linears, embedding_linears, mtp_linears, shard_divisor, weight_bytes_per_param

_COMM_VEC = {allreduce_time: allreduce_time_vec, alltoall_time: alltoall_time_vec}

ATT, IDX, DENSE, EXPERT, COMM, OTHER = range(6)
A2A = 6  # extra slot: the overlappable (EP all-to-all) part of COMM
_SRC = {"tokens": 0, "kv_up": 1, "sampled": 2}
_MTP_SRC = 3
# tables of the fast path (see StepCostModel._fill): what each one is a function of
_T_MAIN, _T_KV, _T_SAMPLED, _T_MTP, _T_LOGITS, _T_MAIN_PF = range(6)  # _T_MAIN_PF: main terms of a step with prefill (EP normal dispatch)
_TBL_BITS = 9
_TBL = 1 << _TBL_BITS  # points per lazily built table block
_TBL_MASK = _TBL - 1
_ZEROS = [0.0] * _TBL


def default_expert_imbalance(layout: ParallelLayout) -> float:
    """Busiest EP rank's load over the mean: 1.2 without EPLB, 1.05 with >= ep redundant experts (assumption)."""
    if layout.ep <= 1:
        return 1.0
    return 1.2 - 0.15 * min(1.0, layout.eplb_redundant_experts / layout.ep)


class StepCostModel:
    """Step times of ``model`` on ``hw`` under ``layout``; everything that depends only on those is built once here."""

    def __init__(
        self,
        model: ModelSpec,
        hw: Hardware,
        layout: ParallelLayout,
        calibration: CalibrationProfile | None = None,
        *,
        dp_imbalance: float = 1.0,
        expert_imbalance: float | None = None,
        expert_load: Callable[[float], float] | None = None,
    ):
        self.model, self.hw, self.layout = model, hw, layout
        self.cal = calibration or profile_for(hw)  # the hardware's measured block, else the H200-derived defaults
        self.dp_imbalance = max(1.0, dp_imbalance) if layout.dp > 1 else 1.0
        self.expert_imbalance = default_expert_imbalance(layout) if expert_imbalance is None else max(1.0, expert_imbalance)
        # expert_load(assignments) -> busiest EP rank's load over the mean for a step routing that
        # many token-expert assignments (costmodels.moe_load.ExpertLoad.imbalance); overrides the
        # constant expert_imbalance, so small batches pay their sampling noise and skew is explicit
        self.expert_load = expert_load if layout.ep > 1 else None
        self.share = self.dp_imbalance / layout.dp
        self.notes = list(self.cal.notes)
        if hw.name.lower() != self.cal.measured_on.lower() and not any("scaled" in n for n in self.notes):
            self.notes.append(f"efficiencies measured on {self.cal.measured_on}, applied to {hw.name} datasheet ceilings (scaled by datasheet ratios)")
        for dtype, field in ((layout.weight_dtype, "layout.weight_dtype"), (layout.experts_dtype, "layout.expert_dtype")):
            hw.check_dtype(dtype, field)  # FP8 on a GPU without FP8 is an error, never a silent fallback
        if not hw.supports(layout.experts_dtype) or not hw.supports(layout.weight_dtype):
            self.notes.append(f"{hw.name} has no FP4 tensor cores: FP4 weights are read as FP4 but multiplied at the FP8 rate")
        self._cache: dict = {}
        self._dcache: dict = {}
        self._fit: MemoryFit | None = None
        self._build_layers()
        self._build_gemms()
        self._build_attention()
        self._build_comm_constants()
        self._build_fast()

    # ------------------------------------------------------------------ construction
    def _build_layers(self) -> None:
        m = self.model
        groups: dict[tuple[str, bool], int] = {}
        for i, kind in enumerate(m.kinds()):
            key = (kind, m.is_moe_layer(i))
            groups[key] = groups.get(key, 0) + 1
        self.groups = groups
        self.n_layers = m.num_layers
        self.n_moe_layers = sum(c for (k, moe), c in groups.items() if moe)
        self.n_dense_layers = self.n_layers - self.n_moe_layers
        self.mtp_kind = mtp_kind(m)

    def _build_gemms(self) -> None:
        m, lay, cal, hw = self.model, self.layout, self.cal, self.hw
        rows = []  # (name, kind, cat, count, src, kn_local, w_bytes, io, dtype, is_mtp)

        def add(lins, kind, count, is_mtp):
            for lin in lins:
                if lin.shard == "expert":
                    continue
                div = shard_divisor(lin, m, lay)
                kn = lin.params / div
                bpp = weight_bytes_per_param(lin, lay)
                dtype = "bf16" if lin.wclass == "bf16" else lay.weight_dtype
                src = _MTP_SRC if is_mtp else _SRC[lin.m_source]
                cat = {"dense_gemm": DENSE, "indexer": IDX, "other": OTHER, "expert_gemm": EXPERT}[lin.category]
                rows.append((lin.name, kind, cat, count, src, kn, kn * bpp, (lin.k + lin.n) / div, dtype, is_mtp))

        for (kind, moe), count in self.groups.items():
            add(attention_linears(m, kind) + ffn_linears(m, moe), kind, count, False)
        emb = embedding_linears(m)
        head = [e for e in emb if e.name == "lm_head"] or [e for e in emb if e.name == "embedding"]
        head_lin = head[0]
        if head_lin.name == "embedding":  # tied: the head reuses the embedding matrix
            from costmodels.params import Linear
            head_lin = Linear("lm_head", m.hidden_size, m.vocab_size, "tp", "bf16", "dense_gemm", m_source="sampled")
        add([head_lin], "-", 1, False)
        if m.mtp_layers:
            add(mtp_linears(m) + [head_lin], self.mtp_kind, m.mtp_layers, True)
        self.g_names = [r[0] for r in rows]
        self.g_kind = [r[1] for r in rows]
        self.g_cat = np.array([r[2] for r in rows], dtype=np.int64)
        self.g_count = np.array([r[3] for r in rows], dtype=float)
        self.g_src = np.array([r[4] for r in rows], dtype=np.int64)
        self.g_kn = np.array([r[5] for r in rows], dtype=float)
        self.g_w = np.array([r[6] for r in rows], dtype=float)
        self.g_io = np.array([r[7] for r in rows], dtype=float)
        self.g_dtype = [r[8] for r in rows]
        self.g_mtp = np.array([r[9] for r in rows], dtype=bool)
        self.g_peak = np.array([hw.tflops(d) * 1e12 for d in self.g_dtype])
        self.g_dtypes = sorted(set(self.g_dtype))
        self.g_dmask = {d: np.array([x == d for x in self.g_dtype]) for d in self.g_dtypes}
        self.g_meff_bw = cal.gemm_mem(self.g_w) * hw.hbm_bw  # bandwidth each GEMM achieves, bytes/s
        self.g_cat_onehot = np.zeros((len(rows), 6))
        self.g_cat_onehot[np.arange(len(rows)), self.g_cat] = 1.0
        # routed experts
        if m.moe:
            e = m.moe.n_routed_experts
            self.e_total = e
            self.e_local = (e + lay.eplb_redundant_experts) / lay.ep
            self.e_params_local = 3 * m.hidden_size * m.moe.moe_intermediate_size / lay.moe_tp
            self.e_bpp = WEIGHT_BYTES[lay.experts_dtype]
            self.e_peak = hw.tflops(lay.experts_dtype) * 1e12
            self.e_io_per_token = (2 * m.hidden_size + 3 * m.moe.moe_intermediate_size / lay.moe_tp) * 2.0

    def _build_attention(self) -> None:
        m, lay = self.model, self.layout
        shard = kv_shard_divisor(m, lay)
        self.heads_local = m.num_attention_heads / lay.tp if m.attention == "mla" else m.num_attention_heads / lay.tp
        entry = kv_bytes_per_token_layer(m, lay.kv_dtype) / shard
        kinds: dict[str, int] = {}
        for (kind, _), c in self.groups.items():
            kinds[kind] = kinds.get(kind, 0) + c
        self.att_kinds = [(geometry(m, k), c) for k, c in kinds.items()]
        self.att_mtp = geometry(m, self.mtp_kind) if m.mtp_layers else None
        self.att_entry_bytes = entry
        self.att_peak = self.hw.bf16_tflops * 1e12
        self.idx_peak = self.hw.tflops(m.indexer.dtype) * 1e12 if m.indexer else 0.0
        self.idx_key_bytes = indexer_kv_bytes_per_token(m) if m.indexer else 0.0

    def _build_comm_constants(self) -> None:
        m, lay, hw, cal = self.model, self.layout, self.hw, self.cal
        self.disp_bytes = (1.0 + 4.0 / 128) if lay.experts_dtype in ("fp8", "fp4") else 2.0  # DeepEP FP8 dispatch with 1x128 scales
        self.pp_cross = lay.tp * lay.dp * lay.pp > hw.scaleup_domain
        self.h = m.hidden_size
        # remote copies per token of an EP dispatch: decode steps use DeepEP's low-latency kernels (a copy per
        # expert), steps with prefill its normal kernels (a copy per destination rank); see comm.dispatch_rows_per_token
        if m.moe and lay.ep > 1:
            args = (m.moe.n_routed_experts, m.moe.top_k, lay.ep, m.moe.n_group, m.moe.topk_group)
            self.disp_rows_ll = dispatch_rows_per_token(*args, normal=False)
            self.disp_rows_normal = dispatch_rows_per_token(*args, normal=True)
        else:
            self.disp_rows_ll = self.disp_rows_normal = 0.0

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
        draft = self._draft(new, dec)
        ops: list[OpCost] = []
        tbo = self._tbo(batch.num_requests)
        f = 0.5 if tbo else 1.0
        v = self._nonattn(*self._summary(new, ctx, dec, draft), f, ops) + self._attn(new, ctx, dec, draft, f, ops)
        t, breakdown = self._combine(v, tbo)
        if tbo:
            for o in ops:
                o.count *= 2
                o.flops *= 2
                o.bytes *= 2
                o.time_s *= 2
        ops.sort(key=lambda o: -o.time_s)
        notes = list(self.notes)
        if tbo:
            notes.append("two micro-batches: op times are two halves; all-to-all hidden under compute is subtracted from 'communication'")
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
        (every layer kind reads every cached entry, no measured prefill table): ``chunked_step_time_sum``."""
        return self._attn_simple and not self._pre_table

    def chunked_step_time_sum(self, nd: int, dctx_sum: int, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        """``chunked_step_time`` from the number of decodes and their context sum (only where ``mixed_sum_only``)."""
        if nd == 0:
            return self.chunked_step_time(np.zeros(0, np.int64), draft_len, prefill_new, prefill_ctx)
        return self._fast_time(nd, draft_len, None, dctx_sum, prefill_new, prefill_ctx)   # (contexts unused: simple attention)

    def _mixed_step_time_reference(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray) -> float:
        """``mixed_step_time`` op by op (the ``step`` arithmetic without the op list): the fast path's reference."""
        if new.size == 0:
            return 0.0
        draft = self._draft(new, dec)
        tbo = self._tbo(new.size)
        f = 0.5 if tbo else 1.0
        key = self._summary(new, ctx, dec, draft) + (f,)
        v = self._cache.get(key)
        if v is None:
            v = self._nonattn(*key)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = v
        v = v + self._attn(new, ctx, dec, draft, f, None)
        return self._combine(v, tbo)[0]

    def decode_times(self, context_lens: np.ndarray, num_steps: int, draft_len: int = 0) -> np.ndarray:
        """Times of ``num_steps`` consecutive decode steps of the same requests, context growing by 1 + draft_len a step.

        Equal to calling ``step_time`` once per step; only attention and the indexer depend on
        the context, so everything else is computed (and cached) once and the attention terms
        are evaluated for all steps at once.
        """
        ctx = np.asarray(context_lens, dtype=float)
        n = ctx.size
        if n == 0 or num_steps <= 0:
            return np.zeros(max(num_steps, 0))
        g = 1 + draft_len
        tbo = self.layout.two_micro_batch and self.layout.ep > 1 and n >= 2
        f = 0.5 if tbo else 1.0
        key = (n, draft_len, f)
        base = self._dcache.get(key)
        if base is None:
            fn = float(n)
            v0 = self._nonattn(fn * g, fn * g, fn * g, fn, float(draft_len), 0.0, f)
            base = (float(v0[:6].sum() - v0[A2A]), float(v0[A2A]))
            if len(self._dcache) > 4096:
                self._dcache.clear()
            self._dcache[key] = base
        shifts = np.arange(0.0, num_steps * g, g)[:num_steps]
        sums = SortedSums(ctx + g)
        s = self.share * f
        geos = self.att_kinds
        if draft_len and self.att_mtp is not None:
            geos = geos + [(self.att_mtp, draft_len * self.model.mtp_layers)]
        compute = base[0] + self._attn_decode_stack(geos, sums, shifts, g, s)
        tm = base[1]
        if not tbo:
            return compute + tm
        return np.maximum(2 * compute, 2 * tm) + np.minimum(compute, tm) / self.n_layers

    # ------------------------------------------------------------------ pieces
    def _tbo(self, n_requests: int) -> bool:
        return bool(self.layout.two_micro_batch and self.layout.ep > 1 and n_requests >= 2)

    @staticmethod
    def _draft(new: np.ndarray, dec: np.ndarray) -> int:
        return int(new[dec].max()) - 1 if dec.any() else 0

    def _summary(self, new, ctx, dec, draft) -> tuple:
        """What the non-attention ops depend on: token counts (whole instance)."""
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

    def _gemm_rows(self, tokens, kv_up, sampled, mtp_tokens, draft):
        s = self.share
        mvec = np.array([tokens * s, kv_up * s, sampled * s, mtp_tokens * s])
        m_row = mvec[self.g_src]
        ceff = np.empty_like(m_row)
        for d in self.g_dtypes:
            mask = self.g_dmask[d]
            ceff[mask] = self.cal.gemm_compute(m_row[mask], d)
        flops = 2.0 * m_row * self.g_kn
        byts = self.g_w + m_row * self.g_io * 2.0
        # the bandwidth ramp applies to all bytes the kernel moves (weights and activations)
        meff_bw = self.cal.gemm_mem(byts) * self.hw.hbm_bw
        t = np.maximum(flops / (self.g_peak * np.maximum(ceff, 1e-9)), byts / meff_bw) + self.cal.launch_overhead_s
        count = np.where(self.g_mtp, self.g_count * draft, self.g_count)
        count = np.where(m_row > 0, count, 0.0)
        return count, flops, byts, t

    def _imbalance(self, tokens_total: float) -> float:
        """Busiest EP rank's routed load over the mean for a step of ``tokens_total`` tokens."""
        if self.expert_load is None or not self.model.moe:
            return self.expert_imbalance
        return max(1.0, float(self.expert_load(tokens_total * self.model.moe.top_k)))

    def _experts(self, tokens_total: float):
        """(flops, bytes, time) of one MoE layer's routed experts on the busiest EP rank."""
        assign = tokens_total * self.model.moe.top_k
        imb = self._imbalance(tokens_total)
        tok_rank = assign / self.layout.ep * imb
        touched = self.e_local * (1.0 - (1.0 - 1.0 / self.e_total) ** assign)
        w = touched * self.e_params_local * self.e_bpp
        flops = 2.0 * tok_rank * self.e_params_local
        byts = w + tok_rank * self.e_io_per_token
        m_per_expert = tok_rank / max(touched, 1e-9)
        ceff = float(self.cal.gemm_compute(m_per_expert, self.layout.experts_dtype))
        meff = float(self.cal.expert_mem(byts))
        t = max(flops / (self.e_peak * max(ceff, 1e-9)), byts / (self.hw.hbm_bw * max(meff, 1e-9))) + 2 * self.cal.launch_overhead_s
        return flops, byts, t, touched

    def _nonattn(self, total, kv_up, sampled, n_dec, draft, has_prefill, f, ops: list | None = None) -> np.ndarray:
        """Category times (plus the all-to-all slot) of everything except the attention core and indexer scoring."""
        m, lay, hw, cal = self.model, self.layout, self.hw, self.cal
        total, kv_up, sampled, n_dec = total * f, kv_up * f, sampled * f, n_dec * f
        draft = int(draft)
        v = np.zeros(7)
        count, flops, byts, t = self._gemm_rows(total, kv_up, sampled, n_dec, draft)
        v[:6] += (count * t) @ self.g_cat_onehot
        if ops is not None:
            for i, name in enumerate(self.g_names):
                if count[i] > 0:
                    ops.append(OpCost(name, CATEGORIES[self.g_cat[i]], self.g_kind[i], int(count[i]), float(flops[i] * count[i]), float(byts[i] * count[i]), float(t[i] * count[i])))
        h = self.h
        m_rank = total * self.share
        # routed experts: main MoE layers over all tokens, MTP passes over one token per decode request
        if m.moe:
            for label, tokens, layers in (("routed_experts", total, self.n_moe_layers), ("mtp_routed_experts", n_dec, draft * m.mtp_layers)):
                if layers and tokens > 0:
                    ef, eb, et, touched = self._experts(tokens)
                    v[EXPERT] += layers * et
                    if ops is not None:
                        ops.append(OpCost(f"{label} ({touched:.0f} experts touched/rank)", "expert_gemm", "-", int(layers), ef * layers, eb * layers, et * layers))
        # elementwise / small kernels (category 'other'), memory-bound at streaming efficiency
        stream = hw.hbm_bw * cal.mem_eff
        lo = cal.launch_overhead_s
        passes = [(m_rank, self.n_layers, self.n_moe_layers)]
        if draft and m.mtp_layers:
            passes.append((n_dec * self.share, draft * m.mtp_layers, draft * m.mtp_layers if m.moe else 0))
        for tok, layers, moe_layers in passes:
            if tok <= 0:
                continue
            items = [
                ("rmsnorm", 2 * layers, 2 * tok * h * 2.0 * m.hc_mult),
                ("rope+act_quant+residual", 2 * layers, 2 * tok * h * 2.0 * m.hc_mult),
                ("router_topk", moe_layers, tok * (m.moe.n_routed_experts if m.moe else 0) * 4.0 * 2),
            ]
            for name, k, b in items:
                if k:
                    tt = k * (b / stream + lo)
                    v[OTHER] += tt
                    if ops is not None:
                        ops.append(OpCost(name, "other", "-", int(k), 0.0, k * b, tt))
        s_rank = sampled * self.share + n_dec * self.share * draft
        for name, k, b in (("embedding", 1, m_rank * h * 2.0), ("sampling", 2 if s_rank else 0, s_rank * m.vocab_size * 4.0 * 2)):
            if k and b:
                tt = k * lo + b / stream
                v[OTHER] += tt
                if ops is not None:
                    ops.append(OpCost(name, "other", "-", k, 0.0, b, tt))
        self._comm(total, m_rank, n_dec * self.share, sampled * self.share, draft, v, ops, bool(has_prefill))
        return v

    def _comm(self, total, m_rank, mtp_rank, s_rank, draft, v, ops, prefill: bool = False) -> None:
        m, lay, hw, cal = self.model, self.layout, self.hw, self.cal
        h = self.h
        items = []  # (name, count, bytes per op, time per op, overlappable)
        mtp_passes = draft * m.mtp_layers
        for tok, layers, moe_layers, tag in ((m_rank, self.n_layers, self.n_moe_layers, ""),
                                             (mtp_rank, mtp_passes, mtp_passes if m.moe else 0, "mtp_")):
            if tok <= 0 or layers == 0:
                continue
            ar = tok * h * 2.0
            if lay.tp > 1:
                items.append((f"{tag}attn_allreduce(tp{lay.tp})", layers, ar, allreduce_time(ar, lay.tp, hw, cal), False))
                dense = layers - moe_layers
                if dense:
                    items.append((f"{tag}ffn_allreduce(tp{lay.tp})", dense, ar, allreduce_time(ar, lay.tp, hw, cal), False))
            if moe_layers:
                if lay.ep > 1:
                    tok_gpu = tok / lay.tp
                    normal = prefill and not tag  # MTP passes are decode-only
                    rows = (self.disp_rows_normal if normal else self.disp_rows_ll) * self._imbalance(tok / self.share)
                    d_b = tok_gpu * rows * h * self.disp_bytes
                    c_b = tok_gpu * rows * h * 2.0
                    mode = "normal" if normal else "low-latency"
                    items.append((f"{tag}ep_dispatch(ep{lay.ep}, {mode})", moe_layers, d_b, alltoall_time(d_b, lay.ep, hw, cal), True))
                    items.append((f"{tag}ep_combine(ep{lay.ep}, {mode})", moe_layers, c_b, alltoall_time(c_b, lay.ep, hw, cal), True))
                    if lay.moe_tp > 1:
                        b = tok_gpu * h * 2.0
                        items.append((f"{tag}moe_tp_allreduce(tp{lay.moe_tp})", moe_layers, b, allreduce_time(b, lay.moe_tp, hw, cal), False))
                    if lay.tp > 1 and m.moe.n_shared_experts:
                        items.append((f"{tag}shared_allreduce(tp{lay.tp})", moe_layers, ar, allreduce_time(ar, lay.tp, hw, cal), False))
                elif lay.moe_tp > 1:
                    if lay.dp == 1:
                        items.append((f"{tag}moe_allreduce(tp{lay.tp})", moe_layers, ar, allreduce_time(ar, lay.tp, hw, cal), False))
                    else:
                        b = tok / self.share * h * 2.0  # every DP rank's tokens gathered, reduced, scattered back
                        items.append((f"{tag}moe_gather_scatter(tp{lay.moe_tp})", moe_layers, b, allreduce_time(b, lay.moe_tp, hw, cal), False))
        if lay.tp > 1 and m_rank > 0:
            b = m_rank * h * 2.0
            items.append(("embedding_allreduce", 1, b, allreduce_time(b, lay.tp, hw, cal), False))
            s_all = s_rank + mtp_rank * draft
            if s_all > 0:
                b = s_all * m.vocab_size / lay.tp * 4.0
                items.append(("logits_allgather", 1 + draft, b, allgather_time(b, lay.tp, hw, cal), False))
        if lay.pp > 1 and m_rank > 0:
            b = m_rank * h * 2.0
            items.append(("pp_send", lay.pp - 1, b, p2p_time(b, self.pp_cross, hw, cal), False))
        for name, k, b, t, overlap in items:
            v[COMM] += k * t
            if overlap:
                v[A2A] += k * t
            if ops is not None:
                ops.append(OpCost(name, "communication", "-", int(k), 0.0, k * b, k * t))

    def _attn_time(self, flops, byts, peak):
        if flops <= 0 and byts <= 0:
            return 0.0
        eff_m = float(self.cal.attn_mem(byts))
        return max(flops / (peak * self.cal.attn_compute()), byts / (self.hw.hbm_bw * eff_m)) + self.cal.launch_overhead_s

    def _attn_one(self, geo: AttnGeometry, new, ctx, dec, s):
        """(attention flops, bytes, time, indexer flops, bytes, time) of one layer of ``geo`` on the busiest rank."""
        h_loc = self.heads_local
        out = np.zeros(6)
        for is_dec in (True, False):
            mask = dec if is_dec else ~dec
            if not mask.any():
                continue
            c, n = ctx[mask], new[mask]
            if is_dec:
                last = entries_last(geo, c + n)
                flops = 2.0 * h_loc * (geo.d_qk_decode + geo.d_v_decode) * float((n * last).sum())
                byts = float(last.sum()) * self.att_entry_bytes
            else:
                ent = entries_sum(geo, c, n)
                flops = 2.0 * h_loc * (geo.d_qk_prefill + geo.d_v_prefill) * float(ent.sum())
                if geo.prefill_upproj:
                    byts = float((c + n).sum()) * h_loc * (geo.d_qk_prefill + geo.d_v_prefill) * 2.0
                else:
                    byts = float(entries_last(geo, c + n).sum()) * self.att_entry_bytes
            flops, byts = flops * s, byts * s
            out[0] += flops
            out[1] += byts
            if not is_dec and "attn_prefill_compute" in self.cal.tables and flops > 0:
                # measured per-length efficiency: each chunk is its own kernel (short ones are far below peak)
                eff = np.maximum(self.cal.attn_prefill_compute((c + n).astype(float)), 1e-9)
                t_c = float(np.sum(2.0 * h_loc * (geo.d_qk_prefill + geo.d_v_prefill) * ent * s / (self.att_peak * eff)))
                t_m = byts / (self.hw.hbm_bw * float(self.cal.attn_mem(byts))) if byts > 0 else 0.0
                out[2] += max(t_c, t_m) + self.cal.launch_overhead_s
            else:
                out[2] += self._attn_time(flops, byts, self.att_peak)
            if geo.index_ratio:
                ix = self.model.indexer
                if is_dec:
                    keys = (c + n).astype(float) / geo.index_ratio
                    scored = float((n * keys).sum())
                else:
                    scored = float(entries_sum(AttnGeometry("k", INF, 1.0, 0.0, 0.0, 0, 0, 0, 0, False), c, n).sum()) / geo.index_ratio
                    keys = (c + n).astype(float) / geo.index_ratio
                i_flops = 2.0 * ix.n_heads * ix.head_dim * scored * s
                i_bytes = (float(keys.sum()) * self.idx_key_bytes + scored * 4.0 * 2) * s  # keys + logits written and read by top-k
                out[3] += i_flops
                out[4] += i_bytes
                out[5] += self._attn_time(i_flops, i_bytes, self.idx_peak) + self.cal.launch_overhead_s
        return out

    def _attn(self, new, ctx, dec, draft, f, ops) -> np.ndarray:
        v = np.zeros(7)
        s = self.share * f
        todo = [(geo, count, new, ctx, dec, "") for geo, count in self.att_kinds]
        if draft and self.att_mtp is not None and dec.any():
            # each MTP pass: one query per decode request at the end of its (verified) context
            c = ctx[dec] + new[dec]
            todo.append((self.att_mtp, draft * self.model.mtp_layers, np.ones_like(c), c, np.ones(c.size, bool), "mtp_"))
        for geo, count, nn, cc, dd, tag in todo:
            r = self._attn_one(geo, nn, cc, dd, s)
            v[ATT] += count * r[2]
            v[IDX] += count * r[5]
            if ops is not None:
                ops.append(OpCost(f"{tag}attention_{geo.kind}", "attention", geo.kind, int(count), count * r[0], count * r[1], count * r[2]))
                if r[5]:
                    ops.append(OpCost(f"{tag}indexer_score_topk", "indexer", geo.kind, int(count), count * r[3], count * r[4], count * r[5]))
        return v

    def _attn_decode_stack(self, geos, sums: SortedSums, shifts: np.ndarray, g: int, s: float) -> np.ndarray:
        """Attention + indexer time of all layers for each decode step (vectorised over steps and layer kinds).

        ``geos``: (geometry, layer count) pairs; MTP passes (the entry after the main kinds,
        if any) process one new token per request, main layers ``g``.
        """
        k = len(geos)
        ent = np.empty((k, shifts.size))
        coef_b = np.empty(k)
        coef_f = np.empty(k)
        counts = np.empty(k)
        inv_attn = 1.0 / (self.att_peak * self.cal.attn_compute())
        idx_rows = []
        for i, (geo, count) in enumerate(geos):
            new = g if i < len(self.att_kinds) else 1
            ent[i] = sums.entries(geo, shifts)
            coef_b[i] = self.att_entry_bytes * s
            coef_f[i] = 2.0 * self.heads_local * (geo.d_qk_decode + geo.d_v_decode) * new * s * inv_attn
            counts[i] = count
            if geo.index_ratio:
                idx_rows.append((geo, count, new))
        byts = ent * coef_b[:, None]
        t = np.maximum(ent * coef_f[:, None], byts / (self.cal.attn_mem(byts) * self.hw.hbm_bw)) + self.cal.launch_overhead_s
        total = counts @ t
        if idx_rows:
            ix = self.model.indexer
            keys_all = sums.total + sums.n * shifts
            inv_idx = 1.0 / (self.idx_peak * self.cal.attn_compute())
            for geo, count, new in idx_rows:
                keys = keys_all / geo.index_ratio
                i_bytes = keys * ((self.idx_key_bytes + new * 8.0) * s)
                i_flop_t = keys * (2.0 * ix.n_heads * ix.head_dim * new * s * inv_idx)
                ti = np.maximum(i_flop_t, i_bytes / (self.cal.attn_mem(i_bytes) * self.hw.hbm_bw)) + 2 * self.cal.launch_overhead_s
                total = total + count * ti
        return total

    def _combine(self, v: np.ndarray, tbo: bool) -> tuple[float, dict[str, float]]:
        """Step time and breakdown from category times (of one half-batch when ``tbo``)."""
        if not tbo:
            return float(v[:6].sum()), {c: float(v[i]) for i, c in enumerate(CATEGORIES)}
        tm = float(v[A2A])
        tc = float(v[:6].sum()) - tm
        t = max(2 * tc, 2 * tm) + min(tc, tm) / self.n_layers
        bd = {c: 2.0 * float(v[i]) for i, c in enumerate(CATEGORIES)}
        hidden = 2 * tc + 2 * tm - t
        bd["communication"] = max(0.0, bd["communication"] - hidden)
        return t, bd

    # ------------------------------------------------------------------ fast path of mixed_step_time
    # A step's non-attention time is a sum of terms each depending on one token count: the
    # instance's tokens (GEMMs on every token, routed experts, norms, TP/EP communication), the
    # K/V up-projected tokens, the sampled tokens, and the MTP passes' tokens. Each is tabulated
    # at every integer count (exact: the counts are integers), in blocks of _TBL built on first
    # use with the same arithmetic as _nonattn evaluated elementwise. Attention reads only sums
    # of contexts (closed forms per chunk). A step then costs a few table lookups and scalar math.
    def _build_fast(self) -> None:
        m, lay, cal = self.model, self.layout, self.cal
        self._tables: dict[tuple, tuple[list[float], list[float]]] = {}
        self._tbo_on = bool(lay.two_micro_batch and lay.ep > 1)
        self._kv_up_ctx = bool(m.attention == "mla" and m.mla.kv_up_proj and m.indexer is None)
        self._src_rows = [np.flatnonzero(self.g_src == k) for k in range(4)]
        self._kv_rows = bool(self._src_rows[1].size)
        self._mtp_on = bool(m.mtp_layers)
        self._attn_t = _attn_timer(cal, self.hw.hbm_bw)
        self._att_den = self.att_peak * cal.attn_compute()
        self._idx_den = self.idx_peak * cal.attn_compute() if m.indexer else 1.0
        self._idx_coef = 2.0 * m.indexer.n_heads * m.indexer.head_dim if m.indexer else 0.0
        self._lo = cal.launch_overhead_s
        self._stream = self.hw.hbm_bw * cal.mem_eff
        # a measured per-length prefill-attention table prices each chunk on its own: the op-by-op path does that
        self._pre_table = "attn_prefill_compute" in cal.tables
        self._ep_split = bool(m.moe and lay.ep > 1 and self.disp_rows_normal != self.disp_rows_ll)
        h_loc = self.heads_local

        def consts(geo: AttnGeometry, count: float) -> tuple:
            return (count, geo.cap, geo.ratio, geo.window, geo.index_ratio,
                    2.0 * h_loc * (geo.d_qk_decode + geo.d_v_decode),
                    2.0 * h_loc * (geo.d_qk_prefill + geo.d_v_prefill),
                    geo.d_qk_prefill + geo.d_v_prefill, geo.prefill_upproj)

        self._geo_fast = [consts(geo, c) for geo, c in self.att_kinds]
        self._geo_mtp = consts(self.att_mtp, 0) if self.att_mtp is not None else None
        # every layer kind reads every cached entry: attention depends on sums only (_attn_simple_time)
        self._attn_simple = all(g[1] >= INF and not g[3] and not g[4] for g in self._geo_fast + [self._geo_mtp] if g is not None)

    def _fast_time(self, nd: int, draft: int, dctx, dctx_sum: int, pn: list, pc: list) -> float:
        """Step time of ``nd`` decodes of 1 + draft tokens (contexts ``dctx``, summing to ``dctx_sum``) and prefill chunks (pn, pc)."""
        npre = len(pn)
        if npre and self._pre_table:
            new = np.array([draft + 1] * nd + list(pn), np.int64)
            ctx = np.concatenate([np.asarray(dctx if nd else [], np.int64), np.asarray(pc, np.int64)])
            return self._mixed_step_time_reference(new, ctx, np.arange(new.size) < nd)
        f = 0.5 if self._tbo_on and nd + npre >= 2 else 1.0
        g = draft + 1
        dnew = nd * g
        if npre == 1:
            pre_new, pre_ctx = pn[0], pc[0]
        elif npre:
            pre_new, pre_ctx = sum(pn), sum(pc)
        else:
            pre_new = pre_ctx = 0
        total = dnew + pre_new
        tabs = self._tables
        # non-attention terms: table lookups at integer token counts (_look, inlined)
        km = _T_MAIN_PF if (npre and self._ep_split) else _T_MAIN
        blk = tabs.get((km, f, 0, total >> _TBL_BITS)) or self._fill(km, f, 0, total >> _TBL_BITS)
        j = total & _TBL_MASK
        t, a2a = blk[0][j], blk[1][j]
        if self._kv_rows:
            x = dnew + pre_new + pre_ctx if self._kv_up_ctx else total
            blk = tabs.get((_T_KV, f, 0, x >> _TBL_BITS)) or self._fill(_T_KV, f, 0, x >> _TBL_BITS)
            t += blk[0][x & _TBL_MASK]
        x = dnew + npre  # sampled tokens
        if draft and nd:
            t += self._look(_T_SAMPLED, f, -1, x)[0]
            # sampling and the logits gather cover the sampled tokens and each decode's drafts
            t += self._look(_T_LOGITS, f, draft, x + nd * draft)[0]
            if self._mtp_on:
                tm, am = self._look(_T_MTP, f, draft, nd)
                t += tm
                a2a += am
        else:
            blk = tabs.get((_T_SAMPLED, f, 0, x >> _TBL_BITS)) or self._fill(_T_SAMPLED, f, 0, x >> _TBL_BITS)
            t += blk[0][x & _TBL_MASK]
        if self._attn_simple:
            t += self._attn_simple_time(nd, g, dctx_sum + dnew, pn, pc, pre_new, pre_ctx, self.share * f, draft)
        else:
            t += self._attn_fast(nd, g, dctx, dctx_sum + dnew, pn, pc, self.share * f, draft)
        if f == 1.0:
            return t
        tc = t - a2a
        return max(2 * tc, 2 * a2a) + min(tc, a2a) / self.n_layers

    def _attn_simple_time(self, nd: int, g: int, dpos_sum: int, pn: list, pc: list, pre_new: int, pre_ctx: int, s: float, draft: int) -> float:
        """_attn_fast for layer kinds that read every cached entry (no cap, window or indexer): closed forms of sums."""
        attn_t, den, eb = self._attn_t, self._att_den, self.att_entry_bytes
        out = 0.0
        if pn:
            es = 0
            for c, n in zip(pc, pn):
                es += n * c + n * (n + 1) / 2
            ends = pre_ctx + pre_new
        for count, _, ratio, _, _, cf_dec, cf_pre, dpre, upproj in self._geo_fast:
            ta = 0.0
            if nd:
                last = dpos_sum / ratio
                ta = attn_t(cf_dec * (g * last) * s, last * eb * s, den)
            if pn:
                byts = float(ends) * self.heads_local * dpre * 2.0 if upproj else ends / ratio * eb
                ta += attn_t(cf_pre * (es / ratio) * s, byts * s, den)
            out += count * ta
        if draft and nd and self._geo_mtp is not None:
            # each MTP pass: one query per decode at the end of its verified context
            _, _, ratio, _, _, cf_dec, _, _, _ = self._geo_mtp
            last = (dpos_sum + nd) / ratio
            out += draft * self.model.mtp_layers * attn_t(cf_dec * last * s, last * eb * s, den)
        return out

    def _attn_fast(self, nd: int, g: int, dctx, dpos_sum: int, pn: list, pc: list, s: float, draft: int) -> float:
        """Attention + indexer time of all layers (``_attn`` from sums): decodes at positions ctx + g, then the chunks."""
        lo, eb, ikb = self._lo, self.att_entry_bytes, self.idx_key_bytes
        capped: dict[tuple[float, int], float] = {}

        def dsum(cap: float, shift: int) -> float:  # sum over decodes of min(ctx + g + shift, cap)
            if cap >= INF:
                return dpos_sum + shift * nd
            v = capped.get((cap, shift))
            if v is None:
                v = capped[(cap, shift)] = float(np.minimum(dctx + (g + shift), cap).sum())
            return v

        todo = [(geo, 0, g) for geo in self._geo_fast]
        if draft and nd and self._geo_mtp is not None:
            # each MTP pass: one query per decode at the end of its verified context
            todo.append(((draft * self.model.mtp_layers,) + self._geo_mtp[1:], 1, 1))
        out = 0.0
        for (count, cap, ratio, window, ir, cf_dec, cf_pre, dpre, upproj), shift, n_q in todo:
            ta = ti = 0.0
            if nd:
                last = dsum(cap, shift) / ratio
                if window:
                    last += dsum(window, shift)
                ta += self._attn_t(cf_dec * (n_q * last) * s, last * eb * s, self._att_den)
                if ir:
                    keys = (dpos_sum + shift * nd) / ir
                    scored = n_q * keys
                    ti += self._attn_t(self._idx_coef * scored * s, (keys * ikb + scored * 4.0 * 2) * s, self._idx_den) + lo
            if pn and not shift:
                es = ends = 0.0
                for c, n in zip(pc, pn):
                    es += _sum_min_s(c, n, cap) / ratio + (_sum_min_s(c, n, window) if window else 0.0)
                    if not upproj:
                        p = c + n
                        ends += min(p, cap) / ratio + (min(p, window) if window else 0.0)
                if upproj:
                    byts = float(sum(pc) + sum(pn)) * self.heads_local * dpre * 2.0
                else:
                    byts = ends * eb
                ta += self._attn_t(cf_pre * es * s, byts * s, self._att_den)
                if ir:
                    scored = sum(n * c + n * (n + 1) / 2 for c, n in zip(pc, pn)) / ir
                    keys = (sum(pc) + sum(pn)) / ir
                    ti += self._attn_t(self._idx_coef * scored * s, (keys * ikb + scored * 4.0 * 2) * s, self._idx_den) + lo
            out += count * ta + count * ti
        return out

    def _look(self, kind: int, f: float, draft: int, x: int) -> tuple[float, float]:
        """(time, all-to-all part) of table ``kind`` at integer token count ``x``."""
        b, j = divmod(x, _TBL)
        blk = self._tables.get((kind, f, draft, b))
        if blk is None:
            blk = self._fill(kind, f, draft, b)
        return blk[0][j], blk[1][j]

    def _fill(self, kind: int, f: float, draft: int, b: int) -> tuple[list[float], list[float]]:
        x = np.arange(b * _TBL, (b + 1) * _TBL, dtype=float) * f  # token counts as _nonattn scales them
        a = None  # no all-to-all part
        if kind == _T_MAIN:
            t, a = self._main_vec(x)
        elif kind == _T_MAIN_PF:
            t, a = self._main_vec(x, prefill=True)
        elif kind == _T_MTP:
            t, a = self._mtp_vec(x, draft)
        elif kind == _T_KV:
            t = self._gemm_vec(1, x, 0)
        elif kind == _T_SAMPLED:  # draft -1: the lm_head only; 0: with sampling and the logits gather of draft 0
            t = self._gemm_vec(2, x, 0)
            if draft == 0:
                t = t + self._logits_vec(x, 0)
        else:
            t = self._logits_vec(x, draft)
        blk = (t.tolist(), _ZEROS if a is None else a.tolist())
        if len(self._tables) >= 1024:  # a bound on memory (~30 MB); values never depend on what is kept
            self._tables.clear()
        self._tables[(kind, f, draft, b)] = blk
        return blk

    def _gemm_vec(self, src: int, x: np.ndarray, draft: int) -> np.ndarray:
        """Sum over the GEMM rows fed by ``src`` of count * time, at each token count of ``x`` (_gemm_rows elementwise)."""
        rows = self._src_rows[src]
        if rows.size == 0:
            return np.zeros_like(x)
        mr = np.repeat((x * self.share)[None, :], rows.size, axis=0)
        ceff = np.empty_like(mr)
        for d in self.g_dtypes:
            mask = self.g_dmask[d][rows]
            if mask.any():
                ceff[mask] = self.cal.gemm_compute(mr[mask], d)
        col = lambda a: a[rows][:, None]  # noqa: E731
        flops = 2.0 * mr * col(self.g_kn)
        byts = col(self.g_w) + mr * col(self.g_io) * 2.0
        meff_bw = self.cal.gemm_mem(byts) * self.hw.hbm_bw
        t = np.maximum(flops / (col(self.g_peak) * np.maximum(ceff, 1e-9)), byts / meff_bw) + self.cal.launch_overhead_s
        count = col(self.g_count) * draft if src == _MTP_SRC else col(self.g_count)
        return (np.where(mr > 0, count, 0.0) * t).sum(axis=0)

    def _logits_vec(self, x: np.ndarray, draft: int) -> np.ndarray:
        """Sampling and the logits all-gather (closed forms of _nonattn/_comm) for ``x`` (f-scaled) sampled + draft tokens."""
        s_all = x * self.share
        b = s_all * self.model.vocab_size * 4.0 * 2
        t = np.where(b != 0, 2 * self._lo + b / self._stream, 0.0)
        lay = self.layout
        if lay.tp > 1:
            b = s_all * self.model.vocab_size / lay.tp * 4.0
            t = t + np.array([(1 + draft) * allgather_time(v, lay.tp, self.hw, self.cal) if v > 0 else 0.0 for v in b.tolist()])
        return t

    def _imbalance_vec(self, tokens: np.ndarray):
        if self.expert_load is None or not self.model.moe:
            return self.expert_imbalance
        many = getattr(self.expert_load, "many", None)  # costmodels.moe_load.ExpertLoad: one memo lookup per distinct grid point
        if many is not None:
            return np.maximum(1.0, many(np.asarray(tokens, float) * self.model.moe.top_k))
        return np.array([self._imbalance(x) for x in tokens.tolist()])

    def _experts_vec(self, tok: np.ndarray) -> np.ndarray:
        """Time of one MoE layer's routed experts at each token count (_experts elementwise)."""
        assign = tok * self.model.moe.top_k
        tok_rank = assign / self.layout.ep * self._imbalance_vec(tok)
        touched = self.e_local * (1.0 - (1.0 - 1.0 / self.e_total) ** assign)
        w = touched * self.e_params_local * self.e_bpp
        flops = 2.0 * tok_rank * self.e_params_local
        byts = w + tok_rank * self.e_io_per_token
        ceff = self.cal.gemm_compute(tok_rank / np.maximum(touched, 1e-9), self.layout.experts_dtype)
        meff = self.cal.expert_mem(byts)
        return np.maximum(flops / (self.e_peak * np.maximum(ceff, 1e-9)), byts / (self.hw.hbm_bw * np.maximum(meff, 1e-9))) + 2 * self.cal.launch_overhead_s

    def _other_vec(self, tok: np.ndarray, layers: int, moe_layers: int) -> np.ndarray:
        """Norms, rope/quant/residual and router top-k of one pass (the 'other' items of _nonattn), at tok > 0."""
        m, lo, stream, h = self.model, self._lo, self._stream, self.h
        t = np.zeros_like(tok)
        for k, b in ((2 * layers, 2 * tok * h * 2.0 * m.hc_mult), (2 * layers, 2 * tok * h * 2.0 * m.hc_mult),
                     (moe_layers, tok * (m.moe.n_routed_experts if m.moe else 0) * 4.0 * 2)):
            if k:
                t = t + k * (b / stream + lo)
        return np.where(tok > 0, t, 0.0)

    def _comm_vec(self, tok: np.ndarray, layers: int, moe_layers: int, prefill: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(time, all-to-all part) of one pass's collectives (the per-pass items of _comm) at each per-rank token count."""
        m, lay, hw, cal, h = self.model, self.layout, self.hw, self.cal, self.h
        t = np.zeros_like(tok)
        a = np.zeros_like(tok)
        if layers == 0:
            return t, a

        def each(fn, b, *args):  # the collective model at each point (vectorised twins of the scalar functions)
            vec = _COMM_VEC.get(fn)
            if vec is not None:
                return vec(b, *args, hw, cal)
            return np.array([fn(x, *args, hw, cal) for x in b.tolist()])

        ar = tok * h * 2.0
        ar_t = each(allreduce_time, ar, lay.tp) if lay.tp > 1 else None
        if lay.tp > 1:
            t = t + layers * ar_t
            dense = layers - moe_layers
            if dense:
                t = t + dense * ar_t
        if moe_layers:
            if lay.ep > 1:
                tok_gpu = tok / lay.tp
                rows = (self.disp_rows_normal if prefill else self.disp_rows_ll) * self._imbalance_vec(tok / self.share)
                d_t = each(alltoall_time, tok_gpu * rows * h * self.disp_bytes, lay.ep)
                c_t = each(alltoall_time, tok_gpu * rows * h * 2.0, lay.ep)
                t = t + moe_layers * d_t + moe_layers * c_t
                a = a + moe_layers * d_t + moe_layers * c_t
                if lay.moe_tp > 1:
                    t = t + moe_layers * each(allreduce_time, tok_gpu * h * 2.0, lay.moe_tp)
                if lay.tp > 1 and m.moe.n_shared_experts:
                    t = t + moe_layers * ar_t
            elif lay.moe_tp > 1:
                if lay.dp == 1:
                    t = t + moe_layers * each(allreduce_time, ar, lay.tp)
                else:
                    t = t + moe_layers * each(allreduce_time, tok / self.share * h * 2.0, lay.moe_tp)
        pos = tok > 0
        return np.where(pos, t, 0.0), np.where(pos, a, 0.0)

    def _main_vec(self, x: np.ndarray, prefill: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Everything of _nonattn that depends on the instance's token count (f-scaled ``x``), at each count."""
        m, lay, hw, cal = self.model, self.layout, self.hw, self.cal
        pos = x > 0
        t = self._gemm_vec(0, x, 0)
        if m.moe and self.n_moe_layers:
            t = t + np.where(pos, self.n_moe_layers * self._experts_vec(x), 0.0)
        tok = x * self.share
        t = t + self._other_vec(tok, self.n_layers, self.n_moe_layers)
        b = tok * self.h * 2.0
        t = t + np.where(b != 0, 1 * self._lo + b / self._stream, 0.0)  # embedding
        c, a = self._comm_vec(tok, self.n_layers, self.n_moe_layers, prefill)
        t = t + c
        if lay.tp > 1:
            t = t + allreduce_time_vec(b, lay.tp, hw, cal)  # embedding all-reduce
        if lay.pp > 1:
            t = t + np.array([(lay.pp - 1) * p2p_time(v, self.pp_cross, hw, cal) if v > 0 else 0.0 for v in b.tolist()])
        return t, a

    def _mtp_vec(self, x: np.ndarray, draft: int) -> tuple[np.ndarray, np.ndarray]:
        """Everything of _nonattn that depends on the MTP passes' token count (f-scaled decodes ``x``), at each count."""
        m = self.model
        passes = draft * m.mtp_layers
        t = self._gemm_vec(_MTP_SRC, x, draft)
        if m.moe and passes:
            t = t + np.where(x > 0, passes * self._experts_vec(x), 0.0)
        tok = x * self.share
        if passes:
            t = t + self._other_vec(tok, passes, passes if m.moe else 0)
        c, a = self._comm_vec(tok, passes, passes if m.moe else 0)
        return t + c, a


def _sum_min_s(c: int, n: int, cap: float) -> float:
    """sum_{j=1..n} min(c + j, cap) for scalars (ops.sum_min)."""
    if cap >= INF:
        return n * c + n * (n + 1) / 2
    k = min(max(cap - c, 0.0), n)
    return k * c + k * (k + 1) / 2 + (n - k) * cap


def _attn_timer(cal: CalibrationProfile, hbm_bw: float) -> Callable[[float, float, float], float]:
    """``StepCostModel._attn_time`` for floats in plain Python, ``peak * attn_compute()`` given as ``den``
    (``cal.attn_mem`` evaluated with numpy.interp's arithmetic when it is a table)."""
    table = cal.tables.get("attn_decode_mem")
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
