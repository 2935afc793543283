"""Policy search in simulation on a measured profile (twinfer tune)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodels.calibration import CalibrationProfile
from costmodels.profiled import ProfiledStepCost
from planner.tune import default_grid, gain, tune
from scheduler.config import SchedulerConfig
from scheduler.request import Request

H200 = Path(__file__).resolve().parents[1] / "profiles" / "h200"


def test_gain_direction():
    assert gain("output_throughput", 100.0, 150.0) == pytest.approx(0.5)
    assert gain("ttft_p90", 2.0, 1.5) == pytest.approx(0.25)


def test_tune_finds_a_policy_at_least_as_good_as_the_baseline():
    cost = ProfiledStepCost(CalibrationProfile.load(H200 / "calibration_deepseek-v3-5layers_fp8.json"))
    reqs = [Request(f"r{i}", 0.0, 300 + 7 * i, 16) for i in range(40)]
    base = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, async_overlap=False)
    grid = {"max_num_seqs": [8, 32], "max_num_batched_tokens": [1024, 4096], "long_prefill_threshold": [0],
            "async_overlap": [False, True], "draft_len": [0]}
    res = tune(cost, base, 4000, reqs, grid=grid)
    assert res.best.objective >= res.baseline.objective and res.predicted_gain > 0.2  # a bigger batch pays at saturation
    assert res.best.knobs["max_num_seqs"] == 32
    assert len(res.candidates) == 2 * 2 * 2  # every measurable combination, async overlap among them (the executor pipelines)
    assert res.best.knobs["async_overlap"] is True and res.best_predicted_only is None
    # a grid that cannot beat the baseline keeps it (ties go to the baseline)
    same = tune(cost, base, 4000, reqs, grid={"max_num_seqs": [8], "max_num_batched_tokens": [1024], "long_prefill_threshold": [0]})
    assert same.best.knobs == same.baseline.knobs and same.predicted_gain == 0


def test_default_grid_respects_limits():
    g = default_grid(SchedulerConfig(max_num_seqs=16), 64, mtp=True)
    assert max(g["max_num_seqs"]) == 64 and g["draft_len"] == [0, 1, 2] and g["async_overlap"] == [False, True]


def test_committed_h200_tune_result_has_predicted_and_measured_gain():
    doc = json.loads((H200 / "validation_tune_deepseek-v3-5layers_fp8.json").read_text())
    assert doc["measured"]["gain"] > 0 and doc["result"]["predicted_gain"] > 0
    assert doc["measured"]["gain_error_points"] == pytest.approx((doc["result"]["predicted_gain"] - doc["measured"]["gain"]) * 100)
