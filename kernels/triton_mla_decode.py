"""Tier 1: absorbed MLA decode over the paged latent cache in Triton (split-K flash-decoding).

The query rows of a sequence (``s_q`` positions x ``H`` heads, folded into one axis) all
attend to one shared latent KV head, so a program loads a tile of latents once and uses
it for BLOCK_H query rows; the sequence is cut into splits run by separate programs
(enough programs to fill the SMs at small batch) and the partial outputs are merged by
their log-sum-exp. Row ``i*H + h`` (query position i of s_q) sees keys
``< seq_len - s_q + i + 1``: MTP verification is causal among its queries.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.registry import Unsupported
from kernels.triton_precision import dot_precision

LOG2E = 1.4426950408889634


@triton.jit
def _mla_split_kernel(q_ptr, kv_ptr, bt_ptr, lens_ptr, o_ptr, lse_ptr,
                      R, H, S_Q, split_len, scale_log2,
                      stride_qb, stride_qr, stride_kvp, stride_kvt, stride_btb,
                      stride_ob, stride_or, stride_os, stride_lb, stride_lr,
                      DV: tl.constexpr, DR: tl.constexpr, PAGE: tl.constexpr,
                      BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    rows = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = rows < R
    lim = seq_len - S_Q + rows // H + 1                 # causal limit of each query row
    dv = tl.arange(0, DV)
    dr = tl.arange(0, DR)
    q_base = q_ptr + b * stride_qb + rows[:, None] * stride_qr
    q_nope = tl.load(q_base + dv[None, :], mask=rmask[:, None], other=0.0)
    q_pe = tl.load(q_base + DV + dr[None, :], mask=rmask[:, None], other=0.0)

    start = sp * split_len
    end = tl.minimum(start + split_len, seq_len)
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, DV), tl.float32)
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tmask = t < end
        page = tl.load(bt_ptr + b * stride_btb + t // PAGE, mask=tmask, other=0)
        base = kv_ptr + page.to(tl.int64) * stride_kvp + (t % PAGE) * stride_kvt
        k_nope = tl.load(base[:, None] + dv[None, :], mask=tmask[:, None], other=0.0)
        k_pe = tl.load(base[:, None] + DV + dr[None, :], mask=tmask[:, None], other=0.0)
        s = tl.dot(q_nope, tl.trans(k_nope), input_precision=PREC) + tl.dot(q_pe, tl.trans(k_pe), input_precision=PREC)
        s = s * scale_log2
        s = tl.where((t[None, :] < lim[:, None]) & tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_nope.dtype), k_nope, input_precision=PREC)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    tl.store(o_ptr + b * stride_ob + rows[:, None] * stride_or + sp * stride_os + dv[None, :], out, mask=rmask[:, None])
    tl.store(lse_ptr + b * stride_lb + rows * stride_lr + sp, lse, mask=rmask)


def _pow2(x: int) -> bool:
    return x >= 16 and x & (x - 1) == 0


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
               scale: float, kv_rank: int, topk_indices: torch.Tensor | None = None,
               block_h: int | None = None, block_n: int = 32, num_splits: int | None = None,
               num_warps: int = 4, num_stages: int = 2, memo: dict | None = None) -> torch.Tensor:
    """Same contract as ``reference.mla_decode_paged`` (dense only: DSA top-k goes to the reference); ``memo`` is not
    used (no per-step metadata)."""
    if topk_indices is not None:
        raise Unsupported("triton mla_decode: dense attention only")
    b, s_q, h, d = q.shape
    dr = d - kv_rank
    if not (_pow2(kv_rank) and _pow2(dr)) or q.dtype not in (torch.bfloat16, torch.float16):
        raise Unsupported("triton mla_decode: bf16/fp16 with power-of-two latent and rope dims >= 16")
    page = kv_cache.shape[1]
    r = s_q * h
    bh = block_h or (16 if r <= 16 else 32)
    hb = triton.cdiv(r, bh)
    if num_splits is None:
        # enough programs for ~2 waves on the SMs, but no split shorter than a few tiles
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 8
        max_len = int(block_table.shape[1]) * page
        num_splits = max(1, min(triton.cdiv(2 * sms, b * hb), triton.cdiv(max_len, 4 * block_n), 64))
    max_len = int(block_table.shape[1]) * page
    split_len = triton.cdiv(triton.cdiv(max_len, num_splits), block_n) * block_n
    qf = q.reshape(b, r, d)
    if qf.stride(-1) != 1:
        qf = qf.contiguous()
    o = torch.empty(b, r, num_splits, kv_rank, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, r, num_splits, dtype=torch.float32, device=q.device)
    bt = block_table.to(torch.int32)
    _mla_split_kernel[(b, hb, num_splits)](
        qf, kv_cache, bt, seq_lens.to(torch.int32), o, lse,
        r, h, s_q, split_len, scale * LOG2E,
        qf.stride(0), qf.stride(1), kv_cache.stride(0), kv_cache.stride(1), bt.stride(0),
        o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1),
        DV=kv_rank, DR=dr, PAGE=page, BLOCK_H=bh, BLOCK_N=block_n, PREC=dot_precision(kv_cache.dtype), num_warps=num_warps, num_stages=num_stages)
    # merge splits by log-sum-exp (base 2); empty splits carry -inf and weigh nothing
    m = lse.max(-1, keepdim=True).values
    w = torch.exp2(lse - m)
    out = (o * w[..., None]).sum(2) / w.sum(-1, keepdim=True)
    return out.view(b, s_q, h, kv_rank).to(q.dtype)


def kv_bytes(seq_lens: torch.Tensor, dim: int, elem: int = 2) -> int:
    """Bytes of latent cache one decode step must read (each token once)."""
    return int(seq_lens.sum()) * dim * elem

