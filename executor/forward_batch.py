"""The flattened inputs of one forward pass: tokens, positions, KV slots, attention groups.

All tokens of a step (decodes and prefill chunks) run through the dense layers as one
``[T, hidden]`` batch. Attention splits them: the decode group (``B`` sequences of
``s_q = 1 + draft_len`` trailing queries each, laid out first) goes to a paged decode
kernel in one call; each prefill chunk is attended on its own over its gathered KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


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

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes * self.decode_sq

    @property
    def max_decode_len(self) -> int:
        return int(self.decode_seq_lens.max()) if self.num_decodes else 0

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


def build_forward_batch(seqs: list[SeqInput], page_size: int, null_page: int, device: torch.device) -> ForwardBatch:
    """Flatten ``seqs`` (decodes must come first and share one query count)."""
    decodes = [s for s in seqs if s.is_decode]
    assert seqs[: len(decodes)] == decodes, "decode sequences must come first"
    sq = len(decodes[0].token_ids) if decodes else 1
    assert all(len(s.token_ids) == sq for s in decodes), "decode sequences must share s_q"
    ids: list[int] = []
    pos: list[int] = []
    slots: list[np.ndarray] = []
    spans: list[PrefillSpan] = []
    for s in seqs:
        r = range(s.context_len, s.context_len + len(s.token_ids))
        if not s.is_decode:
            spans.append(PrefillSpan(len(ids), len(s.token_ids), s.context_len,
                                     torch.tensor(s.block_table or [null_page], dtype=torch.int32, device=device)))
        ids.extend(s.token_ids)
        pos.extend(r)
        slots.append(_slots(s.block_table, r, page_size, null_page))
    # wide enough for every decode's KV length: MTP draft positions may run past the allocated
    # blocks (their writes land in the null page, see kv_cache), and the kernels index by length
    max_pages = max([len(s.block_table) for s in decodes] + [-(-(s.context_len + sq) // page_size) for s in decodes] + [1])
    table = [s.block_table + [null_page] * (max_pages - len(s.block_table)) for s in decodes]
    as_t = lambda v, dt: torch.tensor(v, dtype=dt, device=device)  # noqa: E731
    return ForwardBatch(
        input_ids=as_t(ids, torch.int64), positions=as_t(pos, torch.int64),
        slot_mapping=torch.from_numpy(np.concatenate(slots) if slots else np.zeros(0, np.int64)).to(device),
        page_size=page_size, num_decodes=len(decodes), decode_sq=sq,
        decode_block_table=as_t(table, torch.int32).view(len(decodes), max_pages),
        decode_seq_lens=as_t([s.context_len + sq for s in decodes], torch.int32),
        prefills=spans,
    )
