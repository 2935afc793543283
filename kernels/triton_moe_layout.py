"""Tier 1: the fused MoE's layout work in one Triton launch each (permute + quantise, SiLU-and-mul + re-quantise, combine).

``kernels.fused_moe`` runs two DeepGEMM grouped GEMMs; around them the token-expert pairs must be moved into the
GEMMs' layout and back. As torch ops that glue cost ~4.6 ms of the 9.78 ms MoE layer at 4096 tokens on the H200
(benchmarks/gpu/issue18_h200/log_call2.txt: fused 9.78 ms, DeepGEMM's two GEMMs alone 5.19 ms): gathers and
scatters of full rows, an FP32 copy of every activation in the torch quantisation, a bf16 weighted bmm. Each
kernel here reads its input once and writes its output once:

- ``permute_quant``: each token's row is quantised once (1x128 FP8 groups, the arithmetic of
  ``triton_rowwise.quant_fp8_act``, bit-equal to ``reference.quant_fp8_act`` on CUDA) and its codes and scales
  are stored to each of its k destination rows;
- ``silu_mul_quant``: over the pairs' rows only (padding rows are never touched), ``silu(gate) * up`` in fp32,
  rounded to the GEMM output's dtype as the torch path does, then quantised the same way;
- ``combine``: per token, the k pair rows gathered, scaled by the routing weights and summed in fp32.

Scales are written MN-major (group-major, rows contiguous; ``rows_per_batch`` rows per batch of the masked
layout), the layout DeepGEMM's SM90 kernels read: a tensor already in it skips DeepGEMM's transpose kernel
(``get_mn_major_tma_aligned_tensor``). Destination rows come from ``kernels.fused_moe`` (torch ops with sizes
known on the host, no device->host sync), so all three are CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import reference as ref
from kernels.registry import Unsupported
from kernels.triton_rowwise import GROUPS_PER_PROGRAM, INV_FP8_E4M3_MAX

COMBINE_BLOCK = 1024   # columns a combine program sums (7168 = 7 programs a token: enough to fill the SMs at T >= 64)


@triton.jit
def _quant_groups(x, FP8_MAX: tl.constexpr, INV_FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    """[GB, BLOCK] fp32 -> (fp32 codes before the cast, [GB] scales): ``triton_rowwise._quant_kernel``'s arithmetic."""
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), EPS)
    scale = amax * INV_FP8_MAX            # ATen's CUDA ``amax / 448`` (see triton_rowwise)
    y = tl.math.div_rn(x, scale[:, None])
    return tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX), scale


