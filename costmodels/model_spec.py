"""Architecture of a served model: the numbers the cost model and the executor share.

A ModelSpec YAML (schema version ``MODEL_SCHEMA_VERSION``, docs/byo.md) holds these fields;
``twinfer model --show NAME`` prints one with every field described. Most users give a Hugging
Face ``config.json`` instead (costmodels.catalog.from_hf_config builds the spec from it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# full: every past token (or the indexer's top-k of them); sliding: the last sliding_window tokens; csa / hca:
# compressed KV (compress_ratio per kind; csa read through the indexer's top-k); sparse: uncompressed KV read only
# through the indexer's top-k, plus the window (DeepSeek-V4.1's ratio-1 layers)
LayerKind = Literal["full", "sliding", "csa", "hca", "sparse"]
KVDType = Literal["bf16", "fp8", "fp4"]
# FP4 block formats: MXFP4 = one 1-byte UE8M0 scale per 32 values (4.25 bits/value); NVFP4 = one 1-byte E4M3
# scale per 16 values (4.5 bits/value; its per-tensor FP32 scale is negligible). OCP MX spec v1.0; NVIDIA NVFP4.
FP4Format = Literal["mxfp4", "nvfp4"]

MODEL_SCHEMA_VERSION = 1  # bump when a field changes meaning


# upper bounds of a model's sizes (ten or more times the largest published model's): past them a file is a typo, and
# its weights, KV and step times would be numbers no hardware holds (a hidden size of 1e12 passed until 2026-12-06)
DIM_MAX = 1 << 20          # a hidden / FFN / head / latent dim (DeepSeek-V3 7168, Llama-3.1-405B's FFN 53248)
HEADS_MAX = 1 << 16        # attention heads, KV heads, output groups
EXPERTS_MAX = 1 << 16      # routed experts and their per-token / group counts (Kimi-K2: 384)
VOCAB_MAX = 1 << 24        # vocabulary rows (the largest published: ~256k)
CONTEXT_MAX = 1 << 28      # context, window and index lengths in tokens (the longest published: 10M)


class MLAConfig(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3): KV compressed to a latent + a RoPE key."""

    model_config = ConfigDict(extra="forbid")
    q_lora_rank: int | None = Field(1536, ge=1, le=DIM_MAX, description="query low-rank dim (None: full-rank q)")
    kv_lora_rank: int = Field(512, ge=1, le=DIM_MAX, description="latent dim of the compressed KV (cached per token per layer)")
    qk_nope_head_dim: int = Field(128, ge=1, le=DIM_MAX, description="per-head q/k dim without RoPE")
    qk_rope_head_dim: int = Field(64, ge=0, le=DIM_MAX, description="decoupled RoPE key dim (cached per token per layer)")
    v_head_dim: int = Field(128, ge=1, le=DIM_MAX, description="per-head value dim")
    kv_up_proj: bool = Field(True, description="False: the cached latent is itself the MQA key/value (DeepSeek-V4), no kv_b_proj")


class IndexerConfig(BaseModel):
    """Sparse-attention indexer (DSA, DeepSeek-V3.2): scores past tokens, main attention reads top-k."""

    model_config = ConfigDict(extra="forbid")
    n_heads: int = Field(64, ge=1, le=HEADS_MAX, description="indexer heads")
    head_dim: int = Field(128, ge=1, le=DIM_MAX, description="indexer head dim")
    topk: int = Field(2048, ge=1, le=CONTEXT_MAX, description="tokens the main attention reads per query")
    dtype: Literal["bf16", "fp8"] = Field("fp8", description="indexer math dtype")
    kv_dtype: KVDType | None = Field(None, description="indexer key cache dtype (fp4: MXFP4, 1 B per 32 keys' values); null: the math dtype (fp8 keys + one fp32 scale)")


