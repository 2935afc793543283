"""The weight matrices of a model, layer by layer, and how each one shards over a layout.

Memory fit counts their bytes; the step cost model reads them (memory-bound GEMMs) and
multiplies by them (FLOPs). One table, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from costmodels.layout import DType, ParallelLayout
from costmodels.model_spec import LayerKind, ModelSpec

# Bytes per weight parameter including block scales:
#  fp8: DeepSeek-V3 / DeepGEMM layout, one fp32 scale per 128x128 block (V3 config quantization_config.weight_block_size)
#  fp4: MXFP4-style, one 1-byte (ue8m0) scale per 32 values (DeepSeek-V4 expert_dtype fp4, scale_fmt ue8m0);
#       NVFP4 (fp8 scale per 16) would be 0.5625 — within 6%.
WEIGHT_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0 + 4.0 / (128 * 128), "fp4": 0.5 + 1.0 / 32}
# Activations/KV element sizes without scales.
ELEM_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}

Shard = Literal["rep", "tp", "kv", "expert"]
WClass = Literal["weight", "bf16"]
Category = Literal["dense_gemm", "indexer", "expert_gemm", "other"]
MSource = Literal["tokens", "kv_up", "sampled"]


@dataclass(frozen=True)
class Linear:
    """One weight matrix ``k x n`` (times ``copies``) used once per token of ``m_source``."""

    name: str
    k: int
    n: int
    shard: Shard           # rep: replicated in the attention group; tp: split by tp; kv: split by min(tp, kv heads); expert
    wclass: WClass         # "weight": in layout dtype (experts: expert dtype); "bf16": kept in BF16 (norms, router, embeddings)
    category: Category
    copies: int = 1        # e.g. routed experts: n_routed_experts copies
    m_source: MSource = "tokens"

    @property
    def params(self) -> int:
        return self.k * self.n * self.copies


def shard_divisor(lin: Linear, model: ModelSpec, layout: ParallelLayout) -> float:
    """How many ways one GPU's copy of ``lin`` is divided."""
    if lin.shard == "tp":
        return float(layout.tp)
    if lin.shard == "kv":
        return float(min(layout.tp, model.num_kv_heads))
    if lin.shard == "expert":
        # (E + redundant) expert replicas spread over ep ranks, each expert split moe_tp ways
        e = model.moe.n_routed_experts if model.moe else 1
        return layout.ep * layout.moe_tp * e / (e + layout.eplb_redundant_experts)
    return 1.0


def weight_bytes_per_param(lin: Linear, layout: ParallelLayout) -> float:
    if lin.wclass == "bf16":
        return WEIGHT_BYTES["bf16"]
    dtype: DType = layout.experts_dtype if lin.shard == "expert" else layout.weight_dtype
    return WEIGHT_BYTES[dtype]


def attention_linears(model: ModelSpec, kind: LayerKind) -> list[Linear]:
    """Projections of one attention layer of ``kind`` (the attention core itself has no weights)."""
    h, heads = model.hidden_size, model.num_attention_heads
    out: list[Linear] = []
    if model.attention == "mla":
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            out.append(Linear("q_a_proj", h, m.q_lora_rank, "rep", "weight", "dense_gemm"))
            out.append(Linear("q_b_proj", m.q_lora_rank, heads * qk, "tp", "weight", "dense_gemm"))
        else:
            out.append(Linear("q_proj", h, heads * qk, "tp", "weight", "dense_gemm"))
        out.append(Linear("kv_a_proj", h, m.kv_lora_rank + m.qk_rope_head_dim, "rep", "weight", "dense_gemm"))
        if m.kv_up_proj:
            out.append(Linear("kv_b_proj", m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim), "tp", "weight", "dense_gemm", m_source="kv_up"))
        v_total = heads * m.v_head_dim
    else:
        hd, kvh = model.head_dim, model.num_kv_heads
        out.append(Linear("q_proj", h, heads * hd, "tp", "weight", "dense_gemm"))
        out.append(Linear("kv_proj", h, 2 * kvh * hd, "kv", "weight", "dense_gemm"))
        v_total = heads * hd
    if model.o_lora_rank:
        # grouped low-rank output (V4): per group (heads/g * v) -> o_lora, then g*o_lora -> hidden
        out.append(Linear("o_a_proj", v_total, model.o_lora_rank, "tp", "weight", "dense_gemm"))
        out.append(Linear("o_b_proj", model.o_groups * model.o_lora_rank, h, "tp", "weight", "dense_gemm"))
    else:
        out.append(Linear("o_proj", v_total, h, "tp", "weight", "dense_gemm"))
    if kind in ("csa", "hca") and model.attention == "mla":
        # KV compressor: a kv and a gate projection per token (csa overlaps windows: 2x)
        coff = 2 if kind == "csa" else 1
        out.append(Linear("kv_compressor", h, 2 * coff * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim), "rep", "weight", "dense_gemm"))
    if has_indexer(model, kind):
        ix = model.indexer
        q_in = model.mla.q_lora_rank if model.attention == "mla" and model.mla.q_lora_rank else h
        out.append(Linear("indexer_wq", q_in, ix.n_heads * ix.head_dim, "rep", "weight", "indexer"))
        out.append(Linear("indexer_wk", h, ix.head_dim * (4 if kind == "csa" else 1), "rep", "weight", "indexer"))
        out.append(Linear("indexer_weights", h, ix.n_heads, "rep", "bf16", "indexer"))
    return out


