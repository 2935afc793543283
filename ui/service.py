"""Adapters from the Streamlit app to planner/, sim/ and costmodels/: plain data in, plain data out.

The app wraps these in st.cache_data, so arguments are plain values (str, numbers, dicts)
and results are picklable pydantic models. No modelling lives here: each function composes
calls into the packages and reshapes their results for display. Nothing imports streamlit.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from twinfer.config import validate
from twinfer.errors import TwinferError

Progress = Callable[[float, str], None]  # (fraction done, what is running)

# How a step's time is shown: the cost model's categories, grouped the way a planner asks.
BREAKDOWN_GROUPS = {
    "attention": ("attention",), "indexer": ("indexer",), "experts": ("expert_gemm",),
    "dense GEMMs": ("dense_gemm",), "communication": ("communication",), "other": ("other",),
}
# Target-traffic sizing: plans tried after the first guess before giving up (each adds one instance).
SIZING_TRIES = 3


# ---------------------------------------------------------------- catalogs
def model_names() -> list[str]:
    """Catalog models (the executor's toy 'tiny' left out: nobody plans capacity for it)."""
    from costmodels.catalog import list_models

    return [m for m in list_models() if m != "tiny"]


def hardware_names() -> list[str]:
    """Catalog GPUs in catalog order."""
    from costmodels.hardware import list_hardware

    return [h.name for h in list_hardware()]


def hardware_info(hardware: str) -> dict:
    """A GPU's catalog fields (name or uploaded YAML path)."""
    from costmodels.hardware import get_hardware

    return get_hardware(hardware).model_dump(exclude={"measured"})


def model_info(model: str) -> dict:
    """Headline numbers of a model for the app (name, family, layers, experts, MTP, window)."""
    from costmodels.catalog import get_model

    m = get_model(model)
    return {"name": m.name, "family": m.family, "layers": m.num_layers, "hidden": m.hidden_size,
            "attention": m.attention, "experts": m.moe.n_routed_experts if m.moe else 0,
            "top_k": m.moe.top_k if m.moe else 0, "mtp_layers": m.mtp_layers,
            "sliding_window": m.sliding_window or 0, "dtype": m.checkpoint_dtype}


def workload_presets() -> list[str]:
    """Built-in workload presets."""
    from sim.workload import PRESETS

    return list(PRESETS)


def default_token_prices() -> dict:
    """The planner's default revenue prices ($ per million tokens) and where they come from."""
    from planner.request import Prices

    p = Prices()
    return {"input": p.input_per_mtok, "cached_input": p.cached_input_per_mtok, "output": p.output_per_mtok}


# ---------------------------------------------------------------- the question a planner asks
class PlanRequest(BaseModel):
    """Everything the sidebar sets: model, hardware, budget or traffic, workload, SLO, prices, search size.

    Search defaults (4 candidates simulated, at most 1000 requests each, one process) keep the
    default search to about 22 s on 2 cores (docs/ui.md); the planner's own defaults (6, 2500) are for the CLI.
    Fewer than 4 simulated candidates often leaves only a low-batch one confirming the SLO.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "deepseek-v3"
    hardware: str = "H200"
    mode: Literal["budget", "traffic"] = "budget"
    gpus: int = Field(8, ge=1, le=100_000, description="GPU budget (mode 'budget')")
    target_rate: float = Field(5.0, gt=0, le=1e6, description="requests/s to serve (mode 'traffic')")
    workload: dict = Field(default_factory=lambda: {"preset": "chat"}, description="a sim.workload.WorkloadSpec mapping")
    ttft_s: float = Field(2.0, gt=0, le=600)
    tpot_s: float = Field(0.05, gt=0, le=10)
    e2e_s: float | None = Field(None, gt=0, description="end-to-end latency target (the SLO's optional e2e_pNN), seconds")
    slo_percentile: Literal[50, 90, 99] = 90
    price_per_gpu_hour: float | None = Field(None, ge=0, description="None: the hardware catalog's")
    price_per_m_input: float | None = Field(None, ge=0, description="revenue $ per million input tokens (None: planner default)")
    price_per_m_cached_input: float | None = Field(None, ge=0)
    price_per_m_output: float | None = Field(None, ge=0)
    simulate_top: int = Field(4, ge=0, le=64, description="candidates the simulator checks after the screen")
    sim_requests: int = Field(1000, ge=100, le=100_000, description="most requests per simulation")
    workers: int = Field(1, ge=1, le=256, description="planner worker processes")
    seed: int = Field(0, ge=0)


class Costs(BaseModel):
    """What a deployment costs and makes (planner.economics, reshaped)."""

    usd_per_gpu_hour: float
    usd_per_hour: float
    usd_per_m_output_tokens: float | None
    tokens_per_day: float
    revenue_per_gpu_hour: float | None
    margin_per_gpu_hour: float | None
    price_source: str = ""


class Point(BaseModel):
    """One deployment on the Pareto chart (frontier, best of a mode, or the pick)."""

    label: str
    mode: str
    gpus: int
    output_tps_per_gpu: float
    tps_per_user: float
    ttft_s: float
    tpot_s: float
    request_rate: float
    meets_slo: bool               # the planner's verdict after every check (full scale included)
    source: str  # 'screen' | 'simulation'
    on_frontier: bool
    recommended: bool = False
    costs: Costs | None = None
    full_scale: bool | None = None  # the plan's full-scale run met the SLO; False: its slice did, no full-scale run; None: not run


class PoolView(BaseModel):
    """One pool of a plan."""

    role: str
    instances: int
    gpus: int
    layout: dict
    layout_label: str
    scheduler: dict


class PlanView(BaseModel):
    """The recommended deployment, with the plan itself (for what-if, pinning and export)."""

    label: str
    model: str
    hardware: str
    mode: str
    gpus: int
    gpus_budget: int
    pools: list[PoolView]
    policies: dict
    predicted: dict
    costs: Costs
    why: list[str]
    plan: dict  # planner.plan.Plan, as JSON-able data
    yaml: str


class SearchResult(BaseModel):
    """The answer: status, the points to chart, the plan (if any), the closest options, assumptions."""

    request: dict
    status: str  # ok | does_not_fit | slo_unreachable
    message: str
    reason: str
    points: list[Point]
    plan: PlanView | None
    closest: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    timings: dict = Field(default_factory=dict)


# ---------------------------------------------------------------- search
def _planner_request(req: PlanRequest, gpus: int, simulate_top: int | None = None):
    from planner.request import PlanRequest as PReq

    prices = {k: v for k, v in {"input_per_mtok": req.price_per_m_input, "cached_input_per_mtok": req.price_per_m_cached_input,
                                "output_per_mtok": req.price_per_m_output, "gpu_hour": req.price_per_gpu_hour}.items() if v is not None}
    return validate(PReq, {
        "model": req.model, "hardware": req.hardware, "gpus": gpus, "workload": req.workload,
        "slo": {"ttft_s": req.ttft_s, "tpot_s": req.tpot_s, **({"e2e_s": req.e2e_s} if req.e2e_s is not None else {})},
        "slo_percentile": req.slo_percentile, "prices": prices,
        "simulate_top": req.simulate_top if simulate_top is None else simulate_top, "sim_requests": req.sim_requests,
        "seed": req.seed,
    }, "plan request")


# where each batch of planner jobs moves the bar within a search (screen, slices, full-scale runs)
_PHASES = {"_screen_job": (0.0, 0.2), "run_job": (0.2, 0.7), "confirm_plan": (0.7, 1.0)}


@contextlib.contextmanager
def planner_progress(progress: Progress, lo: float, hi: float):
    """Feed the planner's job counts (``planner.parallel.reporting``, what the CLI's bars show) to ``progress``
    between ``lo`` and ``hi``: the bar moves with the work instead of jumping from start to end. Never backwards
    (a second batch of slices starts its phase again)."""
    from planner.parallel import reporting
    from ui.progress import PLANNER_JOBS

    seen = [lo]

    def hook(name: str, done: int, total: int) -> None:
        a, b = _PHASES.get(name, (0.0, 1.0))
        seen[0] = max(seen[0], lo + (hi - lo) * (a + (b - a) * (done / total if total else 1.0)))
        progress(seen[0], f"{PLANNER_JOBS.get(name, name)} {done}/{total}")

    with reporting(hook):
        yield


def search(request: dict, progress: Progress | None = None) -> SearchResult:
    """Search deployments for ``request`` (a PlanRequest mapping); ``progress`` gets (fraction, label)."""
    from planner.search import plan_deployment

    req = validate(PlanRequest, request, "plan request")
    progress = progress or (lambda f, s: None)
    notes: list[str] = []
    if req.mode == "budget":
        progress(0.05, f"screening and simulating deployments of {req.gpus} GPUs")
        preq = _planner_request(req, req.gpus)
        with planner_progress(progress, 0.05, 0.95):
            report = plan_deployment(preq, workers=req.workers)
        reason = report.recommended.why[0] if report.recommended and report.recommended.why else report.message
    else:
        preq, report, reason = _size_for_traffic(req, progress, notes)
    progress(0.95, "costing the candidates")
    result = _view(req, preq, report, reason, notes)
    progress(1.0, "done")
    return result


def _size_for_traffic(req: PlanRequest, progress: Progress, notes: list[str]):
    """Fewest GPUs whose plan serves ``target_rate``: the per-GPU rate of a screen-only plan on one
    scale-up domain gives the first guess; full plans then add one instance at a time until it serves."""
    from costmodels.hardware import get_hardware
    from planner.search import plan_deployment

    probe = get_hardware(req.hardware).scaleup_domain
    for _ in range(4):  # a model too big for one domain: try 2, 4, 8 domains
        progress(0.1, f"screening {probe} GPUs for the rate one GPU sustains")
        rep = plan_deployment(_planner_request(req, probe, simulate_top=0), workers=req.workers)
        if rep.status != "does_not_fit":
            break
        probe *= 2
    if rep.recommended is None:
        return _planner_request(req, probe), rep, rep.message
    per_gpu = rep.recommended.predicted.request_rate / rep.recommended.gpus_used
    step = max(p.layout.gpus for p in rep.recommended.pools)
    gpus = max(step, math.ceil(req.target_rate / per_gpu / step) * step)
    for k in range(SIZING_TRIES + 1):
        progress(0.2 + 0.7 * k / (SIZING_TRIES + 1), f"planning {gpus} GPUs for {req.target_rate:g} requests/s")
        preq = _planner_request(req, gpus)
        report = plan_deployment(preq, workers=req.workers)
        served = report.recommended.predicted.request_rate if report.recommended else 0.0
        if served >= req.target_rate:
            reason = (f"fewest GPUs found that serve {req.target_rate:g} requests/s within the SLO: {report.recommended.gpus_used} "
                      f"GPUs sustain {served:,.2f} requests/s")
            notes.append(f"target traffic: sized from {per_gpu:.3f} requests/s per GPU (screen of {probe} GPUs), then planned "
                         f"at {gpus} GPUs ({k + 1} plan(s) run)")
            return preq, report, reason
        gpus += step
    notes.append(f"target traffic: {gpus - step} GPUs still served only {served:,.2f} requests/s after {SIZING_TRIES + 1} plans")
    return preq, report, (f"no plan up to {gpus - step} GPUs serves {req.target_rate:g} requests/s within the SLO "
                          f"(best: {served:,.2f}); raise the target GPUs or relax the SLO")


def _view(req: PlanRequest, preq, report, reason: str, notes: list[str]) -> SearchResult:
    """Reshape a planner PlanReport for the app: points with costs, the plan's pools and policies."""
    from costmodels.hardware import get_hardware
    from planner.economics import economics
    from planner.workload_stats import workload_stats

    hw = get_hardware(req.hardware)
    stats = workload_stats(preq.workload, preq.seed)
    plan = report.recommended
    rec_label = report.message.removeprefix("recommended: ") if plan else None

    def costs_of(gpus: int, thr_gpu: float) -> Costs:
        e = economics(hw, preq.prices, gpus, preq.gpus, thr_gpu * gpus, stats.mean_prompt, stats.mean_output, stats.hit_fraction)
        return _costs(e)

    seen: dict[str, Point] = {}
    # the frontier over simulated points only (the screen's is optimistic and drawn as open markers, off it)
    frontier = {p.label for p in report.frontier if p.source == "simulation"}
    for p in list(report.frontier) + list(report.best_by_mode):
        if p.label in seen:
            continue
        seen[p.label] = Point(label=p.label, mode=p.mode, gpus=p.gpus, output_tps_per_gpu=p.output_tokens_per_s_per_gpu,
                              tps_per_user=p.tokens_per_s_per_user, ttft_s=p.ttft_s, tpot_s=p.tpot_s, request_rate=p.request_rate,
                              meets_slo=p.meets_slo, source=p.source, on_frontier=p.source == "simulation" and p.label in frontier,
                              costs=costs_of(p.gpus, p.output_tokens_per_s_per_gpu), full_scale=p.full_scale)
    view = None
    if plan is not None:
        pr = plan.predicted
        rec = Point(label=rec_label, mode=plan.mode, gpus=plan.gpus_used, output_tps_per_gpu=pr.output_tokens_per_s_per_gpu,
                    tps_per_user=pr.tokens_per_s_per_user, ttft_s=pr.ttft_s, tpot_s=pr.tpot_s, request_rate=pr.request_rate,
                    meets_slo=True, source=pr.source, on_frontier=pr.source == "simulation" and rec_label in frontier, recommended=True,
                    costs=_costs(plan.economics))
        seen[rec_label] = rec
        view = plan_view(plan.model_dump(mode="json"), rec_label)
    return SearchResult(request=req.model_dump(), status=report.status, message=report.message, reason=reason,
                        points=list(seen.values()), plan=view, closest=list(report.closest_options),
                        notes=notes + list(report.assumptions), timings=report.timings.model_dump())


