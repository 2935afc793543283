"""Tier 1: grouped (per-expert) GEMMs for MoE in Triton, BF16 or block-scaled FP8.

Token-expert pairs are sorted by expert and each expert's run is padded to BLOCK_M rows
(the "align" step, done with torch ops on the device, no host sync), so every row block
of the launch belongs to one expert and reads one weight matrix. Rows hold pair indices
(token * top_k + slot); the first GEMM gathers token rows of x, the second reads the
activation of each pair and scales by its routing weight; the k pairs of a token are
summed at the end. Decode batches touch each expert with a few rows, so the launch is
bound by reading expert weights: a row block of 16-64 keeps that read single.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.registry import Unsupported
from kernels.triton_precision import dot_precision
from kernels.triton_rowwise import quant_fp8_act, silu_mul   # one launch each (quantisation not bit-equal to the reference on the H200)



@triton.jit
def _grouped_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, rows_ptr, block_expert_ptr, w_ptr,
                    N, K, num_kb, a_row_div,
                    stride_am, stride_be, stride_bn, stride_cm, stride_asm, stride_bse, stride_bsn,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    FP8: tl.constexpr, MUL_W: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)   # e * stride_be passes 2^31 for 256 experts
    if e >= 0:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + offs_m).to(tl.int64)
        valid = rows >= 0
        a_rows = tl.where(valid, rows // a_row_div, 0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + e * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, num_kb):
            kmask = offs_k + kb * BLOCK_K < K
            a = tl.load(a_ptrs, mask=valid[:, None] & kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :] & kmask[:, None], other=0.0)
            if FP8:
                a_s = tl.load(as_ptr + a_rows * stride_asm + kb, mask=valid, other=0.0)
                b_s = tl.load(bs_ptr + e * stride_bse + (pid_n * BLOCK_N // 128) * stride_bsn + kb)
                acc += tl.dot(a, b) * a_s[:, None] * b_s
            else:
                acc += tl.dot(a, b, input_precision=PREC)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        if MUL_W:
            acc = acc * tl.load(w_ptr + rows, mask=valid, other=0.0)[:, None]
        c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


def align_by_expert(topk_ids: torch.Tensor, n_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [R] pair index or -1, block_expert [R/block_m] expert or -1), each expert's run padded to block_m.

    R is the no-sync upper bound ``pairs + E*(block_m-1)`` rounded up; blocks past the last
    expert's run get expert -1 and exit at once.
    """
    flat = topk_ids.reshape(-1)
    n = flat.numel()
    # scatter_add, not bincount: bincount on CUDA syncs to read the max (breaks CUDA graph capture)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    starts = ends - padded
    max_rows = triton.cdiv(n + n_experts * (block_m - 1), block_m) * block_m
    order = torch.argsort(flat, stable=True)
    sorted_e = flat[order]
    first = counts.cumsum(0) - counts
    dest = starts[sorted_e] + torch.arange(n, device=flat.device) - first[sorted_e]
    rows = torch.full((max_rows,), -1, dtype=torch.int32, device=flat.device)
    rows[dest] = order.to(torch.int32)
    block_start = torch.arange(0, max_rows, block_m, device=flat.device)
    be = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(be < n_experts, be, torch.full_like(be, -1)).to(torch.int32)
    return rows, block_expert


def _launch(a, a_scale, b, b_scale, c, rows, block_expert, weights, a_row_div: int, block_m: int) -> None:
    n, k = b.shape[1], b.shape[2]
    fp8 = a.dtype == torch.float8_e4m3fn
    bk = 128 if fp8 else 64
    bn = 128 if fp8 else 64
    dummy = c
    grid = (block_expert.numel(), triton.cdiv(n, bn))
    _grouped_kernel[grid](
        a, b, c, a_scale if fp8 else dummy, b_scale if fp8 else dummy, rows, block_expert,
        weights if weights is not None else dummy,
        n, k, triton.cdiv(k, bk), a_row_div,
        a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        a_scale.stride(0) if fp8 else 0, b_scale.stride(0) if fp8 else 0, b_scale.stride(1) if fp8 else 0,
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, FP8=fp8, MUL_W=weights is not None, PREC=dot_precision(a.dtype),
        num_warps=4, num_stages=3)


def default_block_m(tokens: int, top_k: int, experts: int) -> int:
    """Rows per block of the grouped GEMMs: 16 up to 12 token-expert pairs per expert on average, else 64. Every block
    reads its expert's whole weights, so smaller blocks win while an expert's pairs fit one of them and lose once they
    take two or more. H200, DeepSeek-V3's routed experts (benchmarks/gpu/issue18_h200/moe_block_m_fcb255e): 16 beats 64
    by 4-6% at 4-12 pairs (129-384 tokens), 64 wins from 16 pairs (512 tokens: 3.21 vs 3.26 ms) on; 32 never wins.
    The rule before switched at 4 pairs (128 tokens)."""
    return 16 if tokens * top_k <= 12 * experts else 64


def moe_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                block_m: int | None = None) -> torch.Tensor:
    """Same contract as ``reference.moe_experts``; ``block_m``: rows per block (a power of two >= 16; None:
    ``default_block_m``)."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or x.dim() != 2:
        raise Unsupported("triton moe_experts: 2-D bf16/fp16/fp32 activations only")
    t, top_k = topk_ids.shape
    e, two_i, d = w13.shape
    fp8 = w13_scale is not None
    if fp8 and (d % 128 or (two_i // 2) % 128):
        raise Unsupported("triton moe_experts fp8: hidden and expert dims must be multiples of 128")
    if block_m is None:
        block_m = default_block_m(t, top_k, e)
    elif block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two >= 16, got {block_m}")
    rows, block_expert = align_by_expert(topk_ids, e, block_m)
    act_dtype = x.dtype if x.dtype != torch.float32 else torch.float32
    h = torch.empty(t * top_k, two_i, dtype=act_dtype, device=x.device)
    if fp8:
        xq, xs = quant_fp8_act(x)
        _launch(xq, xs, w13, w13_scale.float(), h, rows, block_expert, None, top_k, block_m)
    else:
        _launch(x.contiguous(), None, w13.to(x.dtype), None, h, rows, block_expert, None, top_k, block_m)
    act = silu_mul(h[:, : two_i // 2], h[:, two_i // 2:])
    y = torch.empty(t * top_k, d, dtype=torch.float32, device=x.device)
    wts = topk_weights.reshape(-1).float().contiguous()
    if fp8:
        aq, as_ = quant_fp8_act(act)
        _launch(aq, as_, w2, w2_scale.float(), y, rows, block_expert, wts, 1, block_m)
    else:
        _launch(act.contiguous(), None, w2.to(x.dtype), None, y, rows, block_expert, wts, 1, block_m)
    return y.view(t, top_k, d).sum(1).to(x.dtype)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """Contiguous grouped layout (DeepGEMM's): runs must start at multiples of 64 rows, padding is -1."""
    m = x.shape[0]
    block_m = 64
    if m % block_m:
        raise Unsupported("triton grouped_gemm: rows must be a multiple of 64 (DeepGEMM pads runs to 128)")
    starts = m_indices.view(-1, block_m)
    block_expert = starts[:, 0].to(torch.int32).contiguous()
    rows = torch.where(m_indices >= 0, torch.arange(m, device=x.device), torch.full_like(m_indices, -1)).to(torch.int32)
    out = torch.zeros(m, w.shape[1], dtype=x.dtype, device=x.device)
    _launch(x.contiguous(), None, w, None, out, rows, block_expert, None, 1, block_m)
    return out
