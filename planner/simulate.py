"""Check screened candidates in the simulator, on a slice of the deployment.

Simulating 72 GPUs' worth of concurrent requests for every shortlisted candidate would take
minutes, so each candidate is simulated as a **slice** with the same per-GPU behaviour:

- aggregated: one instance (identical instances behind a router see the same traffic share);
  an attention-DP instance is further cut to ``d_s`` of its ``dp`` ranks (``EffectsSpec.mirror``:
  the cost model sees the batch mirrored, so step times are the full instance's). Its scheduler
  drives those ranks explicitly (``SchedulerConfig.attention_dp``: each request on one rank, per-rank
  seats, tokens and KV, the step priced at the ranks assigned), as the plan's full-scale run and
  ``twinfer simulate --plan`` do (``explicit_ranks``);
- disaggregated: the pool ratio ``n_p : n_d`` reduced to small integers (at most 6 instances),
  each pool mirrored so both carry the same share of the deployment.

The slice gets the matching share of the request rate, at ``load`` x the screened capacity
(0.9, then 0.7 if the SLO is missed), and enough requests for ~3 turnovers of its seats.
Running one instance per pool is the same as a perfect cache-aware router keeping a
session's turns together; the full-scale plan (``twinfer simulate --plan``) keeps the router.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from planner.combine import Candidate
from planner.gc_pause import gc_paused
from planner.slo import MIN_FINISHED
from planner.space import LayoutOption
from scheduler.config import AttentionDPConfig, SchedulerConfig
from sim.disagg import DisaggSpec
from sim.effects import EffectsSpec
from scheduler.metrics import SLO
from sim.router import RouterConfig
from sim.scenario import Scenario
from sim.workload import WorkloadSpec, at_rate

SLICE_SEATS = 512          # most concurrent requests a simulated slice holds
AGENTIC_SLICE_SEATS = 128  # agentic runs simulate a session ramp too: keep their slices small
MIN_REQUESTS = 300


@dataclass(frozen=True)
class SimJob:
    """One simulation of a candidate slice (picklable)."""

    label: str
    row: int
    load: float
    scenario: Scenario
    effects: EffectsSpec
    disagg: DisaggSpec | None
    slice_gpus: float
    slice_rate: float
    warmup_s: float = 0.0
    num_requests: int = 0
    share: float = 1.0         # share of the deployment's traffic (and decode or mixed pool) the slice carries
    full_gpus: int = 0         # GPUs of the whole deployment


@dataclass(frozen=True)
class SimOutcome:
    """What the planner keeps from a simulation."""

    row: int
    load: float
    ok: bool
    error: str
    thr_gpu: float
    tps_user: float
    ttft_s: float
    tpot_s: float
    goodput_fraction: float
    finished_fraction: float
    requests: int
    slice_gpus: float
    rate: float
    digest: str
    wall_s: float
    e2e_s: float = math.inf      # end-to-end latency at the percentile (read only where the SLO sets a target)
    in_gpu: float = 0.0          # prompt tokens/s per GPU of the window (the plan's economics read the run's own)


def scheduler_for(B: int, ranks: int, draft: int, overlap: bool, chunk: int, acceptance: tuple[float, ...] = (),
                  explicit: bool = False, balance: bool = False) -> SchedulerConfig:
    """The scheduler of an instance (or slice) with ``ranks`` attention-DP ranks of ``B`` seats and ``chunk`` prefill
    tokens each; with ``explicit`` (and 2+ ranks) it schedules the ranks explicitly (``scheduler.dp_attention``:
    SGLang's ``immediate`` placement, budgets per rank; with ``balance``, TensorRT-LLM's ADP balance), else as one
    pooled batch the cost model splits."""
    seats = B * ranks
    budget = (chunk + B * (1 + draft)) * ranks
    return SchedulerConfig(max_num_seqs=seats, max_num_batched_tokens=budget, long_prefill_threshold=chunk,
                           draft_len=draft, acceptance_rates=list(acceptance), async_overlap=overlap, host_workers=ranks,
                           attention_dp=AttentionDPConfig(prefill="balance" if balance else "immediate")
                           if explicit and ranks > 1 else None)


def explicit_ranks(mode: str, effects: EffectsSpec) -> bool:
    """Whether a pool's attention-DP ranks are scheduled explicitly: in aggregated deployments, where the simulator
    models them (not yet next to a prefill pool, nor with drifting expert load or periodic EPLB: sim.effects
    refuses those), so a slice, the plan's full-scale run and ``twinfer simulate --plan`` use one rank model."""
    el = effects.expert_load
    drifting = (el is not None and el.drift_fraction_per_min > 0) or effects.eplb_period_s is not None
    return mode == "aggregated" and not drifting


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def ranks_in_slice(dp: int, seats_per_rank: int, budget_seats: int) -> int:
    """Largest divisor of ``dp`` whose ranks hold at most ``budget_seats`` requests (at least 1)."""
    best = 1
    for d in _divisors(dp):
        if d * seats_per_rank <= budget_seats:
            best = d
    return best