def _costs(e) -> Costs:
    finite = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731
    return Costs(usd_per_gpu_hour=e.price_per_gpu_hour, usd_per_hour=e.cluster_cost_per_hour,
                 usd_per_m_output_tokens=finite(e.cost_per_million_output_tokens), tokens_per_day=e.output_tokens_per_day,
                 revenue_per_gpu_hour=e.revenue_per_gpu_hour, margin_per_gpu_hour=e.margin_per_gpu_hour, price_source=e.price_source)


def plan_view(plan: dict, label: str | None = None) -> PlanView:
    """A planner Plan (as data) reshaped for display."""
    from planner.plan import Plan

    p = validate(Plan, plan, "plan")
    pools = [PoolView(role=x.role, instances=x.instances, gpus=x.gpus, layout=x.layout.model_dump(mode="json"),
                      layout_label=x.label or x.layout.describe(), scheduler=x.scheduler.model_dump(mode="json")) for x in p.pools]
    main = p.pool("mixed" if p.mode == "aggregated" else "decode").scheduler
    policies = {"max batch": main.max_num_seqs, "token budget": main.max_num_batched_tokens, "MTP draft": main.draft_len,
                "async overlap": main.async_overlap, "router": p.router.kind, "EPLB": p.effects.eplb,
                "tables": p.effects.table_placement}
    label = label or " + ".join(f"{x.instances} x {x.layout_label} {x.role}" for x in pools)
    costs = _costs(p.economics) if p.economics else Costs(usd_per_gpu_hour=0, usd_per_hour=0, usd_per_m_output_tokens=None,
                                                         tokens_per_day=0, revenue_per_gpu_hour=None, margin_per_gpu_hour=None)
    return PlanView(label=label, model=p.model, hardware=p.hardware, mode=p.mode, gpus=p.gpus_used, gpus_budget=p.gpus_budget,
                    pools=pools, policies=policies, predicted=p.predicted.model_dump() if p.predicted else {}, costs=costs,
                    why=list(p.why), plan=p.model_dump(mode="json"), yaml=p.to_yaml())


