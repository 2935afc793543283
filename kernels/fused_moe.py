"""Fused FP8 MoE on grouped GEMMs: permute, quantise, two grouped GEMMs, combine (DeepGEMM layouts).

The routed-expert FFN of ``reference.moe_experts`` (block-scaled FP8 weights) as the serving
engines run it (vLLM ``DeepGemmExperts``, SGLang's DeepEP low-latency path):

1. quantise the tokens once (1x128 FP8 groups) and **permute** each token-expert pair into its
   expert's rows, in one of DeepGEMM's two layouts:
   - *masked* (decode, few tokens): ``[E, max_m, K]`` with ``masked_m[e]`` valid rows per expert;
     the kernel skips the rest, so the launch reads each touched expert's weights once;
   - *contiguous* (prefill): rows sorted by expert, each expert's run padded to 128 rows,
     ``m_indices`` = expert id per row (-1 for padding);
2. grouped GEMM 1 (gate+up), SiLU-and-mul on the valid pairs only, re-quantise, grouped GEMM 2;
3. **combine**: gather each pair's output row, scale by its routing weight, sum a token's k pairs.

Routing (top-k ids and weights) is done by the caller (``executor/moe.py``). The destination rows
are torch ops with sizes known on the host (no device->host sync), so the path is CUDA-graph safe.
The data movement around the GEMMs (permute + quantise, SiLU + re-quantise, combine) is a ``Glue``:
torch ops (``TORCH_GLUE``) or one Triton launch each (``triton_glue()``, CUDA; as torch ops it cost
~4.6 ms of a 9.8 ms MoE layer at 4096 tokens on the H200, benchmarks/gpu/issue18_h200/log_call2.txt).
The two GEMMs are parameters: DeepGEMM on the GPU (``kernels.vendor``), the torch references
below on CPU, which is how CI checks the permutation and combine against ``reference.moe_experts``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from kernels import reference as ref

CONTIG_ALIGN = 128          # DeepGEMM's M alignment of the contiguous layout on Hopper (get_mk_alignment_for_contiguous_layout)
MASKED_MAX_TOKENS = 128     # above this, the masked buffer (E x max_m rows) costs more memory than the contiguous pad

MaskedGemm = Callable[..., torch.Tensor]      # (aq [E,M,K], as [E,M,K/128], w, ws, masked_m [E] int32, expected_m) -> [E,M,N] bf16
ContigGemm = Callable[..., torch.Tensor]      # (aq [R,K], as [R,K/128], w, ws, m_indices [R] int32) -> [R,N] bf16


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def expert_counts(flat_ids: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Pairs per expert. ``scatter_add``, not ``bincount``: bincount syncs on CUDA (breaks graph capture)."""
    return torch.zeros(n_experts, dtype=torch.int64, device=flat_ids.device).scatter_add_(
        0, flat_ids.long(), torch.ones_like(flat_ids, dtype=torch.int64))


