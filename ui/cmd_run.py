"""``twinfer run``: replay a workload through the real executor and report serving metrics.

The same workload generator and metrics collector as ``twinfer simulate``, but every step
runs the model on real kernels and its time is measured. Requests are added when the
engine clock reaches their arrival; idle gaps between arrivals are skipped (the clock
jumps), so a sparse workload does not wait in real time. Prompts are synthetic token
ids derived from the workload's block hashes: requests sharing a prefix group share the
tokens, so the prefix cache hits as the simulator predicts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from twinfer.errors import TwinferError
from ui.progress import watch


# A preset as it is (chat: 1,000 requests, ~1,500-token prompts, ~400-token outputs) runs for hours
# through the CPU executor (the tiny model: ~1 CPU-second per step on this project's 2-core box);
# this much takes well under a minute and still shows prefill, batched decode and the metrics.
CPU_REQUESTS, CPU_MAX_INPUT, CPU_MAX_OUTPUT = 8, 256, 16
# executor.engine.SamplingParams takes 0 (greedy) or this range; refused here, naming the flag, before the engine build
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-4, 1e4
# router bias -skew * ln(1 + rank) (executor/weights.py set_routing_skew): inf gives inf * 0 = NaN for the top expert
ROUTING_SKEW_MAX = 1000.0


def register(app: typer.Typer) -> None:
    """Add ``run`` to the CLI."""
    app.command("run", help="Run a workload offline through the real executor (measured step times) and report serving metrics.")(run)


def synth_prompt(hashes: tuple[int, ...], prompt_len: int, block_size: int, vocab: int, key: str, seed: int) -> list[int]:
    """Token ids for a prompt: hashed blocks get tokens seeded by their hash (shared content), the rest by the request."""
    out: list[int] = []
    for h in hashes[: prompt_len // block_size]:
        out.extend(np.random.default_rng([int(h) & (2**63 - 1), seed]).integers(0, vocab, block_size).tolist())
    rest = prompt_len - len(out)
    if rest > 0:
        kseed = int.from_bytes(key.encode()[:16].ljust(16, b"\0"), "little")
        out.extend(np.random.default_rng([kseed, seed, 1]).integers(0, vocab, rest).tolist())
    return out[:prompt_len]


def check_temperature(temperature: float, flag: str = "--temperature") -> None:
    """0 (greedy) or a finite temperature in the sampler's range; anything else names the flag (exit 2)."""
    if temperature != 0 and not TEMPERATURE_MIN <= temperature <= TEMPERATURE_MAX:
        raise TwinferError(f"{flag} {temperature:g}: expected 0 (greedy) or {TEMPERATURE_MIN:g}..{TEMPERATURE_MAX:g}")


def plan_scheduler(plan: Path, model: str | None = None) -> dict:
    """The scheduler section ``--plan`` gives as the base config: a file's top-level ``scheduler`` (a tuned policy,
    ``twinfer tune --plan-out``) or an aggregated ``twinfer plan`` file's serving pool's; anything else is refused
    (a plan file of another kind was ignored without a word). Read as ``twinfer serve --plan`` reads it
    (``ui.serve_plan.read_plan``)."""
    from ui.serve_plan import check_plan_model, read_plan

    pf = read_plan(plan, "twinfer run")
    if model is not None:   # a plan sized for another model is refused as twinfer serve refuses it
        check_plan_model(pf, model)
    return pf.scheduler


def _load_workload(workload: str, requests: Optional[int], rate: Optional[float], cap: Optional[int] = None):
    """The run's workload: a preset or a YAML/JSON file, ``--rate`` and ``--requests`` over it. ``requests`` is the
    run's request count: a trace's ``max_requests`` (its earliest requests), any other kind's ``num_requests``.
    ``cap``: the CPU-sized run's default count, an upper bound on what the workload asks for (a trace file's own
    ``max_requests`` below it stands)."""
    from sim.workload import PRESETS, WorkloadSpec, preset
    from twinfer.config import read_mapping, validate
    from twinfer.errors import TwinferError

    over: dict = {} if rate is None else {"rate": rate}
    path = Path(workload)
    is_file = path.exists()
    if is_file:   # a file (read_mapping refuses what is not a regular one, naming it)
        data = read_mapping(workload)
    elif workload in PRESETS:
        data = {}
    elif path.suffix.lower() in (".yaml", ".yml", ".json") or "/" in workload:
        raise TwinferError(f"--workload {workload}: no such file (a workload is a preset, one of "
                           f"{', '.join(PRESETS)}, or a YAML/JSON file)")
    else:
        return preset(workload, **over)   # an unknown name: refused, the presets listed
    base = PRESETS.get(data.get("preset")) if is_file else PRESETS[workload]
    kind = data.get("kind") or (base.kind if base is not None else None)
    key = "max_requests" if kind == "trace" else "num_requests"
    if requests is not None:
        over[key] = requests
    elif cap is not None:
        own = data.get(key, getattr(base, key, None) if base is not None else None)
        if own is None:
            over[key] = cap
        elif isinstance(own, int) and not isinstance(own, bool):
            over[key] = min(own, cap)
        # (anything else is validation's to name, as without the cap)
    if is_file:
        data.update(over)
        return validate(WorkloadSpec, data, workload)
    return preset(workload, **over)


