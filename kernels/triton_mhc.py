"""mHC (manifold-constrained hyper-connections, DeepSeek-V4) around a block, one launch each side.

DeepSeek-V4 keeps ``n`` (``hc_mult``, 4) residual streams of width H. Before each attention and each FFN block
serving engines run (vLLM/SGLang, after the mHC paper's kernel fusion):
1. the mixing projection of the flattened streams and their squared norm in one GEMM (DeepGEMM's
   ``tf32_hc_prenorm_gemm``, split over K; ``reference.mhc_prenorm_gemm``);
2. one kernel per token: the split-K partials summed, the RMS division, two sigmoids, the Sinkhorn iterations of
   the ``n x n`` residual mix in registers, and the weighted sum of the streams that the block reads
   (``mhc_pre`` here);
and after the block:
3. one kernel: each stream becomes ``post_j * y + sum_k comb[k, j] * x_k`` (``mhc_post`` here).
Steps 2 and 3 are written here after ``kernels.reference.mhc_pre`` / ``mhc_post`` (the same arithmetic; sums in
another order), so the op tables time the per-token Sinkhorn chain and the streams' traffic as a fused kernel runs
them (benchmarks/gpu/op_tables.py, stage ``mhc``). Checked in Triton's interpreter on CPU
(tests/test_kernels_mhc.py) and against the reference on the GPU (the op tables' ``rel_err``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.registry import Unsupported

BLOCK_H = 512     # hidden values of each stream a program reads (pre and post)


@triton.jit
def _mhc_pre_kernel(x_ptr, mix_ptr, sqr_ptr, scale_ptr, base_ptr, y_ptr, post_ptr, comb_ptr,
                    T, inv_nh, rms_eps, pre_eps, sk_eps, post_mult, H: tl.constexpr,
                    S: tl.constexpr, SP: tl.constexpr, ITERS: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, BH: tl.constexpr):
    # the width, the split count and the Sinkhorn iterations are compile-time (the few values a model uses)
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)           # this program's block of the hidden width; block 0 also writes post and comb
    NM = (2 + N) * N
    i = tl.arange(0, NP)
    im = i < N
    r2 = i[:, None]
    c2 = i[None, :]
    m2 = (r2 < N) & (c2 < N)
    # split-K partials of the projection and of the squared norm, summed
    sp = tl.arange(0, SP)
    spm = sp < S
    sq = tl.sum(tl.load(sqr_ptr + sp * T + t, mask=spm, other=0.0), axis=0)
    rows = mix_ptr + (sp * T + t) * NM                                                   # [SP] partial rows
    a_pre = tl.sum(tl.load(rows[:, None] + i[None, :], mask=spm[:, None] & im[None, :], other=0.0), axis=0)
    a_post = tl.sum(tl.load(rows[:, None] + N + i[None, :], mask=spm[:, None] & im[None, :], other=0.0), axis=0)
    a_comb = tl.sum(tl.load(rows[:, None, None] + 2 * N + r2[None, :, :] * N + c2[None, :, :],
                            mask=spm[:, None, None] & m2[None, :, :], other=0.0), axis=0)
    r = tl.math.rsqrt(sq * inv_nh + rms_eps)
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    pre = tl.sigmoid(a_pre * r * s0 + tl.load(base_ptr + i, mask=im, other=0.0)) + pre_eps
    post = tl.sigmoid(a_post * r * s1 + tl.load(base_ptr + N + i, mask=im, other=0.0)) * post_mult
    logit = a_comb * r * s2 + tl.load(base_ptr + 2 * N + r2 * N + c2, mask=m2, other=0.0)
    logit = tl.where(m2, logit, -float("inf"))
    e = tl.exp(logit - tl.max(logit, axis=1)[:, None])
    comb = e / tl.sum(e, axis=1)[:, None]
    comb = tl.where(m2, comb + sk_eps, 0.0)
    comb = comb / (tl.sum(comb, axis=0)[None, :] + sk_eps)
    for _ in range(ITERS - 1):
        comb = comb / (tl.sum(comb, axis=1)[:, None] + sk_eps)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + sk_eps)
    first = hb == 0
    tl.store(post_ptr + t * N + i, post, mask=im & first)
    tl.store(comb_ptr + t * N * N + r2 * N + c2, comb, mask=m2 & first)
    # the block's input over this program's columns: the streams weighted by pre
    w = tl.where(im, pre, 0.0)
    cols = hb * BH + tl.arange(0, BH)
    cm = cols < H
    xv = tl.load(x_ptr + (t * N + i[:, None]) * H + cols[None, :], mask=im[:, None] & cm[None, :], other=0.0)
    y = tl.sum(w[:, None] * xv.to(tl.float32), axis=0)
    tl.store(y_ptr + t * H + cols, y.to(y_ptr.dtype.element_ty), mask=cm)


@triton.jit
def _mhc_post_kernel(y_ptr, res_ptr, post_ptr, comb_ptr, out_ptr, H,
                     N: tl.constexpr, NP: tl.constexpr, BH: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    cm = cols < H
    i = tl.arange(0, NP)
    im = i < N
    m2 = im[:, None] & im[None, :]
    comb = tl.load(comb_ptr + t * N * N + i[:, None] * N + i[None, :], mask=m2, other=0.0)      # [k, j]
    post = tl.load(post_ptr + t * N + i, mask=im, other=0.0)                                      # [j]
    y = tl.load(y_ptr + t * H + cols, mask=cm, other=0.0).to(tl.float32)                          # [BH]
    res = tl.load(res_ptr + (t * N + i[:, None]) * H + cols[None, :], mask=im[:, None] & cm[None, :],
                  other=0.0).to(tl.float32)                                                       # [k, BH]
    out = post[:, None] * y[None, :] + tl.sum(comb[:, :, None] * res[:, None, :], axis=0)         # [j, BH]
    tl.store(out_ptr + (t * N + i[:, None]) * H + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=im[:, None] & cm[None, :])


def _check(x: torch.Tensor, name: str) -> None:
    if x.dim() != 3 or not x.is_contiguous() or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Unsupported(f"triton {name}: contiguous [T, n, H] streams in bf16/fp16/fp32")


def mhc_pre(x: torch.Tensor, mix: torch.Tensor, sqr: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            iters: int, rms_eps: float = 1e-6, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
            post_mult: float = 2.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as ``reference.mhc_pre`` (``mix [S, T, (2+n)n]`` / ``sqr [S, T]`` split-K partials, or
    without the split axis), one launch: a program per token and ``BLOCK_H`` columns, each summing the partials and
    running the Sinkhorn chain itself (a few hundred flops) so that the streams' weighted sum spreads over the SMs
    (one program per token reached 31% of the H100's HBM peak at 16,384 tokens: the chain's latency in every
    program's path, little overlap)."""
    _check(x, "mhc_pre")
    t, n, h = x.shape
    if mix.dim() == 2:
        mix, sqr = mix[None], sqr[None]
    if mix.shape[1:] != (t, (2 + n) * n) or sqr.shape[1:] != (t,) or not (mix.is_contiguous() and sqr.is_contiguous()):
        raise Unsupported("triton mhc_pre: contiguous mix [S, T, (2+n)*n] and sqr [S, T] in float32")
    y = torch.empty(t, h, dtype=x.dtype, device=x.device)
    post = torch.empty(t, n, dtype=torch.float32, device=x.device)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=x.device)
    if t:
        bh = min(BLOCK_H, triton.next_power_of_2(h))
        _mhc_pre_kernel[(t, triton.cdiv(h, bh))](x, mix.float(), sqr.float(), scale.float().contiguous(), base.float().contiguous(),
                              y, post, comb, t, 1.0 / (n * h), float(rms_eps), float(pre_eps),
                              float(sinkhorn_eps), float(post_mult), H=h, S=mix.shape[0],
                              SP=triton.next_power_of_2(mix.shape[0]), ITERS=int(iters), N=n,
                              NP=triton.next_power_of_2(n), BH=bh)
    return y, post, comb


def mhc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Same contract as ``reference.mhc_post``, one launch (a program per token and ``BLOCK_H`` values)."""
    _check(residual, "mhc_post")
    t, n, h = residual.shape
    if y.shape != (t, h) or not y.is_contiguous():
        raise Unsupported("triton mhc_post: contiguous y [T, H]")
    out = torch.empty(t, n, h, dtype=y.dtype, device=y.device)
    if t:
        bh = min(BLOCK_H, triton.next_power_of_2(h))
        _mhc_post_kernel[(t, triton.cdiv(h, bh))](y, residual, post.float().contiguous(), comb.float().contiguous(),
                                                  out, h, N=n, NP=triton.next_power_of_2(n), BH=bh)
    return out
