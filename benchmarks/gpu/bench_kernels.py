"""Kernel micro-benchmarks on one GPU: correctness vs the torch reference, then timing.

Each kernel is checked on fresh random inputs (relative error vs the reference), then
timed with CUDA events after warm-up (median of many), and reported against the
measured ceilings (KERNELS.md/DOMAIN.md, H200 here: 4.11 TB/s copy, 741 TF BF16,
1310 TF FP8) re-measured in this run when possible. Every section is independent: a
failure is recorded and the rest still runs. Writes one JSON file.

    python -m benchmarks.gpu.bench_kernels --out bench.json [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
import traceback

import torch

from kernels import reference as R
from kernels import registry

CEIL = {"copy_tbs": 4.11, "bf16_tflops": 741.0, "fp8_tflops": 1310.0}   # DOMAIN.md, measured 2026-11-29


def timed(fn, warmup: int = 5, iters: int = 30) -> float:
    """Median seconds of ``fn()`` by CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def env() -> dict:
    p = torch.cuda.get_device_properties(0)
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001
        drv = f"nvidia-smi failed: {e}"
    import triton
    return {"gpu": p.name, "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1),
            "capability": list(torch.cuda.get_device_capability()), "nvidia_smi": drv, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "python": sys.version.split()[0],
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "libraries": {k: registry.probe_library(k)[1:] for k in registry.LIBRARIES}}


def ceilings() -> dict:
    n = 1 << 30   # 2 GiB bf16 buffers: far beyond L2
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a), 3, 20)
    copy = 2 * a.numel() * 2 / t / 1e12
    del a, b
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: x @ y, 3, 20)
    return {"copy_tbs": copy, "bf16_tflops": 2 * 8192**3 / t / 1e12}


def bench_fp8_gemm(quick: bool) -> list[dict]:
    from kernels.triton_fp8_gemm import fp8_gemm
    from kernels.vendor import deepgemm_fp8_gemm
    shapes = [(4096, 2048, 7168), (4096, 7168, 2048), (64, 2048, 7168), (64, 24576, 1536)]
    rows = []
    for m, n, k in shapes[: 2 if quick else None]:
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda") * 0.02
        xq, xs = R.quant_fp8_act(x)
        wq, ws = R.quant_fp8_weight(w)
        want = R.fp8_gemm_blockscaled(xq, xs, wq, ws, torch.float32)
        impls = [("triton", fp8_gemm), ("deepgemm", deepgemm_fp8_gemm)]
        if m > 64:   # tile sweep of the Triton kernel (BLOCK_M, BLOCK_N, warps, stages)
            for cfg in ((128, 128, 8, 4), (128, 256, 8, 3), (128, 256, 8, 4), (64, 256, 4, 4), (128, 128, 4, 4)):
                impls.append((f"triton{list(cfg)}", lambda a, b, c, d, cfg=cfg: fp8_gemm(a, b, c, d, config=cfg)))
        for name, fn in impls:
            row = {"op": "fp8_gemm", "impl": name, "m": m, "n": n, "k": k}
            try:
                t0 = time.perf_counter()
                out = fn(xq, xs, wq, ws)
                torch.cuda.synchronize()
                row["first_call_s"] = time.perf_counter() - t0      # includes JIT/compile
                row["rel_err"] = rel(out, want)
                t = timed(lambda: fn(xq, xs, wq, ws))
                flops, nbytes = 2 * m * n * k, m * k + n * k + 2 * m * n
                row.update(time_us=t * 1e6, tflops=flops / t / 1e12, tbs=nbytes / t / 1e12,
                           frac_fp8_peak=flops / t / 1e12 / CEIL["fp8_tflops"], frac_copy_bw=nbytes / t / 1e12 / CEIL["copy_tbs"])
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            rows.append(row)
            print(row, flush=True)
    return rows


