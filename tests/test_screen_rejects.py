"""The screen is a filter, not a judge (issue 19): the layouts it keeps from the simulator must not beat the plan.

Runs ``benchmarks/screen_rejects.check_rejects`` on a small question: the planner's pick, then its screen's
rejects nearest the frontier simulated the way the planner simulates its finalists (slices at the planner's
loads and lower ones), every one beating the winner's slice also at full scale, as the planner confirms its pick.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.screen_rejects import Checked, beats_on_slices, check_rejects, reject_rows
from planner.request import PlanRequest
from sim.workload import preset


@pytest.fixture(scope="module")
def checked():
    req = PlanRequest.model_validate(dict(
        model="qwen3-30b-a3b", hardware="h200", gpus=8, workload=preset("chat"), slo={"ttft_s": 2.0, "tpot_s": 0.05},
        simulate_top=2, sim_requests=300))
    return check_rejects(req, 4, workers=1, confirm=4)   # every reject beating the winner's slice runs at full scale


def test_no_screen_reject_beats_the_plan(checked):
    assert checked.winner is not None and checked.winner.slice_meets
    assert len(checked.checked) == 4 and checked.rejects_considered >= 4
    # a reject meeting the SLO above the winner's slice is run at full scale, and must not beat the plan there
    assert all(x.full_thr_gpu is not None for x in checked.checked if x.row in checked.beats_on_slices)
    assert not checked.beats_full_scale, [(x.label, x.full_thr_gpu, checked.plan_thr_gpu) for x in checked.checked]


def test_a_reject_the_simulator_ranks_higher_is_flagged():
    """The verdict is not vacuous: a reject meeting the SLO on its slice above the winner's is flagged, a faster
    one missing the SLO or a slower one meeting it is not."""
    win = Checked(0, "winner", 500.0, slice_thr_gpu=400.0, slice_meets=True)
    rejects = [Checked(1, "better", 900.0, slice_thr_gpu=450.0, slice_meets=True),
               Checked(2, "misses", 900.0, slice_thr_gpu=800.0, slice_meets=False),
               Checked(3, "worse", 900.0, slice_thr_gpu=350.0, slice_meets=True)]
    assert beats_on_slices(win, rejects) == [1]


def test_rejects_come_from_the_rejects_own_frontier_first():
    """Pareto layers of (throughput, tokens/s per user) over the near-SLO rows not simulated, one per layout choice."""
    from planner.combine import Table
    from planner.space import LayoutOption
    from costmodels.layout import ParallelLayout
    from scheduler.metrics import SLO

    opts = [LayoutOption(ParallelLayout(), (k,), "off", "host", 1, "") for k in range(3)]
    n = 6
    cols = {"mode": np.zeros(n, np.int64), "opt": np.array([0, 0, 1, 1, 2, 2]), "popt": np.full(n, -1),
            "B": np.array([8, 8, 8, 16, 8, 16]), "d": np.zeros(n, np.int64),
            "thr_gpu": np.array([900.0, 850, 300, 400, 100, 200]), "tps_user": np.array([10.0, 12, 50, 20, 30, 5]),
            "rate": np.ones(n), "kv_ok": np.ones(n, bool), "ttft": np.full(n, 0.5), "tpot": np.full(n, 0.01)}
    t = Table(cols)
    rows, near, distinct = reject_rows(t, opts, SLO(ttft_s=2.0, tpot_s=0.05), simulated={0}, n=10)
    # row 1 shares row 0's layout choice (simulated); the others are distinct choices
    assert near == 6 and distinct == 4 and 1 not in rows
    # first layer: 3 (400, 20) and 2 (300, 50), by throughput; then 5 (200, 5) and 4 (100, 30), dominated by them
    assert rows == [3, 2, 5, 4]
    # an E2E target: a row whose screened E2E lower bound exceeds it cannot meet it, whatever the band (the planner's
    # own near rule, search._near_slo); the estimate above the target does not exclude a row
    cols2 = dict(cols, e2e_floor=np.array([5.0, 5, 5, 30, 5, 5]), e2e=np.full(n, 40.0))
    rows2, near2, _ = reject_rows(Table(cols2), opts, SLO(ttft_s=2.0, tpot_s=0.05, e2e_s=20.0), simulated={0}, n=10)
    assert near2 == 5 and 3 not in rows2 and rows2 == [2, 5, 4]
