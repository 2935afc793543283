"""DSA and MTP steps through the piecewise CUDA graphs against eager, on the GPU (issue 18: no decode path eager).

Two engines, one after the other, each built as ``serve`` builds it (dummy weights, FP8, the first ``--layers``
layers, decode graphs and piecewise graphs captured at start, the kernel JIT warm-up first):

1. DeepSeek-V3.2 (DSA): decode-only steps at b = 1 / 8 / 64 with every sequence at 4096 tokens of context (past the
   indexer's top-k of 2048: top-k and sparse attention run) and at 1024 (within it: dense attention, no top-k), and
   prompt chunks of 512 tokens over 3072 cached and 2048 new. The whole forward eagerly (``model(batch, kv)``, what
   these models ran before) against the piecewise graphs (``PiecewiseGraphs.run``).
2. DeepSeek-V3 with its MTP layer, ``draft_len`` 1: the MTP layer's draft forward over an MTP step's rows
   (b decodes of 2 queries at 4096 context) and over a chain step (b rows of 1 query), eagerly
   (``model.mtp_forward``) against its two pieces (``PiecewiseGraphs.run_mtp``).

A step whose tokens do not fill their bucket (the mixed step: padding rows) is also run through the same pieces
uncaptured (``capture=False``: eager, padded), which splits its difference from eager into the padding's numerics
(padded against unpadded, no graphs) and the graphs' (captured against uncaptured, same padding); on the DSA model
each layer's indexer top-k is compared too (the share of selected keys that differ), since a top-k near a tie
turns a rounding difference of its scores into a different set of keys. The V3 (MTP) engine runs the same mixed
step, eager against pieces: the padding's numerics without an indexer.

Each shape: the same batch both ways, in the same process; per way the median over ``--repeats`` timed calls after
3 untimed ones of the host wall of one call (issue and wait: ``torch.cuda.synchronize`` after it) and of the CUDA-event
span around it, and the largest absolute difference of the outputs over the largest absolute value (relative error;
bf16 activations, dummy weights). KV latents and indexer keys are random normals.

    python -m benchmarks.gpu.graph_coverage --out graph_coverage.json [--layers 5] [--repeats 30]
    python -m benchmarks.gpu.graph_coverage --out /tmp/g.json --smoke --repeats 2     # CPU check of the script
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PAGE = 64
# the shapes (GPU); ``--smoke`` swaps in small ones for ``tiny`` on the CPU (pieces uncaptured, no CUDA events)
SIZES = {"ctx": (4096, 1024), "batch": (1, 8, 64), "prefill": ((512, 3072), (2048, 0)), "mixed": (32, 4096, (512, 3072)),
         "blocks": 4400, "max_model_len": 8192, "tokens": 4096, "seqs": 64, "device": "cuda", "dtype": "fp8"}
SMOKE = {"ctx": (100, 30), "batch": (1, 4), "prefill": ((20, 70), (40, 0)), "mixed": (2, 100, (20, 70)),
         "blocks": 96, "max_model_len": 256, "tokens": 96, "seqs": 8, "device": "cpu", "dtype": "fp32"}


def _engine(model: str, layers: int | None, draft_len: int):
    from executor.engine import LLMEngine
    from scheduler.config import SchedulerConfig
    z = SIZES
    sc = SchedulerConfig(max_num_seqs=z["seqs"], max_num_batched_tokens=z["tokens"], max_model_len=z["max_model_len"],
                         draft_len=draft_len, async_overlap=False, block_size=PAGE)
    cuda = z["device"] == "cuda"
    e = LLMEngine.from_args(model, load_format="dummy", device=z["device"], dtype=z["dtype"], seed=0,
                            max_model_len=z["max_model_len"], num_kv_blocks=z["blocks"], scheduler_config=sc,
                            num_layers=layers, cuda_graphs=cuda, piecewise_graphs=cuda)
    if not cuda:   # the same pieces, uncaptured
        e.runner.enable_piecewise_graphs(z["tokens"], capture=False, log=lambda s: None, mtp=draft_len > 0)
    return e


def _batch(kv, decode_ctx: list[int], prefills: list[tuple[int, int]], sq: int, vocab: int):
    """Decodes at ``decode_ctx`` (``sq`` queries each) then prompt chunks (new, cached), each on its own pages."""
    import torch

    from executor.forward_batch import build_forward_batch, synthetic_seqs
    seqs, pages = synthetic_seqs(decode_ctx, prefills, sq, vocab, PAGE, seed=len(decode_ctx) * 31 + len(prefills) + sq)
    if pages > kv.null_page:
        raise ValueError(f"{pages} KV pages needed, {kv.null_page} there")
    return build_forward_batch(seqs, PAGE, kv.null_page, torch.device(SIZES["device"]))


def _time(fn, repeats: int) -> tuple[float, float]:
    """(median host wall ms of one call including the wait for the device, median CUDA-event span ms; on the CPU the
    wall twice)."""
    import torch
    cuda = SIZES["device"] == "cuda"
    for _ in range(3):
        fn()
    if cuda:
        torch.cuda.synchronize()
    walls, spans = [], []
    for _ in range(repeats):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            a.record()
            fn()
            b.record()
            b.synchronize()
            spans.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
        walls.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(walls), statistics.median(spans or walls)


def _rel(got, want) -> float:
    g, w = got.float(), want.float()
    return float((g - w).abs().max() / w.abs().max().clamp_min(1e-30))


def _row(name: str, eager, pieces, repeats: int) -> dict:
    import torch
    with torch.inference_mode():
        want = eager().clone()
        got = pieces().clone()
        ew, es = _time(eager, repeats)
        pw, ps = _time(pieces, repeats)
    r = {"shape": name, "eager_wall_ms": round(ew, 3), "eager_span_ms": round(es, 3), "pieces_wall_ms": round(pw, 3),
         "pieces_span_ms": round(ps, 3), "speedup_wall": round(ew / pw, 3), "rel_err": _rel(got, want)}
    print(f"  {name:44s} eager {ew:8.3f} ms (span {es:8.3f}) | pieces {pw:8.3f} ms (span {ps:8.3f}) | "
          f"x{ew / pw:5.2f} | rel err {r['rel_err']:.2e}", flush=True)
    return r


def _topk_trace(net, fn):
    """(fn's output, per layer the indexer's selection: decode top-k ``[B, s_q, k]`` or None, and a key mask per
    prefill span) recorded while ``fn`` runs."""
    layers = [l.self_attn.indexer for l in net.model.layers if getattr(l.self_attn, "indexer", None) is not None]
    seen: list[list] = [[] for _ in layers]
    saved = [ix.select for ix in layers]
    for i, ix in enumerate(layers):
        def rec(*a, _orig=saved[i], _i=i, **k):
            dec, masks = _orig(*a, **k)
            seen[_i].append((None if dec is None else dec.clone(), [None if m is None else m.clone() for m in masks]))
            return dec, masks
        ix.select = rec
    try:
        out = fn().clone()
    finally:
        for ix in layers:
            del ix.select          # the instance attribute goes; the class method is back
    return out, [s[-1] if s else (None, []) for s in seen]


def _topk_diff(a, b) -> list[dict]:
    """Per layer: the share of decode top-k keys (as sets per query) and of prefill mask entries that differ."""
    import torch
    rows = []
    for (da, ma), (db, mb) in zip(a, b):
        r = {}
        if da is not None and db is not None:
            x, y = da.flatten(0, 1).long(), db.flatten(0, 1).long()
            width = int(max(x.max(), y.max())) + 2
            hx = torch.zeros(x.shape[0], width, dtype=torch.bool, device=x.device).scatter_(1, x.clamp_min(-1) + 1, True)
            hy = torch.zeros_like(hx).scatter_(1, y.clamp_min(-1) + 1, True)
            r["decode_keys_differ"] = float((hx ^ hy)[:, 1:].sum() / (2 * hx[:, 1:].sum().clamp_min(1)))
        diffs = [float((p ^ q).sum() / (2 * p.sum().clamp_min(1))) for p, q in zip(ma, mb) if p is not None and q is not None]
        if diffs:
            r["prefill_keys_differ"] = max(diffs)
        rows.append(r)
    return rows


def _padding_split(name: str, net, kv, b, pw) -> dict:
    """A padded step's difference from eager, split: eager padded (the same pieces uncaptured) against eager, and the
    captured pieces against it; on a DSA model each layer's top-k against eager's."""
    import torch

    from executor import piecewise_graphs as pg
    size = pg.bucket_for(b.num_tokens, pw.captured)
    if size is None or size == b.num_tokens:
        return {}
    loose = pg.PiecewiseGraphs(net, kv, torch.device(SIZES["device"]), [size], capture=False, log=lambda s: None, mtp=False)
    with torch.inference_mode():
        want, t_eager = _topk_trace(net, lambda: net(b, kv))
        padded, t_padded = _topk_trace(net, lambda: loose.run(b)[0])
        got, t_pieces = _topk_trace(net, lambda: pw.run(b)[0])
    del loose
    r = {"tokens": b.num_tokens, "bucket": size, "rel_err_padded_vs_eager": _rel(padded, want),
         "rel_err_pieces_vs_padded": _rel(got, padded)}
    if any(d is not None or m for d, m in t_eager):
        r["topk_padded_vs_eager"] = _topk_diff(t_padded, t_eager)
        r["topk_pieces_vs_padded"] = _topk_diff(t_pieces, t_padded)
    tk = "; top-k keys differing per layer (padded vs eager): " + ", ".join(
        f"{max(d.values()):.1e}" if d else "-" for d in r.get("topk_padded_vs_eager", [])) if "topk_padded_vs_eager" in r else ""
    print(f"    {name}: {r['tokens']} tokens in the {size} bucket: eager padded vs eager rel err "
          f"{r['rel_err_padded_vs_eager']:.2e}, pieces vs eager padded {r['rel_err_pieces_vs_padded']:.2e}{tk}", flush=True)
    return r


def _randomise(kv) -> None:
    import torch
    dev = SIZES["device"]
    g = torch.Generator(device=dev).manual_seed(0)
    for t in (kv.latent, kv.index_k):
        if t is not None:
            t.copy_(torch.randn(t.shape, generator=g, device=dev).to(t.dtype))


def _started(model: str, layers: int | None, draft_len: int):
    """(engine, its report's common fields): engine start seconds and what the piecewise graphs captured."""
    t0 = time.perf_counter()
    e = _engine(model, layers, draft_len)
    pw = e.runner.piecewise
    return e, {"model": model, "layers": layers, "engine_start_s": round(time.perf_counter() - t0, 1),
               "piecewise_buckets": len(pw.captured) if pw else 0,
               "piecewise_failed": dict(list(pw.failed.items())[:3]) if pw else {},
               "piecewise_capture_s": pw.capture_s if pw else None, "rows": []}


def bench_dsa(model: str, layers: int, repeats: int) -> dict:
    e, out = _started(model, layers, 0)
    r, kv, net = e.runner, e.runner.kv, e.runner.model
    pw = r.piecewise
    out.update(decode_graphs=r.graphs is not None, decode_graphs_off=r.graphs_off_reason,
               topk=net.model.layers[0].self_attn.indexer.topk)
    dg = "on" if r.graphs is not None else (r.graphs_off_reason or "off")
    print(f"{model} ({layers} layers): engine start {out['engine_start_s']:.1f} s; decode graphs: {dg}; "
          f"piecewise buckets {out['piecewise_buckets']}", flush=True)
    if pw is None:
        return out
    _randomise(kv)
    vocab = net.cfg.spec.vocab_size
    z = SIZES
    shapes = [(f"decode b={b} ctx={c}", [c] * b, []) for c in z["ctx"] for b in z["batch"]]
    shapes += [(f"prefill {n} new over {c} cached", [], [(n, c)]) for n, c in z["prefill"]]
    nd, dctx, (n, c) = z["mixed"]
    shapes.append((f"mixed: {nd} decodes at {dctx} + {n} over {c}", [dctx] * nd, [(n, c)]))
    for name, dec, pre in shapes:
        b = _batch(kv, dec, pre, 1, vocab)
        out["rows"].append(_row(name, lambda b=b: net(b, kv), lambda b=b: pw.run(b)[0], repeats))
        out["rows"][-1].update(_padding_split(name, net, kv, b, pw))
    del e, r, net, pw
    return out


def bench_mtp(model: str, layers: int, repeats: int) -> dict:
    import torch
    e, out = _started(model, layers, 1)
    r, kv, net = e.runner, e.runner.kv, e.runner.model
    pw = r.piecewise
    out.update(mtp_layers=net.num_mtp,
               mtp_piece_buckets=(len(pw.mtp_graphs) if pw.use_graphs else len(pw.captured) * (pw.num_mtp > 0)) if pw else 0)
    print(f"{model} ({layers} layers + {net.num_mtp} MTP): engine start {out['engine_start_s']:.1f} s; piecewise buckets "
          f"{out['piecewise_buckets']}, MTP pieces in {out['mtp_piece_buckets']}", flush=True)
    if pw is None or not pw.num_mtp:
        return out
    _randomise(kv)
    vocab, hidden = net.cfg.spec.vocab_size, net.model.embed_tokens.weight.shape[1]
    nd, dctx, (n, c) = SIZES["mixed"]     # the DSA half's padded mixed step on a model without an indexer
    b = _batch(kv, [dctx] * nd, [(n, c)], 1, vocab)
    name = f"mixed: {nd} decodes at {dctx} + {n} over {c}"
    out["rows"].append(_row(name, lambda b=b: net(b, kv), lambda b=b: pw.run(b)[0], repeats))
    out["rows"][-1].update(_padding_split(name, net, kv, b, pw))
    dev = SIZES["device"]
    g = torch.Generator(device=dev).manual_seed(1)
    for bsz in SIZES["batch"]:
        for sq, what in ((2, "MTP step rows (2 per decode)"), (1, "chain step (1 per decode)")):
            b = _batch(kv, [SIZES["ctx"][0]] * bsz, [], sq, vocab)
            prev = torch.randn(b.num_tokens, hidden, generator=g, device=dev, dtype=net.model.embed_tokens.weight.dtype)
            out["rows"].append(_row(f"MTP draft b={bsz}: {what}", lambda b=b, p=prev: net.mtp_forward(0, b, p, kv),
                                    lambda b=b, p=prev: pw.run_mtp(0, b, p), repeats))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--dsa-model", default="deepseek-v3.2")
    ap.add_argument("--mtp-model", default="deepseek-v3")
    ap.add_argument("--smoke", action="store_true", help="tiny on the CPU, small shapes, pieces uncaptured (a check of the script)")
    a = ap.parse_args(argv)
    import torch
    if a.smoke:
        SIZES.update(SMOKE)
        a.dsa_model = a.mtp_model = "tiny"
        a.layers = None
    res = {"gpu": torch.cuda.get_device_name() if SIZES["device"] == "cuda" else "cpu (smoke)", "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python -m benchmarks.gpu.graph_coverage " + " ".join(argv if argv is not None else sys.argv[1:])}
    for key, fn, model in (("dsa", bench_dsa, a.dsa_model), ("mtp", bench_mtp, a.mtp_model)):
        try:
            res[key] = fn(model, a.layers, a.repeats)
        except Exception as ex:  # noqa: BLE001 - keep the other half and say what failed
            import traceback
            traceback.print_exc()
            res[key] = {"error": f"{type(ex).__name__}: {ex}"[:500]}
        Path(a.out).write_text(json.dumps(res, indent=1))
        gc.collect()
        if SIZES["device"] == "cuda":
            torch.cuda.empty_cache()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
