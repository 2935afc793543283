"""Grouped-query attention (Llama, Qwen3, Qwen3-MoE), HF parameter names, paged K/V."""

from __future__ import annotations

import torch
from torch import nn

from costmodels.model_spec import ModelSpec
from executor.forward_batch import ForwardBatch
from executor.kv_cache import KVCache
from executor.layers import Linear, RMSNorm
from kernels import ops
from kernels import reference as ref


class GQAAttention(nn.Module):
    """q/k/v/o projections, optional per-head q/k RMSNorm (Qwen3, GLM), neox RoPE on the first ``rope_dim`` dims.

    ``rope_dim < head_dim`` is GLM-4.5's partial rotary (HF ``partial_rotary_factor``): the rest passes unrotated.
    """

    def __init__(self, spec: ModelSpec, cache_layer: int, qk_norm: bool, bias: bool, fp8: bool = False,
                 o_bias: bool = False, rope_dim: int | None = None):
        super().__init__()
        self.hq, self.hkv, self.d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        self.cache_layer, self.scale = cache_layer, self.d ** -0.5
        self.rope_dim = rope_dim or self.d
        hid = spec.hidden_size
        self.q_proj = Linear(hid, self.hq * self.d, bias=bias, fp8=fp8)
        self.k_proj = Linear(hid, self.hkv * self.d, bias=bias, fp8=fp8)
        self.v_proj = Linear(hid, self.hkv * self.d, bias=bias, fp8=fp8)
        self.o_proj = Linear(self.hq * self.d, hid, bias=o_bias, fp8=fp8)
        self.q_norm = RMSNorm(self.d, spec.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.d, spec.rms_norm_eps) if qk_norm else None
        self.cos_sin: torch.Tensor | None = None

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated q ``[T, Hq, D]``, rotated k and v ``[T, Hkv, D]`` (shared with the sliding-window variant, executor/swa.py)."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.hq, self.d)
        k = self.k_proj(x).view(t, self.hkv, self.d)
        v = self.v_proj(x).view(t, self.hkv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return self._rope(q, positions), self._rope(k, positions), v

    def project_and_cache(self, x: torch.Tensor, batch: ForwardBatch, kv: KVCache):
        """Project the step's tokens, write their K/V into this layer's pages; returns q, the layer's K and V
        caches and an empty output buffer."""
        q, k, v = self.project(x, batch.positions)
        kc, vc = kv.k[self.cache_layer], kv.v[self.cache_layer]
        ref.write_paged(kc, batch.slot_mapping, k)
        ref.write_paged(vc, batch.slot_mapping, v)
        return q, kc, vc, torch.empty(x.shape[0], self.hq, self.d, dtype=x.dtype, device=x.device)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        q, kc, vc, out = self.project_and_cache(x, batch, kv)
        nd = batch.num_decode_tokens
        if nd:
            qd = q[:nd].view(batch.num_decodes, batch.decode_sq, self.hq, self.d)
            o = ops.gqa_decode(qd, kc, vc, batch.decode_block_table, batch.decode_seq_lens, self.scale)
            out[:nd] = o.reshape(nd, self.hq, self.d)
        for p in batch.prefills:
            rows = slice(p.start, p.start + p.num)
            kk = ref.gather_paged(kc, p.block_table, p.kv_len)
            vv = ref.gather_paged(vc, p.block_table, p.kv_len)
            out[rows] = ops.attention_prefill(q[rows], kk, vv, batch.positions[rows], self.scale)
        return self.o_proj(out.view(x.shape[0], self.hq * self.d))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.rope_dim == self.d:
            return ref.rope(x, positions, self.cos_sin, False)
        r = self.rope_dim
        return torch.cat((ref.rope(x[..., :r], positions, self.cos_sin, False), x[..., r:]), dim=-1)
