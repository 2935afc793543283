"""Issue 18, MLA prefill-chunk attention on the device: the flash split + LSE merge vs the SDPA backends.

One prefill chunk as ``MLAAttention.prefill_attend`` hands it to ``ops.attention_prefill``: 128 heads, q/k 192,
v 128, bf16, the n queries are the last n of n + cached keys (bottom-right causal). Variants, each in the same process:

- ``fa3``: the registry's first choice on Hopper where vLLM's FlashAttention-3 extension loads (kernels.vendor
  .fa3_prefill): one varlen call, causal aligned bottom-right, v at its own head dim (128);
- ``flash_split``: the registry's ``flash`` impl (kernels/prefill_attention.py): causal self part + unmasked cached
  part through ``aten._scaled_dot_product_flash_attention``, merged by log-sum-exp (v zero-padded to 192; the merge
  is one Triton launch, kernels/triton_attn_merge.py);
- ``flash_direct``: ONE ``aten._flash_attention_forward`` call with ``is_causal`` and q_len < k_len. FlashAttention-2
  (>= 2.1) aligns its causal mask bottom-right, which is what a chunk needs; torch's SDPA refuses flash for causal
  non-square calls because its documented ``is_causal`` is top-left. Timed and checked here (``rel`` against the
  reference says whether the alignment is bottom-right in this build); not used by the executor;
- ``mem_efficient``: ``kernels.torch_fast.attention_sdpa`` (the pinned path: explicit mask, memory-efficient);
- ``cudnn``: the same masked SDPA call pinned to cuDNN (per-shape execution plan);
- ``math``: the same pinned to math.

Per variant and shape: the first call's wall ms (host clock around a synchronised call; the very first shape of a
variant also pays lazy kernel loading), the steady device ms (CUDA events, median of ``--iters`` after warm-up) and
the relative error against ``reference.attention`` (fp32). Then ``--new-shapes`` shapes never seen before (first
call minus steady = what a new shape costs; chunked prefill makes one nearly every step). The flash split's parts
(pad, self, cached, merge) are timed alone too.

Usage: python -m benchmarks.gpu.attn_prefill_bench OUT.json [--shapes 64x0,1000x3000,4096x0,517x5003] [--iters 20]
       [--new-shapes 4] [--variants fa3,flash_split,flash_direct,mem_efficient,cudnn,math]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.gpu.bench_kernels import timed
from kernels import prefill_attention as PA
from kernels import reference as R
from kernels.torch_fast import attention_sdpa

H, DQK, DV = 128, 192, 128   # DeepSeek-V3 MLA prefill (expanded form): heads, q/k head dim (128 nope + 64 rope), v


def problem(n: int, cached: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    s = n + cached
    q = torch.randn(n, H, DQK, device="cuda", generator=g).bfloat16()
    k = torch.randn(s, H, DQK, device="cuda", generator=g).bfloat16()
    v = torch.randn(s, H, DV, device="cuda", generator=g).bfloat16()
    return q, k, v, torch.arange(cached, s, device="cuda"), DQK ** -0.5


def _masked_sdpa(backend):
    def run(q, k, v, pos, scale):
        s = k.shape[0]
        mask = torch.arange(s, device=q.device)[None, :] <= pos[:, None]
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                                 attn_mask=mask[None, None], scale=scale)
        return out[0].transpose(0, 1).contiguous()
    return run


def flash_direct(q, k, v, pos, scale):
    """One FlashAttention-2 call, causal with q_len <= k_len (bottom-right if FA2's convention holds)."""
    vp = F.pad(v, (0, q.shape[-1] - v.shape[-1]))
    out = torch.ops.aten._flash_attention_forward(q[None], k[None], vp[None], None, None, q.shape[0], k.shape[0],
                                                  0.0, True, False, scale=scale)[0]
    return out[0, :, :, : v.shape[-1]].contiguous()


def fa3(q, k, v, pos, scale):
    """One FlashAttention-3 varlen call (kernels.vendor.fa3_prefill: vLLM's sm90 build, bottom-right causal, v at 128)."""
    from kernels.vendor import fa3_prefill
    return fa3_prefill(q, k, v, pos, scale, None, True)


VARIANTS = {
    "fa3": fa3,
    "flash_split": lambda q, k, v, pos, scale: PA.attention_prefill_flash(q, k, v, pos, scale, None, True),
    "flash_direct": flash_direct,
    "mem_efficient": lambda q, k, v, pos, scale: attention_sdpa(q, k, v, pos, scale),
    "cudnn": _masked_sdpa(SDPBackend.CUDNN_ATTENTION),
    "math": _masked_sdpa(SDPBackend.MATH),
}


def first_call_ms(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def steady_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median device ms of one eager call (CUDA events around each), after warm-up (``bench_kernels.timed``)."""
    return timed(fn, warmup=warmup, iters=iters) * 1e3


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def flops(n: int, cached: int) -> float:
    """Useful FLOPs of the chunk (QK^T and PV over visible keys only), as executor.calibrate counts them."""
    return 2.0 * H * (DQK + DV) * (n * cached + n * (n + 1) / 2)


def bench_shape(name: str, fn, n: int, cached: int, iters: int, want) -> dict:
    q, k, v, pos, scale = problem(n, cached)
    row = {"variant": name, "new": n, "cached": cached}
    try:
        row["first_ms"] = round(first_call_ms(lambda: fn(q, k, v, pos, scale)), 3)
        row["steady_ms"] = round(steady_ms(lambda: fn(q, k, v, pos, scale), iters), 4)
        row["tflops"] = round(flops(n, cached) / row["steady_ms"] / 1e9, 1)
        row["rel_err"] = rel(fn(q, k, v, pos, scale), want)
    except Exception as e:   # noqa: BLE001  a backend that cannot run the shape (declined, out of memory)
        row["error"] = str(e).splitlines()[0][:200]
    torch.cuda.empty_cache()
    return row


def split_parts(n: int, cached: int, iters: int) -> dict:
    """The flash split's steps alone: v padding, the causal self part, the cached part, the merge (torch ops and
    the one-launch Triton merge the split uses on CUDA, with their largest difference)."""
    q, k, v, pos, scale = problem(n, cached)
    vp = F.pad(v, (0, DQK - DV))
    c = cached
    o1, l1 = PA.attention_lse_flash(q, k[c:], vp[c:], scale, True)
    out = {"new": n, "cached": cached, "pad_ms": steady_ms(lambda: F.pad(v, (0, DQK - DV)), iters),
           "self_ms": steady_ms(lambda: PA.attention_lse_flash(q, k[c:], vp[c:], scale, True), iters)}
    if c:
        o2, l2 = PA.attention_lse_flash(q, k[:c], vp[:c], scale, False)
        out["cached_ms"] = steady_ms(lambda: PA.attention_lse_flash(q, k[:c], vp[:c], scale, False), iters)
        out["merge_torch_ms"] = steady_ms(lambda: PA.merge_attn_states(o1[..., :DV], l1, o2[..., :DV], l2), iters)
        fast = PA.fast_merge(q.device)
        if fast is not PA.merge_attn_states:
            out["merge_triton_ms"] = steady_ms(lambda: fast(o1[..., :DV], l1, o2[..., :DV], l2), iters)
            a, b = fast(o1[..., :DV], l1, o2[..., :DV], l2), PA.merge_attn_states(o1[..., :DV], l1, o2[..., :DV], l2)
            out["merge_triton_vs_torch_max_abs"] = float((a.float() - b.float()).abs().max())
    return {k_: (round(v_, 4) if isinstance(v_, float) else v_) for k_, v_ in out.items()}


def new_shapes(name: str, fn, count: int, iters: int, salt: int) -> list[dict]:
    """``count`` shapes this variant never ran (distinct n and cached per variant): first call vs steady."""
    rows = []
    for j in range(count):
        n, c = 700 + 37 * j + 3 * salt, 2000 + 211 * j + 7 * salt
        q, k, v, pos, scale = problem(n, c, seed=j)
        try:
            first = first_call_ms(lambda: fn(q, k, v, pos, scale))
            steady = steady_ms(lambda: fn(q, k, v, pos, scale), max(3, iters // 4), warmup=1)
        except Exception as e:   # noqa: BLE001  this variant cannot run here: say so, go on
            rows.append({"variant": name, "new": n, "cached": c, "error": str(e).splitlines()[0][:200]})
            break
        rows.append({"variant": name, "new": n, "cached": c, "first_ms": round(first, 3), "steady_ms": round(steady, 4),
                     "one_time_ms": round(first - steady, 3)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", default="64x0,1000x3000,4096x0,517x5003")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--new-shapes", type=int, default=4)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    names = a.variants.split(",")
    res = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(),
           "heads": H, "d_qk": DQK, "d_v": DV, "dtype": "bf16", "iters": a.iters, "rows": [], "new_shapes": [], "parts": []}

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    wants = {}
    for n, c in shapes:   # the fp32 reference once per shape (kept on the host: ~n*H*128*2 bytes)
        q, k, v, pos, scale = problem(n, c)
        wants[(n, c)] = R.attention(q, k, v, pos, scale).cpu()
        del q, k, v
        torch.cuda.empty_cache()
    with torch.inference_mode():
        for i, name in enumerate(names):
            for n, c in shapes:
                row = bench_shape(name, VARIANTS[name], n, c, a.iters, wants[(n, c)].cuda())
                res["rows"].append(row)
                print(f"{name:14s} new {n:5d} cached {c:5d}: first {row.get('first_ms', float('nan')):9.2f} ms  "
                      f"steady {row.get('steady_ms', float('nan')):8.3f} ms  {row.get('tflops', 0):6.1f} TF/s  "
                      f"rel {row.get('rel_err', float('nan')):.2e}  {row.get('error', '')}", flush=True)
                save()
            for row in new_shapes(name, VARIANTS[name], a.new_shapes, a.iters, salt=i):
                res["new_shapes"].append(row)
                if "error" in row:
                    print(f"{name:14s} NEW shape {row['new']:5d} x {row['cached']:5d}: {row['error']}", flush=True)
                    continue
                print(f"{name:14s} NEW shape {row['new']:5d} x {row['cached']:5d}: first {row['first_ms']:8.2f} ms, "
                      f"steady {row['steady_ms']:7.3f} ms, one-time {row['one_time_ms']:+8.2f} ms", flush=True)
                save()
        for n, c in shapes:
            res["parts"].append(split_parts(n, c, a.iters))
            print("flash_split parts:", res["parts"][-1], flush=True)
            save()
    summary(res)
    save()


def summary(res: dict) -> None:
    """Steady ms per shape side by side, with each variant's ratio to mem_efficient (the path before this change)."""
    by = {(r["variant"], r["new"], r["cached"]): r for r in res["rows"] if "steady_ms" in r}
    print("\nsteady ms (ratio to mem_efficient):")
    for n, c in sorted({(r["new"], r["cached"]) for r in res["rows"]}):
        base = by.get(("mem_efficient", n, c), {}).get("steady_ms")
        cells = []
        for v in VARIANTS:
            r = by.get((v, n, c))
            if r:
                cells.append(f"{v} {r['steady_ms']:.3f}" + (f" ({r['steady_ms'] / base:.2f}x)" if base else ""))
        print(f"  {n:5d} x {c:5d}: " + ", ".join(cells))
    print("\nspeed as a fraction of the fastest variant at each shape (issue 18's target: >= 0.9 for what serving runs):")
    for n, c in sorted({(r["new"], r["cached"]) for r in res["rows"]}):
        times = {v: by[(v, n, c)]["steady_ms"] for v in VARIANTS if (v, n, c) in by}
        if times:
            best = min(times, key=times.get)
            print(f"  {n:5d} x {c:5d}: fastest {best}; " + ", ".join(f"{v} {times[best] / t:.2f}" for v, t in times.items()))


if __name__ == "__main__":
    main()
