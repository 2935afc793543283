"""Run a Scenario in simulated time: ``run_scenario(scenario) -> SimResult`` (deterministic, digested)."""

from __future__ import annotations

import numpy as np
import numpy.random  # noqa: F401  (numpy loads it lazily: at import time here, not inside the first simulate())
import simpy
from pydantic import BaseModel

from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.calibration_source import profile_for
from costmodels.replay import depth_correction
from costmodels.effective import EffectiveStepCost
from costmodels.host import wall_time
from costmodels.memory import MemoryFit
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.backend import MemoStepCost, SimBackend, host_coeffs
from sim.closed_loop import arrival_source
from sim.cluster import Cluster
from sim import invariants
from sim.export import digest
from scheduler.metrics import MetricsCollector
from sim.deployment import instance_fit, pooled_dp_note, simulate_deployment
from sim.early_stop import StopPredicate, stopped_at, watch
from sim.result import KVInfo, SimResult, SimRun
from sim.router import make_router
from sim.scenario import Scenario, run_seeds
from sim.workload import generate
from twinfer import __version__
from twinfer.errors import TwinferError


def _fit(scenario: Scenario) -> MemoryFit:
    """Memory fit of one instance; raises DoesNotFitError with the numbers if it does not fit (``instance_fit``)."""
    return instance_fit(scenario, scenario.layout, scenario.scheduler, scenario.effects, "layout")


def build_cost_model(scenario: Scenario) -> EffectiveStepCost:
    """The step cost model of one instance of ``scenario`` (StepCostModel plus per-step DP imbalance, expert load, tables)."""
    hw = get_hardware(scenario.hardware)
    return EffectiveStepCost(get_model(scenario.model), hw, scenario.layout, profile_for(hw, scenario.calibration))


def scenario_requests(scenario: Scenario) -> list[Request]:
    """The requests ``simulate`` generates for ``scenario`` (a caller that wants to count them passes them in);
    for a closed loop, an empty list that ``simulate(requests=...)`` fills as its users send."""
    if scenario.workload.kind == "closed":
        return []
    return generate(scenario.workload, np.random.default_rng(run_seeds(scenario)[0]), scenario.scheduler.block_size)


def simulate(scenario: Scenario, *, record_steps: bool = False, requests: list[Request] | None = None,
             debug: bool | None = None, stop: StopPredicate | None = None) -> SimRun:
    """Run ``scenario`` to completion (every request finished or dropped) in the one simpy event loop.

    ``debug`` (default: env TWINFER_DEBUG_INVARIANTS) checks the run's invariants (sim.invariants).
    ``stop`` (sim.early_stop), asked as each request finishes, may end the run there: the result is then
    partial and ``SimRun.stopped_at_s`` says when.
    A scenario with serving effects or a prefill pool runs in ``sim.deployment`` instead.
    """
    if scenario.needs_deployment_runner:
        return simulate_deployment(scenario, record_steps=record_steps, requests=requests, debug=debug, stop=stop)
    fit = _fit(scenario)
    sc = scenario.scheduler
    num_blocks = fit.max_kv_tokens // sc.block_size
    cost = MemoStepCost(build_cost_model(scenario))

    workload_seed, backend_seed = run_seeds(scenario)
    env = simpy.Environment()
    source = arrival_source(env, scenario.workload, np.random.default_rng(workload_seed), sc.block_size, requests)
    rates = sc.effective_acceptance_rates()

    model, hw = get_model(scenario.model), get_hardware(scenario.hardware)
    replay = sc.replay_for(model)   # the sliding-window replay policy in force
    fix = depth_correction(model, hw, scenario.layout, profile_for(hw, scenario.calibration), replay)

    def make_backend(i: int) -> SimBackend:
        return SimBackend(cost, np.random.default_rng([backend_seed, i]), rates, sc.async_overlap,
                          host_coeffs=host_coeffs(sc), replay_correction=fix)

    debug = invariants.enabled(debug)
    collector = (invariants.CheckingCollector if debug else MetricsCollector)(record_steps=record_steps)
    collector = watch(collector, stop, env)
    schedulers = [Scheduler(sc.for_model(model), num_blocks, i, name_all_blocks=False, replay=replay) for i in range(scenario.instances)]
    cluster = Cluster(env, schedulers, make_backend, make_router(scenario.router), source.watch(collector), source.initial,
                      max_steps=scenario.max_decode_steps)
    source.start(cluster.submit)
    env.run()
    requests = source.requests
    end_s = float(env.now)
    stopped = stopped_at(collector)
    stuck = [s for s in schedulers if s.has_work]
    if stuck and stopped is None:  # cannot happen unless a scheduler bug leaves work behind; say so rather than under-count
        raise RuntimeError(f"simulation ended with work queued on instances {[s.instance_id for s in stuck]}")
    if debug and stopped is None:
        invariants.check_end(collector, schedulers, len(requests), end_s)

    metrics = collector.summarize(scenario.num_gpus, scenario.slo, steady_after_s=scenario.steady_after_s)
    result = SimResult(
        name=scenario.name,
        description=scenario.description,
        scenario=scenario.model_dump(mode="json"),
        seed=scenario.seed,
        twinfer_version=__version__,
        num_gpus=scenario.num_gpus,
        kv=KVInfo(block_size=sc.block_size, num_blocks=num_blocks, capacity_tokens=num_blocks * sc.block_size,
                  kv_bytes_per_token_per_gpu=fit.kv_bytes_per_token, memory=fit.explanation),
        cost_model_notes=list(cost.cost_model.notes) + pooled_dp_note(requests, num_blocks * sc.block_size, scenario.layout, sc),
        num_requests=len(requests),
        simulated_s=end_s,
        metrics=metrics,
    )
    result.digest = digest(result)
    return SimRun(result, collector, requests, stopped)


