"""Prefill-chunk attention through torch's flash kernel: split at the cached prefix, merge by log-sum-exp.

A prefill chunk's n queries are the LAST n positions of a sequence of S keys (bottom-right causal). torch's SDPA
flash backend takes no explicit mask and its ``is_causal`` is top-left, but it needs no per-shape plan (cuDNN builds
one per exact (s_q, s_kv): 40-1300 ms per new shape on the H200, see ``kernels.torch_fast``) and runs ~2.8x faster
than the memory-efficient kernel at MLA's shapes (benchmarks/gpu/issue16_h200/run5_summarize_646970b/log.txt.gz). So the
chunk runs as two flash calls, as serving engines do for chunked prefill (vLLM ``merge_attn_states``, FlashInfer's
cascade ``merge_state``):

1. the queries over their own n keys, causal with q_len == k_len (top-left and bottom-right coincide);
2. the same queries over the S - n cached keys, every key visible (no mask);
3. the two partial outputs merged by their log-sum-exps, in float32.

The split and merge are written once (:func:`split_causal_attention`) over a "partial attention" function returning
(out, lse): flash on CUDA, :func:`attention_lse_torch` (einsum, float32) on CPU for the tests. The decision to take
this path is the caller's, made on the host (``bottom_right=True``): nothing here reads positions back from the device.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from kernels import reference
from kernels.registry import _FLASH_DTYPES, _FLASH_MAX_HEAD_DIM, Unsupported, _dtypes, _flash_available, probe_library

# (q [n,H,D], k [s,H,D], v [s,H,Dv], scale, causal) -> (out [n,H,Dv] in q's dtype, lse [n,H] float32 natural log)
Partial = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor]]

# FlashAttention-2 (what torch's flash backend vendors) head-dim limit and its dtypes, defined with the registry's
# accept check for this implementation (kernels.registry._flash_prefill_declines, the same rules on a call signature)
FLASH_MAX_HEAD_DIM = _FLASH_MAX_HEAD_DIM
FLASH_DTYPES = _dtypes(*_FLASH_DTYPES)


def merge_attn_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Attention over keys A u B from attention over A and over B (disjoint): weights exp(lse) / (exp(lse_a)+exp(lse_b)).

    o ``[n, H, Dv]``, lse ``[n, H]`` (natural log of the softmax denominator, scale included). B's weight is
    ``sigmoid(lse_b - lse_a)``: stable for any magnitudes, 0 where B saw no key (lse -inf). Float32 (float64 when the
    inputs are), back in ``o_a``'s dtype.
    """
    work = torch.float64 if o_a.dtype == torch.float64 else torch.float32
    w_b = torch.sigmoid(lse_b.to(work) - lse_a.to(work))[..., None]
    return torch.lerp(o_a.to(work), o_b.to(work), w_b).to(o_a.dtype)


def split_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, partial: Partial,
                           merge: Callable = merge_attn_states) -> torch.Tensor:
    """Bottom-right causal attention of the last ``n = len(q)`` positions over ``S = len(k)`` keys, as the chunk's
    causal self part plus its unmasked cached part, merged (module docstring). ``partial`` computes each part,
    ``merge`` combines them (this module's torch merge, or the one-launch Triton one on CUDA)."""
    n, s = q.shape[0], k.shape[0]
    c = s - n
    o_new, lse_new = partial(q, k[c:], v[c:], scale, True)
    if c == 0:
        return o_new
    o_old, lse_old = partial(q, k[:c], v[:c], scale, False)
    return merge(o_new, lse_new, o_old, lse_old)


