"""Tier 1: row-wise ops fused into one Triton launch each (FP8 activation quantisation, RMSNorm).

Eager steps are host-bound: each torch op costs ~10 us of host on the H200 (benchmarks/gpu/issue23_h200:
RMSNorm as 9 torch ops 108 us, one BF16 GEMM call 25 us), and the torch references of these two ops are
9 ops each, run 7 (quantisation) and 4 (norm) times per DeepSeek-V3 layer. One launch each does the same
arithmetic: the quantisation is bit-identical to ``reference.quant_fp8_act`` (fp32 amax, IEEE division,
round-to-nearest-even FP8 cast); the norm sums in a different order (fp32, last-bit differences).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import reference as ref
from kernels.registry import Unsupported

GROUPS_PER_PROGRAM = 8   # 8 x 128 values a program: 1 KiB of bf16 in, enough rows x groups to fill the SMs


@triton.jit
def _quant_kernel(x_ptr, q_ptr, s_ptr, G, stride_xm, stride_qm, stride_sm,
                  BLOCK: tl.constexpr, GB: tl.constexpr, FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    gmask = g < G
    cols = g[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + m * stride_xm + cols, mask=gmask[:, None], other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), EPS)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32))   # IEEE division, as torch's
    y = tl.math.div_rn(x, scale[:, None])
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    tl.store(q_ptr + m * stride_qm + cols, y.to(q_ptr.dtype.element_ty), mask=gmask[:, None])
    tl.store(s_ptr + m * stride_sm + g, scale, mask=gmask)


def quant_fp8_act(x: torch.Tensor, block: int = ref.FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``reference.quant_fp8_act``: ``[M,K] -> (e4m3 [M,K], fp32 scales [M, K/128])``, one launch."""
    if x.dim() != 2 or x.shape[1] % block or x.stride(1) != 1 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Unsupported("triton quant_fp8_act: 2-D bf16/fp16/fp32 rows with unit column stride, K % 128 == 0")
    m, k = x.shape
    g = k // block
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, g, dtype=torch.float32, device=x.device)
    if m:
        gb = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(g))
        _quant_kernel[(m, triton.cdiv(g, gb))](x, q, s, g, x.stride(0), q.stride(0), s.stride(0),
                                               BLOCK=block, GB=gb, FP8_MAX=ref.FP8_E4M3_MAX, EPS=1e-4)
    return q, s


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, D, stride_xm, stride_ym, eps, BLOCK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + m * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + cols, (x * r * w).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Same contract as ``reference.rms_norm`` (last dim), one launch; rows may be strided (a column slice)."""
    d = x.shape[-1]
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or x.stride(-1) != 1 or d > 16384:
        raise Unsupported("triton rms_norm: bf16/fp16/fp32, unit last stride, last dim <= 16384")
    x2 = x if x.dim() == 2 else x.reshape(-1, d)   # a view when the leading dims are contiguous, else a copy
    y = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, y, d, x2.stride(0), y.stride(0), eps,
                                         BLOCK=triton.next_power_of_2(d), num_warps=4 if d <= 4096 else 8)
    return y.view(*x.shape)