class MoEConfig(BaseModel):
    """Routed + shared experts of the MoE layers."""

    model_config = ConfigDict(extra="forbid")
    n_routed_experts: int = Field(..., ge=1, le=EXPERTS_MAX, description="routed experts per MoE layer")
    n_shared_experts: int = Field(0, ge=0, le=EXPERTS_MAX, description="always-active shared experts per MoE layer")
    top_k: int = Field(..., ge=1, le=EXPERTS_MAX, description="routed experts per token")
    moe_intermediate_size: int = Field(..., ge=1, le=DIM_MAX, description="inner dim of one expert's FFN")
    first_k_dense: int = Field(0, ge=0, le=1024, description="leading layers with a dense FFN instead of MoE")
    n_group: int = Field(1, ge=1, le=EXPERTS_MAX, description="expert groups for group-limited routing")
    topk_group: int = Field(1, ge=1, le=EXPERTS_MAX, description="groups a token may route to")
    scoring: Literal["softmax", "sigmoid", "sqrtsoftplus"] = Field("softmax", description="router scoring function")
    shared_intermediate_size: int | None = Field(None, ge=1, le=DIM_MAX, description="inner dim of the shared expert(s) together (default n_shared * moe_intermediate_size)")

    @model_validator(mode="after")
    def _check(self) -> "MoEConfig":
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_routed_experts={self.n_routed_experts}")
        if self.n_routed_experts % self.n_group:
            raise ValueError(f"n_group={self.n_group} does not divide n_routed_experts={self.n_routed_experts} "
                             "(group-limited routing splits the experts into equal groups)")
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group={self.topk_group} exceeds n_group={self.n_group}")
        return self