def bench_mla_decode(quick: bool) -> list[dict]:
    from kernels.triton_mla_decode import mla_decode
    from kernels.vendor import flashmla_decode
    rows = []
    cases = [(64, 1, 4096), (64, 2, 4096), (128, 1, 8192)] if not quick else [(64, 1, 4096)]
    g = torch.Generator(device="cuda").manual_seed(0)
    for b, s_q, max_len in cases:
        h, page, rank, dr = 128, 64, 512, 64
        lens = torch.randint(max_len // 2, max_len + 1, (b,), device="cuda", generator=g).to(torch.int32)
        pages = max_len // page
        cache = torch.randn(b * pages + 8, page, rank + dr, device="cuda", dtype=torch.bfloat16, generator=g)
        table = torch.randperm(b * pages + 8, device="cuda", generator=g)[: b * pages].view(b, pages).to(torch.int32)
        q = torch.randn(b, s_q, h, rank + dr, device="cuda", dtype=torch.bfloat16, generator=g)
        scale = 192 ** -0.5
        want = R.mla_decode_paged(q.float(), cache.float(), table, lens, scale, rank)
        nbytes = int(lens.sum()) * (rank + dr) * 2
        impls = [("flashmla", lambda: flashmla_decode(q, cache, table, lens, scale, rank))]
        for bh, bn, nw in ((16, 32, 4), (32, 32, 4), (32, 32, 8), (64, 32, 8), (32, 64, 8)):
            impls.append((f"triton[h{bh},n{bn},w{nw}]",
                          lambda bh=bh, bn=bn, nw=nw: mla_decode(q, cache, table, lens, scale, rank, block_h=bh, block_n=bn, num_warps=nw)))
        if b == 64 and s_q == 1:
            impls.append(("torch", lambda: R.mla_decode_paged(q, cache, table, lens, scale, rank)))
        for name, fn in impls:
            row = {"op": "mla_decode", "impl": name, "batch": b, "s_q": s_q, "heads": h, "max_len": max_len,
                   "kv_tokens": int(lens.sum())}
            try:
                out = fn()
                torch.cuda.synchronize()
                row["rel_err"] = rel(out, want)
                t = timed(fn, 3, 20 if name != "torch" else 5)
                row.update(time_us=t * 1e6, tbs=nbytes / t / 1e12, frac_copy_bw=nbytes / t / 1e12 / CEIL["copy_tbs"])
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:400]
            rows.append(row)
            print(row, flush=True)
        del cache
        torch.cuda.empty_cache()
    return rows