def has_indexer(model: ModelSpec, kind: LayerKind) -> bool:
    """DSA indexer on this layer: every full layer of V3.2; the csa layers of V4."""
    if model.indexer is None:
        return False
    if model.layer_kinds:
        return kind == "csa" or (kind == "full")
    return kind == "full"


def ffn_linears(model: ModelSpec, moe_layer: bool) -> list[Linear]:
    """FFN of one layer: dense SwiGLU, or router + shared + routed experts."""
    h = model.hidden_size
    if not moe_layer:
        return [Linear("dense_ffn", h, 3 * model.intermediate_size, "tp", "weight", "dense_gemm")]
    moe = model.moe
    out = [Linear("router", h, moe.n_routed_experts, "rep", "bf16", "other")]
    shared = moe.shared_intermediate_size or moe.n_shared_experts * moe.moe_intermediate_size
    if shared:
        out.append(Linear("shared_expert", h, 3 * shared, "tp", "weight", "dense_gemm"))
    out.append(Linear("routed_experts", h, 3 * moe.moe_intermediate_size, "expert", "weight", "expert_gemm", copies=moe.n_routed_experts))
    return out


def norm_params(model: ModelSpec) -> int:
    """RMSNorm weights of one layer (two norms, plus q/kv latent norms for MLA)."""
    n = 2 * model.hidden_size * model.hc_mult
    if model.attention == "mla":
        n += (model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank
    return n


def layer_linears(model: ModelSpec, layer: int) -> list[Linear]:
    kind = model.kinds()[layer]
    return attention_linears(model, kind) + ffn_linears(model, model.is_moe_layer(layer))


def embedding_linears(model: ModelSpec) -> list[Linear]:
    """Input embedding and output head (vocab-parallel over tp)."""
    out = [Linear("embedding", model.vocab_size, model.hidden_size, "tp", "bf16", "other")]
    if not model.tie_word_embeddings:
        out.append(Linear("lm_head", model.hidden_size, model.vocab_size, "tp", "bf16", "dense_gemm", m_source="sampled"))
    return out


def mtp_linears(model: ModelSpec) -> list[Linear]:
    """One MTP module: eh_proj (concat of embedding and hidden -> hidden) + a full decoder layer; embedding/head shared."""
    if model.mtp_layers == 0:
        return []
    h = model.hidden_size
    body = attention_linears(model, "full") + ffn_linears(model, model.is_moe)
    return [Linear("mtp_eh_proj", 2 * h, h, "tp", "weight", "dense_gemm")] + body


def total_params(model: ModelSpec, include_mtp: bool = False) -> int:
    """Parameter count of the model (embeddings included; MTP modules only if asked)."""
    n = sum(lin.params for lin in embedding_linears(model))
    n += model.hidden_size  # final norm
    for layer in range(model.num_layers):
        n += sum(lin.params for lin in layer_linears(model, layer)) + norm_params(model)
    if include_mtp:
        n += model.mtp_layers * (sum(lin.params for lin in mtp_linears(model)) + norm_params(model) + 2 * model.hidden_size)
    return n


def active_params(model: ModelSpec) -> int:
    """Parameters touched per token (top_k routed experts instead of all)."""
    n = total_params(model)
    if model.moe:
        per_expert = 3 * model.hidden_size * model.moe.moe_intermediate_size
        moe_layers = model.num_layers - model.moe.first_k_dense
        n -= moe_layers * per_expert * (model.moe.n_routed_experts - model.moe.top_k)
    return n
