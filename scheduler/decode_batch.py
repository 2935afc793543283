"""The running decode batch as a struct of arrays: one numpy update per step, not a loop per request."""

from __future__ import annotations

import numpy as np

from scheduler.request import Request

# columns of DecodeBatch.state, and how one generated token moves each of them
CTX, OUT, LEFT, ROOM = 0, 1, 2, 3
TOKEN_SIGN = np.array([1, 1, -1, -1], np.int64)  # a row: broadcasts over slots
_SIGNS = (1, 1, -1, -1)

_min = np.minimum.reduce


class DecodeBatch:
    """Requests in the decode phase, one row (slot) each, slots ``0 .. n-1`` in plan order.

    Four int64 columns: ``ctx`` and ``out`` ARE the requests' ``num_computed_tokens`` and
    ``num_output_tokens`` while they are here (the Request properties read through), ``left`` is
    output tokens still to generate and ``room`` is free token slots in the KV blocks the request
    already holds. Slots are rows of one array, so the first n slots are one contiguous run of 4n
    numbers and a step moves all four columns with a +1 +1 -1 -1 pattern. Removal moves the last
    slot into the hole, so slots stay dense.

    When every slot made the same number of tokens (a plan without drafts, the common case), the
    arrays are not touched at all: the count goes into ``shift``, and a column's true values are
    its stored ones plus ``shift`` times its sign (+1 for ctx and out, -1 for left and room).
    ``sync()`` folds the shift into the arrays; the ``ctx``/``out``/``left``/``room`` views sync
    first, so readers of those always see true values. The smallest stored ``left`` is kept
    (``_min_left``) so "how many steps until the first decode finishes" costs no array pass.
    """

    def __init__(self, capacity: int):
        self.reqs: list[Request] = []
        self.state = np.zeros((capacity, 4), np.int64)
        self._ctx, self._out, self._left, self._room = self.state.T  # stored columns (views)
        self._flat = self.state.reshape(-1)
        self._sign = np.tile(TOKEN_SIGN, capacity)
        self.shift = 0                        # tokens every slot made that the arrays do not hold yet
        self._min_left: int | None = None     # min of the stored left column over the slots (None: unknown)

    @property
    def n(self) -> int:
        return len(self.reqs)

    # true-value views of the columns (the pending shift applied first)
    @property
    def ctx(self) -> np.ndarray:
        self.sync()
        return self._ctx

    @property
    def out(self) -> np.ndarray:
        self.sync()
        return self._out

    @property
    def left(self) -> np.ndarray:
        self.sync()
        return self._left

    @property
    def room(self) -> np.ndarray:
        self.sync()
        return self._room

    def sync(self) -> None:
        """Apply the pending shift to the arrays."""
        t = self.shift
        if t:
            m = 4 * len(self.reqs)
            self._flat[:m] += self._sign[:m] * t if t != 1 else self._sign[:m]
            self.shift = 0
            if self._min_left is not None:
                self._min_left -= t

    def value(self, slot: int, column: int) -> int:
        """True value of ``column`` of ``slot``."""
        return int(self.state[slot, column]) + _SIGNS[column] * self.shift

    def set_value(self, slot: int, column: int, value: int) -> None:
        self.state[slot, column] = value - _SIGNS[column] * self.shift
        if column == LEFT:
            self._min_left = None

    def min_left(self) -> int:
        """Fewest output tokens any slot has left (the batch must not be empty)."""
        m = self._min_left
        if m is None:
            m = self._min_left = int(_min(self._left[: len(self.reqs)]))
        return m - self.shift

    def context_lens(self) -> np.ndarray:
        """A copy of the slots' context lengths."""
        n = len(self.reqs)
        t = self.shift
        return self._ctx[:n] + t if t else self._ctx[:n].copy()

    def add(self, req: Request, block_size: int) -> None:
        """Append ``req`` as the last slot; its counters move into the arrays."""
        slot = len(self.reqs)
        d = req.__dict__
        ctx, out = d["_num_computed_tokens"], d["_num_output_tokens"]
        blocks = len(req.block_ids) + req._anon_blocks
        t = self.shift
        left = req.output_len - out + t
        self.state[slot] = (ctx - t, out - t, left, blocks * block_size - ctx + t)
        if not self.reqs:
            self._min_left = left
        elif self._min_left is not None and left < self._min_left:
            self._min_left = left
        self.reqs.append(req)
        req._batch, req._slot = self, slot

    def remove(self, req: Request, block_size: int) -> None:
        """Take ``req`` out (its counters move back to the request); the last slot fills the hole."""
        slot = req._slot
        d = req.__dict__
        state = self.state
        ctx, out, left, room = state[slot].tolist()
        t = self.shift
        if left == self._min_left:
            self._min_left = None
        ctx += t
        room -= t
        d["_num_computed_tokens"] = ctx
        d["_num_output_tokens"] = out + t
        # ctx + room is a whole number of blocks: those not named in block_ids are reserved by count
        req._anon_blocks = (ctx + room) // block_size - len(req.block_ids)
        req._batch, req._slot = None, -1
        reqs = self.reqs
        moved = reqs.pop()
        if moved is not req:
            reqs[slot] = moved
            moved._slot = slot
            state[slot] = state[len(reqs)]
        if not reqs:
            self.shift = 0
            self._min_left = None

    def add_tokens(self, n: int, tokens: np.ndarray | int) -> None:
        """Slots ``0..n-1`` produced ``tokens`` each (a scalar or one count per slot)."""
        if isinstance(tokens, int) and n == len(self.reqs):
            self.shift += tokens
            return
        self.sync()
        if isinstance(tokens, int):
            m = 4 * n
            self._flat[:m] += self._sign[:m] if tokens == 1 else self._sign[:m] * tokens
        else:
            self.state[:n] += tokens[:, None] * TOKEN_SIGN
        self._min_left = None

    def blocks_needed(self, tokens_ahead: int, block_size: int) -> tuple[np.ndarray, int]:
        """Blocks each slot must add so that its held blocks have room for ``tokens_ahead`` more tokens
        (0 if they do), and their total. Up to one block ahead (``tokens_ahead <= block_size``: every
        step of a plan up to that long) a slot needs 0 or 1 and ``need`` is a bool mask (room >= 0)."""
        room = self._room[: len(self.reqs)]   # true room = stored - shift
        ahead = tokens_ahead + self.shift
        if tokens_ahead <= block_size:
            need = room < ahead
            return need, int(np.count_nonzero(need))
        need = (ahead + block_size - 1) - room
        need //= block_size
        np.maximum(need, 0, out=need)
        return need, int(np.add.reduce(need))

    def grow(self, need: np.ndarray, block_size: int) -> None:
        """Add the room of ``need[slot]`` blocks to each slot (``need`` as blocks_needed gives it)."""
        room = self._room[: need.size]
        if need.dtype == bool:
            room[need] += block_size
        else:
            room += need * block_size

    def shortfall(self, tokens_ahead: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots whose held blocks lack room for ``tokens_ahead`` more tokens, and by how many tokens."""
        room = self.room[: len(self.reqs)]
        rows = (room < tokens_ahead).nonzero()[0]
        return rows, tokens_ahead - room[rows]
