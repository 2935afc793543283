"""DSA lightning indexer (DeepSeek-V3.2): picks the top-k past tokens each query attends to.

Scores are ``sum_h w[t,h] * relu(q[t,h] . k[s])`` over the indexer's own per-token keys,
which are cached in pages beside the MLA latents. When a sequence's KV is no longer than
top-k every token is selected, so the indexer is skipped (the attention is dense anyway).
"""

from __future__ import annotations

import torch
from torch import nn

from costmodels.model_spec import IndexerConfig
from executor.forward_batch import ForwardBatch
from executor.layers import LayerNorm, Linear
from kernels import ops
from kernels import reference as ref


class Indexer(nn.Module):
    """HF DeepSeek-V3.2 parameter names: wq_b, wk, k_norm, weights_proj."""

    def __init__(self, icfg: IndexerConfig, hidden: int, q_lora_rank: int, rope_dim: int, cache_layer: int,
                 interleaved: bool, fp8: bool = False):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = icfg.n_heads, icfg.head_dim, icfg.topk
        self.rope_dim = min(rope_dim, icfg.head_dim)
        self.cache_layer, self.interleaved = cache_layer, interleaved
        self.wq_b = Linear(q_lora_rank, icfg.n_heads * icfg.head_dim, fp8=fp8)
        self.wk = Linear(hidden, icfg.head_dim, fp8=fp8)
        self.k_norm = LayerNorm(icfg.head_dim)
        self.weights_proj = Linear(hidden, icfg.n_heads)
        # V3.2 reference: weights * n_heads^-0.5 * head_dim^-0.5 (softmax_scale)
        self.weight_scale = (icfg.n_heads ** -0.5) * (icfg.head_dim ** -0.5)

    def _rope(self, t: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
        pe, rest = t[..., : self.rope_dim], t[..., self.rope_dim:]
        return torch.cat((ref.rope(pe, positions, cos_sin, self.interleaved), rest), dim=-1)

    def project(self, x: torch.Tensor, qr: torch.Tensor, batch: ForwardBatch, cache: torch.Tensor, cos_sin: torch.Tensor,
                queries: bool = True) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The per-token part: this step's keys written to the cache, and (``queries``) the indexer's queries ``[T, Hi,
        Di]`` and head weights ``[T, Hi]``. No host read and shapes fixed by ``T``: CUDA-graph capturable (it runs in
        the layer's ``project``, inside a piecewise graph). ``queries=False``: keys only (no row needs a top-k)."""
        t = x.shape[0]
        k = self._rope(self.k_norm(self.wk(x)), batch.positions, cos_sin)
        ref.write_paged(cache, batch.slot_mapping, k)
        if not queries:
            return None
        q = self._rope(self.wq_b(qr).view(t, self.n_heads, self.head_dim), batch.positions, cos_sin)
        w = ref._up(self.weights_proj(x)) * self.weight_scale
        return q, w

    def needs_queries(self, batch: ForwardBatch) -> bool:
        """Whether any row of ``batch`` sees more than top-k keys (host values only: no device read)."""
        return bool(batch.num_decodes and batch.max_decode_len > self.topk) or any(p.kv_len > self.topk for p in batch.prefills)

    def select(self, qw: tuple[torch.Tensor, torch.Tensor] | None, batch: ForwardBatch,
               cache: torch.Tensor) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
        """The per-step part over ``project``'s queries: decode top-k ``[B, s_q, k]`` (or None) and a key mask per
        prefill span. Branches on the batch's KV lengths (host values), so it runs eagerly between graph pieces."""
        need_decode = batch.num_decodes and batch.max_decode_len > self.topk
        need_prefill = any(p.kv_len > self.topk for p in batch.prefills)
        if not (need_decode or need_prefill):
            return None, [None] * len(batch.prefills)
        if qw is None:
            raise ValueError("indexer: rows see more than top-k keys but project() ran without queries")
        q, w = qw
        dec_topk = None
        if need_decode:
            dec_topk = self._decode_topk(q, w, batch, cache)
        masks = []
        for p in batch.prefills:
            if p.kv_len <= self.topk:
                masks.append(None)
                continue
            rows = slice(p.start, p.start + p.num)
            keys = ref.gather_paged(cache, p.block_table, p.kv_len)
            scores = ref.indexer_scores(q[rows], w[rows], keys, batch.positions[rows])
            masks.append(ref.topk_mask(ops.indexer_topk(scores, self.topk), p.kv_len))
        return dec_topk, masks

    def forward(self, x: torch.Tensor, qr: torch.Tensor, batch: ForwardBatch, cache: torch.Tensor,
                cos_sin: torch.Tensor) -> tuple[torch.Tensor | None, list[torch.Tensor | None]]:
        """Store this step's keys; return decode top-k ``[B, s_q, k]`` (or None) and a key mask per prefill span."""
        return self.select(self.project(x, qr, batch, cache, cos_sin, self.needs_queries(batch)), batch, cache)

    def _decode_topk(self, q: torch.Tensor, w: torch.Tensor, batch: ForwardBatch, cache: torch.Tensor) -> torch.Tensor:
        """Batched over the decode group: pages gathered into a padded ``[B, L, D]`` key tensor."""
        b, sq = batch.num_decodes, batch.decode_sq
        n = batch.num_decode_tokens
        keys = cache[batch.decode_block_table.long()].view(b, -1, self.head_dim)           # [B, L, D]
        logits = torch.relu(torch.einsum("bshd,bld->bshl", ref._up(q[:n].view(b, sq, self.n_heads, -1)), ref._up(keys)))
        scores = torch.einsum("bshl,bsh->bsl", logits, w[:n].view(b, sq, -1))
        pos = batch.positions[:n].view(b, sq)
        lpos = torch.arange(keys.shape[1], device=q.device)
        scores = scores.masked_fill(lpos[None, None, :] > pos[:, :, None], float("-inf"))
        return ops.indexer_topk(scores.view(b * sq, -1), self.topk).view(b, sq, self.topk)