@triton.jit
def _scale_offsets(rows, g, G, RB):
    """Offsets of scale (row, group) in the MN-major layout: batches of RB rows, each ``[G, RB]``."""
    return (rows // RB) * RB * G + rows % RB + g * RB


@triton.jit
def _permute_quant_kernel(x_ptr, dest_ptr, q_ptr, s_ptr, G, RB, stride_xm, stride_qm,
                          TOPK: tl.constexpr, BLOCK: tl.constexpr, GB: tl.constexpr, FP8_MAX: tl.constexpr,
                          INV_FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    gmask = g < G
    cols = g[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + t * stride_xm + cols, mask=gmask[:, None], other=0.0).to(tl.float32)
    y, scale = _quant_groups(x, FP8_MAX, INV_FP8_MAX, EPS)
    q = y.to(q_ptr.dtype.element_ty)
    for j in tl.static_range(TOPK):     # the same codes to each of the token's k rows
        row = tl.load(dest_ptr + t * TOPK + j).to(tl.int64)
        tl.store(q_ptr + row * stride_qm + cols, q, mask=gmask[:, None])
        tl.store(s_ptr + _scale_offsets(row, g, G, RB), scale, mask=gmask)


@triton.jit
def _silu_mul_quant_kernel(h_ptr, rows_ptr, q_ptr, s_ptr, G, RB, HALF, stride_hm, stride_qm,
                           BLOCK: tl.constexpr, GB: tl.constexpr, FP8_MAX: tl.constexpr,
                           INV_FP8_MAX: tl.constexpr, EPS: tl.constexpr):
    row = tl.load(rows_ptr + tl.program_id(0)).to(tl.int64)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    gmask = g < G
    cols = g[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    base = h_ptr + row * stride_hm + cols
    gate = tl.load(base, mask=gmask[:, None], other=0.0).to(tl.float32)
    up = tl.load(base + HALF, mask=gmask[:, None], other=0.0).to(tl.float32)
    # reference.silu_mul: fp32, then back in the GEMM output's dtype (bf16), which the quantisation reads
    a = (gate / (1.0 + tl.exp(-gate)) * up).to(h_ptr.dtype.element_ty).to(tl.float32)
    y, scale = _quant_groups(a, FP8_MAX, INV_FP8_MAX, EPS)
    tl.store(q_ptr + row * stride_qm + cols, y.to(q_ptr.dtype.element_ty), mask=gmask[:, None])
    tl.store(s_ptr + _scale_offsets(row, g, G, RB), scale, mask=gmask)


@triton.jit
def _combine_kernel(y_ptr, dest_ptr, w_ptr, out_ptr, D, stride_ym, stride_om, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        row = tl.load(dest_ptr + t * TOPK + j).to(tl.int64)
        w = tl.load(w_ptr + t * TOPK + j).to(tl.float32)
        acc += w * tl.load(y_ptr + row * stride_ym + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, P, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < P
    tl.atomic_add(counts_ptr + tl.load(ids_ptr + offs, mask=m, other=0), 1, mask=m)


@triton.jit
def _contiguous_rows_kernel(counts_ptr, starts_ptr, m_idx_ptr, R, E, ALIGN: tl.constexpr, EB: tl.constexpr,
                            BLOCK: tl.constexpr):
    ex = tl.arange(0, EB)
    em = ex < E
    c = tl.load(counts_ptr + ex, mask=em, other=0)
    padded = (c + ALIGN - 1) // ALIGN * ALIGN
    ends = tl.cumsum(padded, axis=0)      # every program recomputes the E-long scan: cheaper than another launch
    starts = ends - padded
    if tl.program_id(0) == 0:
        tl.store(starts_ptr + ex, starts, mask=em)
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e_of = tl.sum(((ends[None, :] <= r[:, None]) & em[None, :]).to(tl.int32), axis=1)   # searchsorted(ends, r, right)
    sel = ex[None, :] == e_of[:, None]
    first = tl.sum(tl.where(sel, starts[None, :], 0), axis=1)
    count = tl.sum(tl.where(sel, c[None, :], 0), axis=1)
    valid = (e_of < E) & (r - first < count)
    tl.store(m_idx_ptr + r, tl.where(valid, e_of, -1), mask=r < R)


@triton.jit
def _place_kernel(ids_ptr, starts_ptr, fill_ptr, dest_ptr, P, MAX_M, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < P
    e = tl.load(ids_ptr + offs, mask=m, other=0)
    # a free row of the pair's expert; the order inside an expert's run is whatever the atomics give, which changes
    # no result: each GEMM row is computed from its own codes and scales, and the combine gathers by ``dest``
    slot = tl.atomic_add(fill_ptr + e, 1, mask=m)
    if MASKED:
        base = e * MAX_M
    else:
        base = tl.load(starts_ptr + e, mask=m, other=0)
    tl.store(dest_ptr + offs, base + slot, mask=m)


def _check_rows(x: torch.Tensor, what: str) -> None:
    if x.dim() != 2 or x.shape[1] % ref.FP8_BLOCK or x.stride(1) != 1 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise Unsupported(f"triton {what}: 2-D bf16/fp16/fp32 rows with unit column stride, K % 128 == 0")


def scales_mn_major(rows: int, groups: int, rows_per_batch: int, device) -> torch.Tensor:
    """Uninitialised fp32 scales stored MN-major per batch of ``rows_per_batch`` rows: ``[rows, groups]`` with strides
    ``(1, rows)`` for one batch (contiguous layout), ``[b, rows_per_batch, groups]`` for the masked layout."""
    b = rows // rows_per_batch
    s = torch.empty(b, groups, rows_per_batch, dtype=torch.float32, device=device).transpose(1, 2)
    return s[0] if b == 1 else s


def _launch_grid(m: int, g: int) -> tuple[tuple[int, int], int]:
    gb = min(GROUPS_PER_PROGRAM, triton.next_power_of_2(g))
    return (m, triton.cdiv(g, gb)), gb


def permute_quant(x: torch.Tensor, dest: torch.Tensor, rows: int, rows_per_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, K]`` -> (FP8 codes ``[rows, K]``, fp32 scales ``[rows, K/128]`` MN-major): token t's quantised row at rows
    ``dest[t*k : (t+1)*k]``; the other rows stay uninitialised (padding the GEMM never gathers back)."""
    _check_rows(x, "permute_quant")
    t, kdim = x.shape
    topk = dest.numel() // max(t, 1)
    g = kdim // ref.FP8_BLOCK
    q = torch.empty(rows, kdim, dtype=torch.float8_e4m3fn, device=x.device)
    s = scales_mn_major(rows, g, rows_per_batch, x.device)
    if t:
        grid, gb = _launch_grid(t, g)
        _permute_quant_kernel[grid](x, dest, q, s, g, rows_per_batch, x.stride(0), q.stride(0), TOPK=topk,
                                    BLOCK=ref.FP8_BLOCK, GB=gb, FP8_MAX=ref.FP8_E4M3_MAX,
                                    INV_FP8_MAX=INV_FP8_E4M3_MAX, EPS=1e-4)
    return q, s


def silu_mul_quant(h: torch.Tensor, dest: torch.Tensor, rows_per_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``h [R, 2I]`` (gate then up per row) -> FP8 ``[R, I]`` + MN-major scales, computed on the rows in ``dest`` only."""
    h2 = h.reshape(-1, h.shape[-1])
    _check_rows(h2, "silu_mul_quant")
    r, two_i = h2.shape
    half = two_i // 2
    if half % ref.FP8_BLOCK:
        raise Unsupported("triton silu_mul_quant: the expert dim must be a multiple of 128")
    g = half // ref.FP8_BLOCK
    q = torch.empty(r, half, dtype=torch.float8_e4m3fn, device=h.device)
    s = scales_mn_major(r, g, rows_per_batch, h.device)
    if dest.numel():
        grid, gb = _launch_grid(dest.numel(), g)
        _silu_mul_quant_kernel[grid](h2, dest, q, s, g, rows_per_batch, half, h2.stride(0), q.stride(0),
                                     BLOCK=ref.FP8_BLOCK, GB=gb, FP8_MAX=ref.FP8_E4M3_MAX,
                                     INV_FP8_MAX=INV_FP8_E4M3_MAX, EPS=1e-4)
    return q, s


def combine(y: torch.Tensor, dest: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * y[dest[t*k + j]]`` in fp32, written in ``dtype``; one launch."""
    y2 = y.reshape(-1, y.shape[-1])
    if y2.stride(1) != 1:
        raise Unsupported("triton combine: pair rows need unit column stride")
    t, topk = topk_weights.shape
    d = y2.shape[1]
    out = torch.empty(t, d, dtype=dtype, device=y.device)
    w = topk_weights if topk_weights.is_contiguous() else topk_weights.contiguous()
    if t:
        block = min(COMBINE_BLOCK, triton.next_power_of_2(d))
        _combine_kernel[(t, triton.cdiv(d, block))](y2, dest, w, out, d, y2.stride(0), out.stride(0),
                                                    TOPK=topk, BLOCK=block)
    return out


LAYOUT_BLOCK = 256      # pairs (or rows) per program of the layout kernels


def _counts(flat: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pairs per expert, zeroed fill counters), int32, from one memset and one launch."""
    z = torch.zeros(2 * n_experts, dtype=torch.int32, device=flat.device)
    if flat.numel():
        _count_kernel[(triton.cdiv(flat.numel(), LAYOUT_BLOCK),)](flat, z, flat.numel(), BLOCK=LAYOUT_BLOCK)
    return z[:n_experts], z[n_experts:]


def contiguous_layout(topk_ids: torch.Tensor, n_experts: int, align: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_moe.contiguous_layout`` in three launches (count, rows, place) and one memset: (dest [T*k] int32,
    m_indices [R] int32). Same rows per expert and padding; the order of pairs inside an expert's run may differ."""
    flat = topk_ids.reshape(-1).contiguous()
    p = flat.numel()
    rows = triton.cdiv(p + n_experts * (align - 1), align) * align      # the no-sync upper bound, as fused_moe
    counts, fill = _counts(flat, n_experts)
    starts = torch.empty(n_experts, dtype=torch.int32, device=flat.device)
    m_idx = torch.empty(rows, dtype=torch.int32, device=flat.device)
    rb = LAYOUT_BLOCK // 4    # rows a program: its [rows, E] comparisons stay in registers
    _contiguous_rows_kernel[(triton.cdiv(rows, rb),)](counts, starts, m_idx, rows, n_experts, ALIGN=align,
                                                     EB=triton.next_power_of_2(n_experts), BLOCK=rb)
    dest = torch.empty(p, dtype=torch.int32, device=flat.device)
    if p:
        _place_kernel[(triton.cdiv(p, LAYOUT_BLOCK),)](flat, starts, fill, dest, p, 0, BLOCK=LAYOUT_BLOCK, MASKED=False)
    return dest, m_idx


def masked_layout(topk_ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``fused_moe.masked_layout`` in two launches and one memset: (dest [T*k] int32, masked_m [E] int32, max_m)."""
    flat = topk_ids.reshape(-1).contiguous()
    p = flat.numel()
    max_m = triton.cdiv(max(topk_ids.shape[0], 1), 128) * 128   # fused_moe.masked_rows (importing it: a cycle)
    counts, fill = _counts(flat, n_experts)
    dest = torch.empty(p, dtype=torch.int32, device=flat.device)
    if p:
        _place_kernel[(triton.cdiv(p, LAYOUT_BLOCK),)](flat, counts, fill, dest, p, max_m, BLOCK=LAYOUT_BLOCK, MASKED=True)
    return dest, counts, max_m