def _json_nulls(v):
    """``v`` with every float that is not finite (a time the runner did not measure: NaN) as None, so a step log line
    is JSON (NaN is not) and reads null there."""
    if isinstance(v, float):
        return v if np.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_nulls(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_nulls(x) for x in v]
    return v


def count_finished(engine) -> list[int]:
    """[requests finished, output tokens] as the engine's steps return them (for the progress bar and Ctrl-C)."""
    counts = [0, 0]
    step = engine.step

    def counted_step():
        outs = step()
        for o in outs:
            counts[0] += bool(o.finished)
            counts[1] += len(o.new_token_ids)
        return outs

    engine.step = counted_step  # this engine only; replay calls engine.step()
    return counts


def _print_partial(con, m) -> None:
    """The figures of the requests a cut run finished (engine clock; no drain, not comparable to a full run)."""
    def ms(x) -> str:
        return "-" if x is None else f"{x * 1e3:.1f}"

    con.print(f"[yellow]partial figures over the {m.requests_finished} finished requests (no drain, not comparable "
              "to a full run):[/]", highlight=False)
    for name, st in (("TTFT", m.ttft_s), ("TPOT", m.tpot_s), ("E2E", m.e2e_s)):
        con.print(f"  {name} ms mean/p50/p90/p99: {ms(st.mean)} / {ms(st.p50)} / {ms(st.p90)} / {ms(st.p99)}", highlight=False)
    con.print(f"  output tokens/s {m.output_throughput:,.1f} over {m.duration_s:,.2f} engine s", highlight=False)


def _graphs_info(g) -> dict:
    """Captured decode graph sizes, failures and capture time (empty dict when eager)."""
    if g is None:
        return {}
    return {"captured": g.captured, "failed": g.failed, "capture_s": g.capture_s, "max_pages": g.max_pages}


