"""Tier 1: block-scaled FP8 GEMM in Triton (DeepSeek-V3 recipe: 1x128 activation, 128x128 weight scales).

``C[M,N] = sum_kb (A[:, kb] @ B[:, kb]^T) * a_scale[:, kb] * b_scale[n_blk, kb]``: each
128-wide K slice is one tensor-core dot in FP8 with FP32 accumulation, rescaled before it
is added (the scales differ per slice, so they cannot be pulled out of the sum).
BLOCK_N = BLOCK_K = 128 so one weight scale covers a whole tile slice.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.registry import Unsupported


@triton.jit
def _fp8_gemm_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, num_kb, kb_per_split,
                     stride_am, stride_bn, stride_cm, stride_cs, stride_asm, stride_bsn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    # split-K: program (pid, s) sums K blocks [s * kb_per_split, (s + 1) * kb_per_split) into its own fp32 slice
    # (stride_cs apart) of a workspace the caller reduces; one split writes the output directly (stride_cs 0)
    split = tl.program_id(1)
    kb0 = split * kb_per_split
    kb1 = tl.minimum(kb0 + kb_per_split, num_kb)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped launch order: neighbouring programs share B tiles in L2
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    gsz = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % gsz
    pid_n = (pid % per_group) // gsz

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (kb0 * BLOCK_K + offs_k)[None, :]
    b_ptrs = b_ptr + offs_n[None, :] * stride_bn + (kb0 * BLOCK_K + offs_k)[:, None]
    as_ptrs = as_ptr + offs_m * stride_asm
    bs_ptrs = bs_ptr + (offs_n // 128) * stride_bsn     # one weight scale per 128 output columns
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb0, kb1):
        a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        a_s = tl.load(as_ptrs + kb, mask=mask_m, other=0.0)
        b_s = tl.load(bs_ptrs + kb, mask=mask_n, other=0.0)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c_ptr + split * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _dense(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` contiguous (and in ``dtype``), copied only when it is not already."""
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t if t.is_contiguous() else t.contiguous()


# (BLOCK_M, BLOCK_N, num_warps, num_stages, split_k) where no tuned table covers the shape: large M; small M
# (decode) uses a 64-row tile
LARGE_M_CONFIG = (128, 128, 8, 3, 1)
SMALL_M_CONFIG = (64, 128, 4, 3, 1)


def default_config(m: int) -> tuple[int, int, int, int, int]:
    """The untuned tile choice: a 64-row tile up to 64 rows (the smallest efficient wgmma tile), else 128 x 128."""
    return LARGE_M_CONFIG if m > 64 else SMALL_M_CONFIG


def fp8_gemm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16, config: tuple[int, ...] | None = None) -> torch.Tensor:
    """Same contract as ``reference.fp8_gemm_blockscaled``. Tiles from the tuned table for this GPU and shape
    (``kernels.gemm_tuning``), else :func:`default_config`; ``config`` = (BLOCK_M, BLOCK_N, warps, stages[, split_k])
    overrides both (benchmarks, the tuner). ``split_k`` > 1 sums K slices into an fp32 workspace, reduced after."""
    m, k = xq.shape
    n = wq.shape[0]
    if k % 128 or xq.dtype != torch.float8_e4m3fn or wq.dtype != torch.float8_e4m3fn:
        raise Unsupported("triton fp8_gemm: needs e4m3 operands and K % 128 == 0")
    # converted only when needed: each no-op .contiguous()/.float() is still a dispatched call (~1-2 us of host a GEMM)
    xq, wq = _dense(xq), _dense(wq)
    xs, ws = _dense(xs, torch.float32), _dense(ws, torch.float32)
    if config is None:
        from kernels import gemm_tuning
        config = gemm_tuning.lookup(m, n, k, xq.device) or default_config(m)
    bm, bn, warps, stages = config[:4]
    kb = k // 128
    split = max(1, min(int(config[4]) if len(config) > 4 else 1, kb))
    per = triton.cdiv(kb, split)
    split = triton.cdiv(kb, per)          # no empty split
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), split)
    if split == 1:
        out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
        stride_cs = 0
    else:
        out = torch.empty(split, m, n, dtype=torch.float32, device=xq.device)
        stride_cs = out.stride(0)
    _fp8_gemm_kernel[grid](xq, wq, out, xs, ws, m, n, kb, per, xq.stride(0), wq.stride(0), out.stride(-2), stride_cs,
                           xs.stride(0), ws.stride(0), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128, GROUP_M=8,
                           num_warps=warps, num_stages=stages)
    return out if split == 1 else out.sum(0).to(out_dtype)
