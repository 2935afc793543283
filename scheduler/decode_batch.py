"""The running decode batch as a struct of arrays: one numpy update per step, not a loop per request."""

from __future__ import annotations

import numpy as np

from scheduler.request import Request

# columns of DecodeBatch.state, and how one generated token moves each of them
CTX, OUT, LEFT, ROOM = 0, 1, 2, 3
TOKEN_SIGN = np.array([1, 1, -1, -1], np.int64)  # a row: broadcasts over slots


class DecodeBatch:
    """Requests in the decode phase, one row (slot) each, slots ``0 .. n-1`` in plan order.

    ``state`` holds four int64 columns: ``ctx`` and ``out`` ARE the requests' ``num_computed_tokens``
    and ``num_output_tokens`` while they are here (the Request properties read through), ``left``
    is output tokens still to generate and ``room`` is free token slots in the KV blocks the
    request already holds. Keeping them in one array lets a step update all four with one numpy
    operation: slots are rows, so the first n slots are one contiguous run of 4n numbers and a
    step adds a precomputed +1 +1 -1 -1 pattern to it. Removal moves the last slot into the hole,
    so slots stay dense.
    """

    def __init__(self, capacity: int):
        self.reqs: list[Request] = []
        self.state = np.zeros((capacity, 4), np.int64)
        self.ctx, self.out, self.left, self.room = self.state.T  # views, one per column
        self._flat = self.state.reshape(-1)
        self._sign = np.tile(TOKEN_SIGN, capacity)

    @property
    def n(self) -> int:
        return len(self.reqs)

    def add(self, req: Request, block_size: int) -> None:
        """Append ``req`` as the last slot; its counters move into the arrays."""
        slot = len(self.reqs)
        d = req.__dict__
        ctx, out = d["_num_computed_tokens"], d["_num_output_tokens"]
        blocks = len(req.block_ids) + req._anon_blocks
        self.state[slot] = (ctx, out, req.output_len - out, blocks * block_size - ctx)
        self.reqs.append(req)
        req._batch, req._slot = self, slot

    def remove(self, req: Request, block_size: int) -> None:
        """Take ``req`` out (its counters move back to the request); the last slot fills the hole."""
        slot = req._slot
        d = req.__dict__
        state = self.state
        ctx, out, _, room = state[slot].tolist()
        d["_num_computed_tokens"] = ctx
        d["_num_output_tokens"] = out
        # ctx + room is a whole number of blocks: those not named in block_ids are reserved by count
        req._anon_blocks = (ctx + room) // block_size - len(req.block_ids)
        req._batch, req._slot = None, -1
        reqs = self.reqs
        moved = reqs.pop()
        if moved is not req:
            reqs[slot] = moved
            moved._slot = slot
            state[slot] = state[len(reqs)]

    def add_tokens(self, n: int, tokens: np.ndarray | int) -> None:
        """Slots ``0..n-1`` produced ``tokens`` each (a scalar or one count per slot)."""
        if isinstance(tokens, int):
            m = 4 * n
            self._flat[:m] += self._sign[:m] if tokens == 1 else self._sign[:m] * tokens
        else:
            self.state[:n] += tokens[:, None] * TOKEN_SIGN

    def blocks_needed(self, tokens_ahead: int, block_size: int) -> tuple[np.ndarray, int]:
        """Blocks each slot must add so that its held blocks have room for ``tokens_ahead`` more tokens
        (0 if they do), and their total. Up to one block ahead (``tokens_ahead <= block_size``: every
        step of a plan up to that long) a slot needs 0 or 1 and ``need`` is a bool mask (room >= 0)."""
        room = self.room[: len(self.reqs)]
        if tokens_ahead <= block_size:
            need = room < tokens_ahead
            return need, int(np.count_nonzero(need))
        need = (tokens_ahead + block_size - 1) - room
        need //= block_size
        np.maximum(need, 0, out=need)
        return need, int(np.add.reduce(need))

    def grow(self, need: np.ndarray, block_size: int) -> None:
        """Add the room of ``need[slot]`` blocks to each slot (``need`` as blocks_needed gives it)."""
        room = self.room[: need.size]
        if need.dtype == bool:
            room[need] += block_size
        else:
            room += need * block_size

    def shortfall(self, tokens_ahead: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots whose held blocks lack room for ``tokens_ahead`` more tokens, and by how many tokens."""
        room = self.room[: len(self.reqs)]
        rows = (room < tokens_ahead).nonzero()[0]
        return rows, tokens_ahead - room[rows]