# ---------------------------------------------------------------- where the time and memory go
def step_breakdown(model: str, hardware: str, layout: dict, scheduler: dict, batch: int, context: int,
                   effects: dict | None = None) -> dict:
    """One decode step of ``batch`` requests at ``context`` tokens: time by category (host included) and memory per GPU.
    ``effects``: the plan's (``sim.effects.EffectsSpec``): its expert load prices the experts as its simulation does."""
    from costmodels.batch import BatchShape
    from costmodels.catalog import get_model
    from costmodels.effective import batch_dp_imbalance, fit_with_policies
    from costmodels.hardware import get_hardware
    from costmodels.host import exposed_host
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel
    from scheduler.config import SchedulerConfig
    from sim.effects import EffectsSpec, initial_expert_load

    m, hw = get_model(model), get_hardware(hardware)
    lay = validate(ParallelLayout, layout, "layout")
    scfg = validate(SchedulerConfig, scheduler, "scheduler")
    eff = validate(EffectsSpec, effects or {}, "effects")
    load = initial_expert_load(m, lay, eff)
    draft = scfg.draft_len
    shape = BatchShape.from_lists([1 + draft] * batch, [context] * batch, [True] * batch)
    # at the attention-DP split the simulator prices (a request lives on one rank: 1 request on 8 ranks is not 1/8 each)
    imb = batch_dp_imbalance(m, hw, lay, shape, expert_load=load)
    sc = StepCostModel(m, hw, lay, dp_imbalance=imb, expert_load=load).step(shape)
    by = {g: sum(sc.breakdown.get(c, 0.0) for c in cats) for g, cats in BREAKDOWN_GROUPS.items()}
    # host work per step (scheduling, input prep) hides under the device step when async overlap is on
    host = scfg.host_overhead_s(batch, batch * (1 + draft))
    by["host (exposed)"] = exposed_host(sc.time_s, host, scfg.overlap())  # the share the plan's overlap hides, as simulated
    # the memory the plan's simulation fits (sim.deployment): lookup tables the plan keeps in HBM take their room there
    fit = fit_with_policies(m, hw, lay, table_placement=eff.table_placement, max_batched_tokens=scfg.max_num_batched_tokens,
                            max_running_requests=scfg.max_num_seqs, min_kv_tokens=scfg.block_size, mtp=scfg.draft_len > 0)
    tables = fit.weight_breakdown.get("lookup_tables", 0.0)
    memory = {"weights": fit.weight_bytes - tables, **({"lookup tables": tables} if tables else {}),
              "KV pool": max(fit.kv_pool_bytes, 0.0), "workspace": fit.workspace_bytes, "reserved (1 - mem fraction)": fit.free_bytes}
    step = sc.time_s + by["host (exposed)"]
    return {"step_s": step, "device_s": sc.time_s, "host_s": host, "breakdown_s": by, "memory_bytes": memory,
            "hbm_bytes": fit.hbm_bytes, "weights_by_kind": fit.weight_breakdown, "fit": fit.explanation, "notes": list(sc.notes),
            "batch": batch, "context": context, "draft_len": draft,
            # a decode makes 1 + the accepted drafts per step (what `twinfer cost` and the simulator count), not 1 + draft_len
            "tokens_per_s_per_user": scfg.expected_tokens_per_decode() / step if step else None}


