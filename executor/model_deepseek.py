"""DeepSeek-V3 / V3.2 / Kimi-K2 (and the ``tiny`` test model): MLA, MoE, DSA indexer, MTP."""

from __future__ import annotations

import torch
from torch import nn

from executor.forward_batch import ForwardBatch
from executor.kv_cache import KVCache
from executor.layers import MLP, DecoderLayer, Linear, RMSNorm
from executor.mla import MLAAttention
from executor.model_base import CausalLM
from executor.model_config import ExecModelConfig
from executor.moe import MoE
from kernels import reference as ref


def _layer(cfg: ExecModelConfig, i: int, cache_layer: int, fp8: bool, moe: bool) -> DecoderLayer:
    s = cfg.spec
    scale = ref.softmax_scale(s.mla.qk_nope_head_dim + s.mla.qk_rope_head_dim, cfg.rope.attention_mscale())
    attn = MLAAttention(s, cache_layer, scale, fp8, cfg.index_rope_interleaved, cfg.rope_interleave)
    mlp = MoE(s.moe, s.hidden_size, cfg.routed_scaling_factor, cfg.norm_topk_prob, fp8) if moe else MLP(s.hidden_size, s.intermediate_size, fp8)
    return DecoderLayer(s.hidden_size, s.rms_norm_eps, attn, mlp)


class SharedHead(nn.Module):
    """The MTP layer's output norm (its ``head`` is the main LM head, as in DeepSeek-V3's weights)."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(hidden, eps)


class MTPLayer(nn.Module):
    """DeepSeek-V3 multi-token prediction: predicts token i+2 from hidden h_i and token i+1.

    ``x = eh_proj([enorm(embed(t_{i+1})), hnorm(h_i)])`` then one MoE decoder block with its
    own KV; logits via ``shared_head.norm`` and the shared LM head (DeepSeek-V3 report 2.2).
    """

    def __init__(self, cfg: ExecModelConfig, j: int, fp8: bool):
        super().__init__()
        s = cfg.spec
        self.enorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.hnorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.eh_proj = Linear(2 * s.hidden_size, s.hidden_size, fp8=fp8)
        self.block = _layer(cfg, s.num_layers + j, s.num_layers + j, fp8, moe=s.is_moe)
        self.shared_head = SharedHead(s.hidden_size, s.rms_norm_eps)


class DeepseekV3ForCausalLM(CausalLM):
    """The main stack plus ``spec.mtp_layers`` MTP layers."""

    def __init__(self, cfg: ExecModelConfig, fp8: bool = False):
        s = cfg.spec
        layers = [_layer(cfg, i, i, fp8, s.is_moe_layer(i)) for i in range(s.num_layers)]
        super().__init__(cfg, layers, s.mla.qk_rope_head_dim)
        self.mtp = nn.ModuleList([MTPLayer(cfg, j, fp8) for j in range(s.mtp_layers)])
        self.num_mtp = s.mtp_layers

    def attention_modules(self) -> list[nn.Module]:
        return super().attention_modules() + [m.block.self_attn for m in self.mtp]

    def mtp_forward(self, j: int, batch: ForwardBatch, prev_hidden: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """MTP layer ``j`` over ``batch`` (whose input_ids are the *next* tokens); returns its pre-norm hidden."""
        m = self.mtp[j]
        e = m.enorm(self.model.embed_tokens(batch.input_ids))
        x = m.eh_proj(torch.cat((e, m.hnorm(prev_hidden)), dim=-1))
        return m.block(x, batch, kv)

    def mtp_logits(self, j: int, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits of MTP layer ``j``'s hidden states (its norm, the shared LM head)."""
        return self.compute_logits(self.mtp[j].shared_head.norm(hidden))
