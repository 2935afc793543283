"""The weight matrices of a model, layer by layer, and how each one shards over a layout.

Memory fit counts their bytes; the step cost model reads them (memory-bound GEMMs) and
multiplies by them (FLOPs). One table, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from costmodels.layout import DType, ParallelLayout
from costmodels.model_spec import LayerKind, ModelSpec

# FP4 block formats: (values per scale, bytes per scale). MXFP4: a 1-byte UE8M0 scale per 32 values (OCP
# Microscaling Formats spec v1.0; DeepSeek-V4/V4.1 experts: expert_dtype fp4, scale_fmt ue8m0, groups of 32
# along K). NVFP4: a 1-byte E4M3 scale per 16 values (NVIDIA Blackwell NVFP4; plus one FP32 per tensor,
# negligible) = 4.5 bits per value.
FP4_BLOCK: dict[str, tuple[int, float]] = {"mxfp4": (32, 1.0), "nvfp4": (16, 1.0)}


def fp4_bytes(fmt: str) -> float:
    """Bytes per FP4 value including its block scale: mxfp4 0.53125, nvfp4 0.5625."""
    values, scale = FP4_BLOCK[fmt]
    return 0.5 + scale / values


# Bytes per weight parameter including block scales:
#  fp8: DeepSeek-V3 / DeepGEMM layout, one fp32 scale per 128x128 block (V3 config quantization_config.weight_block_size)
#  fp4: MXFP4 (fp4_bytes("mxfp4")); a model with fp4_weight_format nvfp4 pays fp4_bytes("nvfp4") instead
WEIGHT_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0 + 4.0 / (128 * 128), "fp4": fp4_bytes("mxfp4")}
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
        # (E + redundant) expert replicas spread over ep ranks, each expert split moe_tp ways; the busiest rank holds
        # experts_per_rank of them (a rank's share rounded up where ep does not divide them)
        e = model.moe.n_routed_experts if model.moe else 1
        return layout.moe_tp * e / experts_per_rank(model, layout)
    return 1.0


def experts_per_rank(model: ModelSpec, layout: ParallelLayout) -> int:
    """Routed expert slots (replicas included) the fullest EP rank holds: ``ceil((E + redundant) / ep)``. Where ep does
    not divide them (vLLM places the remainder on the first ranks; SGLang refuses such a split) that rank holds one more
    than the mean, and its weights and reads are what the step and the memory fit wait for."""
    e = (model.moe.n_routed_experts if model.moe else 1) + layout.eplb_redundant_experts
    return -(-e // layout.ep)


def dtype_bytes(dtype: str, model: ModelSpec | None = None) -> float:
    """Bytes per weight of ``dtype`` with its block scales; FP4 in the model's block format (MXFP4 unless it says NVFP4)."""
    if dtype == "fp4" and model is not None:
        return fp4_bytes(model.fp4_weight_format)
    return WEIGHT_BYTES[dtype]


def weight_bytes_per_param(lin: Linear, layout: ParallelLayout, model: ModelSpec | None = None) -> float:
    if lin.wclass == "bf16":
        return WEIGHT_BYTES["bf16"]
    dtype: DType = layout.experts_dtype if lin.shard == "expert" else layout.weight_dtype
    return dtype_bytes(dtype, model)


def attention_linears(model: ModelSpec, kind: LayerKind, layer: int | None = None) -> list[Linear]:
    """Projections of one attention layer of ``kind`` (the attention core itself has no weights).

    With ``layer`` given, a layer that reads another's cache (``kv_share_source``) has no KV compressor and
    no indexer key projection, and one that reuses another's top-k (``index_source_layers``) no indexer
    query projection (DeepSeek-V4.1 CSA2); without it, every layer of the kind has them (per-kind op tables).
    """
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
    owns_kv = layer is None or model.stores_kv(layer)
    if kind in ("csa", "hca") and model.attention == "mla" and owns_kv:
        # KV compressor: a kv and a gate projection per token (csa overlaps windows: 2x)
        coff = 2 if kind == "csa" else 1
        out.append(Linear("kv_compressor", h, 2 * coff * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim), "rep", "weight", "dense_gemm"))
    if has_indexer(model, kind):
        ix = model.indexer
        q_in = model.mla.q_lora_rank if model.attention == "mla" and model.mla.q_lora_rank else h
        if layer is None or model.scores_index(layer):
            out.append(Linear("indexer_wq", q_in, ix.n_heads * ix.head_dim, "rep", "weight", "indexer"))
            out.append(Linear("indexer_weights", h, ix.n_heads, "rep", "bf16", "indexer"))
        if owns_kv:
            out.append(Linear("indexer_wk", h, ix.head_dim * (4 if kind == "csa" else 1), "rep", "weight", "indexer"))
    return out


def has_indexer(model: ModelSpec, kind: LayerKind) -> bool:
    """DSA indexer on this layer: every full layer of V3.2; the csa layers of V4."""
    if model.indexer is None:
        return False
    if model.layer_kinds:
        return kind in ("csa", "full", "sparse")
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
    """RMSNorm weights of one layer (two norms, plus q/kv latent norms for MLA; each norm reads the one stream its block
    takes, with hyper-connections too)."""
    n = 2 * model.hidden_size
    if model.attention == "mla":
        n += (model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank
    return n


def mhc_params(model: ModelSpec) -> int:
    """Hyper-connection (mHC) weights of one layer, kept in FP32: per block (attention, FFN) the mixing projection
    ``(2+n)n x nH``, its bias ``(2+n)n`` and three scales; 0 without hyper-connections."""
    n = model.hc_mult
    if n <= 1:
        return 0
    mix = (2 + n) * n
    return 2 * (mix * n * model.hidden_size + mix + 3)


def layer_linears(model: ModelSpec, layer: int) -> list[Linear]:
    kind = model.kinds()[layer]
    return attention_linears(model, kind, layer) + ffn_linears(model, model.is_moe_layer(layer))


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
        n += sum(lin.params for lin in layer_linears(model, layer)) + norm_params(model) + mhc_params(model)
    if include_mtp:
        n += model.mtp_layers * (sum(lin.params for lin in mtp_linears(model)) + norm_params(model) + mhc_params(model)
                                 + 2 * model.hidden_size)
    return n


def active_params(model: ModelSpec, phase: Literal["decode", "prefill"] = "decode") -> int:
    """Parameters touched per token (top_k routed experts instead of all).

    ``prefill``: per prompt token of a long prompt. A CED model (``ced_encoder_layers``) runs its decoder
    layers over only each chunk's last ``sliding_window`` tokens, so per prompt token they vanish in the
    limit, and so does the LM head (one sampled token per chunk) (DeepSeek-V4.1: 8B active in prefill, 16B in
    decode). Other models: the same as decode.
    """
    n = total_params(model)
    if model.moe:
        per_expert = 3 * model.hidden_size * model.moe.moe_intermediate_size
        moe_layers = model.num_layers - model.moe.first_k_dense
        n -= moe_layers * per_expert * (model.moe.n_routed_experts - model.moe.top_k)
    if phase == "prefill" and model.ced_encoder_layers is not None:
        n -= sum(lin.params for lin in embedding_linears(model) if lin.name == "lm_head")
        for layer in range(model.ced_encoder_layers, model.num_layers):
            lins = layer_linears(model, layer)
            n -= sum(lin.params for lin in lins if lin.shard != "expert") + norm_params(model) + mhc_params(model)
            if model.is_moe_layer(layer):
                n -= 3 * model.hidden_size * model.moe.moe_intermediate_size * model.moe.top_k
    return n