def bench_moe(quick: bool) -> list[dict]:
    """One DeepSeek-V3 MoE layer (256 experts, top-8, 7168 -> 2048 -> 7168), routed part only."""
    from kernels.triton_grouped_gemm import moe_experts
    e, d, i, k = 256, 7168, 2048, 8
    rows = []
    w13q = torch.empty(e, 2 * i, d, device="cuda", dtype=torch.float8_e4m3fn)
    w2q = torch.empty(e, d, i, device="cuda", dtype=torch.float8_e4m3fn)
    s13 = torch.empty(e, 2 * i // 128, d // 128, device="cuda")
    s2 = torch.empty(e, d // 128, i // 128, device="cuda")
    for j in range(e):   # per expert: float32 temporaries stay small
        q, s = R.quant_fp8_weight(torch.randn(2 * i, d, device="cuda") / d ** 0.5)
        w13q[j], s13[j] = q, s
        q, s = R.quant_fp8_weight(torch.randn(d, i, device="cuda") / i ** 0.5)
        w2q[j], s2[j] = q, s
    for t in ((64, 4096) if not quick else (64,)):
        x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
        wt, ids = R.route_sigmoid_grouped(torch.randn(t, e, device="cuda"), None, k, 8, 4, 2.5)
        touched = int(torch.unique(ids).numel())
        flops = 2 * t * k * 3 * d * i
        wbytes = touched * 3 * d * i   # fp8 weights of the experts this batch touches
        row = {"op": "moe_experts", "impl": "triton", "dtype": "fp8", "tokens": t, "experts": e, "top_k": k,
               "touched_experts": touched}
        try:
            out = moe_experts(x, wt, ids, w13q, w2q, s13, s2)
            torch.cuda.synchronize()
            sub = slice(0, min(t, 256))   # the reference loops over experts: check a slice of tokens
            want = R.moe_experts(x[sub].float(), wt[sub], ids[sub], w13q, w2q, s13, s2)
            row["rel_err"] = rel(out[sub], want)
            tt = timed(lambda: moe_experts(x, wt, ids, w13q, w2q, s13, s2), 3, 15)
            row.update(time_us=tt * 1e6, tflops=flops / tt / 1e12, weight_tbs=wbytes / tt / 1e12,
                       frac_fp8_peak=flops / tt / 1e12 / CEIL["fp8_tflops"], frac_copy_bw=wbytes / tt / 1e12 / CEIL["copy_tbs"])
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:400]
            traceback.print_exc()
        rows.append(row)
        print(row, flush=True)
    # the first grouped GEMM alone, DeepGEMM's contiguous layout (runs padded to 128): Triton vs DeepGEMM
    try:
        from kernels import triton_grouped_gemm as G
        from kernels.vendor import deepgemm_grouped_fp8_contiguous
        t = 4096
        _, ids = R.route_sigmoid_grouped(torch.randn(t, e, device="cuda"), None, k, 8, 4, 2.5)
        counts = torch.bincount(ids.flatten(), minlength=e)
        padded = (counts + 127) // 128 * 128
        m_idx = torch.repeat_interleave(torch.arange(e, device="cuda"), padded)
        pos = torch.arange(m_idx.numel(), device="cuda") - (padded.cumsum(0) - padded)[m_idx]
        m_idx = torch.where(pos < counts[m_idx], m_idx, torch.full_like(m_idx, -1)).to(torch.int32)
        a = torch.randn(m_idx.numel(), d, device="cuda")
        aq, as_ = R.quant_fp8_act(a)
        rows_v = torch.where(m_idx >= 0, torch.arange(m_idx.numel(), device="cuda"), torch.full_like(m_idx, -1)).to(torch.int32)
        be = m_idx.view(-1, 64)[:, 0].contiguous()
        valid = int(counts.sum())
        flops = 2 * valid * 2 * i * d
        sub_rows = (m_idx >= 0).nonzero().flatten()[:512]
        want = torch.stack([(R.dequant_fp8_act(aq[r:r + 1], as_[r:r + 1]) @ R.dequant_fp8_weight(w13q[m_idx[r]], s13[m_idx[r]]).t())[0]
                            for r in sub_rows.tolist()])

        def tri():
            out = torch.zeros(m_idx.numel(), 2 * i, device="cuda", dtype=torch.bfloat16)
            G._launch(aq, as_, w13q, s13, out, rows_v, be, None, 1, 64)
            return out

        for name, fn in (("triton_grouped", tri), ("deepgemm_grouped", lambda: deepgemm_grouped_fp8_contiguous(aq, as_, w13q, s13, m_idx))):
            row = {"op": "grouped_gemm_fp8", "impl": name, "rows": valid, "padded_rows": int(m_idx.numel()), "n": 2 * i, "k": d, "experts": e}
            try:
                out = fn()
                torch.cuda.synchronize()
                row["rel_err"] = rel(out[sub_rows], want)
                tt = timed(fn, 3, 15)
                row.update(time_us=tt * 1e6, tflops=flops / tt / 1e12, frac_fp8_peak=flops / tt / 1e12 / CEIL["fp8_tflops"])
            except Exception as ex:  # noqa: BLE001
                row["error"] = f"{type(ex).__name__}: {ex}"[:400]
            rows.append(row)
            print(row, flush=True)
    except Exception as ex:  # noqa: BLE001
        rows.append({"op": "grouped_gemm_fp8", "error": f"{type(ex).__name__}: {ex}"[:400]})
    del w13q, w2q
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default="ceilings,fp8_gemm,mla_decode,moe", help="comma-separated subset")
    args = ap.parse_args()
    wanted = set(args.sections.split(",")) | {"env"}
    res: dict = {"command": " ".join(sys.argv), "reference_ceilings": CEIL}
    for name, fn in (("env", env), ("ceilings", ceilings), ("fp8_gemm", lambda: bench_fp8_gemm(args.quick)),
                     ("mla_decode", lambda: bench_mla_decode(args.quick)), ("moe", lambda: bench_moe(args.quick))):
        if name not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001
            res[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
            traceback.print_exc()
        print(f"== {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    print("\n== summary")
    for sec in ("fp8_gemm", "mla_decode", "moe"):
        for r in res.get(sec, []) if isinstance(res.get(sec), list) else []:
            if "impl" not in r:
                print(sec, r)
                continue
            shape = {k: r[k] for k in r if k in ("m", "n", "k", "batch", "s_q", "max_len", "tokens", "rows")}
            if "error" in r:
                print(f"{sec:11s} {r['impl']:22s} {shape} ERROR {r['error'][:100]}")
            else:
                extra = f"{r.get('tflops', 0):7.1f} TF" if "tflops" in r else ""
                print(f"{sec:11s} {r['impl']:22s} {shape} rel {r['rel_err']:.1e} {r['time_us']:9.1f} us "
                      f"{r.get('tbs', r.get('weight_tbs', 0)):.2f} TB/s {extra} frac_bw {r.get('frac_copy_bw', 0):.2f} frac_fp8 {r.get('frac_fp8_peak', 0):.2f}")


if __name__ == "__main__":
    main()
