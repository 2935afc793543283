"""Issue 18: the Triton MoE's rows per block (``block_m``) against the token count, DeepSeek-V3's routed experts
(256 experts, top-8, D=7168, 2I=4096, FP8 128x128 blocks). Each expert's run of token-expert pairs is padded to
``block_m`` rows and every block reads its expert's whole weights, so a block too large computes padding and one too
small reads an expert's weights once per block. The engine's rule (``default_block_m``) switches from 16 to 64 above
4 pairs per expert (128 tokens), where 129-1024 tokens average 4-32 pairs an expert.

Median device ms of a CUDA-graph replay (CUDA events after warm-up) per token count and block_m, the rule's pick
marked, and the error against block_m 16's output (same kernel, other tiling).

    python -m benchmarks.gpu.moe_block_m OUT.json [--tokens 64,128,129,192,256,384,512,768,1024,2048] [--iters 20]
        [--deepgemm]   # and the DeepGEMM path at each count: where the registry's Triton -> DeepGEMM switch belongs
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.gpu.serving_step import E, TOPK, device_ms, moe_problem
from kernels import triton_grouped_gemm as G


def _deepgemm_ms(x, w, ids, w13, w2, s13, s2, iters: int, ref) -> dict:
    """The registry's DeepGEMM MoE path at these tokens (forced): device ms, or why it did not run."""
    from kernels import registry, vendor
    registry.configure({"moe_experts": "deepgemm"})
    try:
        fn = lambda: vendor.deepgemm_moe_experts(x, w, ids.to(torch.int32), w13, w2, s13, s2)  # noqa: E731
        ms, graph = device_ms(fn, iters=iters)
        out = fn().float()
        return {"ms": round(ms, 4), "graph": graph, "rel_err": float((out - ref).norm() / ref.norm().clamp_min(1e-12))}
    except Exception as e:  # noqa: BLE001 - a missing vendor library is a row without the figure, not a failed bench
        return {"ms": None, "why": f"{type(e).__name__}: {str(e)[:160]}"}
    finally:
        registry.configure(None)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", default="64,128,129,192,256,384,512,768,1024,2048")
    ap.add_argument("--blocks", default="16,32,64")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--deepgemm", action="store_true", help="also time the registry's DeepGEMM path (moe_experts="
                    "deepgemm forced, so decode-sized batches take its masked layout): where the Triton -> DeepGEMM switch "
                    "(registry._FUSED_MOE_MIN_TOKENS) belongs")
    a = ap.parse_args(argv)
    toks = [int(x) for x in a.tokens.split(",")]
    blocks = [int(x) for x in a.blocks.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    t0 = time.perf_counter()
    x, wts, ids, w13, w2, s13, s2 = moe_problem(max(toks), gen)
    print(f"weights built in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for t in toks:
        xt, wt, it = x[:t].contiguous(), wts[:t].contiguous(), ids[:t].contiguous()
        ref = G.moe_experts(xt, wt, it, w13, w2, s13, s2, block_m=16).float()
        row = {"tokens": t, "pairs_per_expert": t * TOPK / E, "rule": G.default_block_m(t, TOPK, E), "ms": {}, "rel_err": {}}
        for bm in blocks:
            fn = lambda: G.moe_experts(xt, wt, it, w13, w2, s13, s2, block_m=bm)  # noqa: E731,B023
            ms, graph = device_ms(fn, iters=a.iters)
            out = fn().float()
            row["ms"][bm] = round(ms, 4)
            row["rel_err"][bm] = float((out - ref).norm() / ref.norm().clamp_min(1e-12))
            row.setdefault("graph", {})[bm] = graph
        if a.deepgemm:
            row["deepgemm"] = _deepgemm_ms(xt, wt, it, w13, w2, s13, s2, a.iters, ref)
        best = min(row["ms"], key=row["ms"].get)
        row["best"] = best
        print(f"tokens {t:5d} ({row['pairs_per_expert']:5.1f} pairs/expert): "
              + "  ".join(f"bm{bm} {row['ms'][bm]:7.3f} ms" + ("*" if bm == row["rule"] else "") for bm in blocks)
              + f"  | best {best}, rule {row['rule']} ({row['ms'][row['rule']] / row['ms'][best]:.2f}x best)"
              + (f"  | deepgemm {row['deepgemm']['ms']:.3f} ms" if row.get("deepgemm", {}).get("ms") else ""), flush=True)
        rows.append(row)
    doc = {"benchmark": "moe_block_m", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "experts": E,
           "top_k": TOPK, "rows": rows, "total_s": time.perf_counter() - t0}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    return doc


if __name__ == "__main__":
    main()
