"""Op tables of device time: the kernels serving runs, at the model's shapes, timed inside CUDA graphs.

Why graphs: an eager call pays a host launch (tens of microseconds with a JIT library's Python
wrapper) that a decode step under CUDA graphs does not, so eager timings put a launch floor under
every small shape. Each case here captures R back-to-back launches in one graph and replays it;
device time per launch = median replay time / R. The eager time of one call is timed too (CUDA
events around a single call, median) so the launch floor is a measured figure, not a guess.

Why weight copies: back-to-back launches of one GEMM re-read the same weights from L2 (50 MB on an
H200), which a real step never does (every layer has its own weights). Each case cycles through
enough copies of its weights (and KV caches) that one pass reads more than ``L2_SPILL_BYTES``.

Correctness first: every kernel is checked against the torch reference on the same inputs
(relative error in the table). Writes CSV rows plus a provenance JSON.

    python -m benchmarks.gpu.op_tables --out-dir DIR [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
import traceback
from pathlib import Path

import torch

from benchmarks.gpu.bench_kernels import env, rel, timed
from kernels.measured import L2_SPILL_BYTES, spill_copies
from kernels import reference as R

M_GRID = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# DeepSeek-V3 FP8 GEMMs (N, K): fused q_a+kv_a, q_b, kv_b, o_proj, dense gate_up, dense down,
# shared-expert gate_up, shared-expert down (config.json: hidden 7168, q_lora 1536, kv_lora 512,
# 128 heads x (128 nope + 64 rope), v 128, dense inter 18432, expert inter 2048). The first six
# (N, K) pairs are also the rows of DeepGEMM's published normal-GEMM table.
V3_GEMMS = {"qkv_a": (2112, 7168), "q_b": (24576, 1536), "kv_b": (32768, 512), "o_proj": (7168, 16384),
            "dense_gate_up": (36864, 7168), "dense_down": (7168, 18432), "shared_gate_up": (4096, 7168),
            "shared_down": (7168, 2048)}
# which dimension tensor parallelism splits: column-parallel GEMMs split N, row-parallel ones split K;
# qkv_a stays replicated (DeepSeek-V3 under TP, as vLLM/SGLang shard it)
# the rows a step runs in BF16 whatever its weights' dtype (DeepSeek-V3's router, the LM head's TP8 shard) and a dense
# model's TP8 shards (Llama-3.1-70B: hidden 8192, 64 query / 8 KV heads of 128, FFN 28672): the ``dense_bf16`` stage
# times them in BF16 (cuBLAS) next to the FP8 kernels at the same shapes, the held-out check of the cost model's
# FP8-to-other-dtype transfer (costmodels.op_table.TableGemms)
BF16_EXTRA = {"router": (256, 7168), "lm_head/tp8": (16160, 7168), "l70_qkv/tp8": (1280, 8192),
              "l70_o/tp8": (8192, 1024), "l70_gate_up/tp8": (7168, 8192), "l70_down/tp8": (8192, 3584)}
# BF16 layouts' own shapes, cuBLAS only (``dense_bf16_qwen``): Qwen3-235B-A22B's TP4 shards (hidden 4096, 64 query / 4
# KV heads of 128, 128 experts, vocab 151936) and Qwen3-30B-A3B's unsharded ones (hidden 2048, 32 / 4 heads), smallest
# first so that a cut-short run keeps the most shapes
BF16_QWEN = {"q235_router": (128, 4096), "q235_kv/tp4": (256, 4096), "q30_kv": (1024, 2048), "q235_q/tp4": (2048, 4096),
             "q235_o/tp4": (4096, 2048), "q30_q": (4096, 2048), "q30_o": (2048, 4096), "q235_lm_head/tp4": (37984, 4096)}
TP_SPLIT = {"q_b": "n", "kv_b": "n", "o_proj": "k", "dense_gate_up": "n", "dense_down": "k", "shared_gate_up": "n",
            "shared_down": "k"}


def tp_shards(tps) -> dict[str, tuple[int, int]]:
    """V3's GEMMs as one rank of TP ``tp`` sees them, named ``<gemm>/tp<tp>``."""
    out = {}
    for tp in tps:
        for name, dim in TP_SPLIT.items():
            n, k = V3_GEMMS[name]
            out[f"{name}/tp{tp}"] = (n // tp, k) if dim == "n" else (n, k // tp)
    return out


FIELDS = ["op", "lib", "dtype", "name", "m", "n", "k", "groups", "tokens", "rows", "batch", "context", "device_us",
          "eager_us", "tflops", "tbs", "rel_err", "copies", "error", "seqs", "mhz"]

# the board's power limiter (issue 16, benchmarks/gpu/table_clock.py): an H100 holds its boost clock through a heavy
# shape's 15 replays from rest, but ~0.1-0.2 s of back-to-back heavy shapes takes it 5-8% down (1,980 -> 1,815-1,875
# MHz), and it comes back over ~0.4 s idle. ``--rest S``: a case whose one call takes ``REST_MIN_US`` or more starts
# after S idle, so each is timed at the clock the cost model takes the tables at (``costmodels.power``: the boost
# maximum; the limit is priced on top). The SM clock read right after its replays (``beyond_grid.sm_mhz``) goes in
# the row's ``mhz``.
REST = {"s": 0.0}
REST_MIN_US = 100.0


def graph_time_us(fns, reps: int, replays: int = 15, call_us: float = 0.0) -> float:
    """Device microseconds per call: ``reps`` calls cycling through ``fns`` captured in one CUDA graph. ``call_us``:
    one call's eager time (a case of ``REST_MIN_US`` or more rests ``REST["s"]`` first)."""
    g = capture_graph(fns, reps)
    if REST["s"] > 0 and call_us >= REST_MIN_US:
        torch.cuda.synchronize()
        time.sleep(REST["s"])
    t = timed(g.replay, 1, replays) * 1e6 / reps
    del g
    return t


def capture_graph(fns, reps: int):
    """A CUDA graph of ``reps`` calls cycling through ``fns``, each warmed up once on a side stream first."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:       # warm-up outside capture (JIT, autotune, allocator)
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fns[i % len(fns)]()
    return g


def eager_time_us(fn, iters: int = 20) -> float:
    """Microseconds of one eager call (host launch included), CUDA events, median."""
    return timed(fn, 3, iters) * 1e6


def reps_for(us_guess: float) -> int:
    """Enough launches per graph that a replay lasts ~2 ms, between 4 and 200."""
    return int(min(200, max(4, 2000 / max(us_guess, 1.0))))


def copies_for(nbytes: int) -> int:
    return spill_copies(nbytes, 64)


def dense_gemm_rows(emit, libs, m_grid, gemms) -> None:
    """FP8 block-scaled GEMM (1x128 activation, 128x128 weight scales), bf16 out, per library."""
    from kernels.triton_fp8_gemm import fp8_gemm
    from kernels.vendor import deepgemm_fp8_gemm
    impls = {"deepgemm": deepgemm_fp8_gemm, "triton": fp8_gemm}
    for name, (n, k) in gemms.items():
        w = torch.randn(n, k, device="cuda") * 0.02
        wq, ws = R.quant_fp8_weight(w)
        del w
        ncop = copies_for(n * k)
        ws_list = [(wq.clone(), ws.clone()) for _ in range(ncop - 1)] + [(wq, ws)]
        for m in m_grid:
            x = torch.randn(m, k, device="cuda")
            xq, xs = R.quant_fp8_act(x)
            want = R.fp8_gemm_blockscaled(xq[:256], xs[:256], wq, ws, torch.float32)
            for lib in libs:
                row = {"op": "dense_gemm", "lib": lib, "dtype": "fp8", "name": name, "m": m, "n": n, "k": k,
                       "copies": ncop}
                fn = impls[lib]
                try:
                    row["rel_err"] = rel(fn(xq[:256], xs[:256], wq, ws), want)
                    row["eager_us"] = eager_time_us(lambda: fn(xq, xs, wq, ws))
                    fns = [lambda a=a, b=b: fn(xq, xs, a, b) for a, b in ws_list]
                    t = graph_time_us(fns, reps_for(row["eager_us"]))
                    row.update(device_us=t, tflops=2 * m * n * k / t / 1e6,
                               tbs=(m * k + n * k + 2 * m * n) / t / 1e6)
                except Exception as e:  # noqa: BLE001 - one failed case must not stop the table
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                emit(row)
            del x, xq, xs
        del ws_list, wq, ws
        torch.cuda.empty_cache()


def bf16_gemm_rows(emit, m_grid, gemms) -> None:
    """BF16 ``x @ w.T`` (torch's Linear: cuBLAS), bf16 in and out, the same cases and timing as the FP8 rows."""
    import torch.nn.functional as F
    for name, (n, k) in gemms.items():
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        ncop = copies_for(2 * n * k)
        w_list = [w.clone() for _ in range(ncop - 1)] + [w]
        for m in m_grid:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            want = x[:256].float() @ w.float().T
            row = {"op": "dense_gemm", "lib": "cublas", "dtype": "bf16", "name": name, "m": m, "n": n, "k": k,
                   "copies": ncop}
            try:
                row["rel_err"] = rel(F.linear(x[:256], w), want)
                row["eager_us"] = eager_time_us(lambda: F.linear(x, w))
                fns = [lambda b=b: F.linear(x, b) for b in w_list]
                t = graph_time_us(fns, reps_for(row["eager_us"]))
                row.update(device_us=t, tflops=2 * m * n * k / t / 1e6, tbs=(2 * m * k + 2 * n * k + 2 * m * n) / t / 1e6)
            except Exception as e:  # noqa: BLE001 - one failed case must not stop the table
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            emit(row)
            del x
        del w_list, w
        torch.cuda.empty_cache()


def expert_weights(e: int, n: int, k: int):
    """``e`` experts' ``N x K`` weights in block-scaled FP8 (codes, 128x128 scales), the copies one pass cycles through
    to spill L2, and the (codes, scales) list of those copies."""
    b = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    bq = torch.empty(e, n, k, device="cuda", dtype=torch.float8_e4m3fn)
    bs = torch.empty(e, n // 128, k // 128, device="cuda")
    for j in range(e):
        bq[j], bs[j] = R.quant_fp8_weight(b[j].float())
    del b
    ncop = copies_for(e * n * k)
    return bq, bs, ncop, [(bq.clone(), bs.clone()) for _ in range(ncop - 1)] + [(bq, bs)]


def masked_grouped_rows(emit, groups_grid, m_grid, shapes) -> None:
    """DeepGEMM ``m_grouped_fp8_gemm_nt_masked`` (decode MoE: E experts x up to M tokens each)."""
    from kernels.registry import library_module
    dg = library_module("deepgemm")
    for name, (n, k) in shapes.items():
        for e in groups_grid:
            bq, bs, ncop, wl = expert_weights(e, n, k)
            for m in m_grid:
                mmax = max(128, (m + 127) // 128 * 128)   # masked layout pads M to the block size
                a = torch.randn(e, mmax, k, device="cuda")
                aq = torch.empty(e, mmax, k, device="cuda", dtype=torch.float8_e4m3fn)
                as_ = torch.empty(e, mmax, k // 128, device="cuda")
                for j in range(e):
                    aq[j], as_[j] = R.quant_fp8_act(a[j])
                out = torch.empty(e, mmax, n, device="cuda", dtype=torch.bfloat16)
                masked = torch.full((e,), m, device="cuda", dtype=torch.int32)
                row = {"op": "grouped_gemm_masked", "lib": "deepgemm", "dtype": "fp8", "name": name, "m": m, "n": n,
                       "k": k, "groups": e, "copies": ncop}

                def call(w=bq, s=bs):
                    try:
                        dg.m_grouped_fp8_gemm_nt_masked((aq, as_), (w, s), out, masked, m, disable_ue8m0_cast=True)
                    except TypeError:
                        dg.m_grouped_fp8_gemm_nt_masked((aq, as_), (w, s), out, masked, m)
                try:
                    call()
                    torch.cuda.synchronize()
                    want = R.fp8_gemm_blockscaled(aq[0, :m], as_[0, :m], bq[0], bs[0], torch.float32)
                    row["rel_err"] = rel(out[0, :m], want)
                    row["eager_us"] = eager_time_us(call)
                    t = graph_time_us([lambda w=w, s=s: call(w, s) for w, s in wl], reps_for(row["eager_us"]))
                    row.update(device_us=t, tflops=2 * e * m * n * k / t / 1e6,
                               tbs=(e * n * k + e * m * k + 2 * e * m * n) / t / 1e6)
                except Exception as ex:  # noqa: BLE001
                    row["error"] = f"{type(ex).__name__}: {ex}"[:300]
                emit(row)
                del a, aq, as_, out
            del wl, bq, bs
            torch.cuda.empty_cache()


def routed_counts(tokens: int, n_experts: int, top_k: int, local: int, seed: int = 0) -> torch.Tensor:
    """Pairs each of the first ``local`` experts receives when ``tokens`` tokens each pick ``top_k`` distinct experts of
    ``n_experts`` uniformly at random (seeded, on the CPU: the same counts on every run)."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.rand(tokens, n_experts, generator=g).argsort(dim=1)[:, :top_k]
    return torch.bincount(picks.reshape(-1), minlength=n_experts)[:local]


def contig_grouped_rows(emit, tokens_grid, shapes, align: int = 128) -> None:
    """DeepGEMM ``m_grouped_fp8_gemm_nt_contiguous`` (prefill MoE): ``tokens`` tokens routed uniformly at random (top-k of
    the model's experts), the pairs of the ``groups`` local experts sorted by expert, each expert's run padded to
    ``align`` rows (DeepGEMM's M alignment of this layout on SM90; the tight layout an engine builds once it knows the
    counts, as DeepEP's normal dispatch returns them). ``m`` = pairs, ``rows`` = padded rows the kernel runs; tflops
    counts the pairs' math (the padding's is waste), tbs the weights once plus the rows' activations."""
    from kernels.registry import library_module
    dg = library_module("deepgemm")
    for name, (n, k, n_experts, top_k, e) in shapes.items():
        bq, bs, ncop, wl = expert_weights(e, n, k)
        for tokens in tokens_grid:
            counts = routed_counts(tokens, n_experts, top_k, e)
            padded = (counts + align - 1) // align * align
            pairs, rows = int(counts.sum()), int(padded.sum())
            ids = torch.repeat_interleave(torch.arange(e), padded)
            within = torch.arange(rows) - torch.repeat_interleave(padded.cumsum(0) - padded, padded)
            m_idx = torch.where(within < torch.repeat_interleave(counts, padded), ids, -1).to(torch.int32).cuda()
            row = {"op": "grouped_gemm_contiguous", "lib": "deepgemm", "dtype": "fp8", "name": name, "m": pairs,
                   "rows": rows, "tokens": tokens, "n": n, "k": k, "groups": e, "copies": ncop}
            try:
                a = torch.randn(rows, k, device="cuda")
                aq, as_ = R.quant_fp8_act(a)
                del a
                out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)

                def call(w=bq, s=bs):
                    try:
                        dg.m_grouped_fp8_gemm_nt_contiguous((aq, as_), (w, s), out, m_idx, disable_ue8m0_cast=True)
                    except TypeError:
                        dg.m_grouped_fp8_gemm_nt_contiguous((aq, as_), (w, s), out, m_idx)
                call()
                torch.cuda.synchronize()
                j = int(torch.nonzero(counts)[0])           # the first expert with pairs: its valid rows
                r0 = int((padded.cumsum(0) - padded)[j])
                c = min(int(counts[j]), 256)
                want = R.fp8_gemm_blockscaled(aq[r0:r0 + c], as_[r0:r0 + c], bq[j], bs[j], torch.float32)
                row["rel_err"] = rel(out[r0:r0 + c], want)
                row["eager_us"] = eager_time_us(call)
                t = graph_time_us([lambda w=w, s=s: call(w, s) for w, s in wl], reps_for(row["eager_us"]))
                touched = int((counts > 0).sum())
                row.update(device_us=t, tflops=2 * pairs * n * k / t / 1e6,
                           tbs=(touched * n * k + rows * k + 2 * rows * n) / t / 1e6)
                del aq, as_, out
            except Exception as ex:  # noqa: BLE001
                row["error"] = f"{type(ex).__name__}: {ex}"[:300]
            emit(row)
            torch.cuda.empty_cache()
        del wl, bq, bs
        torch.cuda.empty_cache()


# DeepSeek-V4-class mHC: (hidden H, streams n, Sinkhorn iterations) of V4-Flash and V4.1-Flash (config.json: hidden
# 4096 / 5120, hc_mult 4, hc_sinkhorn_iters 20)
MHC_SHAPES = {"v4_flash": (4096, 4, 20), "v41_flash": (5120, 4, 20)}
MHC_SPLITS = (1, 16)   # DeepGEMM's split-K of the projection: none, and vLLM's mhc_pre default


def mhc_rows(emit, tokens_grid, shapes) -> None:
    """mHC around one block at ``tokens`` tokens of a rank: DeepGEMM's ``tf32_hc_prenorm_gemm`` (the mixing projection
    ``[T, nH] x [(2+n)n, nH]^T`` and the squared norm, at each of ``MHC_SPLITS``), then the fused pre kernel (split-K
    sum, RMS division, sigmoids, Sinkhorn, the streams' weighted sum; ``kernels.triton_mhc.mhc_pre``) at the model's
    Sinkhorn iterations and at one (``context`` = iterations: what the chain costs per iteration), and the post
    kernel (``mhc_post``). Streams and weights cycled over copies like the GEMMs' weights. ``m`` = tokens, ``n`` =
    (2+n)n mixes, ``k`` = nH, ``groups`` = n; tbs counts the bytes each kernel must move."""
    from kernels import triton_mhc as M
    from kernels.registry import library_module
    try:
        dg = library_module("deepgemm")
    except Exception:  # noqa: BLE001
        dg = None
    for name, (h, n, iters) in shapes.items():
        nm, k = (2 + n) * n, n * h
        fns = [torch.randn(nm, k, device="cuda") * 0.02 for _ in range(4)]
        scale = torch.tensor([1.0, 1.0, 1.0], device="cuda")
        base = torch.randn(nm, device="cuda") * 0.1
        for t in tokens_grid:
            ncop = copies_for(t * k * 2 + nm * k * 4)
            xs = [torch.randn(t, n, h, device="cuda", dtype=torch.bfloat16) for _ in range(ncop)]
            ys = [torch.randn(t, h, device="cuda", dtype=torch.bfloat16) for _ in range(ncop)]
            want_mix, want_sqr = R.mhc_prenorm_gemm(xs[0].view(t, k), fns[0])
            base_row = {"m": t, "n": nm, "k": k, "groups": n, "tokens": t, "copies": ncop, "name": name}
            for splits in (MHC_SPLITS if dg is not None else ()):
                row = {"op": "mhc_prenorm_gemm", "lib": "deepgemm", "dtype": "tf32", **base_row, "batch": splits}
                try:
                    d = torch.empty(splits, t, nm, device="cuda")
                    sq = torch.empty(splits, t, device="cuda")

                    def call(x=xs[0], f=fns[0], d=d, sq=sq, splits=splits):
                        if splits == 1:    # no split: 2-D outputs and num_splits=None, as SGLang calls it
                            dg.tf32_hc_prenorm_gemm(x.view(t, k), f, d.view(t, nm), sq.view(t), num_splits=None)
                        else:
                            dg.tf32_hc_prenorm_gemm(x.view(t, k), f, d, sq, num_splits=splits)
                    call()
                    torch.cuda.synchronize()
                    row["rel_err"] = max(rel(d.sum(0), want_mix), rel(sq.sum(0), want_sqr))
                    row["eager_us"] = eager_time_us(call)
                    cases = [lambda x=x, f=f: call(x, f) for x, f in zip(xs, fns * ncop)]
                    tt = graph_time_us(cases, reps_for(row["eager_us"]))
                    row.update(device_us=tt, tflops=2 * t * nm * k / tt / 1e6,
                               tbs=(t * k * 2 + nm * k * 4 + splits * t * (nm + 1) * 4) / tt / 1e6)
                except Exception as ex:  # noqa: BLE001
                    row["error"] = f"{type(ex).__name__}: {ex}"[:300]
                emit(row)
            splits = MHC_SPLITS[-1]
            parts = torch.full((splits, 1, 1), 1.0 / splits, device="cuda")
            mix, sqr = (parts * want_mix).contiguous(), (parts[:, :, 0] * want_sqr).contiguous()
            p0, c0 = torch.rand(t, n, device="cuda"), torch.rand(t, n, n, device="cuda")
            for it in (1, iters):   # the model's Sinkhorn iterations and one: the chain's cost per iteration
                row = {"op": "mhc_pre", "lib": "triton", "dtype": "bf16", **base_row, "batch": splits, "context": it}
                try:
                    y0, p0, c0 = R.mhc_pre(xs[0], mix, sqr, scale, base, it)
                    y1, p1, c1 = M.mhc_pre(xs[0], mix, sqr, scale, base, it)
                    row["rel_err"] = max(rel(y1, y0), rel(c1, c0), rel(p1, p0))
                    row["eager_us"] = eager_time_us(lambda it=it: M.mhc_pre(xs[0], mix, sqr, scale, base, it))
                    tt = graph_time_us([lambda x=x, it=it: M.mhc_pre(x, mix, sqr, scale, base, it) for x in xs],
                                       reps_for(row["eager_us"]))
                    row.update(device_us=tt, tbs=(t * k * 2 + t * h * 2 + splits * t * (nm + 1) * 4) / tt / 1e6)
                except Exception as ex:  # noqa: BLE001
                    row["error"] = f"{type(ex).__name__}: {ex}"[:300]
                emit(row)
            row = {"op": "mhc_post", "lib": "triton", "dtype": "bf16", **base_row}
            try:
                o0 = R.mhc_post(ys[0], xs[0], p0, c0)
                row["rel_err"] = rel(M.mhc_post(ys[0], xs[0], p0, c0), o0)
                row["eager_us"] = eager_time_us(lambda: M.mhc_post(ys[0], xs[0], p0, c0))
                tt = graph_time_us([lambda x=x, y=y: M.mhc_post(y, x, p0, c0) for x, y in zip(xs, ys)],
                                   reps_for(row["eager_us"]))
                row.update(device_us=tt, tbs=(2 * t * k * 2 + t * h * 2) / tt / 1e6)
            except Exception as ex:  # noqa: BLE001
                row["error"] = f"{type(ex).__name__}: {ex}"[:300]
            emit(row)
            del xs, ys
            torch.cuda.empty_cache()


def mla_decode_rows(emit, batches, contexts, heads=(128,)) -> None:
    """FlashMLA dense decode (bf16 KV, ``heads`` query heads (128 / TP), 512+64, page 64), all sequences at ``context``."""
    from kernels.vendor import _flashmla_api
    get_meta, fwd = _flashmla_api()
    page, rank, dr = 64, 512, 64
    scale = 192 ** -0.5
    for h, ctx, bsz in ((h, c, b) for h in heads for c in contexts for b in batches):
        pages = (ctx + page - 1) // page
        kv_bytes = bsz * ctx * (rank + dr) * 2
        if kv_bytes > (40 << 30):
            continue
        ncop = copies_for(kv_bytes)
        row = {"op": "mla_decode", "lib": "flashmla", "dtype": "bf16", "name": f"mla_h{h}", "batch": bsz,
               "context": ctx, "copies": ncop}
        try:
            caches = [torch.randn(bsz * pages, page, 1, rank + dr, device="cuda", dtype=torch.bfloat16)
                      for _ in range(ncop)]
            table = torch.arange(bsz * pages, device="cuda", dtype=torch.int32).view(bsz, pages)
            lens = torch.full((bsz,), ctx, device="cuda", dtype=torch.int32)
            q = torch.randn(bsz, 1, h, rank + dr, device="cuda", dtype=torch.bfloat16)
            meta, splits = get_meta(lens, h, 1)

            def call(c):
                return fwd(q, c, table, lens, rank, meta, splits, softmax_scale=scale, causal=True)[0]
            out = call(caches[0])
            n_chk = min(bsz, 4)
            want = R.mla_decode_paged(q[:n_chk].float(), caches[0][:, :, 0].float(), table[:n_chk], lens[:n_chk],
                                      scale, rank)
            row["rel_err"] = rel(out[:n_chk], want)
            row["eager_us"] = eager_time_us(lambda: call(caches[0]))
            t = graph_time_us([lambda c=c: call(c) for c in caches], reps_for(row["eager_us"]))
            row.update(device_us=t, tbs=kv_bytes / t / 1e6,
                       tflops=2 * bsz * h * ctx * (rank + dr + rank) / t / 1e6)
            del caches
        except Exception as ex:  # noqa: BLE001
            row["error"] = f"{type(ex).__name__}: {ex}"[:300]
            traceback.print_exc()
        emit(row)
        torch.cuda.empty_cache()


# query rows of a chunk the attention stages check against the reference (its last ones: the most keys each)
CHECK_ROWS = 1024

# GQA heads per GPU (query, KV) x head dim the ``gqa`` stage times: Llama-3.1-70B at TP8 (64/8 heads: 8 query over one KV
# head) and Llama-3.1-8B / Qwen3-30B-A3B-like unsharded (32 query over 8 KV heads)
GQA_HEADS = ((8, 1, 128), (32, 8, 128))


def gqa_attention_rows(emit, decode_batches, contexts, prefill_new, prefill_cached, heads=GQA_HEADS) -> None:
    """FlashAttention-3 (vLLM's varlen entry, ``fa_version=3``) over BF16 K/V laid out contiguously per sequence, the
    call vLLM's FA backend makes for decode and prefill alike: ``tokens`` new queries per sequence over ``context``
    keys (the cached ones plus the new), causal bottom-right. Decode rows: one new token, every sequence at
    ``context``; prefill rows: one sequence, ``tokens`` new over ``context - tokens`` cached."""
    from kernels.vendor import _fa3_varlen
    fn = _fa3_varlen()
    cases = [(h, 1, c, b) for h in heads for c in contexts for b in decode_batches] + \
            [(h, n, c + n, 1) for h in heads for c in prefill_cached for n in prefill_new]
    for (hq, hkv, d), new, ctx, bsz in cases:
        if bsz * ctx * 2 * hkv * d * 2 > (20 << 30):
            continue
        row = {"op": "gqa_attention", "lib": "fa3", "dtype": "bf16", "name": f"gqa_q{hq}_kv{hkv}_d{d}", "batch": bsz,
               "tokens": new, "context": ctx, "m": bsz * new}
        fa3_varlen_row(emit, fn, [(new, ctx)] * bsz, hq, hkv, d, row, range(min(bsz, 2)))


class Fa3Case:
    """One FA3 varlen call's inputs over ``seqs`` (new tokens, keys) at ``hq`` / ``hkv`` heads of ``d``: BF16 K/V in
    ``copies`` copies (cycled past L2), the queries, the cumulative offsets; ``call(i)`` runs ``fn`` on copy ``i``,
    causal bottom-right (``num_splits``: FA3's key splits forced, 0 its heuristics)."""

    @staticmethod
    def kv_bytes(seqs, hkv: int, d: int) -> int:
        """BF16 K and V bytes of one copy."""
        return sum(k for _, k in seqs) * 2 * hkv * d * 2

    def __init__(self, fn, seqs, hq: int, hkv: int, d: int, copies: int, num_splits: int = 0):
        self.news, self.ctxs = [n for n, _ in seqs], [k for _, k in seqs]
        tot_q, tot_k = sum(self.news), sum(self.ctxs)
        self.ks = [torch.randn(tot_k, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        self.vs = [torch.randn(tot_k, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        self.q = torch.randn(tot_q, hq, d, device="cuda", dtype=torch.bfloat16)
        self.cq, self.ck = [0], [0]
        for n, k in seqs:
            self.cq.append(self.cq[-1] + n)
            self.ck.append(self.ck[-1] + k)
        self.cu_q = torch.tensor(self.cq, device="cuda", dtype=torch.int32)
        self.cu_k = torch.tensor(self.ck, device="cuda", dtype=torch.int32)
        self.fn, self.scale, self.num_splits = fn, d ** -0.5, num_splits

    def call(self, i: int):
        return self.fn(self.q, self.ks[i], self.vs[i], max_seqlen_q=max(self.news), cu_seqlens_q=self.cu_q,
                       max_seqlen_k=max(self.ctxs), cu_seqlens_k=self.cu_k, softmax_scale=self.scale, causal=True,
                       fa_version=3, num_splits=self.num_splits)


def fa3_varlen_row(emit, fn, seqs, hq: int, hkv: int, d: int, row: dict, check, num_splits: int = 0) -> None:
    """Time one FA3 varlen call (``fn``) over ``seqs`` (new tokens, keys) at ``hq`` / ``hkv`` heads of ``d``, BF16
    K/V cycled over copies past L2, causal bottom-right; check the sequences at indices ``check`` (their last
    ``CHECK_ROWS`` queries) against ``kernels.reference.attention``; fill and emit ``row``. ``num_splits``: FA3's
    key splits forced (1: none, each query tile walks all its keys on one SM); 0 its heuristics, as engines call it."""
    from benchmarks.gpu.beyond_grid import sm_mhz

    kv_bytes = Fa3Case.kv_bytes(seqs, hkv, d)
    ncop = copies_for(kv_bytes)
    row["copies"] = ncop
    try:
        case = Fa3Case(fn, seqs, hq, hkv, d, ncop, num_splits)
        q, ks, vs, cq, ck, call, scale = case.q, case.ks, case.vs, case.cq, case.ck, case.call, case.scale
        out = call(0)
        errs = []
        for j in check:
            # the reference over the sequence's last CHECK_ROWS queries (its scores grow with queries x keys)
            n, k = seqs[j]
            lo = max(0, n - CHECK_ROWS)
            want = R.attention(q[cq[j] + lo:cq[j] + n], ks[0][ck[j]:ck[j] + k], vs[0][ck[j]:ck[j] + k],
                               torch.arange(k - n + lo, k, device="cuda"), scale)
            errs.append(rel(out[cq[j] + lo:cq[j] + n], want))
        row["rel_err"] = max(errs)
        row["eager_us"] = eager_time_us(lambda: call(0))
        t = graph_time_us([lambda i=i: call(i) for i in range(ncop)], reps_for(row["eager_us"]), call_us=row["eager_us"])
        row["mhz"] = sm_mhz()
        pairs = sum(n * (k - n) + n * (n + 1) / 2 for n, k in seqs)
        row.update(device_us=t, tbs=(kv_bytes + 2 * q.numel() * 2) / t / 1e6, tflops=4 * pairs * hq * d / t / 1e6)
        del ks, vs, case
    except Exception as ex:  # noqa: BLE001
        row["error"] = f"{type(ex).__name__}: {ex}"[:300]
        traceback.print_exc()
    emit(row)
    torch.cuda.empty_cache()


# The one-call composition the cost model applies to a step's attention (``StepOps.gqa_chunks_seconds``,
# ``gqa_decode_over``): several prefill chunks, and decodes beside chunks, in ONE varlen call, and decodes at mixed
# contexts. Each composition is ``((new, cached, count), ...)``; the stage times the call vLLM's FA backend makes for
# such a step, so the cost model's one-call rule is checked against the kernel (benchmarks/gqa_mix_check.py).
GQA_MIX = (
    # chunks only
    ((2048, 0, 2),), ((2048, 0, 4),), ((1024, 0, 8),), ((512, 0, 16),), ((128, 0, 8),), ((4096, 0, 2),),
    ((512, 4096, 4),), ((16, 4096, 32),), ((2048, 0, 1), (512, 4096, 1), (128, 16384, 1)),
    # decodes beside chunks
    ((512, 0, 1), (1, 4095, 1)), ((512, 0, 1), (1, 4095, 64)), ((2048, 0, 1), (1, 4095, 64)),
    ((2048, 2048, 1), (1, 2047, 256)), ((8192, 0, 1), (1, 8191, 32)), ((128, 0, 4), (1, 1023, 128)),
    ((16, 4096, 1), (1, 16383, 8)), ((512, 0, 1), (1, 32767, 16)),
    # decodes at mixed contexts
    ((1, 511, 32), (1, 16383, 32)), ((1, 1023, 63), (1, 32767, 1)), ((1, 2047, 8), (1, 8191, 8)),
    ((1, 4095, 128), (1, 511, 128)),
)


# a second, later set of mixes (other sizes, caches and decode counts), held out from everything the first set informed
GQA_MIX2 = (
    ((256, 0, 24),), ((64, 0, 64),), ((1024, 8192, 2),), ((768, 0, 6), (64, 2048, 10)), ((3000, 0, 1), (200, 0, 10)),
    ((4096, 4096, 1), (256, 0, 8)), ((384, 0, 12), (1, 6143, 40)), ((1500, 500, 3), (1, 3000, 100)),
    ((32, 8192, 16), (1, 8191, 16)), ((96, 0, 20), (1, 700, 200)), ((1000, 0, 1), (1, 12000, 4)),
    ((6000, 2000, 1), (1, 20000, 2)), ((48, 30000, 1), (1, 1500, 60)),
)
# the same calls with their sequences in the other order (FA3's varlen scheduler hands tiles out in batch order, vLLM's
# FlashAttention-3 backend keeps the persistent batch's order; our mixes put chunks first, engines mostly decodes)
GQA_ORDER = tuple(tuple(reversed(m)) for m in GQA_MIX + GQA_MIX2 if len(m) > 1)
GQA_MULTI_NEW = (16, 128, 512, 2048, 8192)
GQA_MULTI_CACHED = (0, 4096, 16384)


def gqa_multi_mixes(heads=GQA_HEADS, new=GQA_MULTI_NEW, cached=GQA_MULTI_CACHED, sms: int = 132) -> dict:
    """Per head layout, the ``gqa_multi`` stage's calls: K and 2K identical chunks of ``n`` new over ``c`` cached in one
    call, K the fewest (at least 2) whose query tiles fill four waves of ``sms`` SMs (at most 256, 2K chunks at most
    65,536 new tokens): the marginal cost of a chunk in a busy call, (t(2K) - t(K)) / K."""
    out = {}
    for hq, hkv, d in heads:
        g = hq // hkv
        mixes = []
        for c in cached:
            for n in new:
                tiles = hkv * -(-n * g // 128)
                k = max(2, min(256, -(-4 * sms // tiles), 32768 // n))
                mixes += [((n, c, k),), ((n, c, 2 * k),)]
        out[(hq, hkv, d)] = tuple(mixes)
    return out


# where a long key walk starts in a call: one decode over 20,000 keys after K prompts of 512 or 2,048 tokens (FA3
# hands tiles out in batch order) and before them; and lone decodes with FA3's splits off (num_splits 1): one SM's
# walk over a sequence's key tiles, the per-tile time of a streaming walk
GQA_WALK = tuple(m for k in (1, 8, 32, 128) for m in (((512, 0, k), (1, 19999, 1)), ((1, 19999, 1), (512, 0, k)))) \
    + tuple(m for k in (1, 4, 16) for m in (((2048, 0, k), (1, 19999, 1)), ((1, 19999, 1), (2048, 0, k))))
GQA_WALK_UNSPLIT = tuple(((1, c - 1, b),) for b in (1, 4) for c in (4096, 16384, 65536))


def gqa_mix_rows(emit, mixes=GQA_MIX, heads=GQA_HEADS, op: str = "gqa_mix", num_splits: int = 0) -> None:
    """FlashAttention-3's varlen call over a step's mix of sequences (``GQA_MIX``): decodes and prefill chunks in one
    call, as vLLM's FA backend issues them (``max_seqlen_q`` the longest chunk). ``seqs`` names the mix as
    ``new+cached x count`` terms joined by ``;``; ``batch`` the sequences, ``tokens`` the new tokens, ``context`` the
    keys read. Held-out rows: no cost-model table reads them."""
    from kernels.vendor import _fa3_varlen
    fn = _fa3_varlen()
    for hq, hkv, d in heads:
        for mix in (mixes[(hq, hkv, d)] if isinstance(mixes, dict) else mixes):
            seqs = [(n, n + c) for n, c, cnt in mix for _ in range(cnt)]
            tot_q, tot_k = sum(n for n, _ in seqs), sum(k for _, k in seqs)
            if tot_k * 2 * hkv * d * 2 > (20 << 30):
                continue
            row = {"op": op, "lib": "fa3", "dtype": "bf16", "name": f"gqa_q{hq}_kv{hkv}_d{d}",
                   "batch": len(seqs), "tokens": tot_q, "context": tot_k, "m": tot_q,
                   "seqs": ";".join(f"{n}+{c}x{cnt}" for n, c, cnt in mix)}
            fa3_varlen_row(emit, fn, seqs, hq, hkv, d, row, sorted({0, len(seqs) - 1}) if len(mix) > 1 else [0],
                           num_splits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--quick", action="store_true", help="a few shapes per table (a smoke run)")
    ap.add_argument("--tables", default="dense,masked,mla", help="comma list of dense, dense_tp, masked, masked_tp, contig, mhc, mla, mla_tp, gqa (FA3 GQA decode and "
                    "prefill over cached keys), gqa_mix, gqa_mix2 (FA3 varlen calls over a step's mix of decodes and chunks), gqa_order (the multi-term mixes in reverse order), gqa_walk (a long decode after and before K prompts; lone decodes unsplit), gqa_multi (K and 2K like chunks in one call), dense_bf16 "
                    "(BF16 cuBLAS and DeepGEMM FP8 at the V3 shapes and BF16_EXTRA's), dense_bf16_qwen (BF16 cuBLAS at "
                    "BF16_QWEN's shapes)")
    ap.add_argument("--gqa-heads", default=",".join(f"{q}/{kv}/{d}" for q, kv, d in GQA_HEADS),
                    help="the gqa stage's head layouts a GPU, query/KV/head dim, comma-separated")
    ap.add_argument("--gqa-cached", default="0,4096,16384", help="the gqa stage's cached counts under each prefill chunk, "
                    "and the gqa_multi stage's")
    ap.add_argument("--gqa-contexts", default="512,2048,8192,32768", help="the gqa stage's decode contexts")
    ap.add_argument("--rest", type=float, default=0.0, help="seconds idle before each case whose call takes "
                    f"{REST_MIN_US:.0f} us or more (FA3 GQA cases: the board's power limiter lets its clock back up)")
    ap.add_argument("--tp", default="2,4,8", help="TP widths of the dense_tp (DeepGEMM) and mla_tp (heads = 128 / TP) tables")
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = set(args.tables.split(","))
    REST["s"] = max(0.0, args.rest)
    t0 = time.time()
    prov = {"env": env(), "command": "python -m benchmarks.gpu.op_tables " + " ".join(
        f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else (f"--{k}" if v else "") for k, v in vars(args).items()),
        "method": "device time = CUDA-graph replay of R back-to-back launches / R (median of 15 replays), weights/KV "
                  f"cycled over copies so one pass reads > {L2_SPILL_BYTES >> 20} MiB; eager = one call, CUDA events, "
                  "median of 20; rel_err vs kernels.reference on the same inputs", "stages": {}}
    m_grid = (1, 64, 128, 4096) if args.quick else M_GRID
    gemms = dict(list(V3_GEMMS.items())[:2]) if args.quick else V3_GEMMS
    writer = TableWriter(out, prov, t0)
    tps = [int(t) for t in args.tp.split(",")]

    def heads_arg() -> tuple:
        return tuple(tuple(int(v) for v in h.split("/")) for h in args.gqa_heads.split(","))
    stages = [("dense", lambda: dense_gemm_rows(writer.emit, ("deepgemm", "triton"), m_grid, gemms)),
              ("dense_tp", lambda: dense_gemm_rows(writer.emit, ("deepgemm",), m_grid, tp_shards(tps))),
              ("masked", lambda: masked_grouped_rows(writer.emit, (32,) if args.quick else (8, 32, 256),
                                                     (1, 8, 64) if args.quick else (1, 4, 8, 16, 32, 64, 128, 256),
                                                     {"expert_gate_up": (4096, 7168), "expert_down": (7168, 2048)})),
              # experts split by TP (each GPU holds every expert's N/TP gate_up columns and K/TP down rows): the
              # shapes the routed-expert ramp prices without a table (DeepSeek-V3 TP8 and TP4, Qwen3-235B TP4; DeepGEMM's
              # block scales need N and K in multiples of 128, so Qwen3's TP8 down projection, K = 192, is not one)
              ("masked_tp", lambda: masked_grouped_rows(writer.emit, (8, 32, 128, 256), (1, 4, 16, 64),
                                                        {"v3_tp8_gate_up": (512, 7168), "v3_tp8_down": (7168, 256),
                                                         "v3_tp4_gate_up": (1024, 7168), "v3_tp4_down": (7168, 512),
                                                         "q235_tp4_gate_up": (768, 4096), "q235_tp4_down": (4096, 384)})),
              # prefill MoE: the contiguous layout by tokens routed, DeepSeek-V3's experts whole on one GPU (256) and on
              # one EP8 rank (32 of 256), split by TP8 and TP4, and Qwen3-235B-A22B's split by TP4 (128 experts, top-8)
              ("contig", lambda: contig_grouped_rows(
                  writer.emit, (512, 2048) if args.quick else (128, 512, 1024, 2048, 4096, 8192, 16384),
                  {"expert_gate_up": (4096, 7168, 256, 8, 256), "expert_down": (7168, 2048, 256, 8, 256),
                   "ep8_gate_up": (4096, 7168, 256, 8, 32), "ep8_down": (7168, 2048, 256, 8, 32),
                   "v3_tp8_gate_up": (512, 7168, 256, 8, 256), "v3_tp8_down": (7168, 256, 256, 8, 256),
                   "v3_tp4_gate_up": (1024, 7168, 256, 8, 256), "v3_tp4_down": (7168, 512, 256, 8, 256),
                   "q235_tp4_gate_up": (768, 4096, 128, 8, 128), "q235_tp4_down": (4096, 384, 128, 8, 128)})),
              # DeepSeek-V4-class mHC around a block (hyper-connection streams: projection, Sinkhorn, mixes)
              ("mhc", lambda: mhc_rows(writer.emit, (1, 64) if args.quick else (1, 4, 16, 64, 256, 1024, 4096, 16384),
                                       MHC_SHAPES)),
              ("mla", lambda: mla_decode_rows(writer.emit, (1, 64) if args.quick else (1, 8, 32, 64, 128, 256),
                                              (4096,) if args.quick else (512, 2048, 8192, 32768))),
              ("dense_bf16", lambda: (dense_gemm_rows(writer.emit, ("deepgemm",), m_grid, {**gemms, **BF16_EXTRA}),
                                      bf16_gemm_rows(writer.emit, m_grid, {**gemms, **BF16_EXTRA}))),
              ("dense_bf16_qwen", lambda: bf16_gemm_rows(writer.emit, m_grid, BF16_QWEN)),
              ("gqa", lambda: gqa_attention_rows(writer.emit, (1, 64) if args.quick else (1, 8, 32, 64, 128, 256),
                                                 (2048,) if args.quick else tuple(int(v) for v in args.gqa_contexts.split(",")),
                                                 (16, 512) if args.quick else (1, 16, 128, 512, 2048, 8192),
                                                 (0, 4096) if args.quick else tuple(int(v) for v in args.gqa_cached.split(",")),
                                                 tuple(tuple(int(v) for v in h.split("/")) for h in args.gqa_heads.split(",")))),
              ("gqa_mix", lambda: gqa_mix_rows(writer.emit, GQA_MIX[:2] if args.quick else GQA_MIX,
                                               tuple(tuple(int(v) for v in h.split("/")) for h in args.gqa_heads.split(",")))),
              ("gqa_mix2", lambda: gqa_mix_rows(writer.emit, GQA_MIX2, tuple(tuple(int(v) for v in h.split("/"))
                                                                          for h in args.gqa_heads.split(",")), "gqa_mix2")),
              ("gqa_order", lambda: gqa_mix_rows(writer.emit, GQA_ORDER[:2] if args.quick else GQA_ORDER, heads_arg(),
                                                 "gqa_order")),
              ("gqa_walk", lambda: (gqa_mix_rows(writer.emit, GQA_WALK[:2] if args.quick else GQA_WALK, heads_arg(), "gqa_walk"),
                                    gqa_mix_rows(writer.emit, GQA_WALK_UNSPLIT, heads_arg(), "gqa_walk_unsplit", 1))),
              ("gqa_multi", lambda: gqa_mix_rows(writer.emit, gqa_multi_mixes(heads_arg(), cached=tuple(
                  int(v) for v in args.gqa_cached.split(","))), heads_arg(), "gqa_multi")),
              ("mla_tp", lambda: mla_decode_rows(writer.emit, (1, 8, 32, 64, 128, 256), (512, 2048, 8192, 32768),
                                                 tuple(128 // t for t in tps)))]
    for name, fn in stages:
        if name not in tables:
            continue
        s0 = time.time()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            prov["stages"][name] = f"failed: {type(e).__name__}: {e}"[:300]
        prov["stages"].setdefault(name, f"{time.time() - s0:.0f} s")
        writer.flush()


class TableWriter:
    """Collects rows and rewrites the CSV and provenance after each one: a timeout keeps what ran."""

    def __init__(self, out: Path, prov: dict, t0: float):
        self.out, self.prov, self.t0, self.rows = out, prov, t0, []

    def emit(self, row: dict) -> None:
        print(row, flush=True)
        self.rows.append(row)
        self.flush()

    def flush(self) -> None:
        with open(self.out / "op_tables.csv", "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            for r in self.rows:
                w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items() if k in FIELDS})
        self.prov["seconds"] = round(time.time() - self.t0)
        (self.out / "op_tables.provenance.json").write_text(json.dumps(self.prov, indent=1))

if __name__ == "__main__":
    main()
