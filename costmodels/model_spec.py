"""Architecture of a served model: the numbers the cost model and the executor share.

A ModelSpec YAML (schema version ``MODEL_SCHEMA_VERSION``, docs/byo.md) holds these fields;
``twinfer model --show NAME`` prints one with every field described. Most users give a Hugging
Face ``config.json`` instead (costmodels.catalog.from_hf_config builds the spec from it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerKind = Literal["full", "sliding", "csa", "hca"]

MODEL_SCHEMA_VERSION = 1  # bump when a field changes meaning


class MLAConfig(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3): KV compressed to a latent + a RoPE key."""

    model_config = ConfigDict(extra="forbid")
    q_lora_rank: int | None = Field(1536, ge=1, description="query low-rank dim (None: full-rank q)")
    kv_lora_rank: int = Field(512, ge=1, description="latent dim of the compressed KV (cached per token per layer)")
    qk_nope_head_dim: int = Field(128, ge=1, description="per-head q/k dim without RoPE")
    qk_rope_head_dim: int = Field(64, ge=0, description="decoupled RoPE key dim (cached per token per layer)")
    v_head_dim: int = Field(128, ge=1, description="per-head value dim")
    kv_up_proj: bool = Field(True, description="False: the cached latent is itself the MQA key/value (DeepSeek-V4), no kv_b_proj")


class IndexerConfig(BaseModel):
    """Sparse-attention indexer (DSA, DeepSeek-V3.2): scores past tokens, main attention reads top-k."""

    model_config = ConfigDict(extra="forbid")
    n_heads: int = Field(64, ge=1, description="indexer heads")
    head_dim: int = Field(128, ge=1, description="indexer head dim")
    topk: int = Field(2048, ge=1, description="tokens the main attention reads per query")
    dtype: Literal["bf16", "fp8"] = Field("fp8", description="indexer math dtype")


class MoEConfig(BaseModel):
    """Routed + shared experts of the MoE layers."""

    model_config = ConfigDict(extra="forbid")
    n_routed_experts: int = Field(..., ge=1, description="routed experts per MoE layer")
    n_shared_experts: int = Field(0, ge=0, description="always-active shared experts per MoE layer")
    top_k: int = Field(..., ge=1, description="routed experts per token")
    moe_intermediate_size: int = Field(..., ge=1, description="inner dim of one expert's FFN")
    first_k_dense: int = Field(0, ge=0, description="leading layers with a dense FFN instead of MoE")
    n_group: int = Field(1, ge=1, description="expert groups for group-limited routing")
    topk_group: int = Field(1, ge=1, description="groups a token may route to")
    scoring: Literal["softmax", "sigmoid", "sqrtsoftplus"] = Field("softmax", description="router scoring function")
    shared_intermediate_size: int | None = Field(None, ge=1, description="inner dim of the shared expert(s) together (default n_shared * moe_intermediate_size)")

    @model_validator(mode="after")
    def _check(self) -> "MoEConfig":
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_routed_experts={self.n_routed_experts}")
        return self


class ModelSpec(BaseModel):
    """One model's architecture. Every number carries a source in ``sources``; guesses go in ``assumptions``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = Field(MODEL_SCHEMA_VERSION, description="ModelSpec file schema version (docs/byo.md)")
    name: str = Field(..., min_length=1, description="model name shown in output")
    family: Literal["deepseek_v3", "deepseek_v32", "deepseek_v4", "kimi_k2", "qwen3_moe", "glm4_moe", "llama", "qwen3", "tiny"] = Field(
        ..., description="architecture family (decides which layers exist): deepseek_v3, deepseek_v32, deepseek_v4, kimi_k2, qwen3_moe, glm4_moe, llama, qwen3, tiny")
    num_layers: int = Field(..., ge=1, le=1024, description="transformer layers (MTP layers not included)")
    hidden_size: int = Field(..., ge=1, description="model (residual) dim")
    vocab_size: int = Field(..., ge=1, description="vocabulary size (embedding and LM head rows)")
    num_attention_heads: int = Field(..., ge=1, description="query heads")
    num_kv_heads: int = Field(..., ge=1, description="KV heads (GQA); MLA stores one latent per token")
    head_dim: int = Field(..., ge=1, description="per-head dim of q/k for GQA models")
    intermediate_size: int = Field(..., ge=1, description="dense FFN inner dim")
    attention: Literal["mla", "gqa"] = Field("gqa", description="mla (latent KV, needs the mla section) or gqa (MHA/GQA/MQA)")
    mla: MLAConfig | None = Field(None, description="multi-head latent attention dims (attention: mla)")
    indexer: IndexerConfig | None = Field(None, description="sparse-attention indexer (DeepSeek-V3.2 DSA); null: dense attention")
    moe: MoEConfig | None = Field(None, description="MoE layers; null: a dense model")
    layer_kinds: list[LayerKind] = Field(default_factory=list, description="attention kind per layer (full, sliding, csa, hca); empty: all full")
    sliding_window: int | None = Field(None, ge=1, description="window of 'sliding' layers, tokens")
    compress_ratio: dict[str, int] = Field(default_factory=dict, description="KV compression per layer kind, e.g. {'csa': 4, 'hca': 128}")
    kv_share_group: int = Field(1, ge=1, description="consecutive layers sharing one KV cache (cross-layer KV sharing)")
    mtp_layers: int = Field(0, ge=0, description="multi-token-prediction draft layers")
    host_table_bytes: float = Field(0.0, ge=0, description="vocabulary / n-gram (Engram) tables that may live in host memory")
    host_table_bytes_per_token: float = Field(0.0, ge=0, description="bytes looked up in those tables per token")
    max_context: int = Field(131072, ge=1, description="longest context, tokens (config.json max_position_embeddings)")
    rope_theta: float = Field(10000.0, description="RoPE base (executor only)")
    rms_norm_eps: float = Field(1e-6, description="RMSNorm epsilon (executor only)")
    tie_word_embeddings: bool = Field(False, description="LM head shares the embedding matrix")
    # grouped low-rank output projection (DeepSeek-V4): o_groups groups, each heads/o_groups heads -> o_lora_rank
    o_lora_rank: int | None = Field(None, ge=1, description="grouped low-rank output projection rank (DeepSeek-V4); null: plain o_proj")
    o_groups: int = Field(1, ge=1, description="groups of that output projection")
    hc_mult: int = Field(1, ge=1, description="hyper-connection residual streams (mHC); 1 = plain residual")
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
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        return self

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    def kinds(self) -> list[LayerKind]:
        """Attention kind of every layer."""
        return list(self.layer_kinds) if self.layer_kinds else ["full"] * self.num_layers

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.first_k_dense
