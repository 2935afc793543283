"""Check screened candidates in the simulator, on a slice of the deployment.

Simulating 72 GPUs' worth of concurrent requests for every shortlisted candidate would take
minutes, so each candidate is simulated as a **slice** with the same per-GPU behaviour:

- aggregated: one instance (identical instances behind a router see the same traffic share);
  an attention-DP instance is further cut to ``d_s`` of its ``dp`` ranks (``EffectsSpec.mirror``:
  the cost model sees the batch mirrored, so step times are the full instance's);
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
from fractions import Fraction

from planner.combine import Candidate
from planner.space import LayoutOption
from scheduler.config import SchedulerConfig
from sim.disagg import DisaggSpec
from sim.effects import EffectsSpec
from scheduler.metrics import SLO
from sim.router import RouterConfig
from sim.scenario import Scenario
from sim.workload import WorkloadSpec

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


def scheduler_for(B: int, ranks: int, draft: int, overlap: bool, chunk: int, acceptance: tuple[float, ...] = ()) -> SchedulerConfig:
    """The scheduler of an instance (or slice) with ``ranks`` attention-DP ranks of ``B`` seats and ``chunk`` prefill tokens each."""
    seats = B * ranks
    budget = (chunk + B * (1 + draft)) * ranks
    return SchedulerConfig(max_num_seqs=seats, max_num_batched_tokens=budget, long_prefill_threshold=chunk,
                           draft_len=draft, acceptance_rates=list(acceptance), async_overlap=overlap, host_workers=ranks)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _ranks_in_slice(dp: int, seats_per_rank: int, budget_seats: int) -> int:
    """Largest divisor of ``dp`` whose ranks hold at most ``budget_seats`` requests (at least 1)."""
    best = 1
    for d in _divisors(dp):
        if d * seats_per_rank <= budget_seats:
            best = d
    return best


def _nearest_divisor(n: int, target: float) -> int:
    return min(_divisors(n), key=lambda d: (abs(math.log(d / max(target, 1e-9))), d))


def build_job(cand: Candidate, options: list[LayoutOption], *, model: str, hardware: str, workload: WorkloadSpec,
              slo: SLO, seed: int, effects: EffectsSpec, router: RouterConfig, mean_output: float, load: float,
              max_requests: int, acceptance: tuple[float, ...], label: str) -> SimJob:
    """The slice simulation of ``cand`` at ``load`` x its screened request rate."""
    dopt = options[cand.option]
    dlay = dopt.layout
    acc = tuple(acceptance[: cand.draft_len])
    seats_cap = AGENTIC_SLICE_SEATS if workload.kind == "agentic" else SLICE_SEATS
    if cand.mode == "aggregated":
        ranks = _ranks_in_slice(dlay.dp, cand.batch_per_rank, seats_cap)
        mirror = dlay.dp // ranks
        share = 1.0 / (cand.instances * mirror)
        sc = scheduler_for(cand.batch_per_rank, ranks, cand.draft_len, cand.async_overlap, cand.chunk_tokens, acc)
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
    n_req = int(min(max_requests, max(MIN_REQUESTS, 3 * seats)))
    wl, warmup = steady_workload(workload, max(rate, 1e-3), n_req)
    scen = Scenario(name=label, model=model, hardware=hardware, layout=dlay, instances=scen_inst, scheduler=sc,
                    workload=wl, router=router, slo=slo, seed=seed)
    eff = effects.model_copy(update={"mirror": mirror, "eplb": dopt.eplb != "off", "table_placement": dopt.table_placement})
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
    """
    if spec.kind == "trace":
        return spec, 0.0
    if spec.kind != "agentic":
        return spec.model_copy(update={"rate": rate, "num_requests": n, "duration_s": None}), 0.0
    turn_gap = spec.est_ttft_s + spec.est_tpot_s * spec.output_len.mean() + spec.think_time_s.mean()
    warmup = max(0.0, spec.turns.mean() - 1.0) * turn_gap
    return spec.model_copy(update={"rate": rate, "num_requests": None, "duration_s": warmup + n / rate}), warmup


def run_job(job: SimJob, percentile: int = 90) -> SimOutcome:
    """Simulate one slice (a worker job; deterministic) and keep the planner's numbers.

    Latencies and throughput are measured on the steady part: requests arriving after the first
    20% of the simulated arrivals (the fill of an empty system is not what the plan runs in).
    """
    import numpy as np

    from sim.deployment import simulate_deployment
    from sim.workload import generate
    from twinfer.errors import TwinferError

    t0 = time.perf_counter()
    fail = SimOutcome(job.row, job.load, False, "", 0, 0, math.inf, math.inf, 0, 0, 0, job.slice_gpus, job.slice_rate, "", 0.0)
    try:
        run = simulate_deployment(job.scenario, job.effects, job.disagg)
    except (TwinferError, ValueError) as e:
        return dataclasses.replace(fail, error=str(e), wall_s=time.perf_counter() - t0)
    r = run.result
    m = r.metrics
    arr = np.array([q.arrival_time for q in run.requests])
    # steady part: after the warm-up (agentic ramp) or, without one, after the first 20% of arrivals
    cut = job.warmup_s if job.warmup_s > 0 else (np.percentile(arr, 20) if arr.size else 0.0)
    steady = [q for q in run.requests if q.arrival_time >= cut]
    done = [q for q in steady if q.finish_time is not None and q.first_token_time is not None]
    ttft = np.array([q.first_token_time - q.arrival_time for q in done])
    multi = [q for q in done if q.num_output_tokens > 1]
    tpot = np.array([(q.finish_time - q.first_token_time) / (q.num_output_tokens - 1) for q in multi])
    fin = len(done) / max(len(steady), 1)
    tpot_pos = tpot[tpot > 0]
    return SimOutcome(
        row=job.row, load=job.load, ok=True, error="",
        thr_gpu=sustained_output_rate(steady) / job.share / job.full_gpus if job.full_gpus else 0.0,
        tps_user=float(np.mean(1.0 / tpot_pos)) if tpot_pos.size else 0.0,
        ttft_s=float(np.percentile(ttft, percentile)) if ttft.size else math.inf,
        tpot_s=float(np.percentile(tpot, percentile)) if tpot.size else math.inf,
        goodput_fraction=m.goodput_fraction or 0.0, finished_fraction=fin, requests=r.num_requests,
        slice_gpus=job.slice_gpus, rate=job.slice_rate, digest=r.digest, wall_s=time.perf_counter() - t0,
    )


def sustained_output_rate(requests) -> float:
    """Output tokens/s of the requests arriving between the 10th and 90th percentile of ``requests``' arrival
    times, over that span: the offered load the slice carried (unfinished requests count nothing).

    A whole-run average would include the fill and the drain; the SLO check says whether the
    slice kept up with the offered load.
    """
    import numpy as np

    if not requests:
        return 0.0
    arr = np.array([q.arrival_time for q in requests])
    out = np.array([q.num_output_tokens if q.finish_time is not None else 0 for q in requests], float)
    lo, hi = np.percentile(arr, [10, 90])
    if hi <= lo:
        return float(out.sum() / max(arr.max() - arr.min(), 1e-9))
    sel = (arr >= lo) & (arr < hi)
    return float(out[sel].sum() / (hi - lo))


def meets(o: SimOutcome, slo: SLO) -> bool:
    """A simulated slice meets the SLO at its percentile and served (almost) every request."""
    return o.ok and o.ttft_s <= slo.ttft_s and o.tpot_s <= slo.tpot_s and o.finished_fraction >= 0.99