class ModelSpec(BaseModel):
    """One model's architecture. Every number carries a source in ``sources``; guesses go in ``assumptions``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = Field(MODEL_SCHEMA_VERSION, description="ModelSpec file schema version (docs/byo.md)")
    name: str = Field(..., min_length=1, description="model name shown in output")
    family: Literal["deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "kimi_k2", "qwen3_moe", "glm4_moe", "llama", "qwen3", "tiny"] = Field(
        ..., description="architecture family (decides which layers exist): deepseek_v3, deepseek_v32, deepseek_v4, deepseek_v41, kimi_k2, qwen3_moe, glm4_moe, llama, qwen3, tiny")
    num_layers: int = Field(..., ge=1, le=1024, description="transformer layers (MTP layers not included)")
    hidden_size: int = Field(..., ge=1, le=DIM_MAX, description="model (residual) dim")
    vocab_size: int = Field(..., ge=1, le=VOCAB_MAX, description="vocabulary size (embedding and LM head rows)")
    num_attention_heads: int = Field(..., ge=1, le=HEADS_MAX, description="query heads")
    num_kv_heads: int = Field(..., ge=1, le=HEADS_MAX, description="KV heads (GQA); MLA stores one latent per token")
    head_dim: int = Field(..., ge=1, description="per-head dim of q/k for GQA models")
    intermediate_size: int = Field(..., ge=1, le=DIM_MAX, description="dense FFN inner dim")
    attention: Literal["mla", "gqa"] = Field("gqa", description="mla (latent KV, needs the mla section) or gqa (MHA/GQA/MQA)")
    mla: MLAConfig | None = Field(None, description="multi-head latent attention dims (attention: mla)")
    indexer: IndexerConfig | None = Field(None, description="sparse-attention indexer (DeepSeek-V3.2 DSA); null: dense attention")
    moe: MoEConfig | None = Field(None, description="MoE layers; null: a dense model")
    layer_kinds: list[LayerKind] = Field(default_factory=list, description="attention kind per layer (full, sliding, csa, hca, sparse); empty: all full")
    sliding_window: int | None = Field(None, ge=1, le=CONTEXT_MAX, description="window of 'sliding' layers, tokens")
    compress_ratio: dict[str, int] = Field(default_factory=dict, description="KV compression per layer kind, e.g. {'csa': 4, 'hca': 128}")
    kv_share_group: int = Field(1, ge=1, le=1024, description="consecutive layers sharing one KV cache (cross-layer KV sharing)")
    kv_share_source: list[int | None] = Field(default_factory=list, description=(
        "per layer, the earlier layer whose (compressed/global) KV cache it reads instead of storing its own, any distance "
        "away (DeepSeek-V4.1 CSA2); null: the layer stores its own. Sliding-window entries stay per layer. Empty: kv_share_group decides"))
    index_source_layers: list[int] | None = Field(None, description=(
        "layers that run the indexer's scoring and top-k; the other indexed layers reuse the top-k of a source (DeepSeek-V4.1). null: every indexed layer scores"))
    index_candidate_source: int | None = Field(None, ge=0, description=(
        "two-level index (DeepSeek-V4.1): this layer's indexer picks candidate blocks, and the index sources above it score only "
        "those index_candidate_tokens positions instead of the whole context; null: every index source scores every key"))
    index_candidate_tokens: int | None = Field(None, ge=1, le=CONTEXT_MAX, description="candidate positions the later index sources score (candidate_topk_blocks x candidate_block_size)")
    ced_encoder_layers: int | None = Field(None, ge=1, le=1024, description=(
        "causal encoder-decoder (DeepSeek-V4.1 CED): a prefill chunk runs layers [0, N) over all its tokens and the decoder layers "
        "[N, num_layers) over only its last sliding_window tokens (their global KV comes from the sources below N); decode runs every layer. null: every layer over every token"))
    kv_fp4_format: FP4Format = Field("mxfp4", description=(
        "FP4 KV cache layout: mxfp4 = non-RoPE part FP4 with a 1 B scale per 32, RoPE part BF16; nvfp4 = the whole latent row (RoPE too) FP4 with a 1 B E4M3 scale per 16"))
    fp4_weight_format: FP4Format = Field("mxfp4", description="FP4 weight block format: mxfp4 (1 B scale per 32 values, 4.25 bits) or nvfp4 (1 B E4M3 per 16, 4.5 bits)")
    mtp_layers: int = Field(0, ge=0, le=64, description="multi-token-prediction draft layers")
    host_table_bytes: float = Field(0.0, ge=0, description="vocabulary / n-gram (Engram) tables that may live in host memory")
    host_table_bytes_per_token: float = Field(0.0, ge=0, description="bytes looked up in those tables per token")
    max_context: int = Field(131072, ge=1, le=CONTEXT_MAX, description="longest context, tokens (config.json max_position_embeddings)")
    rope_theta: float = Field(10000.0, description="RoPE base (executor only)")
    rms_norm_eps: float = Field(1e-6, description="RMSNorm epsilon (executor only)")
    tie_word_embeddings: bool = Field(False, description="LM head shares the embedding matrix")
    # grouped low-rank output projection (DeepSeek-V4): o_groups groups, each heads/o_groups heads -> o_lora_rank
    o_lora_rank: int | None = Field(None, ge=1, le=DIM_MAX, description="grouped low-rank output projection rank (DeepSeek-V4); null: plain o_proj")
    o_groups: int = Field(1, ge=1, le=HEADS_MAX, description="groups of that output projection")
    hc_mult: int = Field(1, ge=1, le=64, description="hyper-connection residual streams (mHC); 1 = plain residual")
    hc_sinkhorn_iters: int = Field(20, ge=1, le=1000, description="Sinkhorn iterations of the mHC residual mix (with hc_mult > 1)")
    window_in_compressed_layers: bool = Field(False, description="csa/hca layers also attend the last sliding_window tokens uncompressed")
    # dtypes the released checkpoint ships in (defaults for a layout)
    checkpoint_dtype: Literal["bf16", "fp8", "fp4"] = Field("bf16", description="weight dtype of the released checkpoint (config.json quantization_config); a layout's default")
    checkpoint_expert_dtype: Literal["bf16", "fp8", "fp4"] | None = Field(None, description="routed-expert weight dtype if it differs; null: checkpoint_dtype")
    default_kv_dtype: Literal["bf16", "fp8", "fp4"] = Field("bf16", description="KV cache dtype a layout uses unless it sets kv_dtype")
    sources: list[str] = Field(default_factory=list, description="where the numbers come from")
    assumptions: list[str] = Field(default_factory=list, description="numbers that are guesses")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.attention == "mla" and self.mla is None:
            raise ValueError("attention='mla' needs an 'mla' section")
        if self.layer_kinds and len(self.layer_kinds) != self.num_layers:
            raise ValueError(f"layer_kinds has {len(self.layer_kinds)} entries, num_layers is {self.num_layers}")
        if "sliding" in self.layer_kinds and self.sliding_window is None:
            raise ValueError("'sliding' layers need sliding_window")
        if self.moe is not None and self.moe.first_k_dense >= self.num_layers:
            raise ValueError(f"moe.first_k_dense={self.moe.first_k_dense} leaves no MoE layer of num_layers={self.num_layers} "
                             "(a dense model has no moe section)")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        self._check_kv_share_source()
        for i in self.index_source_layers or []:
            if not 0 <= i < self.num_layers:
                raise ValueError(f"index_source_layers: layer {i} is outside 0..{self.num_layers - 1}")
        if (self.index_candidate_source is None) != (self.index_candidate_tokens is None):
            raise ValueError("index_candidate_source and index_candidate_tokens go together (set both or neither)")
        if self.index_candidate_source is not None and self.index_candidate_source >= self.num_layers:
            raise ValueError(f"index_candidate_source={self.index_candidate_source} is outside 0..{self.num_layers - 1}")
        if self.ced_encoder_layers is not None:
            if self.ced_encoder_layers >= self.num_layers:
                raise ValueError(f"ced_encoder_layers={self.ced_encoder_layers} must be below num_layers={self.num_layers}")
            if not self.sliding_window:
                raise ValueError("ced_encoder_layers needs sliding_window (the decoder layers' prefill tail)")
        return self

    def _check_kv_share_source(self) -> None:
        """Each entry: null or an earlier layer that stores its own cache, of the same kind (the cache's geometry)."""
        src = self.kv_share_source
        if not src:
            return
        if len(src) != self.num_layers:
            raise ValueError(f"kv_share_source has {len(src)} entries, num_layers is {self.num_layers}")
        if self.kv_share_group > 1:
            raise ValueError("kv_share_source and kv_share_group > 1 are two ways to say the same thing: set one")
        kinds = self.kinds()
        for i, j in enumerate(src):
            if j is None or j == i:
                continue
            if not 0 <= j < i:
                raise ValueError(f"kv_share_source[{i}] = {j}: a layer can only read the cache of an earlier layer (0..{i - 1}) or null")
            if src[j] is not None and src[j] != j:
                raise ValueError(f"kv_share_source[{i}] = {j}: layer {j} itself reads layer {src[j]}'s cache; point at the layer that stores it")
            if kinds[i] != kinds[j]:
                raise ValueError(f"kv_share_source[{i}] = {j}: layer {i} is {kinds[i]} but layer {j}'s cache is {kinds[j]} (a shared cache needs one kind)")
            if kinds[i] == "sliding":
                raise ValueError(f"kv_share_source[{i}] = {j}: sliding-window layers keep their own window; share only global (compressed) caches")

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def kinds(self) -> list[LayerKind]:
        """Attention kind of every layer."""
        return list(self.layer_kinds) if self.layer_kinds else ["full"] * self.num_layers

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.first_k_dense

    def stores_kv(self, layer: int) -> bool:
        """Whether ``layer`` stores its own global KV cache (not read from another layer's: kv_share_source / kv_share_group)."""
        if self.kv_share_source:
            j = self.kv_share_source[layer]
            return j is None or j == layer
        return layer % self.kv_share_group == 0

    def scores_index(self, layer: int) -> bool:
        """Whether ``layer`` runs the indexer's scoring (given it is an indexed layer): index_source_layers, else every one."""
        return self.index_source_layers is None or layer in self.index_source_layers

    def index_cap(self, layer: int) -> int | None:
        """Positions an index-scoring ``layer`` scores at most: the candidates of a two-level index above its
        candidate source; None: every key."""
        if self.index_candidate_source is not None and layer > self.index_candidate_source:
            return self.index_candidate_tokens
        return None

    def ced_decoder(self, layer: int) -> bool:
        """A CED decoder layer: in prefill it runs over only each chunk's last sliding_window tokens."""
        return self.ced_encoder_layers is not None and layer >= self.ced_encoder_layers
