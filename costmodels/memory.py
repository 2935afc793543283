"""Does a model fit a layout on a GPU, and how many KV tokens are left once it does.

Per GPU: weights (sharded as ``params.py`` says), a workspace reserve (formula in
:func:`workspace_bytes`), and the KV pool = ``hbm * mem_fraction - weights - workspace``.

Token budget and running requests: one definition for the memory fit, the scheduler and the
planner. ``max_batched_tokens`` / ``max_running_requests`` are the *instance's* limits, as
``SchedulerConfig.max_num_batched_tokens`` / ``max_num_seqs`` hold them (summed over its
attention-DP ranks); each GPU reserves workspace for its rank's share,
:func:`per_rank_share` = ``ceil(limit / ranks)``, as SGLang does with DP attention
(``server_args.py``: ``chunked_prefill_size //= dp_size``). Reserving the instance's whole
budget on every GPU would undercount a DEP32 instance's KV about 30x.

KV sharding: the MLA latent is one vector per token shared by all heads, so every TP rank of
an attention group holds the whole latent of its requests (replicated across TP); GQA KV
heads split by ``min(tp, num_kv_heads)``. Attention-DP ranks hold disjoint requests, so the
instance's KV capacity is ``dp`` times one rank's. Pipeline stages hold only their layers'
weights and KV; the tightest stage decides.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict

from twinfer.errors import DoesNotFitError

from costmodels.hardware import Hardware
from costmodels.layout import DType, ParallelLayout
from costmodels.model_spec import LayerKind, ModelSpec
from costmodels.offload import host_bytes_per_gpu, resident_weights
from costmodels.params import (
    ELEM_BYTES, FP4_BLOCK, WEIGHT_BYTES, embedding_linears, layer_linears, mhc_params, mtp_linears, norm_params,
    shard_divisor, weight_bytes_per_param, has_indexer,
)

GIB = 2**30
# Fixed per-GPU reserve for the CUDA context, cuBLAS/NCCL workspaces and captured CUDA graphs.
# Assumption: ~1 GiB context + ~0.5 GiB graphs is what vLLM/SGLang logs show on Hopper; not measured here.
CONTEXT_RESERVE_BYTES = 1.5 * GIB
# Expert-parallel all-to-all buffers (DeepEP normal + low-latency buffers). Assumption: ~2 GiB per GPU.
EP_BUFFER_BYTES = 2.0 * GIB
# MLA FP8 KV layout (FlashMLA): latent in fp8 with one fp32 scale per 128 values, RoPE part in BF16 = 656 B for V3.
# FP4: MXFP4 (1-byte UE8M0 scale per 32, params.FP4_BLOCK), RoPE part BF16, unless the model packs NVFP4 rows.
KV_SCALE_GROUP = {"fp8": (128, 4.0), "fp4": FP4_BLOCK["mxfp4"]}  # values per scale, bytes per scale


def _fp4_row_bytes(values: int, fmt: str) -> float:
    """``values`` packed FP4 values and their block scales (``fmt``: mxfp4 / nvfp4)."""
    group, scale_bytes = FP4_BLOCK[fmt]
    return values * 0.5 + math.ceil(values / group) * scale_bytes


def mla_kv_bytes_per_token_layer(model: ModelSpec, kv_dtype: DType) -> float:
    """Bytes of one token's latent in one MLA layer (BF16 DeepSeek-V3: (512+64)*2 = 1152).

    FP4 with ``kv_fp4_format: nvfp4``: the whole row, RoPE part too, packed FP4 with a 1-byte E4M3 scale per 16
    (DeepSeek-V4.1's C1/C2 main KV: 512 dims -> 256 + 32 = 288 B; SGLang issue 38902, pypto-lib issue 1238).
    """
    m = model.mla
    if kv_dtype == "bf16":
        return (m.kv_lora_rank + m.qk_rope_head_dim) * 2.0
    if kv_dtype == "fp4" and model.kv_fp4_format == "nvfp4":
        return _fp4_row_bytes(m.kv_lora_rank + m.qk_rope_head_dim, "nvfp4")
    group, scale_bytes = KV_SCALE_GROUP[kv_dtype]
    return m.kv_lora_rank * ELEM_BYTES[kv_dtype] + math.ceil(m.kv_lora_rank / group) * scale_bytes + m.qk_rope_head_dim * 2.0


def gqa_kv_bytes_per_token_layer(model: ModelSpec, kv_dtype: DType) -> float:
    """Bytes of one token's K and V in one GQA layer, all kv heads (unsharded)."""
    elems = 2 * model.num_kv_heads * model.head_dim
    if kv_dtype == "fp4":
        group, scale_bytes = KV_SCALE_GROUP["fp4"]
        return elems * 0.5 + elems / group * scale_bytes
    return elems * ELEM_BYTES[kv_dtype]


def indexer_kv_bytes_per_token(model: ModelSpec) -> float:
    """Indexer key cache per token per layer, in the indexer's own cache dtype (``IndexerConfig.kv_dtype``,
    else its math dtype): FP8 keys + one fp32 scale (DeepGEMM fp8_mqa_logits layout); FP4 keys as MXFP4 (128 dims:
    64 + 4 = 68 B; Dynamo's V4.1 recipes "MXFP4 sparse-indexer KV"); BF16 keys."""
    ix = model.indexer
    dtype = ix.kv_dtype or ix.dtype
    if dtype == "fp4":
        return _fp4_row_bytes(ix.head_dim, "mxfp4")
    return ix.head_dim * 1.0 + 4.0 if dtype == "fp8" else ix.head_dim * 2.0


def kv_bytes_per_token_layer(model: ModelSpec, kv_dtype: DType) -> float:
    """One cache entry of one layer, unsharded."""
    if model.attention == "mla":
        return mla_kv_bytes_per_token_layer(model, kv_dtype)
    return gqa_kv_bytes_per_token_layer(model, kv_dtype)


def kv_shard_divisor(model: ModelSpec, layout: ParallelLayout) -> int:
    """MLA latent: replicated over TP (1). GQA: kv heads split over min(tp, kv heads)."""
    return 1 if model.attention == "mla" else min(layout.tp, model.num_kv_heads)


def _layer_kv_rates(model: ModelSpec, kind: LayerKind, kv_dtype: DType) -> tuple[float, float]:
    """(bytes per context token, fixed bytes per request) of one layer of ``kind``, unsharded.

    full: one entry per token. sliding: at most ``sliding_window`` entries, counted as a fixed
    per-request cost. csa/hca: one entry per ``compress_ratio`` tokens (+ the uncompressed
    window when the model keeps one in those layers). Indexed layers add the indexer keys.
    """
    entry = kv_bytes_per_token_layer(model, kv_dtype)
    ix = indexer_kv_bytes_per_token(model) if has_indexer(model, kind) else 0.0
    if kind == "full":
        return entry + ix, 0.0
    if kind == "sliding":
        return 0.0, entry * model.sliding_window
    ratio = model.compress_ratio.get(kind, 1)
    fixed = entry * model.sliding_window if model.window_in_compressed_layers and model.sliding_window else 0.0
    return (entry + ix) / ratio, fixed


def mtp_kind(model: ModelSpec) -> LayerKind:
    """Attention kind of the MTP layer: full, except in layer-kind models (V4) whose MTP layer is sliding-window (compress ratio 0)."""
    return "sliding" if model.layer_kinds and model.sliding_window else "full"


def kv_rates(model: ModelSpec, kv_dtype: DType, layers: range | list[int] | None = None) -> tuple[float, float]:
    """(bytes per context token, fixed bytes per request) summed over ``layers`` (all by default), unsharded.

    Each stored cache counts once: layers of a ``kv_share_group`` once per group (the whole cache); a layer
    reading another's cache through ``kv_share_source`` adds only its own sliding window (the shared cache is
    the compressed/global one, counted at the layer that stores it).
    """
    kinds = model.kinds()
    idx = list(range(model.num_layers)) if layers is None else list(layers)
    per_tok = fixed = 0.0
    for i in idx:
        if model.stores_kv(i):
            a, b = _layer_kv_rates(model, kinds[i], kv_dtype)
        elif model.kv_share_source:
            a, b = 0.0, _layer_kv_rates(model, kinds[i], kv_dtype)[1]
        else:
            continue
        per_tok += a
        fixed += b
    return per_tok, fixed


def kv_bytes_per_token(model: ModelSpec, kv_dtype: DType = "bf16") -> float:
    """Whole-model KV bytes per context token, unsharded (DeepSeek-V3 BF16: 61 * 1152 = 70,272)."""
    return kv_rates(model, kv_dtype)[0]


def per_rank_share(instance_limit: int, ranks: int) -> int:
    """One attention-DP rank's share of an instance-wide limit (token budget, running requests): ``ceil(limit / ranks)``."""
    return -(-int(instance_limit) // max(int(ranks), 1))


def instance_workspace_bytes(model: ModelSpec, layout: ParallelLayout, max_batched_tokens: int, max_running_requests: int,
                             sched_ranks: int | None = None, mtp: bool = True) -> float:
    """:func:`workspace_bytes` per GPU for a scheduler's instance-wide limits over ``sched_ranks`` attention-DP ranks
    (default ``layout.dp``): each GPU reserves its rank's :func:`per_rank_share`."""
    ranks = layout.dp if sched_ranks is None else sched_ranks
    return workspace_bytes(model, layout, per_rank_share(max_batched_tokens, ranks), per_rank_share(max_running_requests, ranks),
                           mtp)


def workspace_bytes(model: ModelSpec, layout: ParallelLayout, max_batched_tokens: int, max_running_requests: int,
                    mtp: bool = True) -> float:
    """Activation/workspace reserve per GPU, for one attention-DP rank's limits (:func:`per_rank_share` of the instance's).

    ``CONTEXT_RESERVE_BYTES``
    + ``max_batched_tokens * 2 B * (4 * hidden * hc_mult + q_width/tp + 2 * ffn_width/tp)``: the live
      activations of one layer of the largest step (residual streams, q, FFN gate/up) in BF16
    + dispatched MoE tokens: ``max_batched_tokens * dp * top_k / ep * 2 B * (hidden + 2 * moe_inter / moe_tp)``
    + logits: ``max_running_requests * (1 + mtp) * vocab * 4 B`` (fp32, gathered over TP; the MTP layers' only
      with ``mtp``: drafting)
    + ``EP_BUFFER_BYTES`` when ep > 1.
    """
    h = model.hidden_size
    if model.attention == "mla":
        q_width = model.num_attention_heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim + model.mla.v_head_dim)
    else:
        q_width = model.num_attention_heads * model.head_dim * 2
    ffn = model.intermediate_size
    act = max_batched_tokens * 2.0 * (4 * h * model.hc_mult + q_width / layout.tp + 2 * ffn / layout.tp)
    if model.moe:
        tokens_in = max_batched_tokens * layout.dp * model.moe.top_k / layout.ep
        act += tokens_in * 2.0 * (h + 2 * model.moe.moe_intermediate_size / layout.moe_tp)
    logits = max_running_requests * (1 + (model.mtp_layers if mtp else 0)) * model.vocab_size * 4.0
    ep_buf = EP_BUFFER_BYTES if layout.ep > 1 else 0.0
    return CONTEXT_RESERVE_BYTES + act + logits + ep_buf


class MemoryFit(BaseModel):
    """Per-GPU memory budget of one instance (the tightest pipeline stage)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    hardware: str
    layout: str
    gpus: int
    dp_ranks: int
    hbm_bytes: float
    mem_fraction: float
    usable_bytes: float          # hbm * mem_fraction
    weight_bytes: float          # per GPU, tightest stage
    weight_breakdown: dict[str, float]
    workspace_bytes: float
    kv_pool_bytes: float         # usable - weights - workspace (may be negative)
    free_bytes: float            # hbm - usable: what mem_fraction leaves untouched
    kv_bytes_per_token: float    # per GPU, per context token of a request on this GPU's DP rank
    kv_bytes_per_token_model: float  # whole model, unsharded (the number papers quote)
    kv_fixed_bytes_per_request: float  # per GPU: sliding-window layers, independent of length
    kv_dtype: str
    max_kv_tokens_per_dp_rank: int
    max_kv_tokens: int           # whole instance (dp ranks hold disjoint requests)
    host_table_bytes_per_gpu: float
    host_fits: bool
    fits: bool
    explanation: str
    mtp: bool = True             # the MTP layers' weights, KV and logits are held (drafting: serving engines load them
                                 # only with speculative decoding)

    def max_requests(self, context_len: int) -> int:
        """Requests of ``context_len`` tokens the instance can hold at once."""
        per_req = self.kv_bytes_per_token * context_len + self.kv_fixed_bytes_per_request
        if per_req <= 0 or self.kv_pool_bytes <= 0:
            return 0
        return int(self.kv_pool_bytes // per_req) * self.dp_ranks


    def kv_tokens_per_dp_rank_at(self, model: ModelSpec, layout: ParallelLayout, max_batched_tokens: int,
                                 max_running_requests: int, sched_ranks: int | None = None) -> int:
        """KV tokens per DP rank if the workspace were sized for these scheduler limits instead (same rules as
        :func:`memory_fit`: instance limits over ``sched_ranks`` ranks, default ``layout.dp``)."""
        ws = instance_workspace_bytes(model, layout, max_batched_tokens, max_running_requests, sched_ranks, self.mtp)
        pool = self.kv_pool_bytes + self.workspace_bytes - ws
        if pool <= 0 or self.kv_bytes_per_token <= 0:
            return 0
        return int(pool // self.kv_bytes_per_token)


def _stage_layers(model: ModelSpec, pp: int) -> list[list[int]]:
    return [list(a) for a in np.array_split(np.arange(model.num_layers), pp)]


def _linears_bytes(lins, model, layout) -> dict[str, float]:
    out: dict[str, float] = {}
    for lin in lins:
        b = lin.params / shard_divisor(lin, model, layout) * weight_bytes_per_param(lin, layout, model)
        group = {"routed_experts": "routed_experts", "shared_expert": "shared_experts", "dense_ffn": "dense_ffn",
                 "router": "other", "embedding": "embeddings", "lm_head": "embeddings"}.get(lin.name)
        if group is None:
            group = "indexer" if lin.category == "indexer" else "attention"
        out[group] = out.get(group, 0.0) + b
    return out


def stage_weight_bytes(model: ModelSpec, layout: ParallelLayout, mtp: bool = True) -> list[dict[str, float]]:
    """Per pipeline stage, per-GPU weight bytes by group (embedding on the first stage, head and, with ``mtp``, the MTP
    layers on the last)."""
    stages = []
    for s, layers in enumerate(_stage_layers(model, layout.pp)):
        acc: dict[str, float] = {}
        for i in layers:
            for k, v in _linears_bytes(layer_linears(model, i), model, layout).items():
                acc[k] = acc.get(k, 0.0) + v
            acc["other"] = acc.get("other", 0.0) + norm_params(model) * WEIGHT_BYTES["bf16"] + mhc_params(model) * 4.0
        acc = resident_weights(acc, model, layout, sum(1 for i in layers if model.is_moe_layer(i)))  # offload: host, not HBM
        emb = embedding_linears(model)
        if s == 0:
            acc["embeddings"] = acc.get("embeddings", 0.0) + _linears_bytes(emb[:1], model, layout).get("embeddings", 0.0)
        if s == layout.pp - 1:
            head = emb[1:] if len(emb) > 1 else emb[:1]
            if len(emb) > 1 or layout.pp > 1:
                acc["embeddings"] = acc.get("embeddings", 0.0) + _linears_bytes(head, model, layout).get("embeddings", 0.0)
            if model.mtp_layers and mtp:
                one = sum(_linears_bytes(mtp_linears(model), model, layout).values()) + norm_params(model) * 2 + \
                    mhc_params(model) * 4.0
                acc["mtp"] = model.mtp_layers * one
        stages.append(acc)
    return stages


def host_problem(fit: "MemoryFit", model: ModelSpec, layout: ParallelLayout, hw: Hardware) -> str | None:
    """Why the host memory one GPU needs does not fit (``fit.host_fits`` false), else None: the lookup tables kept in
    host memory (``host_table_bytes_per_gpu``) plus the expert weights offloaded there. ``twinfer cost``, the
    simulator and the planner's layout space refuse such a layout alike (the planner kept only table-in-HBM layouts
    where ``cost`` and ``simulate`` ran it without a word)."""
    if fit.host_fits:
        return None
    offloaded = host_bytes_per_gpu(model, layout)
    need = fit.host_table_bytes_per_gpu + offloaded
    parts = [f"{what} {b / 1e9:.1f} GB" for what, b in (("lookup tables", fit.host_table_bytes_per_gpu),
                                                         ("offloaded expert weights", offloaded)) if b > 0]
    fixes = (["the lookup tables in HBM (effects.table_placement: hbm)"] if fit.host_table_bytes_per_gpu > 0 else []) + \
            (["a smaller offload fraction"] if offloaded > 0 else []) + ["more GPUs", "a host with more memory (host_mem_gb)"]
    return (f"host memory does not fit: per GPU {need / 1e9:.1f} GB ({' + '.join(parts)}) of {hw.host_mem_gb:.0f} GB, "
            f"short by {need / 1e9 - hw.host_mem_gb:.1f} GB (try {', or '.join(fixes)})")


def memory_fit(
    model: ModelSpec,
    hw: Hardware,
    layout: ParallelLayout,
    *,
    mem_fraction: float = 0.9,
    max_batched_tokens: int = 8192,
    max_running_requests: int = 256,
    min_kv_tokens: int = 2048,
    sched_ranks: int | None = None,
    mtp: bool = True,
    hbm_table_bytes: float = 0.0,
) -> MemoryFit:
    """Weights, workspace and KV capacity per GPU; ``fits`` needs room for ``min_kv_tokens`` per DP rank.
    ``hbm_table_bytes``: lookup tables each GPU holds in HBM (``effective.fit_with_policies``), counted with the
    weights (``weight_breakdown['lookup_tables']``) and named in the explanation; 0: they stay in host memory. ``mtp``:
    the model's MTP layers are loaded (weights, their KV cache, their logits), as vLLM and SGLang load them only to
    draft (speculative decoding); a scheduler without drafts serves without them.

    ``max_batched_tokens`` / ``max_running_requests`` are the limits of the scheduler driving
    ``sched_ranks`` attention-DP ranks (default: the instance's ``dp``; a simulated slice of an
    instance drives fewer); each GPU's workspace is sized for one rank's share.
    """
    if not 0 < mem_fraction <= 1:
        from twinfer.errors import TwinferError
        raise TwinferError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    usable = hw.hbm_bytes * mem_fraction
    ws = instance_workspace_bytes(model, layout, max_batched_tokens, max_running_requests, sched_ranks, mtp)
    shard = kv_shard_divisor(model, layout)
    stages = stage_weight_bytes(model, layout, mtp)
    best = None  # (tokens, stage index, weights, per_tok, fixed)
    for s, layers in enumerate(_stage_layers(model, layout.pp)):
        per_tok, fixed = kv_rates(model, layout.kv_dtype, layers)
        if s == layout.pp - 1 and model.mtp_layers and mtp:
            a, b = _layer_kv_rates(model, mtp_kind(model), layout.kv_dtype)
            per_tok, fixed = per_tok + model.mtp_layers * a, fixed + model.mtp_layers * b
        per_tok, fixed = per_tok / shard, fixed / shard
        w = sum(stages[s].values()) + hbm_table_bytes
        pool = usable - w - ws
        tokens = int(pool // per_tok) if per_tok > 0 and pool > 0 else (10**12 if pool > 0 else 0)
        if best is None or tokens < best[0] or (tokens == best[0] and w > best[2]):
            best = (tokens, s, w, per_tok, fixed)
    tokens, s, w, per_tok, fixed = best
    pool = usable - w - ws
    host_per_gpu = model.host_table_bytes / max(layout.gpus, 1) if hbm_table_bytes <= 0 else 0.0
    host_fits = host_per_gpu + host_bytes_per_gpu(model, layout) <= hw.host_mem_gb * 1e9  # (+ offloaded weights)
    fits = pool > 0 and tokens >= min_kv_tokens
    gb = lambda x: f"{x / 2**30:.1f} GiB"  # noqa: E731  (the unit the catalog counts HBM in: an H200 is 141.0 GiB)
    tables = f" + {gb(hbm_table_bytes)} lookup tables" if hbm_table_bytes > 0 else ""
    head = (f"{model.name} on {layout.gpus}x{hw.name} ({layout.describe()}, kv {layout.kv_dtype}): per GPU "
            f"{gb(w - hbm_table_bytes)} weights{tables} + {gb(ws)} workspace of {gb(usable)} usable ({mem_fraction:.0%} "
            f"of {gb(hw.hbm_bytes)})")
    breakdown = {**stages[s], "lookup_tables": hbm_table_bytes} if hbm_table_bytes > 0 else stages[s]
    if pool <= 0:
        explanation = f"does not fit: {head}; short by {gb(-pool)} before any KV cache"
    elif tokens < min_kv_tokens:
        explanation = f"does not fit: {head}; leaves {gb(pool)} for KV = {tokens:,} tokens per DP rank, below the {min_kv_tokens:,} needed"
    else:
        explanation = f"fits: {head}; {gb(pool)} KV pool = {tokens:,} tokens per DP rank ({tokens * layout.dp:,} per instance)"
    return MemoryFit(
        model=model.name, hardware=hw.name, layout=layout.describe(), gpus=layout.gpus, dp_ranks=layout.dp, hbm_bytes=hw.hbm_bytes,
        mem_fraction=mem_fraction, usable_bytes=usable, weight_bytes=w, weight_breakdown=breakdown, workspace_bytes=ws,
        kv_pool_bytes=pool, free_bytes=hw.hbm_bytes - usable, kv_bytes_per_token=per_tok,
        kv_bytes_per_token_model=kv_bytes_per_token(model, layout.kv_dtype), kv_fixed_bytes_per_request=fixed,
        kv_dtype=layout.kv_dtype, max_kv_tokens_per_dp_rank=max(tokens, 0), max_kv_tokens=max(tokens, 0) * layout.dp,
        host_table_bytes_per_gpu=host_per_gpu, host_fits=host_fits, fits=fits, explanation=explanation, mtp=mtp,
    )


def check_fit(model: ModelSpec, hw: Hardware, layout: ParallelLayout, **kw) -> MemoryFit:
    """``memory_fit`` that raises DoesNotFitError (with the numbers) when it does not fit."""
    fit = memory_fit(model, hw, layout, **kw)
    if not fit.fits:
        raise DoesNotFitError(fit.explanation)
    return fit
