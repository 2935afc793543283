"""``twinfer tune``: search scheduler policies in simulation on a measured profile; optionally run the
baseline and the winner on the real executor and set the measured gain next to the predicted one."""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from twinfer.errors import TwinferError


def register(app: typer.Typer) -> None:
    """Add ``tune`` to the CLI."""
    app.command("tune", help="Search policies in simulation. --gpus N (catalog model on --hardware): EP width, async overlap "
                             "and sliding-window replay with max batch and chunk, explained, written as a plan; --calibration "
                             "FILE prices its steps and replay with a measured calibration profile. --profile FILE: "
                             "max batch, token budget, chunk size and async overlap (MTP draft length predicted only) on a measured profile; "
                             "--measure runs baseline and winner on the executor.")(tune)


def tune_slo(text: Optional[str]) -> Optional[float]:
    """The TPOT p50 bound the policy search takes, from the one SLO syntax (other targets refused, not ignored)."""
    from planner.slo import parse_slo

    if text is None:
        return None
    spec = parse_slo(text, "--slo", required=("tpot",))
    if spec.percentile != 50 or spec.ttft_s is not None or spec.e2e_s is not None:
        raise TwinferError(f"--slo {text!r}: tune bounds TPOT at p50 only; give tpot_p50=<value><unit>, e.g. tpot_p50=50ms")
    return spec.tpot_s


CPU_TUNE_REQUESTS = 32   # --measure on the CPU: requests searched and replayed unless --requests (run: 8)
MIN_LOAD = 1e-3   # --load: a thousandth of the baseline's capacity (below, arrivals are spread over ~weeks of simulated time)

# each mode's own flags (parameter name -> flag): given to the other mode they would be ignored, so they are refused
PROFILE_FLAGS = {"num_layers": "--num-layers", "trace": "--trace", "requests": "--requests", "objective": "--objective",
                 "max_num_seqs": "--max-num-seqs", "max_batched_tokens": "--max-batched-tokens",
                 "max_seqs_limit": "--max-seqs-limit", "max_model_len": "--max-model-len", "max_input_len": "--max-input-len",
                 "max_output_len": "--max-output-len", "num_kv_blocks": "--num-kv-blocks", "device": "--device", "dtype": "--dtype"}
CATALOG_FLAGS = {"gpus": "--gpus", "hardware": "--hardware", "ep_widths": "--ep-widths", "async_values": "--async",
                 "replay_tokens": "--replay-tokens", "replay_layers": "--replay-layers", "batch_per_rank": "--batch-per-rank",
                 "chunk_tokens": "--chunk-tokens", "base_ep_width": "--base-ep-width", "base_async": "--base-async",
                 "base_replay_tokens": "--base-replay-tokens", "base_batch_per_rank": "--base-batch-per-rank",
                 "base_chunk_tokens": "--base-chunk-tokens", "rate_per_gpu": "--rate-per-gpu",
                 "sim_requests": "--sim-requests", "plan_requests": "--plan-requests", "rounds": "--rounds"}


def check_flags(ctx: typer.Context, profile_mode: bool, objective: str, load: Optional[float],
                rate_per_gpu: Optional[float]) -> None:
    """Refuse, naming the flag, what the search cannot take: an unknown objective, a rate of 0 (nothing would arrive),
    and a flag of the other mode (it would be ignored: --objective with --gpus ranked by throughput all the same)."""
    from planner.tune import OBJECTIVES
    from planner.tune_policies import check_rate_per_gpu

    if objective not in OBJECTIVES:
        raise TwinferError(f"--objective {objective!r}: allowed: {', '.join(OBJECTIVES)}")
    for flag, value in (("--load", load), ("--rate-per-gpu", rate_per_gpu)):
        if value is not None and value <= 0:
            raise TwinferError(f"{flag} {value:g}: must be > 0 (no request would arrive)")
    if load is not None and not (math.isfinite(load) and load >= MIN_LOAD):
        raise TwinferError(f"--load {load:g}: allowed: a finite multiple of the baseline's capacity, at least {MIN_LOAD:g}")
    if rate_per_gpu is not None:
        check_rate_per_gpu(rate_per_gpu, f"--rate-per-gpu {rate_per_gpu:g}")
    other, mode = (CATALOG_FLAGS, "only without --profile") if profile_mode else (PROFILE_FLAGS, "only with --profile")
    for name, flag in other.items():
        source = ctx.get_parameter_source(name)   # typer's own click: its ParameterSource, compared by name
        if source is not None and source.name != "DEFAULT":
            what = f"{flag} {objective}" if name == "objective" else flag
            raise TwinferError(f"{what}: {mode} (" + ("the --gpus search ranks policies by output throughput per GPU on "
                               "--workload" if not profile_mode else "the --profile search tunes one measured GPU") + ")")


