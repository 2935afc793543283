"""The ops of one forward step for a batch shape and layout, each op family written once.

Every family is a function of one count (the instance's tokens, the K/V up-projected tokens,
the sampled tokens, the MTP passes' tokens, the tokens whose logits are sampled) evaluated
at an array of points, and returns :class:`Terms`: per op its kernels and their FLOPs, bytes
and seconds at each point. ``StepCostModel`` builds its lookup tables by evaluating the
families over a grid of counts (the table is the model), and ``StepCostModel.step`` (the
breakdown) evaluates the same families at the one point of a batch. Attention reads per-request
contexts and is evaluated over the batch's requests (``attention``) or over consecutive decode
steps (``attention_decode_steps``), both through one roofline (``attn_roofline``).

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from twinfer.errors import TwinferError

from costmodels.calibration import CalibrationProfile
from costmodels.calibration_source import profile_for
from costmodels.comm import (
    DISPATCH_BYTES_PER_VALUE, allgather_time, allreduce_time, alltoall_time, combine_hidden_under_down, comm_sm_slowdown,
    block_touched, dispatch_payload_dtype, dispatch_rows_per_token, internode_normal_time, intranode_ep_time, node_fanout,
    p2p_time,
)
from costmodels.hardware import Hardware, get_hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import indexer_kv_bytes_per_token, kv_bytes_per_token_layer, kv_shard_divisor, mtp_kind
from costmodels.model_spec import ModelSpec
from costmodels.op_table import (MASKED_MAX_ROWS, MEASURED, MHC_OPS, MLA_ENTRY_DIMS, SCALED, ExpertGemms,
                                 GqaChunks, MhcKernels, TableGemms, TableMLA, gqa_decode_table, kernel_gemms, mhc_bytes,
                                 mhc_fallback_s, mhc_flops, mla_decode_table, nearest_gqa_layout, table_from_points)
from costmodels.op_table import fa3_key_walks, fa3_tile, gqa_work, transferred_one
from costmodels.op_table import load as load_op_tables
from costmodels.op_table import nearest as nearest_op_table_gpus
from costmodels.op_table import same_kind as same_kind_tables
from costmodels.offload import prefetch_for
from costmodels.ops import CATEGORIES, INF, AttnGeometry, OpCost, SortedSums, entries_last, entries_sum, geometry
from costmodels.params import Linear, dtype_bytes, experts_per_rank, attention_linears, embedding_linears, ffn_linears, mtp_linears, shard_divisor, weight_bytes_per_param

ATT, IDX, DENSE, EXPERT, COMM, OTHER = range(6)
A2A = 6  # extra slot of a category vector: the overlappable (EP all-to-all) part of COMM
_CAT = {"dense_gemm": DENSE, "indexer": IDX, "other": OTHER, "expert_gemm": EXPERT}
# what a GEMM's rows are: the instance's tokens, K/V up-projected tokens, sampled tokens, MTP passes' tokens
TOKENS, KV_UP, SAMPLED, MTP = range(4)
_SRC = {"tokens": TOKENS, "kv_up": KV_UP, "sampled": SAMPLED}


def default_expert_imbalance(layout: ParallelLayout) -> float:
    """Busiest EP rank's load over the mean: 1.2 without EPLB, 1.05 with >= ep redundant experts (assumption)."""
    if layout.ep <= 1:
        return 1.0
    return 1.2 - 0.15 * min(1.0, layout.eplb_redundant_experts / layout.ep)


@dataclass
class Terms:
    """Ops of one family at an array of points: per op (rows) its kernel count, and totals over its
    kernels of FLOPs, bytes and seconds (columns: the points)."""

    names: list[str]
    cats: list[int]
    kind: list[str]
    count: np.ndarray
    flops: np.ndarray
    byts: np.ndarray
    time: np.ndarray
    a2a: list[bool]

    def total(self) -> np.ndarray:
        """Seconds at each point (ops summed in order)."""
        return self.time.sum(axis=0)

    def a2a_total(self) -> np.ndarray | None:
        """Seconds of the EP all-to-all ops at each point (None: the family has none)."""
        rows = [i for i, a in enumerate(self.a2a) if a]
        return self.time[rows].sum(axis=0) if rows else None

    def add_to(self, v: np.ndarray, ops: list | None, j: int = 0) -> None:
        """Add point ``j`` to the category vector ``v`` (and its ops with kernels to ``ops``)."""
        for i, name in enumerate(self.names):
            t = float(self.time[i, j])
            v[self.cats[i]] += t
            if self.a2a[i]:
                v[A2A] += t
            if ops is not None and self.count[i, j] > 0:
                ops.append(OpCost(name, CATEGORIES[self.cats[i]], self.kind[i], int(self.count[i, j]),
                                  float(self.flops[i, j]), float(self.byts[i, j]), t))


def _terms(rows: list[tuple], n: int) -> Terms:
    """Terms from (name, category, count, flops, bytes, seconds, all-to-all) rows of arrays over ``n`` points."""
    def stack(k):
        out = np.empty((len(rows), n))   # each row broadcast into place (a copy, as np.array of broadcast views made)
        for i, r in enumerate(rows):
            out[i] = r[k]
        return out

    return Terms([r[0] for r in rows], [r[1] for r in rows], ["-"] * len(rows), stack(2), stack(3), stack(4), stack(5),
                 [r[6] for r in rows])



def transferred_note(measured_on: str, peak: str) -> str:
    """How a table measured on ``measured_on`` reaches this GPU (``op_table.transferred``), as the notes say it;
    ``peak``: the dtype the peak ratio is of ("FP8 ", "BF16 " or "")."""
    return (f"transferred from {measured_on}: its roofline moved to this GPU's bandwidth and math ceilings, its time "
            f"over the roofline scaled by the {peak}peak ratio")


def exp_bound_peak(hw: Hardware, d_qk: float, d_v: float) -> float:
    """Attention math ceiling of ``hw`` at head dims ``d_qk`` / ``d_v``: min(BF16 peak, 2 (d_qk + d_v) x its softmax
    exponential rate) FLOP/s (the BF16 peak where the catalog gives no exponential rate)."""
    peak = hw.bf16_tflops * 1e12
    return peak if hw.exp_rate is None else min(peak, 2.0 * (d_qk + d_v) * hw.exp_rate)

