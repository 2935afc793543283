"""Table blocks of steps with prefill are filled 16 points at a time (costmodels/step.py ``_PF_BITS``; issue 19,
planner speed): every point's value is the one a 512-point block gives, bit for bit, and a step's time is the one
the op-by-op evaluation (the fast path's reference) gives to float rounding, as before."""

from __future__ import annotations

import numpy as np
import pytest

import costmodels.step as step
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.moe_load import ExpertLoad, ExpertLoadSpec
from costmodels.step import StepCostModel

CASES = [
    ("deepseek-v3", "gb300", dict(tp=1, dp=16, ep=16, two_micro_batch=True, eplb_redundant_experts=16)),
    ("deepseek-v3", "h200", dict(tp=1, dp=8, ep=8)),
    ("qwen3-235b-a22b", "b200", dict(tp=2, dp=4, ep=8)),
    ("deepseek-v4.1-flash", "b300", dict(tp=1, dp=8, ep=8)),
]


@pytest.mark.parametrize("name,hw,lay", CASES)
def test_small_prefill_blocks_hold_the_values_of_512_point_blocks(name, hw, lay):
    model = get_model(name)
    layout = ParallelLayout(weight_dtype="fp8", expert_dtype="fp8", **lay)
    el = ExpertLoad.initial(ExpertLoadSpec(), model.moe.n_routed_experts, layout.ep, layout.eplb_redundant_experts)
    m = StepCostModel(model, get_hardware(hw), layout, dp_imbalance=1.37, expert_load=el)
    assert step._PF_TBL < step._TBL and step._T_MAIN_PF in step._SMALL and step._T_KV_PF in step._SMALL
    for kind, big_kind in ((step._T_MAIN_PF, step._T_MAIN_PF), (step._T_KV_PF, step._T_KV)):
        for f in (1.0, 0.5):
            for b in (0, 7, 300):   # 512-point block b, and the 16-point blocks covering it
                saved = step._SMALL
                step._SMALL = ()    # this fill as a 512-point block (the tables before the change)
                try:
                    big = m._fill(big_kind, f, 0, b)
                finally:
                    step._SMALL = saved
                k = step._TBL // step._PF_TBL
                small = [m._fill(kind, f, 0, b * k + i) for i in range(k)]
                for col in (0, 1):
                    got = np.array([v for blk in small for v in blk[col]][: step._TBL])
                    want = np.array(big[col][: step._TBL])
                    assert np.array_equal(got.view(np.int64), want.view(np.int64)), (kind, f, b, col)


def test_steps_with_prefill_still_equal_the_op_by_op_reference():
    model, hw = get_model("deepseek-v3"), get_hardware("gb300")
    layout = ParallelLayout(tp=1, dp=16, ep=16, weight_dtype="fp8", expert_dtype="fp8", two_micro_batch=True)
    m = StepCostModel(model, hw, layout, dp_imbalance=1.2)
    rng = np.random.default_rng(5)
    for _ in range(40):
        n = int(rng.integers(1, 60))
        new = np.where(rng.random(n) < 0.7, 1, rng.integers(2, 9000, n)).astype(np.int64)
        new[0] = max(int(new[0]), 2)   # at least one prefill chunk
        ctx = rng.integers(0, 60_000, n).astype(np.int64)
        dec = new == 1
        fast = m.mixed_step_time(new, ctx, dec)
        ref = m._mixed_step_time_reference(new, ctx, dec)
        assert fast == pytest.approx(ref, rel=1e-9)
    assert m._pf_tables and all(k[0] in step._SMALL for k in m._pf_tables)
