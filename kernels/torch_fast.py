"""Faster torch-only implementations (still tier 0: no extra library), used on GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                   scale: float, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as ``reference.attention`` through ``F.scaled_dot_product_attention``.

    The mask is explicit (queries sit at arbitrary positions after a cached prefix), so
    torch picks its memory-efficient or math backend rather than flash.
    """
    s = k.shape[0]
    visible = torch.arange(s, device=q.device)[None, :] <= q_positions[:, None]
    if key_mask is not None:
        visible = visible & key_mask
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=visible[None, None], scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return out[0].transpose(0, 1).contiguous()
