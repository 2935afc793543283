"""Words for the planner's answers: why a plan won, and why nothing works (with the closest options)."""

from __future__ import annotations

import numpy as np

from costmodels.hardware import Hardware
from costmodels.layout import ParallelLayout
from costmodels.model_spec import ModelSpec
from planner.combine import AGG, Table
from planner.request import SearchSpace
from planner.space import LayoutOption, Rejected, enumerate_layouts
from scheduler.metrics import SLO


def describe_row(table: Table, options: list[LayoutOption], i: int) -> str:
    """One line naming a candidate's deployment and policies."""
    c = table.cols
    opt = options[int(c["opt"][i])]
    pol = f"batch {int(c['B'][i])}/rank, MTP {int(c['d'][i])}, chunk {int(c['chunk'][i])}, async {'on' if c['async'][i] else 'off'}"
    pol += ", ADP balance" if c["adp"][i] else ""
    if c["mode"][i] == AGG:
        return f"{int(c['inst'][i])} x {opt.describe()} ({pol})"
    popt = options[int(c["popt"][i])]
    return (f"{int(c['pinst'][i])} x {popt.describe()} prefill + {int(c['inst'][i])} x {opt.describe()} decode "
            f"({pol}, prefill chunk {int(c['pchunk'][i])})")


def short_row(table: Table, options: list[LayoutOption], i: int) -> tuple[str, str]:
    """(deployment, policies) in a few characters each, for tables: '2xDEP16 tbo eplb+16 > 1xDEP32 eplb+32', 'B128 MTP3 c8k'."""
    c = table.cols

    def lay(k: int) -> str:
        return options[k].describe().replace(" fp8", "").replace(" bf16", "").replace(" fp4", "")

    if c["mode"][i] == AGG:
        dep = f"{int(c['inst'][i])}x{lay(int(c['opt'][i]))}"
    else:
        dep = f"{int(c['pinst'][i])}x{lay(int(c['popt'][i]))} > {int(c['inst'][i])}x{lay(int(c['opt'][i]))}"
    chunk = int(c["chunk"][i])
    pol = f"B{int(c['B'][i])} MTP{int(c['d'][i])} c{chunk // 1024}k" + ("" if c["async"][i] else " sync") + (" bal" if c["adp"][i] else "")
    return dep, pol


