"""Host issue time of a prompt-bearing step's forward through the piecewise CUDA graphs, attention as it runs now
against attention as it ran before the per-step sharing (issue 16), in one process, interleaved.

Why: in the pipelined loop the host launches step N+1 while the device runs step N; a prompt-bearing step's launch
(its eager attention between the graph pieces, once per layer) took 6-9 ms of host on the H200 where the decode step
before it ran 3-8 ms on the device, so those iterations waited on the host, and the host's speed (0.8-1.75x the
calibration's from cell to cell, runs 37-43) showed in the step walls. ``MLAAttention.attend`` now shares per step
what every layer used to rebuild: FlashMLA's scheduling metadata (``ForwardBatch.memo``), each chunk's key slots
(``PrefillSpan.key_slots``, in the step's one host-to-device copy), the absorption weights as per-head ``bmm``
operands, and the piecewise query buffer (no concatenation per chunk). ``attend_before`` below is the code it
replaced, kept here only to measure against in the same process.

Per shape (decodes at a context + prompt chunks (new, cached)), interleaved repeats of ``PiecewiseGraphs.run`` with
each attention: the forward's host issue time (no sync), its split (input fill, graph replays, eager attention), and
the hidden states' max difference between the two; then a cProfile of the current forward (top functions by own
time). Dummy weights, the 5-layer DeepSeek-V3 FP8 engine of the validation matrix (``executor.calibrate.build_engine``).

    python3 -m benchmarks.gpu.prompt_launch --out prompt_launch.json        (on the GPU; scripts/device_prompt_launch.sh)
    python3 -m benchmarks.gpu.prompt_launch --device cpu --layers 2 --repeats 3   (a CPU dry run of the same code)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch

from executor.forward_batch import build_forward_batch, synthetic_seqs
from executor.mla import MLAAttention
from kernels import ops
from kernels import reference as ref

# name -> (decode contexts, prompt chunks (new, cached)): the prompt-bearing steps of the matrix's agentic and
# summarize levels (medians of run 43's samples: low 4 decodes + 375 tokens, knee 22 + 429, past saturation 49 + 847)
SHAPES = {
    "4 dec@1500 + 375 over 1500": ([1500] * 4, [(375, 1500)]),
    "22 dec@2000 + 430 over 2000": ([2000] * 22, [(430, 2000)]),
    "49 dec@2500 + 847 over 3000": ([2500] * 49, [(847, 3000)]),
    "16 dec@1000 + 256 + 256 over 1024": ([1000] * 16, [(256, 0), (256, 1024)]),
    "prefill 2048 (no decodes)": ([], [(2048, 0)]),
}


def attend_before(self, q_nope, q_pe, batch, kv, idx=None, out=None, q=None):
    """``MLAAttention.attend`` as it was before the per-step sharing (``q`` ignored): absorption by ``einsum``,
    FlashMLA's metadata made per layer, each chunk's latents gathered from its pages and its queries concatenated."""
    t = q_nope.shape[0]
    cache = kv.latent[self.cache_layer]
    dec_topk, masks = None, [None] * len(batch.prefills)
    if self.indexer is not None:
        dec_topk, masks = self.indexer.select(idx, batch, kv.index_k[self.cache_layer])
    w_kv_b = self.kv_b_proj.weight
    if out is None:
        out = torch.empty(t, self.h, self.dv, dtype=q_nope.dtype, device=q_nope.device)
    nd = batch.num_decode_tokens
    if nd:
        b, sq = batch.num_decodes, batch.decode_sq
        q_lat = ref.mla_absorb_q(q_nope[:nd], w_kv_b, self.dn, self.dv)
        qd = torch.cat((q_lat, q_pe[:nd]), dim=-1).view(b, sq, self.h, self.rank + self.dr)
        o_lat = ops.mla_decode(qd, cache, batch.decode_block_table, batch.decode_seq_lens, self.scale,
                               self.rank, topk_indices=dec_topk)
        out[:nd] = ref.mla_absorb_out(o_lat.reshape(nd, self.h, self.rank), w_kv_b, self.dn, self.dv)
    for p, mask in zip(batch.prefills, masks):
        rows = slice(p.start, p.start + p.num)
        lat = ref.gather_paged(cache, p.block_table, p.kv_len)
        k_nope, v, kpe = ref.mla_expand_kv(lat, w_kv_b, self.h, self.dn, self.dv, self.rank)
        k = torch.cat((k_nope, kpe[:, None, :].expand(-1, self.h, -1)), dim=-1)
        qq = torch.cat((q_nope[rows], q_pe[rows]), dim=-1)
        out[rows] = ops.attention_prefill(qq, k, v, batch.positions[rows], self.scale, mask, bottom_right=True)
    return out


VARIANTS = {"before": attend_before, "now": MLAAttention.attend}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_shape(runner, dec: list[int], pre: list[tuple[int, int]], repeats: int) -> dict:
    """Interleaved repeats of the piecewise forward with each attention: median host issue and split (ms), the
    batch build's host time, and the hidden states' difference."""
    dev, pw = runner.device, runner.piecewise
    vocab = runner.model.cfg.spec.vocab_size
    seqs, _ = synthetic_seqs(dec, pre, 1, vocab, runner.page_size, seed=len(dec) + len(pre))
    builds = []
    for _ in range(max(repeats, 5)):
        t0 = time.perf_counter()
        batch = build_forward_batch(seqs, runner.page_size, runner.kv.null_page, dev)
        builds.append(time.perf_counter() - t0)
    issue: dict[str, list[float]] = {k: [] for k in VARIANTS}
    split: dict[str, dict[str, list[float]]] = {k: {} for k in VARIANTS}
    hidden = {}
    try:
        with torch.inference_mode():
            for r in range(repeats + 2):   # the first two of each: warm-up (new shapes' first calls)
                for name in (VARIANTS if r % 2 == 0 else reversed(list(VARIANTS))):
                    MLAAttention.attend = VARIANTS[name]
                    batch.memo.clear()   # a step's batch is new each step: nothing shared from the last run
                    _sync(dev)
                    parts: dict[str, float] = {}
                    t0 = time.perf_counter()
                    h, _bucket = pw.run(batch, host_s=parts)
                    t1 = time.perf_counter()
                    _sync(dev)
                    if r >= 2:
                        issue[name].append(t1 - t0)
                        for k, v in parts.items():
                            split[name].setdefault(k, []).append(v)
                    else:
                        hidden[name] = h.float().clone()
    finally:
        MLAAttention.attend = VARIANTS["now"]
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    diff = float((hidden["now"] - hidden["before"]).abs().max())
    return {"tokens": batch.num_tokens, "bucket": _bucket, "build_ms": ms(builds),
            "issue_ms": {k: ms(v) for k, v in issue.items()},
            "split_ms": {k: {p: ms(v) for p, v in parts.items()} for k, parts in split.items()},
            "hidden_max_abs_diff": diff, "hidden_max_abs": float(hidden["before"].abs().max()),
            "layers": len(runner.model.model.layers)}


def decode_graph_check(runner) -> dict:
    """A decode step of 8 through its CUDA graph (captured with the current attention: one FlashMLA metadata per
    step) against the same step run eagerly with the attention before: the final hidden states' max difference."""
    if runner.graphs is None or not runner.graphs.captured:
        return {"skipped": "no decode graphs"}
    vocab = runner.model.cfg.spec.vocab_size
    seqs, _ = synthetic_seqs([300 + 17 * i for i in range(8)], [], 1, vocab, runner.page_size, seed=3)
    batch = build_forward_batch(seqs, runner.page_size, runner.kv.null_page, runner.device)
    with torch.inference_mode():
        replayed = runner.graphs.run(batch)
        if replayed is None:
            return {"skipped": "no graph took the batch"}
        hg = replayed[0].float().clone()
        MLAAttention.attend = attend_before
        try:
            he = runner.model(batch, runner.kv).float()
        finally:
            MLAAttention.attend = VARIANTS["now"]
    return {"graph_size": replayed[1], "max_abs_diff": float((hg - he).abs().max()), "max_abs": float(he.abs().max())}


