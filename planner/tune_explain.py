"""Why the tuned policy won: the best run per policy value, each policy's gain, and the cost term that moved.

Each of the three policies is explained by the term it acts on:

- EP width: the decode step of one GPU at the winner's batch per rank (``StepCostModel.step``): the
  MoE expert GEMMs (at decode a read of the GPU's expert weights, which a wider EP spreads over
  more GPUs) against the EP dispatch/combine communication it adds;
- async overlap: the host work of that step (``SchedulerConfig.host_overhead_s``) and how much of
  it the step exposes (``costmodels.host.exposed_host``: the one overlap rule);
- replay: prompt tokens computed per request in the simulation (W tokens recomputed on every
  prefix hit) and the prefix-cache hit rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.batch import BatchShape
from costmodels.calibration_source import profile_for
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.host import exposed_host
from costmodels.step import StepCostModel
from planner.tune_policies import THE_THREE, Policy, Run, SearchResult, TuneContext, scheduler_of

LABELS = {"ep_width": "EP width", "async_overlap": "async overlap", "replay": "replay (W, layers)"}


def value_text(policy: str, v) -> str:
    if policy == "async_overlap":
        return "on" if v else "off"
    if policy == "replay":
        return "W=0 (keep window KV)" if not v[0] else f"W={v[0]} ({v[1]} sliding layers)"
    if policy == "ep_width":
        return f"EP{v}"
    return str(v)


def gain(base: float, new: float) -> float:
    return (new - base) / base if base > 0 else float("nan")


def combo_table(res: SearchResult) -> list[tuple[tuple, Run]]:
    """Best run per (EP width, overlap, replay) combination simulated, best first (feasible before infeasible)."""
    best: dict[tuple, Run] = {}
    for p, r in res.runs.items():
        key = (p.ep_width, p.async_overlap, p.replay)
        cur = best.get(key)
        if cur is None or (r.feasible, r.thr_gpu) > (cur.feasible, cur.thr_gpu):
            best[key] = r
    return sorted(best.items(), key=lambda kv: (not kv[1].feasible, -kv[1].thr_gpu, kv[0]))


def best_per_value(res: SearchResult) -> dict[str, list[tuple[object, Run]]]:
    """For each of the three policies, the best run seen at each of its values."""
    out: dict[str, list] = {}
    for pol in THE_THREE:
        rows = []
        for v in res.values[pol]:
            seen = [r for p, r in res.runs.items() if p.value(pol) == v]
            if seen:
                rows.append((v, max(seen, key=lambda r: (r.feasible, r.thr_gpu))))
        out[pol] = rows
    return out


@dataclass
class PolicyGain:
    policy: str
    baseline_value: object
    winner_value: object
    without: Run          # the winner with this policy at its baseline value
    gain: float           # winner over ``without`` (0 when the winner keeps the baseline value)
    why: str


def decode_terms(ctx: TuneContext, p: Policy) -> dict[str, float]:
    """One GPU's decode step of policy ``p`` at its batch per rank and the workload's mean context (seconds):
    total, MoE expert GEMMs, EP communication, the rest, host work and the host time the step exposes."""
    model, hw = get_model(ctx.model), get_hardware(ctx.hardware)
    lay = ctx.options[p.ep_width].layout
    n = p.batch_per_rank * lay.dp
    cm = StepCostModel(model, hw, lay, profile_for(hw, ctx.calibration) if ctx.calibration else None)
    step = cm.step(BatchShape.from_lists([1] * n, [int(ctx.stats.mean_context)] * n, [True] * n))
    sc = scheduler_of(p, lay.dp, ctx.draft_len)
    host = sc.host_overhead_s(n, n)
    b = step.breakdown
    return {"step": step.time_s, "moe": b.get("expert_gemm", 0.0), "comm": b.get("communication", 0.0),
            "rest": step.time_s - b.get("expert_gemm", 0.0) - b.get("communication", 0.0), "host": host,
            "exposed": exposed_host(step.time_s, host, p.async_overlap), "tokens_per_gpu": float(p.batch_per_rank)}


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def why_ep(ctx: TuneContext, base: Policy, win: Policy) -> str:
    a, b = decode_terms(ctx, base), decode_terms(ctx, win)
    per_tok = lambda t, k: t[k] / t["tokens_per_gpu"] * 1e6  # noqa: E731  (us per output token per GPU)
    return (f"decode step per GPU at {win.batch_per_rank}/rank: MoE expert GEMMs (weight read) {_ms(a['moe'])} -> {_ms(b['moe'])}, "
            f"EP communication {_ms(a['comm'])} -> {_ms(b['comm'])}, the rest {_ms(a['rest'])} -> {_ms(b['rest'])}; "
            f"per output token {per_tok(a, 'step'):.0f} -> {per_tok(b, 'step'):.0f} us of GPU time")


def why_overlap(ctx: TuneContext, base: Policy, win: Policy) -> str:
    a, b = decode_terms(ctx, base), decode_terms(ctx, win)
    return (f"host work {_ms(b['host'])} per decode step against a {_ms(b['step'])} device step: exposed host time "
            f"{_ms(a['exposed'])} ({value_text('async_overlap', base.async_overlap)}) -> {_ms(b['exposed'])} "
            f"({value_text('async_overlap', win.async_overlap)})")


def why_replay(without: Run, won: Run) -> str:
    return (f"prompt tokens computed per request {without.prefill_tokens_per_request:,.0f} -> {won.prefill_tokens_per_request:,.0f} "
            f"(replayed window tokens on prefix hits), prefix-cache hit rate {without.hit_rate:.0%} -> {won.hit_rate:.0%}")


def policy_gains(ctx: TuneContext, res: SearchResult) -> list[PolicyGain]:
    """Each of the three policies: its baseline and winning value, the winner's gain over the winner with that policy
    at its baseline value, and the term that moved."""
    base, win = res.baseline.policy, res.best.policy
    out = []
    for pol in THE_THREE:
        without = res.attribution[pol]
        g = gain(without.thr_gpu, res.best.thr_gpu) if without.policy != win else 0.0
        ref = without.policy
        if pol == "ep_width":
            why = why_ep(ctx, ref, win)
        elif pol == "async_overlap":
            why = why_overlap(ctx, ref, win)
        else:
            why = why_replay(without, res.best)
        out.append(PolicyGain(pol, base.value(pol), win.value(pol), without, g, why))
    return out


def explanation(ctx: TuneContext, res: SearchResult) -> list[str]:
    """The winner's reasons as lines (also written into the plan's ``why``)."""
    lines = [f"highest simulated output throughput per GPU ({res.best.thr_gpu:,.0f} tokens/s at {ctx.rate_per_gpu:.3g} req/s per GPU "
             f"offered) among {len(res.runs)} simulated policies; baseline {res.baseline.policy.describe()}: "
             f"{res.baseline.thr_gpu:,.0f} tokens/s ({gain(res.baseline.thr_gpu, res.best.thr_gpu):+.1%})"]
    for g in policy_gains(ctx, res):
        if g.winner_value == g.baseline_value:
            lines.append(f"{LABELS[g.policy]}: keeps the baseline's {value_text(g.policy, g.winner_value)}: {g.why}")
        else:
            lines.append(f"{LABELS[g.policy]} {value_text(g.policy, g.baseline_value)} -> {value_text(g.policy, g.winner_value)}: "
                         f"{g.gain:+.1%} ({g.without.thr_gpu:,.0f} -> {res.best.thr_gpu:,.0f} tokens/s/GPU): {g.why}")
    for w, reason in ctx.rejected.items():
        lines.append(f"EP{w} not tried: {reason}")
    return lines
