"""Sliding-window bounded replay: a longer replay window costs prefill compute and saves KV bytes."""

from __future__ import annotations

import numpy as np
import pytest

from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import kv_rates
from costmodels.replay import replay_tradeoff
from costmodels.step import StepCostModel

V4 = get_model("deepseek-v4-flash")


def test_longer_replay_keeps_fewer_window_bytes():
    kv = V4.default_kv_dtype
    full = kv_rates(V4, kv)[1]
    assert full > 1e6  # ~2 MB of window KV per paused sequence (43 layers x 128 entries)
    kept = [replay_tradeoff(V4, kv, w).kept_window_bytes for w in (0, 32, 64, 128)]
    assert kept[0] == pytest.approx(full) and kept[-1] == 0.0
    assert np.all(np.diff(kept) < 0)
    assert kept[1] == pytest.approx(full * (1 - 32 / 128))
    assert replay_tradeoff(V4, kv, 10_000).replay_tokens == V4.sliding_window  # clipped to the window


def test_longer_replay_costs_more_prefill_compute_on_resume():
    hw = get_hardware("b200")
    cost = StepCostModel(V4, hw, ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp4", kv_dtype="fp4"))
    context = 32_768

    def resume(w: int) -> float:
        # 64 sequences resuming at once, each recomputing its last w tokens on top of the cached context
        n = 64
        return cost.mixed_step_time(np.full(n, max(w, 1)), np.full(n, context - w), np.zeros(n, bool))

    times = [resume(w) for w in (1, 32, 128)]
    assert times[0] < times[1] < times[2]
    # bytes kept per paused sequence drop by the KV of the window; compute rises by w prompt tokens each
    saved = replay_tradeoff(V4, V4.default_kv_dtype, 128).saved_bytes
    assert saved > 0


def test_models_without_sliding_windows_have_nothing_to_trade():
    v3 = get_model("deepseek-v3")
    t = replay_tradeoff(v3, "bf16", 128)
    assert (t.window_tokens, t.kept_window_bytes, t.saved_bytes, t.replay_tokens) == (0, 0.0, 0.0, 0)


def test_replay_in_the_simulator_recomputes_the_window_on_every_hit():
    from scheduler.config import SchedulerConfig
    from sim.deployment import simulate_deployment
    from sim.scenario import Scenario
    from sim.workload import preset

    lay = ParallelLayout(tp=1, dp=8, ep=8, weight_dtype="fp8", expert_dtype="fp4", kv_dtype="fp4")
    wl = preset("agentic", rate=4.0, num_requests=150)
    out = {}
    for w in (0, 64, 128):
        sc = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=16384, swa_replay_tokens=w)
        m = simulate_deployment(Scenario(model="deepseek-v4-flash", hardware="b300", layout=lay, scheduler=sc, workload=wl)).result.metrics
        assert m.requests_finished == 150
        out[w] = m
    hits = [out[w].prefix_cache_hit_rate for w in (0, 64, 128)]
    prefill = [out[w].computed_prefill_tokens for w in (0, 64, 128)]
    assert hits[0] > hits[1] > hits[2] > 0.5          # each hit gives back one block per 64 replayed tokens
    assert prefill[0] < prefill[1] < prefill[2]
    n_hits = 150 * 0.8                                # most agentic turns hit the cache
    assert prefill[2] - prefill[0] == pytest.approx(128 * n_hits, rel=0.35)
