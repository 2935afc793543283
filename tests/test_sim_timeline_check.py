"""sim.timeline_check: the simulator replaying measured step times (issue 16's timeline-vs-step split)."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodels.calibration import CalibrationProfile
from costmodels.profiled import ProfiledStepCost
from scheduler.config import SchedulerConfig
from scheduler.request import Request
from sim.timeline_check import replay_measured, sample_steps, split_replays
from sim.validate import copy_requests, metric_values, simulate_requests

H200 = Path(__file__).resolve().parents[1] / "profiles" / "h200"
CFG = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=1024, async_overlap=False)


@pytest.fixture(scope="module")
def case():
    cost = ProfiledStepCost(CalibrationProfile.load(H200 / "calibration_deepseek-v3-5layers_fp8.json"))
    reqs = [Request(f"r{i}", 0.02 * i, 300 + 97 * (i % 7), 6 + i % 5) for i in range(20)]
    # the simulator's own steps stand in for a measured replay: nothing measured yet, every step priced and logged
    _, own = replay_measured(cost, CFG, 2000, copy_requests(reqs), [])
    return cost, reqs, own.steps


def test_own_steps_replay_to_the_same_figures(case):
    cost, reqs, steps = case
    plain = metric_values(simulate_requests(cost, CFG, 2000, copy_requests(reqs)))
    m, tr = replay_measured(cost, CFG, 2000, copy_requests(reqs), steps)
    assert tr.divergence is None and tr.matched == len(steps)
    assert metric_values(m) == pytest.approx(plain, rel=1e-12)
    assert any(p > 0 and d > 0 for (d, p, _), _ in steps)   # the case has mixed steps


def test_slower_prefill_steps_move_ttft(case):
    cost, reqs, _ = case
    burst = copy_requests(reqs, 0.0)   # all at once: the schedule does not depend on the step times
    _, own = replay_measured(cost, CFG, 2000, copy_requests(burst), [])
    slow = [(c, t * 1.5 if c[1] else t) for c, t in own.steps]
    base = metric_values(replay_measured(cost, CFG, 2000, copy_requests(burst), own.steps)[0])
    m, tr = replay_measured(cost, CFG, 2000, copy_requests(burst), slow)
    assert tr.divergence is None
    assert metric_values(m)["ttft_p50"] > base["ttft_p50"] * 1.2


def test_a_different_composition_is_where_the_timelines_part(case):
    cost, reqs, steps = case
    k = 7
    (d, p, c), t = steps[k]
    wrong = list(steps)
    wrong[k] = ((d + 1, p, c), t)
    _, tr = replay_measured(cost, CFG, 2000, copy_requests(reqs), wrong)
    assert tr.divergence is not None and tr.divergence.step == k and tr.matched == k
    assert tr.divergence.simulated == (d, p, c) and tr.divergence.measured == (d + 1, p, c)


def test_split_replays_and_sample_columns(case):
    _, _, steps = case
    both = steps + steps
    n = len(steps)
    assert split_replays(both, 2) == [(0, n), (n, 2 * n)]
    assert split_replays(both + steps[:9], 3) == [(0, n), (n, 2 * n), (2 * n, 2 * n + 9)]
    assert split_replays(steps, 1) == [(0, n)]
    cols = {"decodes": [s[0][0] for s in steps], "prefill_tokens": [s[0][1] for s in steps],
            "prefill_chunks": [s[0][2] for s in steps], "measured_s": [s[1] for s in steps]}
    assert sample_steps(cols) == steps


def test_compact_samples_keep_where_the_time_went():
    from sim.validate import StepSample, compact_samples
    s = [StepSample(decode_ctx=[100, 300], prefill=[(64, 0)], measured_s=0.0301234567, predicted_s=0.029,
                    start_s=1.5, runner_s=0.028, device_s=float("nan")),
         StepSample(decode_ctx=[101], prefill=[], measured_s=0.006)]
    cols = compact_samples(s)
    assert cols["measured_s"] == [0.030123, 0.006]
    assert cols["start_s"] == [1.5, None] and cols["runner_s"] == [0.028, None]
    assert cols["device_s"] == [None, None]   # NaN (not timed) is no JSON number
    assert sample_steps(cols) == [((2, 64, 1), 0.030123), ((1, 0, 0), 0.006)]