def run(
    model: str = typer.Option("tiny", "--model", "-m", help="catalog name (tiny, ...) or HF checkpoint folder"),
    load_format: str = typer.Option("dummy", "--load-format", help="dummy (random weights) or auto (read safetensors)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp32 | fp8 | fp64 [fp32 on cpu, bf16 on cuda]"),
    workload: str = typer.Option("chat", "--workload", "-w", help="workload preset name or YAML/JSON WorkloadSpec file"),
    requests: Optional[int] = typer.Option(None, "--requests", "-n", min=1,
                                           help=f"number of requests [the workload's; {CPU_REQUESTS} on cpu]"),
    rate: Optional[float] = typer.Option(None, "--rate", help="arrival rate, requests/s (overrides the workload)"),
    max_input_len: Optional[int] = typer.Option(None, "--max-input-len", min=1, help=f"clamp prompt lengths [none; {CPU_MAX_INPUT} on cpu]"),
    max_output_len: Optional[int] = typer.Option(None, "--max-output-len", min=1, help=f"clamp output lengths [none; {CPU_MAX_OUTPUT} on cpu]"),
    seed: int = typer.Option(0, "--seed"),
    scheduler_config: Optional[Path] = typer.Option(None, "--scheduler-config", help="SchedulerConfig YAML/JSON"),
    plan: Optional[Path] = typer.Option(None, "--plan", help="deployment plan file; its 'scheduler' section is the base config"),
    block_size: Optional[int] = typer.Option(None, "--block-size", min=1, help="KV block (page) size [64]"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", min=1),
    max_batched_tokens: Optional[int] = typer.Option(None, "--max-batched-tokens", min=1),
    draft_len: Optional[int] = typer.Option(None, "--draft-len", min=0, help="MTP draft tokens per decode step"),
    decode_steps: int = typer.Option(1, "--decode-steps", min=1, help="decode steps one plan may cover"),
    async_overlap: Optional[bool] = typer.Option(None, "--async-overlap/--no-async-overlap",
                                                 help="pipelined loop: schedule step N+1 while the device runs step N [scheduler config; on]"),
    num_kv_blocks: Optional[int] = typer.Option(None, "--num-kv-blocks", min=1),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=2),
    routing_skew: float = typer.Option(0.0, "--routing-skew", min=0.0, max=ROUTING_SKEW_MAX,
                                       help="Zipf-like expert skew for dummy weights (0: none)"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", min=1, help="keep the first n layers (full-width model on one GPU)"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, max=TEMPERATURE_MAX,
                                      help=f"0 (greedy) or {TEMPERATURE_MIN:g}..{TEMPERATURE_MAX:g}"),
    warmup: Optional[bool] = typer.Option(None, "--warmup/--no-warmup", help="compile kernels on throwaway requests first [on for cuda]"),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="no CUDA graphs for decode steps (eager only)"),
    step_log: Optional[Path] = typer.Option(None, "--step-log", help="write one JSON line per executed step"),
    as_json: bool = typer.Option(False, "--json", help="print metrics and run info as JSON (nothing else on stdout)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write metrics and run info as JSON to this file"),
) -> None:
    """Replay the workload; print the metrics."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from executor.engine import LLMEngine  # torch behind this import
    from scheduler.config import SchedulerConfig, token_budget_for
    from sim.workload import generate
    from twinfer.config import read_mapping, validate
    from ui.user_errors import check_out_path

    check_temperature(temperature)
    check_out_path(out, "--out")
    check_out_path(step_log, "--step-log")
    sc = plan_scheduler(plan, model) if plan is not None else {}
    if scheduler_config:
        sc.update(read_mapping(scheduler_config))
    for k, v in (("block_size", block_size), ("max_num_seqs", max_num_seqs),
                 ("max_num_batched_tokens", max_batched_tokens), ("draft_len", draft_len), ("async_overlap", async_overlap)):
        if v is not None:
            sc[k] = v
    if "max_num_seqs" in sc and "max_num_batched_tokens" not in sc:
        sc["max_num_batched_tokens"] = max(8192, token_budget_for(sc["max_num_seqs"], 0) * (1 + sc.get("draft_len", 0)))
    sched_cfg = validate(SchedulerConfig, sc, str(scheduler_config or "scheduler options"))
    err = Console(stderr=True)
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    cap = None
    if device == "cpu" and None in (requests, max_input_len, max_output_len):
        cap = None if requests is not None else CPU_REQUESTS
        max_input_len, max_output_len = max_input_len or CPU_MAX_INPUT, max_output_len or CPU_MAX_OUTPUT
        err.print(f"[dim]cpu-sized run: {requests or f'at most {CPU_REQUESTS}'} requests of {escape(workload)!r}, prompts <= "
                  f"{max_input_len} and outputs <= "
                  f"{max_output_len} tokens (--requests/--max-input-len/--max-output-len to change)[/]", highlight=False)
    spec = _load_workload(workload, requests, rate, cap)   # a bad workload is refused before the engine build (minutes on a GPU)
    t_build = time.perf_counter()
    engine = LLMEngine.from_args(model, load_format=load_format, device=device, dtype=dtype, seed=seed,
                                 max_model_len=max_model_len, num_kv_blocks=num_kv_blocks, scheduler_config=sched_cfg,
                                 routing_skew=routing_skew, decode_steps=decode_steps, num_layers=num_layers,
                                 enforce_eager=enforce_eager)
    build_s = time.perf_counter() - t_build
    warmup_s = engine.warmup() if (warmup if warmup is not None else device == "cuda") else 0.0

    reqs = generate(spec, np.random.default_rng(seed), engine.block_size)
    if not reqs:
        raise TwinferError("the workload produced no requests")
    vocab = engine.vocab_size
    items = []
    for r in reqs:
        plen = min(r.prompt_len, max_input_len or r.prompt_len)
        olen = min(r.output_len, max_output_len or r.output_len)
        items.append((r.arrival_time, r.request_id, synth_prompt(r.block_hashes, plen, engine.block_size, vocab, r.request_id, seed), olen))

    from executor.replay import ReplayInterrupted, replay

    log_f = open(step_log, "w") if step_log else None

    def write_log(plan_no: int, start_s: float, records: list[dict], stats) -> None:
        t = start_s
        for j, rec in enumerate(records):
            log_f.write(json.dumps(_json_nulls({"plan": plan_no, "step": j, "start_s": round(t, 6), **rec,
                                                "kv_used_blocks": stats.kv_used_blocks}), allow_nan=False) + "\n")
            t += rec["wall_s"]

    finished = count_finished(engine)
    t_run = time.perf_counter()
    try:
        with watch(lambda: finished[0], len(items), "run", err, transient=as_json):
            res = replay(engine, items, temperature=temperature, seed=seed, on_plan=write_log if log_f is not None else None)
    except KeyboardInterrupt as cut:
        err.print(f"[yellow]interrupted after {time.perf_counter() - t_run:.1f} s wall: {finished[0]} of {len(items)} requests "
                  f"finished, {finished[1]:,} output tokens ({finished[1] / max(time.perf_counter() - t_run, 1e-9):,.1f} tokens/s wall)[/]",
                  highlight=False)
        if isinstance(cut, ReplayInterrupted) and cut.metrics.requests_finished:
            _print_partial(err, cut.metrics)
        raise typer.Exit(130) from None
    finally:
        if log_f is not None:
            log_f.close()
    wall_s, summary, backend_steps = res.wall_s, res.metrics, res.kernel_steps

    from kernels import ops
    kernels_used = {op: sorted(v, key=v.get, reverse=True) for op, v in backend_steps.items()}
    info = {"model": model, "num_layers": engine.cfg.spec.num_layers, "device": device, "dtype": dtype, "load_format": load_format, "seed": seed,
            "workload": workload, "requests": len(items), "scheduler": engine.scheduler.config.model_dump(),   # as the engine runs it
            "num_kv_blocks": engine.scheduler.blocks.num_blocks, "build_s": build_s, "warmup_s": warmup_s, "wall_s": wall_s,
            "kernels": kernels_used, "kernel_steps": backend_steps, "kernel_fallbacks": dict(ops.fallbacks),
            "cuda_graphs": _graphs_info(engine.runner.graphs) or {"off": engine.runner.graphs_off_reason}}
    doc = json.dumps({"run": info, "metrics": summary.model_dump()}, indent=1, default=str)
    if out is not None:
        Path(out).write_text(doc)
    if as_json:
        print(doc)
        return

    con = Console()
    tab = Table(title=f"twinfer run: {model} on {device} ({dtype}), {len(items)} requests of '{workload}'")
    tab.add_column("metric")
    tab.add_column("value", justify="right")

    def ms(stat) -> str:
        return "-" if stat.mean is None else f"{stat.mean * 1e3:.1f} / {stat.p50 * 1e3:.1f} / {stat.p99 * 1e3:.1f}"

    rows = [
        ("requests finished / dropped", f"{summary.requests_finished} / {summary.requests_dropped}"),
        ("TTFT mean / p50 / p99 (ms)", ms(summary.ttft_s)),
        ("TPOT mean / p50 / p99 (ms)", ms(summary.tpot_s)),
        ("ITL mean / p50 / p99 (ms)", ms(summary.itl_s)),
        ("E2E mean / p50 / p99 (ms)", ms(summary.e2e_s)),
        ("output tokens/s", f"{summary.output_throughput:.1f}"),
        ("total tokens/s", f"{summary.total_throughput:.1f}"),
        ("prefix cache hit rate", "-" if summary.prefix_cache_hit_rate is None else f"{summary.prefix_cache_hit_rate:.3f}"),
        ("preemptions", str(summary.preemptions)),
        ("steps / mean batch tokens", f"{summary.num_steps} / {summary.mean_batch_tokens or 0:.1f}"),
        ("KV util mean / max", f"{summary.kv_util_mean or 0:.3f} / {summary.kv_util_max or 0:.3f}"),
        ("engine time (clock) / wall (s)", f"{summary.duration_s:.2f} / {wall_s:.2f}"),
    ]
    for k, v in rows:
        tab.add_row(k, v)
    con.print(tab)
    for reason, n in list(summary.dropped_by_reason.items())[:5]:
        con.print(f"[yellow]dropped {n}: {escape(reason)}[/]", highlight=False)
    if len(summary.dropped_by_reason) > 5:
        con.print(f"[yellow]dropped: {len(summary.dropped_by_reason) - 5} more reasons in the JSON (-o)[/]", highlight=False)
    con.print("kernels: " + ", ".join(f"{op}={v[0] if v else '-'}" for op, v in sorted(kernels_used.items())), highlight=False)
