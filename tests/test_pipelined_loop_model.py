"""The pipelined engine loop (async overlap) in the twin: the per-step prediction is the simulator's overlap rule, and the
one-step admission lag of an engine that schedules the next plan while the device runs the current one."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from costmodels.calibration import CalibrationProfile
from costmodels.profiled import ProfiledStepCost
from costmodels.step_profile import HostTerms, LoopTerms, StepProfile
from scheduler.config import SchedulerConfig
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.backend import SimBackend
from sim.cluster import Cluster
from sim.router import RouterConfig, make_router


def test_per_step_prediction_is_what_the_simulator_charges():
    from costmodels.host import wall_time
    from ui.cmd_validate import predict_step

    st = StepProfile(model="deepseek-v3", num_layers=2, dtype="fp8", device="cuda", host=HostTerms(fixed_s=0.015),
                     loop=LoopTerms(fixed_s=0.001), overlap=0.2)
    prof = CalibrationProfile.default().model_copy(update={"step": st})
    cost = ProfiledStepCost(prof)
    r = cost.chunked_step_time(np.array([300, 400]), 0, [512], [0])
    assert predict_step(cost, prof, [300, 400], [(512, 0)]) == pytest.approx(r + 0.001)
    # a pipelined loop: the runner step as the simulator's backend takes it (sim.backend.loop_cost: max(device, host))
    from sim.backend import loop_cost
    rp = loop_cost(cost, True).chunked_step_time(np.array([300, 400]), 0, [512], [0])
    assert rp == pytest.approx(0.015 + 0.001)   # host-bound: the 15 ms issue plus the loop, the device work under it
    for overlap in (True, 0.5):
        assert predict_step(cost, prof, [300, 400], [(512, 0)], overlap=overlap) == pytest.approx(wall_time(rp, 0.001, overlap))


class _Cost:
    """Every step 10 ms."""

    def decode_times(self, ctx, k, d=0):
        return np.full(k, 0.010)

    def mixed_step_time(self, new, ctx, dec):
        return 0.010


class _Metrics:
    def on_arrival(self, r): pass
    def on_finish(self, r): pass
    def on_drop(self, r): pass
    def on_step(self, *a): pass


def _run(reqs, overlap: bool):
    cfg = SchedulerConfig(block_size=16, max_num_seqs=8, max_num_batched_tokens=256, host_step_s=0.0,
                          host_per_request_s=0.0, host_per_token_s=0.0)
    env = simpy.Environment()
    Cluster(env, [Scheduler(cfg, 1000, 0, name_all_blocks=False)],
            lambda i: SimBackend(_Cost(), np.random.default_rng(i), async_overlap=overlap),
            make_router(RouterConfig(kind="least_outstanding")), _Metrics(), reqs, max_steps=1000)
    env.run()


def test_idle_engine_admits_at_once_and_busy_pipelined_engine_a_step_later():
    # two requests at the same instant on an idle engine: both in its first plan (it starts cold)
    a, b = Request("a", 1.0, 16, 3), Request("b", 1.0, 16, 3)
    _run([a, b], overlap=True)
    assert a.first_scheduled_time == b.first_scheduled_time == pytest.approx(1.0)
    # busy: a request arriving mid-step joins at the second boundary when pipelined, the first when not
    for overlap, lag in ((False, 0), (True, 1)):
        long, late = Request("long", 0.0, 16, 50), Request("late", 0.0451, 16, 3)
        _run([long, late], overlap)
        assert late.first_scheduled_time == pytest.approx(0.05 + 0.01 * lag, abs=1e-9)
    # nothing scheduled behind the step that ends (the engine drains): no lag
    last, after = Request("last", 0.0, 16, 2), Request("after", 0.0151, 16, 2)
    _run([last, after], overlap=True)
    assert after.first_scheduled_time == pytest.approx(0.02, abs=1e-9)


def test_a_request_waiting_out_the_lag_is_queued_where_routers_see_it():
    """The lag holds a request back from the plan, not from the scheduler: its tokens count in the instance's
    outstanding load at once, so least-outstanding routing does not pile arrivals onto a busy pipelined instance."""
    cfg = SchedulerConfig(block_size=16, max_num_seqs=8, max_num_batched_tokens=256, host_step_s=0.0,
                          host_per_request_s=0.0, host_per_token_s=0.0)
    env = simpy.Environment()
    scheds = [Scheduler(cfg, 1000, i, name_all_blocks=False) for i in range(2)]
    reqs = [Request("busy0", 0.0, 16, 40), Request("busy1", 0.0, 16, 40), Request("x", 0.0151, 160, 3),
            Request("y", 0.0152, 16, 3)]
    seen = {}

    class Probe(_Metrics):
        def on_arrival(self, r):
            if r.request_id == "y":
                seen["loads"] = [s.outstanding_tokens for s in scheds]

    Cluster(env, scheds, lambda i: SimBackend(_Cost(), np.random.default_rng(i), async_overlap=True),
            make_router(RouterConfig(kind="least_outstanding")), Probe(), reqs, max_steps=1000)
    env.run()
    # x (160 prompt tokens) went to one instance mid-step and waits out the lag there; y sees that load and goes to the other
    assert max(seen["loads"]) - min(seen["loads"]) >= 160
    assert reqs[2].first_scheduled_time == pytest.approx(0.03, abs=1e-9)
    assert reqs[3].first_scheduled_time == pytest.approx(0.03, abs=1e-9)
    assert all(r.finish_time is not None for r in reqs)