def run_scenario(scenario: Scenario) -> SimResult:
    """Simulate ``scenario``; the same scenario (seed included) gives a byte-identical result."""
    return simulate(scenario).result


class CapacityEstimate(BaseModel):
    """Sustainable request rate of a scenario's cluster, from the cost model (no simulation)."""

    requests_per_s: float
    batch: int
    mean_prompt: float
    mean_output: float
    decode_step_s: float
    prefill_step_extra_s: float
    explanation: str


def estimate_capacity(scenario: Scenario) -> CapacityEstimate:
    """Saturation throughput of the cluster in requests/s, from mean lengths and the cost model.

    At saturation every instance runs its largest batch ``B`` (max_num_seqs, or fewer if KV
    cannot hold B requests at their mean final length). A request then costs ``O`` decode
    slots of a step of ``t_dec(B)`` seconds shared by ``B`` requests, plus the extra time its
    prompt adds to the step it is prefilled in (``t_mixed(B, P) - t_dec(B)``), so one instance
    serves ``1 / (O * t_dec / B + extra)`` requests/s. Step times include host overhead under
    the async policy; prefix-cache hits and preemption are ignored (hits make this conservative).
    """
    wl = scenario.workload
    if wl.kind == "trace":
        raise TwinferError("workload: capacity estimates need a generated workload (kind poisson/gamma/constant/agentic), not a trace")
    sc = scenario.scheduler
    fit = _fit(scenario)
    cm = build_cost_model(scenario)
    prompt = wl.shared_prefix_len + wl.input_len.mean()
    out = wl.output_len.mean()
    per_req_kv = prompt + out
    batch = int(max(1, min(sc.max_num_seqs, fit.max_kv_tokens // max(per_req_kv, 1.0))))
    ctx = np.full(batch, prompt + out / 2.0)
    spt = sc.expected_tokens_per_decode()
    s = 1 + sc.draft_len

    def wall(device: float, n_req: int, n_tok: int) -> float:
        host = sc.host_overhead_s(n_req, n_tok)
        return wall_time(device, host, sc.overlap())

    t_dec = wall(float(cm.decode_times(ctx, 1, sc.draft_len)[0]), batch, batch * s)
    p = int(round(prompt))
    chunk = min(p, max(1, sc.max_num_batched_tokens - batch * s))
    n_chunks = -(-p // chunk)
    new = np.concatenate([np.full(batch, s), [chunk]]).astype(np.int64)
    ctxs = np.concatenate([ctx, [0.0]]).astype(np.int64)
    dec = np.concatenate([np.ones(batch, bool), [False]])
    t_mix = wall(float(cm.mixed_step_time(new, ctxs, dec)), batch + 1, int(new.sum()))
    extra = n_chunks * max(t_mix - t_dec, 0.0)
    per_instance = 1.0 / (out / spt * t_dec / batch + extra)
    total = per_instance * scenario.instances
    explanation = (
        f"{scenario.instances} x {scenario.layout.describe()} instance(s) at batch {batch}: decode step {t_dec * 1e3:.1f} ms "
        f"(mean context {prompt + out / 2:.0f}), a {p}-token prompt adds {extra * 1e3:.1f} ms; "
        f"{out:.0f} output tokens at {spt:.2f} tokens/step => {total:.2f} requests/s"
    )
    return CapacityEstimate(requests_per_s=total, batch=batch, mean_prompt=prompt, mean_output=out,
                            decode_step_s=t_dec, prefill_step_extra_s=extra, explanation=explanation)


def measure_capacity(scenario: Scenario, num_requests: int = 3000) -> float:
    """Saturation throughput in requests/s, measured by simulating an overload.

    All ``num_requests`` arrive within a few seconds (rate 1000/s), so the queue never empties;
    the throughput is the rate at which the middle 60% of requests finish (from the 20th to the
    80th percentile finish time), leaving out the fill and drain at both ends.
    """
    wl = scenario.workload
    if wl.kind == "trace":
        raise TwinferError("workload: capacity measurement needs a generated workload, not a trace")
    # capacity is a property of the lengths: a closed loop's are measured under the same open-loop overload
    kind = "poisson" if wl.kind == "closed" else wl.kind
    over = scenario.model_copy(update={"workload": wl.model_copy(update={"kind": kind, "rate": 1000.0, "num_requests": num_requests,
                                                                       "duration_s": None})})
    run = simulate(over)
    fin = np.sort([r.finish_time for r in run.requests if r.finish_time is not None])
    if fin.size < 10:
        raise TwinferError("too few requests finished to measure capacity")
    lo, hi = int(0.2 * fin.size), int(0.8 * fin.size)
    return (hi - lo) / float(fin[hi] - fin[lo])
