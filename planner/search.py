"""``plan_deployment``: memory fit -> analytic screen -> simulation of the best -> Pareto frontier -> plan.

Steps (each deterministic; jobs run through ``planner.parallel.Runner`` with results in order):

1. enumerate layouts that fit the GPU budget (``planner.space``);
2. screen every layout's operating points in parallel (``planner.screen``) and combine them
   into aggregated and disaggregated deployments (``planner.combine``);
3. keep the candidates meeting the SLO and their Pareto frontier of output tokens/s per GPU
   against tokens/s per user; shortlist the best, the best of each mode and frontier points;
4. simulate the shortlist on slices (``planner.simulate``), at 0.9 then 0.7 of the screened load;
5. recommend the simulated candidate with the most output tokens/s per GPU meeting the SLO,
   build its plan (pools, policies, routers, effects, workload at the planned rate), its
   economics, why it won and the assumptions behind the numbers.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from costmodels.catalog import get_model
from costmodels.calibration_source import profile_for
from costmodels.hardware import get_hardware
from costmodels.step import StepCostModel
from planner.combine import AGG, Candidate, Table, combine
from planner.confirm import (CONFIRM_MAX_RUNS, CONFIRM_RATE_STEPS, confirm_plan, confirmation_order, may_stop_early,
                             step_bound, STOPPED_EARLY)
from planner.economics import Economics, economics
from planner.explain import describe_row, does_not_fit, short_row, slo_unreachable, why_it_won
from planner.parallel import Runner, report
from planner.pareto import pareto_front
from planner.plan import MAX_RUN_REQUESTS, Plan, PoolPlan, Predicted, RunShare
from planner.request import PlanRequest
from planner.screen import ScreenContext, screen_layout
from planner.simulate import (SimOutcome, build_job, explicit_ranks, meets, mirrored_slice, run_job, scheduler_for,
                              steady_workload)
from planner.space import LayoutOption, enumerate_layouts
from planner.workload_stats import WorkloadStats, workload_stats
from scheduler.config import SchedulerConfig
from sim.effects import EffectsSpec
from sim.router import RouterConfig
from sim.scenario import MAX_INSTANCES
from sim.workload import at_rate
from twinfer.errors import TwinferError

LOADS = (0.9, 0.7)
FRONTIER_POINTS = 12
# The screen as a filter (issue 19): rows within NEAR_SLO x the SLO bounds are candidates, each (mode, layout)
# sends its PER_LAYOUT best to the simulator, best layouts first, up to EXTRA_SHARE x --simulate rows beyond
# the screen's own picks. Checked on the shipped examples by simulating the screen's rejects near the frontier
# (8 x H200 chat: 27 near-frontier rows at 0.9 and 0.7 load, none above the pick).
NEAR_SLO = 1.5
PER_LAYOUT = 1
EXTRA_SHARE = 1.0
# a workload reuses prefixes where over this share of its prompt tokens hit: a prefix-aware router, a host KV tier
PREFIX_REUSE = 0.2


class FrontierPoint(BaseModel):
    """One deployment on (or near) the frontier."""

    label: str
    mode: str
    gpus: int
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    ttft_s: float
    tpot_s: float
    request_rate: float
    meets_slo: bool               # after every check the planner applied (slice, then full scale where it ran one)
    source: Literal["screen", "simulation"]
    row: int
    # whether the plan's full-scale run met the SLO (figures: that run's); False: its slice met it, no full-scale run
    # did (figures: the slice's; meets_slo False); None: not run at full scale
    full_scale: bool | None = None
    deployment: str = ""          # short form: pools and layouts
    policies: str = ""            # short form: batch, MTP, chunk, async
    screen_output_tokens_per_s_per_gpu: float | None = None


class Timings(BaseModel):
    fit_s: float
    screen_s: float
    simulate_s: float
    total_s: float
    runner: str
    screened_per_s: float
    simulated_per_s: float


class PlanReport(BaseModel):
    """Everything ``twinfer plan`` prints or writes."""

    status: Literal["ok", "does_not_fit", "slo_unreachable"]
    message: str
    model: str
    hardware: str
    gpus: int
    workload: str
    slo: str
    layouts_considered: int
    layouts_fitting: int
    candidates_screened: int          # every combination considered (dominated pool points pruned unevaluated)
    candidates_evaluated: int = 0     # rows actually computed
    candidates_meeting_slo: int
    candidates_simulated: int
    simulations_run: int
    frontier: list[FrontierPoint] = Field(default_factory=list)
    best_by_mode: list[FrontierPoint] = Field(default_factory=list)
    simulated: list[FrontierPoint] = Field(default_factory=list)  # every simulated candidate, meeting the SLO or not
    closest_options: list[str] = Field(default_factory=list)
    recommended: Plan | None = None
    assumptions: list[str] = Field(default_factory=list)
    timings: Timings


# rows of the table that are one deployment at different batches per rank: every column but the batch and what the
# screen derives from it equal
SAME_DEPLOYMENT = ("mode", "opt", "inst", "d", "async", "chunk", "popt", "pinst", "pchunk", "pasync", "adp")
BACKOFF_ROUNDS = 2


def smaller_batch(table: Table, i: int) -> int | None:
    """The row of the same deployment as row ``i`` at the next smaller batch per rank (None: it has none)."""
    c = table.cols
    same = np.ones(table.n, bool)
    for k in SAME_DEPLOYMENT:
        if k in c:
            same &= c[k] == c[k][i]
    same &= c["B"] < c["B"][i]
    rows = np.flatnonzero(same)
    if not rows.size:
        return None
    return int(rows[np.argmax(c["B"][rows])])


def _acceptance(max_draft: int) -> tuple[float, ...]:
    return tuple(SchedulerConfig(draft_len=max_draft).effective_acceptance_rates()) if max_draft else ()


def _point(table: Table, options, i: int, ok: bool, source: str, outcome: SimOutcome | None = None, scale_rate: float = 1.0,
           full_scale: bool | None = None) -> FrontierPoint:
    c = table.cols
    dep, pol = short_row(table, options, i)
    common = dict(label=describe_row(table, options, i), deployment=dep, policies=pol, row=i,
                  mode="aggregated" if c["mode"][i] == AGG else "disaggregated", gpus=int(c["gpus"][i]), meets_slo=ok,
                  full_scale=full_scale, screen_output_tokens_per_s_per_gpu=float(c["thr_gpu"][i]))
    if outcome is not None:
        return FrontierPoint(output_tokens_per_s_per_gpu=outcome.thr_gpu, tokens_per_s_per_user=outcome.tps_user,
                             ttft_s=outcome.ttft_s, tpot_s=outcome.tpot_s, request_rate=outcome.rate * scale_rate,
                             source="simulation", **common)
    return FrontierPoint(output_tokens_per_s_per_gpu=float(c["thr_gpu"][i]), tokens_per_s_per_user=float(c["tps_user"][i]),
                         ttft_s=float(c["ttft"][i]), tpot_s=float(c["tpot"][i]), request_rate=float(c["rate"][i]),
                         source="screen", **common)


def _shortlist(table: Table, ok: np.ndarray, front: np.ndarray, k: int) -> list[int]:
    """Rows to simulate: the best overall, the best of each mode, then frontier points spread over tokens/s per user."""
    c = table.cols
    thr = c["thr_gpu"]
    picks: list[int] = []

    def add(i: int) -> None:
        if i not in picks and len(picks) < k:
            picks.append(int(i))

    if ok.any():
        best = np.flatnonzero(ok)
        add(int(best[np.lexsort((best, -c["tps_user"][best], -thr[best]))[0]]))
        for mode in (AGG, 1 - AGG):
            m = ok & (c["mode"] == mode)
            if m.any():
                rows = np.flatnonzero(m)
                add(int(rows[np.lexsort((rows, -c["tps_user"][rows], -thr[rows]))[0]]))
    if front.size:
        for j in np.linspace(0, front.size - 1, num=min(front.size, k)).round().astype(int).tolist():
            add(int(front[j]))
    return picks


def prefix_router(stats: WorkloadStats) -> RouterConfig:
    """The router of a plan: prefix-aware where the workload reuses prefixes (over 20% of prompt tokens hit)."""
    return RouterConfig(kind="prefix_aware" if stats.hit_fraction > PREFIX_REUSE else "least_outstanding")


def host_cache_gb(stats: WorkloadStats, hw, fraction: float = 0.5) -> float:
    """Host memory (GB) for the prefix cache's host tier (HiCache L2): ``fraction`` of the GPU's host memory where the
    workload reuses prefixes (agentic turns, shared system prompts keep evicted KV there), else none."""
    return fraction * hw.host_mem_gb if stats.hit_fraction > PREFIX_REUSE else 0.0


def _near_slo(table: Table, slo) -> np.ndarray:
    """Rows the screen puts within NEAR_SLO of the SLO (and whose seats fit in KV): the screen's estimates are
    optimistic in throughput and unreliable in latency, so these are the simulator's to judge, not the screen's.
    The E2E target, where the SLO sets one, by its lower bound (``screen.e2e_floor``): the estimate is no bound and
    errs by more than NEAR_SLO, so it only orders these rows (``_per_layout``'s ``first``)."""
    c = table.cols
    return (c["kv_ok"] & (c["rate"] > 0) & (c["ttft"] <= NEAR_SLO * slo.ttft_s) & (c["tpot"] <= NEAR_SLO * slo.tpot_s)
            & table.e2e_within(slo, col="e2e_floor"))


def _nearest_e2e(table: Table, possible: np.ndarray, k: int) -> list[int]:
    """Where no row's screened E2E meets the target: the ``k`` rows of ``possible`` (TTFT and TPOT met, E2E not ruled
    out by its lower bound) with the least screened E2E, one per (mode, layouts, batch, MTP), ties by throughput."""
    c = table.cols
    rows = np.flatnonzero(possible)
    out, seen = [], set()
    for r in rows[np.lexsort((rows, -c["thr_gpu"][rows], c["e2e"][rows]))].tolist():
        key = (int(c["mode"][r]), int(c["opt"][r]), int(c["popt"][r]), int(c["B"][r]), int(c["d"][r]))
        if key not in seen and len(out) < k:
            seen.add(key)
            out.append(r)
    return out


def _per_layout(table: Table, near: np.ndarray, picks: list[int], most: int, shape=None,
                first: np.ndarray | None = None) -> list[int]:
    """``picks`` plus, for every (mode, layout shape) with rows near the SLO, its PER_LAYOUT best distinct
    (batch, MTP) rows by screened throughput, best shapes first, up to ``most`` rows in all: the screen filters,
    it does not judge which layout wins (issue 19: it had ranked the layout the simulator put first too low to
    simulate). ``shape(option index)`` groups layout options (default: each option its own group); shapes
    already among ``picks`` come last. Rows in ``first`` (default all) come before the others of their group."""
    c = table.cols
    out = list(picks)
    shape = shape or (lambda o: o)
    groups: dict[tuple, list[int]] = {}
    rows = np.flatnonzero(near)
    # by screened throughput, ties by tokens/s per user: a disaggregated deployment bound by its prefill pool screens
    # the same throughput whatever its decode layout, and the row order had picked which of them the simulator saw
    # (72 x GB300: 4 x DEP8 decode at 59 tok/s/user ahead of 2 x DEP16 at 88, which GB200's plan recommended)
    later = np.zeros(rows.size, bool) if first is None else ~first[rows]
    for r in rows[np.lexsort((rows, -c["tps_user"][rows], -c["thr_gpu"][rows], later))].tolist():
        g = groups.setdefault((int(c["mode"][r]), shape(int(c["opt"][r]))), [])
        if len(g) < PER_LAYOUT and all((c["B"][r], c["d"][r]) != (c["B"][q], c["d"][q]) for q in g):
            g.append(int(r))
    # round robin over the shapes (unrepresented first, then best first), so each gets its best row before any
    # gets a second
    have = {(int(c["mode"][i]), shape(int(c["opt"][i]))) for i in picks}
    order = [g for k, g in groups.items() if k not in have] + [g for k, g in groups.items() if k in have]
    for depth in range(PER_LAYOUT):
        for g in order:
            if depth < len(g) and g[depth] not in out and len(out) < most:
                out.append(g[depth])
    return out


def _assumptions(model, hw, req: PlanRequest, stats: WorkloadStats) -> list[str]:
    from costmodels.layout import ParallelLayout

    notes = StepCostModel(model, hw, ParallelLayout(tp=1), profile_for(hw, req.calibration) if req.calibration else None).notes
    out = []
    if hw.measured is not None:
        out.append(f"hardware: {hw.name} ceilings are measured ({hw.measured.source or 'see costmodels/data/hardware.yaml'})")
    else:
        out.append(f"hardware: {hw.name} numbers are datasheet ceilings; kernel efficiencies are measured on H200 and scaled "
                   f"by datasheet ratios (sources: {'; '.join(hw.sources[:2]) or 'user file'})")
    out += [f"cost model: {n}" for n in notes]
    out += [f"model: {a}" for a in model.assumptions]
    el = req.expert_load
    if el.skew == "zipf":
        out.append(f"expert load: Zipf({el.zipf_s:g}) popularity per layer (0.63 reproduces TensorRT-LLM's DeepSeek-R1 EP32 "
                   "measurement: busiest rank 2.56x the mean without EPLB); EPLB packs replicas of hot experts")
    else:
        out.append(f"expert load: {el.skew} skew as given")
    out.append(f"workload: {stats.describe()}; prefix reuse assumes a cache-aware router keeps sessions together")
    out.append("screen: steady state at the max batch, mean lengths, p90 new prompt tokens for TTFT; "
               "simulation: a slice of the deployment (one instance, or a small prefill:decode ratio; wide attention-DP "
               "instances cut to a share of their ranks) at 0.9x (then 0.7x) the screened rate")
    lat = "TTFT, TPOT and E2E" if req.slo.e2e_s is not None else "TTFT and TPOT"
    out.append(f"SLO: p{req.slo_percentile} {lat} per request; a simulated plan must also finish >= 99% of requests")
    if req.slo.e2e_s is not None:
        out.append(f"screen E2E: TTFT + the p{req.slo_percentile} output ({stats.output_at(req.slo_percentile):,.0f} tokens) "
                   "x TPOT, an estimate that runs high; a candidate is pruned on E2E only where a lower bound "
                   f"({stats.output_floor_at(req.slo_percentile):,.0f} tokens at the fastest one request's tokens can come) "
                   "misses the target")
    out.append("host overhead per step and MTP acceptance (0.85^i) are the scheduler defaults (scheduler/config.py)")
    out.append("KV transfer (disaggregated): 80% of link bandwidth x the sending rank's GPUs, 20 us per transfer (assumption)")
    if stats.hit_fraction > PREFIX_REUSE:
        out.append(f"prefix cache: HBM plus a host-memory tier of {req.host_cache_fraction:.0%} of each GPU's "
                   f"{hw.host_mem_gb:g} GB host memory ({hw.host_link_gbps:g} GB/s host link)")
    return out


def plan_deployment(req: PlanRequest, *, workers: int = 1, ray_address: str | None = None) -> PlanReport:
    """Search deployments for ``req`` and recommend one (see the module docstring)."""
    t0 = time.perf_counter()
    model, hw = get_model(req.model), get_hardware(req.hardware)
    space = req.space
    slo_txt = (f"TTFT <= {req.slo.ttft_s:g} s, TPOT <= {req.slo.tpot_s * 1e3:g} ms"
               + ("" if req.slo.e2e_s is None else f", E2E <= {req.slo.e2e_s:g} s") + f" (p{req.slo_percentile})")
    stats = workload_stats(req.workload, req.seed)
    over, sampled, longest = stats.over_context(model.max_context)
    if over * 2 >= sampled and over:
        # a serving engine refuses such requests (vLLM: 400); a plan over the rest would answer for another workload
        raise TwinferError(f"workload: {over:,} of {sampled:,} sampled requests need more than {model.name}'s context of "
                           f"{model.max_context:,} tokens (prompt + output; the longest {longest:,}): shorten the "
                           "workload's lengths (shared_prefix_len + input_len, output_len), or plan a model with a longer context")
    stats = dataclasses.replace(stats, totals=None)   # not carried to every screening job
    wl_txt = f"{req.workload.kind}: {stats.describe()}"
    options, rejected = enumerate_layouts(model, hw, req.gpus, space, mem_fraction=req.mem_fraction)
    t_fit = time.perf_counter() - t0
    considered = len(options) + len(rejected)
    base = dict(model=model.name, hardware=hw.name, gpus=req.gpus, workload=wl_txt, slo=slo_txt,
                layouts_considered=considered, layouts_fitting=len(options))
    assumptions = _assumptions(model, hw, req, stats)
    if over:
        assumptions.append(f"{over / sampled:.1%} of the workload's requests ({over:,} of {sampled:,} sampled, the longest "
                           f"{longest:,} tokens) exceed {model.name}'s context of {model.max_context:,} tokens: refused, "
                           "as a serving engine refuses them; the figures are over the rest")
    if not options:
        msg, closest = does_not_fit(model, hw, req.gpus, space, rejected, req.mem_fraction)
        return PlanReport(status="does_not_fit", message=msg, closest_options=closest, candidates_screened=0, candidates_evaluated=0,
                          candidates_meeting_slo=0, candidates_simulated=0, simulations_run=0, assumptions=assumptions,
                          timings=Timings(fit_s=t_fit, screen_s=0, simulate_s=0, total_s=time.perf_counter() - t0,
                                          runner="-", screened_per_s=0, simulated_per_s=0), **base)
    drafts = space.draft_len if space.draft_len is not None else ((0, 1, 2, 3) if model.mtp_layers else (0,))
    if not model.mtp_layers:
        drafts = (0,)
    ctx = ScreenContext(req.model, req.hardware, stats, req.expert_load, space.batch_per_rank, drafts, space.async_overlap,
                        space.chunk_tokens, _acceptance(max(drafts)), req.calibration,
                        adp_balance=explicit_ranks("aggregated", EffectsSpec(expert_load=req.expert_load)))
    with Runner(workers, ray_address) as runner:
        t1 = time.perf_counter()
        points = runner.map(_screen_job, list(enumerate(options)), ctx)
        table = combine(options, points, req.gpus, stats, hw, req.model, space.modes, space.prefill_max_gpus,
                        pooled_prefill=prefix_router(stats).kind == "least_outstanding", percentile=req.slo_percentile)
        t_screen = time.perf_counter() - t1
        if len(table) == 0 and table.over_instances:
            widest = max(o.gpus for o in options)
            raise TwinferError(f"gpus: {req.gpus:,} GPUs of {hw.name} make every deployment of {model.name} a pool of more than "
                               f"{MAX_INSTANCES:,} instances (the most a deployment holds; its widest layout that fits spans "
                               f"{widest} GPUs): plan at most {MAX_INSTANCES * widest:,} GPUs, one part of the fleet at a time")
        ok = table.meets(req.slo)
        front = pareto_front(table.cols["thr_gpu"], table.cols["tps_user"], ok)
        best_modes = []
        for mode in (AGG, 1 - AGG):
            m = ok & (table.cols["mode"] == mode)
            if m.any():
                rows = np.flatnonzero(m)
                best_modes.append(int(rows[np.lexsort((rows, -table.cols["thr_gpu"][rows]))[0]]))
        n_ok = int(ok.sum())
        # the screen's E2E estimate runs high and prunes nothing by itself (screen.e2e_at): where it alone puts every
        # row over the target, the rows its lower bound does not rule out are the simulator's to judge
        possible = table.meets(req.slo, e2e="e2e_floor")
        timings = dict(fit_s=t_fit, screen_s=t_screen, runner=runner.describe(),
                       screened_per_s=table.enumerated / max(t_screen, 1e-9))
        if n_ok == 0 and not (req.simulate_top and possible.any()):
            msg, closest = slo_unreachable(table, options, req.slo, stats.mean_prompt + stats.mean_output, model,
                                           min(space.batch_per_rank), stats.output_at(req.slo_percentile),
                                           stats.output_floor_at(req.slo_percentile), req.slo_percentile, space, req.gpus)
            return PlanReport(status="slo_unreachable", message=msg, closest_options=closest, candidates_screened=table.enumerated,
                              candidates_evaluated=len(table),
                              candidates_meeting_slo=0, candidates_simulated=0, simulations_run=0, assumptions=assumptions,
                              timings=Timings(simulate_s=0, total_s=time.perf_counter() - t0, simulated_per_s=0, **timings), **base)
        shortlist = _shortlist(table, ok, front, req.simulate_top) if n_ok else _nearest_e2e(table, possible, req.simulate_top)
        if req.simulate_top:
            extra = max(1, int(EXTRA_SHARE * req.simulate_top))
            shortlist = _per_layout(table, _near_slo(table, req.slo), shortlist, len(shortlist) + extra,
                                    lambda o: (options[o].layout.tp, options[o].layout.dp, options[o].layout.ep, options[o].layout.pp),
                                    first=table.e2e_within(req.slo, NEAR_SLO))
        if not n_ok:   # the best of each mode: the simulated rows nearest the E2E target (none meets it on the screen)
            best_modes = [next(i for i in shortlist if table.cols["mode"][i] == mode) for mode in (AGG, 1 - AGG)
                          if any(table.cols["mode"][i] == mode for i in shortlist)]
        router = prefix_router(stats)
        effects = EffectsSpec(expert_load=req.expert_load, host_cache_gb=host_cache_gb(stats, hw, req.host_cache_fraction))
        acceptance = _acceptance(max(drafts))
        outcomes: dict[int, SimOutcome] = {}
        t2 = time.perf_counter()
        sims_run = 0

        def simulate_rows(rows: list[int]) -> int:
            """Simulate ``rows`` at each load in turn, the misses again at the next (the best-screened half of them,
            bounded time); keeps each row's best outcome. Returns the simulations run."""
            n = 0
            pending = list(rows)
            for load in LOADS:
                if not pending:
                    break
                jobs = [build_job(table.candidate(i), options, model=req.model, hardware=req.hardware, calibration=req.calibration,
                                  workload=req.workload, slo=req.slo, seed=req.seed, effects=effects, router=router,
                                  mean_output=stats.mean_output, load=load, max_requests=req.sim_requests,
                                  acceptance=acceptance, label=f"cand{i}")
                        for i in pending]
                results = runner.map(run_job, jobs, req.slo_percentile)
                n += len(jobs)
                nxt = []
                for i, o in zip(pending, results):
                    prev = outcomes.get(i)
                    if prev is None or (meets(o, req.slo) and not meets(prev, req.slo)):
                        outcomes[i] = o
                    if not meets(o, req.slo):
                        nxt.append(i)
                pending = nxt[: max(2, req.simulate_top // 2)]
            return n

        if req.simulate_top:
            sims_run += simulate_rows(shortlist)
        # a deployment the simulator found over its TPOT target at its batch is simulated again at the next smaller batch
        # per rank (the screen's row with every other choice equal): the screen's TPOT runs low where a batch fills, and
        # the smaller batch it ranked lower may be the one that meets the SLO (qwen3-235b on 16 x H100, chat, TPOT p90
        # 30 ms: 2 x TP8 at B64 missed at 40.8 ms, smaller batches meet it at twice the throughput per GPU of the plan
        # chosen without them). At most BACKOFF_ROUNDS halvings of at most max(2, --simulate / 2) rows each: the
        # deployments whose simulated throughput per GPU was highest first (ranked by the smaller rows' screen
        # figures, the disaggregated ones' optimistic screen took both places of round two there, and the aggregated
        # 2 x TP8 at B16 that meets the SLO at 51 tok/s/GPU was found only with --simulate 16)
        for _ in range(BACKOFF_ROUNDS if req.simulate_top else 0):
            misses = [i for i, o in outcomes.items() if o.ok and not meets(o, req.slo) and o.tpot_s > req.slo.tpot_s]
            misses.sort(key=lambda i: -outcomes[i].thr_gpu)
            backoff = [j for j in dict.fromkeys(smaller_batch(table, i) for i in misses) if j is not None and j not in outcomes]
            backoff = backoff[: max(2, req.simulate_top // 2)]
            if not backoff:
                break
            sims_run += simulate_rows(backoff)
        t_sim = time.perf_counter() - t2
    timings.update(simulate_s=t_sim, simulated_per_s=sims_run / max(t_sim, 1e-9))

    # the recommendation: the best slice-confirmed candidate whose plan, simulated at full scale
    # exactly as `twinfer simulate --plan` runs it, meets the SLO (its figures are the plan's)
    confirmed = sorted(((o.thr_gpu, o.tps_user, -i, i) for i, o in outcomes.items() if meets(o, req.slo)), reverse=True)
    win, plan, full_runs, verdicts = None, None, [], {}
    if confirmed:
        t3 = time.perf_counter()
        rows = [c[3] for c in confirmed]
        mirrored = [mirrored_slice(c, options[c.option].layout.dp, req.workload.kind) for c in map(table.candidate, rows)]
        win, plan, full_runs, verdicts = _confirm(req, table, options, stats, model, hw, router, effects, ok, acceptance,
                                                  outcomes, points, confirmation_order(rows, mirrored))
        sims_run += len(full_runs)
        timings.update(simulate_s=t_sim + time.perf_counter() - t3, simulated_per_s=sims_run / max(t_sim + time.perf_counter() - t3, 1e-9))

    # one verdict per simulated candidate, after every check (slice, then full scale), for every table and list
    sim_points = {i: _point(table, options, i, passes(o, req.slo, full_scale_misses(verdicts)), "simulation", o,
                            1.0 / _share(table, i, o), full_scale=verdicts.get(i))
                  for i, o in sorted(outcomes.items())}
    # two frontiers, never mixed: the simulated candidates' (what the simulator confirmed) and the
    # analytic screen's (optimistic: full batches at 100% load, mean lengths)
    frontier = _frontier(list(sim_points.values()))
    # the screen's rows read 'meets the SLO': not one the simulator found missing it (the one verdict, ``passes``)
    ok_screen = ok.copy()
    ok_screen[[i for i, p in sim_points.items() if not p.meets_slo]] = False
    screen_front = pareto_front(table.cols["thr_gpu"], table.cols["tps_user"], ok_screen)
    frontier += _frontier([_point(table, options, i, True, "screen") for i in screen_front.tolist()])
    best_by_mode = [_best_of_mode(table, options, i, sim_points) for i in best_modes]
    simulated = list(sim_points.values())
    total = time.perf_counter() - t0
    common = dict(candidates_screened=table.enumerated, candidates_evaluated=len(table), candidates_meeting_slo=n_ok, candidates_simulated=len(outcomes),
                  simulations_run=sims_run, frontier=frontier, best_by_mode=best_by_mode, simulated=simulated, assumptions=assumptions,
                  timings=Timings(total_s=total, **timings), **base)
    if req.simulate_top and plan is None:
        closest = []
        tried = [(f"{describe_row(table, options, i)} (full scale, {fo.requests:,} requests)", fo) for i, fo in full_runs]
        tried += [(describe_row(table, options, i), o) for i, o in outcomes.items()]
        e2e_t = req.slo.e2e_s
        for label, o in sorted(tried, key=lambda kv: max(kv[1].ttft_s / req.slo.ttft_s, kv[1].tpot_s / req.slo.tpot_s,
                                                          kv[1].e2e_s / e2e_t if e2e_t else 0.0)):
            if o.error.startswith(STOPPED_EARLY):   # a full-scale run ended at a certain miss: partial figures, say why
                closest.append(f"{label}: {o.error}")
                continue
            e2e = "" if e2e_t is None else f", E2E {o.e2e_s:.2f} s"
            closest.append(f"{label}: simulated TTFT p{req.slo_percentile} {o.ttft_s:.2f} s, "
                           f"TPOT {o.tpot_s * 1e3:.1f} ms{e2e}, {o.thr_gpu:,.0f} tokens/s/GPU at {o.load:.0%} of the screened load")
        where = (f"none of the {len(outcomes)} simulated on slices does" if not full_runs else
                 f"{len(confirmed)} do on slices but none of the {len(full_runs)} full-scale runs of their plans does")
        head = (f"{n_ok:,} candidates meet the SLO in the analytic screen, but {where} "
                "(queueing and prefill interference the screen averages away)" if n_ok else
                f"no candidate meets the E2E target in the analytic screen (its estimate, TTFT + output tokens x TPOT at "
                f"the max batch, runs high) and {where}")
        return PlanReport(status="slo_unreachable",
                          message=f"{head}; relax the SLO or simulate more candidates (--simulate N)",
                          closest_options=closest[:5], **common)
    if plan is None:  # simulation disabled: the screen decides
        rows = np.flatnonzero(ok)
        win = int(rows[np.lexsort((rows, -table.cols["tps_user"][rows], -table.cols["thr_gpu"][rows]))[0]])
        plan = _make_plan(req, table.candidate(win), options, stats, model, hw, router, effects, None, table, ok, acceptance,
                          outcomes, points)
    plan.assumptions = assumptions
    return PlanReport(status="ok", message=f"recommended: {describe_row(table, options, win)}", recommended=plan, **common)


def _confirm(req, table, options, stats, model, hw, router, effects, ok, acceptance, outcomes, points, rows):
    """(row, plan, full-scale runs, verdicts): of ``rows`` (best slice first), the plan with the most output tokens/s
    per GPU meeting the SLO simulated at full scale (at the slice's rate, then lower: ``CONFIRM_RATE_STEPS``); (None,
    None, runs, verdicts) if none does. Stops at a candidate whose slice figure is below the best confirmed one
    (slices are optimistic: full scale adds the router and the ranks a slice mirrors).

    ``verdicts`` maps each row run at full scale to whether a run of it met the SLO there; every table takes that
    verdict (``passes``). A row that met it (the winner, or one met at a lower rate step) has its outcome in
    ``outcomes`` become that full-scale run, so every table shows the plan's figure."""
    runs, best, attempts = [], None, 0
    verdicts: dict[int, bool] = {}          # rows run at full scale (a run with nothing finished included): met?
    met: dict[int, SimOutcome] = {}         # each row's full-scale run meeting the SLO
    report("confirm_plan", 0, CONFIRM_MAX_RUNS)   # a progress bar's total: at most this many runs
    for i in rows:
        o = outcomes[i]
        if (best is not None and o.thr_gpu <= best[2].thr_gpu) or attempts >= CONFIRM_MAX_RUNS:
            break
        mine: list[tuple[float, float]] = []   # this candidate's full-scale runs: (rate step, tokens/s per GPU)
        for step in CONFIRM_RATE_STEPS:
            if attempts >= CONFIRM_MAX_RUNS:   # the limit holds across a candidate's rate steps too
                break
            if attempts:
                report("confirm_plan", attempts, CONFIRM_MAX_RUNS)
            attempts += 1
            if best is not None and step_bound(o.thr_gpu, step, mine) <= best[2].thr_gpu:
                # this step (and any lower) cannot beat the confirmed plan: not simulated, but it spends its run of
                # the budget as before, so the candidates tried after it are the same
                continue
            plan = _make_plan(req, table.candidate(i), options, stats, model, hw, router, effects, o, table, ok, acceptance,
                              outcomes, points, rate_scale=step)
            # a certain miss may end the run early, where its full figure is never read (confirm.may_stop_early)
            stop = may_stop_early(best is not None, step, attempts)
            full = confirm_plan(plan, i, float(table.cols["rate"][i]), req.slo_percentile, slo=req.slo if stop else None)
            verdicts.setdefault(i, False)
            if full is None:     # nothing finished at full scale: a miss
                continue
            runs.append((i, full))
            mine.append((step, full.thr_gpu))
            if meets(full, req.slo):
                met[i], verdicts[i] = full, True
                if best is None or full.thr_gpu > best[2].thr_gpu:
                    best = (i, plan, full)
                break
    report("confirm_plan", attempts, attempts)   # done: as many runs as it took
    outcomes.update(met)
    if best is None:
        return None, None, runs, verdicts
    i, plan, full = best
    plan.predicted = _predicted(full, table.candidate(i), plan.gpus_used, run_label(plan))
    plan.economics = _economics(req, hw, stats, plan.gpus_used, full.thr_gpu, full.in_gpu)
    # the reasons are recomputed from the full-scale outcome, so each figure they print is the plan's own
    where = ("at full scale" if plan.run_share is None else
             f"run on {plan.run_instances(plan.main_pool.role):,} of its {plan.main_pool.instances:,} "
             f"{plan.main_pool.role} instances at that share of its rate")
    headline = (f"highest simulated output throughput per GPU ({full.thr_gpu:,.0f} tokens/s, this plan {where}: "
                f"{full.requests:,} requests, the run `twinfer simulate --plan` repeats) among the "
                f"candidates whose full-scale run met the SLO (screen predicted {table.cols['thr_gpu'][i]:,.0f})")
    plan.why = _why(req, table, options, i, ok, outcomes, points, headline, table.candidate(i).gpus, full_scale_misses(verdicts))
    # slices that met the SLO above the plan's figure but never ran at full scale (the run budget went first): named,
    # so a frontier row above the plan reads as unconfirmed, not as beaten
    above = sorted(((o.thr_gpu, j) for j, o in outcomes.items()
                    if j not in verdicts and meets(o, req.slo) and o.thr_gpu > full.thr_gpu), reverse=True)
    if above:
        thr_j, j = above[0]
        plan.why.append(f"{len(above)} simulated candidate(s) met the SLO on a slice at more output tokens/s per GPU but "
                        f"were not run at full scale (at most {CONFIRM_MAX_RUNS} full-scale runs a search; a slice's figure "
                        f"is optimistic, only a plan's own run confirms it): the best, {describe_row(table, options, j)}, "
                        f"at {thr_j:,.0f} on its slice")
    for j, fo in runs:
        if not fo.error.startswith(STOPPED_EARLY):   # stopped runs only: why it stopped, not its partial figures
            continue
        run = f"{describe_row(table, options, j)} at {fo.load:.0%} of the screened load, {fo.error}"
        if verdicts[j]:   # it met the SLO at a lower rate step: its tables show that run
            lower = outcomes[j]
            plan.why.append(f"met the SLO at full scale only at a lower rate: {run}; at {lower.load:.0%} of the screened "
                            f"load it met it at {lower.thr_gpu:,.0f} output tokens/s per GPU")
        else:
            plan.why.append(f"rejected at full scale: {run}")
    return i, plan, runs, verdicts


def run_label(plan: Plan) -> str:
    """What the plan's run covers, for the figures' window: the whole plan, or the part a run holds."""
    if plan.run_share is None:
        return "full-scale run of this plan"
    main = plan.main_pool
    return (f"run of this plan on {plan.run_instances(main.role):,} of its {main.instances:,} {main.role} instances "
            f"(a run holds {MAX_RUN_REQUESTS:,} requests)")


def _economics(req: PlanRequest, hw, stats: WorkloadStats, gpus_used: int, thr_gpu: float,
               in_gpu: float | None = None) -> Economics:
    """The plan's economics at ``thr_gpu`` output and ``in_gpu`` prompt tokens/s per GPU (a simulated run's; None: the
    workload's prompt/output mix) on ``gpus_used`` GPUs."""
    return economics(hw, req.prices, gpus_used, req.gpus, thr_gpu * gpus_used, stats.mean_prompt, stats.mean_output,
                     stats.hit_fraction, None if in_gpu is None else in_gpu * gpus_used)


def _why(req: PlanRequest, table: Table, options: list[LayoutOption], i: int, ok: np.ndarray, outcomes: dict[int, SimOutcome],
         points: list, headline: str | None, gpus_used: int, rejected: set[int] = frozenset()) -> list[str]:
    """The plan's reasons: ``headline`` (if any), ``why_it_won``'s, then the GPUs of the budget it leaves unused.
    ``rejected``: rows whose full-scale runs missed the SLO (never quoted as meeting it)."""
    why = ([headline] if headline else []) + why_it_won(table, options, i, ok, req.slo, outcomes,
                                                         lambda x: passes(x, req.slo, rejected),
                                                         {p.option_index: p for p in points})
    if gpus_used < req.gpus:
        why.append(f"uses {gpus_used} of {req.gpus} GPUs: the remaining {req.gpus - gpus_used} cannot form another instance of this shape")
    return why


def _predicted(o: SimOutcome | None, cand: Candidate, gpus: int, what: str = "slice") -> Predicted:
    """The plan's figures: a simulation's steady window (``what`` it simulated), or the screen's."""
    if o is None:
        return Predicted(source="screen", request_rate=cand.rate, output_tokens_per_s_per_gpu=cand.thr_gpu,
                         tokens_per_s_per_user=cand.tps_user, ttft_s=cand.ttft_s, tpot_s=cand.tpot_s,
                         screen_output_tokens_per_s_per_gpu=cand.thr_gpu, window="screen: steady state at the max batch")
    return Predicted(source="simulation", request_rate=o.rate,
                     output_tokens_per_s_per_gpu=o.thr_gpu, tokens_per_s_per_user=o.tps_user, ttft_s=o.ttft_s, tpot_s=o.tpot_s,
                     screen_output_tokens_per_s_per_gpu=cand.thr_gpu, simulated_requests=o.requests, simulated_gpus=o.slice_gpus,
                     goodput_fraction=o.goodput_fraction, sim_digest=o.digest,
                     window=f"steady window of the {what} (twinfer simulate --json: metrics.steady)")


def answer_changing_defaults(req: PlanRequest, model, draft_len: int, acceptance: tuple[float, ...]) -> list[str]:
    """The defaults behind the plan that change its answer, said in words (printed with the plan, kept in its file)."""
    out = []
    if model.mtp_layers:
        searched = req.space.draft_len if req.space.draft_len is not None else (0, 1, 2, 3)
        how = "as asked" if req.space.draft_len is not None else "by default (the model has an MTP head)"
        out.append(f"MTP drafts {', '.join(map(str, searched))} searched {how}; this plan drafts {draft_len} per step"
                   + ("" if draft_len else " (MTP off)"))
        if draft_len:
            acc = acceptance[:draft_len]
            out.append(f"MTP acceptance per draft position {', '.join(f'{a:.3g}' for a in acc)} (0.85^i, the scheduler's "
                       f"default, not measured on this workload): {1 + sum(acc):.2f} tokens per decode step; lower acceptance "
                       "means fewer tokens/s per user and per GPU")
    if model.moe is None:
        return out
    el = req.expert_load
    skew = f"Zipf({el.zipf_s:g})" if el.skew == "zipf" else el.skew
    out.append(f"expert load skew {skew}" + (" (the default: TensorRT-LLM's DeepSeek-R1 EP32 measurement)" if el == type(el)() else " (as asked)")
               + "; uniform load would raise wide-EP throughput, heavier skew lower it")
    return out


def full_scale_misses(verdicts: dict[int, bool]) -> set[int]:
    """The rows run at full scale none of whose runs there met the SLO (``_confirm``'s verdicts)."""
    return {i for i, met in verdicts.items() if not met}


def passes(o: SimOutcome, slo, rejected: set[int] = frozenset()) -> bool:
    """The planner's verdict on a simulated candidate after every check it applied: its simulation meets the SLO
    (``meets``) and it is not among the ``rejected`` rows, those run at full scale that met it in no run there (a
    slice that met the SLO is no promise: the plan's own run decides). Every table, list and reason reads this."""
    return meets(o, slo) and o.row not in rejected


def _best_of_mode(table: Table, options, i: int, sim_points: dict[int, FrontierPoint]) -> FrontierPoint:
    """The best deployment of the mode of the screen's best row ``i``: the simulated candidate of that mode with the
    most output tokens/s per GPU meeting the SLO after every check (``passes``), those confirmed at full scale first
    (so the plan heads its own mode: a slice the confirmation never ran is not a better one); else, where ``i`` was
    simulated, ``i`` missing it (named as a miss, not listed); else ``i`` as the screen has it."""
    mode = table.cols["mode"][i]
    good = [p for j, p in sim_points.items() if table.cols["mode"][j] == mode and p.meets_slo]
    if good:
        return max(good, key=lambda p: (bool(p.full_scale), p.output_tokens_per_s_per_gpu, p.tokens_per_s_per_user, -p.row))
    return sim_points[i] if i in sim_points else _point(table, options, i, True, "screen")


def _frontier(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points meeting the SLO that no other dominates, by descending throughput (at most FRONTIER_POINTS, spread)."""
    good = [p for p in points if p.meets_slo]
    if not good:
        return []
    keep = pareto_front(np.array([p.output_tokens_per_s_per_gpu for p in good]), np.array([p.tokens_per_s_per_user for p in good]))
    out = [good[k] for k in keep.tolist()]
    if len(out) > FRONTIER_POINTS:
        sel = np.linspace(0, len(out) - 1, FRONTIER_POINTS).round().astype(int)
        out = [out[k] for k in sorted(set(sel.tolist()))]
    return out


def _screen_job(item, ctx):
    index, opt = item
    return screen_layout(ctx, index, opt)


def _share(table: Table, i: int, o: SimOutcome | None) -> float:
    """Share of the deployment's request rate the slice simulated (rate_slice / rate_full at the same load)."""
    if o is None or o.rate <= 0:
        return 1.0
    return o.rate / (float(table.cols["rate"][i]) * o.load)


# long requests' lives a plan's full-scale run spans in its steady window (``_make_plan``)
LIFETIMES = 5


def _make_plan(req: PlanRequest, cand: Candidate, options: list[LayoutOption], stats: WorkloadStats, model, hw,
               router: RouterConfig, effects: EffectsSpec, o: SimOutcome | None, table: Table, ok: np.ndarray,
               acceptance: tuple[float, ...], outcomes: dict[int, SimOutcome], points: list, rate_scale: float = 1.0) -> Plan:
    dopt = options[cand.option]
    acc = acceptance[: cand.draft_len]
    main_sc = scheduler_for(cand.batch_per_rank, dopt.layout.dp, cand.draft_len, cand.async_overlap, cand.chunk_tokens, acc,
                            explicit_ranks(cand.mode, effects), cand.adp_balance)
    if cand.mode == "aggregated":
        pools = [PoolPlan(role="mixed", instances=cand.instances, layout=dopt.layout, scheduler=main_sc, label=dopt.describe())]
    else:
        popt = options[cand.prefill_option]
        psc = scheduler_for(1, popt.layout.dp, 0, cand.prefill_async, cand.prefill_chunk)
        psc = psc.model_copy(update={"max_num_seqs": max(64, 16 * popt.layout.dp),
                                     "max_num_batched_tokens": max(cand.prefill_chunk * popt.layout.dp, 16 * popt.layout.dp)})
        pools = [PoolPlan(role="prefill", instances=cand.prefill_instances, layout=popt.layout, scheduler=psc, label=popt.describe()),
                 PoolPlan(role="decode", instances=cand.instances, layout=dopt.layout, scheduler=main_sc, label=dopt.describe())]
    if o is not None:
        rate = o.rate / _share(table, cand.row, o) * rate_scale
        thr_gpu = o.thr_gpu
    else:
        rate, thr_gpu = cand.rate, cand.thr_gpu
    seats = sum(p.instances * p.scheduler.max_num_seqs for p in pools if p.role != "prefill")
    # enough requests for the full-scale run to pass the workload's ramp-up (agentic sessions), turn its seats over ~3
    # times (at least 30 s) at the planned rate, and span LIFETIMES of its long requests' lives (the p99 output at the
    # slice's TPOT after its TTFT): the steady window measures a settled occupancy only once it is several of those long
    # (the default chat plan on 8 x GB300 read TTFT p90 0.52 s and 2,912 tok/s/GPU at 3,072 requests, 0.81-0.85 s and
    # 3,100-3,127 from 12,288 to 49,152)
    _, warmup = steady_workload(req.workload, max(rate, 1e-6), 1)
    tpot = o.tpot_s if o is not None and 0 < o.tpot_s < math.inf else req.slo.tpot_s
    ttft = o.ttft_s if o is not None and 0 < o.ttft_s < math.inf else req.slo.ttft_s
    window = max(30.0, 3 * seats / max(rate, 1e-6), LIFETIMES * (ttft + stats.output_at(99) * tpot))
    need = rate * (warmup + window)
    share = None
    if need > MAX_RUN_REQUESTS and req.workload.kind != "trace":
        # more than a run holds: the run takes the largest part of the deployment whose seats it turns over (the
        # requests it needs scale with the instances: same seats per request/s), at the same share of the rate
        n_main = pools[-1].instances
        most = max(1, min(n_main, int(n_main * MAX_RUN_REQUESTS / need)))
        k = RunShare.best_instances(most, n_main, [p.instances for p in pools[:-1]])
        if k < n_main:
            share = RunShare(instances=k, whole_requests=int(need))
            need *= k / n_main
    n_plan = int(min(MAX_RUN_REQUESTS, max(2_000, need)))
    wl = at_rate(req.workload, rate, n_plan)   # a trace: replayed at the rate sized for (sim.workload.at_rate)
    eff = effects.model_copy(update={"eplb": dopt.eplb != "off", "table_placement": dopt.table_placement})
    gpus_used = cand.gpus
    econ = _economics(req, hw, stats, gpus_used, thr_gpu, None if o is None else o.in_gpu)
    headline = None if o is None else (f"highest simulated output throughput per GPU ({thr_gpu:,.0f} tokens/s) among the "
                                       f"candidates meeting the SLO in simulation (screen predicted {cand.thr_gpu:,.0f})")
    why = _why(req, table, options, cand.row, ok, outcomes, points, headline, gpus_used)
    defaults = answer_changing_defaults(req, model, cand.draft_len, acceptance)
    name = f"{model.name}-{hw.name}-{req.gpus}gpu-{cand.mode}".lower()
    predicted = _predicted(o, cand, gpus_used)
    predicted.request_rate = rate
    return Plan(name=name, model=req.model, hardware=req.hardware, calibration=req.calibration, gpus_budget=req.gpus, mode=cand.mode, pools=pools,
                router=router, effects=eff, workload=wl, slo=req.slo, slo_percentile=req.slo_percentile, seed=req.seed,
                steady_after_s=warmup or None, run_share=share,
                predicted=predicted, economics=econ, why=why, defaults=defaults)

