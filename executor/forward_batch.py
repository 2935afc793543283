"""The flattened inputs of one forward pass: tokens, positions, KV slots, attention groups.

All tokens of a step (decodes and prefill chunks) run through the dense layers as one
``[T, hidden]`` batch. Attention splits them: the decode group (``B`` sequences of
``s_q = 1 + draft_len`` trailing queries each, laid out first) goes to a paged decode
kernel in one call; each prefill chunk is attended on its own over its gathered KV.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels.reference import host_to_device


@dataclass
class SeqInput:
    """One sequence's share of the step."""

    token_ids: list[int]     # tokens whose KV this step computes (queries)
    context_len: int         # tokens already in KV before them
    block_table: list[int]   # scheduler block ids == KV page ids
    is_decode: bool


@dataclass
class PrefillSpan:
    """A prefill chunk's rows in the flat batch and its KV pages."""

    start: int
    num: int
    context_len: int
    block_table: torch.Tensor   # [pages] int32
    # first position whose KV this layer holds for the sequence (sliding-window replay, executor/swa_replay.py)
    key_start: int = 0
    # [kv_len] int64 flat KV slot of each of the sequence's positions 0..kv_len-1 (what a layer gathers its keys at),
    # built on the host with the batch; None: ``ForwardBatch.key_slots`` derives them from the block table once
    key_slots: torch.Tensor | None = None

    @property
    def kv_len(self) -> int:
        return self.context_len + self.num


