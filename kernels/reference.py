"""Tier 0: plain-torch reference kernels (CPU and GPU).

These are the correctness oracle every faster tier is tested against, and the path CI
runs. They favour clarity over speed: softmax and norms accumulate in float32, paged
caches are gathered by block table, MoE loops over experts. Shapes follow the vendor
kernels' conventions (FlashMLA: q ``[B, s_q, H, D]``, KV pages ``[P, page, D]``) so a
faster tier is a drop-in replacement.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value (OCP FP8 spec)
FP8_BLOCK = 128       # DeepSeek-V3 FP8 recipe: 128x128 weight blocks, 1x128 activation groups


def _up(x: torch.Tensor) -> torch.Tensor:
    """Accumulation dtype: float32, or float64 when the inputs already are (exact CPU checks)."""
    return x if x.dtype == torch.float64 else x.float()


# ----------------------------------------------------------------------------- norms, rope

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim, accumulated in float32."""
    xf = _up(x)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.to(xf.dtype)).to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm over the last dim (the DSA indexer's key norm), in float32."""
    return F.layer_norm(x.float(), (x.shape[-1],), weight.float(), None if bias is None else bias.float(), eps).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, interleaved: bool,
         rows: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding of ``x [T, ..., d]`` at ``positions [T]``.

    ``cos_sin [max_pos, d]`` holds cos in the first half and sin in the second (float32).
    ``interleaved`` rotates pairs (x0,x1),(x2,x3).. as DeepSeek's checkpoints expect; otherwise
    the two halves (x[:d/2], x[d/2:]) as Llama/Qwen ("neox" style). ``rows``: ``cos_sin[positions]``
    when the caller already gathered it (one gather per forward instead of one per layer).
    """
    d = x.shape[-1]
    cs = cos_sin[positions] if rows is None else rows   # [T, d]
    cos, sin = cs[:, : d // 2], cs[:, d // 2:]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = cos.view(shape), sin.view(shape)
    xf = _up(x)
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        out = torch.stack((o1, o2), dim=-1).flatten(-2)
    else:
        x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


# ----------------------------------------------------------------------------- paged KV

def write_paged(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """Store ``values [T, ...]`` at flat slots ``page * page_size + offset`` of ``cache [P, page, ...]``."""
    flat = cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])
    flat.index_copy_(0, slot_mapping.long(), values.to(cache.dtype))


def gather_paged(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence from ``cache [P, page, ...]`` via its block table."""
    page = cache.shape[1]
    n_pages = (length + page - 1) // page
    pages = cache.index_select(0, block_table[:n_pages].long())  # [n, page, ...]
    return pages.reshape(n_pages * page, *cache.shape[2:])[:length]


def slots_for_positions(block_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
    """Flat cache slot of each position of one sequence."""
    return block_table.long()[positions // page_size] * page_size + positions % page_size


# ----------------------------------------------------------------------------- attention

def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
              scale: float, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of one sequence: key ``j`` is token position ``j``.

    q ``[n, Hq, Dk]``, k ``[S, Hkv, Dk]``, v ``[S, Hkv, Dv]`` (GQA when Hkv < Hq);
    ``key_mask [n, S]`` (bool, True = visible) further restricts keys, e.g. to the indexer's
    top-k. Returns ``[n, Hq, Dv]`` in q's dtype.
    """
    n, hq, _ = q.shape
    s, hkv = k.shape[0], k.shape[1]
    if hkv != hq:
        rep = hq // hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("nhd,shd->hns", _up(q), _up(k).to(_up(q).dtype)) * scale
    visible = torch.arange(s, device=q.device)[None, :] <= q_positions[:, None]
    if key_mask is not None:
        visible = visible & key_mask
    scores = scores.masked_fill(~visible[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hns,shd->nhd", probs, _up(v).to(probs.dtype)).to(q.dtype)


def paged_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """GQA attention of ``s_q`` trailing queries per sequence over a paged KV cache.

    q ``[B, s_q, Hq, D]``; caches ``[P, page, Hkv, D]``; ``seq_lens [B]`` count KV tokens
    including the s_q new ones (queries are the last s_q positions, causal among themselves).
    """
    b, s_q = q.shape[:2]
    out = torch.empty(b, s_q, q.shape[2], v_cache.shape[-1], dtype=q.dtype, device=q.device)
    for i in range(b):
        n = int(seq_lens[i])
        k = gather_paged(k_cache, block_table[i], n)
        v = gather_paged(v_cache, block_table[i], n)
        pos = torch.arange(n - s_q, n, device=q.device)
        out[i] = attention(q[i], k, v, pos, scale)
    return out


def mla_expand_kv(latent: torch.Tensor, w_kv_b: torch.Tensor, num_heads: int, qk_nope: int,
                  v_dim: int, kv_rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split cached MLA latents ``[S, rank + rope]`` into per-head k_nope ``[S,H,dn]``, v ``[S,H,dv]``, k_pe ``[S,dr]``."""
    c, k_pe = latent[:, :kv_rank], latent[:, kv_rank:]
    kv = (c @ w_kv_b.t().to(c.dtype)).view(-1, num_heads, qk_nope + v_dim)
    return kv[..., :qk_nope], kv[..., qk_nope:], k_pe


def mla_attention_naive(q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor, w_kv_b: torch.Tensor,
                        q_positions: torch.Tensor, scale: float, v_dim: int,
                        key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """MLA of one sequence in its expanded ("naive", prefill) form.

    q_nope ``[n, H, dn]``, q_pe ``[n, H, dr]`` (rotated), latent ``[S, rank + dr]`` (normed
    c_kv, rotated k_pe), ``w_kv_b [H*(dn+dv), rank]``. Up-projects the latent into full
    per-head keys and values, then runs ordinary attention. Returns ``[n, H, dv]``.
    """
    h, dn, dr = q_nope.shape[1], q_nope.shape[2], q_pe.shape[2]
    rank = latent.shape[1] - dr
    k_nope, v, k_pe = mla_expand_kv(latent, w_kv_b, h, dn, v_dim, rank)
    k = torch.cat((k_nope, k_pe[:, None, :].expand(-1, h, -1)), dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1)
    return attention(q, k, v, q_positions, scale, key_mask)


def mla_absorb_q(q_nope: torch.Tensor, w_kv_b: torch.Tensor, qk_nope: int, v_dim: int) -> torch.Tensor:
    """Project q_nope ``[..., H, dn]`` into latent space ``[..., H, rank]`` (W_UK absorbed into q)."""
    h = q_nope.shape[-2]
    w = w_kv_b.view(h, qk_nope + v_dim, -1)[:, :qk_nope, :]       # [H, dn, rank]
    return torch.einsum("...hd,hdr->...hr", q_nope, w.to(q_nope.dtype))


def mla_absorb_out(o_latent: torch.Tensor, w_kv_b: torch.Tensor, qk_nope: int, v_dim: int) -> torch.Tensor:
    """Project attention output from latent space ``[..., H, rank]`` to values ``[..., H, dv]`` (W_UV)."""
    h = o_latent.shape[-2]
    w = w_kv_b.view(h, qk_nope + v_dim, -1)[:, qk_nope:, :]       # [H, dv, rank]
    return torch.einsum("...hr,hvr->...hv", o_latent, w.to(o_latent.dtype))


def mla_decode_paged(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float, kv_rank: int,
                     topk_indices: torch.Tensor | None = None, memo: dict | None = None) -> torch.Tensor:
    """Absorbed MLA over a paged latent cache (the FlashMLA contract; ``memo``, per-step scratch, is not used here).

    q ``[B, s_q, H, rank + dr]`` (absorbed q_nope ++ q_pe); ``kv_cache [P, page, rank + dr]``;
    ``seq_lens [B]`` include the s_q new tokens, which are the trailing, mutually causal
    queries. Keys are the whole latent, values its first ``kv_rank`` dims (MQA with one
    shared KV head). ``topk_indices [B, s_q, k]`` (token positions, -1 = none) restricts each
    query to the DSA indexer's selection. Returns ``[B, s_q, H, rank]``.
    """
    b, s_q, h, _ = q.shape
    out = torch.empty(b, s_q, h, kv_rank, dtype=q.dtype, device=q.device)
    for i in range(b):
        n = int(seq_lens[i])
        lat = gather_paged(kv_cache, block_table[i], n)           # [n, D]
        pos = torch.arange(n - s_q, n, device=q.device)
        mask = None
        if topk_indices is not None:
            mask = topk_mask(topk_indices[i], n)
        out[i] = attention(q[i], lat[:, None, :], lat[:, None, :kv_rank], pos, scale, mask)
    return out


# ----------------------------------------------------------------------------- DSA indexer

def indexer_scores(q: torch.Tensor, weights: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor) -> torch.Tensor:
    """DSA lightning-indexer scores ``[n, S]``: sum over heads of w[t,h] * relu(q[t,h] . k[s]).

    q ``[n, Hi, Di]``, weights ``[n, Hi]``, k ``[S, Di]``. Future keys score -inf.
    (DeepSeek-V3.2 Hadamard-rotates q and k before FP8 quantisation; the rotation is
    orthogonal, so in exact arithmetic the scores are the same and the reference omits it.)
    """
    logits = torch.relu(torch.einsum("nhd,sd->nhs", _up(q), _up(k).to(_up(q).dtype)))
    scores = torch.einsum("nhs,nh->ns", logits, weights.to(logits.dtype))
    future = torch.arange(k.shape[0], device=q.device)[None, :] > q_positions[:, None]
    return scores.masked_fill(future, float("-inf"))


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k key positions per row of ``scores [n, S]``; -1 where fewer than k keys are visible."""
    kk = min(k, scores.shape[-1])
    # a stable sort breaks ties (ReLU makes exact-zero scores common) by position, so every
    # implementation that computes the same scores selects the same keys
    vals, idx = torch.sort(scores, dim=-1, descending=True, stable=True)
    vals, idx = vals[..., :kk], idx[..., :kk]
    idx = idx.masked_fill(torch.isinf(vals) & (vals < 0), -1)
    if kk < k:
        idx = torch.cat((idx, idx.new_full((idx.shape[0], k - kk), -1)), dim=-1)
    return idx


def topk_mask(indices: torch.Tensor, length: int) -> torch.Tensor:
    """Boolean visibility ``[n, length]`` from top-k positions ``[n, k]`` (-1 ignored)."""
    mask = torch.zeros(indices.shape[0], length + 1, dtype=torch.bool, device=indices.device)
    idx = torch.where(indices < 0, torch.full_like(indices, length), indices)
    mask.scatter_(1, idx.long(), True)
    return mask[:, :length]


# ----------------------------------------------------------------------------- MoE

def route_sigmoid_grouped(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, n_group: int,
                          topk_group: int, routed_scaling_factor: float = 1.0,
                          norm_topk_prob: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing: sigmoid scores, bias-corrected choice, group-limited top-k.

    Groups are ranked by the sum of their two best (biased) scores, the best ``topk_group``
    groups kept, top-k experts chosen among them; weights are the unbiased sigmoid scores,
    renormalised and scaled (DeepSeek-V3 report, section 2.1.2; HF modeling_deepseek).
    Returns (weights ``[T,k]`` float32, ids ``[T,k]`` int64).
    """
    t, e = logits.shape
    scores = torch.sigmoid(logits.float())
    choice = scores if bias is None else scores + bias.float()
    if n_group > 1:
        g = choice.view(t, n_group, e // n_group)
        group_scores = g.topk(min(2, e // n_group), dim=-1).values.sum(-1)       # [T, G]
        keep = group_scores.topk(topk_group, dim=-1).indices
        gmask = torch.zeros_like(group_scores).scatter_(1, keep, 1.0)
        emask = gmask[:, :, None].expand(t, n_group, e // n_group).reshape(t, e)
        choice = choice.masked_fill(emask == 0, float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    w = scores.gather(1, ids)
    if norm_topk_prob:   # also at top_k = 1 (weight 1), as HF modeling_deepseek_v3 does
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * routed_scaling_factor, ids


def route_softmax_topk(logits: torch.Tensor, top_k: int, norm_topk_prob: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-MoE / Mixtral routing: softmax over experts, top-k, optional renormalisation."""
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = probs.topk(top_k, dim=-1)
    if norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation ``silu(gate) * up`` in float32, back in gate's dtype."""
    return (F.silu(_up(gate)) * _up(up)).to(gate.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation of a fused gate/up projection ``[..., 2I] -> [..., I]``."""
    gate, up = x.chunk(2, dim=-1)
    return silu_mul(gate, up)


# ----------------------------------------------------------------------------- mHC (manifold-constrained hyper-connections)

def mhc_prenorm_gemm(x_flat: torch.Tensor, fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mHC mixing projection and the squared norm it is divided by, of the ``n`` streams flattened
    (``x_flat [T, n*H]``, ``fn [(2+n)*n, n*H]`` fp32): ``(x @ fn^T [T, (2+n)*n], sum(x^2) [T])`` in float32
    (DeepGEMM's ``tf32_hc_prenorm_gemm`` with one split)."""
    xf = _up(x_flat)
    return xf @ _up(fn).t(), xf.square().sum(-1)


def mhc_pre(x: torch.Tensor, mix: torch.Tensor, sqr: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            iters: int, rms_eps: float = 1e-6, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
            post_mult: float = 2.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mHC before a block (DeepSeek-V4's ``hc_pre``), from the projection and squared norm of ``x [T, n, H]``:
    the mixes divided by the streams' RMS, then ``pre = sigmoid(.) + pre_eps`` (``[T, n]``),
    ``post = post_mult * sigmoid(.)`` (``[T, n]``) and ``comb`` (``[T, n, n]``), a softmax over each row
    then ``iters`` Sinkhorn rounds (a column normalisation, then ``iters - 1`` row-and-column ones) that make it
    doubly stochastic. Returns the block's input ``sum_i pre_i x_i`` (``x``'s dtype), post and comb (float32).
    ``mix``/``sqr`` may carry a leading split-K axis (summed)."""
    t, n, h = x.shape
    if mix.dim() == 3:
        mix, sqr = mix.sum(0), sqr.sum(0)
    mixes = _up(mix) * torch.rsqrt(_up(sqr) / (n * h) + rms_eps)[:, None]
    sc, b = _up(scale), _up(base)
    pre = torch.sigmoid(mixes[:, :n] * sc[0] + b[:n]) + pre_eps
    post = torch.sigmoid(mixes[:, n:2 * n] * sc[1] + b[n:2 * n]) * post_mult
    comb = (mixes[:, 2 * n:] * sc[2] + b[2 * n:]).view(t, n, n)
    comb = torch.softmax(comb, dim=-1) + sinkhorn_eps
    comb = comb / (comb.sum(-2, keepdim=True) + sinkhorn_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + sinkhorn_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + sinkhorn_eps)
    y = (pre[:, :, None] * _up(x)).sum(1)
    return y.to(x.dtype), post, comb


def mhc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """mHC after a block (DeepSeek-V4's ``hc_post``): stream ``j`` becomes ``post_j * y + sum_k comb[k, j] * x_k``
    (``y [T, H]`` the block's output, ``residual [T, n, H]`` the streams before it), in ``y``'s dtype."""
    out = _up(post)[:, :, None] * _up(y)[:, None, :] + torch.einsum("tkj,tkh->tjh", _up(comb), _up(residual))
    return out.to(y.dtype)


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """Row-grouped GEMM: row r of ``x [M,K]`` times ``w[m_indices[r]] [N,K]``^T; rows with index -1 give 0.

    The DeepGEMM "contiguous" grouped layout: rows sorted by expert, each expert's rows
    padded, padding marked -1.
    """
    out = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    for e in torch.unique(m_indices).tolist():
        if e < 0:
            continue
        rows = (m_indices == e).nonzero(as_tuple=True)[0]
        out[rows] = (x[rows].float() @ w[e].float().t()).to(x.dtype)
    return out


def moe_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor | None = None,
                w2_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Routed experts: sum_k w[t,k] * down(silu(gate) * up)(x[t]) with expert topk_ids[t,k].

    ``w13 [E, 2I, D]`` (gate rows then up rows), ``w2 [E, D, I]``. With ``*_scale`` the
    weights are block-scaled FP8 and activations are FP8-quantised per 1x128 group before
    each GEMM, as the FP8 grouped kernels do.
    """
    t, k = topk_ids.shape
    out = torch.zeros(t, w2.shape[1], dtype=_up(x).dtype, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    fp8 = w13_scale is not None
    cdt = torch.float32 if fp8 else x.dtype

    def gemm(a: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
        if s is None:
            return a @ w.t().to(a.dtype)
        return dequant_fp8_act(*quant_fp8_act(a)) @ dequant_fp8_weight(w, s).t()

    for e in torch.unique(flat_ids).tolist():
        pos = (flat_ids == e).nonzero(as_tuple=True)[0]
        tok = pos // k
        h = silu_and_mul(gemm(x[tok].to(cdt), w13[e], w13_scale[e] if fp8 else None))
        y = gemm(h, w2[e], w2_scale[e] if fp8 else None).to(out.dtype)
        out.index_add_(0, tok, y * topk_weights.reshape(-1)[pos, None].to(out.dtype))
    return out.to(x.dtype)


# ----------------------------------------------------------------------------- FP8

def _fp8_dtype() -> torch.dtype:
    return torch.float8_e4m3fn


def quant_fp8_act(x: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-128-column FP8 quantisation: ``[M,K] -> (fp8 [M,K], fp32 scales [M, K/128])``."""
    m, k = x.shape
    assert k % block == 0, f"K={k} must be a multiple of {block}"
    xb = x.float().view(m, k // block, block)
    amax = xb.abs().amax(-1).clamp(min=1e-4)
    scale = amax / FP8_E4M3_MAX
    q = (xb / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(_fp8_dtype())
    return q.view(m, k), scale


def quant_fp8_weight(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """128x128-block FP8 quantisation: ``[N,K] -> (fp8 [N,K], fp32 scales [ceil(N/128), K/128])``."""
    n, k = w.shape
    assert k % block == 0, f"K={k} must be a multiple of {block}"
    n_pad = (n + block - 1) // block * block
    wp = torch.zeros(n_pad, k, dtype=torch.float32, device=w.device)
    wp[:n] = w.float()
    wb = wp.view(n_pad // block, block, k // block, block)
    amax = wb.abs().amax(dim=(1, 3)).clamp(min=1e-4)
    scale = amax / FP8_E4M3_MAX
    q = (wb / scale[:, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(_fp8_dtype())
    return q.view(n_pad, k)[:n].contiguous(), scale


def dequant_fp8_act(q: torch.Tensor, scale: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """Inverse of :func:`quant_fp8_act` (float32)."""
    m, k = q.shape
    return (q.float().view(m, k // block, block) * scale[..., None]).view(m, k)


def dequant_fp8_weight(q: torch.Tensor, scale: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """Inverse of :func:`quant_fp8_weight` (float32)."""
    n, k = q.shape
    s = scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return q.float() * s


def fp8_gemm_blockscaled(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
                         out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``x @ w^T`` with both operands block-scaled FP8 (the DeepGEMM ``fp8_gemm_nt`` contract)."""
    return (dequant_fp8_act(xq, xs) @ dequant_fp8_weight(wq, ws).t()).to(out_dtype)


# ----------------------------------------------------------------------------- sampling

def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits ``[B,V]`` outside each row's top-k (k<=0: off) and nucleus top-p (p>=1: off)."""
    v = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(v, device=logits.device)[None, :]
    k = torch.where(top_k <= 0, torch.full_like(top_k, v), top_k.clamp(max=v))
    drop = ranks >= k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # keep a token if the mass strictly before it is < p (so the top token always stays)
    before = probs.cumsum(-1) - probs
    drop |= (before >= top_p[:, None]) & (top_p[:, None] < 1)   # p = 1 is off: float rounding must not cut the tail
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of ``logits [B,V]``: greedy where temperature == 0, else seeded sampling.

    Each row draws one uniform number from its own generator (per-request seed), so a request's
    tokens do not depend on what else is in the batch; the draw is then inverted through the row's
    cumulative distribution for all rows at once (``searchsorted``). One host read of the
    temperatures and one tiny RNG call per sampled row: the per-row ``multinomial`` this replaced
    read each temperature back from the device and cost ~0.17 ms a row on the H200 (21.8 ms at 128). Top-k / top-p
    filtering sorts every sampled row's whole vocabulary, so it runs only when some sampled row asks for it (as vLLM's
    sampler skips it): the knobs come back to the host in the same single read as the temperatures.
    """
    logits = logits.float()
    greedy = logits.argmax(-1)
    knobs = torch.stack([temperature.float(), top_k.float(), top_p.float()])
    temps, ks, ps = knobs.tolist()      # knobs on the host (the runner passes them so): no read-back, no wait
    rows = [i for i, x in enumerate(temps) if x > 0]
    if not rows:
        return greedy
    knobs = host_to_device(knobs, logits.device)
    temperature, top_k, top_p = knobs[0], knobs[1].long(), knobs[2]
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    idx = host_to_device(torch.tensor(rows), logits.device)
    filtered = logits[idx] / t[idx, None]
    if any(ks[i] > 0 or ps[i] < 1 for i in rows):
        filtered = apply_top_k_top_p(filtered, top_k[idx], top_p[idx])
    cdf = torch.softmax(filtered, dim=-1).cumsum(-1)
    u = _uniforms([generators[i] for i in rows], logits.device)
    # first token whose cumulative probability exceeds u (right=True never lands on a zero-probability token)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    out = greedy.clone()
    out[idx] = pick.clamp_(max=logits.shape[-1] - 1)
    return out


def _uniforms(gens: list[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One uniform per sampled row from the row's own generator. Host generators (``None``: torch's default one)
    draw on the CPU and the values reach the device in one copy; a device generator launched one kernel per row
    (~48 us a row on the H200's decode steps, with the rest of the per-row work: run 9). Rows with device
    generators keep that path."""
    if any(g is not None and g.device.type != "cpu" for g in gens):   # each draw on its own generator's device
        return torch.stack([torch.rand((), generator=g, device=g.device if g is not None else device).to(device)
                            for g in gens])
    vals = [float(torch.rand((), generator=g)) for g in gens]
    return host_to_device(torch.tensor(vals, dtype=torch.float32), device)


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without making the host wait: a CPU tensor bound for CUDA goes through pinned memory with a
    non-blocking copy (a copy from pageable memory waits for every kernel queued on the stream: CUDA's API sync
    behaviour); a tensor already there is returned as it is."""
    if t.device == device or (t.device.type == device.type and device.index is None):
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def softmax_scale(head_dim: int, mscale: float = 1.0) -> float:
    """1/sqrt(d) times YaRN's attention-scale correction squared (DeepSeek-V3 modeling code)."""
    return mscale * mscale / math.sqrt(head_dim)
