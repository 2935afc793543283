"""Multi-step decode gives the results of single steps; arrivals break decode runs at the next step."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from scheduler.config import SchedulerConfig
from scheduler.plan import StepResult
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.backend import SimBackend
from sim.cluster import Cluster
from sim.router import make_router, RouterConfig
from sim.runner import simulate
from sim.scenario import Scenario, builtin_scenario


def scenario(n: int, **sched) -> Scenario:
    data = builtin_scenario().model_dump(mode="json", exclude_none=True)
    data["workload"]["num_requests"] = n
    data["scheduler"].update(sched)
    return Scenario.model_validate(data)


def timings(sc: Scenario, max_steps: int) -> tuple[np.ndarray, object]:
    run = simulate(sc.model_copy(update={"max_decode_steps": max_steps}))
    t = np.array([(r.first_scheduled_time, r.first_token_time, r.finish_time, r.num_preemptions) for r in run.requests], float)
    return t, run.result.metrics


@pytest.mark.parametrize("sched, mem", [
    ({}, 0.9),                                          # the default scenario
    ({"draft_len": 1}, 0.9),                            # MTP: accepted drafts drawn per step, priced at real contexts
    ({"enable_prefix_caching": False}, 0.6),            # KV pressure: ~10k tokens of KV, preemptions happen
])
def test_multi_step_equals_single_step(sched, mem):
    sc = scenario(160, **sched).model_copy(update={"gpu_memory_fraction": mem})
    one, m1 = timings(sc, 1)
    many, mk = timings(sc, 256)
    np.testing.assert_allclose(many, one, rtol=1e-9, atol=1e-9)
    assert m1.num_steps == mk.num_steps and m1.preemptions == mk.preemptions
    assert mk.num_plans < m1.num_plans
    if mem < 0.9:
        assert m1.preemptions > 0


class LinearCost:
    """A decode step of n requests costs 10 ms + 0.1 ms per request; prefills 1 us per token."""

    def decode_times(self, ctx, k, d=0):
        return np.full(k, 0.010 + 1e-4 * len(ctx))

    def mixed_step_time(self, new, ctx, dec):
        return 0.010 + 1e-4 * int(dec.sum()) + 1e-6 * int(new[~dec].sum())


class NullMetrics:
    def __init__(self):
        self.plans = []

    def on_arrival(self, r): pass
    def on_finish(self, r): pass
    def on_drop(self, r): pass

    def on_step(self, iid, start, plan, result, used, total):
        self.plans.append((iid, start, plan.num_steps, result.num_steps))


def run_cluster(reqs, instances=1, router="least_outstanding", max_steps=1000, overlap=True):
    cfg = SchedulerConfig(block_size=16, max_num_seqs=8, max_num_batched_tokens=256, host_step_s=0.0,
                          host_per_request_s=0.0, host_per_token_s=0.0)
    env = simpy.Environment()
    metrics = NullMetrics()
    scheds = [Scheduler(cfg, 1000, i, name_all_blocks=False) for i in range(instances)]
    Cluster(env, scheds, lambda i: SimBackend(LinearCost(), np.random.default_rng(i), async_overlap=overlap),
            make_router(RouterConfig(kind=router)), metrics, reqs, max_steps=max_steps)
    env.run()
    return metrics, env.now


@pytest.mark.parametrize("overlap", [False, True])
def test_arrival_cuts_a_decode_run_at_the_next_step_boundary(overlap):
    long = Request("long", 0.0, 16, 1000)
    late = Request("late", 0.3555, 16, 5)
    metrics, _ = run_cluster([long, late], overlap=overlap)
    # the long request decodes alone in 10.1 ms steps; the late one is admitted at the first boundary after it arrives,
    # or, by a pipelined engine (async overlap: the plan due at that boundary was scheduled a step earlier), the second
    lo = late.arrival_time + (0.0101 if overlap else 0.0)
    assert lo <= late.first_scheduled_time < lo + 0.0102
    cut = [p for p in metrics.plans if p[3] < p[2]]
    assert len(cut) == 1                                 # exactly one run was interrupted
    assert long.finish_time > late.finish_time
    # identical to what single steps give
    long2, late2 = Request("long", 0.0, 16, 1000), Request("late", 0.3555, 16, 5)
    run_cluster([long2, late2], max_steps=1, overlap=overlap)
    assert late2.first_scheduled_time == pytest.approx(late.first_scheduled_time, abs=1e-12)
    assert long2.finish_time == pytest.approx(long.finish_time, abs=1e-9)


def test_arrivals_at_exact_step_boundaries_and_idle_wakeups_are_not_lost():
    reqs = [Request(f"r{i}", 0.0101 * (i // 2) + (5.0 if i > 20 else 0.0), 16, 3) for i in range(30)]
    _, end = run_cluster(reqs, instances=2)
    assert all(r.finish_time is not None for r in reqs)
    assert all(r.first_scheduled_time >= r.arrival_time for r in reqs)
    assert end > 5.0


def test_time_never_goes_backwards_per_instance():
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.exponential(0.02, 200))
    reqs = [Request(f"r{i}", float(t[i]), int(rng.integers(1, 300)), int(rng.integers(1, 50))) for i in range(200)]
    metrics, _ = run_cluster(reqs, instances=3, router="round_robin")
    for iid in range(3):
        starts = [p[1] for p in metrics.plans if p[0] == iid]
        assert starts == sorted(starts)


def test_backend_stop_at_and_host_overlap():
    from scheduler.plan import StepPlan
    from costmodels.host import wall_time as wall_step_times

    dev = np.array([0.010, 0.010, 0.010])
    assert list(wall_step_times(dev, 0.004, False, False)) == pytest.approx([0.014] * 3)
    assert list(wall_step_times(dev, 0.004, True, False)) == pytest.approx([0.010] * 3)
    assert list(wall_step_times(dev, 0.004, True, True)) == pytest.approx([0.014, 0.010, 0.010])
    assert list(wall_step_times(dev, 0.020, True, False)) == pytest.approx([0.020] * 3)  # host-bound

    reqs = [Request("a", 0.0, 16, 100)]
    plan = StepPlan(instance_id=0, decodes=reqs, decode_context_lens=np.array([16]), num_steps=5)
    be = SimBackend(LinearCost(), np.random.default_rng(0))
    assert be.execute(plan).num_steps == 5                                   # 10.1 ms steps
    be.clock = lambda: 1.0
    assert be.execute(plan, stop_at=1.0 + 0.0150).num_steps == 2  # first boundary at/after 15 ms: 20.2 ms
    assert be.execute(plan, stop_at=0.5).num_steps == 1           # already past: one step
    assert be.execute(plan, stop_at=9.0).num_steps == 5


def test_backend_first_step_after_idle_cannot_hide_host_work():
    """With async overlap, a plan that starts when the device is busy until then hides its host work;
    one that starts after an idle gap pays it on its first step (costmodels/host.py, cold_start). The pipelined loop
    (launch by launch) learns of the gap from the instance loop's ``drain``; an overlap that hides only part of the
    host work (not a pipelined loop) from the clock."""
    from scheduler.plan import StepPlan

    plan = StepPlan(instance_id=0, decodes=[Request("a", 0.0, 16, 100)], decode_context_lens=np.array([16]),
                    num_steps=1)
    for hides in (1.0, 0.5):
        be = SimBackend(LinearCost(), np.random.default_rng(0), async_overlap=True, host_coeffs=(0.004, 0.0, 0.0, hides))
        assert be.lead == (hides == 1.0)
        t = [0.0]
        be.clock = lambda: t[0]
        cold = be.execute(plan).step_durations[0]          # first plan: cold
        t[0] = cold                                        # the next plan starts when this one ends: warm
        warm = be.execute(plan).step_durations[0]
        t[0] += warm + 1.0                                 # an idle second later: cold again
        be.drain()
        again = be.execute(plan).step_durations[0]
        assert cold == pytest.approx(warm + 0.004 * hides) and again == pytest.approx(cold, rel=1e-12)


def test_backend_prices_host_work_as_the_scheduler_config_says():
    """The plan carries no host cost: the backend prices it per plan from the config's coefficients
    (per step, per scheduled request, per batched token with drafts, shared by host_workers)."""
    from sim.backend import host_coeffs

    cfg = SchedulerConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=10, draft_len=1, host_workers=2,
                          host_step_s=0.001, host_per_request_s=0.002, host_per_token_s=0.0005)
    s = Scheduler(cfg, 100, name_all_blocks=False)
    s.add_request(Request("a", 0.0, 4, 5))
    p = s.schedule(0.0)
    s.complete(p, StepResult(np.array([0.01])), 0.01)
    s.add_request(Request("b", 0.0, 30, 5))
    p = s.schedule(0.02)   # a decodes (1 + 1 draft tokens), b's first chunk of 8
    assert len(p.decodes) == 1 and [c.num_new_tokens for c in p.prefills] == [8]
    be = SimBackend(LinearCost(), np.random.default_rng(0), (0.5,), host_coeffs=host_coeffs(cfg))
    assert be.host_time(p) == pytest.approx(cfg.host_overhead_s(2, 10)) == pytest.approx(0.001 + (0.004 + 0.005) / 2)
    assert be.execute(p).host_s == be.host_time(p)


def test_backend_cut_plan_draws_as_a_stopped_one():
    """Draft acceptance is counter-based: a plan with drafts cut after it was priced (``cut``), a plan
    stopped there by ``stop_at`` and single-step plans draw the same numbers, also for the plans after."""
    from scheduler.plan import StepPlan

    def plan(k=6):
        reqs = [Request(f"r{i}", 0.0, 16, 100) for i in range(3)]
        return StepPlan(instance_id=0, decodes=reqs, decode_context_lens=np.full(3, 16), num_steps=k, draft_len=2)

    def backend():
        be = SimBackend(LinearCost(), np.random.default_rng(7), (0.8, 0.6))
        t = [0.0]
        be.clock = lambda: t[0]
        return be, t

    a, ta = backend()
    full = a.execute(plan())
    got = a.cut(full, 2)
    assert got.num_steps == 2 and got.decode_tokens.shape == (2, 3)
    np.testing.assert_array_equal(got.decode_tokens, full.decode_tokens[:2])
    b, tb = backend()
    stopped = b.execute(plan(), stop_at=0.015)   # steps of 10.3 ms: the second ends after it
    assert stopped.num_steps == 2
    np.testing.assert_array_equal(stopped.decode_tokens, got.decode_tokens)
    c, tc = backend()
    singles = [c.execute(plan(1)).decode_tokens for _ in range(6)]
    np.testing.assert_array_equal(np.concatenate(singles), full.decode_tokens)
    ta[0] = tb[0] = 1.0
    np.testing.assert_array_equal(a.execute(plan(3)).decode_tokens, b.execute(plan(3)).decode_tokens)
    np.testing.assert_array_equal(a.execute(plan(1)).decode_tokens, singles[5])   # steps 2..4 ran, then step 5
    assert full.decode_tokens.min() >= 1 and full.decode_tokens.max() <= 3 and len(np.unique(full.decode_tokens)) > 1