def profile(runner, dec, pre, n: int) -> str:
    """cProfile of ``n`` piecewise forwards of one shape with the current attention: top 30 functions by own time.
    Each forward starts on an idle device (synchronised outside the profile): back to back, the host runs ahead and
    its calls' times carry the wait for queue space (run 44's profile, unsynchronised, put ~0.3 ms on each torch.cat)."""
    vocab = runner.model.cfg.spec.vocab_size
    seqs, _ = synthetic_seqs(dec, pre, 1, vocab, runner.page_size, seed=7)
    batch = build_forward_batch(seqs, runner.page_size, runner.kv.null_page, runner.device)
    prof = cProfile.Profile()
    with torch.inference_mode():
        runner.piecewise.run(batch)
        _sync(runner.device)
        for _ in range(n):
            batch.memo.clear()
            _sync(runner.device)
            prof.enable()
            runner.piecewise.run(batch)
            prof.disable()
        _sync(runner.device)
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    return s.getvalue()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from executor.calibrate import build_engine
    t0 = time.perf_counter()
    engine = build_engine("deepseek-v3", a.layers, a.device, "fp8", max_num_seqs=64, max_model_len=8192,
                          num_kv_blocks=4096, max_batched_tokens=8192)
    runner = engine.runner
    if runner.piecewise is None:   # CPU: the same pieces, uncaptured
        runner.enable_piecewise_graphs(8192, capture=False)
    res: dict = {"build_s": time.perf_counter() - t0, "rows": {}}
    print(f"engine built in {res['build_s']:.1f} s; piecewise buckets {runner.piecewise.captured[:4]}..", flush=True)
    for name, (dec, pre) in SHAPES.items():
        row = res["rows"][name] = time_shape(runner, dec, pre, a.repeats)
        i, s = row["issue_ms"], row["split_ms"]
        print(f"{name:36s} issue before {i['before']:6.2f} ms now {i['now']:6.2f} ms (x{i['before'] / i['now']:.2f}); "
              f"attend {s['before'].get('attend', 0):5.2f} -> {s['now'].get('attend', 0):5.2f} ms, pieces "
              f"{s['before'].get('pieces', 0):5.2f} / {s['now'].get('pieces', 0):5.2f}, fill {s['now'].get('fill', 0):4.2f}; "
              f"build {row['build_ms']:.2f} ms; hidden diff {row['hidden_max_abs_diff']:.3g} of {row['hidden_max_abs']:.3g}",
              flush=True)
    res["decode_graph_check"] = decode_graph_check(runner)
    print("decode graph (now) vs eager (before):", res["decode_graph_check"], flush=True)

    def dump():
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
    dump()
    name = "22 dec@2000 + 430 over 2000"
    res["profile_now"] = profile(runner, *SHAPES[name], n=max(a.repeats, 20))
    print(res["profile_now"][:6000])
    dump()
    return res


if __name__ == "__main__":
    main()
