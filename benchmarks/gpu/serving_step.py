"""Issue 18 on the GPU: vendor paths vs the torch reference, the fused MoE vs Triton, and a 5-layer
DeepSeek-V3 FP8 decode step at batch 64 / context 4k with DeepGEMM on the serving path vs Triton.

Sections (each written to the JSON as soon as it finishes, so a timeout keeps what ran):
- ``correctness``: relative error of every vendor path against ``kernels.reference`` on the same
  quantised operands (DeepGEMM dense, fused MoE masked and contiguous, FlashMLA);
- ``moe``: the MoE layer (256 experts, top-8, 7168/2048, FP8) at 64 and 4096 tokens, DeepGEMM fused vs
  Triton, device time from a CUDA-graph replay (also proves the fused path captures), CUDA events;
- ``step``: engines built through ``LLMEngine.from_args`` (JIT warm-up + graph capture as serving
  does), one per kernel choice; decode step at B=64, every sequence at 4096 tokens of context:
  graph-replay device time (CUDA events) and whole-step wall (inputs + replay + logits + argmax), with
  the warm-up's own time and the DeepGEMM compiler used;
- ``jit_check``: one DeepGEMM GEMM compiled (first call) and cached, with the JIT setup (NVRTC or nvcc);
- ``step_ops`` (``step_ops_triton``): the same decode step against the sum of its ops measured alone,
  launch and host gaps named (``benchmarks.gpu.step_breakdown``).
Usage: python -m benchmarks.gpu.serving_step OUT.json [--sections correctness,moe,step_deepgemm,step_triton,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.gpu.bench_kernels import rel, timed
from benchmarks.gpu.step_breakdown import breakdown, decode_steps, graph_of
from kernels import ops
from kernels import reference as R

E, TOPK, D, I = 256, 8, 7168, 2048


def device_ms(fn, warm: int = 3, iters: int = 20, graph: bool = True) -> tuple[float, bool]:
    """Median ms of ``fn`` by CUDA events, replaying a CUDA graph of it when capture works."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    run, captured = fn, False
    if graph:
        try:
            run, captured = graph_of(fn).replay, True
        except Exception as e:  # noqa: BLE001
            print(f"  graph capture failed ({type(e).__name__}: {str(e)[:120]}): eager timing", flush=True)
    return timed(run, 0, iters) * 1e3, captured


