"""A full-scale confirmation ends at a certain SLO miss (planner.slo_miss through sim.early_stop) without changing
any verdict or the plan: the same runs with and without the stop give the same verdicts, the passing run the same
digest, and plan_deployment the same plan and figures."""

from __future__ import annotations

import numpy as np
import pytest

import planner.search as search
from planner.confirm import STOPPED_EARLY, confirm_plan
from planner.request import PlanRequest
from planner.search import plan_deployment
from planner.simulate import meets
from planner.slo_miss import CertainMiss
from scheduler.metrics import SLO, Stat
from scheduler.request import Request
from sim.workload import preset


def _question():
    return PlanRequest.model_validate(dict(
        model="qwen3-30b-a3b", hardware="h200", gpus=8, workload=preset("chat"), slo={"ttft_s": 2.0, "tpot_s": 0.05},
        simulate_top=3, sim_requests=300))


@pytest.fixture(scope="module")
def planned():
    req = _question()
    return req, plan_deployment(req, workers=1)


def _at_rate(plan, factor: float):
    return plan.model_copy(update={"workload": plan.workload.model_copy(update={"rate": plan.workload.rate * factor})})


def test_a_passing_run_never_stops_and_a_failing_one_stops_with_the_same_verdict(planned):
    req, rep = planned
    plan = rep.recommended
    assert plan is not None and plan.predicted.sim_digest
    for factor, passes in ((1.0, True), (3.0, False), (6.0, False)):
        p = _at_rate(plan, factor)
        full = confirm_plan(p, 0, p.workload.rate, req.slo_percentile)
        early = confirm_plan(p, 0, p.workload.rate, req.slo_percentile, slo=req.slo)
        assert meets(full, req.slo) is passes and meets(early, req.slo) is passes, factor
        if passes:   # nothing to stop: the very same run
            assert early.digest == full.digest and not early.error
        else:
            assert early.error.startswith(STOPPED_EARLY) and not full.error, early.error
            assert early.digest != full.digest   # partial: fewer requests finished


@pytest.mark.parametrize("steps", [None, (3.0, 1.0)])
def test_the_plan_and_its_figures_are_the_same_without_the_early_stop(planned, monkeypatch, steps):
    """As planned, and with a first rate step of 3x the slice's (a full-scale run that misses, then one that meets)."""
    import planner.confirm as confirm
    req, with_stop = planned
    if steps is not None:
        monkeypatch.setattr(confirm, "CONFIRM_RATE_STEPS", steps)
        monkeypatch.setattr(search, "CONFIRM_RATE_STEPS", steps)
        with_stop = plan_deployment(req, workers=1)
    monkeypatch.setattr(search, "may_stop_early", lambda *a: False)
    without = plan_deployment(req, workers=1)
    a, b = with_stop.recommended, without.recommended
    assert with_stop.message == without.message
    assert a.predicted == b.predicted and a.predicted.sim_digest == b.predicted.sim_digest
    assert a.pools == b.pools and a.workload == b.workload
    # the why lines differ only by what says a rejected run stopped early
    stopped = [w for w in a.why if STOPPED_EARLY in w]
    assert [w for w in a.why if STOPPED_EARLY not in w] == b.why
    assert bool(stopped) is (steps is not None), a.why


def _numpy_p(values: np.ndarray, percentile: int) -> float:
    return getattr(Stat.of(values), f"p{percentile}")