# ---------------------------------------------------------------- what-if
PD_RATIO_MAX = 64  # the most prefill instances per decode instance a what-if takes


class WhatIf(BaseModel):
    """Policy changes applied to a plan (None: keep the plan's)."""

    model_config = ConfigDict(extra="forbid")
    ep: int | None = Field(None, ge=1, le=4096, description="EP width of the decode (or mixed) pool")
    async_overlap: bool | None = None
    draft_len: int | None = Field(None, ge=0, le=16)
    prefix_hit_rate: float | None = Field(None, ge=0, le=0.99)
    pd_ratio: float | None = Field(None, gt=0, le=PD_RATIO_MAX, description="prefill instances per decode instance (disaggregated plans)")
    replay_window: int | None = Field(None, ge=0, le=1 << 20, description="SWA bounded replay tokens on every window layer "
                                      "of every pool (0: the window KV is kept, nothing replayed)")


def apply_what_if(plan: dict, what_if: dict) -> dict:
    """The plan (as data) with the what-if changes applied, validated as a planner Plan."""
    import copy

    from planner.plan import Plan

    w = validate(WhatIf, what_if, "what-if")
    p = copy.deepcopy(plan)
    main = next(x for x in p["pools"] if x["role"] in ("mixed", "decode"))
    if w.ep is not None:
        main["layout"]["ep"] = w.ep
    if w.async_overlap is not None:
        for pool in p["pools"]:
            pool["scheduler"]["async_overlap"] = w.async_overlap
    if w.draft_len is not None:
        s = main["scheduler"]
        # the plan lists one acceptance rate per draft; a new length takes the scheduler's defaults
        s.update(draft_len=w.draft_len, acceptance_rates=[])
        s["max_num_batched_tokens"] = max(s["max_num_batched_tokens"], s["max_num_seqs"] * (1 + w.draft_len))
    if w.pd_ratio is not None:
        if p["mode"] != "disaggregated":
            raise TwinferError("what-if pd_ratio: this plan is aggregated (prefill and decode share instances); "
                               "a disaggregated plan has a prefill:decode ratio to change")
        pre = next(x for x in p["pools"] if x["role"] == "prefill")
        pre["instances"] = max(1, round(w.pd_ratio * main["instances"]))
    if w.prefix_hit_rate is not None:
        p["workload"] = _with_prefix_share(p["workload"], w.prefix_hit_rate)
    if w.replay_window is not None:
        _set_replay(p, w.replay_window)
    used = sum(x["instances"] * _gpus(x["layout"]) for x in p["pools"])
    p["gpus_budget"] = max(p["gpus_budget"], used)  # a what-if may use more GPUs than the plan had
    p["predicted"], p["economics"] = None, None  # they described the unchanged plan
    return validate(Plan, p, "what-if plan").model_dump(mode="json")


