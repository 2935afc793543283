"""Decode step time, eager vs CUDA graphs, DeepSeek-V3 first 5 layers (3 dense + 2 MoE), FP8, dummy weights.

One engine built through ``LLMEngine.from_args`` (the path ``twinfer run`` takes) with graphs
captured; each batch size runs the same decode step both ways on the same weights and KV:
host inputs (``build_forward_batch``) + forward (graph replay or eager) + logits + greedy
argmax read back (``.tolist()``, the step's sync). Context 1024 tokens per sequence.
Usage: python scripts/device_graphs.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from executor.engine import LLMEngine
from executor.forward_batch import SeqInput, build_forward_batch
from kernels import ops

BATCHES = [1, 2, 3, 4, 8, 16, 32, 48, 64, 100, 128]
CTX, ITERS, WARM = 1024, 20, 3


def build(overrides=None):
    t0 = time.perf_counter()
    e = LLMEngine.from_args("deepseek-v3", device="cuda", dtype="fp8", num_layers=5, max_model_len=2048,
                            num_kv_blocks=4096, kernel_overrides=overrides,
                            scheduler_config={"max_num_seqs": 128, "max_num_batched_tokens": 8192, "block_size": 64})
    return e, time.perf_counter() - t0


def main(out_path: str) -> None:
    e, build_s = build()
    g = e.runner.graphs
    overrides = None
    if g is None or not g.captured:   # e.g. a vendor kernel refused capture everywhere: retry on Triton MLA
        print("no graph captured:", g.failed if g else None, "-> retry with mla_decode=triton", flush=True)
        overrides = {"mla_decode": "triton"}
        del e
        torch.cuda.empty_cache()
        e, build_s = build(overrides)
        g = e.runner.graphs
    r = e.runner
    model, kv, page = r.model, r.kv, r.page_size
    pages = -(-(CTX + 1) // page)
    res = {"batches": {}, "capture": {"captured": g.captured, "failed": g.failed, "capture_s": g.capture_s,
                                      "max_pages": g.max_pages, "backends": g.backends.get(max(g.captured or [0]), {})},
           "build_s": build_s, "kernel_overrides": overrides, "context_len": CTX, "iters": ITERS}
    gen = torch.Generator().manual_seed(0)

    def step(seqs, graphs: bool):
        batch = build_forward_batch(seqs, page, kv.null_page, r.device)
        rep = g.run(batch) if graphs else None
        hidden = rep[0] if rep is not None else model(batch, kv)
        toks = model.compute_logits(hidden).argmax(-1).tolist()
        return toks, rep is not None, hidden

    with torch.inference_mode():
        for b in BATCHES:
            toks_in = torch.randint(0, 100000, (b,), generator=gen).tolist()
            seqs = [SeqInput([toks_in[i]], CTX, list(range(i * pages, (i + 1) * pages)), True) for i in range(b)]
            row = {}
            outs = {}
            for mode in ("eager", "graph"):
                ts, used = [], None
                for it in range(WARM + ITERS):
                    ops.reset_used()
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    toks, replayed, hidden = step(seqs, mode == "graph")
                    dt = time.perf_counter() - t0
                    if it >= WARM:
                        ts.append(dt)
                used = ops.reset_used()
                outs[mode] = (toks, hidden.float().clone())
                row[mode] = {"median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts),
                             "p90_ms": 1e3 * sorted(ts)[int(0.9 * (len(ts) - 1))], "replayed": replayed}
                if mode == "eager":
                    row["eager_backends"] = used
            row["speedup"] = row["eager"]["median_ms"] / row["graph"]["median_ms"]
            row["graph_bs"] = next((s for s in g.captured if s >= b), None)
            row["tokens_equal_frac"] = sum(x == y for x, y in zip(outs["eager"][0], outs["graph"][0])) / b
            row["hidden_max_abs_diff"] = float((outs["eager"][1] - outs["graph"][1]).abs().max())
            res["batches"][str(b)] = row
            print(f"B={b:4d} eager {row['eager']['median_ms']:7.2f} ms  graph {row['graph']['median_ms']:7.2f} ms "
                  f"(bs {row['graph_bs']}, replayed {row['graph']['replayed']})  x{row['speedup']:.2f}  "
                  f"tok_eq {row['tokens_equal_frac']:.2f}  dh {row['hidden_max_abs_diff']:.3g}", flush=True)
    json.dump(res, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
