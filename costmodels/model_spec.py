"""Architecture of a served model: the numbers the cost model and the executor share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerKind = Literal["full", "sliding", "csa", "hca"]


class MLAConfig(BaseModel):
    """Multi-head latent attention (DeepSeek-V2/V3): KV compressed to a latent + a RoPE key."""

    model_config = ConfigDict(extra="forbid")
    q_lora_rank: int | None = Field(1536, ge=1, description="query low-rank dim (None: full-rank q)")
    kv_lora_rank: int = Field(512, ge=1)
    qk_nope_head_dim: int = Field(128, ge=1)
    qk_rope_head_dim: int = Field(64, ge=0)
    v_head_dim: int = Field(128, ge=1)
    kv_up_proj: bool = Field(True, description="False: the cached latent is itself the MQA key/value (DeepSeek-V4), no kv_b_proj")


class IndexerConfig(BaseModel):
    """Sparse-attention indexer (DSA, DeepSeek-V3.2): scores past tokens, main attention reads top-k."""

    model_config = ConfigDict(extra="forbid")
    n_heads: int = Field(64, ge=1)
    head_dim: int = Field(128, ge=1)
    topk: int = Field(2048, ge=1)
    dtype: Literal["bf16", "fp8"] = "fp8"


class MoEConfig(BaseModel):
    """Routed + shared experts of the MoE layers."""

    model_config = ConfigDict(extra="forbid")
    n_routed_experts: int = Field(..., ge=1)
    n_shared_experts: int = Field(0, ge=0)
    top_k: int = Field(..., ge=1)
    moe_intermediate_size: int = Field(..., ge=1)
    first_k_dense: int = Field(0, ge=0, description="leading layers with a dense FFN instead of MoE")
    n_group: int = Field(1, ge=1)
    topk_group: int = Field(1, ge=1)
    scoring: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "softmax"
    shared_intermediate_size: int | None = Field(None, ge=1, description="inner dim of the shared expert(s) together (default n_shared * moe_intermediate_size)")

    @model_validator(mode="after")
    def _check(self) -> "MoEConfig":
        if self.top_k > self.n_routed_experts:
            raise ValueError(f"top_k={self.top_k} exceeds n_routed_experts={self.n_routed_experts}")
        return self


class ModelSpec(BaseModel):
    """One model's architecture. Every number carries a source in ``sources``; guesses go in ``assumptions``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    family: Literal["deepseek_v3", "deepseek_v32", "deepseek_v4", "kimi_k2", "qwen3_moe", "glm4_moe", "llama", "qwen3", "tiny"]
    num_layers: int = Field(..., ge=1, le=1024)
    hidden_size: int = Field(..., ge=1)
    vocab_size: int = Field(..., ge=1)
    num_attention_heads: int = Field(..., ge=1)
    num_kv_heads: int = Field(..., ge=1, description="KV heads (GQA); MLA stores one latent per token")
    head_dim: int = Field(..., ge=1, description="per-head dim of q/k for GQA models")
    intermediate_size: int = Field(..., ge=1, description="dense FFN inner dim")
    attention: Literal["mla", "gqa"] = "gqa"
    mla: MLAConfig | None = None
    indexer: IndexerConfig | None = None
    moe: MoEConfig | None = None
    # per-layer attention kind; empty means all "full"
    layer_kinds: list[LayerKind] = Field(default_factory=list)
    sliding_window: int | None = Field(None, ge=1, description="window of 'sliding' layers, tokens")
    compress_ratio: dict[str, int] = Field(default_factory=dict, description="KV compression per layer kind, e.g. {'csa': 4, 'hca': 128}")
    kv_share_group: int = Field(1, ge=1, description="consecutive layers sharing one KV cache (cross-layer KV sharing)")
    mtp_layers: int = Field(0, ge=0, description="multi-token-prediction draft layers")
    host_table_bytes: float = Field(0.0, ge=0, description="vocabulary / n-gram (Engram) tables that may live in host memory")
    host_table_bytes_per_token: float = Field(0.0, ge=0, description="bytes looked up in those tables per token")
    max_context: int = Field(131072, ge=1)
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    # grouped low-rank output projection (DeepSeek-V4): o_groups groups, each heads/o_groups heads -> o_lora_rank
    o_lora_rank: int | None = Field(None, ge=1)
    o_groups: int = Field(1, ge=1)
    hc_mult: int = Field(1, ge=1, description="hyper-connection residual streams (mHC); 1 = plain residual")
    window_in_compressed_layers: bool = Field(False, description="csa/hca layers also attend the last sliding_window tokens uncompressed")
    # dtypes the released checkpoint ships in (defaults for a layout)
    checkpoint_dtype: Literal["bf16", "fp8", "fp4"] = "bf16"
    checkpoint_expert_dtype: Literal["bf16", "fp8", "fp4"] | None = None
    default_kv_dtype: Literal["bf16", "fp8", "fp4"] = "bf16"
    sources: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)

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
