"""The screen's ADP-balance operating points (issue 19: the screen is a filter, not a judge).

Attention-DP instances at long prompts were screened only with every step's prompts spread as a straggler chunk
on one rank, which put DEP8 at ISL 4k far below what the simulator serves (TPOT 79 ms screened at 64 per rank).
Under TensorRT-LLM's ADP balance (``attention_dp.prefill = balance``) a prefill step carries one chunk per rank
and only a share of the steps prefills; the screen now prices those points too, and the planner deploys the
policy of the row it picked.
"""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.moe_load import ExpertLoadSpec
from planner.request import SearchSpace
from planner.screen import ScreenContext, screen_layout
from planner.space import enumerate_layouts
from planner.workload_stats import WorkloadStats
from scheduler.config import AttentionDPConfig

ISL4K = WorkloadStats(mean_prompt=4000.0, mean_output=1000.0, mean_new=4000.0, p90_new=4000.0, hit_fraction=0.0,
                      rate=10.0, mean_context=4500.0)


def _isl4k(spec, rate: float, n: int):
    return spec.model_validate(dict(kind="poisson", rate=rate, num_requests=n, input_len={"kind": "fixed", "value": 4000},
                                    output_len={"kind": "fixed", "value": 1000}))


def _ctx(adp_balance: bool, batch=(64,)) -> ScreenContext:
    return ScreenContext("deepseek-v3", "gb300", ISL4K, ExpertLoadSpec(), batch, (0,), (True,), (4096,), (), None,
                         adp_balance=adp_balance)


def _options(shapes: set[str]):
    space = SearchSpace(modes=("aggregated",), tp=(8,), dep=(8,), two_micro_batch=(False,), eplb=("off",))
    opts, _ = enumerate_layouts(get_model("deepseek-v3"), get_hardware("gb300"), 8, space)
    return [(i, o) for i, o in enumerate(opts) if o.describe() in shapes]


def test_balance_rows_only_for_attention_dp_and_only_when_asked():
    (i_dep, dep), (i_tp, tp) = sorted(_options({"DEP8 fp8", "TP8xEP8 fp8"}), key=lambda io: -io[1].layout.dp)
    on = screen_layout(_ctx(True), i_dep, dep)
    assert on.mix_bal.any() and (~on.mix_bal).any()          # both policies screened for attention DP
    assert not screen_layout(_ctx(False), i_dep, dep).mix_bal.any()
    assert not screen_layout(_ctx(True), i_tp, tp).mix_bal.any()   # one attention rank: nothing to balance


def test_balance_prefills_one_chunk_per_rank_instead_of_a_straggler_every_step():
    (i, dep), = _options({"DEP8 fp8"})
    p = screen_layout(_ctx(True), i, dep)
    imm, bal = np.flatnonzero(~p.mix_bal)[0], np.flatnonzero(p.mix_bal)[0]
    # a 2,048-token straggler chunk on one rank every step (79 ms) against 8 whole prompts, one per rank, every
    # 1 / (0.512 / 8) steps: the mean step is far shorter, so more requests/s at a lower TPOT
    assert p.mix_tpot[bal] < 0.6 * p.mix_tpot[imm]
    assert p.mix_rate[bal] > 1.5 * p.mix_rate[imm]
    # TTFT carries the gathering wait: the first prompt waits for dp - 1 more arrivals, then batching_wait_iters steps
    adp = AttentionDPConfig()
    step = p.mix_tpot[bal]   # (no MTP: TPOT is the mean step)
    assert p.mix_ttft[bal] >= 7 / p.mix_rate[bal] + adp.batching_wait_iters * step
    assert p.mix_ttft[bal] <= adp.timeout_iters * step + 4 * 0.2   # the hold is capped, plus a few prefill steps


def test_balance_point_tracks_the_simulator():
    """One DEP8 instance under ADP balance at 0.9 x the screened rate: the simulated TPOT p90 is the screen's
    within 20%, and the screen's TTFT is not below the simulated one (it is a filter: pessimistic is safe)."""
    from planner.simulate import scheduler_for
    from scheduler.metrics import SLO
    from sim.effects import EffectsSpec
    from sim.runner import simulate
    from sim.scenario import Scenario
    from sim.workload import WorkloadSpec

    (i, dep), = _options({"DEP8 fp8"})
    p = screen_layout(_ctx(True), i, dep)
    bal = np.flatnonzero(p.mix_bal)[0]
    rate = 0.9 * float(p.mix_rate[bal])
    sc = scheduler_for(64, 8, 0, True, 4096, (), explicit=True, balance=True)
    wl = _isl4k(WorkloadSpec, rate, 1500)
    scen = Scenario(name="bal", model="deepseek-v3", hardware="gb300", layout=dep.layout, scheduler=sc, workload=wl,
                    slo=SLO(ttft_s=2.0, tpot_s=0.05), effects=EffectsSpec(expert_load=ExpertLoadSpec()))
    s = simulate(scen).result.metrics.steady
    assert s.tpot_s.p90 == pytest.approx(float(p.mix_tpot[bal]), rel=0.2)
    assert s.ttft_s.p90 <= float(p.mix_ttft[bal])


def test_the_row_picked_carries_its_policy_to_the_slice_and_the_plan():
    from planner.combine import Candidate
    from planner.simulate import build_job
    from scheduler.metrics import SLO
    from sim.effects import EffectsSpec
    from sim.router import RouterConfig
    from sim.workload import WorkloadSpec

    (i, dep), = _options({"DEP8 fp8"})
    wl = _isl4k(WorkloadSpec, 5.0, 100)
    for bal, want in ((True, "balance"), (False, "immediate")):
        cand = Candidate("aggregated", 0, 1, 16, 0, True, 4096, -1, 0, 0, False, 5.0, 500.0, 20.0, 1.0, 0.04, 8, True, 0.0,
                         row=0, adp_balance=bal)
        job = build_job(cand, [dep], model="deepseek-v3", hardware="gb300", workload=wl, slo=SLO(ttft_s=2.0, tpot_s=0.05),
                        seed=0, effects=EffectsSpec(expert_load=ExpertLoadSpec()), router=RouterConfig(), mean_output=1000.0,
                        load=0.9, max_requests=300, acceptance=(), label="c")
        assert job.scenario.scheduler.attention_dp.prefill == want
