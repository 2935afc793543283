"""Full-scale confirmation skips a lower rate step that cannot beat the confirmed plan (planner.confirm.step_bound),
and spends its run of the budget as before, so the candidates tried after it stay the same."""

from __future__ import annotations

import dataclasses

import pytest

from planner.confirm import CONFIRM_BOUND_MARGIN, CONFIRM_RATE_STEPS, step_bound
from planner.request import PlanRequest
from planner.search import plan_deployment
from sim.workload import preset


def test_step_bound_is_the_margin_over_the_highest_offered_load_seen():
    assert step_bound(1000.0, 1.0, []) == pytest.approx(CONFIRM_BOUND_MARGIN * 1000.0)
    assert step_bound(1000.0, 0.8, []) == pytest.approx(CONFIRM_BOUND_MARGIN * 800.0)
    # a full-scale run above its slice raises the bound (scaled to the step), one below does not lower it
    assert step_bound(1000.0, 0.8, [(1.0, 1100.0)]) == pytest.approx(CONFIRM_BOUND_MARGIN * 880.0)
    assert step_bound(1000.0, 0.8, [(1.0, 900.0)]) == pytest.approx(CONFIRM_BOUND_MARGIN * 800.0)
    # the measured case behind the margin: 72 x GB300 agentic, slice 1,500.7 -> 0.8 step at full scale 1,233.3
    assert 1233.3 < step_bound(1500.7, 0.8, [(1.0, 1491.9)])


def _question():
    return PlanRequest.model_validate(dict(
        model="qwen3-30b-a3b", hardware="h200", gpus=8, workload=preset("chat"), slo={"ttft_s": 2.0, "tpot_s": 0.05},
        simulate_top=3, sim_requests=300))


def test_a_lower_step_that_cannot_beat_the_confirmed_plan_is_not_simulated(monkeypatch):
    """Scripted full-scale runs: the first candidate meets the SLO just above what the second's lower step could
    reach, the second misses at its slice's rate. The second's lower step is skipped; with the bound off it runs
    and loses, so the plan is the same either way."""
    import planner.confirm as confirm
    import planner.search as search

    def scripted(slices: dict):
        calls = []

        def fake(plan, row, table_rate, percentile, slo=None):
            calls.append(row)
            if row not in slices:   # a candidate past those the recording run reached: a miss
                return dataclasses.replace(next(iter(slices.values())), row=row, ttft_s=1e3)
            o = slices[row]
            if len(calls) == 1:   # the first candidate meets, at 95% of the second-best slice
                second = sorted((s.thr_gpu for s in slices.values() if s.thr_gpu < o.thr_gpu), reverse=True)[0]
                return dataclasses.replace(o, thr_gpu=0.95 * second)
            if len(calls) == 2:   # the next misses its TTFT at its slice's rate
                return dataclasses.replace(o, ttft_s=1e3)
            return dataclasses.replace(o, thr_gpu=0.8 * o.thr_gpu)   # the lower step: meets, below the first
        return fake, calls

    # the slices' outcomes, from a run that records them
    seen = {}
    real_make_plan = search._make_plan

    def recording_make_plan(req, cand, options, stats, model, hw, router, effects, o, *a, **k):
        if o is not None:
            seen[cand.row] = o
        return real_make_plan(req, cand, options, stats, model, hw, router, effects, o, *a, **k)

    monkeypatch.setattr(search, "_make_plan", recording_make_plan)
    monkeypatch.setattr(search, "confirm_plan", lambda plan, row, r, p, slo=None: None)
    plan_deployment(_question(), workers=1)
    assert len(seen) >= 2, "the question needs two slice-confirmed candidates"

    results = {}
    for margin in (CONFIRM_BOUND_MARGIN, 1e9):   # 1e9: no step can be ruled out (the code before the bound)
        monkeypatch.setattr(confirm, "CONFIRM_BOUND_MARGIN", margin)
        fake, calls = scripted(dict(seen))
        monkeypatch.setattr(search, "confirm_plan", fake)
        rep = plan_deployment(_question(), workers=1)
        results[margin] = (calls, rep.recommended.predicted.output_tokens_per_s_per_gpu, rep.message)
    skipped, full = results[CONFIRM_BOUND_MARGIN], results[1e9]
    # the second candidate's lower steps (0.8, 0.64) are skipped with the bound: two runs in all; without it its 0.8
    # step runs and loses to the first, and the budget's last run goes to a third candidate, which misses
    assert CONFIRM_RATE_STEPS == (1.0, 0.8, 0.64)
    assert len(skipped[0]) == 2 and full[0][:2] == skipped[0][:2] and len(full[0]) > len(skipped[0])
    assert skipped[1:] == full[1:]