def catalog_calibration(path: Path, model: str, hardware: str) -> list[str]:
    """Check ``--calibration`` before the search (the loader ``simulate --calibration`` runs,
    ``calibration_source.profile_for``; its replay grid through ``replay_grid.for_profile``) and say what of it applies:
    the efficiencies and op tables always, the replay grid only where it was measured on ``model``."""
    from costmodels.calibration_source import profile_for
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.replay_grid import GridError, for_profile

    hw, spec = get_hardware(hardware), get_model(model)
    try:
        cal = profile_for(hw, path)
    except TwinferError as e:   # every candidate's simulation would fail on it: refuse it once, naming the flag
        raise TwinferError(f"--calibration: {e}") from None
    try:
        grid = for_profile(cal)
    except GridError as e:
        raise TwinferError(f"--calibration: {path}: replay_grid: {e}") from None
    lines = [cal.notes[0]]   # "efficiencies from calibration profile <path> (measured on <GPU>, <date>)..."
    if grid is None:
        lines.append(f"replay: {path} has no replay grid: priced analytically")
    elif grid.matches(spec):
        lines.append(f"replay: priced from the replay grid in {path} (measured on {spec.name})")
    else:
        on = (grid.model or {}).get("name") or grid.layers
        lines.append(f"replay: the replay grid in {path} does not apply (measured on {on}, not on {spec.name}): priced "
                     "analytically; the profile's efficiencies and op tables still apply")
    return lines


def profile_model(ctx: typer.Context, profile: Path, prof, model: str, num_layers: Optional[int]) -> tuple[str, int]:
    """The model and layer count a ``--profile`` search predicts on, and ``--measure`` runs: the profile's own (a
    measured step model prices that model only), ``--num-layers`` at most the model's. A different ``--model`` is
    refused: the plan was written as ``model: tiny`` and ``--measure`` ran tiny against a deepseek-v3 prediction."""
    from costmodels.catalog import get_model

    measured = prof.step.model
    source = ctx.get_parameter_source("model")
    if source is not None and source.name != "DEFAULT" and model != measured and get_model(model).name != measured:
        raise TwinferError(f"--model {model}: {profile} measured {measured}; tune --profile predicts on the profile's "
                           f"model (leave --model out, or give --model {measured})")
    layers = get_model(measured).num_layers
    if num_layers is not None and num_layers > layers:
        raise TwinferError(f"--num-layers {num_layers}: {measured} has {layers} layers (give 1..{layers})")
    if num_layers is None and prof.step.num_layers > layers:
        raise TwinferError(f"{profile}: the profile's step.num_layers {prof.step.num_layers}: {measured} has {layers} "
                           f"layers (give 1..{layers})")
    return measured, num_layers or prof.step.num_layers


