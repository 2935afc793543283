"""Adapters from the Streamlit app to costmodels/, sim/ and planner/: plain data in, plain data out.

The app wraps these in st.cache_data, so arguments are plain values (str, numbers, dicts)
and results are picklable pydantic models. No modelling lives here: each function composes
calls into the packages and reshapes their results for display. Nothing imports streamlit.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Callable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from twinfer.config import validate
from twinfer.errors import TwinferError

Progress = Callable[[float, str], None]  # (fraction done, what is running)

# What a step's time is shown as (the cost model's categories, grouped the way a planner asks).
BREAKDOWN_GROUPS = {
    "attention": ("attention",), "indexer": ("indexer",), "experts": ("expert_gemm",),
    "dense GEMMs": ("dense_gemm",), "communication": ("communication",), "other": ("other",),
}


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
    """Headline numbers of a model for the sidebar (name, family, layers, experts, MTP)."""
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


# ---------------------------------------------------------------- the question a planner asks
class PlanRequest(BaseModel):
    """Everything the sidebar sets: model, hardware, budget or traffic, workload, SLO, prices, search size."""

    model_config = ConfigDict(extra="forbid")

    model: str = "deepseek-v3"
    hardware: str = "H200"
    mode: Literal["budget", "traffic"] = "budget"
    gpus: int = Field(8, ge=1, le=4096, description="GPU budget (mode 'budget')")
    target_rate: float = Field(5.0, gt=0, le=1e5, description="requests/s to serve (mode 'traffic')")
    workload: dict = Field(default_factory=lambda: {"preset": "chat"}, description="a sim.workload.WorkloadSpec mapping")
    ttft_s: float = Field(2.0, gt=0, le=600)
    tpot_s: float = Field(0.05, gt=0, le=10)
    price_per_gpu_hour: float | None = Field(None, ge=0, description="None: the hardware catalog's")
    price_per_m_input: float = Field(0.0, ge=0, description="revenue $ per million input tokens")
    price_per_m_output: float = Field(0.0, ge=0, description="revenue $ per million output tokens")
    sim_requests: int = Field(300, ge=20, le=100_000, description="requests per simulated candidate")
    max_simulated: int = Field(4, ge=1, le=64, description="candidates that get a full simulation")
    seed: int = Field(0, ge=0)


class Costs(BaseModel):
    """What a deployment costs and makes, from its price and its simulated throughput."""

    usd_per_gpu_hour: float
    usd_per_hour: float
    usd_per_m_output_tokens: float | None
    tokens_per_day: float
    revenue_per_gpu_hour: float | None


class Candidate(BaseModel):
    """One deployment the search looked at, reduced to what the app shows."""

    label: str
    layout: dict
    layout_label: str
    gpus_per_instance: int
    instances: int
    gpus: int
    pd: dict | None = None  # {"prefill": n, "decode": m} instances when disaggregated
    policies: dict
    output_tps_per_gpu: float
    tps_per_user: float | None
    ttft_p90_s: float | None = None
    tpot_p50_s: float | None = None
    meets_slo: bool
    simulated: bool
    on_frontier: bool = False
    costs: Costs
    scenario: dict  # sim.scenario.Scenario mapping: what-if and export start from it
    why: str = ""


class SearchResult(BaseModel):
    """The candidates, the frontier among them, the pick and why, and what was assumed."""

    request: dict
    candidates: list[Candidate]
    recommended: int | None
    reason: str
    notes: list[str] = Field(default_factory=list)
    backend: str  # which search produced it ('planner' or 'ui-interim')


# ---------------------------------------------------------------- search
def search(request: dict, progress: Progress | None = None) -> SearchResult:
    """Search deployments for ``request`` (a PlanRequest mapping); ``progress`` gets (fraction, label)."""
    req = validate(PlanRequest, request, "plan request")
    progress = progress or (lambda f, s: None)
    return _interim_search(req, progress)


def _costs(req: PlanRequest, gpus: int, out_tps: float, in_tps: float) -> Costs:
    from costmodels.hardware import get_hardware

    price = req.price_per_gpu_hour if req.price_per_gpu_hour is not None else get_hardware(req.hardware).price_per_gpu_hour
    per_hour = price * gpus
    revenue = None
    if req.price_per_m_input or req.price_per_m_output:
        revenue = (in_tps * req.price_per_m_input + out_tps * req.price_per_m_output) * 3600 / 1e6 / gpus
    return Costs(usd_per_gpu_hour=price, usd_per_hour=per_hour,
                 usd_per_m_output_tokens=per_hour / (out_tps * 3600) * 1e6 if out_tps > 0 else None,
                 tokens_per_day=out_tps * 86400, revenue_per_gpu_hour=revenue)


def _interim_search(req: PlanRequest, progress: Progress) -> SearchResult:
    """A small stand-in for planner/ until it lands: TP and DEP layouts x batch caps, screened with
    sim.runner.estimate_capacity, the best few simulated with sim.runner.run_scenario."""
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.memory import memory_fit
    from sim.runner import estimate_capacity, run_scenario
    from sim.scenario import Scenario

    model, hw = get_model(req.model), get_hardware(req.hardware)
    wl = validate(_workload_type(), req.workload, "workload")
    trace = wl.kind == "trace"
    layouts = []
    for g in (1, 2, 4, 8, 16, 32, 64):
        if req.mode == "budget" and g > req.gpus:
            break
        shapes = [{"tp": g}] + ([{"dp": g, "ep": g}] if model.moe and g > 1 else [])
        for s in shapes:
            lay = ParallelLayout(**s, weight_dtype=model.checkpoint_dtype, expert_dtype=model.checkpoint_expert_dtype,
                                 kv_dtype=model.default_kv_dtype)
            if memory_fit(model, hw, lay).fits:
                layouts.append(lay)
    if not layouts:
        fit = memory_fit(model, hw, ParallelLayout(tp=min(req.gpus, 64), weight_dtype=model.checkpoint_dtype))
        raise TwinferError(f"no layout of {model.name} fits within {req.gpus} x {hw.name}: {fit.explanation}")

    def scenario(lay, instances, seqs, rate=None) -> Scenario:
        w = dict(req.workload)
        if not trace:
            w.update({"rate": rate or w.get("rate", 1.0), "num_requests": req.sim_requests})
            w.pop("duration_s", None)
        else:
            w["max_requests"] = req.sim_requests
        return validate(Scenario, {
            "name": f"{lay.describe()} x{instances} seqs{seqs}", "model": req.model, "hardware": req.hardware,
            "layout": lay.model_dump(), "instances": instances, "workload": w, "seed": req.seed,
            "scheduler": {"max_num_seqs": seqs, "max_num_batched_tokens": max(8192, seqs)},
            "slo": {"ttft_s": req.ttft_s, "tpot_s": req.tpot_s},
        }, "candidate")

    # screen: saturation throughput and per-user speed of every (layout, batch cap)
    screened = []
    for lay in layouts:
        for seqs in (16, 64, 256):
            one = scenario(lay, 1, seqs, rate=1.0)
            if trace:
                screened.append((lay, seqs, None, None))
                continue
            cap = estimate_capacity(one)
            screened.append((lay, seqs, cap.requests_per_s, one.scheduler.expected_tokens_per_decode() / cap.decode_step_s))
    progress(0.1, f"screened {len(screened)} candidates")

    cands: list[Candidate] = []
    for lay, seqs, cap, tpu in screened:
        if req.mode == "budget":
            inst = max(1, req.gpus // lay.gpus)
        else:
            inst = max(1, math.ceil(req.target_rate / (0.8 * cap))) if cap else 1
        tput = (cap * inst * _mean_output(wl) / (inst * lay.gpus)) if cap else 0.0
        sc = scenario(lay, inst, seqs, rate=(0.8 * cap * inst if req.mode == "budget" else req.target_rate) if cap else None)
        cands.append(Candidate(
            label=f"{inst} x {lay.describe()} (batch <= {seqs})", layout=lay.model_dump(), layout_label=lay.describe(),
            gpus_per_instance=lay.gpus, instances=inst, gpus=inst * lay.gpus,
            policies={"max_num_seqs": seqs, "async_overlap": True, "draft_len": 0, "router": "least_outstanding"},
            output_tps_per_gpu=tput, tps_per_user=tpu, meets_slo=bool(tpu and tpu >= 1.0 / req.tpot_s),
            simulated=False, costs=_costs(req, inst * lay.gpus, tput * inst * lay.gpus, 0.0),
            scenario=sc.model_dump(mode="json"), why="analytic screen (cost model at saturation)",
        ))

    # simulate the best few the screen let through (all of them for a trace: nothing to screen with)
    order = sorted(range(len(cands)), key=lambda i: (not cands[i].meets_slo, cands[i].gpus if req.mode == "traffic" else 0,
                                                     -cands[i].output_tps_per_gpu))
    chosen = order[: req.max_simulated] if not trace else order[: max(req.max_simulated, 1)]
    for n, i in enumerate(chosen):
        c = cands[i]
        progress(0.1 + 0.9 * n / len(chosen), f"simulating {c.label}")
        res = run_scenario(validate(Scenario, c.scenario, "candidate"))
        m = res.metrics
        ok = m.ttft_s.p90 is not None and m.ttft_s.p90 <= req.ttft_s and (m.tpot_s.p50 or 0) <= req.tpot_s
        cands[i] = c.model_copy(update={
            "output_tps_per_gpu": m.output_throughput_per_gpu, "tps_per_user": m.per_user_output_tps_mean,
            "ttft_p90_s": m.ttft_s.p90, "tpot_p50_s": m.tpot_s.p50, "meets_slo": ok, "simulated": True,
            "costs": _costs(req, c.gpus, m.output_throughput, m.input_throughput),
            "why": f"simulated {res.num_requests} requests ({m.requests_finished} finished)",
        })
    progress(1.0, "done")
    cands = _mark_frontier(cands)
    rec, reason = _pick(cands, req)
    notes = ["interim search in ui/service.py (planner/ not landed): TP and DEP layouts x batch caps 16/64/256; "
             "screen = sim.runner.estimate_capacity, best few simulated at 80% of capacity (budget) or the target rate"]
    return SearchResult(request=req.model_dump(), candidates=cands, recommended=rec, reason=reason, notes=notes, backend="ui-interim")


def _workload_type():
    from sim.workload import WorkloadSpec

    return WorkloadSpec


def _mean_output(wl) -> float:
    return float(wl.output_len.mean()) if wl.kind != "trace" else 0.0


def _mark_frontier(cands: list[Candidate]) -> list[Candidate]:
    """Flag candidates no other beats on both throughput per GPU and tokens/s per user."""
    pts = [(c.output_tps_per_gpu, c.tps_per_user or 0.0) for c in cands]
    out = []
    for i, c in enumerate(cands):
        dominated = any((a >= pts[i][0] and b >= pts[i][1]) and (a, b) != pts[i] for a, b in pts)
        out.append(c.model_copy(update={"on_frontier": not dominated}))
    return out


def _pick(cands: list[Candidate], req: PlanRequest) -> tuple[int | None, str]:
    sims = [i for i, c in enumerate(cands) if c.simulated and c.meets_slo]
    if not sims:
        return None, (f"no simulated candidate meets TTFT p90 <= {req.ttft_s:g} s and TPOT p50 <= {req.tpot_s * 1e3:g} ms; "
                      "the table lists the closest ones")
    if req.mode == "traffic":
        i = min(sims, key=lambda k: (cands[k].gpus, -cands[k].output_tps_per_gpu))
        return i, f"fewest GPUs ({cands[i].gpus}) that serve {req.target_rate:g} req/s within the SLO"
    i = max(sims, key=lambda k: cands[k].output_tps_per_gpu)
    return i, f"highest output tokens/s per GPU ({cands[i].output_tps_per_gpu:,.0f}) within the SLO on {req.gpus} GPUs"


# ---------------------------------------------------------------- where the time and memory go
def step_breakdown(scenario: dict, batch: int, context: int) -> dict:
    """One decode step of ``batch`` requests at ``context`` tokens: time by category and memory per GPU."""
    import numpy as np

    from costmodels.batch import BatchShape
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.memory import memory_fit
    from costmodels.step import StepCostModel

    model, hw = get_model(scenario["model"]), get_hardware(scenario["hardware"])
    lay = validate(ParallelLayout, scenario["layout"], "layout")
    sched = scenario.get("scheduler", {})
    draft = int(sched.get("draft_len", 0))
    cm = StepCostModel(model, hw, lay)
    sc = cm.step(BatchShape.from_lists([1 + draft] * batch, [context] * batch, [True] * batch))
    by = {g: sum(sc.breakdown.get(c, 0.0) for c in cats) for g, cats in BREAKDOWN_GROUPS.items()}
    # host work per step (scheduling, input prep): hidden under the device step when async overlap is on
    from scheduler.config import SchedulerConfig

    scfg = validate(SchedulerConfig, sched, "scheduler")
    host = scfg.host_overhead_s(batch, batch * (1 + draft))
    by["host (exposed)"] = max(0.0, host - sc.time_s) if scfg.async_overlap else host
    fit = memory_fit(model, hw, lay, mem_fraction=scenario.get("gpu_memory_fraction", 0.9),
                     max_batched_tokens=scfg.max_num_batched_tokens, max_running_requests=scfg.max_num_seqs)
    memory = {"weights": fit.weight_bytes, "KV pool": max(fit.kv_pool_bytes, 0.0), "workspace": fit.workspace_bytes,
              "reserved (1 - mem fraction)": fit.free_bytes}
    return {"step_s": sc.time_s + by["host (exposed)"], "device_s": sc.time_s, "breakdown_s": by,
            "memory_bytes": memory, "hbm_bytes": fit.hbm_bytes, "weights_by_kind": fit.weight_breakdown,
            "fit": fit.explanation, "notes": list(sc.notes), "batch": batch, "context": context, "draft_len": draft,
            "tokens_per_s_per_user": (1 + draft) / (sc.time_s + by["host (exposed)"]) if sc.time_s else None}


# ---------------------------------------------------------------- what-if
class WhatIf(BaseModel):
    """Policy changes applied to a candidate's scenario (None: keep the baseline's)."""

    model_config = ConfigDict(extra="forbid")
    ep: int | None = Field(None, ge=1, le=1024)
    async_overlap: bool | None = None
    draft_len: int | None = Field(None, ge=0, le=16)
    prefix_hit_rate: float | None = Field(None, ge=0, le=0.99)
    pd_ratio: float | None = Field(None, gt=0, le=64, description="prefill:decode instances (needs the planner's PD support)")
    replay_window: int | None = Field(None, ge=0, le=1 << 20, description="SWA bounded replay tokens (needs sim support)")


# what-if knobs the simulator cannot take yet; the app shows them disabled with this reason
UNSUPPORTED_WHATIF = {
    "pd_ratio": "prefill/decode disaggregation lands with planner/ (issue 4)",
    "replay_window": "bounded replay is in costmodels.replay; the simulator does not take it yet",
}


def apply_what_if(scenario: dict, what_if: dict) -> dict:
    """The scenario mapping with the what-if changes applied (validated)."""
    from sim.scenario import Scenario

    w = validate(WhatIf, what_if, "what-if")
    s = yaml.safe_load(yaml.safe_dump(scenario))  # deep copy of plain data
    if w.ep is not None:
        s["layout"]["ep"] = w.ep
    if w.async_overlap is not None:
        s.setdefault("scheduler", {})["async_overlap"] = w.async_overlap
    if w.draft_len is not None:
        s.setdefault("scheduler", {})["draft_len"] = w.draft_len
        seqs = s["scheduler"].get("max_num_seqs", 256)
        s["scheduler"]["max_num_batched_tokens"] = max(s["scheduler"].get("max_num_batched_tokens", 8192), seqs * (1 + w.draft_len))
    if w.prefix_hit_rate is not None:
        s["workload"] = _with_prefix_share(s["workload"], w.prefix_hit_rate)
    for k in UNSUPPORTED_WHATIF:
        if getattr(w, k) is not None:
            raise TwinferError(f"what-if {k}: not available yet ({UNSUPPORTED_WHATIF[k]})")
    return validate(Scenario, s, "what-if scenario").model_dump(mode="json")


def _with_prefix_share(workload: dict, hit: float) -> dict:
    """A workload whose prompts share ``hit`` of their tokens as one system prompt (one prefix group),
    so the prefix cache can hit about that share; prompt lengths keep their mean."""
    wl = validate(_workload_type(), workload, "workload")
    if wl.kind == "trace":
        raise TwinferError("what-if prefix_hit_rate: a trace's prefixes come from its hash_ids; pick a generated workload")
    total = wl.shared_prefix_len + float(wl.input_len.mean())
    shared = int(round(hit * total))
    scale = max(total - shared, 1.0) / max(float(wl.input_len.mean()), 1.0)
    data = wl.model_dump(mode="json", exclude_unset=False)
    data["input_len"] = _scaled_length(data["input_len"], scale)
    data.update({"shared_prefix_len": shared, "num_prefix_groups": 1})
    return data


def _scaled_length(dist: dict, scale: float) -> dict:
    """A length distribution with its scale (mean/median/p90/value/min/max) multiplied."""
    out = dict(dist)
    for k in ("mean", "median", "p90", "value", "max", "min"):
        if isinstance(out.get(k), (int, float)) and out[k]:
            out[k] = max(1, int(round(out[k] * scale))) if k in ("min", "max", "value") else out[k] * scale
    return out


def what_if(scenario: dict, changes: dict) -> dict:
    """Simulate the baseline and the changed scenario; returns both metric rows and the scenario used."""
    from sim.runner import run_scenario
    from sim.scenario import Scenario

    changed = apply_what_if(scenario, changes)
    rows = {}
    for name, s in (("baseline", scenario), ("what-if", changed)):
        rows[name] = metric_row(run_scenario(validate(Scenario, s, name)))
    return {"rows": rows, "scenario": changed}


def metric_row(res) -> dict:
    """The figures the app compares, from a sim.runner.SimResult."""
    m = res.metrics
    return {
        "GPUs": res.num_gpus, "output tok/s per GPU": m.output_throughput_per_gpu,
        "tok/s per user": m.per_user_output_tps_mean, "TTFT p50 (s)": m.ttft_s.p50, "TTFT p90 (s)": m.ttft_s.p90,
        "TPOT p50 (ms)": None if m.tpot_s.p50 is None else m.tpot_s.p50 * 1e3,
        "TPOT p90 (ms)": None if m.tpot_s.p90 is None else m.tpot_s.p90 * 1e3,
        "goodput (% of requests)": None if m.goodput_fraction is None else 100 * m.goodput_fraction,
        "prefix hit rate (%)": None if m.prefix_cache_hit_rate is None else 100 * m.prefix_cache_hit_rate,
        "finished": m.requests_finished,
    }


# ---------------------------------------------------------------- calibration error band
def error_band(hardware: str) -> float | None:
    """Relative error of simulated figures on ``hardware`` from a validation run, or None if none exists.

    Validation reports (``twinfer validate``, issue 7) have not landed; until they do there is no
    measured band and the app says "no calibration: ±?".
    """
    return None


# ---------------------------------------------------------------- export
def plan_yaml(result: SearchResult, index: int | None = None) -> str:
    """A candidate's deployment as YAML: the scenario `twinfer simulate --scenario` runs, plus costs and provenance."""
    from twinfer import __version__

    i = result.recommended if index is None else index
    if i is None:
        raise TwinferError("no plan to export: no candidate meets the SLO")
    c = result.candidates[i]
    doc = {
        "plan": {"label": c.label, "gpus": c.gpus, "instances": c.instances, "layout": c.layout_label, "pd": c.pd,
                 "policies": c.policies, "meets_slo": c.meets_slo, "why": result.reason if i == result.recommended else c.why},
        "expected": {"output_tokens_per_s_per_gpu": c.output_tps_per_gpu, "tokens_per_s_per_user": c.tps_per_user,
                     "ttft_p90_s": c.ttft_p90_s, "tpot_p50_s": c.tpot_p50_s, "simulated": c.simulated},
        "costs": c.costs.model_dump(),
        "scenario": c.scenario,
        "provenance": {"twinfer_version": __version__, "search": result.backend, "request": result.request, "notes": result.notes},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def results_csv(result: SearchResult) -> str:
    """Every candidate as one CSV row."""
    buf = io.StringIO()
    cols = ["label", "gpus", "instances", "layout_label", "output_tps_per_gpu", "tps_per_user", "ttft_p90_s",
            "tpot_p50_s", "meets_slo", "simulated", "on_frontier"]
    cost_cols = list(Costs.model_fields)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols + cost_cols + ["recommended"])
    for i, c in enumerate(result.candidates):
        d = c.model_dump()
        w.writerow([d[k] for k in cols] + [d["costs"][k] for k in cost_cols] + [i == result.recommended])
    return buf.getvalue()
