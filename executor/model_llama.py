"""Llama / Qwen3 (dense), Qwen3-MoE and GLM-4.5 (MoE): GQA attention with a dense or MoE FFN."""

from __future__ import annotations

from executor.gqa import GQAAttention
from executor.layers import MLP, DecoderLayer
from executor.model_base import CausalLM
from executor.model_config import ExecModelConfig
from executor.moe import MoE
from executor.swa import SlidingWindowAttention


class LlamaForCausalLM(CausalLM):
    """GQA decoder stack; MoE layers where ``spec.is_moe_layer(i)`` (Qwen3-MoE, GLM-4.5)."""

    def __init__(self, cfg: ExecModelConfig, fp8: bool = False):
        s = cfg.spec
        rope_dim = int(s.head_dim * cfg.rope.partial_rotary_factor)
        layers = []
        for i, kind in enumerate(s.kinds()):
            if kind == "sliding":   # V4-class sliding-window layers (executor/swa.py)
                attn = SlidingWindowAttention(s, i, s.sliding_window, cfg.qk_norm, cfg.attention_bias, fp8, cfg.o_bias, rope_dim)
            else:
                attn = GQAAttention(s, i, cfg.qk_norm, cfg.attention_bias, fp8, cfg.o_bias, rope_dim)
            if s.is_moe_layer(i):
                # GLM-4.5 scales routed experts (routed_scaling_factor); Qwen3-MoE has no such key (1.0)
                mlp = MoE(s.moe, s.hidden_size, cfg.routed_scaling_factor, cfg.norm_topk_prob, fp8)
            else:
                mlp = MLP(s.hidden_size, s.intermediate_size, fp8)
            layers.append(DecoderLayer(s.hidden_size, s.rms_norm_eps, attn, mlp))
        super().__init__(cfg, layers, rope_dim)
