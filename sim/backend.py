"""SimBackend: runs a StepPlan in simulated time (cost-model device time, seeded draft acceptance)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from scheduler.plan import StepPlan, StepResult
from sim.host import wall_step_times


class StepCost(Protocol):
    """The part of ``costmodels.step.StepCostModel`` the simulator uses."""

    def mixed_step_time(self, new_tokens: np.ndarray, context_lens: np.ndarray, is_decode: np.ndarray) -> float: ...

    def decode_times(self, context_lens: np.ndarray, num_steps: int, draft_len: int = 0) -> np.ndarray: ...


class MemoStepCost:
    """A StepCost whose decode-step times are memoised, where that is exact.

    For models whose attention reads every cached token (no top-k indexer, no sliding window:
    DeepSeek-V3, Qwen3, Llama, ...) a decode step's time depends on the requests' contexts only
    through their sum (checked numerically at construction, ``sum_only``). Its time is then a
    function of (batch size, mean context), which we tabulate per batch size on the grid of mean
    contexts ``0, g, 2g, ...`` (g = 1 + draft_len, the growth per step), 512 points per cost-model
    call (``decode_times`` is vectorised over steps), and interpolate linearly: the grid is one
    token of mean context apart, where the step time is linear to ~1e-9 relative. A k-step plan
    then costs a slice of the table instead of a cost-model call. Other models, and mixed
    prefill/decode steps, go to the cost model directly.
    """

    BLOCK = 512          # grid points per tabulation call
    MAX_BLOCKS = 8192    # memo bound (values never depend on what is memoised, only speed does)

    def __init__(self, cost_model: StepCost):
        self.cost_model = cost_model
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
        """Device time of one step with prefill chunks (not memoised: chunks rarely repeat)."""
        return self.cost_model.mixed_step_time(new_tokens, context_lens, is_decode)

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

    def decode_times(self, context_lens: np.ndarray, num_steps: int, draft_len: int = 0) -> np.ndarray:
        """Device times of ``num_steps`` decode steps of these requests."""
        n = len(context_lens)
        if not self.sum_only or n == 0:
            return np.asarray(self.cost_model.decode_times(context_lens, num_steps, draft_len), float)
        g = 1 + draft_len
        u = float(context_lens.sum()) / (n * g)   # mean context in grid units
        i = int(u)
        frac = u - i
        B = self.BLOCK
        b0, b1 = i // B, (i + num_steps) // B
        if b0 == b1:
            t = self._block(n, draft_len, b0)
            lo = i - b0 * B
            seg = t[lo : lo + num_steps + 1]
        else:  # blocks share their boundary point
            parts = [self._block(n, draft_len, b0)[i - b0 * B : -1]]
            parts += [self._block(n, draft_len, b)[:-1] for b in range(b0 + 1, b1)]
            parts.append(self._block(n, draft_len, b1)[: i + num_steps - b1 * B + 1])
            seg = np.concatenate(parts)
        return seg[:-1] * (1.0 - frac) + seg[1:] * frac


class SimBackend:
    """The simulator's side of the seam: ``execute(plan) -> StepResult`` without a GPU.

    Device time comes from the cost model (one vectorised call for a k-step decode plan); the
    loop's host overhead is added per the async-overlap policy (sim/host.py); each decode's accepted
    draft tokens are drawn from the seeded generator, one uniform per request and executed step, so
    a k-step plan consumes exactly the random numbers k single steps would.
    """

    def __init__(
        self,
        cost_model: StepCost,
        rng: np.random.Generator,
        acceptance_rates: list[float] | tuple[float, ...] = (),
        async_overlap: bool = True,
    ):
        self.cost_model = cost_model
        self.rng = rng
        # ascending copy of the (non-increasing) marginal acceptance rates: the number of draft
        # positions accepted with uniform u is the number of rates above u
        self._rates_asc = np.sort(np.asarray(acceptance_rates, float))
        self.async_overlap = async_overlap

    def device_times(self, plan: StepPlan) -> np.ndarray:
        """Device seconds of each of the plan's steps."""
        cm = self.cost_model
        nd = len(plan.decodes)
        if not plan.prefills:
            return np.asarray(cm.decode_times(plan.decode_context_lens, plan.num_steps, plan.draft_len), float)
        if plan.num_steps != 1:
            raise ValueError("a plan with prefill chunks runs exactly one step")
        chunks = plan.prefills
        new = np.empty(nd + len(chunks), np.int64)
        ctx = np.empty(nd + len(chunks), np.int64)
        new[:nd] = 1 + plan.draft_len
        ctx[:nd] = plan.decode_context_lens
        new[nd:] = [c.num_new_tokens for c in chunks]
        ctx[nd:] = [c.context_len for c in chunks]
        is_decode = np.zeros(len(new), bool)
        is_decode[:nd] = True
        return np.array([cm.mixed_step_time(new, ctx, is_decode)], float)

    def step_times(self, plan: StepPlan, cold_start: bool = False) -> np.ndarray:
        """Wall seconds of each step: device time plus host overhead under the async policy."""
        return wall_step_times(self.device_times(plan), plan.host_overhead_s, self.async_overlap, cold_start)

    def result(self, plan: StepPlan, step_times: np.ndarray) -> StepResult:
        """The StepResult of running the first ``len(step_times)`` steps of ``plan``."""
        steps, nd = len(step_times), len(plan.decodes)
        d = plan.draft_len
        if d == 0 or nd == 0:
            tokens = np.ones((steps, nd), np.int64)
        else:
            u = self.rng.random((steps, nd))
            rates = self._rates_asc[-d:] if len(self._rates_asc) >= d else self._rates_asc
            accepted = len(rates) - np.searchsorted(rates, u, side="right")
            tokens = 1 + accepted.astype(np.int64)
        return StepResult(step_durations=step_times, decode_tokens=tokens)

    def execute(self, plan: StepPlan, stop_at: float | None = None, start_s: float = 0.0, cold_start: bool = False) -> StepResult:
        """Run ``plan`` from ``start_s``; with ``stop_at``, stop at the first step boundary at/after it."""
        times = self.step_times(plan, cold_start)
        if stop_at is not None and len(times) > 1:
            ends = start_s + np.cumsum(times)
            last = min(int(np.searchsorted(ends, stop_at, side="left")), len(times) - 1)
            times = times[: last + 1]
        return self.result(plan, times)
