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
from costmodels.replay import kept_window_bytes, prefill_seconds
from costmodels.replay_grid import for_profile
from planner.tune_policies import THE_THREE, Policy, Run, SearchResult, TuneContext, replay_policy, scheduler_of

LABELS = {"ep_width": "EP width", "async_overlap": "async overlap", "replay": "replay (W, layers)"}


def value_text(policy: str, v) -> str:
    if policy == "async_overlap":
        return "on" if v else "off"
    if policy == "replay":
        return "W=0 keep" if not v[0] else f"W={v[0]} {v[1]}"
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
    sc = scheduler_of(p, lay.dp, ctx.draft_len, ctx.shipped_replay, model)
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


def why_replay(ctx: TuneContext, without: Run, won: Run) -> str:
    """Replayed tokens as simulated (prompt tokens computed per request) and as priced for the mean prompt and its
    cached prefix (``costmodels.replay.prefill_seconds`` under each policy), and the window KV kept per sequence."""
    model, hw = get_model(ctx.model), get_hardware(ctx.hardware)
    lay = ctx.options[won.policy.ep_width].layout
    cal = profile_for(hw, ctx.calibration) if ctx.calibration else None
    # a prompt runs whole on its attention-DP rank, as the simulator prices it (EffectiveStepCost, depth_correction)
    ops = StepCostModel(model, hw, lay, cal, dp_imbalance=float(lay.dp))
    grid = for_profile(cal)   # the profile's measured replay grid prices the prefill where it was measured on this model
    grid = grid if grid is not None and grid.matches(model) else None
    pol = [replay_policy(*r.policy.replay, model).resolve(model) for r in (without, won)]
    st = ctx.stats
    cached = int(max(0.0, st.mean_prompt - st.mean_new))
    pre = [prefill_seconds(ops, r, int(st.mean_prompt), won.policy.chunk_tokens, cached, tables=grid) for r in pol]
    kept = [kept_window_bytes(model, lay.kv_dtype, r) for r in pol]
    src = " (measured replay grid)" if grid is not None else ""
    return (f"prompt tokens computed per request (simulated) {without.prefill_tokens_per_request:,.0f} -> "
            f"{won.prefill_tokens_per_request:,.0f}, prefix-cache hit rate {without.hit_rate:.0%} -> {won.hit_rate:.0%}; "
            f"priced prefill{src} of the mean prompt ({st.mean_prompt:,.0f} tokens, {cached:,} cached) {_ms(pre[0])} -> {_ms(pre[1])}; "
            f"window KV kept per paused sequence {kept[0] / 1e6:.2f} -> {kept[1] / 1e6:.2f} MB")


def _reference(res: SearchResult, pol: str) -> Run:
    """What the winner's value of ``pol`` is measured against: the winner with ``pol`` at its baseline value, or, where
    the winner keeps that value, the best other value simulated with everything else as the winner's, or else the
    best run of any other value (the coordinate descent may have tried them only beside other settings: the
    explanation then names that run's whole policy)."""
    win = res.best.policy
    without = res.attribution[pol]
    if without.policy != win:
        return without
    best = lambda runs: max(runs, key=lambda r: (r.feasible, r.thr_gpu))  # noqa: E731
    others = [r for p, r in res.runs.items() if p != win and p == win.with_value(pol, p.value(pol))]
    if others:
        return best(others)
    elsewhere = [r for p, r in res.runs.items() if p.value(pol) != win.value(pol)]
    return best(elsewhere) if elsewhere else without


def policy_gains(ctx: TuneContext, res: SearchResult) -> list[PolicyGain]:
    """Each of the three policies: its baseline and winning value, the winner's gain over its reference
    (``_reference``) and the term that moved between the two."""
    base, win = res.baseline.policy, res.best.policy
    out = []
    for pol in THE_THREE:
        ref_run = _reference(res, pol)
        ref = ref_run.policy
        g = gain(ref_run.thr_gpu, res.best.thr_gpu) if ref != win else 0.0
        if pol == "ep_width":
            why = why_ep(ctx, ref, win)
        elif pol == "async_overlap":
            why = why_overlap(ctx, ref, win)
        else:
            why = why_replay(ctx, ref_run, res.best)
        out.append(PolicyGain(pol, base.value(pol), win.value(pol), ref_run, g, why))
    return out


def explanation(ctx: TuneContext, res: SearchResult) -> list[str]:
    """The winner's reasons as lines (also written into the plan's ``why``)."""
    load = "at capacity: every request queued at once" if ctx.saturated else f"at {ctx.rate_per_gpu:.3g} req/s per GPU offered"
    none = "" if res.best.feasible else f", none of them feasible (this one: {res.best.why})"
    lines = [f"highest simulated output throughput per GPU ({res.best.thr_gpu:,.0f} tokens/s {load}) among {len(res.runs)} simulated policies{none}; baseline {res.baseline.policy.describe()}: "
             f"{res.baseline.thr_gpu:,.0f} tokens/s ({gain(res.baseline.thr_gpu, res.best.thr_gpu):+.1%})"]
    for g in policy_gains(ctx, res):
        alt = g.without.policy.value(g.policy)
        if g.winner_value != g.baseline_value:
            head = f"{LABELS[g.policy]} {value_text(g.policy, g.baseline_value)} -> {value_text(g.policy, g.winner_value)}"
        else:
            head = f"{LABELS[g.policy]} keeps the baseline's {value_text(g.policy, g.winner_value)}"
        if alt == g.winner_value:
            lines.append(f"{head}: no other value simulated: {g.why}")
        else:
            alone = g.without.policy == res.best.policy.with_value(g.policy, alt)
            also = "" if alone else f" (the best {value_text(g.policy, alt)} simulated, as {g.without.policy.describe()})"
            lines.append(f"{head}: {g.gain:+.1%} over {value_text(g.policy, alt)}{also} ({g.without.thr_gpu:,.0f} -> "
                         f"{res.best.thr_gpu:,.0f} tokens/s/GPU{'' if g.without.feasible else ', which was infeasible: ' + g.without.why}): {g.why}")
    for w, reason in ctx.rejected.items():
        lines.append(f"EP{w} not tried: {reason}")
    return lines
