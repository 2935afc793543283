"""``twinfer bench``: replay a twinfer workload against a live OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Optional

import typer

from twinfer.errors import TwinferError
from ui.user_errors import missing_field_hint

# the longest load ramp a run takes (a day): past it, or infinite, the ramp's last request would never be sent
MAX_RAMP_S = 86_400.0


def register(app: typer.Typer) -> None:
    """Add ``bench`` to the CLI."""
    app.command("bench", help="Benchmark a live OpenAI-compatible server (twinfer, vLLM, SGLang) with a twinfer workload.")(bench)


def load_workload(workload: str, *, requests: Optional[int], rate: Optional[float], trace: Optional[str],
                  trace_format: str, input_len: Optional[int], output_len: Optional[int], duration_s: Optional[float] = None,
                  concurrency: Optional[int] = None, think_time_s: Optional[float] = None):
    """A WorkloadSpec from a preset name or a YAML/JSON file, or a trace, with the CLI's overrides (a file's given
    before it is validated, as ``simulate`` does: a file without a rate takes --rate, a ``kind: closed`` one without
    its users --concurrency)."""
    from sim import workload as wl

    if trace:
        over = {"kind": "trace", "trace_path": trace, "trace_format": trace_format}
        if requests:
            over["max_requests"] = requests
        if duration_s:
            over["duration_s"] = duration_s
        return wl.WorkloadSpec(**over)
    over: dict = {}
    if requests:
        over["num_requests"] = requests
    if rate:
        over["rate"] = rate
    if input_len:
        over["input_len"] = input_len   # a bare number is a fixed length
    if output_len:
        over["output_len"] = output_len
    if duration_s:
        over["duration_s"] = duration_s
    if Path(workload).exists():   # a file (read_mapping refuses what is not a regular one, naming it)
        from twinfer.config import read_mapping, validate

        data = {**read_mapping(workload), **over}   # (read_mapping refuses a file that holds no mapping)
        if data.get("kind") == "closed" and (concurrency is not None or think_time_s is not None):
            data = wl.closed_mapping(data, concurrency, think_time_s)
        try:
            return validate(wl.WorkloadSpec, data, workload)
        except TwinferError as e:   # a file without a required field: the flag that gives it
            hinted = missing_field_hint(str(e))
            if hinted == str(e):
                raise
            raise TwinferError(hinted) from None
    return wl.preset(workload, **over)


def closed_workload(spec, *, concurrency: Optional[int], rate: Optional[float], think_time_s: Optional[float]):
    """The workload as a closed loop, or None to replay it as it is.

    ``kind: closed`` takes --concurrency (its user count) and --think-time-s; a poisson/gamma/constant workload
    with --concurrency and no --rate becomes ``kind: closed`` with the same lengths, prefixes and request count
    (what ``twinfer simulate --concurrency`` runs). Agentic sessions and traces keep their requests: with
    --concurrency alone they are replayed in order by that many workers.
    """
    from sim import workload as wl

    if spec.kind == "closed" or (concurrency is not None and rate is None and spec.kind in wl.RATE_KINDS):
        return wl.as_closed(spec, concurrency, think_time_s)
    if think_time_s is not None:
        raise TwinferError("--think-time-s: only for a closed loop (--concurrency without --rate on a poisson/gamma/"
                           "constant workload, or a workload of kind: closed)")
    return None


def user_loop(spec, seed: int, block_size: int):
    """``spec`` (kind: closed) as the bench client's UserLoop: user u's k-th request is the one ``twinfer simulate``
    draws for the same (seed, u, k)."""
    import numpy as np

    from executor import bench_client as bc
    from sim.closed_loop import UserContent

    content = UserContent(spec, np.random.default_rng(seed), block_size)

    def next_request(u: int, k: int):
        d = content.draw(u, k)
        return bc.BenchItem(d.key, 0.0, d.prompt_len, d.output_len, d.block_hashes), d.think_s

    return bc.UserLoop(spec.concurrency, next_request, spec.num_requests, spec.duration_s)


def clipped_note(clipped: int, total: int, context: str) -> str:
    """How many requests were shortened to fit a context, in the one wording bench and validate print (``context``:
    what set it, e.g. "the server's max_model_len 4096" or "--max-model-len 4096")."""
    return f"{clipped} of {total} requests clipped to fit {context}"


def check_url(url: str) -> str:
    """``url`` if it is http(s); the client strips a '/v1' (what ``twinfer serve`` prints) itself."""
    if not url.strip().startswith(("http://", "https://")):
        raise TwinferError(f"--url {url!r}: expected http://HOST:PORT or http://HOST:PORT/v1")
    return url.strip()


def to_sim_metrics(run, *, num_gpus: int = 1, slo=None):
    """The run as ``scheduler.metrics.SimMetrics``: the report ``twinfer simulate`` gives, from measured records.

    Each request's arrival is when the client sent it (what the server saw), so TTFT, TPOT and
    E2E are the server's; measured ITLs (gaps between streamed chunks) go straight into the
    collector's ITL histogram; failed requests count as dropped with reason ``http_error``.
    Step-level fields (plans, batch sizes, KV utilisation) stay empty: a client cannot see them.
    """
    import numpy as np

    from scheduler.request import Request
    from scheduler.metrics import MetricsCollector

    col = MetricsCollector()
    for rec in sorted(run.records, key=lambda r: r.start_s):
        req = Request(f"b{rec.index}", rec.start_s, rec.prompt_tokens or rec.prompt_len, rec.output_len)
        col.on_arrival(req)
        if not rec.success:
            req.drop_reason = "http_error"
            col.on_drop(req)
            continue
        req.num_output_tokens = rec.output_tokens
        req.num_cached_tokens = rec.cached_tokens or 0
        req.first_token_time = rec.start_s + rec.ttft_s
        req.finish_time = rec.start_s + rec.e2e_s
        col.on_finish(req)
        if rec.itl_s:
            col.itl.add(np.asarray(rec.itl_s), np.ones(len(rec.itl_s)))
    return col.summarize(num_gpus, slo, duration_s=run.duration_s)


def bench(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="server URL, with or without the /v1 that twinfer serve prints"),
    workload: str = typer.Option("chat", "--workload", help="workload preset name or a WorkloadSpec YAML/JSON file"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1, help="number of requests (default: the workload's)"),
    # --rate and --duration-s: > 0, checked in the body (typer's min= is inclusive and showed [x>=0.0] for a 0 refused)
    rate: Optional[float] = typer.Option(None, "--rate", help="mean arrival rate, req/s, > 0 (default: the workload's)"),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1,
                                              help="requests in flight; alone: closed loop of that many users, with --rate: a cap"),
    think_time_s: Optional[float] = typer.Option(None, "--think-time-s", min=0.0,
                                                 help="closed loop: seconds a user waits before its next request (default 0)"),
    duration_s: Optional[float] = typer.Option(None, "--duration-s",
                                               help="send requests only for this many seconds, > 0 (closed loop: users stop, in-flight requests finish)"),
    trace: Optional[str] = typer.Option(None, "--trace", help="replay a trace file instead of a preset"),
    trace_format: str = typer.Option("jsonl", "--trace-format", help="jsonl (twinfer) or mooncake"),
    input_len: Optional[int] = typer.Option(None, "--input-len", min=1, help="fix every prompt's length (tokens)"),
    output_len: Optional[int] = typer.Option(None, "--output-len", min=1, help="fix every output's length (tokens)"),
    warmup: int = typer.Option(0, "--warmup", min=0, help="unmeasured requests sent first"),
    ramp_s: float = typer.Option(0.0, "--ramp-s", min=0.0, help="ramp the load up linearly over this many seconds"),
    records: Optional[str] = typer.Option(None, "--records", help="write per-request records (JSONL) here"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="model id to send (default: the server's first)"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="TWINFER_API_KEY"),
    prompt_mode: str = typer.Option("text", "--prompt-mode", help="text (calibrated synthetic words) or ids (token ids)"),
    block_size: int = typer.Option(16, "--block-size", min=1, help="KV block size for the workload's shared-prefix hashes"),
    seed: int = typer.Option(0, "--seed"),
    timeout_s: float = typer.Option(600.0, "--timeout-s", min=1.0,
                                    help="per-request timeout: seconds a whole request may take, streamed tokens "
                                         "included; one still running then is cut and counted as failed"),
    slo: Optional[str] = typer.Option(None, "--slo", help="targets for goodput and the 'meets the SLO' verdict, e.g. ttft_p90=2s,tpot_p90=50ms"),
    num_gpus: int = typer.Option(1, "--num-gpus", min=1, help="GPUs behind the server, for per-GPU throughputs"),
) -> None:
    """Run the workload against the server and report TTFT/TPOT/ITL/E2E and throughput."""
    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from executor import bench_client as bc
    from sim import workload as wl
    from planner.slo import parse_slo
    from scheduler.metrics import SLO

    if prompt_mode not in ("text", "ids"):
        raise TwinferError(f"--prompt-mode must be text or ids, got {prompt_mode!r}")
    if trace_format not in ("jsonl", "mooncake"):
        raise TwinferError(f"--trace-format must be jsonl or mooncake, got {trace_format!r}")
    if not (math.isfinite(ramp_s) and ramp_s <= MAX_RAMP_S):   # an endless ramp never sends its last request
        raise TwinferError(f"--ramp-s {ramp_s:g}: allowed: 0 up to {MAX_RAMP_S:,.0f} seconds")
    for flag, value in (("--rate", rate), ("--duration-s", duration_s)):
        # 0 is no rate and no sending time; the overrides below would take it for "unset" and run the workload's
        if value is not None and not value > 0:   # (NaN too)
            raise TwinferError(f"{flag} must be > 0 (got {value:g})")
    err = Console(stderr=True)
    target = parse_slo(slo, "--slo") if slo is not None else None
    url = check_url(url)
    spec = load_workload(workload, requests=requests, rate=rate, trace=trace, trace_format=trace_format,
                         input_len=input_len, output_len=output_len, duration_s=duration_s, concurrency=concurrency,
                         think_time_s=think_time_s)
    closed_spec = closed_workload(spec, concurrency=concurrency, rate=rate, think_time_s=think_time_s)
    users, items = None, []
    if closed_spec is not None:
        users = user_loop(closed_spec, seed, block_size)
    else:
        items = bc.items_from_requests(wl.generate(spec, np.random.default_rng(seed), block_size))
        if not items:
            raise TwinferError("the workload produced no requests")
    if trace and rate:  # a trace keeps its burstiness, stretched to the asked mean rate
        items = bc.rescale_arrivals(items, rate)

    try:
        model, max_len = asyncio.run(bc.server_info(url, model, api_key))
    except LookupError as e:   # reachable, but it does not serve that model
        raise TwinferError(f"--model {model}: {e}") from None
    except Exception as e:  # noqa: BLE001 - unreachable or not OpenAI-compatible: say so plainly
        raise TwinferError(f"cannot reach an OpenAI-compatible server at {url} ({type(e).__name__}: {e})") from None

    closed = users is not None or (concurrency is not None and rate is None)
    total = len(items) if users is None else users.num_requests
    done: list = []
    with Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=as_json) as progress:
        task = progress.add_task("bench", total=total, status="")
        failed = 0

        def on_record(rec: bc.RequestRecord) -> None:
            nonlocal failed
            failed += not rec.success
            done.append(rec)
            progress.update(task, advance=1, status=f"[red]{failed} failed[/]" if failed else "")

        try:
            run = asyncio.run(bc.run_benchmark(url, items, model=model, concurrency=concurrency, closed_loop=closed,
                                               warmup=warmup, ramp_s=ramp_s, api_key=api_key, prompt_mode=prompt_mode,
                                               block_size=block_size, seed=seed, timeout_s=timeout_s,
                                               max_model_len=int(max_len) if max_len else None, users=users,
                                               on_record=on_record))
        except KeyboardInterrupt:
            # what completed is still reported (records, --json), then exit 130: a cut run is not a clean one
            progress.stop()
            print_partial(err, done, total or len(done))
            run = partial_run(done, model=model, url=url, prompt_mode=prompt_mode)
    interrupted = run.interrupted
    if run.clipped:
        err.print("note: " + clipped_note(run.clipped, len(run.records), f"the server's max_model_len {max_len}"))
    if records:
        bc.write_records(records, run)
    metrics = to_sim_metrics(run, num_gpus=num_gpus, slo=SLO(**target.targets()) if target else None)
    config = {"url": url, "model": run.model, "workload": trace or workload, "num_requests": len(run.records),
              "rate": rate, "concurrency": users.users if users else concurrency, "closed_loop": closed, "warmup": warmup,
              "ramp_s": ramp_s, "prompt_mode": prompt_mode, "tokens_per_word": run.tokens_per_word, "seed": seed,
              "clipped_to_max_model_len": run.clipped}
    if interrupted:   # num_requests: those that completed before Ctrl-C, of this many
        config.update(interrupted=True, num_requests_planned=total)
    if users is not None:
        config.update(think_time_s_mean=closed_spec.think_time_s.mean(), duration_s=closed_spec.duration_s,
                      max_in_flight=run.max_in_flight)
    verdict = target.verdict(metrics) if target else None
    if as_json:
        doc = {"config": config, "metrics": metrics.model_dump(mode="json")}
        if verdict:
            doc["slo_check"] = {"slo": target.text(), "percentile": target.percentile, "meets": verdict[0], "line": verdict[1]}
        print(json.dumps(doc, indent=2))
    elif not interrupted:   # (a cut run's figures were printed by print_partial)
        print_summary(Console(), config, metrics)
        if verdict:
            Console().print(verdict[1], highlight=False, style=None if verdict[0] else "red")
    errors = [r.error for r in run.records if r.error]
    if errors:
        err.print(f"[red]{len(errors)} requests failed[/]; first error: {errors[0]}")
    if interrupted:
        raise typer.Exit(130)


def partial_run(records: list, *, model: str, url: str, prompt_mode: str):
    """The requests that completed before a Ctrl-C, as a run (``interrupted`` set): its duration runs from the
    first send to the last completion (what the client saw; requests cut in flight are not in it)."""
    from executor import bench_client as bc

    end = max((r.start_s + (r.e2e_s or 0.0) for r in records), default=0.0)
    return bc.BenchRun(records=list(records), duration_s=end, model=model, url=url, prompt_mode=prompt_mode,
                       interrupted=True)


def print_partial(console, records: list, total: int) -> None:
    """What a bench cut by Ctrl-C measured: counts and latency percentiles of the requests that completed."""
    import numpy as np

    ok = [r for r in records if r.success]
    if not ok:   # no latency to report: said so, not a heading over nothing
        failed = f" (all {len(records)} failed)" if records else ""
        console.print(f"[yellow]interrupted: {len(records)} of {total} requests completed{failed}; no figures to "
                      "report[/]", highlight=False)
        return
    console.print(f"[yellow]interrupted: {len(records)} of {total} requests completed ({len(records) - len(ok)} failed); "
                  "partial figures over the successful ones:[/]", highlight=False)
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        x = np.array([getattr(r, name) for r in ok if getattr(r, name) is not None], dtype=float)
        if x.size:
            p50, p90, p99 = np.percentile(x, [50, 90, 99]) * 1e3
            console.print(f"  {name[:-2].upper()} ms p50/p90/p99: {p50:,.1f} / {p90:,.1f} / {p99:,.1f} ({x.size} requests)", highlight=False)


def print_summary(console, config: dict, m) -> None:
    """A table of the SimMetrics fields a client can measure."""
    from rich.table import Table

    t = Table(title=f"twinfer bench: {config['model']} at {config['url']}", show_header=True)
    t.add_column("latency (ms)")
    for col in ("mean", "p50", "p90", "p99"):
        t.add_column(col, justify="right")
    for label, st in (("TTFT", m.ttft_s), ("TPOT", m.tpot_s), ("ITL", m.itl_s), ("E2E", m.e2e_s)):
        vals = (st.mean, st.p50, st.p90, st.p99)
        t.add_row(label, *("-" if v is None else f"{v * 1e3:.1f}" for v in vals))
    console.print(t)
    line = (f"requests: {m.requests_finished} finished, {m.requests_dropped} failed in {m.duration_s:.2f} s  |  "
            f"{m.request_throughput:.2f} req/s  |  output {m.output_throughput:.1f} tok/s  |  "
            f"total {m.total_throughput:.1f} tok/s  |  tokens in/out {m.input_tokens}/{m.output_tokens}")
    if m.prefix_cache_hit_rate is not None:
        line += f"  |  prefix cache hits {m.prefix_cache_hit_rate:.1%}"
    if m.goodput is not None:
        line += f"  |  goodput {m.goodput:.2f} req/s ({m.goodput_fraction:.1%} meet the SLO)"
    console.print(line, highlight=False)
    if config.get("max_in_flight") is not None:  # a closed loop: the load is the user count
        per_user = "-" if m.per_user_output_tps_mean is None else f"{m.per_user_output_tps_mean:.1f}"
        console.print(f"closed loop: {config['concurrency']} users (think {config['think_time_s_mean']:g} s mean), at most "
                      f"{config['max_in_flight']} in flight  |  output {m.output_throughput_per_gpu:.1f} tok/s per GPU  |  "
                      f"{per_user} tok/s per user (mean)", highlight=False)