def _set_replay(plan: dict, tokens: int) -> None:
    """Every pool resumes its window layers with bounded replay of ``tokens`` (0: keeps the window KV), the policy the
    simulator prices (``scheduler.replay``, as ``twinfer simulate --replay replay:W`` / ``persist`` sets it)."""
    from costmodels.catalog import get_model
    from costmodels.replay import window_layers

    if not window_layers(get_model(plan["model"])):
        raise TwinferError(f"what-if replay_window: {plan['model']} has no sliding-window layers: nothing to keep or replay")
    rule = {"default": {"mode": "replay"}, "tokens": tokens} if tokens else {"default": {"mode": "persist"}}
    for pool in plan["pools"]:
        pool["scheduler"].update(replay=rule, swa_replay_tokens=0)


def replay_window(plan: dict) -> int | None:
    """The replay length W the plan's decode (or mixed) pool resumes every window layer with (0: the window KV is kept),
    None where its layers differ or the model has no window layers (the what-if form's starting value)."""
    from costmodels.catalog import get_model
    from planner.plan import Plan

    p = validate(Plan, plan, "plan")
    model = get_model(p.model)
    res = p.pool("mixed" if p.mode == "aggregated" else "decode").scheduler.replay_for(model)
    rules = {(m, t if m == "replay" else 0) for m, t in zip(res.modes, res.tokens) if m != "none"}
    if len(rules) != 1:
        return None
    mode, tokens = rules.pop()
    return tokens if mode == "replay" else 0 if mode == "persist" else None