def _same_except(table: Table, i: int, **changes) -> int | None:
    """Row equal to ``i`` in every candidate field except ``changes`` (None if the table has none)."""
    c = table.cols
    keys = ("mode", "opt", "inst", "B", "d", "async", "chunk", "popt", "pinst", "pchunk", "pasync", "adp")
    mask = np.ones(table.n, bool)
    for k in keys:
        want = changes.get(k, c[k][i])
        mask &= c[k] == want
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def why_it_won(table: Table, options: list[LayoutOption], i: int, ok: np.ndarray, slo: SLO, sim: dict, meets_sim,
               points: dict | None = None) -> list[str]:
    """Reasons, each with a number: margin over the best of the other mode, SLO headroom, what each policy adds.

    ``sim`` maps rows to simulation outcomes and ``meets_sim`` is the planner's verdict on one (after every check,
    full scale included); comparisons use simulated numbers when both sides were simulated, else the screen's for
    both (never a simulated number against a screened one), over rows no simulation found missing the SLO.
    """
    c = table.cols
    out: list[str] = []
    thr = c["thr_gpu"]
    other = 1 - int(c["mode"][i])
    name = "aggregated" if other == AGG else "disaggregated"
    sim_other = [(o.thr_gpu, j) for j, o in sim.items() if int(c["mode"][j]) == other and meets_sim(o)]
    o_i = sim.get(i)
    if o_i is not None and sim_other:
        v, j = max(sim_other)
        out.append(f"{o_i.thr_gpu / v - 1:+.0%} output tokens/s per GPU over the best simulated {name} deployment meeting the SLO "
                   f"({describe_row(table, options, j)}: {v:,.0f})")
    else:
        mask_other = ok & (c["mode"] == other)
        mask_other[[j for j, o in sim.items() if not meets_sim(o)]] = False   # a simulated miss is not quoted as meeting
        if mask_other.any():
            j = int(np.flatnonzero(mask_other)[np.argmax(thr[mask_other])])
            out.append(f"{thr[i] / thr[j] - 1:+.0%} output tokens/s per GPU over the best {name} deployment meeting the SLO "
                       f"in the analytic screen ({describe_row(table, options, j)}: {thr[j]:,.0f} vs {thr[i]:,.0f})")
        elif (c["mode"] == other).any():
            out.append(f"no {name} deployment meets the SLO")
        else:   # none was a candidate (a budget too small to split, or the modes asked for): nothing to have missed
            out.append(f"no {name} deployment was among the candidates")
    if o_i is not None:
        ttft, tpot, src = o_i.ttft_s, o_i.tpot_s, "simulated"
    else:
        ttft, tpot, src = float(c["ttft"][i]), float(c["tpot"][i]), "screen"
    e2e = ""
    if slo.e2e_s is not None:   # the screen's is an estimate (planner.screen.e2e_at), said as one
        e2e = (f", E2E {o_i.e2e_s:.2f} s of {slo.e2e_s:g} s" if o_i is not None else
               f", E2E {float(c['e2e'][i]):.2f} s of {slo.e2e_s:g} s (estimated: this TTFT + the output tokens at the "
               "SLO's percentile at this TPOT)")
    out.append(f"meets the SLO ({src}): TTFT {ttft:.2f} s of {slo.ttft_s:g} s, TPOT {tpot * 1e3:.1f} ms of {slo.tpot_s * 1e3:g} ms{e2e}")
    out += _policy_effects(table, i, points or {})
    for role, col in (("decode" if c["mode"][i] != AGG else "instance", "opt"), ("prefill", "popt")):
        k_opt = int(c[col][i])
        if k_opt < 0:
            continue
        opt = options[k_opt]
        if opt.layout.ep <= 1:
            continue
        for k, o in enumerate(options):
            if o is not opt and (o.layout.tp, o.layout.dp, o.layout.ep, o.layout.two_micro_batch, o.layout.kv_dtype, o.table_placement) == \
                    (opt.layout.tp, opt.layout.dp, opt.layout.ep, opt.layout.two_micro_batch, opt.layout.kv_dtype, opt.table_placement) \
                    and o.eplb != opt.eplb:
                j = _same_except(table, i, **{col: k})
                if j is not None and thr[j] > 0:
                    gain = thr[i] / thr[j] - 1
                    # a tie is no reason it won (e.g. a disaggregated deployment's decode pool where its prefill
                    # pool sets the rate): say so rather than print "+0%" as one
                    out.append(f"{role} EPLB '{opt.eplb}' rather than '{o.eplb}': {gain:+.0%} throughput "
                               "(busiest EP rank's expert load; screen)" if abs(gain) >= 0.005 else
                               f"{role} EPLB '{opt.eplb}' or '{o.eplb}': the same throughput within 0.5% (screen)")
                    break
    return out


def _policy_effects(table: Table, i: int, points: dict) -> list[str]:
    """What async overlap and MTP drafts do for the winner's decode (or mixed) steps, from its operating points."""
    c = table.cols
    p = points.get(int(c["opt"][i]))
    if p is None:
        return []
    B, d, ov = int(c["B"][i]), int(c["d"][i]), bool(c["async"][i])

    def point(dd: int, oo: bool):
        m = (p.dec_B == B) & (p.dec_d == dd) & (p.dec_async == oo)
        k = np.flatnonzero(m)
        return (float(p.dec_t[k[0]]), float(p.dec_spt[k[0]])) if k.size else None

    out = []
    me, flip = point(d, ov), point(d, not ov)
    if me and flip and ov:
        out.append(f"async CPU/GPU overlap on: decode step {me[0] * 1e3:.1f} ms instead of {flip[0] * 1e3:.1f} ms "
                   f"(host work hidden), {flip[0] / me[0] - 1:+.0%} tokens/s")
    base = point(0, ov)
    if d and me and base:
        out.append(f"MTP {d} drafts: {me[1]:.2f} tokens per step for a {me[0] / base[0]:.2f}x longer step, "
                   f"{(me[1] / me[0]) / (base[1] / base[0]) - 1:+.0%} tokens/s per user")
    return out


