"""Expert-parallel benchmark: all-to-all latency/bandwidth by message size and EP width, and the
MoE layer / model step time by EP width, against the cost model (``costmodels.comm.alltoall_time``,
``StepCostModel``'s ``ep_dispatch`` / ``ep_combine`` ops).

CPU (gloo processes; the CI-sized run, minutes on 2 cores):

    python benchmarks/ep_bench.py --backend gloo --ep 1,2,4 --out profiles/cpu_gloo/ep_profile.json

One host of NVIDIA GPUs (NCCL, one process per GPU; the measurement the cost model wants):

    python benchmarks/ep_bench.py --backend nccl --ep 1,2,4,8 --dtype bf16 --tokens 16,128,1024 \\
        --out profiles/h200/ep_profile.json
    # a DeepSeek-V3-width layer stack instead of the tiny model (experts sharded after a full build):
    python benchmarks/ep_bench.py --backend nccl --ep 1,2,4,8 --model deepseek-v3 --num-layers 4 --dtype fp8 \\
        --tokens 16,128,1024 --out profiles/h200/ep_profile_dsv3.json

What it measures, per EP width ``n`` (each point: ``--iters`` repetitions after ``--warmup``,
ranks aligned by a barrier before each, the slowest rank's time per repetition, median):

- ``all_to_all_single`` with equal splits where every rank sends ``size`` bytes in total to the
  other ``n - 1`` ranks (the ``nbytes_out`` of ``alltoall_time``): time, bytes/s per rank;
- one EP MoE layer (the model's first MoE layer) with ``T`` tokens per rank, by phase: route,
  dispatch (counts + payload), local experts, combine, shared expert; with the bytes really sent;
- one model forward per rank: a decode batch of ``T`` sequences and a prefill of ``T`` tokens.

Then it fits the cost model's all-to-all form ``t = latency + bytes / bandwidth`` to every
(n > 1, size) point, reports each point's error under the fit and under the shipped default
H200 profile, and writes a ``CalibrationProfile`` (``alltoall_eff`` = fitted bandwidth over the
``--hardware`` entry's scale-up bandwidth, ``alltoall_latency_s`` = fitted latency; provenance;
raw points in ``op_points``). On CPU/gloo the numbers describe the CPU, not a GPU: they check
the code and the model's form, and must not be used to price GPUs (the profile says so).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_SIZES = {"gloo": [4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20],
                 "nccl": [4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 128 << 20]}
PHASES = ("route", "dispatch", "experts", "combine", "shared")


# ----------------------------------------------------------------------------- per-rank work

def _sync(g) -> None:
    import torch
    if g.device.type == "cuda":
        torch.cuda.synchronize(g.device)


def _slowest(g, per_iter: list[list[float]]) -> list[list[float]]:
    """Per repetition (and phase), the slowest rank's time."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(per_iter, dtype=torch.float64)
    if g.distributed:
        t = t.to(g.device) if g.backend == "nccl" else t
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g.group)
    return t.cpu().tolist()


def _barrier(g) -> None:
    import torch.distributed as dist
    if g.distributed:
        dist.barrier(group=g.group)
    _sync(g)


def _median(rows: list[list[float]]) -> list[float]:
    return [statistics.median(col) for col in zip(*rows)]