def attention_lse_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference partial attention with its log-sum-exp (``reference.attention``'s arithmetic: float32, or float64
    for float64 inputs). ``causal`` is top-left (query i sees keys 0..i), used only with ``len(q) == len(k)``."""
    up = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = torch.einsum("nhd,shd->hns", q.to(up), k.to(up)) * scale
    if causal:
        n, s = q.shape[0], k.shape[0]
        visible = torch.arange(s, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                                  # [H, n]
    probs = torch.exp(scores - lse[..., None])
    out = torch.einsum("hns,shd->nhd", probs, v.to(up)).to(q.dtype)
    return out, lse.t()


def attention_lse_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial attention through ``aten._scaled_dot_product_flash_attention`` (FlashAttention-2 in torch; no
    per-shape plan), which also returns the log-sum-exp ``[1, H, n]`` (float32, natural log, scale included).

    It wants ``[B, H, S, D]`` (the transposed views of our ``[S, H, D]``; it works in ``[B, S, H, D]`` inside, so
    no copy) and one head dim for q, k and v: ``v`` must come padded to q's width (:func:`flash_prefill`); the
    output keeps that width (the caller slices). On CPU the same contract runs torch's CPU flash kernel
    (``_scaled_dot_product_flash_attention_for_cpu``, same layout and LSE): the CPU tests run this exact code.
    """
    q4, k4, v4 = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if q.device.type == "cuda":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q4, k4, v4, 0.0, causal, False, scale=scale)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4, k4, v4, 0.0, causal, scale=scale)[:2]
    return out[0].transpose(0, 1), lse[0].t()


def flash_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """:func:`split_causal_attention` on flash: v zero-padded once to the q/k head dim (192 vs 128 for MLA; zero
    columns add nothing to the kept ones), the merged output sliced back to v's width."""
    dv, dqk = v.shape[-1], q.shape[-1]
    vp = F.pad(v, (0, dqk - dv)) if dv != dqk else v

    def partial(q_, k_, v_, scale_, causal_):   # merge only the kept columns
        out, lse = attention_lse_flash(q_, k_, v_, scale_, causal_)
        return out[..., :dv], lse
    return split_causal_attention(q, k, vp, scale, partial, fast_merge(q.device)).contiguous()


def fast_merge(device: torch.device) -> Callable:
    """The merge to use on ``device``: one Triton launch on CUDA where Triton imports (kernels/triton_attn_merge.py),
    else the torch ops of :func:`merge_attn_states`."""
    if device.type == "cuda" and probe_library("triton")[0]:
        from kernels.triton_attn_merge import merge_attn_states as triton_merge
        return triton_merge
    return merge_attn_states


def flash_decline(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask, bottom_right: bool) -> str:
    """Why the flash split cannot take this call ("" = it can). Host-side checks only (shapes, dtype, device)."""
    if not bottom_right:
        return "needs queries at the sequence's end (bottom-right causal), decided by the caller"
    if key_mask is not None:
        return "flash takes no explicit mask (key_mask given)"
    if q.device.type != "cuda":
        return "CUDA only"
    if q.dtype not in FLASH_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"flash runs fp16/bf16, got {q.dtype}"
    if k.shape[1] != q.shape[1]:
        return "GQA (fewer KV heads) stays on SDPA"
    dqk, dv = q.shape[-1], v.shape[-1]
    if dqk > FLASH_MAX_HEAD_DIM or dqk % 8 or dv > dqk:
        return f"head dims q/k {dqk}, v {dv}: flash needs <= {FLASH_MAX_HEAD_DIM}, a multiple of 8, v <= q/k"
    if q.shape[0] > k.shape[0] or q.shape[0] == 0:
        return f"{q.shape[0]} queries over {k.shape[0]} keys"
    if not _flash_available():
        return "this torch build has no flash attention"
    return ""



def attention_prefill_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, scale: float,
                            key_mask: torch.Tensor | None = None, bottom_right: bool = False) -> torch.Tensor:
    """Registry adapter (op ``attention_prefill``): the flash split when the caller says the queries are the last
    ``len(q)`` positions of ``k`` (``bottom_right``, so ``q_positions`` is not read) and there is no key mask;
    otherwise :class:`Unsupported` and the next implementation (masked SDPA) runs."""
    why = flash_decline(q, k, v, key_mask, bottom_right)
    if why:
        raise Unsupported(why)
    return flash_prefill(q, k, v, scale)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, scale: float,
                        key_mask: torch.Tensor | None = None, bottom_right: bool = False) -> torch.Tensor:
    """``reference.attention`` taking (and not needing) the ``bottom_right`` hint: the CPU path, unchanged."""
    return reference.attention(q, k, v, q_positions, scale, key_mask)
