"""Simulate a deployment with serving effects and/or prefill/decode disaggregation.

``simulate_deployment(scenario, effects, disagg)`` runs like ``sim.runner.simulate`` (same
workload seeding, metrics collector, result with digest) but builds each pool's step cost
with :func:`sim.effects.build_step_cost` and, with a ``DisaggSpec``, wires a prefill pool and
a decode pool with KV transfers between them (:mod:`sim.disagg`). With ``mirror > 1`` an
instance is simulated as a share of its DP ranks: its KV blocks shrink by the same factor
(the scheduler's seats and token budget are the scenario's, set for the share) and the GPU
count behind the per-GPU metrics is the simulated share's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from costmodels.catalog import get_model
from costmodels.calibration_source import profile_for
from costmodels.replay import depth_correction
from costmodels.effective import fit_with_policies
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import MemoryFit, host_problem, kv_rates
from scheduler.config import SchedulerConfig
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.backend import SimBackend, host_coeffs
from sim.closed_loop import arrival_source
from sim.cluster import Cluster
from sim.disagg import DisaggSpec, KVLinks, _PrefillMetrics, link_bandwidth, prompt_copy, transfer_bytes
from sim.effects import EffectsSpec, build_step_cost, kv_tiers, pricing_notes, ranked_cost
from sim.early_stop import StopPredicate, stopped_at, watch
from sim.export import digest
from sim.instance import Instance
from sim import invariants
from scheduler.metrics import MetricsCollector
from sim.result import KVInfo, SimResult, SimRun
from sim.router import make_router
from sim.scenario import Scenario, run_seeds
from twinfer import __version__
from twinfer.errors import DoesNotFitError, TwinferError


@dataclass
class PoolStats:
    """What a pool did, for reports."""

    role: str
    instances: int
    gpus_simulated: float
    busy_s: float
    steps: int


def wider_hint(layout, fits, what: str = "layout", model=None) -> str:
    """Where ``layout`` (the field ``what``) does not fit: the smallest tensor-parallel width at which it would (the
    same layout otherwise, at most 64 GPUs an instance; ``fits(layout) -> bool``), as a hint for the error. A scenario
    that leaves its layout out runs TP1, vLLM's default, which a large model does not fit. Only widths the layout's
    own validation and ``model`` (``ParallelLayout.check_model``: heads that split evenly) take are named: TP3's
    doubling, TP6, was suggested for DeepSeek-V3's 128 heads and then refused."""
    per_tp = layout.gpus // layout.tp
    for tp in _wider_tps(layout.tp, 64 // per_tp):
        try:
            lay = ParallelLayout.model_validate({**layout.model_dump(), "tp": tp})
            if model is not None:
                lay.check_model(model)
        except ValueError:   # TwinferError and pydantic's ValidationError both are
            continue
        try:
            ok = fits(lay)
        except (TwinferError, ValueError):
            return ""
        if ok:
            flag = f", or --tp {tp}" if what == "layout" else ""
            return f"; at TP{tp} it fits ({what}.tp: {tp}{flag}; `twinfer plan` searches layouts)"
    return "; no tensor-parallel width up to 64 GPUs fits (`twinfer plan` searches layouts, dtypes and pipelines)"


def _wider_tps(tp: int, most: int) -> list[int]:
    """Tensor-parallel widths past ``tp`` up to ``most``, smallest first: its doublings (TP1: 2, 4, 8, ...) and the
    powers of two between them (TP3: 4, 6, 8, 12, ...), the widths servers are run at."""
    out, t = set(), tp * 2
    while t <= most:
        out.add(t)
        t *= 2
    p = 1
    while p <= most:
        if p > tp:
            out.add(p)
        p *= 2
    return sorted(out)


def instance_fit(scenario: Scenario, layout: ParallelLayout, sc: SchedulerConfig, effects: EffectsSpec, what: str) -> MemoryFit:
    """Memory fit of one instance of ``layout`` under ``sc`` and ``effects`` (HBM, then host memory: ``host_problem``);
    raises DoesNotFitError naming ``what`` (the field) and the numbers where it does not fit."""
    def fit_of(lay: ParallelLayout) -> MemoryFit:
        return fit_with_policies(
            get_model(scenario.model), get_hardware(scenario.hardware), lay, table_placement=effects.table_placement,
            mem_fraction=scenario.gpu_memory_fraction, max_batched_tokens=sc.max_num_batched_tokens,
            max_running_requests=sc.max_num_seqs, min_kv_tokens=sc.block_size,
            sched_ranks=max(1, lay.dp // effects.mirror),  # a mirrored slice's scheduler drives dp / mirror ranks
            mtp=sc.draft_len > 0,
        )
    fit = fit_of(layout)
    if not fit.fits:
        raise DoesNotFitError(f"{what}: {fit.explanation}"
                              + wider_hint(layout, lambda lay: fit_of(lay).fits, what, get_model(scenario.model)))
    host = host_problem(fit, get_model(scenario.model), layout, get_hardware(scenario.hardware))
    if host:
        raise DoesNotFitError(f"{what}: {host}")
    return fit


def simulate_deployment(scenario: Scenario, effects: EffectsSpec | None = None, disagg: DisaggSpec | None = None, *,
                        record_steps: bool = False, requests: list[Request] | None = None,
                        debug: bool | None = None, stop: StopPredicate | None = None) -> SimRun:
    """Run ``scenario`` with ``effects`` (and a prefill pool when ``disagg`` is given) to completion.

    ``effects`` / ``disagg`` default to the scenario's own ``effects`` / ``disagg`` fields; given
    here, they replace them (and the result's scenario records what ran). ``debug`` (default: env
    TWINFER_DEBUG_INVARIANTS) checks the run's invariants (sim.invariants; with a prefill pool,
    the end-of-run KV and accounting checks only). ``stop``: as in ``sim.runner.simulate``.
    """
    eff = effects if effects is not None else scenario.effects
    if disagg is None:
        disagg = scenario.disagg
    scenario = scenario.model_copy(update={"effects": eff, "disagg": disagg})
    model, hw = get_model(scenario.model), get_hardware(scenario.hardware)
    sc = scenario.scheduler
    fit = instance_fit(scenario, scenario.layout, sc, eff, "layout")
    num_blocks = max(1, fit.max_kv_tokens // eff.mirror // sc.block_size)

    workload_seed, backend_seed = run_seeds(scenario)
    env = simpy.Environment()
    source = arrival_source(env, scenario.workload, np.random.default_rng(workload_seed), sc.block_size, requests)
    clock = lambda: env.now  # noqa: E731
    debug = invariants.enabled(debug)
    checked = debug and disagg is None  # a prefill pool hands requests over: per-event checks do not apply
    collector = watch((invariants.CheckingCollector if checked else MetricsCollector)(record_steps=record_steps), stop, env)
    cost = build_step_cost(model, hw, scenario.layout, eff, clock, profile_for(hw, scenario.calibration))
    sc, load_s = kv_tiers(eff, sc, hw, scenario.layout, fit.kv_bytes_per_token)
    scenario = scenario.model_copy(update={"scheduler": sc})
    rates = sc.effective_acceptance_rates()
    decode_gpus = scenario.instances * scenario.layout.gpus / eff.mirror
    notes = pricing_notes(cost, sc)

    if disagg is None:
        replay = sc.replay_for(model)   # the sliding-window replay policy in force
        fix = depth_correction(model, hw, scenario.layout, profile_for(hw, scenario.calibration), replay, eff.dp_balance)

        def make_backend(i: int) -> SimBackend:
            return SimBackend(ranked_cost(cost, schedulers[i]), np.random.default_rng([backend_seed, i]), rates, sc.async_overlap,
                              load_s, host_coeffs(sc), replay_correction=fix)

        schedulers = [Scheduler(sc.for_model(model), num_blocks, i, name_all_blocks=False, replay=replay) for i in range(scenario.instances)]
        cluster = Cluster(env, schedulers, make_backend, make_router(scenario.router), source.watch(collector),
                          source.initial, max_steps=scenario.max_decode_steps)
        source.start(cluster.submit)
        env.run()
        all_scheds = schedulers
        gpus = decode_gpus
        del cluster
    else:
        all_scheds, gpus, extra = _run_disagg(env, scenario, eff, disagg, collector, source, cost, num_blocks,
                                              backend_seed, decode_gpus, load_s)
        notes += extra
    requests = source.requests
    if disagg is None:
        notes += pooled_dp_note(requests, num_blocks * sc.block_size, scenario.layout, sc)
    stopped = stopped_at(collector)
    if stopped is not None:   # a partial run: work is left behind by design, the end-of-run checks do not apply
        checked = debug = False
    stuck = [s for s in all_scheds if s.has_work]
    if stuck and stopped is None:
        raise RuntimeError(f"simulation ended with work queued on instances {[s.instance_id for s in stuck]}")
    if checked:
        invariants.check_end(collector, all_scheds, len(requests), float(env.now))

    metrics = collector.summarize(max(1, int(round(gpus))), scenario.slo, steady_after_s=scenario.steady_after_s)
    if debug and not checked:
        invariants.check_pools(all_scheds, len(requests), metrics)
    scen = scenario.model_dump(mode="json")
    result = SimResult(
        name=scenario.name, description=scenario.description, scenario=scen, seed=scenario.seed,
        twinfer_version=__version__, num_gpus=max(1, int(round(gpus))),
        kv=KVInfo(block_size=sc.block_size, num_blocks=num_blocks, capacity_tokens=num_blocks * sc.block_size,
                  kv_bytes_per_token_per_gpu=fit.kv_bytes_per_token, memory=fit.explanation),
        cost_model_notes=notes, num_requests=len(requests), simulated_s=float(env.now), metrics=metrics,
    )
    result.digest = digest(result)
    return SimRun(result, collector, requests, stopped)


POOLED_DP_MARK = "need more KV than one attention-DP rank holds"


def pooled_dp_note(requests, pool_tokens: int, layout: ParallelLayout, sc: SchedulerConfig) -> list[str]:
    """A line when requests need more KV than one attention-DP rank holds: without ``scheduler.attention_dp`` the
    instance is one scheduler over the ranks' pooled KV (docs/attention_dp.md), so the simulation admitted them, where an
    engine placing each request on one rank refuses it (``twinfer cost`` does, per DP rank). None on one rank or with
    per-rank batches."""
    dp = layout.dp
    if dp <= 1 or sc.attention_dp is not None:
        return []
    rank = pool_tokens // dp
    big = sum(1 for r in requests if r.prompt_len + r.output_len > rank)
    if not big:
        return []
    return [f"{big} request(s) {POOLED_DP_MARK} ({rank:,} of the instance's {pool_tokens:,} "
            f"tokens over {dp} ranks): this run pools the ranks' KV in one batch, so it served them; an engine that places "
            "each request on one rank would refuse them (scheduler.attention_dp models per-rank batches and budgets)"]


def _run_disagg(env, scenario: Scenario, eff: EffectsSpec, spec: DisaggSpec, collector, source, decode_cost,
                num_blocks: int, backend_seed: int, decode_gpus: float, load_s: tuple[float, float]):
    collector = source.watch(collector)  # every request ends through it: a decode finish, a first-token finish or a drop
    model, hw = get_model(scenario.model), get_hardware(scenario.hardware)
    dsc = scenario.scheduler
    psc = spec.prefill_config(dsc)
    peff = eff.model_copy(update={"mirror": spec.prefill_mirror})
    pfit = instance_fit(scenario, spec.prefill_layout, psc, peff, "disagg.prefill_layout")
    p_blocks = max(1, pfit.max_kv_tokens // spec.prefill_mirror // psc.block_size)
    clock = lambda: env.now  # noqa: E731
    pcost = build_step_cost(model, hw, spec.prefill_layout, peff, clock, profile_for(hw, scenario.calibration))
    psc, p_load_s = kv_tiers(peff, psc, hw, spec.prefill_layout, pfit.kv_bytes_per_token)
    n_p, n_d = spec.prefill_instances, scenario.instances
    total_gpus = n_p * spec.prefill_layout.gpus + n_d * scenario.layout.gpus
    bw, link = link_bandwidth(spec, hw, total_gpus)
    per_tok, fixed = kv_rates(model, scenario.layout.kv_dtype)
    p_slots = [max(1, spec.prefill_layout.dp // spec.prefill_mirror)] * n_p
    d_slots = [max(1, scenario.layout.dp // eff.mirror)] * n_d
    links = KVLinks(env, p_slots, d_slots, bw, spec.transfer_latency_s)

    originals = {r.request_id: r for r in source.initial}
    copies = [prompt_copy(r) for r in source.initial]
    d_rates = dsc.effective_acceptance_rates()
    d_replay = dsc.replay_for(model)
    d_scheds = [Scheduler(dsc.for_model(model), num_blocks, n_p + j, name_all_blocks=False, replay=d_replay) for j in range(n_d)]
    d_instances = [
        Instance(env, n_p + j, s, SimBackend(decode_cost, np.random.default_rng([backend_seed, n_p + j]), d_rates, dsc.async_overlap, load_s,
                                          host_coeffs(dsc)),
                 collector, scenario.max_decode_steps)
        for j, s in enumerate(d_scheds)
    ]
    d_router = make_router(spec.decode_router)
    p_index: dict[str, int] = {}

    def on_prefilled(copy: Request) -> None:
        orig = originals[copy.request_id]
        orig.first_scheduled_time = copy.first_scheduled_time
        orig.num_cached_tokens = copy.num_cached_tokens
        orig.num_preemptions = copy.num_preemptions
        if orig.output_len <= 1:   # its one token is the answer: the prefill instance returns it
            orig.first_token_time = copy.first_token_time
            orig.num_output_tokens = 1
            orig.status = copy.status
            orig.finish_time = copy.finish_time
            collector.on_finish(orig)
            return
        orig.num_computed_tokens = orig.prompt_len
        orig.num_output_tokens = 1
        j = d_router.choose(orig, d_scheds) if n_d > 1 else 0
        nbytes = transfer_bytes(per_tok, fixed, orig)
        env.process(links.transfer(p_index[copy.request_id], j, nbytes, lambda: _admit(orig, j)))

    handover = getattr(collector, "on_handover", None)

    def _admit(orig: Request, j: int) -> None:
        sched, inst = d_scheds[j], d_instances[j]
        if not sched.add_prefilled(orig):
            collector.on_drop(orig)
            return
        if handover is not None:   # its first decode token's ITL runs from its first token (its admission there)
            handover(n_p + j, orig)
        inst.wake()

    p_replay = psc.replay_for(model)
    p_fix = depth_correction(model, hw, spec.prefill_layout, profile_for(hw, scenario.calibration), p_replay, peff.dp_balance)
    p_scheds = [Scheduler(psc.for_model(model), p_blocks, i, name_all_blocks=False, replay=p_replay) for i in range(n_p)]
    p_rates = psc.effective_acceptance_rates()

    def make_pbackend(i: int) -> SimBackend:
        return SimBackend(pcost, np.random.default_rng([backend_seed, 0x5046, i]), p_rates, psc.async_overlap, p_load_s,
                          host_coeffs(psc), replay_correction=p_fix)

    router = make_router(spec.prefill_router)

    class _TrackingRouter:
        def choose(self, req, schedulers):
            i = router.choose(req, schedulers)
            p_index[req.request_id] = i
            return i

    pmetrics = _PrefillMetrics(collector, originals, on_prefilled)
    if n_p == 1:
        for c in copies:
            p_index[c.request_id] = 0
    cluster = Cluster(env, p_scheds, make_pbackend, _TrackingRouter(), pmetrics, copies, max_steps=scenario.max_decode_steps)

    def submit(orig: Request) -> None:
        """A request made during the run (a closed-loop user's): its prompt copy goes to the prefill pool."""
        originals[orig.request_id] = orig
        if n_p == 1:
            p_index[orig.request_id] = 0
        cluster.submit(prompt_copy(orig))

    source.start(submit)
    env.run()
    del cluster
    gpus = decode_gpus + n_p * spec.prefill_layout.gpus / spec.prefill_mirror
    notes = [
        f"disaggregated: {n_p} x {spec.prefill_layout.describe()} prefill + {n_d} x {scenario.layout.describe()} decode; "
        f"KV over {link} at {bw / 1e9:.0f} GB/s per transfer lane: {links.transfers} transfers, "
        f"{links.bytes / 1e9:.1f} GB, mean queueing {links.wait_s / max(links.transfers, 1) * 1e3:.2f} ms"
    ]
    return p_scheds + d_scheds, gpus, notes
