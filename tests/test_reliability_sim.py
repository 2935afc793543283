"""Simulator invariants (sim/invariants.py): hold on random scenarios, catch injected faults, run in soaks.

Token conservation, KV within capacity and no block leaked, monotone time, every request
accounted for: checked as the run goes and at its end whenever ``debug`` is on.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from costmodels.layout import ParallelLayout
from scheduler.kv_manager import CountedKV
from sim import invariants
from sim.deployment import simulate_deployment
from sim.disagg import DisaggSpec
from sim.effects import EffectsSpec, ExpertLoadSpec
from sim.runner import simulate
from sim.scenario import Scenario
from twinfer.errors import DoesNotFitError

PROPS = settings(max_examples=25, derandomize=True, deadline=None, database=None, print_blob=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# (model, layout): a small dense model on one GPU, and DeepSeek-V3 on a node with KV kept tight
MODELS = [
    ("llama-3.1-8b", {"tp": 1}),
    ("deepseek-v3", {"tp": 8, "weight_dtype": "fp8"}),
    ("qwen3-30b-a3b", {"tp": 2, "weight_dtype": "fp8"}),
]


@st.composite
def scenarios(draw):
    model, layout = draw(st.sampled_from(MODELS))
    mtp = model == "deepseek-v3"
    draft = draw(st.sampled_from([0, 0, 1, 2])) if mtp else 0
    seqs = draw(st.sampled_from([4, 16, 64]))
    budget = draw(st.sampled_from([256, 1024, 8192]))
    budget = max(budget, seqs * (1 + draft))
    kind = draw(st.sampled_from(["poisson", "gamma", "agentic", "constant"]))
    n = draw(st.integers(5, 60))
    wl = {"kind": kind, "rate": draw(st.sampled_from([0.5, 5.0, 50.0, 500.0])), "num_requests": n,
          "input_len": draw(st.sampled_from([{"kind": "uniform", "min": 1, "max": 3000},
                                             {"kind": "lognormal", "median": 300, "p90": 4000, "min": 1, "max": 20000},
                                             {"kind": "fixed", "value": 1}])),
          "output_len": draw(st.sampled_from([{"kind": "uniform", "min": 1, "max": 400}, {"kind": "fixed", "value": 1},
                                              {"kind": "lognormal", "mean": 200, "sigma": 1.0, "min": 1, "max": 3000}]))}
    if kind == "gamma":
        wl["cv"] = draw(st.sampled_from([0.5, 3.0]))
    if kind == "agentic":
        wl["turns"] = {"kind": "uniform", "min": 1, "max": 5}
        wl["think_time_s"] = {"kind": "fixed", "value": 0.5}
    if draw(st.booleans()):
        wl["shared_prefix_len"] = draw(st.sampled_from([64, 1000]))
        wl["num_prefix_groups"] = draw(st.integers(1, 3))
    if kind != "agentic" and draw(st.booleans()):
        wl["hash_private_blocks"] = True
    if draw(st.booleans()):
        wl["priority_mix"] = {0: 1.0, 1: 2.0}
    scheduler = {
        "max_num_seqs": seqs, "max_num_batched_tokens": budget, "block_size": draw(st.sampled_from([16, 64])),
        "enable_chunked_prefill": draw(st.booleans()), "enable_prefix_caching": draw(st.booleans()),
        "policy": draw(st.sampled_from(["fcfs", "priority"])), "draft_len": draft,
        "async_overlap": draw(st.booleans()), "max_model_len": draw(st.sampled_from([4096, 131072])),
        "long_prefill_threshold": draw(st.sampled_from([0, 512])),
    }
    return {
        "model": model, "hardware": "H200", "layout": layout, "instances": draw(st.integers(1, 3)),
        "router": draw(st.sampled_from(["round_robin", "least_outstanding", "prefix_aware"])),
        "scheduler": scheduler, "workload": wl, "seed": draw(st.integers(0, 3)),
        "max_decode_steps": draw(st.sampled_from([1, 8, 256])),
        # tight KV on DeepSeek-V3 (weights take ~0.6 of each H200): preemption and cache eviction
        "gpu_memory_fraction": draw(st.sampled_from([0.9, 0.7, 0.66])) if model == "deepseek-v3" else 0.9,
    }


@PROPS
@given(data=scenarios())
def test_invariants_hold_on_random_scenarios(data):
    sc = Scenario.model_validate(data)
    try:
        run = simulate(sc, debug=True)  # raises InvariantViolation on any breach
    except DoesNotFitError:
        assume(False)
    m = run.result.metrics
    assert m.requests_finished + m.requests_dropped == len(run.requests) and m.requests_unfinished == 0
    assert run.collector.blocks_leaked == 0
    assert run.collector.tokens_produced == run.collector.tokens_finished == m.output_tokens


def _tight() -> Scenario:
    """DeepSeek-V3 with little KV and bursts of long chats: preemptions and prefix-cache evictions."""
    return Scenario.model_validate({
        "model": "deepseek-v3", "hardware": "H200", "layout": {"tp": 8, "weight_dtype": "fp8"},
        "gpu_memory_fraction": 0.66, "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
        "workload": {"kind": "agentic", "rate": 40.0, "num_requests": 300, "shared_prefix_len": 2048,
                     "num_prefix_groups": 4, "turns": {"kind": "uniform", "min": 2, "max": 6},
                     "think_time_s": {"kind": "fixed", "value": 0.2},
                     "input_len": {"kind": "uniform", "min": 200, "max": 3000},
                     "output_len": {"kind": "uniform", "min": 50, "max": 600}},
        "seed": 3})


def test_a_tight_run_preempts_and_still_keeps_every_invariant():
    run = simulate(_tight(), debug=True)
    m = run.result.metrics
    assert m.preemptions > 0 and m.prefix_cache_hit_rate and m.requests_finished == 300
    assert run.collector.blocks_leaked == 0


def test_a_leaked_block_is_caught(monkeypatch):
    real = CountedKV.free
    leaked = []

    def leaky(self, req):
        if not leaked and req._anon_blocks:
            leaked.append(req.request_id)
            req._anon_blocks -= 1  # one counted block never goes back
        real(self, req)

    monkeypatch.setattr(CountedKV, "free", leaky)
    with pytest.raises(invariants.InvariantViolation, match="leak"):
        simulate(_tight(), debug=True)


def test_a_lost_token_is_caught(monkeypatch):
    real = invariants.CheckingCollector.on_finish

    def short_changed(self, req):
        if self.n_finished == 7:
            req.num_output_tokens -= 1  # as if the scheduler dropped one generated token
        real(self, req)

    monkeypatch.setattr(invariants.CheckingCollector, "on_finish", short_changed)
    with pytest.raises(invariants.InvariantViolation, match="output tokens"):
        simulate(_tight().model_copy(update={"workload": _tight().workload.model_copy(update={"num_requests": 40})}),
                 debug=True)


def test_time_going_backwards_is_caught():
    c = invariants.CheckingCollector()

    class R:
        request_id, arrival_time = "r0", 5.0

    c.on_arrival(R())
    from scheduler.plan import StepPlan, StepResult
    import numpy as np

    plan, res = StepPlan(instance_id=0), StepResult(step_durations=np.array([1.0]), decode_tokens=np.zeros((1, 0)))
    c.on_step(0, 10.0, plan, res, 0, 10)
    c.on_step(0, 10.5, plan, res, 11, 10)  # starts before the previous plan ended, and KV over capacity
    assert any("before its previous plan ended" in v for v in c.violations)
    assert any("outside [0, 10]" in v for v in c.violations)


def test_debug_env_var_turns_the_checks_on(monkeypatch):
    calls = []
    real = invariants.check_end
    monkeypatch.setattr(invariants, "check_end", lambda *a, **k: (calls.append(1), real(*a, **k)))
    sc = _tight().model_copy(update={"workload": _tight().workload.model_copy(update={"num_requests": 20})})
    monkeypatch.setenv(invariants.ENV_VAR, "0")
    simulate(sc)
    assert not calls
    monkeypatch.setenv(invariants.ENV_VAR, "1")
    simulate(sc)
    assert calls == [1]


@pytest.mark.parametrize("how", ["effects", "disagg"])
def test_deployment_runs_check_their_invariants(how):
    base = _tight().model_copy(update={"workload": _tight().workload.model_copy(update={"num_requests": 60})})
    if how == "effects":
        run = simulate_deployment(base.model_copy(update={"layout": ParallelLayout(dp=8, ep=8, weight_dtype="fp8"),
                                                          "gpu_memory_fraction": 0.9}),
                                  effects=EffectsSpec(expert_load=ExpertLoadSpec(zipf_s=1.2), eplb=True, eplb_period_s=5),
                                  debug=True)
    else:
        run = simulate_deployment(base, disagg=DisaggSpec(prefill_layout=ParallelLayout(tp=8, weight_dtype="fp8"),
                                                          prefill_instances=1), debug=True)
    assert run.result.metrics.requests_finished == 60


def _soak_module():
    path = Path(__file__).parent.parent / "benchmarks" / "soak_sim.py"
    spec = importlib.util.spec_from_file_location("soak_sim", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("soak_sim", mod)
    spec.loader.exec_module(mod)
    return mod


def test_a_small_streamed_soak_loses_nothing_and_frees_what_it_dispatched():
    soak = _soak_module()
    r = soak.soak(3000, None, 500, check=True, quiet=True)
    assert (r["completed"], r["lost"], r["invariant_violations"], r["blocks_leaked"]) == (3000, 0, 0, 0)
    assert r["tokens_conserved"]
    # the streamed workload is forward-only: what was dispatched is not kept
    from sim.workload import preset

    reqs = soak.StreamedRequests(preset("chat"), 10, 4, 0, 64)
    assert reqs[0].request_id == "r0" and reqs[5].request_id == "r5"
    with pytest.raises(IndexError):
        reqs[0]
