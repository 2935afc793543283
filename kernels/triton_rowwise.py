"""Tier 1: row-wise ops fused into one Triton launch each (FP8 activation quantisation, RMSNorm, RoPE, SiLU-and-mul).

Eager steps are host-bound: each torch op costs ~10 us of host on the H200 (benchmarks/gpu/issue23_h200:
RMSNorm as 9 torch ops 108 us, one BF16 GEMM call 25 us), and the torch references of these two ops are
9 ops each, run 7 (quantisation) and 4 (norm) times per DeepSeek-V3 layer. One launch each does the same
arithmetic (the quantisation: fp32 amax, the scale as ATen computes it on CUDA, IEEE division of the values,
round-to-nearest-even FP8 cast, written after ``reference.quant_fp8_act``; the norm sums in a different order).

Measured on the H200 (benchmarks/gpu/issue18_h200/eager_8df7bd1): one call through ``kernels.ops`` to these
kernels costs 50-64 us of host (``ops.rms_norm`` 50, ``ops.quant_fp8_act`` 64; a torch add 12), so they win where
the device work is large (prefill 512: 16.4 vs 20.6 ms with the torch references) and lose on host-bound decode
(b=1: 19.4 vs 17.2 ms). At 8df7bd1 the quantisation was NOT bit-equal to ``reference.quant_fp8_act`` there: neither
its codes nor its scales (``quant_bits_equal`` / ``quant_scales_equal`` false; the MoE layer with it vs the reference:
max rel 1.75%). The cause: the kernel divided ``amax / 448`` in IEEE, where ATen on CUDA multiplies by fp32(1/448)
(a CPU-scalar divisor); the kernel now does the same (not yet re-checked on the H200). RMSNorm and SiLU-and-mul matched the reference exactly on that input, RoPE to max rel 1.1e-3 (bf16).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from kernels import reference as ref
from kernels.registry import Unsupported

# fp32(1) / fp32(448), the reciprocal ATen multiplies by for ``amax / 448`` on CUDA
INV_FP8_E4M3_MAX = float(np.float32(1.0) / np.float32(ref.FP8_E4M3_MAX))
GROUPS_PER_PROGRAM = 8   # 8 x 128 values a program: 1 KiB of bf16 in, enough rows x groups to fill the SMs


@triton.jit
def _quant_kernel(x_ptr, q_ptr, s_ptr, G, stride_xm, stride_qm, stride_sm,
                  BLOCK: tl.constexpr, GB: tl.constexpr, FP8_MAX: tl.constexpr, INV_FP8_MAX: tl.constexpr,
                  EPS: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    gmask = g < G
    cols = g[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + m * stride_xm + cols, mask=gmask[:, None], other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), EPS)
    # the reference's ``amax / FP8_MAX`` on CUDA: ATen divides by a CPU scalar as a multiply by its fp32 reciprocal
    # (div_true_kernel_cuda), which can differ from an IEEE division in the last bit; the element division below is
    # tensor / tensor, an IEEE division in ATen as here
    scale = amax * INV_FP8_MAX
    y = tl.math.div_rn(x, scale[:, None])
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    tl.store(q_ptr + m * stride_qm + cols, y.to(q_ptr.dtype.element_ty), mask=gmask[:, None])
    tl.store(s_ptr + m * stride_sm + g, scale, mask=gmask)


def quant_fp8_act(x: torch.Tensor, block: int = ref.FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``reference.quant_fp8_act``: ``[M,K] -> (e4m3 [M,K], fp32 scales [M, K/128])``, one launch.
    Its scale is ATen's CUDA one (the reference on the GPU); see the module docstring."""
    if x.dim() != 2 or x.shape[1] % block or x.stride(1) != 1 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Unsupported("triton quant_fp8_act: 2-D bf16/fp16/fp32 rows with unit column stride, K % 128 == 0")
    m, k = x.shape
    g = k // block
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, g, dtype=torch.float32, device=x.device)
    if m:
        gb = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(g))
        _quant_kernel[(m, triton.cdiv(g, gb))](x, q, s, g, x.stride(0), q.stride(0), s.stride(0),
                                               BLOCK=block, GB=gb, FP8_MAX=ref.FP8_E4M3_MAX,
                                               INV_FP8_MAX=INV_FP8_E4M3_MAX, EPS=1e-4)
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


@triton.jit
def _rope_kernel(x_ptr, cs_ptr, y_ptr, N, stride_xt, stride_xh, stride_yt, stride_yh, stride_ct,
                 HALF: tl.constexpr, BH: tl.constexpr, INTERLEAVED: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    hm = h < N
    i = tl.arange(0, HALF)
    cos = tl.load(cs_ptr + t * stride_ct + i)[None, :]
    sin = tl.load(cs_ptr + t * stride_ct + HALF + i)[None, :]
    if INTERLEAVED:   # pairs (x0,x1),(x2,x3)..: DeepSeek's checkpoints
        o1 = 2 * i
        o2 = 2 * i + 1
    else:             # halves (x[:d/2], x[d/2:]): Llama/Qwen "neox" style
        o1 = i
        o2 = i + HALF
    xb = x_ptr + t * stride_xt + h[:, None] * stride_xh
    x1 = tl.load(xb + o1[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(xb + o2[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
    yb = y_ptr + t * stride_yt + h[:, None] * stride_yh
    tl.store(yb + o1[None, :], (x1 * cos - x2 * sin).to(y_ptr.dtype.element_ty), mask=hm[:, None])
    tl.store(yb + o2[None, :], (x2 * cos + x1 * sin).to(y_ptr.dtype.element_ty), mask=hm[:, None])


def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, interleaved: bool,
         rows: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as ``reference.rope`` for ``x [T, heads, d]`` (unit last stride), one launch."""
    d = x.shape[-1]
    half = d // 2
    if x.dim() != 3 or x.stride(-1) != 1 or d % 2 or half < 1 or half & (half - 1) or cos_sin.dtype != torch.float32 \
            or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Unsupported("triton rope: x [T, heads, d] bf16/fp16/fp32 with d/2 a power of two, fp32 cos/sin table")
    cs = cos_sin[positions] if rows is None else rows
    if cs.stride(-1) != 1:
        cs = cs.contiguous()
    t, n = x.shape[0], x.shape[1]
    y = torch.empty(t, n, d, dtype=x.dtype, device=x.device)
    if t and n:
        bh = min(16, triton.next_power_of_2(n))
        _rope_kernel[(t, triton.cdiv(n, bh))](x, cs, y, n, x.stride(0), x.stride(1), y.stride(0), y.stride(1), cs.stride(0),
                                              HALF=half, BH=bh, INTERLEAVED=interleaved)
    return y


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, N, stride_g, stride_u, stride_y, BLOCK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(g_ptr + m * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + m * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_y + cols, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Same contract as ``reference.silu_mul`` (2-D, rows may be strided: the halves of a fused gate/up output)."""
    if gate.dim() != 2 or gate.shape != up.shape or gate.stride(1) != 1 or up.stride(1) != 1 \
            or gate.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Unsupported("triton silu_mul: 2-D bf16/fp16/fp32 gate and up of one shape, unit column stride")
    m, n = gate.shape
    y = torch.empty(m, n, dtype=gate.dtype, device=gate.device)
    if m and n:
        block = min(1024, triton.next_power_of_2(n))
        _silu_mul_kernel[(m, triton.cdiv(n, block))](gate, up, y, n, gate.stride(0), up.stride(0), y.stride(0), BLOCK=block)
    return y