class StepOps:
    """Everything of a step's ops that depends only on model, hardware, layout and calibration."""

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
        measured_sampling: bool = False,
        measured_logits: bool = False,
        profile_fit: bool = False,
    ):
        self.model, self.hw, self.layout = model, hw, layout
        # True: a measured profile's fit prices these ops (costmodels.profiled). The model's own BF16 GEMMs beside
        # weights in another dtype (router, heads) keep the analytic ramp, and the routed experts the ramp without the
        # layout-kernel rows (where the profile did not time its own MoE layer), as that fit took them; else the FP8
        # table transfers to the BF16 rows too and the grouped tables price the experts
        self.profile_fit = bool(profile_fit)
        # True: the caller prices sampling (and, ``measured_logits``, the logits GEMM before it) from a measured table
        # (costmodels.profiled: a measured executor's sampler); these ops are then left out of the step's terms
        self.sampling_measured = bool(measured_sampling)
        self.logits_measured = bool(measured_logits)
        self.cal = calibration or profile_for(hw)  # the hardware's measured block, else the H200-derived defaults
        for dtype, field in ((layout.weight_dtype, "layout.weight_dtype"), (layout.experts_dtype, "layout.expert_dtype")):
            hw.check_dtype(dtype, field)  # FP8 on a GPU without FP8 is an error, never a silent fallback
        layout.check_model(model)      # a split the model cannot take is an error too, never priced
        self.dp_imbalance = max(1.0, dp_imbalance) if layout.dp > 1 else 1.0
        self.expert_imbalance = default_expert_imbalance(layout) if expert_imbalance is None else max(1.0, expert_imbalance)
        # expert_load(assignments) -> busiest EP rank's load over the mean for a step routing that
        # many token-expert assignments (costmodels.moe_load.ExpertLoad.imbalance); overrides the
        # constant expert_imbalance, so small batches pay their sampling noise and skew is explicit
        self.expert_load = expert_load if layout.ep > 1 else None
        self.share = self.dp_imbalance / layout.dp
        self._lo = self.cal.launch_overhead_s
        self._stream = hw.hbm_bw * self.cal.mem_eff  # elementwise kernels stream at the copy efficiency
        self._build_layers()
        self._build_gemms()
        self._build_attention()
        self._build_comm_constants()
        self._post_init()

    def _post_init(self) -> None:
        """Hook for subclasses: runs last in ``__init__``, once every op constant is built."""

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
        # CED (ModelSpec.ced_encoder_layers): in a step with prefill, the decoder layers run over the decodes' tokens
        # and only each prefill chunk's last ``ced_tail`` tokens (the families of those layers take a second count)
        self.ced = m.ced_encoder_layers is not None
        self.ced_tail = int(m.sliding_window or 0) if self.ced else 0
        dec = [i for i in range(self.n_layers) if m.ced_decoder(i)]
        self.n_dec_layers = len(dec)
        self.n_dec_moe_layers = sum(1 for i in dec if m.is_moe_layer(i))

    def _build_gemms(self) -> None:
        m, lay, cal, hw = self.model, self.layout, self.cal, self.hw
        rows = []  # (name, kind, cat, count, src, kn_local, w_bytes, io, dtype, is_mtp)

        def add(lins, kind, count, is_mtp):
            for lin in lins:
                if lin.shard == "expert":
                    continue
                div = shard_divisor(lin, m, lay)
                kn = lin.params / div
                bpp = weight_bytes_per_param(lin, lay, m)
                dtype = "bf16" if lin.wclass == "bf16" else lay.weight_dtype
                src = MTP if is_mtp else _SRC[lin.m_source]
                rows.append((lin.name, kind, _CAT[lin.category], count, src, kn, kn * bpp, (lin.k + lin.n) / div, dtype, is_mtp,
                             kernel_gemms(lin.name, lin.k, lin.n, div, m.hidden_size)))

        self.g_group: list[tuple[str, bool] | None] = []  # each row's (kind, moe) layer group; None: head/MTP (costmodels.replay)
        self.g_layers: list[list[int] | None] = []        # the layers each row runs in (None: head/MTP)
        kinds = m.kinds()
        for (kind, moe), count in self.groups.items():
            layers = [i for i, k in enumerate(kinds) if k == kind and m.is_moe_layer(i) == moe]
            partial = self._partial_linears(kind, layers)
            add([lin for lin in attention_linears(m, kind) + ffn_linears(m, moe) if lin.name not in partial], kind, count, False)
            self.g_layers += [layers] * (len(rows) - len(self.g_group))
            self.g_group += [(kind, moe)] * (len(rows) - len(self.g_group))
            # projections only some layers of the group have (a KV source's compressor, an index source's indexer query):
            # one row each over those layers; not a whole group's row (g_group None: costmodels.replay skips them)
            for lin, have in partial.values():
                add([lin], kind, len(have), False)
                self.g_layers.append(have)
                self.g_group.append(None)
        emb = embedding_linears(m)
        head = [e for e in emb if e.name == "lm_head"] or [e for e in emb if e.name == "embedding"]
        head_lin = head[0]
        if head_lin.name == "embedding":  # tied: the head reuses the embedding matrix
            head_lin = Linear("lm_head", m.hidden_size, m.vocab_size, "tp", "bf16", "dense_gemm", m_source="sampled")
        add([head_lin], "-", 1, False)
        if m.mtp_layers:
            add(mtp_linears(m) + [head_lin], self.mtp_kind, m.mtp_layers, True)
        self.g_layers += [None] * (len(rows) - len(self.g_group))
        self.g_group += [None] * (len(rows) - len(self.g_group))
        self.g_names = [r[0] for r in rows]
        self.g_kind = [r[1] for r in rows]
        self.g_cat = np.array([r[2] for r in rows], dtype=np.int64)
        self.g_count = np.array([r[3] for r in rows], dtype=float)
        self.g_src = np.array([r[4] for r in rows], dtype=np.int64)
        self.g_kn = np.array([r[5] for r in rows], dtype=float)
        self.g_w = np.array([r[6] for r in rows], dtype=float)
        self.g_io = np.array([r[7] for r in rows], dtype=float)
        self.g_dtype = [r[8] for r in rows]
        self.g_peak = np.array([hw.tflops(d) * 1e12 for d in self.g_dtype])
        self.g_dtypes = sorted(set(self.g_dtype))
        self.g_math = {d: hw.math_dtype(d) for d in self.g_dtypes}   # the math each dtype's GEMMs run (its efficiency)
        self.g_dmask = {d: np.array([x == d for x in self.g_dtype]) for d in self.g_dtypes}
        self._src_rows = [np.flatnonzero(self.g_src == k) for k in range(4)]
        self.g_table = self._gemm_table([r[10] for r in rows])
        if m.moe:  # routed experts
            e = m.moe.n_routed_experts
            self.e_total = e
            self.e_local = float(experts_per_rank(m, lay))   # the fullest rank's slots (uneven splits round up)
            self.e_params_local = 3 * m.hidden_size * m.moe.moe_intermediate_size / lay.moe_tp
            self.e_bpp = dtype_bytes(lay.experts_dtype, m)  # FP4 in the model's block format (mxfp4 / nvfp4)
            self.e_peak = hw.tflops(lay.experts_dtype) * 1e12
            self.e_math = hw.math_dtype(lay.experts_dtype)   # the math the experts' GEMMs run (its efficiency)
            self.e_io_per_token = (2 * m.hidden_size + 3 * m.moe.moe_intermediate_size / lay.moe_tp) * 2.0

    def _partial_linears(self, kind: str, layers: list[int]) -> dict[str, tuple[Linear, list[int]]]:
        """name -> (projection, the layers of ``layers`` that have it) for the attention projections only some of them
        have (``attention_linears`` per layer: kv_share_source / index_source_layers); empty for other models."""
        m = self.model
        if not m.kv_share_source and m.index_source_layers is None:
            return {}
        have: dict[str, tuple[Linear, list[int]]] = {}
        for i in layers:
            for lin in attention_linears(m, kind, i):
                have.setdefault(lin.name, (lin, []))[1].append(i)
        return {name: (lin, ls) for name, (lin, ls) in have.items() if len(ls) < len(layers)} | \
            {lin.name: (lin, []) for lin in attention_linears(m, kind) if lin.name not in have}

    def _gemm_table(self, shapes: list[list[tuple[int, int]]]) -> TableGemms | None:
        """Device times of the weight GEMMs from the measured FP8 table when the calibration names op tables: the FP8
        rows as measured (or transferred to this GPU by its datasheet), rows in another dtype (BF16 heads and routers,
        FP4 weights) transferred to their own bytes, peak and compute efficiency (``TableGemms``); the same rule on any
        GPU with FP8-class tensor cores, whoever made it. None (the analytic ramp) without op tables."""
        name = self.cal.op_tables
        if not name or not self.hw.has_fp8:
            return None
        # a calibration that timed the model's own GEMM shapes at its token buckets (bench_gemm_shapes) prices them
        # from that table on the GPU it ran on; else the committed op table of the engine's library
        own = table_from_points(self.cal.op_points, self.cal.measured_on) if self.cal.op_points else None
        tables = load_op_tables(name)
        if own is not None and own.measured_on.lower() == self.hw.name.lower():
            table = own
        else:
            table = tables.gemm_table("fp8", self.cal.gemm_libs()) if tables else None
        if table is None:
            return None
        # BF16 weight GEMMs (routers, heads, BF16 layouts) from the measured BF16 table where there is one (cuBLAS)
        bf16 = tables.gemm_table("bf16") if tables else None
        # every row; with ``profile_fit`` (a measured profile's fit) not the model's own BF16 rows beside weights in
        # another dtype (router, heads): they stay on the analytic ramp that fit was made with
        wd = self.layout.weight_dtype
        covers = np.array([kn > 0 and not (self.profile_fit and d == "bf16" != wd) for d, kn in zip(self.g_dtype, self.g_kn)])
        if not covers.any():
            return None
        per_elem = np.divide(self.g_w, self.g_kn, out=np.zeros_like(self.g_w), where=self.g_kn > 0)
        return TableGemms.on(table, self.hw, shapes, covers, self.g_dtype, per_elem, self.cal.mem_eff, self.cal.gemm_compute_eff,
                             {"bf16": bf16} if bf16 is not None else None)

    def gemm_table_note(self) -> str | None:
        """Where the dense GEMM times come from (None: the analytic ramp for all of them)."""
        g = self.g_table
        if g is None:
            return None
        src = {r: (MEASURED if all(s in g.table_of(r).families for s in g.shapes[r]) else SCALED)
               for r in np.flatnonzero(g.covers) if r not in g.rows and r not in g.own}
        by: dict[str, set[str]] = {}
        for r, s in src.items():
            by.setdefault(s, set()).add(self.g_names[r])
        own: dict[tuple[str, str], dict[str, set[str]]] = {}   # (dtype, lib) -> source -> names
        for r, (t, _, _) in g.own.items():
            s = MEASURED if all(x in t.families for x in g.shapes[r]) else SCALED
            own.setdefault((t.dtype, t.lib), {}).setdefault(s, set()).add(self.g_names[r])
        how = "measured" if g.same_gpu else transferred_note(g.table.measured_on, "")
        clauses = []

        def names(v) -> str:   # the MTP module's GEMMs run only when the engine drafts
            return ", ".join(f"{n} (when drafting)" if n.startswith("mtp_") else n for n in sorted(v))
        dts = sorted({self.g_dtype[r] for r in g.rows})
        if by or dts:
            src_txt = f" ({g.table.source})" if g.table.source else ""
            clauses.append(f"FP8 from the {g.table.lib} FP8 table of {g.table.measured_on}{src_txt} ({how})"
                           + "".join(f"; {s} shapes: {names(v)}" for s, v in sorted(by.items())))
        if dts:
            clauses.append(f"{', '.join(d.upper() for d in dts)} weight GEMMs from that FP8 table at their shape, their "
                           "time above one GEMM's floor moved by the bytes they move, bounded by this GPU's bandwidth and "
                           "math ceilings at their dtype")
        for (dt, lib), srcs in sorted(own.items()):
            r0 = next(r for r, (t, _, _) in g.own.items() if (t.dtype, t.lib) == (dt, lib))
            clauses.append(f"{dt.upper()} weight GEMMs from the {lib} {dt.upper()} table of {g.table_of(r0).measured_on} "
                           f"({'measured' if g.own_here(r0) else how})"
                           + "".join(f"; {s} shapes: {names(v)}" for s, v in sorted(srcs.items())))
        ramp = sorted({self.g_names[r] for r in range(len(g.covers)) if not g.covers[r]})
        if ramp:
            clauses.append(f"the model's own BF16 GEMMs ({', '.join(ramp)}) on the analytic ramp, as the measured profile's "
                           "fit took them")
        return ("dense GEMMs from measured device-time tables (unmeasured N x K scaled from the nearest measured one by "
                "roofline, M beyond 16384 along the roofline): " + "; ".join(clauses))

    def _build_attention(self) -> None:
        m, lay, cal = self.model, self.layout, self.cal
        self.heads_local = m.num_attention_heads / lay.tp
        kinds: dict[str, int] = {}
        for (kind, _), c in self.groups.items():
            kinds[kind] = kinds.get(kind, 0) + c
        self.att_kinds = [(geometry(m, k), c) for k, c in kinds.items()]
        self.att_groups, self.att_dec = self._attention_groups()
        self.att_mtp = geometry(m, self.mtp_kind) if m.mtp_layers else None
        self.att_entry_bytes = kv_bytes_per_token_layer(m, lay.kv_dtype) / kv_shard_divisor(m, lay)
        self.att_peak = self.hw.bf16_tflops * 1e12
        self.idx_peak = self.hw.tflops(m.indexer.dtype) * 1e12 if m.indexer else 0.0
        self.idx_key_bytes = indexer_kv_bytes_per_token(m) if m.indexer else 0.0
        self._att_den = self.att_peak * cal.attn_compute()
        # softmax exponentials (one per score per query head) run on the SFUs (MUFU.EX2), beside the tensor cores;
        # None: the catalog entry gives no rate, no exponential bound (att_den)
        self.exp_rate = self.hw.exp_rate
        self._idx_den = self.idx_peak * cal.attn_compute() if m.indexer else 1.0
        self._idx_coef = 2.0 * m.indexer.n_heads * m.indexer.head_dim if m.indexer else 0.0
        self.mla_table = self._mla_table()
        self._mla_by_q: dict[int, TableMLA | None] = {}   # mla_for's tables of draft-verifying decodes
        self.kv_heads_local = m.num_kv_heads / kv_shard_divisor(m, lay) if m.attention != "mla" else 0.0
        self.gqa_chunks, self.gqa_chunks_on, self.gqa_busy = self._gqa_chunks()
        self.decode_stream = self._decode_stream()
        self.chunk_table = cal.tables.get("attn_prefill_chunk")   # PrefillChunkTable (a measured profile's) or None
        # MoELayerTable (a measured profile's): the routed experts' measured device time, where it timed this MoE on one GPU
        mt = cal.tables.get("moe_layer")
        self.moe_table = mt if (mt is not None and m.moe and lay.ep == 1 and lay.moe_tp == 1 and not lay.eplb_redundant_experts
                                and mt.matches(m.moe.n_routed_experts, m.moe.top_k, m.hidden_size, m.moe.moe_intermediate_size,
                                               lay.experts_dtype)) else None
        self.e_table = self._expert_table()
        self.mhc_k = self._mhc_kernels()

    def _expert_table(self) -> ExpertGemms | None:
        """The routed experts' grouped FP8 GEMMs from the measured grouped tables at this layout's expert shapes (gate_up
        2I/TP x H, down H x I/TP) where the calibration names op tables that measured both; None (the bandwidth ramp)
        for experts in another dtype, a profile that measured its own MoE layer or grouped-GEMM bandwidth, or shapes no
        table holds."""
        m, lay, cal = self.model, self.layout, self.cal
        if (not m.moe or self.moe_table is not None or self.profile_fit or "expert_mem" in cal.tables or not cal.op_tables
                or not self.hw.has_fp8 or lay.experts_dtype != "fp8"):
            return None
        h, inter, tp = m.hidden_size, m.moe.moe_intermediate_size, lay.moe_tp
        if inter % tp:
            return None
        # this GPU's own grouped tables, or those of a GPU of the same die and memory (the H100's for an H800), else
        # the profile's op tables transferred, else the nearest measured GPU's that hold the layout's shapes (a TP
        # shard only the H100 measured: its kernel moved here, not the bandwidth ramp, which priced the H200's TP8
        # shards 1.8x faster than the H100's measured ones, and a GPU 0.05 TB/s off an H100 13% faster than the H100)
        for name in dict.fromkeys((*same_kind_tables(self.hw), cal.op_tables, *nearest_op_table_gpus(self.hw))):
            tables = load_op_tables(name)
            got = ExpertGemms.on(tables, self.hw, [(2 * inter // tp, h), (h, inter // tp)], cal.mem_eff,
                                 cal.gemm_compute_eff.get("fp8", 0.662)) if tables is not None else None
            if got is not None:
                return got
        return None

    def _mhc_kernels(self) -> MhcKernels | None:
        """The mHC kernels around each block from a measured table (this model's streams and width where it holds
        them, else its shape nearest in bytes a token, ``MhcKernels.on``): this GPU's own, a GPU's of the same die and
        memory, else the profile's op tables, else any measured GPU's, transferred; None (bytes at the streaming rate
        plus a launch each) for a model without hyper-connections or where no table holds the mHC stage."""
        m, cal = self.model, self.cal
        if m.hc_mult <= 1:
            return None
        for tables in self._table_sources():
            got = MhcKernels.on(tables, self.hw, m.hc_mult, m.hidden_size, m.hc_sinkhorn_iters, cal.mem_eff,
                                cal.gemm_compute_eff.get("bf16", 0.662))
            if got is not None:
                return got
        return None

    def mhc_note(self) -> str | None:
        """Where the hyper-connection kernels' time comes from; None for a model without them."""
        m = self.model
        if m.hc_mult <= 1:
            return None
        proj = "DeepGEMM's tf32_hc_prenorm_gemm" if self.hw.vendor == "nvidia" else "a TF32/FP32-input GEMM"
        what = (f"mHC ({m.hc_mult} residual streams, {m.hc_sinkhorn_iters} Sinkhorn iterations): before each attention "
                f"and FFN block the mixing projection with the streams' squared norm (mhc_prenorm_gemm: {proj}, at "
                f"{self.hw.tf32_rate / 1e12:,.0f} TFLOP/s TF32 peak here) and one fused kernel (RMS, sigmoids, Sinkhorn, "
                "the streams' weighted sum), after it the stream mix (mhc_post); the streams' collapse before the head "
                "once a forward at the streaming rate")
        k = self.mhc_k
        if k is None:
            return what + ("; no table holds the mHC stage: each kernel is priced by its bytes at the streaming rate "
                           "plus one launch (the projection by its TF32 math where that is longer), without the "
                           "Sinkhorn chain's own latency")
        how = "measured here" if k.same_gpu else ("transferred: the part its streaming ceiling accounts for by the "
                                                  "bandwidth ratio, the projection's rest by the BF16 peak ratio, the "
                                                  "other kernels' launch and dependent steps as measured, bounded by "
                                                  "this GPU's streaming and TF32 ceilings")
        shape = "" if k.same_shape else (f", measured at {k.n_m} streams x {k.h_m} and taken at the token count that "
                                         f"moves this model's bytes there")
        ops = ", ".join(op for op in MHC_OPS if op in k.series)
        pre = (f"; the pre kernel from its table ({k.series['mhc_pre'].detail})" if "mhc_pre" in k.series else
               "; the pre kernel by its bytes at the streaming rate plus one launch" +
               (f" plus the Sinkhorn chain measured on the {k.measured_on}: {k.chain_s * 1e6:.3f} us an iteration "
                f"(a latency, as measured), {m.hc_sinkhorn_iters * k.chain_s * 1e6:.1f} us a block" if k.chain_s else ""))
        return what + f"; {ops} from the mHC table of {k.measured_on}{shape}, {how}{pre}"

    def _mhc_rows(self, tok: np.ndarray, layers: int) -> list[tuple]:
        """Rows of the three mHC kernels around each of a layer's two blocks (``layers`` layers over ``tok`` tokens)."""
        m = self.model
        n, h, k = m.hc_mult, m.hidden_size, self.mhc_k
        pos = tok > 0
        rows = []
        tf32 = self.hw.tf32_rate * self.cal.gemm_compute_eff.get("bf16", 0.662)
        c = 2 * layers
        for op in MHC_OPS:
            b, f = mhc_bytes(op, tok, n, h), mhc_flops(op, tok, n, h)
            # the table, else the bytes at the streaming rate (the projection's TF32 math where longer) plus a launch,
            # and for the pre kernel the measured Sinkhorn chain where a table holds it
            if k is not None and op in k.series:
                t = k.seconds(op, tok)
            else:
                t = mhc_fallback_s(op, tok, n, h, self._stream, self._lo, tf32)
                if op == "mhc_pre" and k is not None:
                    t = t + m.hc_sinkhorn_iters * k.chain_s
            rows.append((op, OTHER, np.where(pos, c, 0), np.where(pos, c * f, 0.0), np.where(pos, c * b, 0.0),
                         np.where(pos, c * t, 0.0), False))
        return rows

    def _attention_groups(self) -> tuple[list[tuple[AttnGeometry, int]], list[bool]]:
        """(geometry, layer count) of the layer groups attention is priced over, and whether each is a CED decoder
        group. ``att_kinds`` (one group per kind) unless the model names index sources (a layer reusing another's
        top-k runs no scoring: its geometry has no index) or a CED split."""
        m = self.model
        if m.index_source_layers is None and not self.ced and m.index_candidate_source is None:
            order = list(dict.fromkeys(m.kinds()))   # att_kinds' order: first appearance
            self.att_layer = [order.index(k) for k in m.kinds()]  # each layer's group (costmodels.replay prices layer runs)
            return list(self.att_kinds), [False] * len(self.att_kinds)
        counts: dict[tuple[str, bool, bool, int | None], int] = {}
        keys = []
        for i, kind in enumerate(m.kinds()):
            key = (kind, m.scores_index(i), m.ced_decoder(i), m.index_cap(i))
            counts[key] = counts.get(key, 0) + 1
            keys.append(key)
        self.att_layer = [list(counts).index(k) for k in keys]
        groups, dec = [], []
        for (kind, scores, is_dec, icap), c in counts.items():
            geo = geometry(m, kind)
            if geo.index_ratio and not scores:
                geo = replace(geo, index_ratio=0.0)
            elif geo.index_ratio and icap is not None:  # a two-level index: only the candidates are scored
                geo = replace(geo, index_cap=float(icap))
            groups.append((geo, c))
            dec.append(is_dec)
        return groups, dec

    def ced_tokens(self, new: np.ndarray, dec: np.ndarray) -> float | None:
        """Tokens the CED decoder layers process in a step: every decode token, and each prefill chunk's last
        ``ced_tail`` (None: not a CED model, every layer processes every token)."""
        if not self.ced or dec.all():  # (no prefill: every layer over every token)
            return None
        return float(new[dec].sum() + np.minimum(new[~dec], self.ced_tail).sum())

    def ced_tail_chunks(self, new: np.ndarray, ctx: np.ndarray, dec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(new, context) the CED decoder layers see: a prefill chunk of n tokens on c cached is its last
        min(n, ced_tail) tokens on c + n - that many; decodes unchanged."""
        tail = np.where(dec, new, np.minimum(new, self.ced_tail))
        return tail, ctx + new - tail

    def _mla_table(self) -> TableMLA | None:
        """Measured FlashMLA decode times for the dense-latent (``full``) layers when the calibration names op tables,
        this is an NVIDIA GPU and the layers are the measured kernel's (bf16 latent 512 + 64); else None (formula)."""
        m, lay, cal = self.model, self.layout, self.cal
        if not cal.op_tables or self.hw.vendor.lower() != "nvidia" or m.attention != "mla" or not m.mla.kv_up_proj \
                or lay.kv_dtype != "bf16" or not any(self.mla_covers(geo) for geo, _ in self.att_kinds):
            return None
        return self._mla_at(self.heads_local)

    def _mla_at(self, heads: float) -> TableMLA | None:
        """The calibration's FlashMLA table for ``heads`` query heads a GPU, moved to this GPU (``mla_decode_table``)."""
        cal = self.cal
        return mla_decode_table(load_op_tables(cal.op_tables), heads, self.att_peak, self.hw.hbm_bw, cal.mem_eff,
                                float(cal.attn_compute()))

    def _decode_stream(self) -> TableMLA | None:
        """How decode attention the FlashMLA table does not price (an FP8 or indexed cache, GQA, sliding layers,
        another vendor's GPU) reads its KV: as the measured FlashMLA kernel at its fewest query heads a GPU (16, TP8
        of DeepSeek-V3: memory-bound) reading the same bytes over the same batch (``stream_time``), moved to this GPU
        as the table itself is (``TableMLA``), where the calibration names op tables; else None (``attn_decode_mem``:
        the catalog's two FlashMLA points at 128 heads a GPU, compute-bound, which as a streaming rate read about
        half the table's at 0.2-0.9 GB: an FP8 cache's decode was priced slower than the BF16 one the table priced,
        a draft-verifying one 1.8x)."""
        if not self.cal.op_tables:
            return None
        if self.model.attention != "mla":
            # a GQA model's decode: the measured FlashAttention-3 GQA kernel at its nearest head layout, where a table
            # holds one (this GPU's, a GPU's of the same die and memory, the profile's, else any measured GPU's)
            for tabs in self._table_sources():
                if tabs.gqa_decode:
                    return gqa_decode_table(tabs, self.heads_local, self.kv_heads_local, self.model.head_dim,
                                            self.att_peak, self.hw.hbm_bw, self.cal.mem_eff, float(self.cal.attn_compute()))
        tabs = load_op_tables(self.cal.op_tables)
        return self._mla_at(min(tabs.mla_decode)) if tabs is not None and tabs.mla_decode else None

    def _table_sources(self):
        """Measured op tables nearest first, for a stage any GPU's table may price (mHC, GQA attention): this GPU's
        own, a GPU's of the same die and memory, the profile's, then every measured GPU's by datasheet distance."""
        for name in dict.fromkeys((*same_kind_tables(self.hw), self.cal.op_tables, *nearest_op_table_gpus(self.hw))):
            tabs = load_op_tables(name) if name else None
            if tabs is not None:
                yield tabs

    def _gqa_chunks(self) -> tuple[GqaChunks | None, object, GqaChunks | None]:
        """(the FlashAttention-3 GQA prefill table of the measured head layout nearest this model's, the GPU it was
        measured on, the same layout's marginal costs in a busy call where measured) for a GQA model where the
        calibration names op tables and a table holds the stage; else (None, None, None): prefill attention on the
        formula."""
        m = self.model
        if m.attention == "mla" or not self.cal.op_tables:
            return None, None, None
        for tabs in self._table_sources():
            if tabs.gqa_prefill:
                key = nearest_gqa_layout(list(tabs.gqa_prefill), self.heads_local, self.kv_heads_local, m.head_dim)
                return tabs.gqa_prefill[key], get_hardware(tabs.gpu), tabs.gqa_busy.get(key)
        return None, None, None

    def gqa_covers(self, geo: AttnGeometry | None) -> bool:
        """A layer the GQA prefill table speaks for: every cached entry read (no window, index or compression)."""
        return self.gqa_chunks is not None and geo is not None and geo.cap >= INF and geo.ratio == 1.0 \
            and not geo.window and not geo.index_ratio and not geo.prefill_upproj

    def gqa_chunks_seconds(self, geo: AttnGeometry, news, cached, s: float, over_dec: float = 0.0) -> float:
        """Seconds of one layer's prefill attention over chunks of ``news`` new on ``cached`` cached tokens at this
        model's heads on this GPU (``s``: the rank's share), from the GQA prefill table: each chunk's measured time at
        its shape (``GqaChunks.at`` on the measured GPU, then ``transferred_one``), split into its part of a busy call
        (its measured marginal cost there, ``gqa_busy``; the roofline at the calibration's efficiencies where none is
        measured) and the time over that part (launch, a wave's tail). One varlen kernel runs the chunks together, as
        serving engines call FlashAttention: their parts add, the time over them is paid once, the largest chunk's
        (one chunk: its measured time; 16 prompts of 512 tokens, Llama-3.1-70B TP8 heads on the H100: 39.8 us a
        layer, measured 38.6). ``over_dec``: the time over the roofline of the step's
        decodes in the same layer (``gqa_decode_over``), whose kernel call this is too: the larger of the two is paid
        (a mixed step's decodes and chunks are one varlen call)."""
        return self.gqa_chunks_call(geo, news, cached, s, over_dec)[0]

    def gqa_chunks_call(self, geo: AttnGeometry, news, cached, s: float, over_dec: float = 0.0) -> tuple[float, np.ndarray]:
        """(``gqa_chunks_seconds``, each chunk's part of the call at the rank's share ``s``, in batch order: the work
        its tiles put ahead of the later sequences', ``gqa_chain_floor``'s ``work``)."""
        parts, over = self.gqa_chunk_terms(geo, news, cached)
        parts = parts * s
        return float(parts.sum()) + max(0.0, over * s - over_dec), parts

    @property
    def gqa_walks(self) -> bool:
        """Whether a step's GQA attention can be bounded by its longest key walk (``gqa_chain_floor``: a GQA table
        speaks for a layer, and both GPUs' SM counts are known)."""
        on = self.gqa_chunks_on
        return self.gqa_chunks is not None and bool(self.hw.sm_count) and on is not None and bool(on.sm_count)

    def gqa_chain_floor(self, geo: AttnGeometry, news, keys, work=None) -> float:
        """Seconds one layer's FlashAttention-3 varlen call over sequences of ``news`` new tokens and ``keys`` keys
        (cached plus new) takes at least: the query tile with the most key tiles to walk after the call's splits
        (``fa3_key_walks``: FA3's split heuristics) walks them on one SM, one after another. Priced as the measured
        kernel's least time plus those key tiles at one SM's rate on the measured GPU's longest chunk
        (``GqaChunks.walk_rate``: its busiest SM's key tiles over its time), moved here by the math ceiling a SM. 0 where the GPU's SM count is
        not in the catalog or no GQA table speaks for the layer. Not scaled by a rank's share: a walk is one
        sequence's (with attention DP, the longest of the step's, wherever it runs). Measured (run
        ``gqa_mix_d535dec``, Llama-3.1-70B TP8 heads on the H100): a 2,048-token prompt, a 512-token chunk over 4,096
        cached and a 128-token chunk over 16,384 cached in one call take 189.9 us (unsplit: the last chunk's 129 key
        tiles in a row), where the chunks apart take about 91.

        ``work``: per sequence in batch order, the seconds of the call's work in its tiles. FA3's
        persistent scheduler hands tiles out in batch order to whichever SM frees first, so a sequence's longest walk
        starts once the tiles ahead of it have been handed out: about their work over the SMs, which is their parts of
        a busy call (``gqa_chunks_call``; a decode's, its share of the decodes' roofline: ``gqa_decode_work``). The
        call then takes the
        latest of those starts plus the walk. Measured (gqa_order, H200): a 20,000-key decode pair behind a
        6,000-token chunk 359 us, in front of it 229 (8 / 1 heads); a 48-token chunk over 30,000 cached behind 60
        decodes of 1,500 keys 227 us, in front of them 155 (32 / 8 heads). A serving engine's step puts its decodes
        first (the executor's ``ForwardBatch``, vLLM's scheduler), so there a chunk's walk waits for them."""
        if not self.gqa_walks:
            return 0.0
        dq, dv = geo.d_qk_prefill, geo.d_v_prefill
        hkv, g, rate = self._walk_consts(dq, dv)
        bm, bn = fa3_tile(dq, dv, max(news) * g)
        sms = self.hw.sm_count
        walks, splits = fa3_key_walks(news, keys, hkv, g, sms, bm, bn)
        walks = walks * (2.0 * bm * bn * (dq + dv) / rate)
        if work is not None:
            # the work and the tiles ahead of each sequence: while fewer tiles than the SMs, its first tile starts at
            # once; past them, the work ahead less about one tile of it, which the SMs still run when its turn comes
            # (equal tiles in waves: exactly the waves before it)
            tiles = hkv * np.ceil(np.asarray(news, float) * g / bm) * splits
            ahead = np.concatenate(([0.0], np.cumsum(work)[:-1]))
            n_ahead = np.concatenate(([0.0], np.cumsum(tiles)[:-1]))
            walks = walks + ahead * np.maximum(0.0, 1.0 - sms / np.maximum(n_ahead, 1.0))
        return self.gqa_chunks.floor_s() + float(walks.max())

    @staticmethod
    def gqa_decode_work(t: float, over: float, keys) -> np.ndarray:
        """Each decode's part of a GQA varlen call (``gqa_chain_floor``'s ``work``): the decodes' time ``t`` less its
        part over the roofline ``over``, shared by the keys each reads."""
        keys = np.asarray(keys, float)
        return (t - over) / max(float(keys.sum()), 1e-30) * keys

    def _walk_consts(self, dq: float, dv: float) -> tuple[int, int, float]:
        """(KV heads a GPU, query heads a KV head, FLOP/s of one SM on a key tile here) of ``gqa_chain_floor``."""
        tab, mhw, sms = self.gqa_chunks, self.gqa_chunks_on, self.hw.sm_count
        hkv = max(1, round(self.kv_heads_local))
        rate = tab.walk_rate(mhw.sm_count) * (self.att_math_peak(dq, dv) / sms) \
            / (exp_bound_peak(mhw, tab.d, tab.d) / mhw.sm_count)
        return hkv, max(1, round(self.heads_local / hkv)), rate

    def gqa_decode_over(self, t: float, flops: float, byts: float, den: float) -> float:
        """The time over the roofline of a GQA decode kernel priced ``t`` seconds for ``flops`` / ``byts`` (math at
        ``den``): what the same varlen call's prefill chunks share (``gqa_chunks_seconds``)."""
        return max(0.0, t - max(flops / den, byts / (self.cal.mem_eff * self.hw.hbm_bw)))

    def gqa_chunks_parts(self, geo: AttnGeometry, news, cached) -> tuple[float, float]:
        """(the chunks' parts of a busy call summed, the largest time over its part) of ``gqa_chunks_seconds``,
        unscaled."""
        parts, over = self.gqa_chunk_terms(geo, news, cached)
        return float(parts.sum()), over

    def gqa_chunk_terms(self, geo: AttnGeometry, news, cached) -> tuple[np.ndarray, float]:
        """(each chunk's part of a busy call, in batch order, the largest time over a part) of ``gqa_chunks_parts``,
        unscaled."""
        tab, mhw = self.gqa_chunks, self.gqa_chunks_on
        hq, hkv = self.heads_local, self.kv_heads_local
        me, ce = self.cal.mem_eff, float(self.cal.attn_compute())
        dq, dv = geo.d_qk_prefill, geo.d_v_prefill
        # the math ceilings: the BF16 peak, or where lower the softmax exponentials' rate (att_math_peak), on the
        # measured GPU and here: an exponential-bound GPU's chunks move by its exponential rate
        mpeak = exp_bound_peak(mhw, dq, dv)
        peak = self.att_math_peak(dq, dv)
        moved = mpeak != peak or mhw.hbm_bw != self.hw.hbm_bw
        tpeak = exp_bound_peak(mhw, tab.d, tab.d)   # the measured layout's math ceiling there
        busy = self.gqa_busy
        parts = np.zeros(len(news))
        over = 0.0
        for i, (n, c) in enumerate(zip(news, cached)):
            n, c = float(n), float(c)
            if n <= 0:
                continue
            t = tab.at(n, c, hq, hkv, dq, dv, tpeak, mhw.hbm_bw, me, ce, mpeak)
            f, b = gqa_work(hq, hkv, dq, dv, n, c)
            f, b = float(f), float(b)
            if moved:
                t = transferred_one(t, f, b, mpeak, peak, mhw.hbm_bw, self.hw.hbm_bw, me, ce)
            if busy is not None:
                # the chunk's measured marginal cost in a busy call (its tiles' work beside other chunks': causal
                # diagonal, per-tile prologue and epilogue), moved as its time is
                part = busy.at(n, c, hq, hkv, dq, dv, tpeak, mhw.hbm_bw, me, ce, mpeak)
                if moved:   # work: in proportion to the roofline here against there (GqaChunks.proportional)
                    part *= max(b / (me * self.hw.hbm_bw), f / (ce * peak)) / max(b / (me * mhw.hbm_bw), f / (ce * mpeak))
            else:
                part = max(b / (me * self.hw.hbm_bw), f / (ce * peak))
            parts[i] = min(t, part)
            over = max(over, t - part)
        return parts, over

    def stream_time(self, batch: float, byts):
        """Seconds the decode attention of ``batch`` requests reading ``byts`` KV bytes streams them
        (``_decode_stream``; ``byts`` may be an array): the measured kernel at the batch and the context that reads
        the same latent bytes."""
        tab = self.decode_stream
        b = max(float(batch), 1e-9)
        tb = tab.token_bytes
        if tab.kv_units:
            # a GQA table: this layout's KV heads as more (or fewer) sequences of the table's, at the same context
            b *= tab.kv_units
        if isinstance(byts, float):
            return tab.at(b, max(byts / (b * tb), 1e-9), 0.0, byts) if byts > 0 else 0.0
        arr = np.asarray(byts, float)
        t = tab.many(b, np.maximum(arr / (b * tb), 1e-9), 0.0, arr)
        return np.where(arr > 0, t, 0.0)

    def mla_for(self, n_q: int) -> TableMLA | None:
        """The FlashMLA table for decodes of ``n_q`` query tokens each (1 + draft length): FlashMLA packs a request's
        queries with its heads (its metadata takes s_q x h_q query rows per KV head), so ``n_q`` tokens at h heads a
        GPU read the same KV as one token at n_q x h heads, at that count's time. None without a table."""
        if self.mla_table is None:
            return None
        if n_q <= 1:
            return self.mla_table
        got = self._mla_by_q.get(n_q)
        if got is None:
            got = self._mla_by_q[n_q] = self._mla_at(self.heads_local * n_q)
        return got

    @staticmethod
    def mla_covers(geo: AttnGeometry | None) -> bool:
        """A layer the FlashMLA table speaks for: dense latent cache (every entry read, no index, no window) of its dims."""
        return geo is not None and geo.kind == "full" and geo.cap >= INF and geo.ratio == 1.0 and not geo.window \
            and not geo.index_ratio and (geo.d_qk_decode, geo.d_v_decode) == MLA_ENTRY_DIMS

    def expert_note(self) -> str | None:
        """Where the routed experts' time comes from, and what it leaves out; None where the executor's measured MoE
        layer prices them (its op name says so) or the model has none."""
        if not self.model.moe or self.moe_table is not None:
            return None
        et = self.e_table
        if et is not None:
            shp = ", ".join(f"{n}x{k}" for n, k in et.shapes)
            how = ("measured" if et.measured_on.lower() == self.hw.name.lower() else
                   f"measured on the {et.measured_on}, this {self.hw.name}'s die and memory") if et.same_gpu else \
                transferred_note(et.measured_on, "FP8 ")
            cg = et.contig_experts
            big = (f"the contiguous table (measured at {', '.join(map(str, cg))} experts a GPU, uniform random "
                   "routing's counts)" if cg else "the masked table as in decode (the contiguous kernel's own cost over "
                   "the masked one's, 15-31% on the H100, not priced)")
            return (f"routed experts: the DeepGEMM grouped FP8 GEMM tables of {et.measured_on} at this layout's expert "
                    f"shapes (N x K {shp}), {how}. Decode steps (masked layout): the masked table at the mean rows an "
                    f"expert up to {MASKED_MAX_ROWS:g}, above that each expert's count Poisson at the mean over 128-row "
                    f"tiles. Steps with a prefill (contiguous layout): {big}. The layout kernels around them (permute, "
                    "SiLU-and-mul, combine) at the streaming rate, one launch each")
        if "expert_mem" in self.cal.tables:
            src = "the calibration profile's measured grouped-GEMM bandwidth"
        else:
            src = ("the GEMM bandwidth ramp (whole experts: within 7.4% of the H200's measured masked grouped FP8 GEMMs, "
                   "tests/test_expert_ramp_device.py)")
        split = self.layout.moe_tp
        line = f"routed experts: {src} over the bytes of the experts a step touches"
        if split > 1:
            line += (f"; each expert split {split} ways here, a shape no table covers (split shards measured on an H100: "
                     "-35% to +63%, short-K down projections priced fast)")
        return line + "; the layout kernels around them (permute, SiLU-and-mul, combine) at the streaming rate, one launch each"

    def attention_table_note(self) -> str | None:
        """Where decode attention times come from: the FlashMLA table for the dense-latent MLA layers it measured, the
        same kernel's streaming for every other decode (GQA, sliding, indexed, compressed layers, another vendor's
        GPU); None where neither is in use (the formula for all attention)."""
        t, st = self.mla_table, self.decode_stream
        if t is None and st is None and self.gqa_chunks is None:
            return None

        def how(x: TableMLA) -> str:
            return "measured" if x.same_gpu else transferred_note(x.measured_on, "BF16 ")
        parts = []
        if t is not None:
            heads = f"{t.heads:g} query heads/GPU" + (
                "" if t.heads == t.table_heads else
                f" (the measured {t.table_heads}'s time: FlashMLA pads heads to its tile)" if t.heads < t.table_heads else
                f" (scaled by the head ratio from the measured {t.table_heads})")
            parts.append(f"MLA decode attention (dense latent layers, one query per request) from the FlashMLA "
                         f"device-time table at (batch, mean context), {heads}, {how(t)}; MTP draft verification "
                         "(s_q > 1) at s_q x the heads (FlashMLA packs a request's queries with its heads)")
        if st is not None and st.kernel != "FlashMLA":
            parts.append(f"decode attention: the measured {st.kernel} GQA decode kernel of {st.measured_on} at "
                         f"{st.layout} a GPU (this layout: {self.heads_local:g} query / {self.kv_heads_local:g} KV heads "
                         f"of {self.model.head_dim}) at (batch, the context that reads the step's KV bytes) ({how(st)}; "
                         "the kernel's own latency included, no launch added), its math at the formula's rate")
        elif st is not None:
            which = "other layers' decode attention (indexed, compressed, sliding, or a cache the table did not measure)" \
                if t is not None else "decode attention"
            parts.append(f"{which}: its KV read as the measured FlashMLA kernel at {st.table_heads:g} query heads/GPU "
                         f"(memory-bound) reads the same bytes over the same batch ({how(st)}; the kernel's own latency "
                         "included, no launch added), its math at the formula's rate")
        ch, on = self.gqa_chunks, self.gqa_chunks_on
        if ch is not None:
            moved = "measured" if on.name == self.hw.name else transferred_note(on.name, "BF16 (or exponential-rate) ")
            parts.append(f"prefill attention (layers reading every cached entry): the measured FlashAttention-3 chunk "
                         f"table of {on.name} at {ch.hq} query / {ch.hkv} KV heads of {ch.d} over new x cached tokens "
                         f"(new {ch.news[0]}-{ch.news[-1]}; past the grid the edge's time scaled by the roofline), "
                         f"moved to this layout's heads by its roofline ({moved}); a step's chunks run as one kernel: "
                         "their roofline parts add, the time over the roofline is the largest chunk's")
        elif st is not None:
            parts.append("prefill attention's KV reads at the GEMM streaming ramp, its math on the formula")
        else:
            parts.append("prefill attention and the other layers' decode on the formula")
        return "; ".join(parts)

    def _build_comm_constants(self) -> None:
        m, lay, hw = self.model, self.layout, self.hw
        self.disp_dtype = dispatch_payload_dtype(lay)
        if self.disp_dtype == "nvfp4" and m.moe and lay.ep > 1 and not (hw.supports("fp4") and hw.vendor.lower() == "nvidia"):
            why = "has none" if not hw.supports("fp4") else "runs MXFP4, not NVIDIA's NVFP4"
            raise TwinferError(f"layout.dispatch_dtype: nvfp4 needs NVIDIA FP4 tensor cores (NVFP4 activations feed a W4A4 "
                               f"grouped GEMM) and {hw.name} {why}; allowed on {hw.name}: bf16, fp8")
        self.disp_bytes = DISPATCH_BYTES_PER_VALUE[self.disp_dtype]  # per hidden value (DeepEP FP8 by default)
        self.prefetch = prefetch_for(m, hw.host_bw, self.cal.comm_eff, lay)  # None: every weight in HBM
        self.pp_cross = lay.tp * lay.dp * lay.pp > hw.scaleup_domain
        self.h = m.hidden_size
        # remote copies per token of an EP dispatch: decode steps use DeepEP's low-latency kernels (a copy per
        # expert), steps with prefill its normal kernels (a copy per destination rank); see comm.dispatch_rows_per_token
        if m.moe and lay.ep > 1:
            args = (m.moe.n_routed_experts, m.moe.top_k, lay.ep, m.moe.n_group, m.moe.topk_group)
            self.disp_rows_ll = dispatch_rows_per_token(*args, normal=False)
            self.disp_rows_normal = dispatch_rows_per_token(*args, normal=True)
            moe = m.moe
            # DeepEP normal kernels: rows a rank receives per token inside one scale-up domain (the ranks a token
            # reaches, own included), and across nodes the (remote nodes, ranks) a token reaches (comm.node_fanout)
            self.ep_rows_intranode_normal = lay.ep * block_touched(moe.n_routed_experts, moe.top_k, moe.n_routed_experts / lay.ep,
                                                                   moe.n_group, moe.topk_group)
            self.ep_fanout = node_fanout(moe.n_routed_experts, moe.top_k, lay.ep, hw.scaleup_domain, moe.n_group, moe.topk_group)
        else:
            self.disp_rows_ll = self.disp_rows_normal = 0.0
        # compute slowdown beside DeepEP's (low-latency, normal) kernels under overlap (comm_sm_slowdown)
        sm = getattr(hw, "sm_count", None)
        self._sm_slow = (comm_sm_slowdown(sm, self.cal.deepep_ll_sms), comm_sm_slowdown(sm, self.cal.deepep_normal_sms))

    # ------------------------------------------------------------------ op families (x: arrays of f-scaled counts)
    def gemms(self, src: int, x: np.ndarray, draft: int = 0) -> Terms:
        """Dense GEMMs whose rows are ``src`` tokens (``x`` on the instance; this rank's share of them)."""
        if src == SAMPLED and self.logits_measured:
            return _terms([], x.size)
        rows = self._src_rows[src]
        mr = np.repeat((x * self.share)[None, :], rows.size, axis=0)
        ceff = np.empty_like(mr)
        for d in self.g_dtypes:
            mask = self.g_dmask[d][rows]
            if mask.any():
                ceff[mask] = self.cal.gemm_compute(mr[mask], self.g_math[d])
        col = lambda a: a[rows][:, None]  # noqa: E731
        flops = 2.0 * mr * col(self.g_kn)
        # the bandwidth ramp applies to all bytes the kernel moves (weights and activations)
        byts = col(self.g_w) + mr * col(self.g_io) * 2.0
        meff_bw = self.cal.gemm_mem(byts) * self.hw.hbm_bw
        t = np.maximum(flops / (col(self.g_peak) * np.maximum(ceff, 1e-9)), byts / meff_bw) + self._lo
        if self.g_table is not None:   # measured device time (CUDA graphs: the launch is inside it)
            for i, r in enumerate(rows):
                if self.g_table.covers[r]:
                    t[i] = self.g_table.seconds(r, mr[i])
        count = np.where(mr > 0, col(self.g_count) * draft if src == MTP else col(self.g_count), 0.0)
        return Terms([self.g_names[r] for r in rows], self.g_cat[rows].tolist(), [self.g_kind[r] for r in rows],
                     count, count * flops, count * byts, count * t, [False] * rows.size)

    def expert_imbalance_at(self, tokens: np.ndarray):
        """Busiest EP rank's routed load over the mean for steps of ``tokens`` instance tokens."""
        if self.expert_load is None or not self.model.moe:
            return self.expert_imbalance
        many = getattr(self.expert_load, "many", None)  # costmodels.moe_load.ExpertLoad: one memo lookup per distinct grid point
        if many is not None:
            return np.maximum(1.0, many(np.asarray(tokens, float) * self.model.moe.top_k))
        return np.array([max(1.0, float(self.expert_load(v * self.model.moe.top_k))) for v in np.asarray(tokens, float).tolist()])

    def experts_touched(self, tok: np.ndarray, imbalance: np.ndarray | float | None = None) -> np.ndarray:
        """Distinct local experts the busiest EP rank reads for ``tok`` instance tokens. Under an expert-load model
        (``ExpertLoad.touched``) its own slots at their popularity; else each of the ``tok * top_k`` assignments lands
        on a given local expert with probability ``imbalance / E`` (the busiest rank takes ``imbalance`` times its
        share, spread over its experts): ``e_local (1 - (1 - imbalance / E)^assign)``, all of them at imbalance = ep."""
        tok = np.asarray(tok, float)
        assign = tok * self.model.moe.top_k
        touched = getattr(self.expert_load, "touched", None)
        if touched is not None:
            return np.minimum(touched(assign), self.e_local)
        imb = self.expert_imbalance_at(tok) if imbalance is None else imbalance
        p = np.minimum(1.0, np.asarray(imb, float) / self.e_total)
        return self.e_local * (1.0 - (1.0 - p) ** assign)

    def _expert_roofline(self, tok: np.ndarray, prefill: bool = False) -> tuple[np.ndarray, ...]:
        """One MoE layer's routed experts over ``tok`` instance tokens on the busiest EP rank: (seconds, experts
        touched, FLOPs, bytes, token-expert pairs). Seconds from the grouped tables where they measured this layout's
        shapes (``prefill``: the contiguous layout), else by the roofline (along which the measured MoE table
        extrapolates)."""
        tok = np.asarray(tok, float)
        assign = tok * self.model.moe.top_k
        imb = self.expert_imbalance_at(tok)
        tok_rank = assign / self.layout.ep * imb
        touched = self.experts_touched(tok, imb)
        flops = 2.0 * tok_rank * self.e_params_local
        byts = touched * self.e_params_local * self.e_bpp + tok_rank * self.e_io_per_token
        if self.e_table is not None:   # measured device time of the two grouped GEMMs (CUDA graphs: launches inside)
            t = self.e_table.seconds(tok_rank / np.maximum(touched, 1e-9), touched, prefill)
            return np.where(tok_rank > 0, t, 2 * self._lo), touched, flops, byts, tok_rank
        ceff = self.cal.gemm_compute(tok_rank / np.maximum(touched, 1e-9), self.e_math)
        meff = self.cal.expert_mem(byts)
        t = np.maximum(flops / (self.e_peak * np.maximum(ceff, 1e-9)), byts / (self.hw.hbm_bw * np.maximum(meff, 1e-9))) + 2 * self._lo
        return t, touched, flops, byts, tok_rank

    def experts(self, tok: np.ndarray, layers: int, label: str, prefill: bool = False) -> Terms:
        """Routed experts of ``layers`` MoE layers over ``tok`` instance tokens, on the busiest EP rank (``prefill``: a
        step with prefill, the contiguous grouped layout; else the masked one)."""
        if not self.model.moe or not layers:
            return _terms([], tok.size)
        t, touched, flops, byts, pairs = self._expert_roofline(tok, prefill)
        src = ""
        if self.moe_table is not None:
            # the executor's own MoE layer, its device time measured at these token counts (uniform routing, one GPU);
            # beyond the largest count the roofline at that count's measured/roofline ratio carries it
            t, ext = self.moe_table(tok, lambda x: self._expert_roofline(x)[0])
            src = ", measured MoE layer table" + (", extrapolated beyond its largest count" if ext.any() else "")
        k = np.where(tok > 0, float(layers), 0.0)
        name = f"{label} ({float(touched.flat[0]):.0f} experts touched/rank{src})"
        rows = [(name, EXPERT, k, k * flops, k * byts, np.where(tok > 0, layers * t, 0.0), False)]
        if self.moe_table is None and not self.profile_fit:   # the executor's measured layer holds its own layout kernels
            rows += self._moe_glue(tok, pairs, layers, label)
        return _terms(rows, tok.size)

    def _moe_glue(self, tok: np.ndarray, pairs: np.ndarray, layers: int, label: str) -> list[tuple]:
        """The memory-bound kernels around the two grouped GEMMs on the busiest EP rank, one launch each a layer
        (``kernels.fused_moe``'s glue; vLLM's and SGLang's DeepGEMM MoE run the same passes): permute (each received
        token's BF16 row read once, each of its pairs written into its expert's rows in the GEMM's input dtype, FP8 with
        its 1x128 scales), SiLU-and-mul (each pair's gate/up BF16 output read, the product written in the input dtype
        for the down GEMM) and combine (each pair's BF16 output read, scaled by its routing weight, summed into its
        token's row). Each at the streaming rate plus a launch: what the data movement costs, not a fit (the H200's
        Triton glue measured 0.45 ms where this prices 0.29 at 4,096 tokens on DeepSeek-V3's 256 experts, issue 18;
        tests/test_expert_tables.py). ``pairs``: the token-expert pairs the busiest rank receives."""
        m, lay = self.model, self.layout
        h, inter = self.h, m.moe.moe_intermediate_size / lay.moe_tp
        # received tokens: a token's pairs on one rank arrive once (top_k over ep of them on average, at least one)
        recv = pairs / max(1.0, m.moe.top_k / lay.ep)
        a = DISPATCH_BYTES_PER_VALUE[{"fp4": "nvfp4", "fp8": "fp8"}.get(self.hw.math_dtype(lay.experts_dtype), "bf16")]
        on = tok > 0
        prefix = label[: -len("routed_experts")]
        out = []
        for name, b in (("moe_permute", recv * h * 2.0 + pairs * h * a), ("moe_silu_mul", pairs * inter * (2 * 2.0 + a)),
                        ("moe_combine", pairs * h * 2.0 + recv * h * 2.0)):
            out.append((prefix + name, OTHER, np.where(on, layers, 0), np.zeros_like(b), np.where(on, layers * b, 0.0),
                        np.where(on, layers * (b / self._stream + self._lo), 0.0), False))
        return out

    def elementwise(self, tok: np.ndarray, layers: int, moe_layers: int, tag: str = "") -> Terms:
        """Norms, rope/quant/residual and router top-k of one pass over ``tok`` tokens of this rank (memory-bound), and
        a hyper-connection model's mHC kernels around each block (``_mhc_rows``; its norms then read the one stream
        the block takes, and the residual add is the post kernel's). ``tag`` prefixes the rows (``mtp_``, ``decoder_``)."""
        m, h = self.model, self.h
        items = (("rmsnorm", 2 * layers, 2 * tok * h * 2.0),
                 ("rope+act_quant" if m.hc_mult > 1 else "rope+act_quant+residual", 2 * layers, 2 * tok * h * 2.0),
                 ("router_topk", moe_layers, tok * (m.moe.n_routed_experts if m.moe else 0) * 4.0 * 2))
        pos = tok > 0
        rows = [(tag + name, OTHER, np.where(pos, k, 0), np.zeros_like(b), np.where(pos, k * b, 0.0),
                 np.where(pos, k * (b / self._stream + self._lo), 0.0), False) for name, k, b in items if k]
        if m.hc_mult > 1 and layers:
            rows += [(tag + r[0], *r[1:]) for r in self._mhc_rows(tok, layers)]
        return _terms(rows, tok.size)

    def embedding(self, tok: np.ndarray) -> Terms:
        """The embedding lookup of ``tok`` tokens of this rank; with hyper-connections the lookup writes every stream,
        and the streams collapse into one before the head (``mhc_head``: a two-pass kernel that reads them once and
        their projection weight)."""
        n, h = self.model.hc_mult, self.h
        b = tok * h * 2.0 * (1 + n) if n > 1 else tok * h * 2.0
        on = b != 0
        rows = [("embedding", OTHER, np.where(on, 1, 0), 0.0, b, np.where(on, self._lo + b / self._stream, 0.0), False)]
        if n > 1:
            hb = tok * (n * h * 2.0 + h * 2.0) + n * n * h * 4.0
            rows.append(("mhc_head", OTHER, np.where(on, 1, 0), 0.0, np.where(on, hb, 0.0),
                         np.where(on, self._lo + hb / self._stream, 0.0), False))
        return _terms(rows, tok.size)

    def sampling(self, s: np.ndarray, draft: int) -> Terms:
        """Sampling over the vocabulary for ``s`` tokens of this rank, and the logits all-gather over TP
        (once for the sampled tokens and once per MTP draft)."""
        m, lay = self.model, self.layout
        b = s * m.vocab_size * 4.0 * 2
        on = b != 0
        # a measured executor's sampler is priced from its own table outside the categories (ProfiledStepCost)
        rows = [] if self.sampling_measured else \
            [("sampling", OTHER, np.where(on, 2, 0), 0.0, b, np.where(on, 2 * self._lo + b / self._stream, 0.0), False)]
        if lay.tp > 1:
            b = s * m.vocab_size / lay.tp * 4.0
            on = b > 0
            rows.append(("logits_allgather", COMM, np.where(on, 1 + draft, 0), 0.0, np.where(on, (1 + draft) * b, 0.0),
                         np.where(on, (1 + draft) * allgather_time(b, lay.tp, self.hw, self.cal), 0.0), False))
        return _terms(rows, s.size)

    def collectives(self, tok: np.ndarray, layers: int, moe_layers: int, prefill: bool, tag: str = "") -> Terms:
        """TP all-reduces and EP dispatch/combine of one pass over ``tok`` tokens of this rank."""
        m, lay, hw, cal, h = self.model, self.layout, self.hw, self.cal, self.h
        rows = []  # (name, count, bytes per op, seconds per op, all-to-all)
        if layers:
            ar = tok * h * 2.0
            ar_t = allreduce_time(ar, lay.tp, hw, cal) if lay.tp > 1 else None
            if lay.tp > 1:
                rows.append((f"{tag}attn_allreduce(tp{lay.tp})", layers, ar, ar_t, False))
                if layers - moe_layers:
                    rows.append((f"{tag}ffn_allreduce(tp{lay.tp})", layers - moe_layers, ar, ar_t, False))
            if moe_layers and lay.ep > 1:
                tok_gpu = tok / lay.tp
                imb = self.expert_imbalance_at(tok / self.share)  # the busiest rank's tokens set the pace
                intranode = lay.ep <= hw.scaleup_domain
                if intranode and cal.alltoall_eff is None:
                    rows += self._intranode_ep(tok_gpu * imb, moe_layers, tag, prefill)
                elif prefill and not intranode:
                    rows += self._internode_normal(tok_gpu * imb, moe_layers, tag)
                else:  # low-latency kernels across nodes, or a measured all-to-all fraction inside one node
                    rows_tok = (self.disp_rows_normal if prefill else self.disp_rows_ll) * imb
                    mode = "normal" if prefill else "low-latency"
                    d_b, c_b = tok_gpu * rows_tok * h * self.disp_bytes, tok_gpu * rows_tok * h * 2.0
                    rows.append((f"{tag}ep_dispatch(ep{lay.ep}, {mode})", moe_layers, d_b, alltoall_time(d_b, lay.ep, hw, cal), True))
                    rows.append((f"{tag}ep_combine(ep{lay.ep}, {mode})", moe_layers, c_b, alltoall_time(c_b, lay.ep, hw, cal), True))
                if lay.moe_tp > 1:
                    b = tok_gpu * h * 2.0
                    rows.append((f"{tag}moe_tp_allreduce(tp{lay.moe_tp})", moe_layers, b, allreduce_time(b, lay.moe_tp, hw, cal), False))
                if lay.tp > 1 and m.moe.n_shared_experts:
                    rows.append((f"{tag}shared_allreduce(tp{lay.tp})", moe_layers, ar, ar_t, False))
            elif moe_layers and lay.moe_tp > 1:
                if lay.dp == 1:
                    rows.append((f"{tag}moe_allreduce(tp{lay.tp})", moe_layers, ar, allreduce_time(ar, lay.tp, hw, cal), False))
                else:
                    b = tok / self.share * h * 2.0  # every DP rank's tokens gathered, reduced, scattered back
                    rows.append((f"{tag}moe_gather_scatter(tp{lay.moe_tp})", moe_layers, b, allreduce_time(b, lay.moe_tp, hw, cal), False))
        pos = tok > 0
        return _terms([(name, COMM, np.where(pos, k, 0), 0.0, np.where(pos, k * b, 0.0), np.where(pos, k * t, 0.0), a)
                       for name, k, b, t, a in rows], tok.size)

    def _intranode_ep(self, t: np.ndarray, moe_layers: int, tag: str, prefill: bool) -> list[tuple]:
        """DeepEP dispatch and combine inside one scale-up domain (``comm.intranode_ep_time``): each rank receives a
        row per token per rank it holds experts of (normal kernels: the ranks a token reaches, own rank included) or
        per chosen expert (low-latency kernels: ``top_k``). A profile with a measured all-to-all fraction
        (``alltoall_eff``, benchmarks/ep_bench.py) prices intranode EP with it instead (``comm.alltoall_time``).
        ``t``: the busiest rank's tokens."""
        lay, h = self.layout, self.h
        rows = self.ep_rows_intranode_normal if prefill else float(self.model.moe.top_k)
        mode = "normal" if prefill else "low-latency"
        return [(f"{tag}ep_{op}(ep{lay.ep}, {mode})", moe_layers, t * rows * h * per_value,
                 intranode_ep_time(t, rows, per_value, h, self.hw, self.cal), True)
                for op, per_value in (("dispatch", self.disp_bytes), ("combine", 2.0))]

    def _internode_normal(self, t: np.ndarray, moe_layers: int, tag: str) -> list[tuple]:
        """DeepEP's internode normal dispatch and combine (an EP group wider than one scale-up domain, steps with
        prefill): one RDMA copy per token per remote node its experts lie in, fanned out over NVLink inside the
        node, the two stages pipelined (``comm.internode_normal_time``). Bytes shown: what crosses the NIC. ``t``:
        the busiest rank's tokens."""
        lay, hw, cal, h = self.layout, self.hw, self.cal, self.h
        fan = self.ep_fanout
        out = []
        for op, per_value in (("dispatch", self.disp_bytes), ("combine", 2.0)):
            out.append((f"{tag}ep_{op}(ep{lay.ep}, normal, {fan[0]:.2f} remote nodes/token)", moe_layers,
                        t * fan[0] * h * per_value, internode_normal_time(t, per_value, h, fan, hw, cal), True))
        return out

    def comm_sm_slowdown(self, prefill: bool) -> float:
        """Compute slowdown beside DeepEP kernels under overlap: they hold ``deepep_normal_sms`` (steps with prefill)
        or ``deepep_ll_sms`` (decode) of the GPU's ``sm_count`` SMs (``comm.comm_sm_slowdown``; 1 when unknown)."""
        return self._sm_slow[prefill]

    def tbo_time(self, tc, tm, prefill: bool):
        """Step time with two micro-batches from one half's compute ``tc`` and all-to-all ``tm`` (floats or arrays):
        ``max(2 Tc, 2 Tm) + min(Tc, Tm) / layers``, where compute that runs beside the other half's all-to-all
        (for at most ``tm`` seconds) gets only the SMs the communication kernels leave: ``Tc = tc + min(tm, s tc)
        (1 - 1/s)`` with ``s`` = :meth:`comm_sm_slowdown`."""
        s = self._sm_slow[prefill]
        if not isinstance(tc, np.ndarray) and not isinstance(tm, np.ndarray):
            # one step (the simulator's per-step path): builtin min/max, no numpy scalar calls
            if s != 1.0:
                tc = tc + min(tm, s * tc) * (1.0 - 1.0 / s)
            return max(2 * tc, 2 * tm) + min(tc, tm) / self.n_layers
        if s != 1.0:
            tc = tc + np.minimum(tm, s * tc) * (1.0 - 1.0 / s)
        return np.maximum(2 * tc, 2 * tm) + np.minimum(tc, tm) / self.n_layers

    def overlap_combine_down(self, experts: Terms, comm: Terms, x: np.ndarray) -> None:
        """With ``comm_overlap: combine_down``, take off the combine rows of ``comm`` (in place) the seconds that hide
        under the down GEMM of ``experts`` (same layers, ``x`` instance tokens): ``comm.combine_hidden_under_down``
        pipelined over the experts touched per rank (each expert's finished down GEMM releases its combine sends).

        The down GEMM is taken as a third of the grouped expert GEMM time (it holds a third of the weights and
        FLOPs). While the sends run beside it the GEMM gets only the SMs they leave (:meth:`comm_sm_slowdown`, by the
        row's mode), so of ``hidden`` overlapped seconds it loses ``hidden (1 - 1/s)``: the row keeps
        ``combine - hidden / s``."""
        if self.layout.overlap != "combine_down" or not self.model.moe or self.layout.ep <= 1 or not experts.names:
            return
        rows = [i for i, n in enumerate(comm.names) if "ep_combine(" in n]
        if not rows:
            return
        down = experts.time[0] / 3.0   # the grouped GEMMs' row (the rows after it are the layout kernels)
        touched = self.experts_touched(x)
        for i in rows:
            s = self.comm_sm_slowdown(", normal" in comm.names[i])
            comm.time[i] = comm.time[i] - combine_hidden_under_down(comm.time[i], down, touched) / s
            comm.names[i] = comm.names[i][:-1] + ", exposed past the down GEMM)"

    def prefetched(self, t):
        """Step time(s) ``t`` (float or array) with the layout's offloaded weights prefetched over the host link
        (``costmodels.offload.Prefetch.step_time``); ``t`` itself when every weight is in HBM."""
        return t if self.prefetch is None else self.prefetch.step_time(t)

    def prefetch_into(self, t: float, breakdown: dict[str, float], ops: list) -> float:
        """``prefetched(t)`` for the breakdown: the exposed host-link time goes to 'communication' and the op list."""
        if self.prefetch is None:
            return t
        p = self.prefetch
        extra = p.exposed(t)
        breakdown["communication"] += extra
        ops.append(OpCost(f"weight_prefetch(host link, {self.layout.offload_fraction:.0%} {self.layout.offload_scope}: exposed)",
                          "communication", "-", p.offloaded_layers, 0.0, p.bytes_per_layer * p.offloaded_layers, extra))
        return t + extra

    def embedding_allreduce(self, tok: np.ndarray) -> Terms:
        """The TP all-reduce after the (vocabulary-sharded) embedding."""
        if self.layout.tp <= 1:
            return _terms([], tok.size)
        b = tok * self.h * 2.0
        return _terms([("embedding_allreduce", COMM, np.where(b > 0, 1, 0), 0.0, b,
                        allreduce_time(b, self.layout.tp, self.hw, self.cal), False)], tok.size)

    def pp_sends(self, tok: np.ndarray) -> Terms:
        """One activation send per pipeline stage boundary."""
        lay = self.layout
        if lay.pp <= 1:
            return _terms([], tok.size)
        b = tok * self.h * 2.0 * self.model.hc_mult   # every residual stream crosses (hyper-connections: hc_mult)
        on = b > 0
        return _terms([("pp_send", COMM, np.where(on, lay.pp - 1, 0), 0.0, np.where(on, (lay.pp - 1) * b, 0.0),
                        np.where(on, (lay.pp - 1) * p2p_time(b, self.pp_cross, self.hw, self.cal), 0.0), False)], tok.size)

    # ------------------------------------------------------------------ the families of each count
    def main_terms(self, x: np.ndarray, prefill: bool, xd: np.ndarray | None = None) -> list[Terms]:
        """Ops over the instance's ``x`` tokens (all layers; EP in normal mode when the step has prefill).
        A CED model given ``xd`` (the decoder layers' tokens, :meth:`ced_tokens`) prices its decoder layers over
        ``xd``: ``part_terms(x, "enc") + part_terms(xd, "dec")``."""
        if self.ced and xd is not None:
            return self.part_terms(x, prefill, "enc") + self.part_terms(xd, prefill, "dec")
        tok = x * self.share
        ex, co = self.experts(x, self.n_moe_layers, "routed_experts", prefill), self.collectives(tok, self.n_layers, self.n_moe_layers, prefill)
        self.overlap_combine_down(ex, co, x)
        return [self.gemms(TOKENS, x), ex, self.elementwise(tok, self.n_layers, self.n_moe_layers), self.embedding(tok),
                co, self.embedding_allreduce(tok), self.pp_sends(tok)]

    def part_terms(self, x: np.ndarray, prefill: bool, part: str) -> list[Terms]:
        """A CED model's main terms split by layers: ``enc`` = the encoder layers plus what runs once (embedding,
        its all-reduce, pipeline sends) over ``x``; ``dec`` = the decoder layers over ``x``."""
        tok = x * self.share
        dec = part == "dec"
        layers = self.n_dec_layers if dec else self.n_layers - self.n_dec_layers
        moe = self.n_dec_moe_layers if dec else self.n_moe_layers - self.n_dec_moe_layers
        ex = self.experts(x, moe, "decoder_routed_experts" if dec else "routed_experts", prefill)
        co = self.collectives(tok, layers, moe, prefill, "decoder_" if dec else "")
        self.overlap_combine_down(ex, co, x)
        fams = [self._gemm_part(x, dec), ex, self.elementwise(tok, layers, moe, "decoder_" if dec else ""), co]
        return fams if dec else fams + [self.embedding(tok), self.embedding_allreduce(tok), self.pp_sends(tok)]

    def _gemm_part(self, x: np.ndarray, dec: bool) -> Terms:
        """``gemms(TOKENS, x)`` restricted to the decoder (or encoder) layers: each row's share of its group's layers."""
        fam = self.gemms(TOKENS, x)
        share = self.row_share(TOKENS, self.model.ced_decoder)
        share = share if dec else 1.0 - share
        for a in ("count", "flops", "byts", "time"):
            setattr(fam, a, getattr(fam, a) * share[:, None])
        if dec:
            fam.names = [f"decoder_{n}" for n in fam.names]
        return fam

    def row_share(self, src: int, member: Callable[[int], bool]) -> np.ndarray:
        """Per GEMM row of ``src`` (``gemms(src, ...)``'s order), the share of the layers it runs in
        (``g_layers``) for which ``member(layer)`` holds; 0 for head/MTP rows."""
        return np.array([sum(member(i) for i in self.g_layers[r]) / len(self.g_layers[r]) if self.g_layers[r] else 0.0
                         for r in self._src_rows[src]])

    def mtp_terms(self, x: np.ndarray, draft: int) -> list[Terms]:
        """Ops of ``draft`` MTP passes over ``x`` decodes (one token each; decode-only, so low-latency EP)."""
        passes = draft * self.model.mtp_layers
        moe_passes = passes if self.model.moe else 0
        tok = x * self.share
        ex, co = self.experts(x, passes, "mtp_routed_experts"), self.collectives(tok, passes, moe_passes, False, "mtp_")
        self.overlap_combine_down(ex, co, x)
        return [self.gemms(MTP, x, draft), ex, self.elementwise(tok, passes, moe_passes, "mtp_") if passes else _terms([], x.size), co]

    def nonattn(self, total, kv_up, sampled, n_dec, draft, has_prefill, f, ops: list | None = None,
                dec_total: float | None = None) -> np.ndarray:
        """Category times (plus the all-to-all slot) of everything but attention and the indexer, at one point
        (the families ``StepCostModel``'s tables hold, evaluated once). ``dec_total``: a CED model's decoder-layer
        tokens (:meth:`ced_tokens`; None: every layer over ``total``)."""
        draft = int(draft)
        one = lambda v: np.array([v * f], float)  # noqa: E731
        xd = None if dec_total is None else one(dec_total)
        fams = self.main_terms(one(total), bool(has_prefill), xd) + [self.gemms(KV_UP, one(kv_up)), self.gemms(SAMPLED, one(sampled))]
        if draft and self.model.mtp_layers:
            fams += self.mtp_terms(one(n_dec), draft)
        fams.append(self.sampling(one(sampled + n_dec * draft) * self.share, draft))
        v = np.zeros(7)
        for fam in fams:
            fam.add_to(v, ops)
        return v

    # ------------------------------------------------------------------ attention
    def att_den(self, d_qk: float, d_v: float) -> float:
        """Achieved FLOP/s of attention math over scores of ``d_qk`` + ``d_v`` dims: the BF16 tensor peak, or the
        SFU exponential rate times the 2 (d_qk + d_v) FLOP a score costs per head (one exponential each) where that
        is lower, at the ``attn_compute`` efficiency. max(FLOPs / peak, exps / rate) as one rate: the two units
        overlap (FlashAttention-3/4 ping-pong softmax against the MMAs). Exponential-bound below
        peak / rate FLOP a score: ~512 on B200/GB200 (head dim < 128), ~256 on Hopper and Blackwell Ultra."""
        return self.att_math_peak(d_qk, d_v) * self.cal.attn_compute()

    def att_math_peak(self, d_qk: float, d_v: float) -> float:
        """``att_den`` before the efficiency: min(BF16 peak, 2 (d_qk + d_v) x exponential rate) FLOP/s."""
        return exp_bound_peak(self.hw, d_qk, d_v)

    def exp_bound_note(self) -> str | None:
        """Which attention kinds are priced at the SFU exponential rate rather than the tensor peak (None: none)."""
        if self.exp_rate is None:
            return None
        bound: dict[str, float] = {}   # "kind phase" -> math time over the tensor-bound time
        for geo, _ in self.att_groups + ([(self.att_mtp, 0)] if self.att_mtp is not None else []):
            for phase, dq, dv in (("prefill", geo.d_qk_prefill, geo.d_v_prefill), ("decode", geo.d_qk_decode, geo.d_v_decode)):
                if self.att_math_peak(dq, dv) < self.att_peak:
                    bound[f"{geo.kind} {phase}"] = self.att_peak / self.att_math_peak(dq, dv)
        if not bound:
            return None
        which = ", ".join(f"{k} x{v:.2f}" for k, v in bound.items())
        return (f"attention exponential-bound on {self.hw.name} ({which} the tensor-bound math time): one softmax "
                f"exponential per score and head at {self.exp_rate / 1e12:g} T/s (sfu_exp_tera_per_s) outlasts its "
                f"{self.att_peak / 1e12:g} TFLOP/s BF16 math")

    def prefill_mem_eff(self, byts):
        """Fraction of peak HBM bandwidth a prefill attention kernel reaches reading ``byts`` of KV: where decode
        streams as the measured kernel (``decode_stream``), the streaming ramp a kernel of that many bytes reaches
        (``gemm_mem``), so a chunk of one new token over a long cache reads its KV near what a decode of it does
        (Llama-3.1-70B TP8 on H100s, 32 x 32k cached: attention 15.8 vs 15.2 ms, was 30.5, before the GQA chunk
        table priced such layers: ``gqa_chunks_seconds``); else the ``attn_mem`` curve decode takes too. (``attn_mem``'s default points are FlashMLA's compute-bound 128-head ones: as a
        streaming rate about half the measured kernel's.) ``step._attn_timer(streaming=...)`` is its plain-Python twin."""
        return self.cal.gemm_mem(byts) if self.decode_stream is not None else self.cal.attn_mem(byts)

    def attn_roofline(self, flops, byts, den: float, decode_batch: float | None = None, prefill: bool = False):
        """Seconds of attention-like kernels (elementwise): math at ``den`` FLOP/s, KV streaming at the
        ``attn_mem`` efficiency of the bytes each kernel reads (``decode_batch``: a decode kernel over that many
        requests, streamed as the measured decode kernel streams, ``stream_time``, where there is one; ``prefill``:
        a prefill kernel, at ``prefill_mem_eff``), plus a launch (not on a measured decode kernel's time, which holds its own); nothing to do costs nothing."""
        with np.errstate(divide="ignore", invalid="ignore"):  # (an empty kernel's 0 / 0 is masked below)
            if decode_batch is not None and self.decode_stream is not None:
                # the measured kernel's device time holds its own launch and latency: no launch on top
                t = np.maximum(flops / den, self.stream_time(decode_batch, byts))
            else:
                t_mem = byts / (self.hw.hbm_bw * (self.prefill_mem_eff(byts) if prefill else self.cal.attn_mem(byts)))
                t = np.maximum(flops / den, t_mem) + self._lo
        return np.where((np.asarray(flops) <= 0) & (np.asarray(byts) <= 0), 0.0, t)

    def _attn_one(self, geo: AttnGeometry, new, ctx, dec, s) -> np.ndarray:
        """(attention flops, bytes, time, indexer flops, bytes, time) of one layer of ``geo`` on the busiest rank."""
        h_loc = self.heads_local
        out = np.zeros(6)
        over_dec = 0.0   # a GQA decode's time over its roofline, shared with the chunks' (one varlen call)
        work = None      # a GQA varlen call's work per sequence, batch order (gqa_chain_floor)
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
            if is_dec and self.mla_table is not None and self.mla_covers(geo) and bool((n == n[0]).all()):
                # measured FlashMLA: one kernel over the rank's decodes at their mean context (absorbed MLA decode:
                # 2 x 1088 FLOP a score, far above any catalog GPU's peak / exp rate: never exponential-bound); decodes
                # verifying drafts at their query rows' head count (mla_for)
                out[2] += self.mla_for(int(n[0])).at(c.size * s, float(last.sum()) / c.size, flops, byts)
            elif not is_dec and flops > 0 and self.gqa_covers(geo):
                # measured FlashAttention-3 GQA prefill: the chunks' measured times at (new, cached), moved to this
                # model's heads and this GPU, run as one varlen kernel (gqa_chunks_seconds)
                t_c, parts = self.gqa_chunks_call(geo, n, c, s, over_dec)
                out[2] += t_c
                if work is None:
                    work = np.zeros(new.size)
                work[mask] = parts
            elif not is_dec and geo.prefill_upproj and self.chunk_table is not None and flops > 0:
                # measured per-chunk attention (new x cached, the executor's own masked SDPA), scaled to this
                # layout's heads and head dims; the K/V up-projection stays with the KV_UP GEMMs. Measured seconds are
                # left alone (no exponential scaling): the table's own GPU paid its exponentials
                tab = self.chunk_table
                t_c, _ = tab(n, c)
                out[2] += float(t_c.sum()) * s * h_loc * (geo.d_qk_prefill + geo.d_v_prefill) / (tab.heads * (tab.d_qk + tab.d_v))
            elif not is_dec and "attn_prefill_compute" in self.cal.tables and flops > 0:
                # measured per-length efficiency: each chunk is its own kernel (short ones are far below peak), of
                # the tensor peak or, where lower, of the exponential rate's FLOP equivalent (att_den)
                eff = np.maximum(self.cal.attn_prefill_compute((c + n).astype(float)), 1e-9)
                peak = self.att_math_peak(geo.d_qk_prefill, geo.d_v_prefill)
                t_c = float(np.sum(2.0 * h_loc * (geo.d_qk_prefill + geo.d_v_prefill) * ent * s / (peak * eff)))
                t_m = byts / (self.hw.hbm_bw * float(self.prefill_mem_eff(byts))) if byts > 0 else 0.0
                out[2] += max(t_c, t_m) + self._lo
            else:
                den = self.att_den(geo.d_qk_decode, geo.d_v_decode) if is_dec else self.att_den(geo.d_qk_prefill, geo.d_v_prefill)
                t = float(self.attn_roofline(flops, byts, den, c.size * s) if is_dec else
                          self.attn_roofline(flops, byts, den, prefill=True))
                out[2] += t
                if is_dec and self.decode_stream is not None and self.gqa_covers(geo):
                    over_dec = self.gqa_decode_over(t, flops, byts, den)
                    # each decode's part of the call: the decodes' time under their roofline, by the keys it reads
                    work = np.zeros(new.size)
                    work[mask] = self.gqa_decode_work(float(t), over_dec, last)
            if geo.index_ratio:
                keys = np.minimum(c + n, geo.index_cap).astype(float) / geo.index_ratio
                if is_dec:
                    scored = float((n * keys).sum())
                else:
                    scored = float(entries_sum(AttnGeometry("k", geo.index_cap, 1.0, 0.0, 0.0, 0, 0, 0, 0, False), c, n).sum()) / geo.index_ratio
                i_flops = self._idx_coef * scored * s
                i_bytes = (float(keys.sum()) * self.idx_key_bytes + scored * 4.0 * 2) * s  # keys + logits written and read by top-k
                out[3] += i_flops
                out[4] += i_bytes
                out[5] += float(self.attn_roofline(i_flops, i_bytes, self._idx_den)) + self._lo  # + the top-k kernel
        if dec.size > 1 and self.gqa_covers(geo) and not dec.all():
            # the step's decodes and chunks are one FlashAttention-3 call: unsplit, its longest key walk bounds it (one
            # chunk alone: its measured time holds its own walk)
            # (each sequence's walk starts after the work of those ahead of it in the batch)
            out[2] = max(out[2], self.gqa_chain_floor(geo, new, ctx + new, work))
        return out

    def attention(self, new, ctx, dec, draft, f, ops: list | None = None) -> np.ndarray:
        """Category times of attention and the indexer over a batch's requests (all layers, MTP passes too)."""
        v = np.zeros(7)
        s = self.share * f
        if self.ced and not dec.all():
            tn, tc = self.ced_tail_chunks(new, ctx, dec)
            todo = [(geo, count, tn, tc, dec, "") if is_dec else (geo, count, new, ctx, dec, "")
                    for (geo, count), is_dec in zip(self.att_groups, self.att_dec)]
        else:
            todo = [(geo, count, new, ctx, dec, "") for geo, count in self.att_groups]
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

    def attention_decode_steps(self, geos, sums: SortedSums, shifts: np.ndarray, g: int, s: float) -> np.ndarray:
        """Attention + indexer seconds of all layers for each of consecutive decode steps (contexts ``sums``
        shifted by ``shifts``). ``geos``: (geometry, layer count) pairs; MTP passes (the entry after the main
        kinds, if any) process one new token per request, main layers ``g``."""
        total = np.zeros(shifts.size)
        keys_all = sums.total + sums.n * shifts
        for i, (geo, count) in enumerate(geos):
            new = g if i < len(self.att_groups) else 1
            ent = sums.entries(geo, shifts)
            flops = ent * (2.0 * self.heads_local * (geo.d_qk_decode + geo.d_v_decode) * new * s)
            byts = ent * (self.att_entry_bytes * s)
            if sums.n and self.mla_table is not None and self.mla_covers(geo):
                total = total + count * self.mla_for(new).many(sums.n * s, ent / sums.n, flops, byts)
            else:
                total = total + count * self.attn_roofline(flops, byts, self.att_den(geo.d_qk_decode, geo.d_v_decode),
                                                           sums.n * s)
            if geo.index_ratio:
                keys = (keys_all if geo.index_cap >= INF else sums.sum_min(shifts, geo.index_cap)) / geo.index_ratio
                i_bytes = keys * ((self.idx_key_bytes + new * 8.0) * s)
                i_flops = keys * (self._idx_coef * new * s)
                total = total + count * (self.attn_roofline(i_flops, i_bytes, self._idx_den) + self._lo)
        return total