def moe_problem(t: int, gen: torch.Generator):
    """Random FP8 expert weights (quantised per expert), tokens and sigmoid-style routing."""
    w13 = torch.empty(E, 2 * I, D, dtype=torch.float8_e4m3fn, device="cuda")
    w2 = torch.empty(E, D, I, dtype=torch.float8_e4m3fn, device="cuda")
    s13 = torch.empty(E, 2 * I // 128, D // 128, device="cuda")
    s2 = torch.empty(E, D // 128, I // 128, device="cuda")
    for e in range(E):
        w13[e], s13[e] = R.quant_fp8_weight(torch.randn(2 * I, D, device="cuda", generator=gen) * 0.02)
        w2[e], s2[e] = R.quant_fp8_weight(torch.randn(D, I, device="cuda", generator=gen) * 0.02)
    x = torch.randn(t, D, device="cuda", generator=gen).bfloat16()
    ids = torch.rand(t, E, device="cuda", generator=gen).topk(TOPK, dim=-1).indices
    wts = torch.rand(t, TOPK, device="cuda", generator=gen)
    return x, wts, ids, w13, w2, s13, s2


def correctness(gen, problem) -> dict:
    from kernels import vendor
    out = {}
    for m, n, k in ((64, 24576, 1536), (4096, 7168, 2048)):
        xq, xs = R.quant_fp8_act(torch.randn(m, k, device="cuda", generator=gen))
        wq, ws = R.quant_fp8_weight(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
        out[f"deepgemm fp8_gemm {m}x{n}x{k}"] = rel(vendor.deepgemm_fp8_gemm(xq, xs, wq, ws),
                                                     R.fp8_gemm_blockscaled(xq, xs, wq, ws, torch.float32))
    x, wts, ids, w13, w2, s13, s2 = problem
    for t, layout in ((64, "masked"), (1024, "contiguous")):
        want = R.moe_experts(x[:t].float(), wts[:t], ids[:t], w13, w2, s13, s2)
        out[f"deepgemm fused moe {layout} T={t}"] = rel(vendor.deepgemm_fused_moe(x[:t], wts[:t], ids[:t], w13, w2, s13, s2), want)
        from kernels.triton_grouped_gemm import moe_experts as tri
        out[f"triton moe T={t}"] = rel(tri(x[:t], wts[:t], ids[:t], w13, w2, s13, s2), want)
    q = torch.randn(16, 1, 128, 576, device="cuda", generator=gen).bfloat16()
    cache = torch.randn(16 * 64 + 4, 64, 576, device="cuda", generator=gen).bfloat16()
    table = torch.randperm(16 * 64 + 4, device="cuda", generator=gen)[: 16 * 64].view(16, 64).int()
    lens = torch.randint(2048, 4097, (16,), device="cuda", generator=gen).int()
    out["flashmla decode B=16 L<=4096"] = rel(vendor.flashmla_decode(q, cache, table, lens, 0.04, 512),
                                              R.mla_decode_paged(q.float(), cache.float(), table, lens, 0.04, 512))
    for k_, v in out.items():
        print(f"  rel err {k_}: {v:.3g}", flush=True)
    return out


def gemms_alone(t: int, ids, w13, w2, s13, s2) -> float:
    """Device ms of the fused path's two DeepGEMM grouped GEMMs alone, on its own layout (the rest is glue)."""
    from kernels import fused_moe as F
    from kernels import vendor
    if t <= F.MASKED_MAX_TOKENS:
        _, masked_m, max_m = F.masked_layout(ids, E)
        exp = max(1, -(-t * TOPK // E))
        a1 = R.quant_fp8_act(torch.randn(E * max_m, D, device="cuda"))
        a2 = R.quant_fp8_act(torch.randn(E * max_m, I, device="cuda"))
        return device_ms(lambda: (vendor.deepgemm_grouped_fp8_masked(a1[0].view(E, max_m, D), a1[1].view(E, max_m, -1), w13, s13, masked_m, exp),
                                  vendor.deepgemm_grouped_fp8_masked(a2[0].view(E, max_m, I), a2[1].view(E, max_m, -1), w2, s2, masked_m, exp)))[0]
    _, m_idx = F.contiguous_layout(ids, E)
    a1 = R.quant_fp8_act(torch.randn(m_idx.numel(), D, device="cuda"))
    a2 = R.quant_fp8_act(torch.randn(m_idx.numel(), I, device="cuda"))
    return device_ms(lambda: (vendor.deepgemm_grouped_fp8_contiguous(*a1, w13, s13, m_idx),
                              vendor.deepgemm_grouped_fp8_contiguous(*a2, w2, s2, m_idx)))[0]


def moe_times(problem) -> dict:
    from kernels import vendor
    from kernels.triton_grouped_gemm import moe_experts as tri
    x, wts, ids, w13, w2, s13, s2 = problem
    res = {}
    for t in (64, 4096):
        args = (x[:t], wts[:t], ids[:t], w13, w2, s13, s2)
        row = {}
        for name, fn in (("deepgemm_fused", vendor.deepgemm_fused_moe), ("triton", tri)):
            ms, cap = device_ms(lambda: fn(*args))
            touched = int(torch.unique(ids[:t]).numel())
            wbytes = touched * (2 * I * D + D * I)          # FP8 expert weights read once
            row[name] = {"ms": round(ms, 4), "graph": cap, "weight_tbs": round(wbytes / ms / 1e9, 3),
                         "tflops": round(2 * t * TOPK * 3 * I * D / ms / 1e9, 1)}
        row["deepgemm_gemms_alone"] = {"ms": round(gemms_alone(t, ids[:t], w13, w2, s13, s2), 4)}
        row["triton_over_deepgemm"] = round(row["triton"]["ms"] / row["deepgemm_fused"]["ms"], 3)
        res[f"T={t}"] = row
        print(f"  moe T={t}: {row}", flush=True)
    return res


def decode_engine(overrides: dict | None, ctx: int, b: int):
    """(engine, its decode sequences, build seconds, warm-up summary): the 5-layer DeepSeek-V3 FP8 engine built as
    serving builds it, and ``b`` decoding sequences each at ``ctx`` tokens of context."""
    from executor.engine import LLMEngine
    from executor.forward_batch import SeqInput
    from kernels import warmup
    ops.clear_choices()
    warm, inner = {}, warmup.jit_warmup

    def timed_warmup(*a, **kw):   # the engine imports it at call time: this records the warm-up's own time
        t = time.perf_counter()
        rows = inner(*a, **kw)
        warm.update(seconds=round(time.perf_counter() - t, 1), shapes=len(rows),
                    impls={i: sum(r["impl"] == i for r in rows) for i in sorted({r["impl"] for r in rows})},
                    slowest_s=max((r["seconds"] for r in rows), default=0.0))
        return rows
    warmup.jit_warmup = timed_warmup
    t0 = time.perf_counter()
    pages = -(-(ctx + 1) // 64)
    try:
        e = LLMEngine.from_args("deepseek-v3", device="cuda", dtype="fp8", num_layers=5, max_model_len=ctx + 64,
                                num_kv_blocks=b * pages + 16, kernel_overrides=overrides,
                                scheduler_config={"max_num_seqs": b, "max_num_batched_tokens": 8192, "block_size": 64})
    finally:
        warmup.jit_warmup = inner
    seqs = [SeqInput([17 * i + 3], ctx, list(range(i * pages, (i + 1) * pages)), True) for i in range(b)]
    return e, seqs, time.perf_counter() - t0, warm


def step_times(overrides: dict | None, ctx: int = 4096, b: int = 64, iters: int = 20) -> dict:
    from kernels import jit_cache
    e, seqs, build_s, warm = decode_engine(overrides, ctx, b)
    r, g = e.runner, e.runner.graphs
    model, kv = r.model, r.kv
    with torch.inference_mode():
        _, wall, replay, _, rep, _ = decode_steps(r, seqs, iters)
    res = {"overrides": overrides, "build_s": round(build_s, 1), "graph": rep is not None,
           "forward_ms": round(statistics.median(replay), 3), "step_wall_ms": round(statistics.median(wall), 3),
           "backends": dict(g.backends.get(max(g.captured), {})) if g is not None and g.captured else ops.reset_used(),
           "capture_s": getattr(g, "capture_s", None), "warmup": warm, "deepgemm_jit": jit_cache.state.get("note")}
    print(f"  step B={b} ctx={ctx} {overrides}: {res}", flush=True)
    del e, r, g, model, kv
    torch.cuda.empty_cache()
    return res


def jit_check(m: int = 64, n: int = 3072, k: int = 4096) -> dict:
    """One DeepGEMM FP8 GEMM at a shape no model here uses: import, JIT setup, first call (the compile) and a
    cached call timed, error vs the reference. The compiler is whatever ``DG_JIT_USE_NVRTC`` asks for."""
    from kernels import jit_cache, registry, vendor
    t0 = time.perf_counter()
    ok, path, why = registry.probe_library("deepgemm")
    res = {"found": ok, "library": path or why, "import_s": round(time.perf_counter() - t0, 2), "shape_mnk": [m, n, k]}
    res["jit"] = {key: jit_cache.state[key] for key in ("compiler", "cuda_home", "shim", "note")}
    if not ok:
        res["ok"] = False
        return res
    gen = torch.Generator(device="cuda").manual_seed(0)
    xq, xs = R.quant_fp8_act(torch.randn(m, k, device="cuda", generator=gen))
    wq, ws = R.quant_fp8_weight(torch.randn(n, k, device="cuda", generator=gen) * 0.02)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        out = vendor.deepgemm_fp8_gemm(xq, xs, wq, ws)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the failure text is the result
        res.update(ok=False, error=f"{type(e).__name__}: {e}"[:500], first_call_s=round(time.perf_counter() - t0, 2))
        print(f"  jit check: {res}", flush=True)
        return res
    res.update(ok=True, first_call_s=round(time.perf_counter() - t0, 2))
    t0 = time.perf_counter()
    vendor.deepgemm_fp8_gemm(xq, xs, wq, ws)
    torch.cuda.synchronize()
    res["second_call_ms"] = round(1e3 * (time.perf_counter() - t0), 3)
    res["rel_err"] = rel(out, R.fp8_gemm_blockscaled(xq, xs, wq, ws, torch.float32))
    res["device_ms"] = round(device_ms(lambda: vendor.deepgemm_fp8_gemm(xq, xs, wq, ws))[0], 4)
    print(f"  jit check: {res}", flush=True)
    return res


def step_ops(overrides: dict | None = None, ctx: int = 4096, b: int = 64) -> dict:
    """The decode step against the sum of its ops alone (``benchmarks.gpu.step_breakdown``), printed as a table."""
    e, seqs, build_s, warm = decode_engine(overrides, ctx, b)
    res = breakdown(e, seqs, ctx)
    res.update(overrides=overrides, build_s=round(build_s, 1), warmup=warm,
               backends=dict(e.runner.graphs.backends.get(max(e.runner.graphs.captured), {})) if e.runner.graphs else {})
    summary = {k: res[k] for k in ("step_wall_ms", "forward_graph_ms", "sum_alone", "gaps", "in_graph",
                                   "ratio_step_to_sum_alone", "ratio_forward_graph_to_sum_alone", "backends")}
    print(f"  step ops B={b} ctx={ctx}: {json.dumps(summary)}", flush=True)
    for kind, ms in res["by_kind"].items():
        print(f"    {kind:40s} {ms:8.3f} ms", flush=True)
    bad = [r for r in res["ops"] if r["ms"] is None]
    if bad:
        print(f"    {len(bad)} ops could not be timed alone, first: {bad[0]}", flush=True)
    del e
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sections", default="correctness,moe,step_deepgemm,step_triton,step_mixed")
    args = ap.parse_args()
    res = {"sections": {}}
    needs_problem = bool({"correctness", "moe"} & set(args.sections.split(",")))
    gen = torch.Generator(device="cuda").manual_seed(0) if needs_problem else None
    problem = moe_problem(4096, gen) if needs_problem else None
    steps = {
        "correctness": lambda: correctness(gen, problem),
        "moe": lambda: moe_times(problem),
        "step_deepgemm": lambda: step_times(None),
        "step_triton": lambda: step_times({"fp8_gemm": "triton", "moe_experts": "triton"}),
        "step_mixed": lambda: step_times({"fp8_gemm": "deepgemm", "moe_experts": "triton"}),
        "jit_check": jit_check,
        "step_ops": step_ops,
        "step_ops_triton": lambda: step_ops({"fp8_gemm": "triton", "moe_experts": "triton"}),
    }
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            res["sections"][name] = steps[name]()
        except Exception as e:  # noqa: BLE001 - keep the other sections' results
            import traceback
            traceback.print_exc()
            res["sections"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        res["sections"][name + "_s"] = round(time.perf_counter() - t0, 1)
        json.dump(res, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
