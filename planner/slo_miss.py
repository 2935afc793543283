"""When a full-scale run's SLO verdict is certain to be a miss before the run ends (a ``stop`` for sim.early_stop).

The verdict (``planner.simulate.meets`` on ``confirm_plan``'s window) misses when the run's TTFT, TPOT or (where
the SLO sets one) E2E percentile is above its target. That percentile is numpy's linear interpolation over the N finite values
of the window's finished requests: at sorted index h = floor(q (N - 1)) and the next, so it is above the
target once N - h of the values are. Three facts make counting finishes enough:

- N is at most the window's request count M, known before the run: an open-loop workload's arrivals are
  generated up front, every request ends finished or dropped, and the steady window holds the requests
  arriving between percentiles of all arrivals (``scheduler.metrics.steady_bounds``);
- N - floor(q (N - 1)) never falls as N grows, so M's count is enough for any N <= M;
- a finished request's TTFT, TPOT and E2E are final: later finishes only add values.

The run's window is the steady one unless that turns out empty (it depends on finish times), then the whole
run: the stop waits until both are certain misses. One spare request and a relative 1e-9 on each target
cover rounding in numpy's index and interpolation, so the stop never fires on a run that would pass.
"""

from __future__ import annotations

import math

import numpy as np

from scheduler.metrics import SLO, STEADY_ARRIVAL_PERCENTILES
from scheduler.request import Request

ROUNDING = 1e-9   # relative, on each target (numpy's interpolation can land an ulp or two under its lower value)


def _needed(n: int, percentile: float) -> int:
    """Values above a target that put the ``percentile`` of n values above it, for any n' <= n (plus one spare)."""
    return max(1, n - math.floor(float(np.float64(percentile) / 100 * (n - 1))) + 1)


class CertainMiss:
    """``stop(req)`` for a run of ``requests`` (all of an open-loop run's): True once its verdict against ``slo`` at
    ``percentile`` is certain to be a miss; ``reason`` says why. O(1) per finished request."""

    def __init__(self, requests: list[Request], slo: SLO, percentile: float, steady_after_s: float | None = None):
        arrival = np.array([r.arrival_time for r in requests], float)
        a_lo, a_hi = (np.percentile(arrival, STEADY_ARRIVAL_PERCENTILES).tolist() if arrival.size else (0.0, 0.0))
        if steady_after_s is not None:
            a_lo = float(steady_after_s)
        self.window = (a_lo, a_hi)
        self.requests = (int(((arrival >= a_lo) & (arrival < a_hi)).sum()), int(arrival.size))   # steady, whole run
        self.needed = tuple(_needed(n, percentile) for n in self.requests)
        self.ttft_s, self.tpot_s = slo.ttft_s * (1 + ROUNDING), slo.tpot_s * (1 + ROUNDING)
        self.e2e_s = math.inf if slo.e2e_s is None else slo.e2e_s * (1 + ROUNDING)
        self.slo, self.percentile = slo, percentile
        self.over = [[0, 0, 0], [0, 0, 0]]   # [steady, whole run] x [TTFT, TPOT, E2E] finished above their target
        self.reason = ""

    def __call__(self, req: Request) -> bool:
        first, finish = req.first_token_time, req.finish_time
        if first is None:
            return False   # no TTFT: not among the values
        ttft = first - req.arrival_time > self.ttft_s
        n = req.num_output_tokens
        tpot = finish is not None and n > 1 and (finish - first) / (n - 1) > self.tpot_s
        e2e = finish is not None and finish - req.arrival_time > self.e2e_s
        if not (ttft or tpot or e2e):
            return False
        a_lo, a_hi = self.window
        for w, counts in enumerate(self.over):
            if w == 0 and not (a_lo <= req.arrival_time < a_hi):
                continue
            counts[0] += ttft
            counts[1] += tpot
            counts[2] += e2e
        return self._certain()

    def _certain(self) -> bool:
        """Both windows' verdicts are misses (the reason names the steady window's count)."""
        steady, whole = self.over
        need_s, need_w = self.needed
        if not (max(steady) >= need_s and max(whole) >= need_w):
            return False
        k = next(j for j, c in enumerate(steady) if c >= need_s)
        what, target = (("TTFT", f"{self.slo.ttft_s:g} s"), ("TPOT", f"{self.slo.tpot_s * 1e3:g} ms"),
                        ("E2E", f"{self.slo.e2e_s or 0:g} s"))[k]
        count = steady[k]
        p = f"p{self.percentile:g}"
        self.reason = (f"{count:,} of the steady window's {self.requests[0]:,} requests finished with {what} above "
                       f"{target}: its {what} {p} cannot meet the SLO whatever the rest do")
        return True
