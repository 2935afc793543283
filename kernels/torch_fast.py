"""Faster torch-only implementations (still tier 0: no extra library), used on GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Prefill SDPA backends, in order. Not cuDNN: on sm90 with a recent cuDNN torch puts it first (sdp_utils.cpp
# check_prefer_cudnn_attention), and cuDNN builds one execution plan per exact (s_q, s_kv, strides) problem, cached in
# an unbounded per-thread map (aten/src/ATen/native/cudnn/MHA.cpp); a miss costs tens of ms of host (FlashInfer
# measured 55-70 ms per new shape, flashinfer#5245). Chunked prefill makes a new (new, cached) shape nearly every step,
# so a trace's first replay paid it on its large eager steps and its second did not (H200 matrix run 4: 8k-token
# 4-chunk steps 275 ms then 190 ms, in units of ~45 ms per step). The memory-efficient kernel takes the mask and the
# 192/128 q/v head dims with no per-shape plan; math is the fallback.
PREFILL_SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                   scale: float, key_mask: torch.Tensor | None = None, bottom_right: bool = False) -> torch.Tensor:
    """Same contract as ``reference.attention`` through ``F.scaled_dot_product_attention``.

    The mask is explicit (queries sit at arbitrary positions after a cached prefix), so
    flash cannot run; the backends are pinned to memory-efficient, then math (``PREFILL_SDPA_BACKENDS``: no cuDNN).
    ``bottom_right`` (queries at the sequence's end) is the flash split's hint (kernels/prefill_attention.py),
    taken and not needed here. That split serves MLA prefill chunks; this serves masked calls (SWA, DSA) and GQA.
    """
    s = k.shape[0]
    visible = torch.arange(s, device=q.device)[None, :] <= q_positions[:, None]
    if key_mask is not None:
        visible = visible & key_mask
    if k.shape[1] != q.shape[1]:
        # GQA: repeat the KV heads rather than pass enable_gqa, which with an attn_mask sends SDPA to its math
        # backend (a [heads, n, S] fp32 score matrix; pytorch/pytorch#139586, transformers#39412's review)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    with sdpa_kernel(PREFILL_SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=visible[None, None], scale=scale)
    return out[0].transpose(0, 1).contiguous()


def mla_decode_batched(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                       scale: float, kv_rank: int, topk_indices: torch.Tensor | None = None,
                       memo: dict | None = None) -> torch.Tensor:
    """``reference.mla_decode_paged`` without the per-sequence loop: one gather, two batched matmuls (``memo``: unused).

    Keys are gathered per query row: the DSA top-k positions when given (sparse, what V3.2
    reads), else every position up to the longest sequence (dense, padded and masked). Costs
    B x s_q x keys x 576 of gathered latents: fine for top-k 2048 or short contexts, wasteful
    for long dense ones (FlashMLA / Triton are preferred there).
    """
    b, s_q, h, d = q.shape
    page = kv_cache.shape[1]
    dev = q.device
    if topk_indices is None:
        n = int(seq_lens.max())
        idx = torch.arange(n, device=dev).expand(b, s_q, n)
    else:
        idx = topk_indices.long()
    qpos = seq_lens.long()[:, None] - s_q + torch.arange(s_q, device=dev)[None, :]      # [B, s_q]
    valid = (idx >= 0) & (idx <= qpos[:, :, None])
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    pages = torch.gather(block_table.long(), 1, (safe // page).view(b, -1)).view_as(safe)
    kv = kv_cache.reshape(-1, d)[(pages * page + safe % page).view(-1)].view(b, s_q, -1, d)   # [B, s_q, K, D]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = torch.einsum("bshd,bskd->bshk", q.to(work), kv.to(work)) * scale
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bshk,bskd->bshd", probs, kv[..., :kv_rank].to(work)).to(q.dtype)
