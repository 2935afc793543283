"""The running decode batch as a struct of arrays: one numpy update per step, not a loop per request."""

from __future__ import annotations

import numpy as np

from scheduler.request import Request


class DecodeBatch:
    """Requests in the decode phase, one row (slot) each, rows ``0 .. n-1`` in plan order.

    ``ctx`` and ``out`` ARE the requests' ``num_computed_tokens`` / ``num_output_tokens`` while they
    are here (the Request properties read through), ``olen`` is their output_len and ``nblk`` the
    number of KV blocks each holds. Removal swaps the last row in, so rows stay dense.
    """

    def __init__(self, capacity: int):
        self.reqs: list[Request] = []
        self.ctx = np.zeros(capacity, np.int64)
        self.out = np.zeros(capacity, np.int64)
        self.olen = np.zeros(capacity, np.int64)
        self.nblk = np.zeros(capacity, np.int64)

    @property
    def n(self) -> int:
        return len(self.reqs)

    def add(self, req: Request) -> None:
        """Append ``req`` as the last row; its counters move into the arrays."""
        slot = len(self.reqs)
        d = req.__dict__
        self.ctx[slot] = d["_num_computed_tokens"]
        self.out[slot] = d["_num_output_tokens"]
        self.olen[slot] = req.output_len
        self.nblk[slot] = len(req.block_ids)
        self.reqs.append(req)
        req._batch, req._slot = self, slot

    def remove(self, req: Request) -> None:
        """Take ``req`` out (its counters move back to the request); the last row fills the hole."""
        slot = req._slot
        d = req.__dict__
        d["_num_computed_tokens"] = int(self.ctx[slot])
        d["_num_output_tokens"] = int(self.out[slot])
        req._batch, req._slot = None, -1
        last = len(self.reqs) - 1
        if slot != last:
            moved = self.reqs[last]
            self.reqs[slot] = moved
            moved._slot = slot
            self.ctx[slot] = self.ctx[last]
            self.out[slot] = self.out[last]
            self.olen[slot] = self.olen[last]
            self.nblk[slot] = self.nblk[last]
        self.reqs.pop()

    def blocks_needed(self, tokens_ahead: int, block_size: int) -> np.ndarray:
        """Extra KV blocks each row needs to hold ``tokens_ahead`` more tokens."""
        n = len(self.reqs)
        need = (self.ctx[:n] + (tokens_ahead + block_size - 1)) // block_size - self.nblk[:n]
        np.maximum(need, 0, out=need)
        return need
