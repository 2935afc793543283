"""Confirm a recommendation at full scale: simulate the plan exactly as ``twinfer simulate --plan`` does.

The slices (``planner.simulate``) rank the shortlist; the plan's own figures come from one run
of ``Plan.to_scenario()`` with the plan's request count and seed, read from the steady window
(``SimMetrics.steady``). ``twinfer simulate --plan`` runs the same scenario, so it reports the
same figures (and digest), not merely similar ones. A plan whose full-scale run misses the SLO
is retried at a lower rate, then the next candidate is tried.
"""

from __future__ import annotations

import time

from planner.plan import Plan
from planner.simulate import SimOutcome, outcome_of

CONFIRM_CANDIDATES = 3          # slice-confirmed candidates tried at full scale, best first
CONFIRM_RATE_STEPS = (1.0, 0.8)  # of the rate the slice met the SLO at
CONFIRM_MAX_RUNS = 3            # full-scale runs at most (an agentic 72-GPU plan's run costs ~35 s CPU)


def confirm_plan(plan: Plan, row: int, table_rate: float, percentile: int) -> SimOutcome | None:
    """The full-scale run of ``plan`` as a SimOutcome (its steady window); None when no request finished."""
    from sim.runner import simulate

    t0 = time.perf_counter()
    result = simulate(plan.to_scenario()).result
    m = result.metrics
    w = m.steady or m.whole_run
    if w is None:
        return None
    rate = plan.workload.rate or 0.0
    return outcome_of(w, row, rate / table_rate if table_rate > 0 else 1.0, percentile, 1.0, result.num_gpus,
                      result.num_requests, float(result.num_gpus), rate, result.digest, time.perf_counter() - t0)
