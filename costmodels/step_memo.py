"""Memoised decode-step times: a StepCost wrapped so that decode steps are table lookups.

The simulator prices every step through this component (``sim.backend.SimBackend``); what it
memoises, and how it interpolates, is in :class:`MemoStepCost`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from costmodels.batch import decodes_then_chunks


class StepCost(Protocol):
    """The part of ``costmodels`` StepCostModel / EffectiveStepCost the simulator uses."""

    def mixed_step_time(self, new_tokens: np.ndarray, context_lens: np.ndarray, is_decode: np.ndarray) -> float: ...

    def decode_times(self, context_lens: np.ndarray, num_steps: int, draft_len: int = 0) -> np.ndarray: ...


class MemoStepCost:
    """A StepCost whose decode-step times are memoised, where that is exact up to the interpolation below.

    For models whose attention reads every cached token (no top-k indexer, no sliding window,
    one attention-DP rank: DeepSeek-V3 TP8, Qwen3, Llama, ...) a decode step's time depends on
    the requests' contexts only through their sum (checked numerically at construction:
    ``sum_only``). It is then a function of (batch size, mean context), which we tabulate per batch
    size on the grid of mean contexts ``0, g, 2g, ...`` (g = 1 + draft_len), 512 points per
    cost-model call (``decode_times`` is vectorised over steps). Other models, and mixed
    prefill/decode steps, go to the cost model directly.

    The interpolation (every decode price of a sum_only model): with ``u = context_sum / (n * g)``
    the mean context in grid units, ``i = floor(u)`` and ``w = u - i``, the time is
    ``T[i] * (1 - w) + T[i + 1] * w``, linear between grid points one token of mean context apart
    (relative error < 1e-5 against direct calls, checked in tests); the point after a block's last
    is the next block's first. Consecutive steps of one run sit one grid point apart and share
    ``w``. ``decode_times``, ``decode_times_at`` and ``decode_time`` apply it, and so does
    ``sim.backend.SimBackend._decode_run_until``, which walks the blocks inline for speed.
    A k-step plan then costs a table lookup instead of a cost-model call, and steps can be priced
    at any context sums (e.g. those speculative decoding actually reached).
    """

    BLOCK = 512          # grid points per tabulation call
    MAX_BLOCKS = 8192    # memo bound; values never depend on what is memoised, only speed does

    def __init__(self, cost_model: StepCost):
        self.cost_model = cost_model
        if type(self).mixed_step_time is MemoStepCost.mixed_step_time:
            self._chunked = getattr(cost_model, "chunked_step_time", None)
            if getattr(cost_model, "mixed_sum_only", False) and type(self).chunked_step_time is MemoStepCost.chunked_step_time:
                self.chunked_sum = cost_model.chunked_step_time_sum
        self._blocks: dict[tuple[int, int, int], np.ndarray] = {}
        self.sum_only = self._probe()

    def _probe(self) -> bool:
        cm = self.cost_model
        for d in (0, 1):
            for a, b in ((64.0, 4096.0), (1.0, float(2**20)), (1000.0, 3000.0)):
                spread = cm.decode_times(np.array([a, b]), 2, d)
                even = cm.decode_times(np.array([(a + b) / 2] * 2), 2, d)
                if not np.allclose(spread, even, rtol=1e-12, atol=0.0):
                    return False
        return True

    def mixed_step_time(self, new_tokens: np.ndarray, context_lens: np.ndarray, is_decode: np.ndarray) -> float:
        """Device time of one step with prefill chunks (not memoised: chunk shapes rarely repeat)."""
        return float(self.cost_model.mixed_step_time(new_tokens, context_lens, is_decode))

    _chunked = None  # the cost model's chunked_step_time, where it has one and mixed_step_time is not overridden
    # (nd, context sum, draft_len, prefill_new, prefill_ctx) -> the same time, where the contexts matter only
    # through their sum; else None
    chunked_sum = None

    def chunked_step_time(self, decode_context_lens: np.ndarray, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        """``mixed_step_time`` of decodes (1 + draft_len tokens each) followed by prefill chunks, without building arrays."""
        fast = self._chunked
        if fast is not None:
            return float(fast(decode_context_lens, draft_len, prefill_new, prefill_ctx))
        return self.mixed_step_time(*decodes_then_chunks(decode_context_lens, draft_len, prefill_new, prefill_ctx))

    def _block(self, n: int, d: int, b: int) -> np.ndarray:
        key = (n, d, b)
        t = self._blocks.get(key)
        if t is None:
            g = 1 + d
            start = np.full(n, float(b * self.BLOCK * g))
            t = np.asarray(self.cost_model.decode_times(start, self.BLOCK + 1, d), float)
            if len(self._blocks) >= self.MAX_BLOCKS:
                self._blocks.clear()
            self._blocks[key] = t
        return t

    def _table(self, n: int, d: int, lo: int, hi: int) -> tuple[np.ndarray, int]:
        """Table values covering grid indices ``lo .. hi`` (inclusive) and the index of its first entry."""
        B = self.BLOCK
        b0, b1 = lo // B, hi // B
        if b0 == b1:
            return self._block(n, d, b0), b0 * B
        # consecutive blocks share their boundary point
        parts = [self._block(n, d, b)[:-1] for b in range(b0, b1)] + [self._block(n, d, b1)]
        return np.concatenate(parts), b0 * B

    def decode_times_at(self, n: int, draft_len: int, context_sums: np.ndarray) -> np.ndarray:
        """Decode step times of ``n`` requests whose contexts sum to each of ``context_sums`` (sum_only models)."""
        g = 1 + draft_len
        u = np.asarray(context_sums, float) / (n * g)   # mean context in grid units
        i = u.astype(np.int64)
        frac = u - i
        t, first = self._table(n, draft_len, int(i.min()), int(i.max()) + 1)
        j = i - first
        return t[j] * (1.0 - frac) + t[j + 1] * frac

    def decode_time(self, n: int, draft_len: int, context_sum: int) -> float:
        """``decode_times(context_lens, 1, draft_len)[0]`` of ``n`` requests whose contexts sum to ``context_sum`` (sum_only models)."""
        u = context_sum / (n * (1 + draft_len))
        i = int(u)
        frac = u - i
        B = self.BLOCK
        b = i // B
        j = i - b * B
        t = self._block(n, draft_len, b)
        # the grid point after a block's last one is the next block's first (as _table joins them);
        # item(): the same float without a numpy scalar (the simulator prices most decode steps here)
        nxt = t.item(j + 1) if j + 1 < B else self._block(n, draft_len, b + 1).item(0)
        return t.item(j) * (1.0 - frac) + nxt * frac

    def decode_times(self, context_lens: np.ndarray, num_steps: int, draft_len: int = 0) -> np.ndarray:
        """Device times of ``num_steps`` decode steps, contexts growing by 1 + draft_len a step."""
        n = len(context_lens)
        if not self.sum_only or n == 0:
            return np.asarray(self.cost_model.decode_times(context_lens, num_steps, draft_len), float)
        # consecutive steps sit one grid point apart, so they share one interpolation weight
        u = float(np.add.reduce(context_lens)) / (n * (1 + draft_len))
        i = int(u)
        frac = u - i
        t, first = self._table(n, draft_len, i, i + num_steps)
        seg = t[i - first : i - first + num_steps + 1]
        return seg[:-1] * (1.0 - frac) + seg[1:] * frac
