"""Disaggregated pool splits: every split on small budgets, a bounded grid on huge ones (the table was linear in the
budget: a 100,000-GPU plan of DeepSeek-V3 on GB300 ran out of memory past 21 GB)."""

from __future__ import annotations

import numpy as np

from planner.request import PlanRequest
from planner.search import plan_deployment
from sim.workload import preset


def test_small_budgets_try_every_split():
    from planner.combine import _pool_ratios

    for budget, d, p in ((8, 1, 1), (72, 1, 1), (72, 4, 8), (128, 2, 1)):
        assert _pool_ratios(budget, d, p).tolist() == list(range(1, (budget - p) // d + 1))
    assert _pool_ratios(4, 4, 1).size == 0 and _pool_ratios(4, 1, 4).size == 0


def test_huge_budgets_try_a_bounded_grid_dense_at_both_ends():
    from planner.combine import POOL_STEP, _pool_ratios

    budget, d, p = 100_000, 4, 8
    n_d = _pool_ratios(budget, d, p)
    n_p = (budget - n_d * d) // p
    assert n_d.size < 1_000                                   # every split: 24,998
    assert n_d[0] == 1 and n_d[-1] == (budget - p) // d
    assert set(range(1, 33)) <= set(n_p.tolist())             # few prefill instances: each tried
    assert np.all(np.diff(n_d) <= POOL_STEP * n_d[:-1] + 1)   # no gap past one step (and rounding)


def test_a_huge_budget_screens_a_bounded_table():
    def screened(gpus: int) -> int:
        req = PlanRequest.model_validate(dict(model="llama-3.1-8b", hardware="h200", gpus=gpus, workload=preset("chat"),
                                              slo={"ttft_s": 2.0, "tpot_s": 0.05}, simulate_top=0,
                                              space={"modes": ("disaggregated",)}))
        rep = plan_deployment(req, workers=1)
        assert rep.status == "ok"
        return rep.candidates_evaluated

    assert screened(100_000) < 20 * screened(512)             # linear in the budget it was ~200x
