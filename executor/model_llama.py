"""Llama / Qwen3 (dense) and Qwen3-MoE: GQA attention with a dense or MoE FFN."""

from __future__ import annotations

from executor.gqa import GQAAttention
from executor.layers import MLP, DecoderLayer
from executor.model_base import CausalLM
from executor.model_config import ExecModelConfig
from executor.moe import MoE


class LlamaForCausalLM(CausalLM):
    """GQA decoder stack; MoE layers where ``spec.is_moe_layer(i)`` (Qwen3-MoE)."""

    def __init__(self, cfg: ExecModelConfig, fp8: bool = False):
        s = cfg.spec
        layers = []
        for i in range(s.num_layers):
            attn = GQAAttention(s, i, cfg.qk_norm, cfg.attention_bias, fp8)
            if s.is_moe_layer(i):
                mlp = MoE(s.moe, s.hidden_size, 1.0, cfg.norm_topk_prob, fp8)
            else:
                mlp = MLP(s.hidden_size, s.intermediate_size, fp8)
            layers.append(DecoderLayer(s.hidden_size, s.rms_norm_eps, attn, mlp))
        super().__init__(cfg, layers, s.head_dim)