def tune(
    ctx: typer.Context,
    model: str = typer.Option("deepseek-v3", "--model", "-m", help="catalog model (--gpus) [deepseek-v3, as plan and simulate: at least "
                              "4 x gb300 or 8 x h200]; with --profile: the model it measured, the default (the one tune "
                              "predicts on and --measure runs)"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", min=1, help="with --profile: layers of the model priced "
                                             "and run, at most the model's [the profile's]"),
    profile: Optional[Path] = typer.Option(None, "--profile", "-p", help="calibration profile JSON (twinfer calibrate): tune on "
                                            "the measured executor model (one GPU; EP width not searched)"),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="with --gpus: calibration profile JSON (twinfer "
                                                "calibrate) whose efficiencies, op tables and replay grid (if measured on "
                                                "--model) price every candidate, as simulate --calibration [defaults]"),
    hardware: str = typer.Option("gb300", "--hardware", "--hw", help="GPU catalog name (catalog mode, with --gpus)"),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-g", min=1, max=100_000, help="GPU budget: tune EP width, async overlap "
                                       "and replay on the catalog --model (no --profile)"),
    ep_widths: Optional[str] = typer.Option(None, "--ep-widths", help="EP widths to try, e.g. 1,2,4,8 [1, 2, 4, ... 64 and 72 up to --gpus, and --gpus itself]"),
    async_values: str = typer.Option("off,on", "--async", help="async overlap values to try: off, on or off,on"),
    replay_tokens: Optional[str] = typer.Option(None, "--replay-tokens", help="replay lengths W to try, e.g. 0,64,128 [0, half "
                                                "the sliding window, the window]"),
    replay_layers: Optional[str] = typer.Option(None, "--replay-layers", help="which window layers replay W: all and/or layer "
                                                "kinds (sliding, csa, hca, sparse), e.g. all,csa [all, plus each window kind]"),
    batch_per_rank: str = typer.Option("32,64,128", "--batch-per-rank", help="max batch per attention-DP rank values to try (each 1..65,536)"),
    chunk_tokens: str = typer.Option("2048,8192", "--chunk-tokens", help="prefill chunk per rank values to try (each 1..4,194,304)"),
    base_ep_width: Optional[int] = typer.Option(None, "--base-ep-width", help="baseline EP width [the narrowest that fits]"),
    base_async: Optional[bool] = typer.Option(None, "--base-async/--base-no-async", help="baseline async overlap [off]"),
    base_replay_tokens: Optional[int] = typer.Option(None, "--base-replay-tokens", min=0, help="baseline replay length W on "
                                                     "every window layer, 0: window KV kept [the model's shipped policy]"),
    base_batch_per_rank: Optional[int] = typer.Option(None, "--base-batch-per-rank", help="baseline max batch per rank [64]"),
    base_chunk_tokens: Optional[int] = typer.Option(None, "--base-chunk-tokens", help="baseline prefill chunk per rank [8192]"),
    rate_per_gpu: Optional[float] = typer.Option(None, "--rate-per-gpu", help="offered requests/s per GPU, 0.001 up "
                                                 "to (not including) 10,000 [each policy at its own capacity]"),
    sim_requests: int = typer.Option(1500, "--sim-requests", min=100, max=1_000_000, help="most requests per candidate simulation"),
    plan_requests: int = typer.Option(20000, "--plan-requests", min=100, max=1_000_000, help="most requests of the plan's full-scale run "
                                      "(an agentic plan needs ~15k to pass its session ramp-up at 80 req/s)"),
    rounds: int = typer.Option(2, "--rounds", min=1, max=10, help="coordinate-descent rounds at most"),
    trace: Optional[str] = typer.Option(None, "--trace", "-t", help="twinfer JSONL trace (default: the --workload preset)"),
    workload: str = typer.Option("chat", "--workload", "-w"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1),
    load: Optional[float] = typer.Option(None, "--load", min=0.0, help="arrival rate as a multiple of the baseline's predicted capacity, "
                                         "at least 0.001 [--profile: 2, past saturation; --gpus: none, each policy at its own capacity]"),
    objective: str = typer.Option("output_throughput", "--objective", help="with --profile: output_throughput | ttft_p50 | ttft_p90 | tpot_p50 | tpot_p90 | e2e_p50"),
    slo: Optional[str] = typer.Option(None, "--slo", help="candidates must keep TPOT p50 under it, in the SLO syntax: tpot_p50=50ms"),
    max_num_seqs: int = typer.Option(16, "--max-num-seqs", min=1, help="baseline max batch"),
    max_batched_tokens: int = typer.Option(2048, "--max-batched-tokens", min=1, help="baseline token budget"),
    max_seqs_limit: int = typer.Option(128, "--max-seqs-limit", min=1, help="largest max batch searched"),
    max_model_len: int = typer.Option(4096, "--max-model-len", min=16),
    max_input_len: Optional[int] = typer.Option(None, "--max-input-len", min=1),
    max_output_len: Optional[int] = typer.Option(None, "--max-output-len", min=1),
    num_kv_blocks: Optional[int] = typer.Option(None, "--num-kv-blocks", min=2),
    measure: bool = typer.Option(False, "--measure", help="run the baseline and the winner on the executor"),
    device: str = typer.Option("cpu", "--device"),
    dtype: Optional[str] = typer.Option(None, "--dtype"),
    seed: int = typer.Option(0, "--seed"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write the result as JSON"),
    plan_out: Optional[Path] = typer.Option(None, "--plan-out", help="write the winning policy as a plan file that "
                                            "`twinfer serve --plan FILE` runs (its `scheduler` section)"),
) -> None:
    """Tune policies: on a catalog model and GPU (--gpus), or on a measured profile (--profile)."""
    if profile is None and gpus is None:   # no mode chosen: say how to choose one before judging flags by a mode
        raise TwinferError("tune: give --gpus N (tune a catalog --model on --hardware in simulation) or --profile FILE "
                           "(tune on a measured executor profile)")
    check_flags(ctx, profile is not None, objective, load, rate_per_gpu)
    from ui.user_errors import check_out_path
    check_out_path(out, "--out")   # before the search, not after it
    check_out_path(plan_out, "--plan-out")
    if profile is not None and calibration is not None:
        raise TwinferError("--calibration and --profile: give one of them (--calibration prices the --gpus search; "
                           "--profile tunes on the measured executor profile, which is already its calibration)")
    if profile is None:
        if measure:
            raise TwinferError("--measure runs the executor: it needs --profile (the measured model it replays)")
        from ui.tune_catalog import bool_list, int_list, layers_list, run_catalog_tune
        from planner.tune_policies import MAX_BATCH_PER_RANK, MAX_CHUNK_TOKENS
        space = {"ep_widths": int_list(ep_widths, "--ep-widths", 1) if ep_widths else None,
                 "async_overlap": bool_list(async_values, "--async"),
                 "replay_tokens": int_list(replay_tokens, "--replay-tokens", 0, 1 << 20) if replay_tokens else None,
                 "replay_layers": layers_list(replay_layers, "--replay-layers") if replay_layers else None,
                 "batch_per_rank": int_list(batch_per_rank, "--batch-per-rank", 1, MAX_BATCH_PER_RANK),
                 "chunk_tokens": int_list(chunk_tokens, "--chunk-tokens", 1, MAX_CHUNK_TOKENS)}
        base = {"ep_width": base_ep_width, "async_overlap": base_async, "replay_tokens": base_replay_tokens,
                "batch_per_rank": base_batch_per_rank, "chunk_tokens": base_chunk_tokens}
        notes = catalog_calibration(calibration, model, hardware) if calibration is not None else []
        run_catalog_tune(model=model, hardware=hardware, gpus=gpus, workload=workload, load=load, rate_per_gpu=rate_per_gpu,
                         slo_tpot_s=tune_slo(slo), space_args=space, base_args=base, sim_requests=sim_requests,
                         plan_requests=plan_requests, rounds=rounds, seed=seed, out=out, plan_out=plan_out,
                         calibration=str(calibration.resolve()) if calibration is not None else None,
                         calibration_notes=notes)
        return
    from rich.console import Console
    from rich.table import Table

    from costmodels.calibration import CalibrationProfile
    from costmodels.profiled import ProfiledStepCost
    from planner.tune import default_grid, tune as search
    from scheduler.config import SchedulerConfig, token_budget_for
    from sim.validate import copy_requests, natural_rate, saturation_rps
    from twinfer.config import validate
    from ui.cmd_validate import load_requests, sim_config

    con = Console()
    load = 2.0 if load is None else load
    slo_tpot_s = tune_slo(slo)
    prof = CalibrationProfile.load(profile)
    if prof.step is None:
        raise TwinferError(f"{profile}: no measured step model in this profile (make one with twinfer calibrate)")
    model, num_layers = profile_model(ctx, profile, prof, model, num_layers)
    cost = ProfiledStepCost(prof, num_layers=num_layers)
    bs = 64
    base = validate(SchedulerConfig, dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=token_budget_for(max_num_seqs, max_batched_tokens),
                                          max_model_len=max_model_len, block_size=bs), "scheduler options")
    if measure and device == "cpu":
        requests, max_input_len, max_output_len, note = cpu_measure_sizes(requests, max_input_len, max_output_len)
        if note:
            con.print(f"[dim]{note}[/]", highlight=False)
    reqs = load_requests(trace, workload, requests, bs, seed, max_input_len, max_output_len, max_model_len)
    blocks = num_kv_blocks or max_seqs_limit * (-(-max_model_len // bs)) + 64
    engine = None
    if measure:   # built (and its --device/--dtype checked) before the search, not after it
        from executor.calibrate import build_engine
        engine = build_engine(model, num_layers, device, dtype or prof.step.dtype, max_seqs_limit, max_model_len,
                              num_kv_blocks=blocks, seed=seed)
        if device == "cuda":
            engine.warmup()
    sbase = sim_config(base, prof)
    cap = saturation_rps(cost, sbase, blocks, reqs)
    if not (np.isfinite(cap) and cap > 0):   # no capacity to scale the arrivals by (it gave 'nan req/s', '+nan%')
        raise TwinferError(f"the baseline (--max-num-seqs {base.max_num_seqs}, --max-batched-tokens "
                           f"{base.max_num_batched_tokens}) finished no request of the {len(reqs)} queued at once on "
                           f"{blocks:,} KV blocks of {bs} tokens: give more --num-kv-blocks, or shorter requests "
                           "(--max-input-len, --max-output-len)")
    r0 = natural_rate(reqs)
    scale = r0 / (load * cap) if np.isfinite(r0) else 1.0
    reqs = copy_requests(reqs, scale)
    grid = default_grid(base, max_seqs_limit, bool(cost.model.mtp_layers))
    res = search(cost, sbase, blocks, reqs, objective=objective, slo_tpot_s=slo_tpot_s, grid=grid, seed=seed)
    con.print(f"{len(res.candidates)} policies simulated on {len(reqs)} requests at {load:g} x the baseline's predicted capacity "
              f"({load * cap:.2f} req/s); objective {objective}")
    tab = Table(title="best policies (simulated)")
    tab.add_column("policy")
    unit = "tok/s" if objective == "output_throughput" else "s"
    for c in ("max_num_seqs", "max_batched_tokens", "chunk cap", "async", "draft", f"{objective} {unit}", "feasible"):
        tab.add_column(c, justify="right")
    ranked = sorted([c for c in res.candidates if c.objective is not None], key=lambda c: c.objective,
                    reverse=objective == "output_throughput")
    shown = [res.baseline] + ranked[:8]
    shown += [res.best] if all(c is not res.best for c in shown) else []   # infeasible ones may outrank the winner
    for c in shown:
        k = c.knobs
        role = ("baseline" if c is res.baseline else "winner" if c is res.best else
                "predicted only" if "predicted only" in (c.why or "") else "")
        tab.add_row(role, str(k["max_num_seqs"]), str(k["max_num_batched_tokens"]), str(k["long_prefill_threshold"] or "-"),
                    "on" if k["async_overlap"] else "off", str(k["draft_len"]), f"{c.objective:.4g}", "yes" if c.feasible else c.why)
    con.print(tab)
    if not res.best.feasible:   # tune keeps the baseline when nothing is feasible: say so, not a 'winner' and a gain
        con.print(f"[bold red]no policy simulated is feasible[/] (the baseline: {res.baseline.why}); the plan keeps the "
                  "baseline", highlight=False)
    con.print(f"baseline {res.baseline.knobs} -> winner {res.best.knobs}: predicted gain {res.predicted_gain * 100:+.1f}%", highlight=False)
    if res.best_predicted_only is not None:
        con.print(f"predicted only: {res.best_predicted_only.knobs} {res.predicted_only_gain * 100:+.1f}%", highlight=False)
    on_cpu = prof.measured_on.strip().lower() == "cpu"   # (its hardware basis is only the cost model's reference)
    con.print(f"EP width: not searched here (a one-{'CPU' if on_cpu else 'GPU'} measured profile runs EP1); it stays a "
              f"simulated recommendation: twinfer tune --model <catalog model> --hardware "
              f"{'<GPU>' if on_cpu else prof.step.hardware_basis} --gpus N", highlight=False)

    measured = None
    if engine is not None:
        measured = measure_gain(engine, reqs, base, res, objective, seed=seed, log=con)
    if plan_out is not None:
        from ui.tuned_policy import simulation_section
        sim = simulation_section(profile=str(profile), num_layers=cost.num_layers, workload=workload, trace=trace,
                                 requests=requests, seed=seed, max_input_len=max_input_len, max_output_len=max_output_len,
                                 max_model_len=max_model_len, num_kv_blocks=blocks, arrival_scale=scale,
                                 rate_rps=load * cap, load_x_capacity=load)
        written = write_policy_plan(plan_out, model, base, res, measured, str(profile), sim)
        con.print(f"plan for twinfer serve --plan: {written}  (twinfer simulate --plan {written} repeats the winner's "
                  "simulated figures)", highlight=False)
    if out is not None:
        doc = {"result": res.model_dump(), "measured": measured, "profile": str(profile), "provenance": prof.provenance,
               "load_x_capacity": load, "rate_rps": load * cap, "requests": len(reqs),
               "command": "twinfer " + " ".join(sys.argv[1:]), "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        doc["result"]["candidates"] = doc["result"]["candidates"][:400]
        Path(out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        con.print(f"result: {out}")


def cpu_measure_sizes(requests: int | None, max_input_len: int | None, max_output_len: int | None):
    """``tune --measure --device cpu``'s requests and length caps: what was given, else run's CPU-sized lengths and
    CPU_TUNE_REQUESTS (the executor replays them 6 times: chat's 1,000 requests of ~1.5k-token prompts and ~400-token
    outputs ran for hours on the CPU). Returns (requests, max input, max output, the note to print or None)."""
    if None not in (requests, max_input_len, max_output_len):
        return requests, max_input_len, max_output_len, None
    from ui.cmd_run import CPU_MAX_INPUT, CPU_MAX_OUTPUT
    requests = requests or CPU_TUNE_REQUESTS
    max_input_len, max_output_len = max_input_len or CPU_MAX_INPUT, max_output_len or CPU_MAX_OUTPUT
    return requests, max_input_len, max_output_len, (
        f"cpu-sized --measure: {requests} requests, prompts <= {max_input_len} and outputs <= {max_output_len} tokens "
        "(--requests/--max-input-len/--max-output-len to change)")


def measure_gain(engine, reqs, base, res, objective: str, *, seed: int = 0, warm: bool = True, log=None, rounds: int = 2) -> dict:
    """Replay the requests with the baseline and the winning policy on the engine; measured gain next to predicted.

    ``rounds`` > 1 alternates the policies (A B B A ...) so a slow drift of the device or host does not favour
    the one measured second; each policy's figures are the mean over its rounds (every round is kept)."""
    from rich.console import Console

    from executor.replay import fresh_engine, replay
    from planner.tune import MEASURABLE, gain
    from sim.validate import metric_values
    from ui.cmd_run import synth_prompt

    con = log or Console()
    bs = base.block_size
    vocab = engine.vocab_size
    items = [(r.arrival_time, r.request_id, synth_prompt(r.block_hashes, r.prompt_len, bs, vocab, r.request_id, seed), r.output_len)
             for r in reqs]
    cfgs = {name: base.model_copy(update={k: knobs[k] for k in MEASURABLE})
            for name, knobs in (("baseline", res.baseline.knobs), ("winner", res.best.knobs))}
    if warm:  # unmeasured passes: kernel specialisations of both policies' shapes
        for cfg in cfgs.values():
            replay(fresh_engine(engine, cfg), [(0.0,) + it[1:] for it in items], seed=seed)
    order = []
    for i in range(max(1, rounds)):
        order += ["baseline", "winner"] if i % 2 == 0 else ["winner", "baseline"]
    each: dict[str, list[dict]] = {"baseline": [], "winner": []}
    for name in order:
        r = replay(fresh_engine(engine, cfgs[name]), items, seed=seed)
        each[name].append(metric_values(r.metrics))
        con.print(f"measured {name} (round {len(each[name])}): {objective} {each[name][-1][objective]:.4g} (predicted "
                  f"{(res.baseline if name == 'baseline' else res.best).objective:.4g})", highlight=False)
    runs = {name: {k: (float(np.mean([v[k] for v in vals])) if all(v[k] is not None for v in vals) else None) for k in vals[0]}
            for name, vals in each.items()}
    mg = gain(objective, runs["baseline"][objective], runs["winner"][objective])
    con.print(f"gain: predicted {res.predicted_gain * 100:+.1f}%, measured {mg * 100:+.1f}% "
              f"({(res.predicted_gain - mg) * 100:+.1f} points; mean of {max(1, rounds)} alternating rounds)", highlight=False)
    return {"baseline": runs["baseline"], "winner": runs["winner"], "gain": mg, "predicted_gain": res.predicted_gain,
            "rounds": each, "order": order,
            "gain_error_points": (res.predicted_gain - mg) * 100, "warm_up_replays": warm}


def write_policy_plan(path: Path, model: str, base, res, measured: dict | None, profile: str, sim: dict | None = None) -> Path:
    """The winner's scheduler config (the policies the executor runs: max batch, token budget, chunk cap) as a
    YAML plan whose ``scheduler`` section ``twinfer serve --plan`` (LLMEngine ``plan_path``) loads; with ``sim``
    (``ui.tuned_policy.simulation_section``) also what ``twinfer simulate --plan`` needs to repeat the winner's figures
    (``tune.predicted``)."""
    import yaml

    from planner.tune import MEASURABLE

    knobs = {k: res.best.knobs[k] for k in MEASURABLE}
    sched = base.model_copy(update=knobs)
    doc = {
        "kind": "tuned-policy",
        "model": model,
        "scheduler": sched.model_dump(mode="json"),
        **({"simulation": sim} if sim is not None else {}),
        "tune": {"profile": profile, "objective": res.objective, "predicted": dict(res.best.metrics),
                 "baseline": res.baseline.knobs, "winner": res.best.knobs, "predicted_gain": res.predicted_gain,
                 "measured_gain": (measured or {}).get("gain"),
                 "predicted_only": res.best_predicted_only.knobs if res.best_predicted_only is not None else None,
                 "note": "MTP draft length is a predicted-only knob: the plan keeps the baseline's (async overlap is "
                         "measurable and the plan runs the winner's)",
                 "ep_width": "not searched on a one-GPU measured profile: EP width stays a simulated recommendation "
                             "(twinfer tune --model M --hardware HW --gpus N)"},
    }
    path = Path(path)
    path.write_text("# twinfer tune: the winning scheduler policy; run it with  twinfer serve --plan " + path.name + "\n"
                    + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path
