"""Attention-DP imbalance: the step waits for the busiest DP rank."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.catalog import get_model
from costmodels.effective import EffectiveStepCost
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.step import StepCostModel

V3 = get_model("deepseek-v3")
H200 = get_hardware("h200")
DEP8 = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8")


def batch(n_dec: int, chunks: list[int], ctx: int = 2048):
    new = np.array([1] * n_dec + chunks, np.int64)
    cl = np.array([ctx] * n_dec + [0] * len(chunks), np.int64)
    dec = np.array([True] * n_dec + [False] * len(chunks))
    return new, cl, dec


def test_one_long_chunk_on_one_rank_is_slower_than_the_same_tokens_spread():
    cost = EffectiveStepCost(V3, H200, DEP8)
    one = cost.mixed_step_time(*batch(64, [8192]))
    spread = cost.mixed_step_time(*batch(64, [1024] * 8))
    even = StepCostModel(V3, H200, DEP8).mixed_step_time(*batch(64, [1024] * 8))  # the evenly-spread assumption
    assert cost.dp_imbalance(*batch(64, [8192])) > 4
    assert cost.dp_imbalance(*batch(64, [1024] * 8)) == pytest.approx(1.0, abs=0.02)
    assert one > 2 * spread
    assert spread == pytest.approx(even, rel=0.05)


def test_uneven_decode_counts_wait_for_the_fuller_rank():
    cost = EffectiveStepCost(V3, H200, DEP8)
    assert cost.dp_imbalance(*batch(64, [])) == 1.0
    # 65 requests on 8 ranks: one rank has 9 where the mean is 8.125
    assert cost.dp_imbalance(*batch(65, [])) == pytest.approx(9 / 8.125, abs=0.01)
    t64 = cost.decode_times(np.full(64, 2048.0), 1)[0]
    t65 = cost.decode_times(np.full(65, 2048.0), 1)[0]
    assert t65 > t64


def test_dp1_and_balancing_off_match_the_plain_model():
    tp8 = ParallelLayout(tp=8, weight_dtype="fp8")
    args = batch(64, [8192])
    assert EffectiveStepCost(V3, H200, tp8).mixed_step_time(*args) == pytest.approx(StepCostModel(V3, H200, tp8).mixed_step_time(*args))
    assert EffectiveStepCost(V3, H200, DEP8, dp_balance=False).mixed_step_time(*args) == pytest.approx(
        StepCostModel(V3, H200, DEP8).mixed_step_time(*args))


def test_lpt_fast_path_equals_the_loop():
    cost = EffectiveStepCost(V3, H200, DEP8)
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, m, size = int(rng.integers(0, 30)), int(rng.integers(1, 40)), int(rng.integers(1, 4000))
        new, cl, dec = batch(n, [size] * m)
        cl[:n] = rng.integers(100, 5000, n)
        w = np.zeros(8)
        r = np.arange(n) % 8
        np.add.at(w, r, new[:n] * cost._w_tok + (cl[:n] + new[:n]) * cost._w_kv)
        for i in range(n, n + m):
            k = int(np.argmin(w))
            w[k] += new[i] * cost._w_tok + (cl[i] + new[i]) * cost._w_kv
        assert cost.dp_imbalance(new, cl, dec) == pytest.approx(min(8.0, round(w.max() / w.mean(), 2)))
