"""Host cost of one ``kernels.ops.call`` per dispatch case, kernels replaced by no-ops (CPU, no GPU needed).

    python benchmarks/registry_dispatch.py                 # table, ns per call (median of repeats)
    python benchmarks/registry_dispatch.py --json          # the same as JSON
    PYTHONPATH=/tmp/old python benchmarks/registry_dispatch.py   # another checkout's kernels/ (e.g. before a change)

Each case installs a registry choice made of the real ``registry.IMPLS`` entries for the op (whatever the registry
under test declares for them: accept checks or not) with their kernels swapped for stand-ins: a no-op where the
implementation takes the call, and where it declines either the real adapter (``kernels.vendor`` imports on CPU and
declines before touching CUDA) or a copy of the Triton adapter's check that raises ``Unsupported`` as the adapter does
(Triton does not import on CPU). What is timed is therefore the dispatcher alone: choosing, declining, falling back,
recording ``ops.used``. ``direct`` calls the no-op without the dispatcher (the floor).

Cases (the ones marked * hit a decline on every eager call before issue 18's accept checks):
  one_candidate      CPU: one implementation, nothing to decide
  rms_norm_takes     Triton rms_norm takes a bf16 row block
  rms_norm_declines* Triton rms_norm declines fp64 rows, the torch reference runs
  mla_dsa*           DSA decode (top-k given): FlashMLA and Triton decline, torch_batched runs
  moe_decode*        decode-sized MoE (64 tokens): fused DeepGEMM declines, Triton runs
  raises_anyway*     dense decode after FlashMLA failed at run time: its adapter raises Unsupported, torch_batched runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # last: a checkout on PYTHONPATH wins

import torch  # noqa: E402

from kernels import ops, registry  # noqa: E402


def noop(*args, **kwargs):
    return None


def triton_rms_norm_check(x, weight, eps=1e-6):
    """kernels.triton_rowwise.rms_norm's own check, then the decline it raises."""
    d = x.shape[-1]
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or x.stride(-1) != 1 or d > 16384:
        raise registry.Unsupported("triton rms_norm: bf16/fp16/fp32, unit last stride, last dim <= 16384")
    return None


def triton_mla_check(q, kv_cache, block_table, seq_lens, scale, kv_rank, topk_indices=None):
    """kernels.triton_mla_decode.mla_decode's first check."""
    if topk_indices is not None:
        raise registry.Unsupported("triton mla_decode: dense attention only")
    return None


def impl(op: str, name: str) -> registry.Impl:
    return next(i for i in registry.IMPLS[op] if i.name == name)


def install(op: str, cands: list[tuple[registry.Impl, object]]) -> None:
    """Make ``cands`` the choice for ``op`` on the CPU, each implementation's kernel replaced by the given callable."""
    for im, fn in cands:
        registry._fn_cache[im.target] = fn
    ops._choices[(op, "cpu")] = registry.Choice(op, "cpu", [im for im, _ in cands], "benchmark")


def cases() -> dict[str, tuple[object, tuple, dict]]:
    """name -> (callable, args, kwargs), the registry choices installed."""
    from kernels import vendor
    registry._probe_cache["triton"] = (True, "triton", "imported triton")   # the MoE adapter's decode rule needs it
    bf = torch.zeros(64, 7168, dtype=torch.bfloat16)
    w = torch.ones(7168, dtype=torch.bfloat16)
    q = torch.zeros(64, 1, 128, 576, dtype=torch.bfloat16)
    kv = torch.zeros(8, 64, 576, dtype=torch.bfloat16)
    table = torch.zeros(64, 8, dtype=torch.int32)
    lens = torch.full((64,), 300, dtype=torch.int32)
    topk = torch.zeros(64, 1, 2048, dtype=torch.int32)
    x = torch.zeros(64, 7168, dtype=torch.bfloat16)
    wts = torch.ones(64, 8)
    ids = torch.zeros(64, 8, dtype=torch.int64)
    w13 = torch.zeros(4, 512, 7168, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(4, 7168, 256, dtype=torch.float8_e4m3fn)
    s13, s2 = torch.ones(4, 4, 56), torch.ones(4, 56, 2)

    install("gqa_decode", [(impl("gqa_decode", "torch"), noop)])
    # the Triton stand-in runs the adapter's check: it takes bf16 rows (the check's cost, as the adapter pays) and
    # raises on fp64 ones, as the adapter does
    install("rms_norm", [(impl("rms_norm", "triton"), triton_rms_norm_check), (impl("rms_norm", "torch"), noop)])
    install("mla_decode", [(impl("mla_decode", "flashmla"), vendor.flashmla_decode),
                           (impl("mla_decode", "triton"), triton_mla_check),
                           (impl("mla_decode", "torch_batched"), noop)])
    install("moe_experts", [(impl("moe_experts", "deepgemm"), vendor.deepgemm_moe_experts),
                            (impl("moe_experts", "triton"), noop)])
    # a vendor library that failed at run time: its adapter raises on every call (kernels.vendor.failures), no check
    # on the signature can know; the grouped_gemm slot holds a dense MLA decode choice for this case
    vendor.failures["flashmla"] = "RuntimeError: benchmark"
    ops._choices[("grouped_gemm", "cpu")] = registry.Choice("mla_decode", "cpu", [impl("mla_decode", "flashmla"),
                                                                                   impl("mla_decode", "torch_batched")])
    call = ops.call
    return {
        "direct": (noop, (bf, w, 1e-6), {}),
        "one_candidate": (lambda *a: call("gqa_decode", bf.device, *a), (bf, w, 1e-6), {}),
        "rms_norm_takes": (lambda *a: call("rms_norm", bf.device, *a), (bf, w, 1e-6), {}),
        "rms_norm_declines": (lambda *a: call("rms_norm", bf.device, *a), (bf.double(), w, 1e-6), {}),
        "mla_dsa": (lambda *a, **k: call("mla_decode", q.device, *a, **k), (q, kv, table, lens, 0.1, 512), {"topk_indices": topk}),
        "moe_decode": (lambda *a: call("moe_experts", x.device, *a), (x, wts, ids, w13, w2, s13, s2), {}),
        "raises_anyway": (lambda *a: call("grouped_gemm", q.device, *a), (q, kv, table, lens, 0.1, 512), {}),
    }


def per_call_ns(fn, args, kwargs, n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean ns per call of ``n`` calls (one warm-up pass first)."""
    for _ in range(n // 10 + 1):
        fn(*args, **kwargs)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn(*args, **kwargs)
        runs.append((time.perf_counter_ns() - t0) / n)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000, help="calls per repeat [20000]")
    ap.add_argument("--repeats", type=int, default=7, help="repeats, the median is reported [7]")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args()
    if a.calls < 1 or a.repeats < 1:
        ap.error("--calls and --repeats must be >= 1")
    res = {name: round(per_call_ns(fn, args, kw, a.calls, a.repeats)) for name, (fn, args, kw) in cases().items()}
    meta = {"kernels": str(Path(ops.__file__).resolve().parent), "python": sys.version.split()[0], "torch": torch.__version__,
            "accept_checks": any(getattr(i, "declines", None) for impls in registry.IMPLS.values() for i in impls)}
    if a.json:
        print(json.dumps({"meta": meta, "ns_per_call": res}, indent=1))
        return
    print(f"kernels from {meta['kernels']} (accept checks: {meta['accept_checks']}), python {meta['python']}, torch {meta['torch']}")
    for name, ns in res.items():
        print(f"  {name:18s} {ns:7d} ns/call")


if __name__ == "__main__":
    main()