def closest_to_slo(table: Table, slo: SLO, k: int = 5) -> np.ndarray:
    """Rows that miss the SLO by the least (largest of TTFT, TPOT and E2E, where set, over their targets), best first."""
    c = table.cols
    viol = np.maximum(c["ttft"] / slo.ttft_s, c["tpot"] / slo.tpot_s)
    if slo.e2e_s is not None:
        viol = np.maximum(viol, c["e2e"] / slo.e2e_s)
    viol = np.where(c["kv_ok"] & (c["rate"] > 0), viol, np.inf)
    order = np.lexsort((np.arange(table.n), -c["thr_gpu"], viol))
    return order[:k][np.isfinite(viol[order[:k]])]


def slo_unreachable(table: Table, options: list[LayoutOption], slo: SLO, seat_tokens: float = 0.0, model: ModelSpec | None = None,
                    min_batch: int = 1, output_p: float = 0.0, output_floor: float = 0.0,
                    percentile: int = 90, space: SearchSpace | None = None, gpus: int = 0) -> tuple[str, list[str]]:
    """Why no candidate meets the SLO, and the closest ones with their numbers. Where no candidate was built from the
    layouts that fit (``space``'s modes on ``gpus``), that is the reason; where none has KV room for its
    batch of ``seat_tokens``-token requests, that is (every latency would read 'inf'). An E2E target is
    said unreachable by its lower bound where that rules every row out (``output_floor`` tokens, the fewest the
    ``percentile`` of a simulated run's outputs holds, at the fastest a token can come), else by the estimate
    (``output_p`` tokens, the workload's at the percentile, at each row's TPOT after its TTFT)."""
    if table.n == 0 and options and space is not None:
        return "no deployment meets the SLO: " + no_candidates(options, space, gpus), []
    c = table.cols
    okkv = c["kv_ok"] & (c["rate"] > 0)
    if not okkv.any() and seat_tokens > 0:
        room = max((o.max_kv_tokens_per_rank for o in options), default=0)
        msg = (f"no deployment meets the SLO: none has KV cache room for its requests (each holds {seat_tokens:,.0f} tokens, "
               f"mean prompt + output; the largest KV pool is {room:,} tokens per DP rank, the smallest batch searched "
               f"{min_batch} per rank)")
        if model is not None and seat_tokens > model.max_context:
            msg += f"; they are also past {model.name}'s context of {model.max_context:,} tokens"
        return msg + ": more GPUs, an FP8 KV cache (space.kv_dtypes) or smaller batches (space.batch_per_rank)", []
    best_ttft = float(c["ttft"][okkv].min()) if okkv.any() else float("inf")
    best_tpot = float(c["tpot"][okkv].min()) if okkv.any() else float("inf")
    parts = []
    if best_ttft > slo.ttft_s:
        parts.append(f"the fastest first token any candidate reaches is {best_ttft:.2f} s (SLO {slo.ttft_s:g} s)")
    if best_tpot > slo.tpot_s:
        parts.append(f"the fastest decode step per token is {best_tpot * 1e3:.1f} ms (SLO {slo.tpot_s * 1e3:g} ms)")
    if slo.e2e_s is not None:
        parts += _e2e_unreachable(table, okkv, slo, output_p, output_floor, percentile)
    if not parts:
        both = "all three bounds" if slo.e2e_s is not None else "both bounds"
        parts.append(f"no candidate meets {both} at once (the fast-TTFT and the fast-TPOT deployments differ)")
    msg = "no deployment meets the SLO: " + "; ".join(parts)
    rows = closest_to_slo(table, slo)
    close = [f"{describe_row(table, options, int(r))}: TTFT {c['ttft'][r]:.2f} s, TPOT {c['tpot'][r] * 1e3:.1f} ms, "
             + (f"E2E {c['e2e'][r]:.2f} s (estimated), " if slo.e2e_s is not None else "")
             + f"{c['thr_gpu'][r]:,.0f} tokens/s/GPU" for r in rows]
    return msg, close