@pytest.mark.parametrize("percentile", [50, 90, 99])
@pytest.mark.parametrize("seed", range(6))
def test_once_it_fires_no_ending_of_the_rest_brings_the_percentile_under_the_target(percentile, seed):
    """Random runs finish in random order; once the stop fires, finish the rest in the kindest way (every other
    request fast, or dropped) and the window's percentile, as scheduler.metrics computes it, is still a miss."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    arrival = np.sort(rng.uniform(0, 100, n))
    ttft = rng.exponential(2.5, n)
    reqs = [Request(f"r{i}", float(a), 10, 3) for i, a in enumerate(arrival)]
    slo = SLO(ttft_s=2.0, tpot_s=1e9)
    stop = CertainMiss(reqs, slo, percentile)
    lo, hi = np.percentile(arrival, (10, 90))
    done = []
    fired = False
    for i in rng.permutation(n).tolist():
        r = reqs[i]
        r.first_token_time = r.arrival_time + float(ttft[i])
        r.finish_time, r.num_output_tokens = r.first_token_time, 1
        done.append(i)
        if stop(r):
            fired = True
            break
    rest = [i for i in range(n) if i not in set(done)]
    for kind in ("fast", "dropped"):
        t = ttft.copy()
        keep = np.ones(n, bool)
        if kind == "fast":
            t[rest] = 0.0
        else:
            keep[rest] = False
        steady = keep & (arrival >= lo) & (arrival < hi)
        p_steady, p_whole = _numpy_p(t[steady], percentile), _numpy_p(t[keep], percentile)
        if fired:
            assert p_steady is None or p_steady > slo.ttft_s, (kind, stop.reason)
            assert p_whole > slo.ttft_s


def test_it_fires_as_soon_as_enough_finished_over_target():
    """25 requests arriving at 0, 1, ..., 24 s: the steady window holds the 19 arriving in [2.4, 21.6) s, whose p90
    is certain over the target once 19 - floor(0.9 * 18) = 3 are (one spare: 4); the whole run's 25 need
    25 - floor(0.9 * 24) + 1 = 5. So the 5th finish over the target stops the run, not the 4th."""
    reqs = [Request(f"r{i}", float(i), 10, 1) for i in range(25)]
    stop = CertainMiss(reqs, SLO(ttft_s=1.0, tpot_s=1.0), 90)
    assert stop.requests == (19, 25) and stop.needed == (4, 5)
    fired = []
    for k, r in enumerate(reqs[3:8]):   # all in the steady window, each 5 s over
        r.first_token_time = r.finish_time = r.arrival_time + 5.0
        r.num_output_tokens = 1
        fired.append(stop(r))
    assert fired == [False, False, False, False, True] and "TTFT" in stop.reason


def test_an_e2e_target_counts_too():
    """An SLO with an end-to-end target misses on it alone (TTFT and TPOT met): `plan --slo ...,e2e_p90=20s` once
    recommended a plan whose E2E p90 was 28.7 s and said it met the SLO. The verdict and the early stop read it."""
    reqs = [Request(f"r{i}", float(i), 10, 101) for i in range(25)]
    slo = SLO(ttft_s=1.0, tpot_s=0.1, e2e_s=5.0)
    stop = CertainMiss(reqs, slo, 90)
    fired = []
    for r in reqs[3:8]:   # first token after 0.5 s, then 100 more at 0.09 s: TTFT and TPOT met, E2E 9.5 s
        r.first_token_time = r.arrival_time + 0.5
        r.finish_time, r.num_output_tokens = r.first_token_time + 9.0, 101
        fired.append(stop(r))
    assert fired == [False, False, False, False, True] and "E2E" in stop.reason and "5 s" in stop.reason
    assert not CertainMiss(reqs, SLO(ttft_s=1.0, tpot_s=0.1), 90)(reqs[3])   # no E2E target: nothing to miss
    from planner.simulate import SimOutcome

    o = SimOutcome(0, 1.0, True, "", 100.0, 10.0, 0.5, 0.09, 1.0, 1.0, 25, 8.0, 1.0, "", 0.0, e2e_s=9.5)
    assert meets(o, SLO(ttft_s=1.0, tpot_s=0.1)) and not meets(o, slo)


def test_a_plan_with_an_e2e_target_meets_it_in_its_run():
    """8 x H200 DeepSeek-V3 chat at ttft_p90=2s,tpot_p90=50ms,e2e_p90=20s: the plan's run meets all three, and the
    reasons say E2E (it recommended one at 28.7 s, the planner checking TTFT and TPOT only)."""
    from sim.runner import simulate

    req = PlanRequest.model_validate(dict(
        model="deepseek-v3", hardware="h200", gpus=8, workload=preset("chat"),
        slo={"ttft_s": 2.0, "tpot_s": 0.05, "e2e_s": 20.0}, simulate_top=6, sim_requests=2500))
    plan = plan_deployment(req, workers=1).recommended
    s = simulate(plan.to_scenario()).result.metrics.steady
    assert s.e2e_s.p90 <= 20.0 and s.ttft_s.p90 <= 2.0 and s.tpot_s.p90 <= 0.05
    line = next(w for w in plan.why if w.startswith("meets the SLO"))
    assert f"E2E {s.e2e_s.p90:.2f} s of 20 s" in line, line


@pytest.mark.parametrize("deployment", [False, True])
def test_the_sim_hook_ends_the_run_at_the_finish_the_predicate_names(deployment):
    """sim.early_stop through both runners (the plain one and sim.deployment): the run ends at the 10th finish,
    leaves the rest unfinished without the end-of-run error, and says when; without a stop nothing changes."""
    from sim.runner import simulate
    from sim.scenario import Scenario, builtin_scenario
    data = builtin_scenario("default").model_dump(mode="json", exclude_none=True)
    data["workload"]["num_requests"] = 60
    scen = Scenario.model_validate(data)
    if deployment:
        scen = scen.model_copy(update={"effects": scen.effects.model_copy(update={"dp_balance": False})})
        assert scen.needs_deployment_runner
    seen = []

    def tenth(req):
        seen.append(req.finish_time)
        return len(seen) == 10

    run = simulate(scen, stop=tenth)
    whole = simulate(scen)
    assert run.stopped_at_s == seen[9] and whole.stopped_at_s is None
    assert 10 <= run.result.metrics.requests_finished < 60 == whole.result.metrics.requests_finished
    assert run.result.simulated_s < whole.result.simulated_s