def bench_a2a(g, sizes: list[int], iters: int, warmup: int) -> list[dict]:
    """Equal-split all-to-all: every rank sends ``size`` bytes in total to the others."""
    import torch
    from executor.ep import all_to_all_rows
    rows = []
    if not g.distributed:
        return rows
    for size in sizes:
        per_peer = max(1, size // (g.world - 1))
        x = torch.ones(g.world * per_peer, dtype=torch.uint8, device=g.device)
        times = []
        for i in range(warmup + iters):
            _barrier(g)
            t0 = time.perf_counter()
            all_to_all_rows(x, None, None, g)
            _sync(g)
            if i >= warmup:
                times.append([time.perf_counter() - t0])
        t = _median(_slowest(g, times))[0]
        out = per_peer * (g.world - 1)
        rows.append({"ep": g.world, "bytes_out": out, "time_s": t, "bytes_per_s": out / t})
    return rows


def _build(opts: dict, device):
    from executor.model_config import ExecModelConfig, resolve_spec
    from executor.weights import build_model
    spec = resolve_spec(opts["model"])
    if opts.get("num_layers"):
        spec = spec.model_copy(update={"num_layers": opts["num_layers"],
                                       "layer_kinds": spec.layer_kinds[:opts["num_layers"]] if spec.layer_kinds else []})
    cfg = ExecModelConfig.build(spec)
    return cfg, build_model(cfg, device, opts["dtype"], "dummy", seed=1, routing_skew=opts["routing_skew"], max_pos=4096)


def bench_model(g, opts: dict) -> dict:
    """MoE layer phases and model forwards with ``T`` tokens per rank, for each ``T``."""
    import torch
    from executor.ep_moe import shard_moe_layers
    from executor.forward_batch import SeqInput, build_forward_batch
    from executor.kv_cache import KVCache
    from executor.weights import DTYPES

    cfg, model = _build(opts, g.device)
    layers = shard_moe_layers(model, g, redundant=opts["redundant"])
    layer = layers[0]
    hidden = cfg.spec.hidden_size
    moe_rows, fwd_rows = [], []
    act = DTYPES[opts["dtype"]]
    for T in opts["tokens"]:
        gen = torch.Generator().manual_seed(1000 + g.rank)
        x = torch.randn(T, hidden, generator=gen).to(act).to(g.device)
        per_iter, rows_sent, bytes_sent, comb_sent = [], 0, 0, 0
        with torch.inference_mode():
            for i in range(opts["warmup"] + opts["iters"]):
                _barrier(g)
                s0 = dict(g.stats)
                ts = [time.perf_counter()]
                w, ids = layer.route(x)
                slots = layer.pick_slots(ids)
                _sync(g); ts.append(time.perf_counter())
                rec = layer.dispatcher.dispatch(x, slots, w)
                _sync(g); ts.append(time.perf_counter())
                y = layer.expert_ffn(rec)
                _sync(g); ts.append(time.perf_counter())
                out = layer.dispatcher.combine(y, rec.handle).to(x.dtype)
                _sync(g); ts.append(time.perf_counter())
                if layer.shared_experts is not None:
                    out = out + layer.shared_experts(x)
                _sync(g); ts.append(time.perf_counter())
                if i >= opts["warmup"]:
                    per_iter.append([b - a for a, b in zip(ts, ts[1:])])
                    rows_sent = g.stats["dispatch_rows"] - s0["dispatch_rows"]
                    bytes_sent = g.stats["dispatch_bytes"] - s0["dispatch_bytes"]
                    comb_sent = g.stats["combine_bytes"] - s0["combine_bytes"]
        med = _median(_slowest(g, per_iter))
        # the layer as the model calls it, without and with the two-micro-batch overlap
        whole = {}
        with torch.inference_mode():
            for tmb in (False, True):
                layer.two_micro_batch = tmb
                times = []
                for i in range(opts["warmup"] + opts["iters"]):
                    _barrier(g)
                    t0 = time.perf_counter()
                    layer(x)
                    _sync(g)
                    if i >= opts["warmup"]:
                        times.append([time.perf_counter() - t0])
                whole[tmb] = _median(_slowest(g, times))[0]
            layer.two_micro_batch = False
        moe_rows.append({"ep": g.world, "tokens_per_rank": T, **{f"{p}_s": v for p, v in zip(PHASES, med)},
                         "forward_s": whole[False], "forward_tmb_s": whole[True],
                         "layer_s": sum(med), "rank0_dispatch_rows": rows_sent, "rank0_dispatch_bytes": bytes_sent,
                         "rank0_combine_bytes": comb_sent,
                         "rank0_received_rows": int(rec.x.shape[0])})
        # whole forward: a decode batch of T sequences (context 128) and a prefill of T tokens
        page = 64
        for kind in ("decode", "prefill"):
            if kind == "decode":
                ctx = 128
                n_pages = T * (-(-(ctx + 1) // page))
                seqs = [SeqInput([(7 * i) % 256], ctx, list(range(i * 3, i * 3 + 3)), True) for i in range(T)]
            else:
                n_pages = -(-T // page)
                seqs = [SeqInput([(5 * i) % 256 for i in range(T)], 0, list(range(n_pages)), False)]
            kv = KVCache(cfg, n_pages + 1, page, g.device, act)
            batch = build_forward_batch(seqs, page, kv.null_page, g.device)
            times = []
            with torch.inference_mode():
                for i in range(opts["warmup"] + opts["iters"]):
                    _barrier(g)
                    t0 = time.perf_counter()
                    model(batch, kv)
                    _sync(g)
                    if i >= opts["warmup"]:
                        times.append([time.perf_counter() - t0])
            fwd_rows.append({"ep": g.world, "kind": kind, "tokens_per_rank": T, "forward_s": _median(_slowest(g, times))[0]})
    return {"moe": moe_rows, "forward": fwd_rows, "dispatcher": g.dispatcher}


def bench_rank(g, opts: dict) -> dict:
    """Everything one EP width measures; rank 0's copy is the result."""
    import torch
    if g.device.type == "cpu":
        torch.set_num_threads(opts["threads"])
    res = {"a2a": bench_a2a(g, opts["sizes"], opts["iters"], opts["warmup"])}
    res.update(bench_model(g, opts))
    return res


# ----------------------------------------------------------------------------- fits and predictions

def fit_alltoall(rows: list[dict]) -> tuple[float, float]:
    """Least squares ``t = latency + bytes / bw`` in relative error (each point weighted 1/t): (latency s, bytes/s)."""
    b = np.array([r["bytes_out"] for r in rows], float)
    t = np.array([r["time_s"] for r in rows], float)
    a = np.stack([np.ones_like(b), b], 1) / t[:, None]
    (lat, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    lat = max(float(lat), 0.0)
    inv_bw = max(float(inv_bw), 1e-30)
    return lat, 1.0 / inv_bw


def _profile(base, lat: float, bw: float, hw, backend: str, prov: dict, points: list[dict], per_ep: dict):
    eff = min(1.0, bw / hw.scaleup_bw)
    notes = list(base.notes) + [
        f"all-to-all fitted by benchmarks/ep_bench.py over {backend}: latency {lat * 1e6:.1f} us, "
        f"{bw / 1e9:.3f} GB/s per rank = alltoall_eff {eff:.4g} of {hw.name} scale-up {hw.scaleup_bw / 1e9:.0f} GB/s"
        " (the latency includes the host's launch and synchronisation: timed with the host clock around a device sync)",
        "per-EP-width fits (latency us, GB/s): " + ", ".join(f"ep{n}: {v[0] * 1e6:.1f}, {v[1] / 1e9:.3f}" for n, v in per_ep.items()),
    ]
    if backend == "gloo":
        notes.append("CPU/gloo measurement: checks code and model form only; NOT a GPU calibration, do not price GPUs with it")
    return base.model_copy(update={
        "measured_on": hw.name if backend == "nccl" else "cpu", "source": f"benchmarks/ep_bench.py ({backend})",
        "created": prov["date"], "notes": notes, "alltoall_eff": max(eff, 1e-9), "alltoall_latency_s": lat,
        "provenance": {**base.provenance, "ep_bench": prov} if base.provenance else {"ep_bench": prov},
        "op_points": list(base.op_points) + points,
    })


def _ep_step(spec, hw, cal, ep: int, redundant: int, batch):
    """The cost model's step (StepCost) for ``batch`` at EP width ``ep``, attention data-parallel (``dp = ep``)."""
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel
    return StepCostModel(spec, hw, ParallelLayout(dp=ep, ep=ep, eplb_redundant_experts=redundant), cal).step(batch)


def _step_prediction(spec, hw, cal, ep: int, tokens: int, redundant: int) -> dict:
    """The cost model's EP communication (dispatch + combine, per MoE layer) for a prefill of ``tokens`` per rank."""
    from costmodels.batch import BatchShape
    cost = _ep_step(spec, hw, cal, ep, redundant, BatchShape.prefill(ep, tokens))
    n_moe = sum(1 for i in range(spec.num_layers) if spec.is_moe_layer(i)) or 1
    pick = lambda key: next(((o.time_s / o.count, o.bytes / o.count) for o in cost.ops if o.name.startswith(key)), (0.0, 0.0))  # noqa: E731
    (d_t, d_b), (c_t, c_b) = pick("ep_dispatch"), pick("ep_combine")
    return {"dispatch_s": d_t, "combine_s": c_t, "dispatch_bytes": d_b, "combine_bytes": c_b,
            "step_s": cost.time_s, "moe_layers": n_moe}


def _forward_prediction(spec, hw, cal, ep: int, kind: str, tokens: int, redundant: int) -> float:
    """The cost model's time for the bench's forward at EP width ``ep``: ``tokens`` decode sequences of
    context 128 per rank, or one prefill of ``tokens`` per rank."""
    from costmodels.batch import BatchShape
    batch = BatchShape.decode(ep * tokens, 128) if kind == "decode" else BatchShape.prefill(ep, tokens)
    return _ep_step(spec, hw, cal, ep, redundant, batch).time_s


def _git() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def provenance(backend: str, device: str, opts: dict, argv: list[str]) -> dict:
    import torch
    p = {"backend": backend, "device": device, "torch": torch.__version__, "python": platform.python_version(),
         "host": platform.node(), "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
         "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "git": _git(),
         "command": "python benchmarks/ep_bench.py " + " ".join(argv), "options": {k: v for k, v in opts.items()},
         "method": "barrier, then one collective/forward; slowest rank per repetition; median over repetitions"}
    if device == "cuda":
        p["gpu"] = torch.cuda.get_device_name(0)
        p["gpus"] = torch.cuda.device_count()
        p["cuda"] = torch.version.cuda
        p["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else ""
        try:
            p["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                         text=True, timeout=20).stdout.split("\n")[0].strip()
        except Exception:  # noqa: BLE001
            p["driver"] = ""
    else:
        p["threads_per_rank"] = opts["threads"]
        p["load_average_1m"] = os.getloadavg()[0]   # a shared CPU's other work inflates the timings
    return p


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--ep", default="1,2,4", help="EP widths, comma-separated")
    ap.add_argument("--sizes", default=None, help="all-to-all bytes sent per rank, comma-separated (default by backend)")
    ap.add_argument("--tokens", default="16,256", help="tokens per rank for the MoE layer and forward steps")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--num-layers", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="fp32 (CPU default), bf16 (GPU default), fp8")
    ap.add_argument("--redundant", type=int, default=0, help="EPLB redundant experts")
    ap.add_argument("--routing-skew", type=float, default=0.0)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank on CPU")
    ap.add_argument("--hardware", default="H200", help="catalog entry the profile's alltoall_eff is relative to")
    ap.add_argument("--base", default=None, help="calibration profile to add the fitted comm terms to (default: analytic)")
    ap.add_argument("--out", default=None, help="write the calibration profile JSON here (and a .report.json beside it)")
    args = ap.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)

    import torch
    from costmodels.calibration import CalibrationProfile
    from costmodels.comm import alltoall_time
    from costmodels.hardware import get_hardware
    from executor import ep as ep_mod
    from executor.ep_launch import run_ranks
    from executor.model_config import resolve_spec

    device = "cuda" if args.backend == "nccl" else "cpu"
    widths = [int(x) for x in args.ep.split(",")]
    opts = {"model": args.model, "num_layers": args.num_layers, "dtype": args.dtype or ("bf16" if device == "cuda" else "fp32"),
            "tokens": [int(x) for x in args.tokens.split(",")], "redundant": args.redundant, "routing_skew": args.routing_skew,
            "iters": args.iters or (30 if device == "cuda" else 10), "warmup": args.warmup, "threads": args.threads,
            "sizes": [int(x) for x in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES[args.backend]}
    if device == "cuda" and torch.cuda.device_count() < max(widths):
        raise SystemExit(f"--ep {args.ep}: needs {max(widths)} GPUs, torch sees {torch.cuda.device_count()}")

    results = {}
    for n in widths:
        t0 = time.perf_counter()
        if n == 1:
            g = ep_mod.single(torch.device("cuda", 0) if device == "cuda" else "cpu")
            if device == "cuda":
                torch.cuda.set_device(0)
            results[n] = bench_rank(g, opts)
        else:
            results[n] = run_ranks(bench_rank, n, (opts,), device=device, backend=args.backend, threads=args.threads)[0]
        print(f"# ep={n}: measured in {time.perf_counter() - t0:.1f} s (dispatcher: {results[n]['dispatcher']})", flush=True)

    hw = get_hardware(args.hardware)
    default_cal = CalibrationProfile.default(hw)
    a2a = [r for n in widths for r in results[n]["a2a"]]
    report: dict = {"provenance": provenance(args.backend, device, opts, argv), "a2a": a2a,
                    "moe": [r for n in widths for r in results[n]["moe"]],
                    "forward": [r for n in widths for r in results[n]["forward"]]}
    profile = None
    if a2a:
        lat, bw = fit_alltoall(a2a)
        per_ep = {n: fit_alltoall([r for r in a2a if r["ep"] == n]) for n in widths if n > 1}
        base = CalibrationProfile.load(args.base) if args.base else default_cal
        points = [{"op": "alltoall", "backend": args.backend, **r} for r in a2a]
        profile = _profile(base, lat, bw, hw, args.backend, report["provenance"], points, per_ep)
        for r in a2a:
            r["pred_fit_s"] = alltoall_time(r["bytes_out"], r["ep"], hw, profile)
            r["err_fit"] = r["pred_fit_s"] / r["time_s"] - 1
            r["pred_default_s"] = alltoall_time(r["bytes_out"], r["ep"], hw, default_cal)
            r["err_default"] = r["pred_default_s"] / r["time_s"] - 1
        report["fit"] = {"latency_s": lat, "bytes_per_s": bw, "per_ep": {str(n): {"latency_s": v[0], "bytes_per_s": v[1]} for n, v in per_ep.items()},
                         "mean_abs_err_fit": float(np.mean([abs(r["err_fit"]) for r in a2a])),
                         "max_abs_err_fit": float(np.max([abs(r["err_fit"]) for r in a2a]))}
        spec = resolve_spec(args.model)
        if args.num_layers:
            spec = spec.model_copy(update={"num_layers": args.num_layers,
                                           "layer_kinds": spec.layer_kinds[:args.num_layers] if spec.layer_kinds else []})
        for r in report["moe"]:
            if r["ep"] == 1:
                continue
            fitted = _step_prediction(spec, hw, profile, r["ep"], r["tokens_per_rank"], args.redundant)
            target = _step_prediction(spec, hw, default_cal, r["ep"], r["tokens_per_rank"], args.redundant)
            meas = r["dispatch_s"] + r["combine_s"]
            # the cost model's own bytes (top-k copies of each token, bf16/fp8 payload, 1.2x busiest rank)
            r["pred_comm_fit_s"] = fitted["dispatch_s"] + fitted["combine_s"]
            r["err_comm_fit"] = r["pred_comm_fit_s"] / meas - 1
            r["model_dispatch_bytes"] = fitted["dispatch_bytes"]
            # alltoall_time on the bytes this code really sent (one token per destination rank)
            r["pred_comm_sent_s"] = (alltoall_time(r["rank0_dispatch_bytes"], r["ep"], hw, profile)
                                     + alltoall_time(r["rank0_combine_bytes"], r["ep"], hw, profile))
            r["err_comm_sent"] = r["pred_comm_sent_s"] / meas - 1
            r["pred_comm_default_s"] = target["dispatch_s"] + target["combine_s"]
            r["pred_step_default_s"] = target["step_s"]

        # step time by EP width: the simulator's cost model for the same forward (global batch = ep x the rank's)
        for r in report["forward"]:
            for tag, cal in (("fit", profile), ("default", default_cal)):
                r[f"pred_{tag}_s"] = _forward_prediction(spec, hw, cal, r["ep"], r["kind"], r["tokens_per_rank"], args.redundant)
                r[f"err_{tag}"] = r[f"pred_{tag}_s"] / r["forward_s"] - 1
        base1 = {(r["kind"], r["tokens_per_rank"]): r for r in report["forward"] if r["ep"] == 1}
        for r in report["forward"]:
            b = base1.get((r["kind"], r["tokens_per_rank"]))
            if b is not None and r["ep"] > 1:   # what EP width changes: measured vs predicted growth over EP 1
                r["delta_meas_s"] = r["forward_s"] - b["forward_s"]
                r["delta_pred_s"] = r["pred_fit_s"] - b["pred_fit_s"]

    _print(report, args.backend, hw)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if profile is not None:
            profile.save(out)
        Path(str(out.with_suffix("")) + ".report.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"# wrote {out} and {out.with_suffix('')}.report.json")
    return report


def _print(rep: dict, backend: str, hw) -> None:
    print(f"\n## all-to-all ({backend}): bytes each rank sends to the others -> time (slowest rank, median)")
    print(f"{'ep':>3} {'bytes_out':>10} {'time_us':>10} {'GB/s/rank':>10} {'fit_us':>9} {'err_fit':>8} {hw.name + '_us':>9} {'err_' + hw.name:>9}")
    for r in rep["a2a"]:
        print(f"{r['ep']:>3} {r['bytes_out']:>10} {r['time_s'] * 1e6:>10.1f} {r['bytes_per_s'] / 1e9:>10.3f} "
              f"{r.get('pred_fit_s', 0) * 1e6:>9.1f} {r.get('err_fit', 0):>+8.1%} {r.get('pred_default_s', 0) * 1e6:>9.1f} {r.get('err_default', 0):>+9.1%}")
    if "fit" in rep:
        f = rep["fit"]
        print(f"fit t = {f['latency_s'] * 1e6:.1f} us + bytes / {f['bytes_per_s'] / 1e9:.3f} GB/s; |err| mean {f['mean_abs_err_fit']:.1%}, "
              f"max {f['max_abs_err_fit']:.1%}; per ep: " + ", ".join(f"ep{n} {v['latency_s'] * 1e6:.0f} us + {v['bytes_per_s'] / 1e9:.3f} GB/s"
                                                                       for n, v in f["per_ep"].items()))
        if backend == "gloo":
            print(f"(gloo on CPU processes is not the target hardware: the {hw.name} column is what the shipped profile predicts for NVLink)")
    print("\n## MoE layer (first MoE layer), per phase, ms (slowest rank, median)")
    print(f"{'ep':>3} {'T/rank':>6} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'layer':>8} {'rows':>5} {'sent_KB':>8} {'model_KB':>8}"
          f" {'pred_sent':>9} {'err':>6} {'pred_model':>10} {'err':>6}")
    for r in rep["moe"]:
        print(f"{r['ep']:>3} {r['tokens_per_rank']:>6} " + " ".join(f"{r[p + '_s'] * 1e3:>9.3f}" for p in PHASES)
              + f" {r['layer_s'] * 1e3:>8.3f} {r['rank0_dispatch_rows']:>5} {r['rank0_dispatch_bytes'] / 1e3:>8.1f}"
              + (f" {r['model_dispatch_bytes'] / 1e3:>8.1f} {r['pred_comm_sent_s'] * 1e3:>9.3f} {r['err_comm_sent']:>+6.0%}"
                 f" {r['pred_comm_fit_s'] * 1e3:>10.3f} {r['err_comm_fit']:>+6.0%}" if "err_comm_fit" in r else ""))
    print("(dispatch+combine measured vs alltoall_time under the fitted profile: 'pred_sent' on the bytes really sent,"
          " 'pred_model' on the cost model's own bytes formula; sent_KB is rank 0's dispatch payload to other ranks)")
    print("\n## MoE layer forward, ms: one batch vs two overlapped micro-batches (executor/two_micro_batch.py)")
    print(f"{'ep':>3} {'T/rank':>6} {'one':>9} {'two_mb':>9} {'gain':>7}")
    for r in rep["moe"]:
        print(f"{r['ep']:>3} {r['tokens_per_rank']:>6} {r['forward_s'] * 1e3:>9.3f} {r['forward_tmb_s'] * 1e3:>9.3f} "
              f"{1 - r['forward_tmb_s'] / r['forward_s']:>+7.0%}")
    print("\n## model forward per rank (all layers), ms (slowest rank, median)")
    print(f"{'ep':>3} {'kind':>8} {'T/rank':>6} {'forward_ms':>10} {'pred_ms':>8} {'err':>7} {'d_meas':>7} {'d_pred':>7}")
    for r in rep["forward"]:
        print(f"{r['ep']:>3} {r['kind']:>8} {r['tokens_per_rank']:>6} {r['forward_s'] * 1e3:>10.2f}"
              + (f" {r['pred_fit_s'] * 1e3:>8.2f} {r['err_fit']:>+7.0%}" if "pred_fit_s" in r else "")
              + (f" {r['delta_meas_s'] * 1e3:>+7.2f} {r['delta_pred_s'] * 1e3:>+7.2f}" if "delta_meas_s" in r else ""))
    if any("pred_fit_s" in r for r in rep["forward"]):
        print("(pred: StepCostModel with the fitted all-to-all, global batch = ep x per-rank batch; d_meas / d_pred: growth over"
              " EP 1 of the same batch. The eager executor's forward is launch-bound, the cost model prices device time)")


if __name__ == "__main__":
    main()