def _gpus(layout: dict) -> int:
    return layout.get("tp", 1) * layout.get("dp", 1) * layout.get("pp", 1)


def _with_prefix_share(workload: dict, hit: float) -> dict:
    """A workload whose prompts share ``hit`` of their tokens as one system prompt (one prefix group),
    so the prefix cache can serve about that share; prompt lengths keep their mean."""
    from sim.workload import WorkloadSpec

    wl = validate(WorkloadSpec, workload, "workload")
    if wl.kind == "trace":
        raise TwinferError("what-if prefix_hit_rate: a trace's prefixes come from its hash_ids; pick a generated workload")
    total = wl.shared_prefix_len + float(wl.input_len.mean())
    shared = int(round(hit * total))
    scale = max(total - shared, 1.0) / max(float(wl.input_len.mean()), 1.0)
    data = wl.model_dump(mode="json")
    data["input_len"] = _scaled_length(data["input_len"], scale)
    data.update({"shared_prefix_len": shared, "num_prefix_groups": 1})
    return validate(WorkloadSpec, data, "what-if workload").model_dump(mode="json")


def _scaled_length(dist: dict, scale: float) -> dict:
    """A length distribution with its scale (mean/median/p90/value/min/max) multiplied."""
    out = dict(dist)
    for k in ("mean", "median", "p90", "value", "max", "min"):
        if isinstance(out.get(k), (int, float)) and out[k]:
            out[k] = max(1, int(round(out[k] * scale))) if k in ("min", "max", "value") else out[k] * scale
    return out


def what_if_requests(plan: dict, num_requests: int) -> int:
    """Requests a what-if simulates: the plan's own count (what ``twinfer simulate --plan`` runs, so the
    baseline is the plan's figure); a plan without one: ``num_requests``, raised to three turnovers
    of its seats (fewer would measure the ramp-up, not the deployment)."""
    own = plan["workload"].get("num_requests")
    if own:
        return int(own)
    seats = sum(p["instances"] * p["scheduler"]["max_num_seqs"] for p in plan["pools"] if p["role"] != "prefill")
    return int(max(num_requests, 3 * seats))


