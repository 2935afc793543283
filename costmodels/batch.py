"""The shape of one forward step: what the cost model needs to know about a batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchShape:
    """Per request in the step: tokens computed now and tokens already in KV before them.

    Decode requests have ``new_tokens == 1 + draft_len``; prefill chunks have their chunk
    length. ``is_decode`` tells the two apart (a 1-token prefill chunk is still a prefill).
    """

    new_tokens: np.ndarray     # int64 [n]
    context_lens: np.ndarray   # int64 [n], KV tokens before this step (prefix hits included)
    is_decode: np.ndarray      # bool [n]

    @staticmethod
    def from_lists(new_tokens, context_lens, is_decode) -> "BatchShape":
        return BatchShape(
            np.asarray(new_tokens, dtype=np.int64),
            np.asarray(context_lens, dtype=np.int64),
            np.asarray(is_decode, dtype=bool),
        )

    @staticmethod
    def decode(batch_size: int, context_len: int, draft_len: int = 0) -> "BatchShape":
        """A uniform decode batch: ``batch_size`` requests with ``context_len`` tokens each."""
        return BatchShape(
            np.full(batch_size, 1 + draft_len, np.int64),
            np.full(batch_size, context_len, np.int64),
            np.ones(batch_size, bool),
        )

    @staticmethod
    def prefill(batch_size: int, prompt_len: int, cached_len: int = 0) -> "BatchShape":
        """``batch_size`` prompts of ``prompt_len`` tokens, ``cached_len`` of them prefix hits."""
        return BatchShape(
            np.full(batch_size, prompt_len - cached_len, np.int64),
            np.full(batch_size, cached_len, np.int64),
            np.zeros(batch_size, bool),
        )

    @property
    def num_requests(self) -> int:
        return int(self.new_tokens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.new_tokens.sum())


def decodes_then_chunks(decode_ctx, draft_len: int, prefill_new, prefill_ctx) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(new_tokens, context_lens, is_decode) of decodes verifying ``draft_len`` drafts each (contexts
    ``decode_ctx``), then prefill chunks of ``prefill_new`` tokens on ``prefill_ctx`` cached ones."""
    nd = len(decode_ctx) if decode_ctx is not None else 0
    new = np.empty(nd + len(prefill_new), np.int64)
    ctx = np.empty(new.size, np.int64)
    new[:nd] = 1 + draft_len
    if nd:
        ctx[:nd] = decode_ctx
    new[nd:] = prefill_new
    ctx[nd:] = prefill_ctx
    dec = np.zeros(new.size, bool)
    dec[:nd] = True
    return new, ctx, dec