def rank_within_expert(flat_ids: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """For each pair, its position among the pairs of its expert (pair order kept: stable sort)."""
    order = torch.argsort(flat_ids, stable=True)
    first = counts.cumsum(0) - counts
    pos = torch.empty_like(flat_ids, dtype=torch.int64)
    pos[order] = torch.arange(flat_ids.numel(), device=flat_ids.device) - first[flat_ids[order].long()]
    return pos


def masked_rows(t: int) -> int:
    """Rows per expert of the masked buffer for ``t`` tokens. A token picks an expert at most once, so an expert gets
    at most T pairs: T rounded up to 128 rows (the masked kernel's block), known without reading the ids."""
    return _align(max(t, 1), 128)


def masked_layout(topk_ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(dest row of each pair in the flattened ``[E*max_m]`` buffer, masked_m [E] int32, max_m)."""
    flat = topk_ids.reshape(-1)
    max_m = masked_rows(topk_ids.shape[0])
    counts = expert_counts(flat, n_experts)
    dest = flat.long() * max_m + rank_within_expert(flat, counts)
    return dest, counts.to(torch.int32), max_m


def contiguous_layout(topk_ids: torch.Tensor, n_experts: int, align: int = CONTIG_ALIGN) -> tuple[torch.Tensor, torch.Tensor]:
    """(dest row of each pair, m_indices [R] int32: expert per row, -1 for padding).

    R = pairs + E*(align-1) rounded up to ``align``: the no-sync upper bound of the padded runs;
    rows past the last run are padding too.
    """
    flat = topk_ids.reshape(-1)
    counts = expert_counts(flat, n_experts)
    padded = (counts + align - 1) // align * align
    ends = padded.cumsum(0)
    starts = ends - padded
    rows = _align(flat.numel() + n_experts * (align - 1), align)
    dest = starts[flat.long()] + rank_within_expert(flat, counts)
    r = torch.arange(rows, device=flat.device)
    e_of_row = torch.searchsorted(ends, r, right=True)
    valid = (e_of_row < n_experts) & (r - starts[e_of_row.clamp(max=n_experts - 1)] < counts[e_of_row.clamp(max=n_experts - 1)])
    m_indices = torch.where(valid, e_of_row, torch.full_like(e_of_row, -1)).to(torch.int32)
    return dest, m_indices


class Glue(NamedTuple):
    """The layout work around the two GEMMs: torch ops here (any device, CI's path) or one Triton launch each
    (``kernels.triton_moe_layout``, CUDA). ``rows_per_batch``: rows of one expert block in the masked layout
    (``max_m``), all rows in the contiguous one."""

    permute: Callable      # (x [T,K], dest [T*k], rows, rows_per_batch) -> (codes [rows,K], scales)
    silu_quant: Callable   # (h [R,2I] or [E,max_m,2I], dest, rows_per_batch) -> (codes [R,I], scales)
    combine: Callable      # (y [R,D] or [E,max_m,D], dest, topk_weights [T,k], dtype) -> [T,D]
    masked_layout: Callable        # (topk_ids, E) -> (dest, masked_m [E] int32, max_m)
    contiguous_layout: Callable    # (topk_ids, E, align) -> (dest, m_indices [R] int32)


def _torch_permute(x, dest, rows, rows_per_batch):
    """Quantise the tokens once, copy each pair's row to its destination (padding rows stay uninitialised:
    their outputs are never gathered, so no memset of the worst-case bound)."""
    xq, xs = ref.quant_fp8_act(x)
    k = dest.numel() // x.shape[0] if x.shape[0] else 1
    tok = torch.arange(dest.numel(), device=x.device) // k
    aq = torch.empty(rows, x.shape[1], dtype=xq.dtype, device=x.device)
    as_ = torch.empty(rows, xs.shape[1], dtype=torch.float32, device=x.device)
    aq[dest], as_[dest] = xq[tok], xs[tok]
    return aq, as_


def _torch_silu_quant(h, dest, rows_per_batch):
    """SiLU-and-mul of the valid pairs' gate/up rows, re-quantised to 1x128 FP8 for GEMM 2, back in their rows."""
    h2 = h.reshape(-1, h.shape[-1])
    hq, hs = ref.quant_fp8_act(ref.silu_and_mul(h2[dest]))
    bq = torch.empty(h2.shape[0], hq.shape[1], dtype=hq.dtype, device=h.device)
    bs = torch.empty(h2.shape[0], hs.shape[1], dtype=torch.float32, device=h.device)
    bq[dest], bs[dest] = hq, hs
    return bq, bs


def _torch_combine(y, dest, topk_weights, dtype):
    """Weighted sum of a token's k pair outputs: one batched ``[1,k] @ [k,D]`` matmul per token
    (FP32 accumulation inside the matmul, no FP32 copy of the ``[T*k, D]`` outputs)."""
    t, k = topk_weights.shape
    y_pairs = y.reshape(-1, y.shape[-1])[dest]
    w = topk_weights.reshape(t, 1, k).to(y_pairs.dtype)
    return torch.bmm(w, y_pairs.view(t, k, -1)).view(t, -1).to(dtype)


TORCH_GLUE = Glue(_torch_permute, _torch_silu_quant, _torch_combine, masked_layout, contiguous_layout)


def triton_glue() -> Glue:
    """The one-launch Triton kernels (imported here: CPU CI has no Triton)."""
    from kernels import triton_moe_layout as T
    return Glue(T.permute_quant, T.silu_mul_quant, T.combine, T.masked_layout, T.contiguous_layout)


def moe_masked(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, gemm: MaskedGemm,
               glue: Glue = TORCH_GLUE) -> torch.Tensor:
    """Decode MoE through the masked layout; same contract as ``reference.moe_experts`` (FP8)."""
    t, k = topk_ids.shape
    e, two_i, d = w13.shape
    dest, masked_m, max_m = glue.masked_layout(topk_ids, e)
    expected_m = max(1, -(-t * k // e))          # mean pairs per expert: the kernel's tiling hint
    aq, as_ = glue.permute(x, dest, e * max_m, max_m)   # rows >= masked_m are never read
    h = gemm(aq.view(e, max_m, d), as_.view(e, max_m, -1), w13, w13_scale, masked_m, expected_m)
    bq, bs = glue.silu_quant(h, dest, max_m)
    y = gemm(bq.view(e, max_m, -1), bs.view(e, max_m, -1), w2, w2_scale, masked_m, expected_m)
    return glue.combine(y, dest, topk_weights, x.dtype)


def moe_contiguous(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, gemm: ContigGemm,
                   glue: Glue = TORCH_GLUE, align: int = CONTIG_ALIGN) -> torch.Tensor:
    """Prefill MoE through the contiguous layout; same contract as ``reference.moe_experts`` (FP8)."""
    e = w13.shape[0]
    dest, m_indices = glue.contiguous_layout(topk_ids, e, align)
    rows = m_indices.numel()
    aq, as_ = glue.permute(x, dest, rows, rows)
    h = gemm(aq, as_, w13, w13_scale, m_indices)
    bq, bs = glue.silu_quant(h, dest, rows)
    y = gemm(bq, bs, w2, w2_scale, m_indices)
    return glue.combine(y, dest, topk_weights, x.dtype)


def moe_experts(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, masked: MaskedGemm,
                contiguous: ContigGemm, glue: Glue = TORCH_GLUE, align: int = CONTIG_ALIGN) -> torch.Tensor:
    """Pick the layout by batch size: masked for decode (T <= 128), contiguous for prefill."""
    if topk_ids.shape[0] <= MASKED_MAX_TOKENS:
        return moe_masked(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, masked, glue)
    return moe_contiguous(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, contiguous, glue, align)


# --- torch references of the two grouped GEMMs (CPU CI checks the layouts with these) ---------

def ref_masked_gemm(aq, as_, w, ws, masked_m, expected_m) -> torch.Tensor:
    """Reference ``m_grouped_fp8_gemm_nt_masked``: rows >= masked_m[e] are left 0."""
    e, m, _ = aq.shape
    out = torch.zeros(e, m, w.shape[1], dtype=torch.bfloat16, device=aq.device)
    for g in range(e):
        n = int(masked_m[g])
        if n:
            out[g, :n] = ref.fp8_gemm_blockscaled(aq[g, :n], as_[g, :n], w[g], ws[g], torch.float32).to(out.dtype)
    return out


def ref_contiguous_gemm(aq, as_, w, ws, m_indices) -> torch.Tensor:
    """Reference ``m_grouped_fp8_gemm_nt_contiguous``: padding rows (-1) are left 0."""
    out = torch.zeros(aq.shape[0], w.shape[1], dtype=torch.bfloat16, device=aq.device)
    for g in torch.unique(m_indices[m_indices >= 0]).tolist():
        rows = (m_indices == g).nonzero(as_tuple=True)[0]
        out[rows] = ref.fp8_gemm_blockscaled(aq[rows], as_[rows], w[g], ws[g], torch.float32).to(out.dtype)
    return out
