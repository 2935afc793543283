"""Issue 18: every op the engine runs, the registry's choice against every other implementation usable here.

The 5-layer DeepSeek-V3 FP8 model is built as serving builds it (dummy weights, ``executor.weights.build_model``) and
each kernel op it calls is run at its real shapes, through ``kernels.ops`` (what the engine runs: the registry's
choice for that call, recorded from ``ops.used``) and through every other usable implementation of the op
(``registry.choose``), all in this process:

- ``fp8_gemm``: every distinct (N, K) of the model's FP8 linears at each ``--rows`` M (DeepGEMM's shapes compiled
  first in its process pool, ``kernels.warmup.precompile``);
- ``moe_experts``: a routed-expert layer (256 experts, top-8) at each M; DeepGEMM's fused path (masked layout up to
  128 tokens, contiguous above) is timed at every M, also where the registry declines it;
- ``mla_decode``: the decode attention at the decode batches (M <= 128), every sequence at ``--ctx`` tokens;
- ``attention_prefill``: MLA prefill chunks of the prefill sizes (M >= 4096) with no cached keys, and one chunk after
  cached context;
- the row-wise ops (``quant_fp8_act``, ``rms_norm``, ``rope``, ``silu_mul``) at each M, and the sampler.

Per op and shape: each implementation's device time (a CUDA-graph replay, CUDA events, median of ``--iters`` after
warm-up; where capture fails, e.g. FlashAttention-3's per-call ``cu_seqlens`` copy, back-to-back eager calls timed by
events, marked ``graph: false``), its relative error against ``kernels.reference`` where that is cheap, and
``choice_over_best`` = best time / choice's time (the target is >= 0.9), ``choice_over_best_vendor`` the same
against vendor libraries only, and the choice's fraction of the measured ceilings (FP8 1310 TFLOP/s, copy
4.11 TB/s: DOMAIN.md). The torch reference implementations of attention, MoE and MLA decode are not timed (they
loop or materialise the score matrix; they are the correctness references).

    python -m benchmarks.gpu.engine_ops --out engine_ops.json [--rows 64,128,4096,8192] [--ctx 4096] [--iters 30]
    python -m benchmarks.gpu.engine_ops --out /tmp/e.json --smoke      # the tiny model on the CPU (a check)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from kernels import ops, registry  # noqa: E402
from kernels import reference as R  # noqa: E402

CEIL = {"copy_tbs": 4.11, "fp8_tflops": 1310.0, "bf16_tflops": 741.0}   # DOMAIN.md, measured on the H200 2026-11-29
NOT_TIMED = {("attention_prefill", "torch"), ("moe_experts", "torch"), ("mla_decode", "torch"), ("fp8_gemm", "torch")}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def device_ms(fn, iters: int, cuda: bool) -> tuple[float, bool]:
    """Median ms of ``fn``: on CUDA a CUDA graph of it replayed, CUDA events (eager events where capture fails:
    ``serving_step.device_ms``); on the CPU the wall clock (the smoke check)."""
    if cuda:
        from benchmarks.gpu.serving_step import device_ms as cuda_ms
        return cuda_ms(fn, warm=3, iters=iters)
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, False


def candidates(op: str, device: str) -> list[registry.Impl]:
    """The usable implementations of ``op`` to time: on CUDA all but the slow references (``NOT_TIMED``)."""
    return [c for c in registry.choose(op, device).candidates if device != "cuda" or (op, c.name) not in NOT_TIMED]


def compare(op: str, shape: dict, via_ops, impls: dict, want, work: dict, iters: int, cuda: bool, extra: dict | None = None) -> dict:
    """Time the engine's choice (``via_ops``: the call through ``kernels.ops``) and each implementation of ``impls``
    (name -> callable), error of each against ``want`` (a tensor, a callable taking an output, or None)."""
    row = {"op": op, **shape, "impls": {}}
    ops.reset_used()
    out = via_ops()
    row["choice"] = ops.used.get(op, "?")
    row["fallback"] = ops.fallbacks.get(op, "")
    tiers = {c.name: c.tier for c in registry.IMPLS[op]}
    for name, fn in {**impls, **(extra or {})}.items():
        r: dict = {"tier": tiers.get(name, 2)}
        try:
            got = fn()
            if want is not None:
                r["rel_err"] = float(f"{want(got) if callable(want) else rel(got, want):.3g}")
            ms, graph = device_ms(fn, iters, cuda)
            r.update(ms=round(ms, 4), graph=graph)
            if "flops" in work:
                r["tflops"] = round(work["flops"] / ms / 1e9, 1)
                r["frac_fp8_peak"] = round(work["flops"] / ms / 1e9 / CEIL["fp8_tflops"], 3)
            if "bytes" in work:
                r["tbs"] = round(work["bytes"] / ms / 1e9, 3)
                r["frac_copy"] = round(work["bytes"] / ms / 1e9 / CEIL["copy_tbs"], 3)
        except Exception as e:  # noqa: BLE001 - the failure is the result
            r["error"] = f"{type(e).__name__}: {e}"[:300]
        row["impls"][name] = r
    del out
    timed = {k: v["ms"] for k, v in row["impls"].items() if "ms" in v}
    if row["choice"] in timed:
        best = min(timed, key=timed.get)
        row["best"] = best
        row["choice_over_best"] = round(timed[best] / timed[row["choice"]], 3)
        vend = {k: v for k, v in timed.items() if row["impls"][k]["tier"] == 2}
        if vend:
            bv = min(vend, key=vend.get)
            row["best_vendor"] = bv
            row["choice_over_best_vendor"] = round(vend[bv] / timed[row["choice"]], 3)
    ch = row["impls"].get(row["choice"], {})
    print(f"  {op:17s} {json.dumps(shape):40s} choice {row['choice']:9s} "
          + "  ".join(f"{k} {v.get('ms', v.get('error', '?'))}" for k, v in row["impls"].items())
          + f"  -> {row.get('choice_over_best', '?')} of best"
          + (f", {ch['frac_fp8_peak']} of FP8 peak" if "frac_fp8_peak" in ch else "")
          + (f", {ch['frac_copy']} of copy" if "frac_copy" in ch else ""), flush=True)
    return row


def build(model: str, layers: int, device: torch.device, fp8: bool):
    from executor.model_config import ExecModelConfig, resolve_spec
    from executor.weights import build_model
    spec = resolve_spec(model)
    kinds = spec.layer_kinds[:layers] if spec.layer_kinds else []
    spec = spec.model_copy(update={"num_layers": layers, "layer_kinds": kinds})
    cfg = ExecModelConfig.build(spec, None)
    return cfg, build_model(cfg, device, "fp8" if fp8 else "bf16", "dummy", 0, 0.0, max_pos=16384)


def fp8_linears(net) -> list:
    seen, mods = set(), []
    for m in net.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, torch.Tensor) and w.dtype == torch.float8_e4m3fn and hasattr(m, "weight_scale_inv"):
            if tuple(w.shape) not in seen:
                seen.add(tuple(w.shape))
                mods.append(m)
    return mods


def section_gemm(net, rows, dev, iters, cuda, log) -> list[dict]:
    from kernels import warmup
    mods = fp8_linears(net)
    if cuda:
        items = [warmup.WarmItem("fp8_gemm", m, mod.weight.shape[0], mod.weight.shape[1], module=mod) for mod in mods for m in rows]
        warmup.precompile(items, dev, log)
    out = []
    g = torch.Generator(device=dev).manual_seed(0)
    for mod in mods:
        n, k = mod.weight.shape
        for m in rows:
            xq, xs = R.quant_fp8_act(torch.randn(m, k, device=dev, generator=g))
            w, ws = mod.weight, mod.weight_scale_inv
            want = R.fp8_gemm_blockscaled(xq, xs, w, ws, torch.float32)
            impls = {c.name: (lambda f=registry.load(c): f(xq, xs, w, ws, torch.bfloat16)) for c in candidates("fp8_gemm", dev.type)}
            work = {"flops": 2 * m * n * k, "bytes": m * k + n * k + 2 * m * n}
            out.append(compare("fp8_gemm", {"m": m, "n": n, "k": k}, lambda: ops.fp8_gemm(xq, xs, w, ws, torch.bfloat16),
                               impls, want, work, iters, cuda))
    return out


def section_moe(net, rows, dev, iters, cuda) -> list[dict]:
    moe = next((m for m in net.modules() if getattr(m, "w13", None) is not None), None)
    if moe is None:
        return [{"op": "moe_experts", "error": "the model has no routed experts"}]
    w13, w2, s13, s2 = moe.w13, moe.w2, getattr(moe, "w13_scale_inv", None), getattr(moe, "w2_scale_inv", None)
    e, two_i, d = w13.shape
    top_k = min(8, e)
    out = []
    g = torch.Generator(device=dev).manual_seed(1)
    for t in rows:
        x = torch.randn(t, d, device=dev, generator=g).to(torch.bfloat16)
        ids = torch.rand(t, e, device=dev, generator=g).topk(top_k, dim=-1).indices
        wts = torch.rand(t, top_k, device=dev, generator=g)
        sub = slice(0, min(t, 128))
        ref = R.moe_experts(x[sub].float(), wts[sub], ids[sub], w13, w2, s13, s2)
        impls = {c.name: (lambda f=registry.load(c): f(x, wts, ids, w13, w2, s13, s2)) for c in candidates("moe_experts", dev.type)}
        extra = {}
        if "deepgemm" in impls:   # the fused DeepGEMM path at every size (the registry's adapter declines decode sizes)
            from kernels.vendor import deepgemm_fused_moe
            impls.pop("deepgemm")
            extra["deepgemm"] = lambda: deepgemm_fused_moe(x, wts, ids, w13, w2, s13, s2)
        touched = int(torch.unique(ids).numel())
        work = {"flops": 2 * t * top_k * 3 * d * (two_i // 2), "bytes": touched * 3 * d * (two_i // 2) * w13.element_size()}
        out.append(compare("moe_experts", {"m": t, "experts": e, "top_k": top_k, "touched": touched},
                           lambda: ops.moe_experts(x, wts, ids, w13, w2, s13, s2), impls, lambda o: rel(o[sub], ref), work,
                           iters, cuda, extra))
    return out


def section_mla_decode(cfg, rows, ctx, dev, iters, cuda) -> list[dict]:
    m = cfg.spec.mla
    h, rank, dr = cfg.spec.num_attention_heads, m.kv_lora_rank, m.qk_rope_head_dim
    page = 64
    out = []
    g = torch.Generator(device=dev).manual_seed(2)
    for b in [r for r in rows if r <= 128]:
        pages = -(-ctx // page)
        cache = torch.randn(b * pages + 8, page, rank + dr, device=dev, generator=g).to(torch.bfloat16)
        table = torch.randperm(b * pages + 8, device=dev, generator=g)[: b * pages].view(b, pages).to(torch.int32)
        lens = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        q = torch.randn(b, 1, h, rank + dr, device=dev, generator=g).to(torch.bfloat16)
        scale = (m.qk_nope_head_dim + dr) ** -0.5
        want = R.mla_decode_paged(q.float(), cache.float(), table, lens, scale, rank)
        impls = {c.name: (lambda f=registry.load(c): f(q, cache, table, lens, scale, rank)) for c in candidates("mla_decode", dev.type)}
        work = {"bytes": b * ctx * (rank + dr) * 2}
        out.append(compare("mla_decode", {"m": b, "ctx": ctx, "heads": h}, lambda: ops.mla_decode(q, cache, table, lens, scale, rank),
                           impls, want, work, iters, cuda))
        del cache
    return out


def section_prefill_attention(cfg, rows, dev, iters, cuda) -> list[dict]:
    m = cfg.spec.mla
    h, dqk, dv = cfg.spec.num_attention_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    out = []
    g = torch.Generator(device=dev).manual_seed(3)
    cases = [(r, 0) for r in rows if r >= 1024] + ([(1024, 3072)] if cuda else [(8, 24)])
    for new, cached in cases:
        q = torch.randn(new, h, dqk, device=dev, generator=g).to(torch.bfloat16)
        k = torch.randn(new + cached, h, dqk, device=dev, generator=g).to(torch.bfloat16)
        v = torch.randn(new + cached, h, dv, device=dev, generator=g).to(torch.bfloat16)
        pos = torch.arange(cached, cached + new, device=dev)
        scale = dqk ** -0.5
        want = R.attention(q.float(), k.float(), v.float(), pos, scale, None) if new * (new + cached) <= 1024 * 4096 else None
        impls = {c.name: (lambda f=registry.load(c): f(q, k, v, pos, scale, None, True)) for c in candidates("attention_prefill", dev.type)}
        pairs = new * cached + new * (new + 1) // 2
        work = {"flops": 2 * h * pairs * (dqk + dv)}
        row = compare("attention_prefill", {"m": new, "cached": cached, "heads": h},
                      lambda: ops.attention_prefill(q, k, v, pos, scale, None, bottom_right=True), impls, want, work, iters, cuda)
        for r in row["impls"].values():   # attention is bf16: against the BF16 peak, not FP8's
            if "tflops" in r:
                r["frac_bf16_peak"] = round(r.pop("frac_fp8_peak") * CEIL["fp8_tflops"] / CEIL["bf16_tflops"], 3)
        out.append(row)
    return out


def section_rowwise(net, cfg, rows, dev, iters, cuda) -> list[dict]:
    d = cfg.spec.hidden_size
    inter = cfg.spec.intermediate_size
    mla = next((x for x in net.modules() if getattr(x, "cos_sin", None) is not None and hasattr(x, "interleave")), None)
    h, dr = cfg.spec.num_attention_heads, cfg.spec.mla.qk_rope_head_dim
    out = []
    g = torch.Generator(device=dev).manual_seed(4)
    for m in rows:
        x = torch.randn(m, d, device=dev, generator=g).to(torch.bfloat16)
        w = torch.randn(d, device=dev, generator=g).to(torch.bfloat16)
        gate = torch.randn(m, inter, device=dev, generator=g).to(torch.bfloat16)
        up = torch.randn(m, inter, device=dev, generator=g).to(torch.bfloat16)
        cases = [
            ("quant_fp8_act", (x,), {"bytes": m * d * 2 + m * d + m * d // 128 * 4}, lambda o, x=x: rel(R.dequant_fp8_act(*o), x.float())),
            ("rms_norm", (x, w, 1e-6), {"bytes": 2 * m * d * 2}, R.rms_norm(x.float(), w.float(), 1e-6)),
            ("silu_mul", (gate, up), {"bytes": 3 * m * inter * 2}, R.silu_mul(gate.float(), up.float())),
        ]
        if mla is not None:
            pe = torch.randn(m, h + 1, dr, device=dev, generator=g).to(torch.bfloat16)
            pos = torch.randint(0, 4096, (m,), device=dev, generator=g)
            rows_cs = mla.cos_sin[pos]
            cases.append(("rope", (pe, pos, mla.cos_sin, mla.interleave, rows_cs), {"bytes": 2 * m * (h + 1) * dr * 2},
                          R.rope(pe.float(), pos, mla.cos_sin, mla.interleave, rows_cs)))
        for op, args, work, want in cases:
            impls = {c.name: (lambda f=registry.load(c), a=args: f(*a)) for c in candidates(op, dev.type)}
            fn = getattr(ops, op)
            out.append(compare(op, {"m": m}, lambda fn=fn, a=args: fn(*a), impls, want, work, iters, cuda))
    vocab = cfg.spec.vocab_size
    for m in [r for r in rows if r <= 128]:
        logits = torch.randn(m, vocab, device=dev, generator=g)
        knobs = [torch.full((m,), 0.8), torch.full((m,), 50, dtype=torch.long), torch.full((m,), 0.95)]
        gens = [None] * m
        impls = {c.name: (lambda f=registry.load(c): f(logits, *knobs, gens)) for c in candidates("sampling", dev.type)}
        out.append(compare("sampling", {"m": m, "vocab": vocab}, lambda: ops.sample(logits, *knobs, gens), impls, None,
                           {"bytes": m * vocab * 4}, iters, cuda))
    return out


def fp8_ceiling(rows: list[dict]) -> tuple[float, str]:
    """The FP8 ceiling to judge against: the measured one (``CEIL``), or the best FP8 rate a kernel reached in this run
    where that is higher (a ceiling a kernel beats was not the ceiling), with where it came from."""
    best, where = CEIL["fp8_tflops"], "measured 2026-11-29 (DOMAIN.md)"
    for r in rows:
        for name, v in r.get("impls", {}).items():
            if r["op"] in ("fp8_gemm", "moe_experts") and v.get("tflops", 0) > best:
                best, where = v["tflops"], f"{name} {r['op']} m={r['m']}" + (f" n={r['n']} k={r['k']}" if "n" in r else "") + " in this run"
    return best, where


def summary(rows: list[dict]) -> list[str]:
    fp8, fp8_from = fp8_ceiling(rows)
    lines = [f"FP8 ceiling {fp8:.0f} TFLOP/s: {fp8_from}",
             f"{'op':17s} {'shape':34s} {'choice':10s} {'best':10s} {'x best':>7s} {'x vendor':>8s} {'ceiling':>12s}"]
    for r in rows:
        if "choice" not in r:
            lines.append(f"{r.get('op', '?'):17s} error: {r.get('error', '')[:80]}")
            continue
        shape = ",".join(f"{k}={v}" for k, v in r.items() if k in ("m", "n", "k", "ctx", "cached", "touched"))
        ch = r["impls"].get(r["choice"], {})
        ceil = (f"{ch['frac_copy']:.2f} copy" if r["m"] <= 128 and "frac_copy" in ch   # decode sizes: bandwidth-bound
                else f"{ch['tflops'] / fp8:.2f} FP8" if "frac_fp8_peak" in ch else f"{ch['frac_bf16_peak']:.2f} BF16" if "frac_bf16_peak" in ch
                else f"{ch['frac_copy']:.2f} copy" if "frac_copy" in ch else "")
        lines.append(f"{r['op']:17s} {shape:34s} {r['choice']:10s} {r.get('best', '-'):10s} {r.get('choice_over_best', float('nan')):7.3f} "
                     f"{r.get('choice_over_best_vendor', float('nan')):8.3f} {ceil:>12s}")
    worst = {}
    for r in rows:
        if "choice_over_best" in r:
            band = "decode" if r["m"] <= 128 else "prefill" if r["m"] >= 4096 else "other"
            key = (r["op"], band)
            worst[key] = min(worst.get(key, 9.9), r["choice_over_best"])
    lines.append("worst choice/best per op and band: " + ", ".join(f"{o} {b} {v:.3f}" for (o, b), v in sorted(worst.items())))
    below = [r for r in rows if r.get("choice_over_best", 1.0) < 0.9 and (r["m"] <= 128 or r["m"] >= 4096)]
    lines.append(f"below 0.9x at decode/prefill shapes: {len(below)}"
                 + "".join(f"\n  {r['op']} m={r['m']}{' n=' + str(r['n']) if 'n' in r else ''}: {r['choice']} {r['choice_over_best']} of {r['best']}"
                           for r in below))
    return lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--rows", default=None, help="token counts: decode (<= 128) and prefill (>= 4096); default 64,128,4096,8192 "
                    "(--smoke: 4,16)")
    ap.add_argument("--ctx", type=int, default=4096, help="decode context per sequence (mla_decode)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--sections", default="gemm,moe,mla_decode,prefill_attention,rowwise")
    ap.add_argument("--smoke", action="store_true", help="the tiny model on the CPU, small rows (checks the harness)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.model, a.layers, a.iters, a.ctx = "tiny", 2, 3, 256
    a.rows = a.rows or ("4,16" if a.smoke else "64,128,4096,8192")
    cuda = torch.cuda.is_available() and not a.smoke
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    try:
        rows = [int(x) for x in a.rows.split(",")]
    except ValueError:
        rows = []
    if not rows or any(r < 1 or r > 65536 for r in rows):
        ap.error(f"--rows: comma-separated token counts in 1..65536, got {a.rows!r}")
    res: dict = {"command": " ".join(sys.argv), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if cuda else "cpu", "model": a.model,
                 "layers": a.layers, "rows": rows, "ctx": a.ctx, "iters": a.iters, "ceilings": CEIL, "rows_out": []}
    cfg, net = build(a.model, a.layers, dev, fp8=True)
    res["libraries"] = {k: registry.probe_library(k)[:2] for k in ("deepgemm", "flashmla", "fa3", "triton")}
    path = Path(a.out)
    want = set(a.sections.split(","))
    sections = [("gemm", lambda: section_gemm(net, rows, dev, a.iters, cuda, print)),
                ("moe", lambda: section_moe(net, rows, dev, a.iters, cuda)),
                ("mla_decode", lambda: section_mla_decode(cfg, rows, a.ctx, dev, a.iters, cuda)),
                ("prefill_attention", lambda: section_prefill_attention(cfg, rows, dev, a.iters, cuda)),
                ("rowwise", lambda: section_rowwise(net, cfg, rows, dev, a.iters, cuda))]
    with torch.inference_mode():
        for name, fn in sections:
            if name not in want:
                continue
            print(f"== {name}", flush=True)
            t0 = time.perf_counter()
            try:
                res["rows_out"] += fn()
            except Exception as e:  # noqa: BLE001 - one section's failure keeps the others
                traceback.print_exc()
                res["rows_out"].append({"op": name, "error": f"{type(e).__name__}: {e}"[:400]})
            res.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 1)
            path.write_text(json.dumps(res, indent=1))
            if cuda:
                torch.cuda.empty_cache()
    res["summary"] = summary(res["rows_out"])
    path.write_text(json.dumps(res, indent=1))
    print("\n".join(res["summary"]), flush=True)
    return res


if __name__ == "__main__":
    main()