def slice_seats(workload_kind: str) -> int:
    """Most concurrent requests a simulated slice of a ``workload_kind`` workload holds."""
    return AGENTIC_SLICE_SEATS if workload_kind == "agentic" else SLICE_SEATS


def slice_requests(seats: int, most: int) -> int:
    """Requests a slice simulates: ~3 turnovers of its ``seats``, at least MIN_REQUESTS, at most ``most``."""
    return int(min(most, max(MIN_REQUESTS, 3 * seats)))


def mirrored_slice(cand: Candidate, dp: int, workload_kind: str) -> bool:
    """Whether ``cand``'s slice simulates only a share of an aggregated attention-DP instance's ranks (mirror > 1)."""
    return cand.mode == "aggregated" and ranks_in_slice(dp, cand.batch_per_rank, slice_seats(workload_kind)) < dp


def _nearest_divisor(n: int, target: float) -> int:
    return min(_divisors(n), key=lambda d: (abs(math.log(d / max(target, 1e-9))), d))


def build_job(cand: Candidate, options: list[LayoutOption], *, model: str, hardware: str, workload: WorkloadSpec,
              slo: SLO, seed: int, effects: EffectsSpec, router: RouterConfig, mean_output: float, load: float,
              max_requests: int, acceptance: tuple[float, ...], label: str, calibration: str | None = None) -> SimJob:
    """The slice simulation of ``cand`` at ``load`` x its screened request rate."""
    dopt = options[cand.option]
    dlay = dopt.layout
    acc = tuple(acceptance[: cand.draft_len])
    seats_cap = slice_seats(workload.kind)
    if cand.mode == "aggregated":
        ranks = ranks_in_slice(dlay.dp, cand.batch_per_rank, seats_cap)
        mirror = dlay.dp // ranks
        share = 1.0 / (cand.instances * mirror)
        sc = scheduler_for(cand.batch_per_rank, ranks, cand.draft_len, cand.async_overlap, cand.chunk_tokens, acc,
                           explicit_ranks(cand.mode, effects), cand.adp_balance)
        scen_inst, disagg = 1, None
        slice_gpus = dlay.gpus / mirror
        seats = sc.max_num_seqs
    else:
        popt = options[cand.prefill_option]
        b, mirror, a, p_mirror = _disagg_slice(cand, dlay.dp, popt.layout.dp, seats_cap)
        share = b / (cand.instances * mirror)           # share of the decode pool (and of the traffic) simulated
        ranks = dlay.dp // mirror
        sc = scheduler_for(cand.batch_per_rank, ranks, cand.draft_len, cand.async_overlap, cand.chunk_tokens, acc)
        p_ranks = popt.layout.dp // p_mirror
        psc = scheduler_for(1, p_ranks, 0, cand.prefill_async, cand.prefill_chunk)
        psc = psc.model_copy(update={"max_num_seqs": max(64, 16 * p_ranks),
                                     "max_num_batched_tokens": max(cand.prefill_chunk * p_ranks, 16 * p_ranks)})
        disagg = DisaggSpec(prefill_layout=popt.layout, prefill_instances=a, prefill_scheduler=psc,
                            prefill_router=router, prefill_mirror=p_mirror)
        scen_inst = b
        slice_gpus = b * dlay.gpus / mirror + a * popt.layout.gpus / p_mirror
        seats = b * sc.max_num_seqs
    rate = cand.rate * share * load
    n_req = slice_requests(seats, max_requests)
    wl, warmup = steady_workload(workload, max(rate, 1e-3), n_req)
    eff = effects.model_copy(update={"mirror": mirror, "eplb": dopt.eplb != "off", "table_placement": dopt.table_placement})
    # validated with its effects: explicit attention-DP ranks are layout.dp / effects.mirror
    scen = Scenario(name=label, model=model, hardware=hardware, calibration=calibration, layout=dlay, instances=scen_inst, scheduler=sc,
                    workload=wl, router=router, slo=slo, seed=seed, steady_after_s=warmup or None, effects=eff)
    return SimJob(label, cand.row, load, scen, eff, disagg, slice_gpus, rate, warmup, n_req, share, cand.gpus)


def _disagg_slice(cand: Candidate, dp_d: int, dp_p: int, seats_cap: int) -> tuple[int, int, int, int]:
    """(decode instances, decode mirror, prefill instances, prefill mirror) of the smallest slice whose two pools
    carry the same share of their pools (within the divisors available), seats within ``seats_cap``."""
    best = None
    for b in range(1, 5):
        for m_d in _divisors(dp_d):
            if b * cand.batch_per_rank * dp_d // m_d > max(seats_cap, cand.batch_per_rank):
                continue
            f_d = b / (cand.instances * m_d)
            for a in range(1, 5):
                for m_p in _divisors(dp_p):
                    f_p = a / (cand.prefill_instances * m_p)
                    miss = abs(math.log(f_p / f_d))
                    size = b * dp_d // m_d + a * dp_p // m_p
                    key = (round(miss, 3), size, b, a, m_d, m_p)
                    if best is None or key < best[0]:
                        best = (key, (b, m_d, a, m_p))
    if best is None:  # one decode rank already exceeds the seat cap: simulate it anyway
        return 1, dp_d, 1, max(1, _nearest_divisor(dp_p, dp_p * cand.prefill_instances / cand.instances / dp_d))
    return best[1]


