"""The tuned policy as a deployment plan: ``twinfer simulate --plan`` repeats it, ``twinfer serve --plan`` runs it.

The winner becomes an aggregated plan (``planner.plan.Plan``): ``gpus // EP width`` instances of
its DEP layout with its scheduler (overlap, replay length, batch, chunk), the workload at the
tuned per-GPU rate. Its figures come from one full-scale run of ``Plan.to_scenario()`` — the run
``twinfer simulate --plan`` does — so that command reports the same figures and digest.
"""

from __future__ import annotations

from costmodels.catalog import get_model
from planner.plan import Plan, PoolPlan, Predicted
from planner.simulate import steady_workload
from planner.tune_policies import Policy, TuneContext, scheduler_of
from sim.workload import offered_rate

PLAN_MIN_REQUESTS = 1000


PLAN_UTILISATION = 0.9   # a plan tuned at capacity is served at this share of it


def tuned_plan(ctx: TuneContext, p: Policy, why: list[str], *, max_requests: int = 20000, capacity_per_gpu: float = 0.0) -> Plan:
    """The plan of policy ``p`` on the context's GPUs (no figures yet: :func:`confirm`): at the tuned rate per GPU, or,
    when tuned at capacity, at ``PLAN_UTILISATION`` x the winner's capacity (``capacity_per_gpu`` requests/s per GPU: its
    output tokens/s per GPU over the workload's mean output, since a saturated run's steady window finishes short requests
    more often than they arrive)."""
    opt = ctx.options[p.ep_width]
    instances = max(1, ctx.gpus // opt.layout.gpus)
    sc = scheduler_of(p, opt.layout.dp, ctx.draft_len, ctx.shipped_replay, get_model(ctx.model))
    per_gpu = PLAN_UTILISATION * capacity_per_gpu if ctx.saturated else ctx.rate_per_gpu
    rate = per_gpu * instances * opt.layout.gpus
    _, warmup = steady_workload(ctx.workload, max(rate, 1e-6), 1)
    # enough requests to pass the ramp-up and turn the seats over ~3 times (at least 30 s), as planner.search does
    window = max(30.0, 3 * instances * sc.max_num_seqs / max(rate, 1e-6))
    wanted = rate * (warmup + window)
    n = int(min(max_requests, max(PLAN_MIN_REQUESTS, wanted)))
    if n < wanted:
        # held to max_requests: the steady window starts halfway, as on the slices (tune_policies.slice_workload)
        warmup = min(warmup, n / max(rate, 1e-6) / 2)
    wl = ctx.workload.model_copy(update={"rate": rate, "num_requests": n, "duration_s": None}) if ctx.workload.kind != "trace" else ctx.workload
    eff = ctx.effects.model_copy(update={"eplb": False, "table_placement": opt.table_placement})
    assumptions = [
        "EP width is a simulated recommendation: measured only where several GPUs are lent (one GPU runs EP1)",
        ("policies compared at capacity (every request queued at once); the plan runs at "
         f"{PLAN_UTILISATION:.0%} of the winner's simulated capacity" if ctx.saturated else
         "policies compared at one offered request rate per GPU") + ", each on a slice of the deployment (planner.simulate)",
        "replay W applies to every sliding-window layer (SchedulerConfig.swa_replay_tokens)",
    ]
    return Plan(name=f"tuned-{ctx.model}-{ctx.hardware}-{ctx.gpus}gpu".lower(), model=ctx.model, hardware=ctx.hardware,
                calibration=ctx.calibration, gpus_budget=ctx.gpus, mode="aggregated",
                pools=[PoolPlan(role="mixed", instances=instances, layout=opt.layout, scheduler=sc, label=opt.describe())],
                router=ctx.router, effects=eff, workload=wl, slo=ctx.slo or _no_slo(), slo_percentile=ctx.slo_percentile,
                seed=ctx.seed, steady_after_s=warmup or None, why=list(why), assumptions=assumptions)


def _no_slo():
    from scheduler.metrics import SLO

    return SLO(ttft_s=1e6, tpot_s=1e6)


def confirm(plan: Plan) -> Plan:
    """``plan`` with its figures from the full-scale run ``twinfer simulate --plan`` repeats (steady window, digest)."""
    from sim.runner import simulate

    r = simulate(plan.to_scenario()).result
    m = r.metrics
    w = m.steady or m.whole_run
    pct = plan.slo_percentile
    val = lambda s: float(getattr(s, f"p{pct}") or 0.0)  # noqa: E731
    plan.predicted = Predicted(
        source="simulation", request_rate=offered_rate(plan.workload) or 0.0,
        output_tokens_per_s_per_gpu=(w.output_throughput / r.num_gpus) if w else 0.0,
        tokens_per_s_per_user=(w.per_user_output_tps_mean or 0.0) if w else 0.0,
        ttft_s=val(w.ttft_s) if w else 0.0, tpot_s=val(w.tpot_s) if w else 0.0,
        simulated_requests=r.num_requests, simulated_gpus=float(r.num_gpus),
        goodput_fraction=(w.goodput_fraction if w else None), sim_digest=r.digest,
        window=f"{'steady' if m.steady else 'whole-run'} window of the full-scale run of this plan (twinfer simulate --plan)")
    return plan