def no_candidates(options: list[LayoutOption], space: SearchSpace, gpus: int) -> str:
    """Why the layouts that fit made no candidate deployment (an empty table): said as such, not as a lack of KV room
    (a disaggregated plan on one GPU read "none has KV cache room for its requests" with 0 candidates screened)."""
    narrowest = min(o.gpus for o in options)
    why = []
    if "disaggregated" in space.modes:
        pre = min((o.gpus for o in options if o.gpus <= space.prefill_max_gpus), default=None)
        if pre is None:
            why.append(f"a disaggregated one needs a prefill instance of at most {space.prefill_max_gpus} GPUs "
                       f"(space.prefill_max_gpus), and the narrowest layout that fits spans {narrowest}")
        elif pre + narrowest > gpus:
            why.append(f"a disaggregated one needs a prefill and a decode instance, {pre + narrowest} GPUs at least (the "
                       f"narrowest layouts that fit span {pre} and {narrowest}), and the budget is {gpus}")
    if "aggregated" in space.modes and narrowest > gpus:   # pragma: no cover - a layout that fits fits the budget
        why.append(f"the narrowest layout that fits spans {narrowest} GPUs, past the budget of {gpus}")
    modes = " and ".join(space.modes)
    return (f"no candidate deployment was built ({modes}) from the {len(options)} layout options that fit"
            + (": " + "; ".join(why) if why else "") + ": more GPUs, or other modes (space.modes)")


def _e2e_unreachable(table: Table, okkv: np.ndarray, slo: SLO, output_p: float, output_floor: float,
                     percentile: int) -> list[str]:
    """Why the E2E target is out of reach, if it is: its lower bound (planner.screen.e2e_floor) over the target for
    every row, or for every row meeting TTFT and TPOT; else (the planner simulates nothing then) its estimate
    (planner.screen.e2e_at) over it for every row meeting TTFT and TPOT."""
    c = table.cols
    lat = okkv & (c["ttft"] <= slo.ttft_s) & (c["tpot"] <= slo.tpot_s)
    for rows, who in ((okkv, "no candidate"), (lat, "no candidate meeting TTFT and TPOT")):
        if not rows.any():
            return []
        floor = float(c["e2e_floor"][rows].min())
        if floor > slo.e2e_s:
            tok = floor / max(output_floor - 1.0, 1.0)
            return [f"{who} can finish the p{percentile} request within E2E {slo.e2e_s:g} s: at least {output_floor:,.0f} "
                    f"output tokens (the fewest a run's p{percentile} holds) at the fastest it decodes one request's tokens "
                    f"({tok * 1e3:.1f} ms, the request alone, every draft accepted) take {floor:.2f} s"]
    best = float(c["e2e"][lat].min())
    if best <= slo.e2e_s:
        return []
    return [f"the shortest E2E any candidate meeting TTFT and TPOT screens at is {best:.2f} s (SLO {slo.e2e_s:g} s; "
            f"TTFT + {output_p:,.0f} output tokens, the p{percentile}, at its TPOT: an estimate)"]


def does_not_fit(model: ModelSpec, hw: Hardware, budget: int, space: SearchSpace, rejected: list[Rejected],
                 mem_fraction: float) -> tuple[str, list[str]]:
    """Why no layout fits in the budget, and what would (more GPUs, smaller dtypes)."""
    smallest = min(rejected, key=lambda r: (r.short_by_bytes, r.gpus)) if rejected else None
    msg = f"{model.name} does not fit on {budget} x {hw.name}"
    if smallest is not None:
        msg += f": the closest layout, {smallest.label}, {smallest.reason.removeprefix('does not fit: ')}"
    options: list[str] = []
    for factor in (2, 4, 8, 16, 32, 64):
        bigger = budget * factor
        ok, _ = enumerate_layouts(model, hw, bigger, space, mem_fraction=mem_fraction)
        if ok:
            least = min(ok, key=lambda o: (o.gpus, o.describe()))
            options.append(f"with {least.gpus} GPUs: {least.describe()} fits ({least.max_kv_tokens_per_rank:,} KV tokens per DP rank)")
            break
    for label, upd in (("FP8 KV cache", {"kv_dtypes": ("fp8",)}),
                       ("FP8 weights", {"weight_dtype": "fp8", "expert_dtype": "fp8"}),
                       ("FP4 experts", {"expert_dtype": "fp4"})):
        if label == "FP4 experts" and not hw.supports("fp4"):
            continue
        alt = space.model_copy(update=upd)
        if alt == space:
            continue
        ok, _ = enumerate_layouts(model, hw, budget, alt, mem_fraction=mem_fraction)
        if ok:
            least = min(ok, key=lambda o: (o.gpus, o.describe()))
            options.append(f"with {label} on {budget} GPUs: {least.describe()} fits (changes accuracy: check before use)")
    if not options:
        options.append("no layout in the search space fits even with 64x the GPUs: check the model and hardware files")
    return msg, options


def fmt_layout(layout: ParallelLayout) -> str:
    return layout.describe()
