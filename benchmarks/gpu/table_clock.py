"""The SM clock while an op table times its shape (issue 16): are the tables timed at full clock?

``benchmarks/gpu/op_tables.py`` times a shape as the median of 15 replays of a CUDA graph of R back-to-back launches
(about 2 ms each), right after the previous shape. ``costmodels.power`` takes the tables as timed near the boost
clock and prices the power limit on top (a prompt step under sustained load runs at the clock the limit allows). If
the limiter takes the clock down within the table's own ~30-60 ms of back-to-back work, the big shapes' table times
already hold a capped clock, and a step that runs them at full clock (a key walk on a few SMs, a step from rest) is
priced too slow, while the governor counts the same cap twice under sustained load.

For each case this replays the table's own graph from rest (``REST_S`` idle): ``TABLE_REPLAYS`` replays as the table
does, then on to ``SETTLE_S`` of back-to-back replays. NVML is read every ``beyond_grid.TRACE_DT`` s on a thread
(SM clock, instant board power, the SW power cap flag). Per replay: its CUDA-event device time per call and the
samples inside its host span. Printed per case: the first replay, the table's median, the settled median, each
with its median clock.

    python3 -m benchmarks.gpu.table_clock --out DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REST_S, TABLE_REPLAYS, SETTLE_S = 1.0, 15, 0.6

# (name, FA3 varlen sequences (new, keys), query heads, KV heads, head dim): the GQA table's compute-bound chunks,
# a decode batch (HBM-bound), and mixes whose time is one decode's key walk on a few SMs
FA3_CASES = (
    ("gqa 32/8 8192 over 0", [(8192, 8192)], 32, 8, 128),
    ("gqa 32/8 2048 over 16384", [(2048, 18432)], 32, 8, 128),
    ("gqa 8/1 8192 over 0", [(8192, 8192)], 8, 1, 128),
    ("gqa 32/8 64 decodes at 32768", [(1, 32768)] * 64, 32, 8, 128),
    ("gqa 32/8 1000 over 0 + 4 decodes at 12000", [(1000, 1000)] + [(1, 12000)] * 4, 32, 8, 128),
    ("gqa 32/8 1 decode at 20000 + 2048 over 0", [(1, 20000), (2048, 2048)], 32, 8, 128),
    ("gqa 8/1 1 decode at 20000 + 2048 over 0", [(1, 20000), (2048, 2048)], 8, 1, 128),
)
GEMM_CASES = (("bf16 gemm 8192x8192x8192", 8192, 8192, 8192),)


def summarize(replays: list[dict], samples: list[tuple], first: int = TABLE_REPLAYS) -> dict:
    """``replays``: per replay ``{"t0", "t1"}`` (host seconds from the trace start) and ``us`` (device us a call);
    ``samples``: (seconds, MHz, W, capped). Per replay its samples' median MHz, max W and capped count; then the
    first replay, the median of the first ``first`` (the table's own figure) and of the rest (settled), each with the
    median of its replays' clocks."""
    def med(xs):
        xs = sorted(x for x in xs if x is not None)
        return xs[len(xs) // 2] if xs else None

    for r in replays:
        inside = [s for s in samples if r["t0"] <= s[0] <= r["t1"]]
        r["mhz"] = med([s[1] for s in inside])
        r["w_max"] = max((s[2] for s in inside), default=None)
        r["capped"] = sum(s[3] for s in inside)
        r["n"] = len(inside)
    head, tail = replays[:first], replays[first:]
    out = {"first_us": replays[0]["us"] if replays else None, "first_mhz": replays[0]["mhz"] if replays else None,
           "table_us": med([r["us"] for r in head]), "table_mhz": med([r["mhz"] for r in head]),
           "settled_us": med([r["us"] for r in tail]), "settled_mhz": med([r["mhz"] for r in tail]),
           "settled_capped": sum(r["capped"] for r in tail), "settled_samples": sum(r["n"] for r in tail),
           "replays": len(replays)}
    return out


def trace_graph(g, reps: int, read) -> tuple[list[dict], list[tuple]]:
    """Replays of graph ``g`` (``reps`` calls each) from ``REST_S`` idle: ``TABLE_REPLAYS`` of them, then on for
    ``SETTLE_S``; NVML read on a thread throughout. (replays, samples) as ``summarize`` takes them."""
    import torch

    from benchmarks.gpu.beyond_grid import NvmlSampler

    torch.cuda.synchronize()
    time.sleep(REST_S)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replays = []
    with NvmlSampler(read) as sampler:
        time.sleep(0.02)
        t_start = time.perf_counter()
        while len(replays) < TABLE_REPLAYS or time.perf_counter() - t_start < SETTLE_S:
            h0 = sampler.now()
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            replays.append({"t0": h0, "t1": sampler.now(), "us": a.elapsed_time(b) * 1e3 / reps})
        time.sleep(0.2)
    return replays, sampler.samples


def fa3_graph(seqs, hq: int, hkv: int, d: int):
    """(graph, reps) of the op table's FA3 varlen case (``op_tables.Fa3Case``: K/V cycled over copies past L2,
    ``reps_for`` launches a replay)."""
    from benchmarks.gpu.op_tables import Fa3Case, capture_graph, copies_for, eager_time_us, reps_for
    from kernels.vendor import _fa3_varlen

    ncop = copies_for(Fa3Case.kv_bytes(seqs, hkv, d))
    case = Fa3Case(_fa3_varlen(), seqs, hq, hkv, d, ncop)
    reps = reps_for(eager_time_us(lambda: case.call(0)))
    return capture_graph([lambda i=i: case.call(i) for i in range(ncop)], reps), reps


def gemm_graph(m: int, n: int, k: int):
    """(graph, reps) of a BF16 cuBLAS GEMM (a compute-bound reference)."""
    import torch

    from benchmarks.gpu.op_tables import capture_graph, eager_time_us, reps_for

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    reps = reps_for(eager_time_us(lambda: x @ w.t()))
    return capture_graph([lambda: x @ w.t()], reps), reps


def main() -> None:
    import argparse

    import torch

    from benchmarks.gpu.beyond_grid import _nvml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    read = _nvml()
    if read is None:
        print("NVML cannot be read here: no clock to trace", flush=True)
        return
    rows = []
    cases = [(name, lambda s=s, hq=hq, hkv=hkv, d=d: fa3_graph(s, hq, hkv, d)) for name, s, hq, hkv, d in FA3_CASES]
    cases += [(name, lambda m=m, n=n, k=k: gemm_graph(m, n, k)) for name, m, n, k in GEMM_CASES]
    for name, build in cases:
        try:
            g, reps = build()
            replays, samples = trace_graph(g, reps, read)
            s = summarize(replays, samples)
            del g
            torch.cuda.empty_cache()
        except Exception as ex:  # noqa: BLE001  (a case that cannot run here: the rest still do)
            print(f"{name}: {type(ex).__name__}: {ex}"[:300], flush=True)
            continue
        rows.append({"case": name, "reps": reps, **s, "trace": {"replays": replays,
                     "samples": [[round(t, 5), m, round(w, 1), c] for t, m, w, c in samples]}})

        def f(us, mhz):
            return f"{us:.1f} us at {mhz:.0f} MHz" if us is not None and mhz is not None else "-"
        print(f"{name}: first {f(s['first_us'], s['first_mhz'])}; table (median of {TABLE_REPLAYS}) "
              f"{f(s['table_us'], s['table_mhz'])}; settled {f(s['settled_us'], s['settled_mhz'])} "
              f"(capped {s['settled_capped']}/{s['settled_samples']}); {s['replays']} replays of {reps}", flush=True)
    (out / "table_clock.json").write_text(json.dumps({"command": "python3 -m benchmarks.gpu.table_clock "
                                                      + " ".join(sys.argv[1:]), "gpu": torch.cuda.get_device_name(),
                                                      "rows": rows}) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
