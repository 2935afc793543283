"""Issue 18 on the GPU: vendor paths vs the torch reference, the fused MoE vs Triton, and a 5-layer
DeepSeek-V3 FP8 decode step at batch 64 / context 4k with DeepGEMM on the serving path vs Triton.

Sections (each written to the JSON as soon as it finishes, so a timeout keeps what ran):
- ``correctness``: relative error of every vendor path against ``kernels.reference`` on the same
  quantised operands (DeepGEMM dense, fused MoE masked and contiguous, FlashMLA);
- ``moe``: the MoE layer (256 experts, top-8, 7168/2048, FP8) at 64 and 4096 tokens, DeepGEMM fused vs
  Triton, device time from a CUDA-graph replay (also proves the fused path captures), CUDA events;
- ``step``: engines built through ``LLMEngine.from_args`` (JIT warm-up + graph capture as serving
  does), one per kernel choice; decode step at B=64, every sequence at 4096 tokens of context:
  graph-replay device time (CUDA events) and whole-step wall (inputs + replay + logits + argmax).
Usage: python -m benchmarks.gpu.serving_step OUT.json [--sections correctness,moe,step_deepgemm,step_triton]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.gpu.bench_kernels import rel, timed
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
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                with torch.cuda.graph(g, stream=s):
                    fn()
            torch.cuda.synchronize()
            run, captured = g.replay, True
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
        out[f"deepgemm fused moe {layout} T={t}"] = rel(vendor.deepgemm_moe_experts(x[:t], wts[:t], ids[:t], w13, w2, s13, s2), want)
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
        for name, fn in (("deepgemm_fused", vendor.deepgemm_moe_experts), ("triton", tri)):
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


def step_times(overrides: dict | None, ctx: int = 4096, b: int = 64, iters: int = 20) -> dict:
    from executor.engine import LLMEngine
    from executor.forward_batch import SeqInput, build_forward_batch
    ops.clear_choices()
    t0 = time.perf_counter()
    pages = -(-(ctx + 1) // 64)
    e = LLMEngine.from_args("deepseek-v3", device="cuda", dtype="fp8", num_layers=5, max_model_len=ctx + 64,
                            num_kv_blocks=b * pages + 16, kernel_overrides=overrides,
                            scheduler_config={"max_num_seqs": b, "max_num_batched_tokens": 8192, "block_size": 64})
    build_s = time.perf_counter() - t0
    r, g = e.runner, e.runner.graphs
    model, kv = r.model, r.kv
    seqs = [SeqInput([17 * i + 3], ctx, list(range(i * pages, (i + 1) * pages)), True) for i in range(b)]
    replay, wall = [], []
    with torch.inference_mode():
        for it in range(3 + iters):
            torch.cuda.synchronize()
            w0 = time.perf_counter()
            batch = build_forward_batch(seqs, r.page_size, kv.null_page, r.device)
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            rep = g.run(batch) if g is not None else None
            hidden = rep[0] if rep is not None else model(batch, kv)
            z.record()
            model.compute_logits(hidden).argmax(-1).tolist()
            if it >= 3:
                replay.append(a.elapsed_time(z))
                wall.append(1e3 * (time.perf_counter() - w0))
    res = {"overrides": overrides, "build_s": round(build_s, 1), "graph": rep is not None,
           "forward_ms": round(statistics.median(replay), 3), "step_wall_ms": round(statistics.median(wall), 3),
           "backends": dict(g.backends.get(max(g.captured), {})) if g is not None and g.captured else ops.reset_used(),
           "capture_s": getattr(g, "capture_s", None)}
    print(f"  step B={b} ctx={ctx} {overrides}: {res}", flush=True)
    del e, r, g, model, kv
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sections", default="correctness,moe,step_deepgemm,step_triton,step_mixed")
    args = ap.parse_args()
    res = {"sections": {}}
    gen = torch.Generator(device="cuda").manual_seed(0)
    problem = moe_problem(4096, gen) if {"correctness", "moe"} & set(args.sections.split(",")) else None
    steps = {
        "correctness": lambda: correctness(gen, problem),
        "moe": lambda: moe_times(problem),
        "step_deepgemm": lambda: step_times(None),
        "step_triton": lambda: step_times({"fp8_gemm": "triton", "moe_experts": "triton"}),
        "step_mixed": lambda: step_times({"fp8_gemm": "deepgemm", "moe_experts": "triton"}),
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
