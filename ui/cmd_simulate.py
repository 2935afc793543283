"""``twinfer simulate``: serving metrics of a scenario in simulated time (the default one with no arguments)."""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path
from typing import Optional

import numpy as np
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from planner.slo import SLOSpec, parse_slo, slo_in_mapping
from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError
from ui.cmd_replay import policy_mapping
from ui.progress import done_requests, partial_metrics, watch
from ui.user_errors import check_arrival_flags, missing_field_hint
from ui.tuned_policy import is_tuned_policy


def _base_mapping(scenario: str | None) -> tuple[dict, str]:
    """The scenario mapping to start from: a file, a built-in name, or the default."""
    from sim.scenario import builtin_scenarios

    if scenario is None:
        scenario = "default"
    if Path(scenario).exists() or scenario.endswith((".yaml", ".yml", ".json")):   # read_mapping names a non-file
        from sim.scenario import resolve_relative_paths
        return resolve_relative_paths(read_mapping(scenario), Path(scenario).parent), scenario
    if scenario in builtin_scenarios():
        with resources.as_file(resources.files("sim").joinpath("data", f"{scenario}.yaml")) as p:
            return read_mapping(p), f"built-in scenario {scenario!r}"
    raise TwinferError(f"--scenario {scenario!r}: no such file, and not a built-in scenario (built-in: {', '.join(builtin_scenarios())})")


def _set(data: dict, path: str, value) -> None:
    """``data[a][b] = value`` for path 'a.b', creating mappings on the way."""
    *heads, last = path.split(".")
    node = data
    for h in heads:
        if not isinstance(node.get(h), dict):
            node[h] = {} if node.get(h) is None else node[h]
            if not isinstance(node[h], dict):
                raise TwinferError(f"{'.'.join(heads)}: expected a mapping to set {last!r} in, got {node[h]!r}")
        node = node[h]
    node[last] = value


def effective_scenario(scenario: str | None = None, *, concurrency: int | None = None, think_time_s: float | None = None,
                       **overrides):
    """The Scenario after applying command-line overrides (None means 'not given'). ``concurrency`` / ``think_time_s``
    (--concurrency, --think-time-s) make a generated workload of the file a closed loop before it is validated, as
    --rate sets its rate: a file's ``kind: closed`` may leave its user count to the flag."""
    from sim.scenario import Scenario
    from sim.workload import MAX_SECONDS, RATE_KINDS, closed_mapping

    if think_time_s is not None and not 0 <= think_time_s <= MAX_SECONDS:   # (NaN too) named by flag, not as the
        # distribution's field it becomes (workload.think_time_s.fixed.value)
        raise TwinferError(f"--think-time-s {think_time_s:g}: allowed: 0 to {MAX_SECONDS:g} seconds")

    data, source = _base_mapping(scenario)
    slo_in_mapping(data, source, percentile_key=None)  # 'slo: ttft_p90=2s,tpot_p90=50ms' in a scenario file
    check_arrival_flags({"--workload": overrides.get("workload"), "--trace": overrides.get("trace"),
                         "--trace-format": overrides.get("trace_format"), "--rate": overrides.get("rate"),
                         "--concurrency": concurrency, "--think-time-s": think_time_s},
                        _kind(data.get("workload")), "the scenario's workload")
    o = {k: v for k, v in overrides.items() if v is not None}
    given = dict(o)
    if "workload" in o:  # a preset replaces the workload; --rate/--requests/--duration still apply
        data["workload"] = {"preset": o.pop("workload")}
    if "trace" in o:
        data["workload"] = {"kind": "trace", "trace_path": o.pop("trace"), "trace_format": o.pop("trace_format", "jsonl")}
    o.pop("trace_format", None)
    if "model" in o and "dtype" not in o:  # the base's dtypes described its model: the new one's checkpoint sets them
        from sim.scenario import drop_layout_dtypes
        data = drop_layout_dtypes(data)
    trace = isinstance(data.get("workload"), dict) and data["workload"].get("kind") == "trace"
    paths = {
        "model": "model", "hardware": "hardware", "instances": "instances",
        "tp": "layout.tp", "dp": "layout.dp", "ep": "layout.ep", "dtype": "layout.weight_dtype",
        "rate": "workload.rate", "requests": "workload.max_requests" if trace else "workload.num_requests",
        "duration": "workload.duration_s",
        "max_num_seqs": "scheduler.max_num_seqs", "max_batched_tokens": "scheduler.max_num_batched_tokens",
        "async_overlap": "scheduler.async_overlap", "draft_len": "scheduler.draft_len", "replay": "scheduler.replay",
        "router": "router", "seed": "seed", "calibration": "calibration",
    }
    for key, value in o.items():
        _set(data, paths[key], value)
    named = dict(paths)   # the fields a flag set, for errors that name the flag
    wl = data.get("workload")
    if (concurrency is not None or think_time_s is not None) and isinstance(wl, dict) and "preset" not in wl \
            and wl.get("kind", "poisson") in RATE_KINDS + ("closed",):
        # a preset or another kind is made a closed loop after validation (_as_closed), which says what it refuses
        data["workload"] = closed_mapping(wl, concurrency, think_time_s)
        for key, value in (("concurrency", concurrency), ("think_time_s", think_time_s)):
            if value is not None:
                o[key] = value
                named[key] = f"workload.{key}"
    if given:  # say what changed, so the printed name/description do not describe another scenario
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in given.items())
        data["description"] = f"{data.get('description', '')} (modified: {flags})".strip()
    if overrides.get("requests") is not None and overrides.get("duration") is None and not trace:
        # --requests alone means "this many": drop a duration the base scenario may bound arrivals with
        if isinstance(data.get("workload"), dict):
            data["workload"].pop("duration_s", None)
    try:
        return validate(Scenario, data, source)
    except TwinferError as e:   # name the flag the user typed next to the field it set
        msg = str(e)
        for key in o:
            msg = msg.replace(f": {named[key]}:", f": --{key.replace('_', '-')} ({named[key]}):")
        if "workload: " in msg:   # a file without a required field: the flag that gives it
            msg = missing_field_hint(msg, "workload.")
        if msg == str(e):
            raise
        raise TwinferError(msg) from None


