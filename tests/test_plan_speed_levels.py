"""StepCostModel.at_dp_imbalance (EffectiveStepCost's per-level models copied from the level-1.0 one instead of
built from scratch; issue 19, planner speed) equals a StepCostModel built at that level: same attributes and the
same step times, bit for bit, over layouts with and without attention DP, two micro-batches, MTP, a CED model
and an expert-load model."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.catalog import get_model
from costmodels.effective import EffectiveStepCost
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.moe_load import ExpertLoad, ExpertLoadSpec
from costmodels.step import StepCostModel

CASES = [
    ("deepseek-v3", "gb300", dict(tp=1, dp=16, ep=16, two_micro_batch=True, eplb_redundant_experts=16), True),
    ("deepseek-v3", "h200", dict(tp=1, dp=8, ep=8), False),
    ("deepseek-v3", "h200", dict(tp=8, dp=1, ep=1), False),
    ("qwen3-235b-a22b", "b200", dict(tp=2, dp=4, ep=8), True),
    ("deepseek-v4.1-flash", "b300", dict(tp=1, dp=8, ep=8), False),
]


def _same(a, b, path="") -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), path
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (int, float, str, bool, type(None))):
        assert a == b or (a != a and b != b), (path, a, b)
    else:   # tables, calibration, specs, functions: built by the same code from the same arguments
        assert type(a) is type(b), path


@pytest.mark.parametrize("name,hw,lay,load", CASES)
def test_a_copied_level_equals_a_built_one(name, hw, lay, load):
    model, hardware = get_model(name), get_hardware(hw)
    layout = ParallelLayout(weight_dtype="fp8", expert_dtype="fp8", **lay)
    el = ExpertLoad.initial(ExpertLoadSpec(), model.moe.n_routed_experts, layout.ep, layout.eplb_redundant_experts) \
        if load and model.moe and layout.ep > 1 else None
    base = StepCostModel(model, hardware, layout, dp_imbalance=1.0, expert_load=el)
    rng = np.random.default_rng(7)
    for level in (1.0, 1.01, 1.37, 2.5, float(layout.dp)):
        built = StepCostModel(model, hardware, layout, dp_imbalance=level, expert_load=el)
        copied = base.at_dp_imbalance(level)
        assert vars(built).keys() == vars(copied).keys()
        for k in vars(built):
            if k != "_mla_by_q":   # a memo of level-free tables, shared: compared after the same calls, below
                _same(vars(built)[k], vars(copied)[k], k)
        for n in (1, 5, 64, 300):
            ctx = rng.integers(1, 40_000, n).astype(float)
            for draft in (0, 2):
                assert np.array_equal(built.decode_times(ctx, 7, draft), copied.decode_times(ctx, 7, draft))
            new = np.where(rng.random(n) < 0.8, 1, rng.integers(2, 9000, n))
            dec = new == 1
            c = ctx.astype(np.int64)
            assert built.mixed_step_time(new, c, dec) == copied.mixed_step_time(new, c, dec)
            pn, pc = [int(v) for v in rng.integers(1, 8192, 3)], [int(v) for v in rng.integers(0, 30_000, 3)]
            assert built.chunked_step_time(c, 1, pn, pc) == copied.chunked_step_time(c, 1, pn, pc)
        assert vars(built).keys() == vars(copied).keys()
        for k in ("_tables", "_pf_tables", "_cache", "_mla_by_q"):   # caches filled by the same calls hold the same values
            _same(vars(built)[k], vars(copied)[k], k)
    base.decode_times(np.full(8, 1000.0), 2)
    later = base.at_dp_imbalance(1.5)   # copied after base filled tables: starts with none of them
    assert base._tables and not later._tables and not later._pf_tables and not later._cache and later.notes is not base.notes


def test_effective_step_cost_levels_equal_models_built_at_them():
    model, hw = get_model("deepseek-v3"), get_hardware("gb300")
    layout = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp8", two_micro_batch=True)
    eff = EffectiveStepCost(model, hw, layout)
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(2, 200))
        ctx = rng.integers(100, 60_000, n).astype(float)
        t = eff.decode_times(ctx, 5, 1)
        new, c, dec = np.full(n, 2, np.int64), ctx.astype(np.int64), np.ones(n, bool)
        level = eff.dp_imbalance(new, c, dec)
        ref = StepCostModel(model, hw, layout, dp_imbalance=level).decode_times(ctx, 5, 1)
        assert np.array_equal(t, ref)
    assert len(eff._models) > 3
