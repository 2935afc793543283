"""Sliding-window state on resume in the executor: per layer persist / replay W / recompute.

The policy is costmodels/replay.py's ``ReplayPolicy`` (the simulator prices the same one),
resolved on the model into a mode and W per layer. A sequence *resumes* at ``c`` tokens when a
prefill chunk starts with ``c`` tokens already in KV: a prefix-cache hit, or the second and later
chunks of a chunked prompt. What each layer holds of the earlier ``c`` tokens (its kept range K):

- full-attention layers: every earlier token (the paged prefix cache), ``K = [0, c)``;
- sliding ``persist``: its window, ``K = [c - S, c)`` (``S`` = ``sliding_window``);
- sliding ``replay`` W: the window less its last W tokens, ``K = [c - S, c - W)`` (empty when W >= S);
- sliding ``recompute``: nothing, ``K = {}``.

Layer j needs ``x_j`` earlier tokens recomputed (0, ``min(W, c)``, ``c``); since a token's input to
layer j is its residual stream after layers 0..j-1 (no engine keeps hidden states), layer j carries
``e_j = max(x_i, i >= j)`` extra rows, the earlier tokens ``[c - e_j, c)`` (``ResolvedReplay.extra_tokens``,
the simulator's count). The executor runs exactly that: the step's chunk is extended at the front by
``e_0`` earlier tokens and each layer processes only its own ``e_j`` extra rows plus the new tokens
(leading rows drop out going up). When the scheduler runs the same policy its chunks already carry the
``e_0`` tokens (``ScheduledChunk.replayed``, priced by the simulator through every layer less its depth
correction); the executor then resumes at ``context_len + replayed`` and runs the same rows. An extra row writes this layer's KV only where the layer did not keep
it (a kept entry is the original, exact value; the prefix's pages may be shared with other requests);
a sliding layer's keys start at ``min(K.start, c - e_j)``, so nothing outside K and the rows is read.

When replay gives identical logits (``exact_for_new_tokens``): the new tokens at a sliding layer read
positions ``c - S + 1 .. c - 1``: kept ones are exact, recomputed ones are exact iff their own inputs
were, which needs *their* windows one sliding layer down, and so on: the reach grows by S - 1 per
sliding layer that recomputes (SGLang PR #31713 rebuilds V4's window from ``W + (layers - 1) W``
tokens for this reason). Full layers add no reach (their earlier KV is all kept). So replay W gives
the logits of a full recompute when W covers that reach (e.g. W >= k (S - 1) with k replaying
layers, or one replaying layer with only full layers below it), and *different* logits when it does
not: an extra row whose window reaches below what its layer kept attends the keys it has (the
truncated window a bounded-replay engine computes, vLLM PR #56227's reading). The tests compare the
exact cases to a one-shot forward and check the others do differ.

Audit (``audit=True``): before a resumed chunk runs, every earlier position a sliding layer does not
keep is overwritten with NaN in that layer's pages. A step that read dropped KV would give NaN logits,
so a finite, identical result proves the policy needs only what it says it keeps; ``kept_blocks``
counts the pages that still hold kept KV. The overwritten entries below the step's rows are put back
after the step: the audit checks one resume, and the same pages may serve a later resume at another
boundary (a prefix hit at a block boundary the first request passed mid-chunk). It is for tests and
sequential replays: pages of a prefix shared with a request running in the same step would read NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from costmodels.model_spec import ModelSpec
from costmodels.replay import ReplayPolicy, ResolvedReplay
from executor.forward_batch import ForwardBatch, PrefillSpan, SeqInput, build_forward_batch, to_device
from executor.kv_cache import KVCache


@dataclass(frozen=True)
class LayerResume:
    """One layer on a resume at ``c`` earlier tokens."""

    sliding: bool
    extra: int        # e_j: earlier tokens this layer processes as rows, [c - extra, c)
    kept: tuple[int, int]   # [k0, k1): earlier positions whose KV the layer kept (k0 == k1: none)
    key_start: int    # first position the layer reads keys from

    def keeps(self, pos: np.ndarray) -> np.ndarray:
        return (pos >= self.kept[0]) & (pos < self.kept[1])


def resume_layout(resolved: ResolvedReplay, sliding: list[bool], c: int) -> list[LayerResume]:
    """Per layer: extra rows, kept range and first key, for a chunk that starts after ``c`` tokens."""
    s, extra = resolved.window, resolved.extra_tokens(c)
    out = []
    for j, (mode, w) in enumerate(zip(resolved.modes, resolved.tokens)):
        e = int(extra[j])
        if not sliding[j]:
            out.append(LayerResume(False, e, (0, c), 0))
            continue
        k0 = max(0, c - s)
        k1 = {"persist": c, "replay": max(k0, c - min(w, c)), "recompute": k0}.get(mode, c)
        if mode == "recompute":
            k0 = k1 = 0
        start = min(k0 if k1 > k0 else c, c - e)
        out.append(LayerResume(True, e, (k0, k1), start))
    return out


def exact_for_new_tokens(layout: list[LayerResume], window: int, c: int) -> bool:
    """Whether the new tokens get the logits of a full recompute (module docstring: the reach argument).

    Walks down from the top: ``e`` is the first earlier position whose input to the layer above must be
    exact; a sliding layer's new-token keys reach ``window - 1`` further down and must all be there, and
    the positions among them it recomputes need exact inputs from the layer below."""
    e = c
    for lay in reversed(layout):
        if not lay.sliding:
            continue
        need = max(0, e - window + 1)
        if need < lay.key_start:
            return False
        k0, k1 = lay.kept
        # first position in [need, c) that the layer recomputed rather than kept
        first = need if (k1 <= k0 or need < k0) else max(need, k1)
        if first < c:
            e = min(e, first)
    return True


def kept_blocks(layout: list[LayerResume], c: int, page: int) -> list[int]:
    """Pages per layer that hold kept KV of the earlier ``c`` tokens (what the policy must store per sequence)."""
    out = []
    for lay in layout:
        k0, k1 = lay.kept
        out.append(0 if k1 <= k0 else -(-k1 // page) - k0 // page)
    return out


@dataclass
class PreparedStep:
    """A step's host-side work for ``SWAReplay.run``: the extended batch, per layer (rows or None, view), output rows."""

    batch: ForwardBatch
    views: list
    news: list[SeqInput]
    lays: list
    take: torch.Tensor
    put: torch.Tensor
    rows: int


