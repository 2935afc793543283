"""The running decode batch as a struct of arrays: one numpy update per step, not a loop per request."""

from __future__ import annotations

import heapq

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

    With ``implicit`` (CountedKV without drafts: blocks counted, not named, one token per decode
    per step), the ``room`` column is not kept either. Every decode then holds exactly
    the blocks for its context plus ``ahead`` tokens, ``ceil((ctx + ahead) / block_size)``, where
    ``ahead`` is one number for the whole batch: plans reserve the same tokens ahead for every
    decode, and steps consume them. The blocks k more tokens need then depend only on how many
    decodes have each ``ctx mod block_size``: a histogram of block_size counts (``_hist``, indexed
    by ``-stored ctx mod block_size``), so reserving and trimming cost no array pass. Anything
    that breaks the rule (a request entering with other blocks, a per-slot token count, a write
    to its counters, a read of ``room``) first turns the batch back into an explicit room column
    (``_materialize``), for good.
    """

    def __init__(self, capacity: int, block_size: int, implicit: bool = False):
        self.reqs: list[Request] = []
        self.state = np.zeros((capacity, 4), np.int64)
        self._ctx, self._out, self._left, self._room = self.state.T  # stored columns (views)
        self._flat = self.state.reshape(-1)
        self._sign = np.tile(TOKEN_SIGN, capacity)
        self.shift = 0                        # tokens every slot made that the arrays do not hold yet
        self._min_left: int | None = None     # min of the stored left column over the slots (None: unknown)
        self._ctx_sum = 0                     # sum of the stored ctx column over the slots
        # implicit room (see the class docstring): block size, tokens reserved ahead, ctx residue counts
        self._bs = block_size
        self.implicit = implicit
        self.ahead = 0
        self._hist = [0] * block_size if implicit else []
        # implicit mode also indexes the slots by stored ``left`` (requests per value, and a heap of the
        # values, stale ones skipped), so the first to finish and who finishes cost no array pass
        self._by_left: dict[int, list[Request]] | None = {} if implicit else None
        self._left_heap: list[int] = []
        # bumped whenever a slot's true values or the slot set change (plans read contexts lazily against it)
        self.version = 0

    @property
    def n(self) -> int:
        return len(self.reqs)

    # true-value views of the columns (the pending shift applied first)
    ctx = property(lambda self: self._synced()._ctx)
    out = property(lambda self: self._synced()._out)
    left = property(lambda self: self._synced()._left)

    def _synced(self) -> "DecodeBatch":
        self.sync()
        return self

    @property
    def room(self) -> np.ndarray:
        if self.implicit:
            self._materialize()
        self.sync()
        return self._room

    def _materialize(self) -> None:
        """Leave implicit-room mode: write every slot's room into the column."""
        if not self.implicit:
            return
        n, bs, a, t = len(self.reqs), self._bs, self.ahead, self.shift
        ctx = self._ctx[:n] + t
        self._room[:n] = (ctx + (a + bs - 1)) // bs * bs - ctx + t
        self.implicit = False
        self.ahead = 0
        self._by_left, self._left_heap, self._min_left = None, [], None

    def _between(self, lo: int, hi: int) -> int:
        """Implicit mode: blocks all slots need to go from ``lo`` to ``hi >= lo`` tokens ahead of their contexts."""
        bs = self._bs
        full, rem = divmod(hi - lo, bs)
        total = full * len(self.reqs)
        if rem:
            h = self._hist
            start = (lo + self.shift) % bs
            stop = start + rem
            total += sum(h[start:stop]) if stop <= bs else sum(h[start:]) + sum(h[: stop - bs])
        return total

    def trim_ahead(self) -> int:
        """Implicit mode: drop every slot's blocks reserved ahead of its context; returns how many."""
        a = self.ahead
        self.ahead = 0
        if a >= 0:
            return self._between(0, a) if a else 0
        return -self._between(a, 0)  # (never in practice: plans reserve before they run)

    def sync(self) -> None:
        """Apply the pending shift to the arrays."""
        t = self.shift
        if t:
            if self.implicit:  # residues of -stored ctx move by -t, stored lefts by -t
                r = t % self._bs
                if r:
                    h = self._hist
                    self._hist = h[r:] + h[:r]
                self._by_left = {v - t: rs for v, rs in self._by_left.items()}
                self._left_heap = [v - t for v in self._left_heap]  # a uniform shift keeps the heap order
            n = len(self.reqs)
            m = 4 * n
            self._flat[:m] += self._sign[:m] * t if t != 1 else self._sign[:m]
            self._ctx_sum += n * t
            self.shift = 0
            if self._min_left is not None:
                self._min_left -= t

    def value(self, slot: int, column: int) -> int:
        """True value of ``column`` of ``slot``."""
        return int(self.state[slot, column]) + _SIGNS[column] * self.shift

    def set_value(self, slot: int, column: int, value: int) -> None:
        self.version += 1
        if column == LEFT and self.implicit:
            self._materialize()
        if column == CTX:
            if self.implicit:
                self._materialize()
            self._ctx_sum += value - self.shift - int(self.state[slot, CTX])
        self.state[slot, column] = value - _SIGNS[column] * self.shift
        if column == LEFT:
            self._min_left = None

    def min_left(self) -> int:
        """Fewest output tokens any slot has left (the batch must not be empty)."""
        by_left = self._by_left
        if by_left is not None:
            heap = self._left_heap
            while heap[0] not in by_left:
                heapq.heappop(heap)
            return heap[0] - self.shift
        m = self._min_left
        if m is None:
            m = self._min_left = int(_min(self._left[: len(self.reqs)]))
        return m - self.shift

    def context_lens(self) -> np.ndarray:
        """A copy of the slots' context lengths."""
        n = len(self.reqs)
        t = self.shift
        return self._ctx[:n] + t if t else self._ctx[:n].copy()

    def context_sum(self) -> int:
        """Sum of the slots' context lengths."""
        return self._ctx_sum + len(self.reqs) * self.shift

    def finished_slots(self, n: int) -> list[int]:
        """Slots among the first ``n`` with no output tokens left."""
        by_left = self._by_left
        if by_left is not None and self.min_left() >= 0:
            rs = by_left.get(self.shift)
            if not rs:
                return []
            if len(rs) == 1:
                slot = rs[0]._slot
                return [slot] if slot < n else []
            return sorted(r._slot for r in rs if r._slot < n)
        return (self._left[:n] <= self.shift).nonzero()[0].tolist()

    def add(self, req: Request) -> None:
        """Append ``req`` as the last slot; its counters move into the arrays."""
        slot = len(self.reqs)
        self.version += 1
        ctx, out = req._num_computed_tokens, req._num_output_tokens
        blocks = len(req.block_ids) + req._anon_blocks
        t = self.shift
        left = req.output_len - out + t
        bs = self._bs
        if self.implicit:
            if blocks != -(-(ctx + self.ahead) // bs):
                self._materialize()
            else:
                self._hist[(t - ctx) % bs] += 1
        self.state[slot] = (ctx - t, out - t, left, blocks * bs - ctx + t)
        self._ctx_sum += ctx - t
        by_left = self._by_left
        if by_left is not None:
            rs = by_left.get(left)
            if rs is None:
                by_left[left] = [req]
                heapq.heappush(self._left_heap, left)
            else:
                rs.append(req)
        elif not self.reqs:
            self._min_left = left
        elif self._min_left is not None and left < self._min_left:
            self._min_left = left
        self.reqs.append(req)
        req._batch, req._slot = self, slot

    def remove(self, req: Request) -> None:
        """Take ``req`` out (its counters move back to the request); the last slot fills the hole."""
        slot = req._slot
        self.version += 1
        state = self.state
        ctx, out, left, room = state[slot].tolist()
        t = self.shift
        self._ctx_sum -= ctx
        by_left = self._by_left
        if by_left is not None:
            rs = by_left[left]
            if len(rs) == 1:
                del by_left[left]
            else:
                rs.remove(req)
        elif left == self._min_left:
            self._min_left = None
        ctx += t
        bs = self._bs
        if self.implicit:
            self._hist[(t - ctx) % bs] -= 1
            room = -(-(ctx + self.ahead) // bs) * bs - ctx
        else:
            room -= t
        req._num_computed_tokens = ctx
        req._num_output_tokens = out + t
        # ctx + room is a whole number of blocks: those not named in block_ids are reserved by count
        req._anon_blocks = (ctx + room) // bs - len(req.block_ids)
        req._batch, req._slot = None, -1
        reqs = self.reqs
        moved = reqs.pop()
        if moved is not req:
            reqs[slot] = moved
            moved._slot = slot
            state[slot] = state[len(reqs)]
        if not reqs:
            if by_left is not None:
                self._left_heap = []
            self.shift = 0
            self._min_left = None
            self.ahead = 0

    def add_tokens(self, n: int, tokens: np.ndarray | int) -> None:
        """Slots ``0..n-1`` produced ``tokens`` each (a scalar or one count per slot)."""
        self.version += 1
        if isinstance(tokens, int) and n == len(self.reqs):
            self.shift += tokens
            self.ahead -= tokens
            return
        self._materialize()
        self.sync()
        if isinstance(tokens, int):
            m = 4 * n
            self._flat[:m] += self._sign[:m] if tokens == 1 else self._sign[:m] * tokens
            self._ctx_sum += n * tokens
        else:
            self.state[:n] += tokens[:, None] * TOKEN_SIGN
            self._ctx_sum += int(np.add.reduce(tokens))
        self._min_left = None

    def blocks_needed(self, tokens_ahead: int) -> tuple[np.ndarray, int]:
        """Blocks each slot must add so that its held blocks have room for ``tokens_ahead`` more tokens
        (0 if they do), and their total. Up to one block ahead (``tokens_ahead <= block_size``: every
        step of a plan up to that long) a slot needs 0 or 1 and ``need`` is a bool mask (room >= 0).
        In implicit mode ``need`` is just ``tokens_ahead`` (grow reserves that much for every slot)."""
        if self.implicit:
            a = self.ahead
            return tokens_ahead, (self._between(a, tokens_ahead) if tokens_ahead > a else 0)
        bs = self._bs
        room = self._room[: len(self.reqs)]   # true room = stored - shift
        ahead = tokens_ahead + self.shift
        if tokens_ahead <= bs:
            need = room < ahead
            return need, int(np.count_nonzero(need))
        need = (ahead + bs - 1) - room
        need //= bs
        np.maximum(need, 0, out=need)
        return need, int(np.add.reduce(need))

    def grow(self, need: np.ndarray) -> None:
        """Add the room of ``need[slot]`` blocks to each slot (``need`` as blocks_needed gives it)."""
        if self.implicit:
            if need > self.ahead:
                self.ahead = need
            return
        room = self._room[: need.size]
        if need.dtype == bool:
            room[need] += self._bs
        else:
            room += need * self._bs