def _kind(workload) -> str | None:
    """The kind of a scenario file's workload mapping (a preset's kind where it names one); None where unreadable."""
    if not isinstance(workload, dict):
        return None
    from sim.workload import PRESETS

    name = workload.get("preset")
    if "kind" not in workload and isinstance(name, str) and name in PRESETS:
        return PRESETS[name].kind
    kind = workload.get("kind", "poisson")
    return kind if isinstance(kind, str) else None


def simulate_tuned_policy(path: str, *, as_json: bool, given: dict) -> None:
    """``--plan`` on a tuned policy (``twinfer tune --profile ... --plan-out``): the winner's figures again, on tune's
    requests, profile and scheduler; no other option applies (the file fixes them all), only --json."""
    from ui.tuned_policy import FIGURES, resimulate

    extra = sorted(k for k, v in given.items() if v is not None)
    if extra:
        raise TwinferError(f"--plan {path}: a tuned policy fixes its requests, profile and scheduler; drop {', '.join(extra)} "
                           "(only --json applies)")
    got, said, notes = resimulate(path)
    same = bool(said) and all(said.get(k) == got.get(k) for k in FIGURES if k in said)
    if as_json:
        print(json.dumps({"plan": path, "kind": "tuned-policy", "metrics": got, "tune_predicted": said,
                          "same_as_tune": same, "notes": notes}, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    con = Console()
    tab = Table(title=f"tuned policy {path}: one simulation on the measured profile (tune's requests and scheduler)")
    tab.add_column("figure")
    tab.add_column("simulated", justify="right")
    tab.add_column("tune's figure (in the file)", justify="right")
    for k in FIGURES:
        v, t = got.get(k), said.get(k)
        fmt = (lambda x: f"{x:,.1f} tok/s") if k == "output_throughput" else (lambda x: f"{x:,.0f}") if k == "requests_finished" else \
            (lambda x: f"{x:.2f} s") if k == "duration_s" else (lambda x: f"{x * 1e3:.2f} ms")
        tab.add_row(k, "-" if v is None else fmt(v), "-" if t is None else fmt(t))
    con.print(tab)
    con.print("the same figures as tune's winner" if same else
              ("tune's figures were not written in this file" if not said else "differs from tune's figures (see notes)"),
              highlight=False)
    for n in notes:
        con.print(f"note: {n}", highlight=False)


def scenario_from_plan(path: str, *, scenario: str | None, requests: int | None, rate: float | None, seed: int | None, others: dict,
                       concurrency: int | None = None, think_time_s: float | None = None):
    """(the Scenario of a plan file's run, the Plan); only --requests, --rate and --seed adjust it here (--concurrency
    and --think-time-s make it a closed loop after, checked here against the plan's workload)."""
    from planner.plan import load_plan

    if scenario is not None:
        raise TwinferError("--plan and --scenario: give one of them (a plan already holds its scenario)")
    given = sorted(k for k, v in others.items() if v is not None)
    if given:
        raise TwinferError(f"--plan: the plan fixes the deployment; drop {', '.join('--' + k.replace('_', '-') for k in given)} "
                           "(only --requests, --rate, --seed, --concurrency, --think-time-s and --slo apply to a plan)")
    p = load_plan(path)
    check_arrival_flags({"--rate": rate, "--concurrency": concurrency, "--think-time-s": think_time_s}, p.workload.kind,
                        "the plan's workload")
    sc = p.to_scenario(num_requests=requests)
    upd: dict = {}
    if rate is not None:   # the deployment's rate; a run of part of it takes that part's share
        upd["workload"] = sc.workload.model_copy(update={"rate": rate * p.run_fraction})
    if seed is not None:
        upd["seed"] = seed
    return (sc.model_copy(update=upd) if upd else sc), p


def plan_comparison(p, res, changed: list[str] = ()) -> str:
    """One line setting a `--plan` run beside the plan ``p``'s own prediction: the same run (same digest), or why not
    (``changed``: the flags given that change the plan's run)."""
    pr, pct = p.predicted, p.slo_percentile
    said = (f"{pr.output_tokens_per_s_per_gpu:,.0f} output tok/s/GPU, TTFT p{pct} {pr.ttft_s:.2f} s, "
            f"TPOT p{pct} {pr.tpot_s * 1e3:.1f} ms")
    if pr.source != "simulation" or not pr.sim_digest:
        return f"the plan's figures ({said}) are the analytic screen's, not a simulation: expect these to differ"
    whole = ""
    w = res.metrics.steady or res.metrics.whole_run
    if p.run_share is not None and w is not None:   # the run covers part of the plan: its figure per GPU of the whole
        whole = (f"; per GPU of the whole plan this run gives {p.per_gpu(w.output_throughput):,.0f} "
                 f"output tok/s (its {w.output_throughput:,.0f} tok/s / {p.run_fraction:.4g} / {p.gpus_used:,} GPUs)")
    if res.digest == pr.sim_digest:
        return (f"the plan's own run (digest {res.digest[:16]} = the plan's): the plan predicted {said}, the steady window "
                f"above{whole}")
    why = (f"{'/'.join(changed)} changed it" if changed else
           "no flag changed it: the plan file or the simulator changed since the plan was made")
    return (f"not the plan's run ({why}; digest {res.digest[:16]}, the plan's {pr.sim_digest[:16]}): "
            f"the plan predicted {said} on {pr.simulated_requests or 0:,} requests{whole}")


def _workload_yaml(wl) -> dict:
    """The workload's fields that differ from their defaults (kind always), nested models in full."""
    from pydantic import BaseModel

    out = {}
    full = wl.model_dump(mode="json", exclude_none=True)
    for name, field in type(wl).model_fields.items():
        if name not in full:
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json", exclude_none=True)
        if name == "kind" or full[name] != default:
            out[name] = full[name]
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f}"


def slo_spec(flag: str | None, plan: str | None, scenario: str | None, sc) -> SLOSpec | None:
    """The SLO the verdict uses: --slo, else the scenario's (its percentile where the file names one, else p90)."""
    if flag is not None:
        return parse_slo(flag, "--slo")
    if sc.slo is None:
        return None
    pct = 90
    if plan is not None:
        from planner.plan import load_plan

        pct = load_plan(plan).slo_percentile
    else:
        raw, source = _base_mapping(scenario)
        if isinstance(raw.get("slo"), str):
            return parse_slo(raw["slo"], f"{source}: slo")
    return SLOSpec(ttft_s=sc.slo.ttft_s, tpot_s=sc.slo.tpot_s, percentile=pct, e2e_s=sc.slo.e2e_s)


def print_partial(con: Console, requests: list, sc, spec: SLOSpec | None, wall_s: float) -> None:
    """What a run cut by Ctrl-C got through: counts and latencies of the requests finished so far."""
    done = [r for r in requests if r.finish_time is not None]
    con.print(f"[yellow]interrupted after {wall_s:.1f} s: {len(done):,} of {len(requests):,} requests finished; "
              "partial figures (no drain, not comparable to a full run):[/]", highlight=False)
    if not done:
        return
    m = partial_metrics(requests, sc.num_gpus, sc.slo)
    for name, st in (("TTFT", m.ttft_s), ("TPOT", m.tpot_s), ("E2E", m.e2e_s)):
        con.print(f"  {name} ms mean/p50/p90/p99: {_ms(st.mean)} / {_ms(st.p50)} / {_ms(st.p90)} / {_ms(st.p99)}", highlight=False)
    con.print(f"  output tokens/s per GPU {m.output_throughput_per_gpu:,.0f} over {m.duration_s:,.1f} simulated s", highlight=False)
    if spec is not None:
        con.print("  " + escape(spec.verdict(m)[1]), highlight=False)


def _as_closed(sc, concurrency: int | None, think_time_s: float | None, rate: float | None):
    """The scenario with its workload run as a closed loop (--concurrency / --think-time-s)."""
    from sim.workload import as_closed

    check_arrival_flags({"--rate": rate, "--concurrency": concurrency, "--think-time-s": think_time_s}, sc.workload.kind)
    wl = as_closed(sc.workload, concurrency, think_time_s)
    note = f"(closed loop: {wl.concurrency} users, think {wl.think_time_s.mean():g} s mean)"
    return sc.model_copy(update={"workload": wl, "description": f"{sc.description} {note}".strip()})


def _check_replay(sc, flag: str | None) -> None:
    """The replay policy in force, checked on the scenario's model before the run: ``ReplayPolicy.resolve``'s checks (a
    layer past the model or without a window; they were said only after 'simulating ...'), and a rule other than
    persist on a model with no window layers, which resolves to nothing (the library's meaning, costmodels/replay.py:
    nothing to govern) and so ran byte-identical to no policy, exit 0. Names --replay where the flag set the policy,
    else the scenario's field."""
    from costmodels.catalog import get_model
    from costmodels.replay import window_layers

    model, s = get_model(sc.model), sc.scheduler
    where = f"--replay {flag!r}" if flag is not None else "scheduler.replay"
    try:
        s.replay_for(model)
    except TwinferError as err:
        if flag is None:
            raise
        raise TwinferError(f"{where}: {err}") from None
    if window_layers(model):
        return
    pol, rules = s.replay, []
    if pol is not None:
        for name, r in (("default", pol.default), *((f"kinds.{k}", r) for k, r in sorted(pol.kinds.items()))):
            if r.mode != "persist":
                rules.append(f"{name} {r.mode}" + (f":{r.tokens or pol.tokens}" if r.mode == "replay" else ""))
    elif s.swa_replay_tokens:
        where, rules = "scheduler.swa_replay_tokens", [f"replay:{s.swa_replay_tokens}"]
    if rules:
        raise TwinferError(f"{where}: {', '.join(rules)} on {model.name}, which has no sliding-window layers: nothing is "
                           "kept or recomputed on resume, so only persist applies")


def _offered(wl: dict, metrics=None) -> str:
    """The offered arrival rate of an open-loop workload (what `twinfer plan` says its plan is sized for): a generated
    one's rate, a trace's requests over their arrival span (``sim.workload.offered_rate``); none for a closed loop.
    An agentic workload's turns arrive as its sessions think and answer, not at its ``rate`` (the turn rate once
    sessions overlap: a run of a few hundred turns offered half of it): the run's own requests over their arrival span
    (``metrics``' whole run, as a trace's: one less than the requests over first to last arrival), its sessions' start
    rate and the workload's rate beside it, each named."""
    from sim.workload import WorkloadSpec, offered_rate

    kind = wl.get("kind")
    if kind == "closed":
        return ""
    if kind == "agentic":
        spec = WorkloadSpec.model_validate(wl)
        sessions = f"sessions start at {_rate(spec.rate / max(spec.turns.mean(), 1.0))}/s, workload rate {_rate(spec.rate)} req/s"
        w = getattr(metrics, "whole_run", None)
        span = (w.arrivals_to_s - w.arrivals_from_s) if w is not None else 0.0
        if w is None or w.requests_arrived < 2 or not span > 0:
            return f" (agentic: {sessions})"
        return f" offered at {_rate((w.requests_arrived - 1) / span)} req/s (first to last arrival; agentic: {sessions})"
    r = offered_rate(WorkloadSpec.model_validate(wl)) if kind == "trace" else wl.get("rate")
    if not r:
        return ""
    return f" offered at {_rate(r)} req/s"


def _rate(r: float) -> str:
    return f"{r:,.1f}" if r >= 0.1 else f"{r:.2g}"  # 0.01 is not "0.0"


def _print_result(con: Console, res, wall_s: float, spec: SLOSpec | None = None, plan: str | None = None) -> None:
    m = res.metrics
    sc = res.scenario
    lay = sc["layout"]
    pools, kv_per = f"{sc['instances']} x {_layout_label(lay)}", "instance"
    if sc.get("disagg"):  # the scenario's layout is the decode pool's; the KV figure (res.kv) is a decode instance's
        pre = sc["disagg"]["prefill_layout"]
        pdt = f" {pre['weight_dtype']}" if pre["weight_dtype"] != lay["weight_dtype"] else ""
        pools = f"prefill {sc['disagg']['prefill_instances']} x {_layout_label(pre)}{pdt} + decode {pools}"
        kv_per = "decode instance"
    mirror = int((sc.get("effects") or {}).get("mirror", 1) or 1)
    if mirror > 1:   # a slice of a wide attention-DP instance stands for all of it (sim.effects.EffectsSpec.mirror)
        pools += f"; 1/{mirror} of its DP ranks simulated, on the GPUs counted here (effects.mirror {mirror})"
        kv_per = "simulated slice"
    con.print(f"[bold]{escape(res.name)}[/]: {escape(res.description or '(no description)')}", highlight=False)
    con.print(
        f"{_label(sc['model'])} {lay['weight_dtype']} on {res.num_gpus}x{_hw_name(sc['hardware'])} ({pools}), "
        f"{res.num_requests:,} requests{_offered(sc['workload'], m)}, seed {res.seed}; KV {res.kv.capacity_tokens:,} tokens per {kv_per} "
        f"({res.kv.num_blocks:,} whole blocks of {res.kv.block_size})",
        style="dim", highlight=False,
    )
    wl = sc["workload"]
    if wl["kind"] == "closed" and m.e2e_s.mean is not None:  # the load is the user count; Little's law gives what it kept in flight
        con.print(f"closed loop: {wl['concurrency']:,} users; mean requests in flight {m.request_throughput * m.e2e_s.mean:,.1f} "
                  "(requests/s x mean E2E)", style="dim", highlight=False)
    lat = Table(title=f"latency (ms) over {m.requests_finished:,} finished requests (whole run)", title_justify="left")
    for c in ("", "mean", "p50", "p90", "p99"):
        lat.add_column(c, justify="left" if not c else "right")
    for name, st in (("TTFT", m.ttft_s), ("TPOT", m.tpot_s), ("ITL", m.itl_s), ("E2E", m.e2e_s)):
        lat.add_row(name, _ms(st.mean), _ms(st.p50), _ms(st.p90), _ms(st.p99))
    con.print(lat)
    thr = _figures_table("throughput and load (whole run: first arrival to last finish)")
    thr.add_row("output tokens/s (per GPU)", f"{m.output_throughput:,.0f} ({m.output_throughput_per_gpu:,.0f})")
    thr.add_row("total tokens/s (per GPU)", f"{m.total_throughput:,.0f} ({m.total_throughput_per_gpu:,.0f})")
    if m.per_user_output_tps_mean is not None:
        thr.add_row("tokens/s per user (mean, p50)", f"{m.per_user_output_tps_mean:,.1f}, {m.per_user_output_tps_p50:,.1f}")
    thr.add_row("requests/s", f"{m.request_throughput:,.2f}")
    if m.goodput is not None and m.slo is not None:
        thr.add_row(f"goodput (TTFT<={m.slo.ttft_s:g}s, TPOT<={m.slo.tpot_s * 1e3:g}ms)",
                    f"{m.goodput:,.2f} req/s ({100 * (m.goodput_fraction or 0):.1f}% of requests)")
    if spec is not None:
        ok, _ = spec.verdict(m)   # judged on the steady window where the run has one, as twinfer plan judges
        where = ", steady window" if m.steady is not None else ""
        thr.add_row(f"meets the SLO ({escape(spec.text())}{where})", "yes" if ok else "[red]no[/]")
    price, whose = _price(sc["hardware"], plan)
    if price and m.output_throughput > 0:
        thr.add_row("$ per million output tokens",
                    f"{_usd_per_million(price, res.num_gpus, m.output_throughput):,.3f} (at ${price:.2f}/GPU-hour{whose})")
    thr.add_row("requests finished / dropped / unfinished", f"{m.requests_finished:,} / {m.requests_dropped:,} / {m.requests_unfinished:,}")
    if m.prefix_cache_hit_rate is not None:
        thr.add_row("prefix-cache hit rate", f"{100 * m.prefix_cache_hit_rate:.1f}%")
    if m.kv_util_mean is not None:
        thr.add_row("KV use (mean while busy, max)", f"{100 * m.kv_util_mean:.1f}%, {100 * (m.kv_util_max or 0):.1f}%")
    thr.add_row("preemptions", f"{m.preemptions:,}")
    if m.mean_batch_requests is not None:
        thr.add_row("mean batch (requests, tokens)", f"{m.mean_batch_requests:,.1f}, {m.mean_batch_tokens:,.0f}")
    thr.add_row("simulated time (steps, plans)", f"{m.duration_s:,.1f} s ({m.num_steps:,}, {m.num_plans:,})")
    con.print(thr)
    if m.steady is not None:
        con.print(steady_table(m.steady, price, res.num_gpus))
    for reason, n in m.dropped_by_reason.items():
        con.print(f"[yellow]dropped {n}:[/] {escape(reason)}", highlight=False)
    con.print(f"[dim]digest {res.digest[:16]}, simulated in {wall_s:.2f} s wall[/]", highlight=False)


# the steady window's last third holds fewer than this share of its first third's decoding requests: the run's arrivals
# ended and the batch emptied inside the window (`simulate -n 200` of the default: 79 -> 40 requests; 2,000: 116 -> 150,
# 5,000: 128 -> 129; past saturation with 2,000 the queue keeps it at 255 -> 253)
DRAIN_SHARE = 0.6


def output_cut_note(requests, asked) -> str | None:
    """A note when requests asked for more output than the context window leaves after their prompt: the scheduler
    stops each at the window (as vLLM and SGLang do, finish reason "length"), so they produce fewer tokens than
    asked. None when none was cut."""
    cut = [(a, r) for a, r in zip(asked, requests) if r.output_len < a and r.drop_reason is None]
    if not cut:
        return None
    got = sum(r.output_len for _, r in cut)
    want = sum(a for a, _ in cut)
    return (f"{len(cut):,} request(s) asked for more output than the context window leaves after the prompt: each "
            f"stops at the window (finish reason 'length', as vLLM and SGLang stop it), {got:,} of the {want:,} output "
            "tokens they asked for; the figures above are of the tokens produced")


def steady_drain_note(requests, window) -> str | None:
    """A note when the steady window's throughput is a draining system's: the requests decoding in its last third
    (first token <= t < finish, mean over the third) fall below ``DRAIN_SHARE`` of those in its first third. None
    when they do not, or without a window."""
    if window is None or window.end_s <= window.start_s:
        return None
    done = [r for r in requests if r.finish_time is not None and r.first_token_time is not None]
    if len(done) < 2:
        return None
    first = np.sort(np.array([r.first_token_time for r in done], float))
    finish = np.sort(np.array([r.finish_time for r in done], float))
    ts = np.linspace(window.start_s, window.end_s, 301)
    decoding = np.searchsorted(first, ts, "right") - np.searchsorted(finish, ts, "right")
    a, b = float(decoding[:100].mean()), float(decoding[-100:].mean())
    if a <= 0 or b >= DRAIN_SHARE * a:
        return None
    return (f"the steady window is not steady: {a:,.0f} requests decoding in its first third, {b:,.0f} in its last (the "
            "arrivals ended and the batch drained inside it), so its throughput reads low; more requests (-n) give a "
            "steady window")


def no_steady_note(requests, steady_after_s: float | None, window) -> str | None:
    """A note when the scenario set ``steady_after_s`` and the run has no steady window for it: the ramp-up it names
    ends at or after the run's last arrival (or last finish), so every figure, the SLO verdict too, is the whole
    run's. None otherwise."""
    if steady_after_s is None or window is not None:
        return None
    arrivals = [r.arrival_time for r in requests]
    last = max(arrivals) if arrivals else 0.0
    return (f"steady_after_s {steady_after_s:g} s: no steady window (the run's last request arrived at {last:,.1f} s): "
            f"every figure above, and the SLO verdict, is the whole run's; set steady_after_s below {last:,.1f} s or "
            "run more requests")


def _layout_label(lay: dict) -> str:
    """'TP1 DP8 EP8' for a scenario's layout mapping (DP, EP and PP only when > 1: the GPUs of the header add up)."""
    return (f"TP{lay['tp']}" + (f" DP{lay['dp']}" if lay["dp"] > 1 else "") + (f" EP{lay['ep']}" if lay["ep"] > 1 else "")
            + (f" PP{lay['pp']}" if lay.get("pp", 1) > 1 else ""))


def _figures_table(title: str) -> Table:
    """A headerless two-column table (label left, figure right) under ``title``."""
    t = Table(show_header=False, title=title, title_justify="left")
    t.add_column(justify="left")
    t.add_column(justify="right")
    return t


def steady_table(w, price: float | None, gpus: int) -> Table:
    """The steady window's figures (the ones ``twinfer plan`` predicts), its definition in the title."""
    t = _figures_table(f"steady window: {w.definition.removeprefix('steady: ')} ({w.requests_arrived:,} requests)")
    t.add_row("output tokens/s (per GPU)", f"{w.output_throughput:,.0f} ({w.output_throughput_per_gpu:,.0f})")
    t.add_row("TTFT p50 / p90 (ms)", f"{_ms(w.ttft_s.p50)} / {_ms(w.ttft_s.p90)}")
    t.add_row("TPOT p50 / p90 (ms)", f"{_ms(w.tpot_s.p50)} / {_ms(w.tpot_s.p90)}")
    if w.per_user_output_tps_mean is not None:
        t.add_row("tokens/s per user (mean)", f"{w.per_user_output_tps_mean:,.1f}")
    t.add_row("requests/s finishing", f"{w.request_throughput:,.2f}")
    if w.goodput_fraction is not None:
        t.add_row("goodput (% of the window's requests)", f"{100 * w.goodput_fraction:.1f}%")
    if price and w.output_throughput > 0:
        t.add_row("$ per million output tokens", f"{_usd_per_million(price, gpus, w.output_throughput):,.3f}")
    t.add_row("window (s)", f"arrivals {w.arrivals_from_s:,.1f}-{w.arrivals_to_s:,.1f}, output {w.start_s:,.1f}-{w.end_s:,.1f}")
    return t


def _hw_name(hardware: str) -> str:
    """The GPU's name (a hardware file's ``name``, not its path)."""
    from costmodels.hardware import get_hardware

    return get_hardware(hardware).name


def _label(model: str) -> str:
    """A model file's folder or file stem (the name its ModelSpec carries), a catalog name as it is."""
    from costmodels.catalog import get_model

    return get_model(model).name


def get_hardware_measured(hardware: str) -> bool:
    """Whether a (non-H200) hardware file brings its own measured block, so the output says where efficiencies come from."""
    from costmodels.hardware import get_hardware

    hw = get_hardware(hardware)
    return hw.measured is not None and hw.name.lower() != "h200"


def _usd_per_million(price_per_gpu_hour: float, gpus: int, output_tokens_per_s: float) -> float:
    """$ per million output tokens for ``gpus`` GPUs at ``price_per_gpu_hour`` producing ``output_tokens_per_s``."""
    return price_per_gpu_hour * gpus / (output_tokens_per_s * 3600) * 1e6


def _price(hardware: str, plan: str | None = None) -> tuple[float, str]:
    """$ per GPU-hour and whose: a plan file's own (``twinfer plan --gpu-hour``: its figures were priced at it), else the
    hardware catalog's."""
    if plan is not None:
        from planner.plan import load_plan

        econ = load_plan(plan).economics
        if econ is not None:
            return float(econ.price_per_gpu_hour), ", the plan's"
    from costmodels.hardware import get_hardware

    return float(get_hardware(hardware).price_per_gpu_hour or 0.0), ""


HINT = (
    "change it: --scenario my.yaml (start from `twinfer simulate --print-scenario > my.yaml`), or flags such as "
    "--rate 6 --requests 5000 --tp 8 --max-num-seqs 128 --draft-len 1 --no-async-overlap --workload reasoning "
    "(twinfer simulate --help lists them)"
)


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to the CLI."""

    @app.command("simulate")
    def simulate(
        scenario: Optional[str] = typer.Option(None, "--scenario", "-s", help="scenario YAML/JSON file or built-in name [default]"),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="model catalog name, HF config.json (or its folder) or ModelSpec YAML; layout dtypes then follow its checkpoint unless --dtype [the scenario's]"),
        hardware: Optional[str] = typer.Option(None, "--hardware", "--hw", help="GPU catalog name or hardware YAML (twinfer hardware --template) [the scenario's]"),
        calibration: Optional[str] = typer.Option(None, "--calibration", help="calibration profile JSON whose efficiencies replace the defaults (twinfer calibrate)"),
        instances: Optional[int] = typer.Option(None, "--instances", help="identical instances behind the router [the scenario's]"),
        tp: Optional[int] = typer.Option(None, "--tp", help="tensor parallel per instance [the scenario's]"),
        dp: Optional[int] = typer.Option(None, "--dp", help="attention data parallel per instance [the scenario's]"),
        ep: Optional[int] = typer.Option(None, "--ep", help="expert parallel per instance [the scenario's]"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="weight dtype bf16|fp8|fp4 [the scenario's]"),
        rate: Optional[float] = typer.Option(None, "--rate", "-r", help="arrivals per second [the scenario's]"),
        requests: Optional[int] = typer.Option(None, "--requests", "-n", help="number of requests (trace: first N) [the scenario's]"),
        duration: Optional[float] = typer.Option(None, "--duration", help="arrivals only before this many seconds [the scenario's]"),
        concurrency: Optional[int] = typer.Option(None, "--concurrency", help="run the workload as a closed loop of this many users, each sending its next request when its last one ends (kind: closed)"),
        think_time_s: Optional[float] = typer.Option(None, "--think-time-s", help="closed loop: seconds a user waits before its next request [0]"),
        workload: Optional[str] = typer.Option(None, "--workload", "-w", help="workload preset: chat, long-context, summarize, agentic, reasoning [the scenario's]"),
        trace: Optional[str] = typer.Option(None, "--trace", help="replay a trace file instead of a generated workload"),
        trace_format: Optional[str] = typer.Option(None, "--trace-format", help="mooncake | jsonl [jsonl]"),
        max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="most running requests per instance [the scenario's]"),
        max_batched_tokens: Optional[int] = typer.Option(None, "--max-batched-tokens", help="token budget per step [the scenario's]"),
        async_overlap: Optional[bool] = typer.Option(None, "--async-overlap/--no-async-overlap", help="hide host overhead under GPU time"),
        draft_len: Optional[int] = typer.Option(None, "--draft-len", help="MTP draft tokens per decode step [the scenario's]"),
        replay: Optional[str] = typer.Option(None, "--replay", help="sliding-window replay policy (twinfer replay --help): "
                                             "'{layers: {39: recompute}}' or persist | recompute | replay:W [the scenario's]"),
        router: Optional[str] = typer.Option(None, "--router", help="round_robin | least_outstanding | prefix_aware [the scenario's]"),
        seed: Optional[int] = typer.Option(None, "--seed", help="random seed [the scenario's]"),
        slo: Optional[str] = typer.Option(None, "--slo", help="latency targets for goodput and the 'meets the SLO' verdict, e.g. ttft_p90=2s,tpot_p90=50ms [the scenario's, at p90]"),
        as_json: bool = typer.Option(False, "--json", help="print the full result as JSON (nothing else on stdout)"),
        csv: Optional[Path] = typer.Option(None, "--csv", help="write the metrics as metric,value CSV"),
        perfetto: Optional[Path] = typer.Option(None, "--perfetto", help="write a Perfetto/Chrome trace of every plan"),
        print_scenario: bool = typer.Option(False, "--print-scenario", help="print the effective scenario as YAML and exit"),
        all_values: bool = typer.Option(False, "--all", help="with --print-scenario: every effective value, defaults included"),
        plan: Optional[str] = typer.Option(None, "--plan", help="simulate a `twinfer plan --out` plan file as the plan ran it (the whole deployment, or the part of it its run_share names; --requests, --rate, --seed still apply), or repeat a `twinfer tune --profile ... --plan-out` winner on tune's requests (only --json applies)"),
        error_band: Optional[str] = typer.Option(None, "--error-band", help="print the twin's error band next to the figures: a `twinfer validate` report JSON, or 'auto' (profiles/<hardware>/validation_*.json)"),
    ) -> None:
        """Serving metrics of a scenario in simulated time; with no options, the built-in default.

        Options marked [the scenario's] keep the scenario's value when left out (see them all: --print-scenario).
        """
        check_arrival_flags({"--workload": workload, "--trace": trace, "--trace-format": trace_format, "--rate": rate,
                             "--concurrency": concurrency, "--think-time-s": think_time_s})   # flag against flag
        if plan is not None and is_tuned_policy(plan):
            simulate_tuned_policy(plan, as_json=as_json, given={
                "--scenario": scenario, "--model": model, "--hardware": hardware, "--calibration": calibration,
                "--instances": instances, "--tp": tp, "--dp": dp, "--ep": ep, "--dtype": dtype, "--rate": rate,
                "--requests": requests, "--duration": duration, "--concurrency": concurrency, "--think-time-s": think_time_s,
                "--workload": workload, "--trace": trace, "--max-num-seqs": max_num_seqs,
                "--max-batched-tokens": max_batched_tokens, "--async-overlap": async_overlap, "--draft-len": draft_len,
                "--replay": replay, "--router": router, "--seed": seed, "--slo": slo, "--csv": csv, "--perfetto": perfetto,
                "--error-band": error_band, "--print-scenario": print_scenario or None, "--all": all_values or None})
            return
        the_plan = None
        if plan is not None:
            sc, the_plan = scenario_from_plan(plan, scenario=scenario, requests=requests, rate=rate, seed=seed, others=dict(
                model=model, hardware=hardware, instances=instances, tp=tp, dp=dp, ep=ep, dtype=dtype, duration=duration,
                workload=workload, trace=trace, max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens,
                async_overlap=async_overlap, draft_len=draft_len, router=router, calibration=calibration, replay=replay),
                concurrency=concurrency, think_time_s=think_time_s)
        else:
            sc = effective_scenario(
                scenario, model=model, hardware=hardware, instances=instances, tp=tp, dp=dp, ep=ep, dtype=dtype,
                rate=rate, requests=requests, duration=duration, workload=workload, trace=trace, trace_format=trace_format,
                max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens, async_overlap=async_overlap,
                draft_len=draft_len, router=router, seed=seed, calibration=calibration,
                replay=policy_mapping(replay, "--replay"), concurrency=concurrency, think_time_s=think_time_s,
            )
        if concurrency is not None or think_time_s is not None:
            if the_plan is not None and concurrency is not None:   # the deployment's users; a run of part of it, its share
                concurrency = the_plan.run_users(concurrency)
            sc = _as_closed(sc, concurrency, think_time_s, rate)
        _check_replay(sc, replay)
        if all_values and not print_scenario:
            raise TwinferError("--all: only with --print-scenario")
        if print_scenario and all_values:
            print(yaml.safe_dump(sc.model_dump(mode="json", context={"all_fields": True}), sort_keys=False), end="")
            return
        if print_scenario:
            data = sc.model_dump(mode="json", exclude_none=True)
            # the workload's unused knobs (agentic/trace fields at their defaults) only add noise
            data["workload"] = _workload_yaml(sc.workload)
            print(yaml.safe_dump(data, sort_keys=False), end="")
            return
        if error_band is not None:  # before the run, not after it
            from sim.bands import check_band_source
            check_band_source(error_band)
        from ui.user_errors import check_out_path
        check_out_path(csv, "--csv")   # before the run too: a missing folder was refused only at the write, after it
        check_out_path(perfetto, "--perfetto")
        from sim.export import to_json, write_csv, write_perfetto
        from sim.runner import scenario_requests, simulate as run

        spec = slo_spec(slo, plan, scenario, sc)
        if slo is not None:
            from scheduler.metrics import SLO

            sc = sc.model_copy(update={"slo": SLO(**spec.targets())})
        con = Console(stderr=as_json)
        requests_flag = requests          # what --requests said (the plan comparison names the flags given)
        requests = scenario_requests(sc)
        t0 = time.perf_counter()  # wall time is only reported, never part of the result
        try:
            if not as_json:
                con.print(f"[dim]simulating {sc.name!r} ...[/]", highlight=False)
            total = len(requests) or sc.workload.num_requests or 0  # a closed loop's list fills during the run
            asked = [r.output_len for r in requests]   # the scheduler cuts an output at the context window
            with watch(lambda: done_requests(requests), total, "simulate", Console(stderr=True), transient=as_json):
                out = run(sc, record_steps=perfetto is not None, requests=requests)  # routes effects / a prefill pool
        except KeyboardInterrupt:
            print_partial(Console(stderr=True), requests, sc, spec, time.perf_counter() - t0)
            raise typer.Exit(130) from None
        wall = time.perf_counter() - t0
        res = out.result
        if csv is not None:
            write_csv(res.metrics, csv)
        if perfetto is not None:
            write_perfetto(out.collector.step_records, perfetto)
        if as_json:
            text = to_json(res, indent=1)
            part = the_plan.run_description() if the_plan is not None else None
            if part:   # what the run covers sits next to the result, as the verdict does
                data = json.loads(text)
                data["plan_run"] = part
                text = json.dumps(data, indent=1)
            if spec is not None:  # the verdict sits next to the result; the digest covers the result only
                data = json.loads(text)
                ok, line = spec.verdict(res.metrics)
                data["slo_check"] = {"slo": spec.text(), "percentile": spec.percentile, "meets": ok, "line": line}
                text = json.dumps(data, indent=1)
            print(text)
            return
        _print_result(con, res, wall, spec, plan)
        cut = output_cut_note(requests, asked)
        if cut:
            con.print(f"[yellow]note:[/] {cut}", highlight=False)
        drain = steady_drain_note(requests, res.metrics.steady)
        if drain:
            con.print(f"[yellow]note:[/] {drain}", highlight=False)
        none = no_steady_note(requests, res.scenario.get("steady_after_s"), res.metrics.steady)
        if none:
            con.print(f"[yellow]note:[/] {none}", highlight=False)
        from sim.deployment import POOLED_DP_MARK
        for line in (n for n in res.cost_model_notes if POOLED_DP_MARK in n):   # figures an engine would not reach
            con.print(f"[yellow]note:[/] {escape(line)}", highlight=False)
        if plan is not None:
            # --slo changes the run's SLO (its goodput and verdict), so its digest, not its timings
            changed = [f for f, v in (("--requests", requests_flag), ("--rate", rate), ("--seed", seed),
                                      ("--concurrency", concurrency), ("--think-time-s", think_time_s),
                                      ("--slo (the goodput and verdict only)", slo)) if v is not None]
            con.print(plan_comparison(the_plan, res, changed), highlight=False)
            part = the_plan.run_description()
            if part:
                con.print(f"note: the plan's run simulates {part}", highlight=False)
        if sc.calibration is not None or get_hardware_measured(sc.hardware):
            con.print("[dim]efficiencies: " + escape("; ".join(res.cost_model_notes[:4])) + "[/]", highlight=False)
        if error_band is not None:
            from sim.bands import applicable_band_line
            con.print(applicable_band_line(error_band, sc), highlight=False)
        for path, what in ((csv, "metrics CSV"), (perfetto, "Perfetto trace (open in ui.perfetto.dev)")):
            if path is not None:
                con.print(f"wrote {what}: {path}", highlight=False)
        con.print(f"[dim]{HINT}[/]", highlight=False)