@dataclass
class ForwardBatch:
    """Device tensors for one forward pass."""

    input_ids: torch.Tensor          # [T] int64
    positions: torch.Tensor          # [T] int64
    slot_mapping: torch.Tensor       # [T] int64 flat KV slots (null page for tokens without a block)
    page_size: int
    num_decodes: int                 # B
    decode_sq: int                   # queries per decode sequence
    decode_block_table: torch.Tensor  # [B, max_pages] int32, padded with the null page
    decode_seq_lens: torch.Tensor    # [B] int32, KV length including this step's queries
    prefills: list[PrefillSpan]
    # the same KV lengths on the host (None: read them back from the device): sizes and sums without a sync
    decode_seq_lens_host: np.ndarray | None = None
    # per-forward values every layer shares (the RoPE rows of this batch's positions), filled on first use
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes * self.decode_sq

    def _decode_lens(self) -> np.ndarray | torch.Tensor:
        """The decodes' KV lengths: the host copy when known (sizes and sums without a device read), else the device's."""
        return self.decode_seq_lens if self.decode_seq_lens_host is None else self.decode_seq_lens_host

    @property
    def max_decode_len(self) -> int:
        return int(self._decode_lens().max()) if self.num_decodes else 0

    @property
    def decode_context_tokens(self) -> int:
        """Sum of the decodes' KV lengths (host values when known: no device read)."""
        return int(self._decode_lens().sum()) if self.num_decodes else 0

    def rope_rows(self, cos_sin: torch.Tensor) -> torch.Tensor:
        """``cos_sin[positions]``, gathered once per forward and table (every layer rotates at the same positions)."""
        key = ("rope", cos_sin.data_ptr(), cos_sin.shape[1])
        rows = self.memo.get(key)
        if rows is None:
            rows = self.memo[key] = cos_sin[self.positions]
        return rows

    def key_slots(self, i: int, page_size: int) -> torch.Tensor:
        """Prefill chunk ``i``'s key slots (``PrefillSpan.key_slots``): as built, or derived from its block table on the
        device once per forward (every layer gathers at the same slots)."""
        p = self.prefills[i]
        if p.key_slots is not None:
            return p.key_slots
        key = ("key_slots", i)
        slots = self.memo.get(key)
        if slots is None:
            pos = torch.arange(p.kv_len, device=p.block_table.device)
            slots = self.memo[key] = p.block_table.long()[pos // page_size] * page_size + pos % page_size
        return slots

    def last_token_rows(self) -> list[int]:
        """Row of each sequence's last query, in batch order (decodes, then prefills)."""
        rows = [(i + 1) * self.decode_sq - 1 for i in range(self.num_decodes)]
        return rows + [p.start + p.num - 1 for p in self.prefills]


def _slots(table: list[int], positions: range, page_size: int, null_page: int) -> np.ndarray:
    """Flat KV slot per position (vectorised: prefill chunks are thousands of tokens)."""
    pos = np.arange(positions.start, positions.stop, dtype=np.int64)
    blk = pos // page_size
    t = np.asarray(table, dtype=np.int64)
    pages = np.where(blk < len(t), t[np.minimum(blk, max(len(t) - 1, 0))] if len(t) else null_page, null_page)
    return pages * page_size + pos % page_size


def to_device(host: np.ndarray, device: torch.device) -> torch.Tensor:
    """One host array on ``device`` without a host stall (``kernels.reference.host_to_device``: pinned memory and a
    non-blocking copy on CUDA), on CPU without a copy."""
    return host_to_device(torch.from_numpy(host), device)


def _decode_rows(decodes: list[SeqInput], sq: int, page_size: int, null_page: int):
    """The decode rows' token ids, positions, KV slots, padded block table and KV lengths, vectorised over the batch
    (a loop per row cost ~5.6 us a row on the host, 0.74 ms at batch 128). The table is wide enough for every
    decode's KV length: MTP draft positions may run past the allocated blocks (their writes land in the null page,
    see kv_cache), and the kernels index by length; a position past a row's blocks maps to the null page."""
    nd = len(decodes)
    ctx = np.fromiter((s.context_len for s in decodes), np.int64, nd)
    n_blk = np.fromiter((len(s.block_table) for s in decodes), np.int64, nd)
    max_pages = int(max(n_blk.max(initial=0), ((ctx + sq + page_size - 1) // page_size).max(initial=0), 1))
    table = np.full((nd, max_pages), null_page, dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(s.block_table for s in decodes), np.int64, int(n_blk.sum()))
    if flat.size:
        rows = np.repeat(np.arange(nd), n_blk)
        table[rows, np.arange(flat.size) - np.repeat(np.cumsum(n_blk) - n_blk, n_blk)] = flat
    p = (ctx[:, None] + np.arange(sq, dtype=np.int64)[None, :])                       # [nd, sq]
    blk = np.minimum(p // page_size, max_pages - 1)    # (never clipped: max_pages covers ctx + sq)
    slot = table[np.arange(nd)[:, None], blk] * page_size + p % page_size
    ids = list(itertools.chain.from_iterable(s.token_ids for s in decodes))
    return ids, [p.reshape(-1)], [slot.reshape(-1)], table, ctx + sq


def build_forward_batch(seqs: list[SeqInput], page_size: int, null_page: int, device: torch.device) -> ForwardBatch:
    """Flatten ``seqs`` (decodes must come first and share one query count).

    All index arrays are built on the host with numpy and packed into one int64 buffer that reaches the device in
    one copy (each prefill chunk's key slots too: every layer gathers its keys at them); the int32 ones (block
    tables, KV lengths) sit at its end and are converted by one cast.
    """
    decodes = [s for s in seqs if s.is_decode]
    assert seqs[: len(decodes)] == decodes, "decode sequences must come first"
    sq = len(decodes[0].token_ids) if decodes else 1
    assert all(len(s.token_ids) == sq for s in decodes), "decode sequences must share s_q"
    nd = len(decodes)
    ids, pos, slots, table, lens = _decode_rows(decodes, sq, page_size, null_page)
    spans: list[tuple[int, int, int, list[int]]] = []   # (start, num, context_len, pages)
    keys: list[np.ndarray] = []                          # each chunk's key slots, positions 0..kv_len-1
    for s in seqs[nd:]:
        r = range(s.context_len, s.context_len + len(s.token_ids))
        spans.append((len(ids), len(s.token_ids), s.context_len, s.block_table or [null_page]))
        ids.extend(s.token_ids)
        pos.append(np.arange(r.start, r.stop, dtype=np.int64))
        keys.append(_slots(s.block_table, range(0, r.stop), page_size, null_page))
        slots.append(keys[-1][s.context_len:])
    max_pages = table.shape[1]
    t = len(ids)
    n_keys = sum(len(k) for k in keys)
    host = np.concatenate([np.asarray(ids, dtype=np.int64), *pos, *slots, *keys, lens, table.reshape(-1),
                           *(np.asarray(p[3], dtype=np.int64) for p in spans)])
    dev = to_device(host, device)
    i32 = dev[3 * t + n_keys:].to(torch.int32)   # KV lengths, decode table, prefill tables
    off, koff = nd + nd * max_pages, 3 * t
    prefills = []
    for (start, num, ctx, pages), k in zip(spans, keys):
        prefills.append(PrefillSpan(start, num, ctx, i32[off: off + len(pages)], key_slots=dev[koff: koff + len(k)]))
        off += len(pages)
        koff += len(k)
    return ForwardBatch(
        input_ids=dev[:t], positions=dev[t: 2 * t], slot_mapping=dev[2 * t: 3 * t],
        page_size=page_size, num_decodes=nd, decode_sq=sq,
        decode_block_table=i32[nd: nd + nd * max_pages].view(nd, max_pages),
        decode_seq_lens=i32[:nd], prefills=prefills, decode_seq_lens_host=lens,
    )


def synthetic_seqs(decode_ctx: list[int], prefills: list[tuple[int, int]], sq: int, vocab: int, page_size: int,
                   seed: int) -> tuple[list[SeqInput], int]:
    """Random-token inputs of a batch shape, for tests and benchmarks that build a forward without the scheduler:
    decodes at ``decode_ctx`` (``sq`` queries each) then prompt chunks ``(new, cached)``, each sequence on its own
    consecutive pages from page 0. Returns the inputs and the number of pages they use."""
    rng = np.random.default_rng(seed)
    seqs, page = [], 0
    for c in decode_ctx:
        n = -(-(c + sq) // page_size)
        seqs.append(SeqInput(rng.integers(0, vocab, sq).tolist(), c, list(range(page, page + n)), True))
        page += n
    for new, ctx in prefills:
        n = -(-(ctx + new) // page_size)
        seqs.append(SeqInput(rng.integers(0, vocab, new).tolist(), ctx, list(range(page, page + n)), False))
        page += n
    return seqs, page
