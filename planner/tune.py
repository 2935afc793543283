"""Policy search in simulation on a measured hardware profile (``twinfer tune``).

Candidates are scheduler policies (max batch, token budget, prefill chunk cap, async overlap, and, predicted
only, MTP draft length) simulated on the same requests with a step cost from a calibration profile
(``costmodels.step_profile.ProfiledStepCost``). The search runs in two stages: first the knobs the executor's
engine loop honours as-is (``MEASURABLE``: async overlap among them, the loop pipelines when the config asks; so the
winner can be run on the GPU and the measured gain set next to the predicted one), then MTP draft length on top of
that winner, reported as a predicted-only gain.
"""

from __future__ import annotations

import itertools
from typing import Sequence

from pydantic import BaseModel, Field

from scheduler.config import SchedulerConfig
from scheduler.request import Request
from sim.validate import copy_requests, metric_values, simulate_requests

LOWER_IS_BETTER = {"tpot_p50", "tpot_p90", "ttft_p50", "ttft_p90", "e2e_p50"}
OBJECTIVES = ("output_throughput", "ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50")  # metric_values' keys searched
# async overlap is measurable: the executor's loop pipelines (LLMEngine.step_overlapped) when the config asks
MEASURABLE = ("max_num_seqs", "max_num_batched_tokens", "long_prefill_threshold", "async_overlap")
PREDICTED_ONLY = ("draft_len",)


class Candidate(BaseModel):
    """One policy and its simulated figures."""

    knobs: dict
    metrics: dict[str, float | None]
    objective: float | None
    feasible: bool = True
    why: str = ""


class TuneResult(BaseModel):
    objective: str
    slo_tpot_s: float | None = None
    baseline: Candidate
    best: Candidate
    predicted_gain: float
    best_predicted_only: Candidate | None = None
    predicted_only_gain: float | None = None
    candidates: list[Candidate] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def default_grid(base: SchedulerConfig, max_seqs: int, mtp: bool) -> dict[str, list]:
    """Knob values to try (measurable ones) and the predicted-only extras."""
    seqs = sorted({s for s in (8, 16, 32, 64, 128, 256, base.max_num_seqs) if s <= max_seqs})
    grid = {
        "max_num_seqs": seqs,
        "max_num_batched_tokens": sorted({1024, 2048, 4096, 8192, base.max_num_batched_tokens}),
        "long_prefill_threshold": sorted({0, 512, 2048, base.long_prefill_threshold}),
        "async_overlap": [False, True],
    }
    extra = {"draft_len": [0, 1, 2] if mtp else [0]}
    return {**grid, **extra}


def gain(objective: str, base: float, new: float) -> float:
    """Relative improvement (positive is better) of ``new`` over ``base``."""
    if base is None or new is None or base == 0:
        return float("nan")
    return (base - new) / base if objective in LOWER_IS_BETTER else (new - base) / base


def evaluate(cost, cfg: SchedulerConfig, num_blocks: int, requests: Sequence[Request], objective: str,
             slo_tpot_s: float | None, seed: int = 0) -> Candidate:
    """Simulate one policy on the requests."""
    m = metric_values(simulate_requests(cost, cfg, num_blocks, copy_requests(requests), seed=seed))
    knobs = {k: getattr(cfg, k) for k in MEASURABLE + PREDICTED_ONLY}
    feasible, why = True, ""
    if m["requests_finished"] < len(requests):
        feasible, why = False, f"{len(requests) - int(m['requests_finished'])} requests not finished"
    elif slo_tpot_s is not None and (m["tpot_p50"] or 0) > slo_tpot_s:
        feasible, why = False, f"TPOT p50 {m['tpot_p50'] * 1e3:.1f} ms > SLO {slo_tpot_s * 1e3:.1f} ms"
    return Candidate(knobs=knobs, metrics=m, objective=m.get(objective), feasible=feasible, why=why)


def _better(objective: str, a: Candidate, b: Candidate | None) -> bool:
    if b is None:
        return True
    if a.objective is None:
        return False
    if b.objective is None:
        return True
    return a.objective < b.objective if objective in LOWER_IS_BETTER else a.objective > b.objective


def _configs(base: SchedulerConfig, grid: dict[str, list], keys: Sequence[str], fixed: dict):
    vals = [grid.get(k, [getattr(base, k)]) for k in keys]
    for combo in itertools.product(*vals):
        upd = {**fixed, **dict(zip(keys, combo))}
        per = 1 + upd.get("draft_len", base.draft_len)
        if upd.get("max_num_seqs", base.max_num_seqs) * per > upd.get("max_num_batched_tokens", base.max_num_batched_tokens):
            continue
        if upd.get("long_prefill_threshold", 0) and upd["long_prefill_threshold"] > upd.get("max_num_batched_tokens", base.max_num_batched_tokens):
            continue
        upd["acceptance_rates"] = [] if upd.get("draft_len", base.draft_len) != base.draft_len else base.acceptance_rates
        yield base.model_copy(update=upd)


def tune(cost, base: SchedulerConfig, num_blocks: int, requests: Sequence[Request], *, objective: str = "output_throughput",
         slo_tpot_s: float | None = None, grid: dict[str, list] | None = None, seed: int = 0) -> TuneResult:
    """Search policies in simulation; the best measurable policy and its predicted gain over ``base``."""
    grid = grid or default_grid(base, base.max_num_seqs, False)
    baseline = evaluate(cost, base, num_blocks, requests, objective, slo_tpot_s, seed)
    cands: list[Candidate] = []
    best: Candidate | None = baseline if baseline.feasible else None  # ties keep the baseline
    for cfg in _configs(base, grid, MEASURABLE, {}):
        c = evaluate(cost, cfg, num_blocks, requests, objective, slo_tpot_s, seed)
        cands.append(c)
        if c.feasible and _better(objective, c, best):
            best = c
    best = best or baseline
    notes = []
    extra_best, extra_gain = None, None
    extras = [k for k in PREDICTED_ONLY if len(grid.get(k, [])) > 1]
    if extras:
        win_cfg = base.model_copy(update={k: best.knobs[k] for k in MEASURABLE})
        for cfg in _configs(win_cfg, grid, extras, {}):
            if all(getattr(cfg, k) == getattr(win_cfg, k) for k in extras):
                continue
            c = evaluate(cost, cfg, num_blocks, requests, objective, slo_tpot_s, seed)
            c.why = (c.why + "; " if c.why else "") + "predicted only"
            cands.append(c)
            if c.feasible and _better(objective, c, extra_best):
                extra_best = c
        if extra_best is not None and _better(objective, extra_best, best):
            extra_gain = gain(objective, baseline.objective, extra_best.objective)
        else:
            extra_best = None
        notes.append("MTP draft length is predicted only: dummy weights accept no MTP drafts")
    return TuneResult(objective=objective, slo_tpot_s=slo_tpot_s, baseline=baseline, best=best,
                      predicted_gain=gain(objective, baseline.objective, best.objective),
                      best_predicted_only=extra_best, predicted_only_gain=extra_gain, candidates=cands, notes=notes)
