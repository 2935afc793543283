"""``twinfer tune --gpus N`` (no --profile): EP width, async overlap and replay length searched together on a catalog
model and GPU in simulation; prints why the winner won and writes it as a plan (``planner.tune_plan``)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from twinfer.errors import TwinferError

ONOFF = {"on": True, "off": False, "true": True, "false": False}


def int_list(text: str, flag: str, lo: int = 0, hi: int | None = None) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); anything else (or a value outside ``lo``..``hi``) a one-line error naming ``flag``."""
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TwinferError(f"{flag} {text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not vals or any(v < lo for v in vals):
        raise TwinferError(f"{flag} {text!r}: expected comma-separated integers >= {lo}")
    if hi is not None and max(vals) > hi:
        raise TwinferError(f"{flag} {text!r}: each value at most {hi:,}")
    return vals


def bool_list(text: str, flag: str) -> tuple[bool, ...]:
    vals = [x.strip().lower() for x in text.split(",") if x.strip()]
    if not vals or any(v not in ONOFF for v in vals):
        raise TwinferError(f"{flag} {text!r}: expected off, on or off,on")
    return tuple(ONOFF[v] for v in vals)


def layers_list(text: str, flag: str) -> tuple[str, ...]:
    from planner.tune_policies import LAYER_GROUPS

    vals = tuple(x.strip() for x in text.split(",") if x.strip())
    if not vals or any(v not in ("all",) + LAYER_GROUPS for v in vals):
        raise TwinferError(f"{flag} {text!r}: allowed: all (every window layer replays W) or a window layer kind: "
                           f"{', '.join(LAYER_GROUPS)}")
    return vals


def run_catalog_tune(*, model: str, hardware: str, gpus: int, workload: str, load: Optional[float], rate_per_gpu: Optional[float],
                     slo_tpot_s: Optional[float], space_args: dict, base_args: dict, sim_requests: int, plan_requests: int,
                     rounds: int, seed: int, out: Optional[Path], plan_out: Optional[Path], calibration: Optional[str] = None,
                     calibration_notes: tuple[str, ...] | list[str] = ()) -> None:
    """Fit the EP widths, find the rate, search, explain, write the plan (``calibration``: a checked profile path that
    every simulation, the explanation and the plan take; ``calibration_notes``: what of it applies, printed)."""
    from rich.console import Console

    from planner.tune_explain import explanation
    from planner.tune_plan import confirm, tuned_plan
    from planner.tune_policies import (TuneSpace, baseline_policy, capacity_per_gpu, check_rate_per_gpu, make_context,
                                       search, simulations_bound, values_of)
    from scheduler.metrics import SLO
    from twinfer.config import validate
    from ui.cmd_run import _load_workload
    from ui.progress import progress_bar

    con = Console()
    space = validate(TuneSpace, {k: v for k, v in space_args.items() if v is not None}, "tune")
    spec = _load_workload(workload, None, None)
    slo = SLO(ttft_s=3600.0, tpot_s=slo_tpot_s) if slo_tpot_s else None
    ctx = make_context(model, hardware, gpus, spec, space, slo=slo, slo_percentile=50, seed=seed, sim_requests=sim_requests,
                       calibration=calibration)
    for line in calibration_notes:
        con.print(line, highlight=False)
    for w, reason in ctx.rejected.items():
        con.print(f"EP{w}: not tried: {reason}", highlight=False)
    if not ctx.options:
        if space_args.get("ep_widths"):
            raise TwinferError(f"--ep-widths: no EP width fits {model} on {gpus} x {hardware} (reasons above)")
        raise TwinferError(f"--gpus {gpus}: {model} fits at no EP width on {gpus} x {hardware} (reasons above): give more "
                           "--gpus, or a smaller --model")
    vals = values_of(ctx, space)
    base = baseline_policy(ctx, vals, **base_args)
    if rate_per_gpu is not None:
        ctx.rate_per_gpu = rate_per_gpu
    elif load is not None:
        cap = capacity_per_gpu(ctx, base)
        if not cap > 0:   # nothing to scale: every rate would be 0 (the plan could not be built)
            raise TwinferError(f"--load {load:g}: the baseline ({base.describe()}) finished no request with every request "
                               f"queued at once (are the --workload's requests longer than {model}'s context?)")
        check_rate_per_gpu(load * cap, f"--load {load:g} x the baseline's capacity of {cap:.3g} requests/s per GPU")
        ctx.rate_per_gpu = load * cap
        con.print(f"baseline capacity {cap:.3g} req/s per GPU (everything queued at once); offered {load:g} x = "
                  f"{ctx.rate_per_gpu:.3g} req/s per GPU", highlight=False)
    else:
        con.print("policies compared at capacity: every request queued at once (--load or --rate-per-gpu: at an offered rate)",
                  highlight=False)
    total = simulations_bound(vals, rounds)
    done: list = []  # the runs so far, for a Ctrl-C
    err = Console(stderr=True)  # bars and the Ctrl-C report on stderr, as every command's
    with progress_bar(err, transient=True) as bar:
        task = bar.add_task("tune: simulating policies", total=total)
        try:
            res = search(ctx, base, vals, max_rounds=rounds, tick=lambda run: (done.append(run), bar.advance(task)))
        except KeyboardInterrupt:
            bar.stop()
            print_interrupted(err, done, total, f"p{ctx.slo_percentile}" if ctx.slo is not None else "p50")
            raise typer.Exit(130) from None
        bar.update(task, total=len(res.runs), completed=len(res.runs))
    why = explanation(ctx, res)
    print_report(con, ctx, res, why)
    if not res.best.thr_gpu > 0:   # a plan at 0 requests/s cannot be built, and would serve nothing
        raise TwinferError(f"no policy simulated produced output ({res.best.why}): no plan (are the --workload's requests "
                           f"longer than {model}'s context?)")
    plan = tuned_plan(ctx, res.best.policy, why, max_requests=plan_requests, capacity_per_gpu=res.best.thr_gpu / max(ctx.stats.mean_output, 1.0))
    with progress_bar(err, transient=True) as bar:
        bar.add_task(f"full-scale run of the plan ({plan.workload.num_requests:,} requests)", total=None)
        plan = confirm(plan)
    pr = plan.predicted
    con.print(f"plan at full scale ({plan.pools[0].instances} x {plan.pools[0].label}, {pr.request_rate:.3g} req/s, "
              f"{pr.simulated_requests:,} requests): "
              f"{pr.output_tokens_per_s_per_gpu:,.0f} output tokens/s per GPU, TPOT p{plan.slo_percentile} {pr.tpot_s * 1e3:.1f} ms, "
              f"digest {pr.sim_digest[:16]}", highlight=False)
    con.print("EP width is a simulated recommendation: it is measured only where several GPUs are lent", highlight=False)
    if plan_out is not None:
        plan.save(plan_out)
        con.print(f"plan: {plan_out}  (twinfer simulate --plan {plan_out} repeats these figures; twinfer serve --plan runs it)"
                  + (f"; priced with calibration {calibration}" if calibration else ""), highlight=False)
    if out is not None:
        doc = {"runs": [dict(policy=r.policy.__dict__, thr_gpu=r.thr_gpu, ttft_s=r.ttft_s, tpot_s=r.tpot_s, feasible=r.feasible,
                             why=r.why, prefill_tokens_per_request=r.prefill_tokens_per_request, digest=r.digest)
                        for r in res.runs.values()],
               "baseline": res.baseline.policy.__dict__, "winner": res.best.policy.__dict__, "rounds": res.rounds,
               "rejected_ep_widths": ctx.rejected, "rate_per_gpu": None if ctx.saturated else ctx.rate_per_gpu,
               "compared_at_capacity": ctx.saturated, "why": why,
               "calibration": calibration, "calibration_notes": list(calibration_notes),
               "plan_predicted": pr.model_dump(), "command": "twinfer " + " ".join(sys.argv[1:]),
               "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        Path(out).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
        con.print(f"result: {out}")


def print_interrupted(con, runs: list, total: int, pct: str) -> None:
    """Ctrl-C during the search: how far it got and the best policy among the finished simulations (no plan)."""
    con.print(f"[yellow]interrupted after {len(runs)} of at most {total} policy simulations; no winner and no plan[/]", highlight=False)
    feasible = [r for r in runs if r.feasible]
    if feasible:
        b = max(feasible, key=lambda r: r.thr_gpu)
        con.print(f"best so far (simulated, not run at full scale): {b.policy.describe()}: {b.thr_gpu:,.0f} output tok/s/GPU, "
                  f"TTFT {pct} {b.ttft_s:.2f} s, TPOT {pct} {b.tpot_s * 1e3:.1f} ms", highlight=False)


def print_report(con, ctx, res, why: list[str]) -> None:
    """The best run per (EP width, overlap, replay), the best per value of each policy, and the reasons."""
    from rich import box
    from rich.table import Table

    from planner.tune_explain import LABELS, best_per_value, combo_table, gain, value_text

    con.print(f"{len(res.runs)} policies simulated (coordinate descent, {res.rounds} round(s)) on {ctx.model} x {ctx.hardware}, "
              f"{ctx.gpus} GPUs; workload {ctx.stats.describe()}", highlight=False)
    # two-line headers, no box: fits an 80-column terminal (a boxed table cut "tok/s/GPU" to "tok/…" and "+88.6%" to "+88.…")
    tab = Table(title="best per policy combination (simulated; the others at their best)", title_justify="left",
                box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0))
    pct = f"p{ctx.slo_percentile}" if ctx.slo is not None else "p50"
    for c in ("EP", "async", "replay", "batch\n/rank", "chunk", "tok/s\n/GPU", "vs\nbase", f"TTFT\n{pct} s", f"TPOT\n{pct} ms",
              "feasible"):
        tab.add_column(c, justify="left" if c == "feasible" else "right", no_wrap=c not in ("replay", "feasible"),
                       min_width=len(c) if c in ("replay", "feasible") else None)
    b0 = res.baseline.thr_gpu
    for (ep, ov, rep), r in combo_table(res):
        mark = "*" if r is res.best else ""
        tab.add_row(f"{mark}EP{ep}", value_text("async_overlap", ov), value_text("replay", rep), str(r.policy.batch_per_rank),
                    str(r.policy.chunk_tokens), f"{r.thr_gpu:,.0f}", f"{gain(b0, r.thr_gpu):+.1%}",
                    f"{r.ttft_s:.2f}" if r.ttft_s < 1e9 else "-",
                    f"{r.tpot_s * 1e3:.1f}" if r.tpot_s < 1e9 else "-", "yes" if r.feasible else r.why)
    con.print(tab)
    per = Table(title="best per policy value", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for c in ("policy", "value", "tok/s/GPU", "vs base"):
        per.add_column(c, justify="right")
    for pol, rows in best_per_value(res).items():
        for v, r in rows:
            per.add_row(LABELS[pol], value_text(pol, v), f"{r.thr_gpu:,.0f}" if r.feasible else f"({r.why})", f"{gain(b0, r.thr_gpu):+.1%}")
    con.print(per)
    if not res.best.feasible:   # better() ranks feasible first: none was
        con.print(f"[bold red]no policy simulated is feasible[/]: the winner below is the best infeasible one "
                  f"({res.best.why})", highlight=False)
    con.print(f"winner: {res.best.policy.describe()}" + ("" if res.best.feasible else f" (INFEASIBLE: {res.best.why})"),
              highlight=False)
    con.print("why it won:", highlight=False)
    for line in why:
        con.print(f"  - {line}", highlight=False)