class SWAReplay:
    """Runs forwards of a model with sliding layers under a ReplayPolicy; counts what it replays.

    ``rows_per_layer`` accumulates rows each layer processed (new + extra), ``extra_rows`` the extra ones
    over all layers: the policy's compute, measured."""

    def __init__(self, spec: ModelSpec, policy: ReplayPolicy | None = None, audit: bool = False):
        self.resolved = (policy or ReplayPolicy()).resolve(spec)
        self.sliding = [k == "sliding" for k in spec.kinds()]
        bad = sorted({k for k in spec.kinds() if k not in ("full", "sliding")})
        if bad:
            raise ValueError(f"model {spec.name!r}: the executor's replay runs full and sliding layers, not {bad}")
        self.window, self.audit = self.resolved.window, audit
        self.rows_per_layer = np.zeros(len(self.sliding), np.int64)
        self.extra_rows = 0

    def layout(self, c: int) -> list[LayerResume]:
        return resume_layout(self.resolved, self.sliding, c)

    # ----------------------------------------------------------------- the forward
    def forward(self, model, seqs: list[SeqInput], earlier: list[list[int]], kv: KVCache,
                replayed: list[int] | None = None) -> torch.Tensor:
        """Final-normed hidden states in the row layout of ``build_forward_batch(seqs)`` (as ``model(batch, kv)``).

        ``earlier[i]``: prefill sequence i's tokens from position 0 (at least up to its chunk's start).
        ``replayed[i]``: leading tokens of its chunk that the scheduler already marked as replayed
        (``ScheduledChunk.replayed``): the sequence resumes at ``context_len + replayed``. The executor runs
        its own policy's rows for that resume point either way (so the plan's replayed rows and the policy's
        agree when the scheduler runs the same policy); the rows of replayed tokens come back as zeros
        (they stop at the deepest layer that needs them: only new tokens have a final hidden state)."""
        prep = self.prepare(seqs, earlier, kv, replayed)
        saved = [drop_unkept(kv, lay, s.block_table, s.context_len)
                 for s, lay in zip(prep.news, prep.lays) if lay and self.audit]
        h = self.run(model, prep, kv)
        for dropped in saved:   # the audit is per resume: a later one (another boundary) finds the pages as the step left them
            restore(kv, dropped)
        return h

    def prepare(self, seqs: list[SeqInput], earlier: list[list[int]], kv: KVCache,
                replayed: list[int] | None = None) -> "PreparedStep":
        """The host side of ``forward``: the extended batch and every layer's view, copied to the device up front
        (a host-to-device copy waits for the queued kernels: made between layers, it would stall each one)."""
        nd = sum(s.is_decode for s in seqs)
        replayed = replayed or [0] * (len(seqs) - nd)
        news = [SeqInput(s.token_ids[r:], s.context_len + r, s.block_table, False) for s, r in zip(seqs[nd:], replayed)]
        ext, lays = list(seqs[:nd]), []
        for s, toks in zip(news, earlier):
            c = s.context_len
            lay = self.layout(c) if c else None
            e0 = lay[0].extra if lay else 0
            ext.append(SeqInput(list(toks[c - e0: c]) + list(s.token_ids), c - e0, s.block_table, False))
            lays.append(lay)
        batch = build_forward_batch(ext, kv.page_size, kv.null_page, kv.device)
        views = []
        for j in range(len(self.sliding)):
            idx, view = self._layer_view(batch, lays, news, j, kv.null_page)
            self.rows_per_layer[j] += int(view.positions.shape[0])
            views.append((idx, view))
        take, put, rows = self._plain_rows(batch, seqs[nd:], news, kv.device)
        return PreparedStep(batch, views, news, lays, take, put, rows)

    @staticmethod
    def run(model, prep: "PreparedStep", kv: KVCache) -> torch.Tensor:
        """The device side of ``forward``: embed, each layer on its rows, norm, the new tokens' rows placed (the
        three steps below, which the replay bench also times one by one)."""
        x = SWAReplay.embed(model, prep)
        for j in range(len(prep.views)):
            x = SWAReplay.layer_step(model, prep, kv, j, x)
        return SWAReplay.finish(model, prep, x)

    @staticmethod
    def embed(model, prep: "PreparedStep") -> torch.Tensor:
        """The extended batch's embeddings (every row the step runs)."""
        return model.model.embed_tokens(prep.batch.input_ids)

    @staticmethod
    def layer_step(model, prep: "PreparedStep", kv: KVCache, j: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``j`` on its rows of ``x`` (all of them, or the rows its view selects, put back in place)."""
        idx, view = prep.views[j]
        layer = model.model.layers[j]
        if idx is None:
            return layer(x, view, kv)
        return x.index_copy(0, idx, layer(x.index_select(0, idx), view, kv))

    @staticmethod
    def finish(model, prep: "PreparedStep", x: torch.Tensor) -> torch.Tensor:
        """Final norm and the new tokens' rows placed where ``build_forward_batch`` of the plain chunks puts them."""
        h = model.model.norm(x)
        return h.new_zeros(prep.rows, h.shape[1]).index_copy(0, prep.put, h.index_select(0, prep.take))

    @staticmethod
    def _plain_rows(batch: ForwardBatch, chunks: list[SeqInput], news: list[SeqInput], dev):
        """(rows of the extended batch's decodes and new tokens, where ``build_forward_batch(decodes + chunks)``
        lays them out, its row count)."""
        nd = batch.num_decode_tokens
        src, dst, row = [np.arange(nd)], [np.arange(nd)], nd
        for p, s, n in zip(batch.prefills, chunks, news):
            k = len(n.token_ids)
            src.append(np.arange(p.start + p.num - k, p.start + p.num))
            row += len(s.token_ids)
            dst.append(np.arange(row - k, row))
        return to_device(np.concatenate(src), dev), to_device(np.concatenate(dst), dev), row

    def _layer_view(self, batch: ForwardBatch, lays: list, chunks: list[SeqInput], j: int, null_page: int):
        """(rows of the extended batch layer ``j`` processes or None for all, the batch it sees)."""
        if all(lay is None for lay in lays):
            return None, batch
        keep = [np.arange(batch.num_decode_tokens)]
        slots, no_write = batch.slot_mapping, []
        spans, row = [], batch.num_decode_tokens
        for p, lay, s in zip(batch.prefills, lays, chunks):
            c, n = s.context_len, len(s.token_ids)
            e0 = p.num - n
            lj = lay[j] if lay else None
            e = lj.extra if lj else 0
            rows = np.arange(p.start + e0 - e, p.start + p.num)
            keep.append(rows)
            if lj is not None and e:
                # an extra row writes KV only where this layer did not keep it (kept values are the exact ones);
                # positions from the host-side layout: the extended chunk starts at c - e0
                pos = rows - p.start + (c - e0)
                no_write.append(rows[lj.keeps(pos) & (pos < c)])
            ks = lj.key_start if (lj is not None and lj.sliding) else 0
            spans.append(PrefillSpan(row, e + n, c - e, p.block_table, ks))
            self.extra_rows += e
            row += e + n
        dropped = np.concatenate(no_write) if no_write else np.zeros(0, np.int64)
        if dropped.size:
            slots = slots.clone()
            slots[to_device(dropped.astype(np.int64), slots.device)] = null_page * batch.page_size
        idx_np = np.concatenate(keep)
        if idx_np.size == batch.num_tokens:
            idx = None
            view = ForwardBatch(batch.input_ids, batch.positions, slots, batch.page_size, batch.num_decodes,
                                batch.decode_sq, batch.decode_block_table, batch.decode_seq_lens, spans,
                                batch.decode_seq_lens_host)
            return idx, view
        idx = to_device(idx_np.astype(np.int64), batch.positions.device)   # pinned, non-blocking: no stream sync
        view = ForwardBatch(batch.input_ids.index_select(0, idx), batch.positions.index_select(0, idx),
                            slots.index_select(0, idx), batch.page_size, batch.num_decodes, batch.decode_sq,
                            batch.decode_block_table, batch.decode_seq_lens, spans, batch.decode_seq_lens_host)
        return idx, view


def drop_unkept(kv: KVCache, layout: list[LayerResume], block_table: list[int], c: int) -> list:
    """Overwrite with NaN every earlier position a sliding layer does not keep (the audit of the module docstring).

    Returns what ``restore`` needs to put back the dropped entries the step's extra rows did not rewrite."""
    pos = np.arange(c)
    table = np.asarray(block_table, dtype=np.int64)
    saved = []
    for j, lay in enumerate(layout):
        if not lay.sliding:
            continue
        drop = pos[~lay.keeps(pos)]
        if drop.size == 0:
            continue
        slots = torch.as_tensor(table[drop // kv.page_size] * kv.page_size + drop % kv.page_size, device=kv.device)
        back = torch.as_tensor(drop < c - lay.extra, device=kv.device)   # below the rows: not rewritten
        for cache in (kv.k[j], kv.v[j]):
            flat = cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])
            saved.append((flat, slots[back], flat[slots[back]].clone()))
            flat[slots] = float("nan")
    return saved


def restore(kv: KVCache, saved: list) -> None:
    """Put back the entries ``drop_unkept`` overwrote below the step's rows."""
    for flat, slots, values in saved:
        flat[slots] = values


def finite_pages(kv: KVCache, layer: int, block_table: list[int], c: int) -> int:
    """Pages of the first ``c`` tokens whose KV in ``layer`` is not all NaN (the audit's count of kept pages)."""
    pages = -(-c // kv.page_size)
    k = kv.k[layer].index_select(0, torch.as_tensor(block_table[:pages], device=kv.device))
    tok = torch.isfinite(k.reshape(pages * kv.page_size, -1)).all(dim=1)
    tok[c:] = False   # positions past c in the last page hold nothing of the earlier tokens
    return int(tok.view(pages, kv.page_size).any(dim=1).sum())
