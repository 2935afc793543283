"""``twinfer plan``: search deployments for a GPU budget, print the Pareto frontier and the recommended plan."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.request import DEFAULT_PRICE_CACHED_INPUT, DEFAULT_PRICE_INPUT, DEFAULT_PRICE_OUTPUT
from planner.slo import EXAMPLE, parse_slo, slo_in_mapping
from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError
from ui.progress import PLANNER_JOBS as JOB_LABELS  # the labels the UI's bar uses too

def _workload(name: str) -> dict:
    if name.endswith(".jsonl"):   # read as YAML it failed with a parser's message of several lines
        raise TwinferError(f"--workload {name}: a .jsonl file is a trace; give it as --trace {name} "
                           "(--workload takes a preset or a workload YAML/JSON file)")
    if Path(name).is_file() or name.endswith((".yaml", ".yml", ".json")):
        return read_mapping(name)
    return {"preset": name}


def _skew(text: str | None) -> dict | None:
    """'zipf:0.8' | 'uniform' | 'histogram:file.json' (a list of tokens per expert)."""
    if text is None:
        return None
    kind, _, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind == "uniform":
        return {"skew": "uniform"}
    if kind == "zipf":
        try:
            return {"skew": "zipf", "zipf_s": float(arg) if arg else 0.63}
        except ValueError:
            raise TwinferError(f"--expert-skew {text!r}: the Zipf exponent must be a number, e.g. zipf:0.8") from None
    if kind == "histogram":
        p = Path(arg)
        if not p.is_file():
            raise TwinferError(f"--expert-skew {text!r}: {arg!r} is not a file (a JSON list of tokens per expert)")
        try:
            data = json.loads(p.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as err:
            raise TwinferError(f"--expert-skew {text!r}: {arg} is not JSON ({err}); expected a list of tokens per expert") from None
        if not isinstance(data, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data):
            raise TwinferError(f"--expert-skew {text!r}: {arg} must hold a JSON list of numbers (tokens per expert)")
        return {"skew": "histogram", "histogram": data}
    raise TwinferError(f"--expert-skew {text!r}: expected uniform, zipf[:S] or histogram:FILE.json")


def build_request(config: Optional[str], **flags):
    """The PlanRequest from an optional config file and command-line flags (flags win)."""
    from planner.request import PlanRequest

    from ui.user_errors import check_arrival_flags

    data: dict = read_mapping(config) if config else {}
    f = {k: v for k, v in flags.items() if v is not None}
    check_arrival_flags({"--workload": f.get("workload"), "--trace": f.get("trace"), "--trace-format": f.get("trace_format")})
    for key in ("model", "hardware", "gpus", "seed", "calibration"):
        if key in f:
            data[key] = f[key]
    if "workload" in f:
        data["workload"] = _workload(f["workload"])
    if "trace" in f:   # replayed at the rate each deployment is sized for (its arrival times scaled), as a preset's rate is set
        data["workload"] = {"kind": "trace", "trace_path": f["trace"], "trace_format": f.get("trace_format", "jsonl")}
    data.setdefault("workload", {"preset": "chat"})
    slo_in_mapping(data, config or "twinfer plan")
    if "slo" in f:
        spec = parse_slo(f["slo"], "--slo")
        data["slo"], data["slo_percentile"] = spec.targets(), spec.percentile
    if "slo" not in data:
        raise TwinferError(f"--slo is required, e.g. --slo {EXAMPLE}")
    if "simulate" in f:
        data["simulate_top"] = f["simulate"]
    if "sim_requests" in f:
        data["sim_requests"] = f["sim_requests"]
    prices = dict(data.get("prices") or {})
    for flag, key in (("price_input", "input_per_mtok"), ("price_cached", "cached_input_per_mtok"),
                      ("price_output", "output_per_mtok"), ("gpu_hour", "gpu_hour")):
        if flag in f:
            prices[key] = f[flag]
    if prices:
        data["prices"] = prices
    if "modes" in f:
        names = {"agg": "aggregated", "aggregated": "aggregated", "disagg": "disaggregated", "disaggregated": "disaggregated", "pd": "disaggregated"}
        modes = []
        for m in f["modes"].split(","):
            m = m.strip().lower()
            if m not in names:
                raise TwinferError(f"--modes {f['modes']!r}: {m!r} is not one of agg, disagg")
            modes.append(names[m])
        data.setdefault("space", {})
        data["space"] = {**data["space"], "modes": sorted(set(modes))}
    skew = _skew(f.get("expert_skew"))
    if skew is not None:
        data["expert_load"] = skew
    try:
        return validate(PlanRequest, data, config or "twinfer plan")
    except TwinferError as e:   # name the flag the user typed next to the field it set (--simulate: simulate_top)
        msg = str(e)
        for key in f:
            if key in FLAG_FIELDS:
                msg = msg.replace(f": {FLAG_FIELDS[key]}:", f": --{key.replace('_', '-')} ({FLAG_FIELDS[key]}):")
        if "gpus" in f:   # a rule of several fields names the budget inside its message
            msg = msg.replace("needs gpus >= ", "needs --gpus >= ").replace("; gpus is ", "; --gpus is ")
        if msg == str(e):
            raise
        raise TwinferError(msg) from None


# the PlanRequest field each plain flag sets (build_request), for errors that name the flag
FLAG_FIELDS = {"model": "model", "hardware": "hardware", "gpus": "gpus", "seed": "seed", "calibration": "calibration",
               "simulate": "simulate_top", "sim_requests": "sim_requests", "price_input": "prices.input_per_mtok",
               "price_cached": "prices.cached_input_per_mtok", "price_output": "prices.output_per_mtok",
               "gpu_hour": "prices.gpu_hour", "modes": "space.modes", "trace": "workload.trace_path",
               "trace_format": "workload.trace_format"}


def _fmt_ms(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x * 1e3:,.1f}"


def _fmt_s(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:,.2f}"


WIDE = 100  # the width the tables are laid out for; below it they drop padding and the $/M column


def points_table(title: str, points, rec_label: str, price: float, pct: int, width: int = WIDE) -> Table:
    """Deployments as rows that fit ~100 columns: two-line headers, mode folded into the deployment, a 'meets SLO' column.

    Narrower (an 80-column terminal): no cell padding and no $/M column (the recommendation's cost line has
    it), so that 'meets SLO' and 'from' stay on screen instead of being cut off at the right edge."""
    narrow = width < WIDE
    tab = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True,
                padding=(0, 0) if narrow else (0, 1))
    cols = [("", "left"), ("deployment\nprefill > decode", "left"), ("policies", "left"), ("GPUs", "right"),
            ("tok/s\nper GPU", "right"), ("tok/s\nper user", "right"), (f"TTFT\np{pct} s", "right"),
            (f"TPOT\np{pct} ms", "right"), ("$/M\nout", "right"), ("meets\nSLO", "left"), ("from", "left")]
    for c, j in cols:
        if narrow and c.startswith("$/M"):
            continue
        wraps = c.startswith(("deployment", "policies"))  # the numbers never wrap; the labels fold at spaces
        # the labels fold (inside a long word too); a figure's column keeps at least its header's width, so a narrow
        # table shrinks the labels, never cuts a header ('from' to 'fro')
        tab.add_column(c, justify=j, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis",
                       min_width=(12 if narrow else 16) if c.startswith("deployment") else None if wraps else max(1, *map(len, c.split("\n"))))
    for p in points:
        usd = price / (p.output_tokens_per_s_per_gpu * 3600) * 1e6 if p.output_tokens_per_s_per_gpu > 0 and price else float("nan")
        mode = "agg" if p.mode == "aggregated" else "disagg"
        cells = ["[bold green]*[/]" if p.label == rec_label else "", f"{mode} {escape(p.deployment or p.label)}",
                 escape(p.policies), str(p.gpus), f"{p.output_tokens_per_s_per_gpu:,.0f}", f"{p.tokens_per_s_per_user:,.1f}",
                 _fmt_s(p.ttft_s), _fmt_ms(p.tpot_s), "-" if not math.isfinite(usd) else f"{usd:,.3f}",
                 _meets_cell(p), "sim" if p.source == "simulation" else "screen"]
        if narrow:
            del cells[8]
        tab.add_row(*cells)
    return tab


def _meets_cell(p) -> str:
    """'yes', 'no', or 'no (full scale)' where the slice met the SLO and the full-scale runs did not."""
    if p.meets_slo:
        return "yes"
    return "[red]no (full scale)[/]" if p.full_scale is False else "[red]no[/]"


def print_report(con: Console, rep, out: Optional[Path]) -> None:
    """The human-readable report."""
    con.print(f"[bold]twinfer plan[/]: {rep.model} on {rep.gpus} x {rep.hardware}; SLO {escape(rep.slo)}", highlight=False)
    con.print(f"[dim]workload {escape(rep.workload)}[/]", highlight=False)
    t = rep.timings
    con.print(
        f"[dim]{rep.layouts_fitting} of {rep.layouts_considered} layouts fit in memory; {rep.candidates_screened:,} deployments screened "
        f"({rep.candidates_evaluated:,} evaluated, the rest dominated) in {t.screen_s:.1f} s; {rep.candidates_meeting_slo:,} meet the SLO by the screen's estimates; "
        f"{rep.candidates_simulated} simulated ({rep.simulations_run} runs) in {t.simulate_s:.1f} s on {t.runner}[/]",
        highlight=False,
    )
    if rep.status != "ok":
        con.print(f"[bold red]{escape(rep.message)}[/]", highlight=False)
        if rep.closest_options:
            con.print("closest options:", highlight=False)
            for line in rep.closest_options:
                con.print(f"  - {escape(line)}", highlight=False)
        return
    plan = rep.recommended
    price = plan.economics.price_per_gpu_hour if plan.economics else 0.0
    rec_label = rep.message.removeprefix("recommended: ")

    def table(title: str, points) -> Table:
        return points_table(title, points, rec_label, price, plan.slo_percentile, con.width)

    sim = [p for p in rep.frontier if p.source == "simulation"]
    screen = [p for p in rep.frontier if p.source == "screen"]
    if sim:
        con.print(table(f"Pareto frontier (simulated, meeting the SLO): output tokens/s per GPU vs tokens/s per user", sim))
    if screen:
        con.print(table("analytic screen frontier (not simulated: full batches, mean lengths; optimistic)", screen))
    best = [p for p in rep.best_by_mode if p.meets_slo]  # the title promises it: a miss is named below, not listed
    if best:
        con.print(table("aggregated vs disaggregated: the best of each meeting the SLO", best))
    for p in rep.best_by_mode:
        if not p.meets_slo:
            how = "at full scale (its slice met it: " if p.full_scale is False else "in simulation ("
            con.print(f"[yellow]{'aggregated' if p.mode == 'aggregated' else 'disaggregated'}: the best screened deployment "
                      f"({escape(p.deployment or p.label)}) misses the SLO {how}TTFT p{plan.slo_percentile} {_fmt_s(p.ttft_s)} s, "
                      f"TPOT p{plan.slo_percentile} {_fmt_ms(p.tpot_s)} ms); none of this mode is listed[/]", highlight=False)
    pr, ec = plan.predicted, plan.economics
    con.print(f"\n[bold green]recommended[/]: {escape(rec_label)}", highlight=False)
    for pool in plan.pools:
        sc = pool.scheduler
        con.print(f"  {pool.role:7s} {pool.instances} x {escape(pool.label or pool.layout.describe())} ({pool.layout.gpus} GPUs each): "
                  f"max batch {sc.max_num_seqs}, token budget {sc.max_num_batched_tokens:,}, chunk {sc.long_prefill_threshold:,}, "
                  f"MTP {sc.draft_len}, async overlap {'on' if sc.async_overlap else 'off'}", highlight=False)
    con.print(f"  router {plan.router.kind}; EPLB {'on' if plan.effects.eplb else 'off'}; KV link {plan.kv_link}", highlight=False)
    con.print(f"  predicted ({pr.source}): {pr.output_tokens_per_s_per_gpu:,.0f} output tok/s/GPU, {pr.tokens_per_s_per_user:,.1f} tok/s/user, "
              f"TTFT p{plan.slo_percentile} {pr.ttft_s:.2f} s, TPOT p{plan.slo_percentile} {pr.tpot_s * 1e3:.1f} ms at an offered {pr.request_rate:,.1f} req/s",
              highlight=False)
    for line in _trace_lines(plan):
        con.print(f"  {line}", highlight=False)
    if pr.window:
        con.print(f"  [dim]figures: {escape(pr.window)}[/]", highlight=False)
    for d in plan.defaults:
        con.print(f"  default: {escape(d)}", highlight=False)
    if ec is not None:
        con.print(f"  cost: ${ec.price_per_gpu_hour:.2f}/GPU-hour x {ec.gpus_used} GPUs = ${ec.cluster_cost_per_hour:,.2f}/hour; "
                  f"${ec.cost_per_million_output_tokens:,.3f} per million output tokens (${ec.cost_per_million_total_tokens:,.3f} per million total)",
                  highlight=False)
        con.print(f"  revenue at list prices: ${ec.revenue_per_gpu_hour:,.2f}/GPU-hour (margin ${ec.margin_per_gpu_hour:,.2f}); "
                  f"{ec.output_tokens_per_day / 1e9:,.2f} B output tokens/day ({ec.total_tokens_per_day / 1e9:,.1f} B total)", highlight=False)
    con.print("[bold]why it won[/]:", highlight=False)
    for w in plan.why:
        con.print(f"  - {escape(w)}", highlight=False)
    con.print("[dim]assumptions (full list in the plan file / --json):[/]", highlight=False)
    for a in plan.assumptions[:3]:
        con.print(f"[dim]  - {escape(a)}[/]", highlight=False)
    if out is not None:
        con.print(f"wrote plan: {out}  (run it: twinfer simulate --plan {out})", highlight=False)
    con.print(f"[dim]total {t.total_s:.1f} s[/]", highlight=False)


def _trace_lines(plan) -> list[str]:
    """For a plan of a trace: how its run replays the trace (the offered rate above is that replay's requests over
    their arrival span), and a note where the trace holds fewer requests than the run was sized for."""
    wl = plan.workload
    if wl.kind != "trace":
        return []
    from sim.workload import trace_arrivals

    n, span = trace_arrivals(wl)
    ts = wl.time_scale
    pace = "as recorded" if ts == 1 else f"{1 / ts:,.3g}x as fast as its timestamps" if ts < 1 else f"{ts:,.3g}x as slow as its timestamps"
    out = [f"[dim]trace {escape(str(wl.trace_path))} replayed at time_scale {ts:.4g} ({pace}): {n:,} requests arriving "
           f"over {span:,.4g} s[/]"]
    if wl.max_requests is not None and n < wl.max_requests:
        out.append(f"[yellow]note: the trace holds {n:,} requests; the plan's run is sized for {wl.max_requests:,} (its "
                   "seats turned over, past their ramp-up): its figures are of a run too short to reach a steady state; "
                   "a longer trace gives figures that hold[/]")
    return out


def plan_with_progress(plan_deployment, req, workers: int, ray: Optional[str], quiet: bool):
    """``plan_deployment`` with a bar per batch of planner jobs on stderr; Ctrl-C says how far it got."""
    import time

    from planner.parallel import reporting
    from ui.progress import progress_bar

    err = Console(stderr=True)
    where: dict = {"task": None, "label": "fit", "done": 0, "total": 0}
    t0 = time.perf_counter()
    with progress_bar(err, transient=quiet) as bar:
        def hook(name: str, done: int, total: int) -> None:
            if done == 0:
                where["label"] = JOB_LABELS.get(name, name)
                where["task"] = bar.add_task(where["label"], total=total)
            bar.update(where["task"], completed=done, total=total)
            where["done"], where["total"] = done, total

        try:
            with reporting(hook):
                return plan_deployment(req, workers=workers, ray_address=ray)
        except KeyboardInterrupt:
            bar.stop()
            err.print(f"[yellow]interrupted after {time.perf_counter() - t0:.1f} s while the planner was at '{where['label']}' "
                      f"({where['done']} of {where['total']} jobs); no plan: the recommendation needs the simulations[/]",
                      highlight=False)
            raise typer.Exit(130) from None


def register(app: typer.Typer) -> None:
    """Add ``plan`` to the CLI."""

    @app.command("plan")
    def plan(
        model: Optional[str] = typer.Option(None, "--model", "-m", help="model catalog name, HF config.json (or its folder) or ModelSpec YAML [deepseek-v3]"),
        hardware: Optional[str] = typer.Option(None, "--hardware", "--hw", help="GPU catalog name or hardware YAML (twinfer hardware --template) [gb300]"),
        calibration: Optional[str] = typer.Option(None, "--calibration", help="calibration profile JSON whose efficiencies replace the defaults"),
        gpus: Optional[int] = typer.Option(None, "--gpus", "-g", help="GPU budget"),
        workload: Optional[str] = typer.Option(None, "--workload", "-w", help="preset (chat, agentic, reasoning, summarize, long-context) or file [chat]"),
        trace: Optional[str] = typer.Option(None, "--trace", help="plan for a trace file's requests instead of a preset: its lengths, "
                                            "prefixes and arrival pattern, replayed at the rate each deployment is sized for"),
        trace_format: Optional[str] = typer.Option(None, "--trace-format", help="mooncake | jsonl [jsonl]"),
        slo: Optional[str] = typer.Option(None, "--slo", help=f"latency targets with percentile and unit, e.g. {EXAMPLE} (p50/p90/p99; s/ms/us); required unless the --config file has an slo section"),
        modes: Optional[str] = typer.Option(None, "--modes", help="agg,disagg [both]"),
        simulate: Optional[int] = typer.Option(None, "--simulate", help="candidates to check in the simulator [6]; 0: screen only"),
        sim_requests: Optional[int] = typer.Option(None, "--sim-requests", help="most requests per candidate's slice simulation [2500]; the plan's full-scale run takes what its rate and seats need (2,000 to 100,000)"),
        expert_skew: Optional[str] = typer.Option(None, "--expert-skew", help="uniform | zipf[:S] | histogram:FILE.json [zipf:0.63]"),
        price_input: Optional[float] = typer.Option(None, "--price-input", help=f"$ per million uncached input tokens [{DEFAULT_PRICE_INPUT:g}: DeepSeek list price]"),
        price_cached: Optional[float] = typer.Option(None, "--price-cached", help=f"$ per million cached input tokens [{DEFAULT_PRICE_CACHED_INPUT:g}]"),
        price_output: Optional[float] = typer.Option(None, "--price-output", help=f"$ per million output tokens [{DEFAULT_PRICE_OUTPUT:g}]"),
        gpu_hour: Optional[float] = typer.Option(None, "--gpu-hour", help="$ per GPU-hour [the hardware catalog's TCO estimate]"),
        workers: int = typer.Option(0, "--workers", help="worker processes [all CPUs]"),
        ray: Optional[str] = typer.Option(None, "--ray", help="run the sweep on a Ray cluster at ADDRESS (e.g. auto, ray://host:10001) [off: --workers]"),
        seed: Optional[int] = typer.Option(None, "--seed", help="random seed [0]"),
        config: Optional[str] = typer.Option(None, "--config", help="PlanRequest YAML/JSON (flags override it)"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the recommended plan (YAML; .json for JSON)"),
        as_json: bool = typer.Option(False, "--json", help="print the whole report as JSON"),
    ) -> None:
        """Search deployments for a GPU budget: Pareto frontier, recommended plan, cost, and why it won."""
        from planner.parallel import default_workers
        from planner.search import plan_deployment

        req = build_request(config, model=model, hardware=hardware, calibration=calibration, gpus=gpus, workload=workload,
                            trace=trace, trace_format=trace_format, slo=slo,
                            modes=modes, simulate=simulate, sim_requests=sim_requests,
                            expert_skew=expert_skew, price_input=price_input, price_cached=price_cached,
                            price_output=price_output, gpu_hour=gpu_hour, seed=seed)
        cpus = default_workers()
        if not 0 <= workers <= cpus:
            # each worker is a process holding the cost model: more than the CPUs here only queues them (and an
            # unbounded count spawns processes without end)
            raise TwinferError(f"--workers {workers}: must be 0..{cpus}, the CPUs this process may use (0: all of them)")
        from ui.user_errors import check_out_path
        check_out_path(out, "--out")   # before the search, not after it (the plan was lost at the write)
        con = Console(stderr=as_json, width=min(shutil.get_terminal_size((100, 40)).columns, 120))
        if not as_json:
            con.print(f"[dim]planning {req.model} on {req.gpus} x {req.hardware} ...[/]", highlight=False)
        rep = plan_with_progress(plan_deployment, req, workers or default_workers(), ray, as_json)
        if out is not None and rep.recommended is not None:
            if out.suffix == ".json":
                out.write_text(rep.recommended.model_dump_json(indent=1, exclude_none=True), encoding="utf-8")
            else:
                rep.recommended.save(out)
        if as_json:
            print(rep.model_dump_json(indent=1))
        else:
            print_report(con, rep, out if rep.recommended is not None else None)
        if rep.status != "ok":
            raise typer.Exit(1)