def plan_run_part(plan: dict) -> str | None:
    """What part of the deployment the plan's run covers, in words; None where it runs all of it."""
    from planner.plan import Plan

    return validate(Plan, plan, "plan").run_description()


def simulate_plan(plan: dict, num_requests: int) -> dict:
    """Simulate a plan at full scale on ``num_requests`` requests (the run ``twinfer simulate --plan`` makes);
    the figures the app compares, from its steady window. Its GPUs and output tokens/s per GPU are the whole plan's,
    as the planner reads them (``Plan.per_gpu``): a run of part of the deployment (``Plan.run_share``)
    carries that share of the rate, and a disaggregated run's prefill pool is rounded up, so the run's own per-GPU
    figure (``twinfer simulate --plan``'s steady table) is not the plan's (its comparison line gives the plan's)."""
    from planner.plan import Plan
    from sim.runner import simulate

    p = validate(Plan, plan, "plan")
    scenario = p.to_scenario(num_requests=num_requests if p.workload.kind != "trace" else None)
    res = simulate(scenario).result
    row = metric_row(res, p.slo_percentile)
    w = res.metrics.steady or res.metrics.whole_run
    if w is not None:
        row.update({"GPUs": p.gpus_used, "output tok/s per GPU": p.per_gpu(w.output_throughput)})
    return row


def what_if(plan: dict, changes: dict, num_requests: int) -> dict:
    """Simulate the plan and the changed plan the same way; both metric rows and the changed plan."""
    changed = apply_what_if(plan, changes)
    n = what_if_requests(plan, num_requests)
    return {"rows": {"baseline": simulate_plan(plan, n), "what-if": simulate_plan(changed, n)}, "plan": changed, "requests": n}


def metric_row(res, percentile: int = 90) -> dict:
    """The figures the app compares, from a sim.runner.SimResult: its steady window (``SimMetrics.steady``,
    the plan's figures), the whole run's where a run is too short to have one."""
    m = res.metrics
    w = m.steady or m.whole_run or m
    q = f"p{percentile}"
    ms = lambda x: None if x is None else x * 1e3  # noqa: E731
    return {
        "window": getattr(w, "window", "whole_run"),
        "GPUs": res.num_gpus, "output tok/s per GPU": w.output_throughput_per_gpu,
        "tok/s per user": w.per_user_output_tps_mean, f"TTFT {q} (s)": getattr(w.ttft_s, q),
        "TPOT p50 (ms)": ms(w.tpot_s.p50), f"TPOT {q} (ms)": ms(getattr(w.tpot_s, q)),
        "goodput (% of requests)": None if w.goodput_fraction is None else 100 * w.goodput_fraction,
        "prefix hit rate (%)": None if m.prefix_cache_hit_rate is None else 100 * m.prefix_cache_hit_rate,
        "finished": w.requests_finished,
    }


# ---------------------------------------------------------------- calibration error band
def error_band(hardware: str) -> float | None:
    """Relative error of the planner's simulated figures on ``hardware`` from a validation run, or None.

    None for every GPU today, and the app says "no calibration: ±?": the committed validation reports
    (profiles/<hw>/validation_*.json, ``twinfer simulate --error-band auto``) measure the twin of a
    5-layer DeepSeek-V3 stack priced by its own calibrated step model, while the planner prices full
    models with the analytic cost model; those reports are no band for these figures (docs/twin.md).
    """
    return None


# ---------------------------------------------------------------- export
def results_csv(result: SearchResult) -> str:
    """Every charted candidate as one CSV row (costs included)."""
    buf = io.StringIO()
    cols = ["label", "mode", "gpus", "output_tps_per_gpu", "tps_per_user", "ttft_s", "tpot_s", "request_rate",
            "meets_slo", "source", "on_frontier", "recommended"]
    cost_cols = [c for c in Costs.model_fields if c != "price_source"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols + cost_cols)
    for p in result.points:
        d = p.model_dump()
        w.writerow([d[k] for k in cols] + [(d["costs"] or {}).get(k) for k in cost_cols])
    return buf.getvalue()
