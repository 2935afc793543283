"""Multi-head latent attention (DeepSeek-V2/V3), HF parameter names.

Decodes use the absorbed form: q_nope is projected into latent space (W_UK folded into
the query), attention runs over the cached latents themselves (one shared 576-dim KV
head: FlashMLA's contract) and the output is projected back by W_UV. Prefill chunks use
the expanded form (up-project the latents into per-head K/V), which is cheaper when many
queries share the keys. Both compute the same function (tested).
"""

from __future__ import annotations

import torch
from torch import nn

from costmodels.model_spec import ModelSpec
from executor.forward_batch import ForwardBatch
from executor.indexer import Indexer
from executor.kv_cache import KVCache
from executor.layers import Linear, RMSNorm, shared_quant
from kernels import ops
from kernels import reference as ref


class MLAAttention(nn.Module):
    """One MLA layer writing latents (and indexer keys) to KV layer ``cache_layer``."""

    def __init__(self, spec: ModelSpec, cache_layer: int, softmax_scale: float, fp8: bool = False,
                 index_rope_interleaved: bool = False, rope_interleave: bool = True):
        super().__init__()
        m = spec.mla
        self.h, self.dn, self.dr, self.dv, self.rank = spec.num_attention_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        self.cache_layer, self.scale, self.interleave = cache_layer, softmax_scale, rope_interleave
        # the latent norms use RMSNorm's default eps, not config.rms_norm_eps (DeepSeek-V3 inference/model.py
        # and HF modeling_deepseek_v3 both build them as RMSNorm(rank))
        eps = 1e-6
        d, qk = spec.hidden_size, m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            self.q_a_proj = Linear(d, m.q_lora_rank, fp8=fp8)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, eps)
            self.q_b_proj = Linear(m.q_lora_rank, self.h * qk, fp8=fp8)
        else:
            self.q_proj = Linear(d, self.h * qk, fp8=fp8)
        self.kv_a_proj_with_mqa = Linear(d, m.kv_lora_rank + m.qk_rope_head_dim, fp8=fp8)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, eps)
        # kept in the activation dtype: absorbed decode reads it per head (DeepSeek dequantises it too)
        self.kv_b_proj = Linear(m.kv_lora_rank, self.h * (self.dn + self.dv))
        self.o_proj = Linear(self.h * self.dv, d, fp8=fp8)
        self.indexer = None
        if spec.indexer is not None and m.q_lora_rank:
            self.indexer = Indexer(spec.indexer, d, m.q_lora_rank, m.qk_rope_head_dim, cache_layer,
                                   index_rope_interleaved, fp8=fp8)
        self.cos_sin: torch.Tensor | None = None   # set by the model (shared rope table)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        q_nope, q_pe, idx = self.project(x, batch, kv)
        return self.output(self.attend(q_nope, q_pe, batch, kv, idx))

    def project(self, x: torch.Tensor, batch: ForwardBatch, kv: KVCache, indexer_queries: bool | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """The per-token part before attention: q/kv projections, latent norms, RoPE, and the KV-cache write.
        DSA models also run the indexer's per-token part here (its keys written beside the latents, its queries and
        head weights from ``x`` and the normed q latent). Returns ``(q_nope [T, h, dn], q_pe [T, h, dr], idx)``:
        ``idx`` the indexer's ``(queries [T, Hi, Di], weights [T, Hi])``, None without an indexer or when
        ``indexer_queries`` is False (None: computed when some row of ``batch`` sees more than top-k keys; a piecewise
        graph passes True, its static batch says nothing of the step). No host sync and shapes fixed by ``T`` when
        ``indexer_queries`` is given: CUDA-graph capturable (executor/piecewise_graphs.py)."""
        t = x.shape[0]
        qr = None
        if hasattr(self, "q_a_proj"):
            quant = shared_quant(x, self.q_a_proj, self.kv_a_proj_with_mqa)   # both read x: quantise it once
            qr = self.q_a_layernorm(self.q_a_proj(x, quant))
            q = self.q_b_proj(qr)
        else:
            quant = shared_quant(x, self.q_proj, self.kv_a_proj_with_mqa)
            q = self.q_proj(x, quant)
        q = q.view(t, self.h, self.dn + self.dr)
        kva = self.kv_a_proj_with_mqa(x, quant)
        c = self.kv_a_layernorm(kva[:, : self.rank])
        # the query heads' and the shared key's rope parts rotated in one call, at rows gathered once per forward
        pe = ops.rope(torch.cat((q[..., self.dn:], kva[:, None, self.rank:]), dim=1), batch.positions, self.cos_sin,
                      self.interleave, batch.rope_rows(self.cos_sin))
        q_nope, q_pe, k_pe = q[..., : self.dn], pe[:, : self.h], pe[:, self.h]
        ref.write_paged(kv.latent[self.cache_layer], batch.slot_mapping, torch.cat((c, k_pe), dim=-1))
        idx = None
        if self.indexer is not None:
            if indexer_queries is None:
                indexer_queries = self.indexer.needs_queries(batch)
            idx = self.indexer.project(x, qr, batch, kv.index_k[self.cache_layer], self.cos_sin, indexer_queries)
        return q_nope, q_pe, idx

    def attend(self, q_nope: torch.Tensor, q_pe: torch.Tensor, batch: ForwardBatch, kv: KVCache,
               idx: tuple[torch.Tensor, torch.Tensor] | None = None, out: torch.Tensor | None = None,
               q: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of the batch's queries over the cache ``project`` wrote: the decode group through the paged decode
        kernel (absorbed form), each prefill chunk expanded and attended on its own. Per-step shapes (KV lengths, chunk
        spans) live here, so this part stays eager between graph pieces: with them the DSA indexer's top-k over
        ``project``'s ``idx`` (DSA models only). ``out``: where to write ``[T, h, dv]`` (a static buffer's rows; allocated
        when None). ``q``: the same queries already side by side, ``[T, h, dn + dr]`` (the piecewise graphs' buffer),
        which spares each chunk a concatenation.

        Each op here is paid on the host once per layer (eager between graph pieces: a prompt step's launch, which the
        device waits on when it outlasts the step before), so the per-step parts are shared: the decode kernel's
        scheduling metadata (``batch.memo``), each chunk's key slots (``PrefillSpan.key_slots``, from the step's one
        host-to-device copy) and the absorption weights as per-head views (:meth:`absorb_weights`)."""
        t = q_nope.shape[0]
        cache = kv.latent[self.cache_layer]
        dec_topk, masks = None, [None] * len(batch.prefills)
        if self.indexer is not None:
            dec_topk, masks = self.indexer.select(idx, batch, kv.index_k[self.cache_layer])

        if out is None:
            out = torch.empty(t, self.h, self.dv, dtype=q_nope.dtype, device=q_nope.device)
        nd = batch.num_decode_tokens
        if nd:
            w_uk, w_uv = self.absorb_weights(q_nope.dtype)
            b, sq = batch.num_decodes, batch.decode_sq
            q_lat = torch.bmm(q_nope[:nd].transpose(0, 1), w_uk)                  # [h, nd, rank]: W_UK into q
            qd = torch.cat((q_lat.transpose(0, 1), q_pe[:nd]), dim=-1).view(b, sq, self.h, self.rank + self.dr)
            o_lat = ops.mla_decode(qd, cache, batch.decode_block_table, batch.decode_seq_lens, self.scale,
                                   self.rank, topk_indices=dec_topk, memo=batch.memo)
            torch.bmm(o_lat.reshape(nd, self.h, self.rank).transpose(0, 1), w_uv, out=out[:nd].transpose(0, 1))  # W_UV
        for i, (p, mask) in enumerate(zip(batch.prefills, masks)):
            rows = slice(p.start, p.start + p.num)
            k_nope, v, kpe = self.prefill_expand(cache, batch.key_slots(i, cache.shape[1]))
            out[rows] = self.prefill_attend(q_nope[rows], q_pe[rows], k_nope, v, kpe, batch.positions[rows], mask,
                                            q=None if q is None else q[rows])
        return out

    def absorb_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj``'s two halves as batched-matmul operands: W_UK ``[h, dn, rank]`` (q_nope into latent space) and
        W_UV transposed ``[h, rank, dv]`` (latent outputs to values), views of the weight made once per weight tensor
        (converted each call when ``dtype`` differs): ``reference.mla_absorb_q`` / ``mla_absorb_out`` as one ``bmm``
        each."""
        w = self.kv_b_proj.weight
        got = getattr(self, "_absorb", None)
        if got is not None and got[0] is w and w.dtype == dtype:
            return got[1], got[2]
        per_head = (w if w.dtype == dtype else w.to(dtype)).view(self.h, self.dn + self.dv, self.rank)
        pair = per_head[:, : self.dn, :], per_head[:, self.dn:, :].transpose(1, 2)
        if w.dtype == dtype:   # views of the weight itself: an in-place load reaches them (a converted copy would not)
            self._absorb = (w, *pair)
        return pair

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """The output projection of ``attend``'s ``[T, h, dv]`` (graphable: it opens the next piece)."""
        return self.o_proj(out.view(out.shape[0], self.h * self.dv))

    def prefill_expand(self, cache: torch.Tensor, key_slots: torch.Tensor):
        """A prefill chunk's keys and values: its sequence's cached latents gathered at their flat cache slots
        (``key_slots [kv_len]``, ``ForwardBatch.key_slots``) and up-projected by ``kv_b_proj`` (the cost model's KV_UP
        GEMM over cached + new tokens). Returns per-head ``k_nope [S, h, dn]``, ``v [S, h, dv]`` and the shared
        ``k_pe [S, dr]`` (views)."""
        lat = cache.view(cache.shape[0] * cache.shape[1], cache.shape[-1]).index_select(0, key_slots)
        return ref.mla_expand_kv(lat, self.kv_b_proj.weight, self.h, self.dn, self.dv, self.rank)

    def prefill_attend(self, q_nope: torch.Tensor, q_pe: torch.Tensor, k_nope: torch.Tensor, v: torch.Tensor,
                       kpe: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                       q: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of one prefill chunk's queries over its expanded keys: the per-head K assembled (k_pe
        broadcast to every head) and masked SDPA. ``executor.calibrate`` times exactly this over new x cached
        tokens (the profile's ``attn_prefill_chunk`` table). The queries are always the keys' last ``len(q)``
        positions (``attend``: a chunk's keys end at its last token), known here without reading ``positions``:
        ``bottom_right=True`` lets the flash split serve the unmasked case (kernels/prefill_attention.py).
        ``q``: ``q_nope`` and ``q_pe`` already side by side (no concatenation then)."""
        k = torch.cat((k_nope, kpe[:, None, :].expand(-1, self.h, -1)), dim=-1)
        qq = q if q is not None else torch.cat((q_nope, q_pe), dim=-1)
        return ops.attention_prefill(qq, k, v, positions, self.scale, mask, bottom_right=True)
