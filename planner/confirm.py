"""Confirm a recommendation at full scale: simulate the plan exactly as ``twinfer simulate --plan`` does.

The slices (``planner.simulate``) rank the shortlist; the plan's own figures come from one run
of ``Plan.to_scenario()`` with the plan's request count and seed, read from the steady window
(``SimMetrics.steady``). ``twinfer simulate --plan`` runs the same scenario, so it reports the
same figures (and digest), not merely similar ones. A plan whose full-scale run misses the SLO
is retried at a lower rate, then the next candidate is tried.

A run given the SLO ends as soon as its verdict is certain to be a miss (``planner.slo_miss``; most
of a missing run's cost otherwise goes on requests that cannot change the verdict). Its outcome is
then a miss (``ok`` False) whose ``error`` says when and why it stopped: its figures are partial.
"""

from __future__ import annotations

import dataclasses
import time

from planner.gc_pause import gc_paused
from planner.plan import Plan
from planner.simulate import SimOutcome, outcome_of
from planner.slo_miss import CertainMiss
from scheduler.metrics import SLO
from sim.workload import offered_rate

CONFIRM_CANDIDATES = 3          # slice-confirmed candidates tried at full scale, best first
CONFIRM_RATE_STEPS = (1.0, 0.8, 0.64)  # of the rate the slice met the SLO at
CONFIRM_MAX_RUNS = 4            # full-scale runs at most (an agentic 72-GPU plan's run costs ~35 s CPU)
# A lower rate step of a candidate is skipped when even this margin over its offered load cannot beat the confirmed
# plan: a run meeting the SLO keeps up with its arrivals, so its steady-window throughput is the offered load up to
# arrival noise (72 x GB300 agentic: the 0.8 step of a 1,501 tok/s/GPU slice gave 1,233 at full scale, 2.7% over
# 0.8 x 1,501; the margin allows over five times that).
CONFIRM_BOUND_MARGIN = 1.15
STOPPED_EARLY = "stopped early"   # how a confirmation's error begins when it ended at a certain miss


def confirmation_order(rows: list[int], mirrored: list[bool]) -> list[int]:
    """The first CONFIRM_CANDIDATES of ``rows`` (best slice first) in the order they are confirmed at full scale:
    best first, but at most one mirrored slice (a share of a wide attention-DP instance: optimistic, since the
    mirror copies its prefill chunks to every rank group in lockstep) before the best exact slice.

    Confirming mirrored slices last kept the best layouts from ever running (72 x GB300 ISL 4k aggregated:
    18 x DEP4 at 1,890 tokens/s/GPU recommended while 9 x DEP8 meets the SLO at full scale at 2,662); trying
    them all first could spend every run on misses and recommend nothing (the same question without MTP:
    DEP32 and DEP64 slices met the SLO, their full-scale runs did not, the 18 x TP4 that does never ran).
    So one optimistic candidate gets its rate steps, then the best exact slice is the floor."""
    i = next((k for k, m in enumerate(mirrored) if not m), 0)   # the best exact slice (none: keep the order)
    order = rows if i <= 1 else [rows[0], rows[i]] + rows[1:i] + rows[i + 1:]
    return order[:CONFIRM_CANDIDATES]


def step_bound(slice_thr: float, step: float, full: list[tuple[float, float]]) -> float:
    """The most output tokens/s per GPU a full-scale run at ``step`` x the slice's rate could report (meeting the SLO):
    CONFIRM_BOUND_MARGIN x the offered load, read from the slice (``slice_thr`` at step 1) and from this candidate's
    full-scale runs so far (``full``: (step, tokens/s per GPU) each), scaled to ``step``, whichever is higher."""
    return CONFIRM_BOUND_MARGIN * step * max([slice_thr] + [thr / s for s, thr in full])


def may_stop_early(best_found: bool, step: float, attempts: int) -> bool:
    """Whether a confirmation run may stop at a certain miss without changing what the search does next: its full
    figure is read only by ``step_bound`` for the candidate's lower rate steps once a plan is confirmed, so a run
    may stop when none is yet, or when it is the candidate's last step or the last run of CONFIRM_MAX_RUNS."""
    return not best_found or step == CONFIRM_RATE_STEPS[-1] or attempts >= CONFIRM_MAX_RUNS


def confirm_plan(plan: Plan, row: int, table_rate: float, percentile: int, slo: SLO | None = None) -> SimOutcome | None:
    """The full-scale run of ``plan`` as a SimOutcome (its steady window); None when no request finished.

    With ``slo`` the run stops once it is certain to miss it at ``percentile`` (an open-loop workload: a closed
    loop's arrivals are not known up front); the outcome then is a miss whose ``error`` says why."""
    from sim.runner import scenario_requests, simulate

    t0 = time.perf_counter()
    scenario = plan.to_scenario()
    requests = scenario_requests(scenario) if slo is not None else []
    stop = CertainMiss(requests, slo, percentile, scenario.steady_after_s) if requests else None
    with gc_paused():
        run = simulate(scenario, requests=requests or None, stop=stop)
    result = run.result
    m = result.metrics
    w = m.steady or m.whole_run
    if w is None:
        return None
    rate = offered_rate(plan.workload) or 0.0   # a trace's too: its requests over their arrival span
    # per GPU of the whole plan: a run of part of it (``Plan.run_share``) carries that share of its rate, as a slice does
    o = outcome_of(w, row, rate / table_rate if table_rate > 0 else 1.0, percentile, plan.run_fraction, plan.gpus_used,
                   result.num_requests, float(result.num_gpus), rate, result.digest, time.perf_counter() - t0)
    if run.stopped_at_s is not None:
        o = dataclasses.replace(o, ok=False, error=f"{STOPPED_EARLY} at {run.stopped_at_s:,.0f} s of simulated time, "
                   f"{m.requests_finished:,} of {result.num_requests:,} requests finished (figures partial): {stop.reason}")
    return o
