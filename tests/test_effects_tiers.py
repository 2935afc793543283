"""Prefix-cache tiers (HBM, host memory, storage): evicted prefixes load back instead of being recomputed."""

from __future__ import annotations

import pytest

from costmodels.layout import ParallelLayout
from scheduler.config import SchedulerConfig
from scheduler.kv_tiers import KVTiers
from sim.deployment import simulate_deployment
from sim.effects import EffectsSpec
from sim.scenario import Scenario
from sim.workload import preset


def test_tiers_are_exclusive_lrus_that_spill_downwards():
    t = KVTiers(host_blocks=2, storage_blocks=2)
    for h in (1, 2, 3, 4, 5):
        t.on_evicted(h)
    assert list(t.host) == [4, 5] and list(t.storage) == [2, 3] and t.dropped == 1
    assert t.match((2, 3, 4, 9), 0, 4) == (1, 2)  # 2, 3 in storage, 4 in host, 9 nowhere: stop
    assert t.match((1, 2), 0, 2) == (0, 0)        # 1 fell off: the prefix is broken at its start
    t.take((2, 3, 4))
    assert t.loaded == [1, 2] and list(t.host) == [5] and not t.storage


def scenario() -> Scenario:
    # a small HBM KV pool (68% of an H200 for weights + KV): agentic sessions get evicted between turns
    # HBM that holds ~3/4 of the agentic prefixes (0.68 before the MTP layer left HBM when no drafts run)
    return Scenario(model="deepseek-v3", hardware="h200", layout=ParallelLayout(tp=8, weight_dtype="fp8"),
                    gpu_memory_fraction=0.66, scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192),
                    workload=preset("agentic", rate=2.0, num_requests=300), seed=0)


def test_a_host_tier_turns_recomputation_into_loads():
    hbm = simulate_deployment(scenario(), EffectsSpec()).result.metrics
    host = simulate_deployment(scenario(), EffectsSpec(host_cache_gb=200)).result.metrics
    storage = simulate_deployment(scenario(), EffectsSpec(storage_cache_gb=1000)).result.metrics
    for m in (hbm, host, storage):
        assert m.requests_finished == 300
    assert hbm.prefix_cache_hit_rate < 0.8 < host.prefix_cache_hit_rate
    assert host.computed_prefill_tokens < 0.75 * hbm.computed_prefill_tokens
    assert host.ttft_s.mean < 0.85 * hbm.ttft_s.mean
    # the same hits from storage load slower (5 GB/s per GPU vs 225 GB/s C2C / 64 GB/s PCIe)
    assert storage.prefix_cache_hit_rate == pytest.approx(host.prefix_cache_hit_rate, abs=0.02)
    assert host.ttft_s.mean <= storage.ttft_s.mean < hbm.ttft_s.mean


def test_no_tiers_no_change():
    a = simulate_deployment(scenario(), EffectsSpec()).result
    b = simulate_deployment(scenario(), EffectsSpec(storage_gbps=1.0)).result  # bandwidth alone changes nothing
    assert a.metrics == b.metrics
