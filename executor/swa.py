"""Sliding-window attention (the ``sliding`` layers of V4-class models): each query sees its last ``window`` tokens.

Query at position p attends keys at positions ``p - window + 1 .. p`` (HF's ``sliding_window``
convention as in Mistral/Gemma: the window counts the query itself). The layer shares the GQA
projections and the paged K/V layout of the full-attention layers (one block table for every
layer); what differs is which keys it reads. A prefill chunk gathers only the pages covering
``[lo, kv_len)`` with ``lo = max(span.key_start, first query - window + 1)``, so a chunk of n
tokens costs n x (n + window) attention, not n x context. ``span.key_start`` is the first
position whose KV this layer holds for the sequence (set by executor/swa_replay.py when the
window was only partly kept); keys below it are never read, so a dropped page can hold anything.

V4-Flash's attention is one shared KV head of dim 512 (MQA); here it is GQA with any number of
KV heads (``num_kv_heads = 1`` gives the MQA shape). Decodes run a per-sequence loop over the
last ``window`` keys (correct, not fast: the benchmarks that use this layer time prefill).
"""

from __future__ import annotations

import torch

from costmodels.model_spec import ModelSpec
from executor.forward_batch import ForwardBatch
from executor.gqa import GQAAttention
from executor.kv_cache import KVCache
from kernels import ops


def gather_range(cache: torch.Tensor, block_table: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Tokens ``[lo, hi)`` of one sequence from ``cache [P, page, ...]``: reads only the pages covering them."""
    page = cache.shape[1]
    p0, p1 = lo // page, -(-hi // page)
    pages = cache.index_select(0, block_table[p0:p1].long())
    flat = pages.reshape((p1 - p0) * page, *cache.shape[2:])
    return flat[lo - p0 * page: hi - p0 * page]


# query rows per attention call: a long run of rows (a recompute over the whole context) is cut into tiles,
# each attending only the keys its window reaches, so its cost is rows x (tile + window), not rows^2
ROW_TILE = 2048


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, lo: int,
                     window: int, scale: float) -> torch.Tensor:
    """Queries at positions ``first, first+1, ..`` over keys of positions ``lo, lo+1, ..``: causal, within ``window``."""
    n = q.shape[0]
    q_pos = torch.arange(first, first + n, device=q.device)
    if n <= ROW_TILE:
        return _window_tile(q, k, v, q_pos, lo, window, scale)
    out = torch.empty(n, q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    for a in range(0, n, ROW_TILE):
        b = min(n, a + ROW_TILE)
        k0 = max(lo, first + a - window + 1)
        k1 = first + b   # keys up to the tile's last query
        out[a:b] = _window_tile(q[a:b], k[k0 - lo: k1 - lo], v[k0 - lo: k1 - lo], q_pos[a:b], k0, window, scale)
    return out


def _window_tile(q, k, v, q_pos, lo: int, window: int, scale: float) -> torch.Tensor:
    rel = q_pos - lo
    key_pos = torch.arange(k.shape[0], device=q.device) + lo
    in_window = key_pos[None, :] > (q_pos[:, None] - window)
    return ops.attention_prefill(q, k, v, rel, scale, in_window)


class SlidingWindowAttention(GQAAttention):
    """GQA restricted to the last ``window`` positions; writes K/V to KV layer ``cache_layer`` like GQAAttention."""

    def __init__(self, spec: ModelSpec, cache_layer: int, window: int, qk_norm: bool, bias: bool, fp8: bool = False,
                 o_bias: bool = False, rope_dim: int | None = None):
        super().__init__(spec, cache_layer, qk_norm, bias, fp8, o_bias, rope_dim)
        self.window = int(window)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        q, kc, vc, out = self.project_and_cache(x, batch, kv)
        sq = batch.decode_sq
        # the KV lengths on the host where the batch has them (reading them off the device syncs the stream)
        lens = batch.decode_seq_lens_host
        if lens is None and batch.num_decodes:
            lens = batch.decode_seq_lens.tolist()
        for i in range(batch.num_decodes):
            n = int(lens[i])
            lo = max(0, n - sq - self.window + 1)
            rows = slice(i * sq, (i + 1) * sq)
            out[rows] = self._attend(q[rows], kc, vc, batch.decode_block_table[i], lo, n, n - sq)
        for p in batch.prefills:
            rows = slice(p.start, p.start + p.num)
            lo = max(p.key_start, p.context_len - self.window + 1, 0)
            out[rows] = self._attend(q[rows], kc, vc, p.block_table, lo, p.kv_len, p.context_len)
        return self.o_proj(out.view(x.shape[0], self.hq * self.d))

    def _attend(self, q, kc, vc, table, lo: int, hi: int, first: int) -> torch.Tensor:
        """Queries at ``first, ..`` over the sequence's keys ``[lo, hi)``."""
        kk, vv = gather_range(kc, table, lo, hi), gather_range(vc, table, lo, hi)
        return window_attention(q, kk, vv, first, lo, self.window, self.scale)