def steady_workload(spec: WorkloadSpec, rate: float, n: int) -> tuple[WorkloadSpec, float]:
    """The workload at ``rate`` for the simulation, and the arrival time after which it is in steady state.

    Agentic sessions ramp up over one session's span (turns x (answer time + think time)):
    before that fewer sessions overlap than the rate implies, and a run cut short at the start
    would miss the cache reuse of earlier turns. So the simulation starts empty at t = 0, runs
    past one mean session span (``warmup``) and ``n`` more requests; the planner measures only
    requests arriving after ``warmup``.

    A trace is its first ``n`` requests replayed at ``rate`` (``sim.workload.at_rate``: its arrival times scaled),
    as a generated workload's rate is replaced: what a slice is offered is the rate it is said to be (it replayed
    the whole trace at the trace's own rate on every slice, whatever share of the deployment that was).
    """
    if spec.kind == "trace":
        return at_rate(spec, rate, n), 0.0
    if spec.kind != "agentic":
        return spec.model_copy(update={"rate": rate, "num_requests": n, "duration_s": None}), 0.0
    turn_gap = spec.est_ttft_s + spec.est_tpot_s * spec.output_len.mean() + spec.think_time_s.mean()
    warmup = max(0.0, spec.turns.mean() - 1.0) * turn_gap
    return spec.model_copy(update={"rate": rate, "num_requests": None, "duration_s": warmup + n / rate}), warmup


def run_job(job: SimJob, percentile: int = 90) -> SimOutcome:
    """Simulate one slice (a worker job; deterministic) and keep the planner's numbers.

    The numbers are the run's steady window (``SimMetrics.steady``, the figure ``twinfer
    simulate`` reports under that name): latencies of the requests arriving after the ramp-up
    (the agentic warm-up, else the 10th percentile arrival), the output rate delivered while
    the middle 80% of the requests finish, scaled from the slice's share to the deployment.
    """
    from sim.runner import simulate
    from twinfer.errors import TwinferError

    t0 = time.perf_counter()
    fail = SimOutcome(job.row, job.load, False, "", 0, 0, math.inf, math.inf, 0, 0, 0, job.slice_gpus, job.slice_rate, "", 0.0)
    try:
        with gc_paused():
            run = simulate(job.scenario.model_copy(update={"effects": job.effects, "disagg": job.disagg}))
    except (TwinferError, ValueError) as e:
        return dataclasses.replace(fail, error=str(e), wall_s=time.perf_counter() - t0)
    r = run.result
    w = r.metrics.steady or r.metrics.whole_run
    if w is None:
        return dataclasses.replace(fail, error="no request finished", wall_s=time.perf_counter() - t0)
    return outcome_of(w, job.row, job.load, percentile, job.share, job.full_gpus, r.num_requests, job.slice_gpus,
                      job.slice_rate, r.digest, time.perf_counter() - t0)


def outcome_of(w, row: int, load: float, percentile: int, share: float, full_gpus: int, requests: int, slice_gpus: float,
               rate: float, digest: str, wall_s: float) -> SimOutcome:
    """The planner's numbers from a run's window (``scheduler.metrics.WindowMetrics``) of a ``share`` of the deployment."""
    def pct(stat) -> float:
        v = getattr(stat, f"p{percentile}")
        return math.inf if v is None else float(v)

    return SimOutcome(
        row=row, load=load, ok=True, error="",
        thr_gpu=w.output_throughput / share / full_gpus if full_gpus else 0.0,
        tps_user=w.per_user_output_tps_mean or 0.0, ttft_s=pct(w.ttft_s), tpot_s=pct(w.tpot_s),
        goodput_fraction=w.goodput_fraction or 0.0, finished_fraction=w.finished_fraction or 0.0, requests=requests,
        slice_gpus=slice_gpus, rate=rate, digest=digest, wall_s=wall_s, e2e_s=pct(w.e2e_s),
        in_gpu=w.input_throughput / share / full_gpus if full_gpus else 0.0,
    )


def meets(o: SimOutcome, slo: SLO) -> bool:
    """A simulated slice meets the SLO at its percentile (TTFT, TPOT, and E2E where it sets one) and served (almost)
    every request."""
    return (o.ok and o.ttft_s <= slo.ttft_s and o.tpot_s <= slo.tpot_s and (slo.e2e_s is None or o.e2e_s <= slo.e2e_s)
            and o.finished_fraction >= MIN_FINISHED)

