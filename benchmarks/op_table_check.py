"""How far the cost model's op times are from the H200's measured op tables (device time, CUDA graphs).

For DeepSeek-V3 FP8 on the H200 under TP 1/2/4/8, at decode batches and prefill chunks, it prices one
step with the cost model (``StepCostModel.step``: the op list `twinfer cost` prints) and sets each dense
GEMM and the MLA decode attention next to the measured kernel time at the same shape
(``costmodels/op_table.py``; the engine fuses q_a and kv_a into one 2112-column GEMM, so their sum is
compared with that GEMM). Prints one row per (TP, M, op) and a summary per size bucket: median and worst
ratio model / measured. Where the cost model itself reads a table (FP8 GEMMs, MLA decode attention since
issue 16) a bucket near 1.00 checks the wiring (shapes, heads per GPU, batch and context per rank); the
formula's distance from the tables is in docs/costmodel.md.

    python benchmarks/op_table_check.py [--tp 1,8] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from costmodels import op_table
from costmodels.batch import BatchShape
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.step import StepCostModel


def gemm_shapes(tp: int) -> dict[str, list[tuple[int, int]]]:
    """Cost-model op name -> the (N, K) GEMMs the engine runs for it on one TP rank (DeepSeek-V3)."""
    return {"q_a_proj+kv_a_proj": [(2112, 7168)], "q_b_proj": [(24576 // tp, 1536)], "kv_b_proj": [(32768 // tp, 512)],
            "o_proj": [(7168, 16384 // tp)], "shared_expert": [(4096 // tp, 7168), (7168, 2048 // tp)],
            "dense_ffn": [(36864 // tp, 7168), (7168, 18432 // tp)]}


def model_op_times(cm: StepCostModel, batch: BatchShape) -> dict[str, float]:
    """Seconds per call of each op of one step (first occurrence of a name: MoE-layer and dense-layer copies agree)."""
    out: dict[str, float] = {}
    for o in cm.step(batch).ops:
        if o.count and o.name not in out:
            out[o.name] = o.time_s / o.count
    out["q_a_proj+kv_a_proj"] = out.get("q_a_proj", 0.0) + out.get("kv_a_proj", 0.0)
    return out


def compare(tps: list[int]) -> list[dict]:
    tables = op_table.load("H200")
    gemm = tables.gemm_table("fp8")
    model, hw = get_model("deepseek-v3"), get_hardware("H200")
    rows = []
    for tp in tps:
        cm = StepCostModel(model, hw, ParallelLayout(tp=tp, weight_dtype="fp8"))
        cases = [("decode", b, BatchShape.decode(b, 4096)) for b in (1, 16, 64, 128, 256)]
        cases += [("prefill", m, BatchShape.prefill(1, m)) for m in (4096, 16384)]
        for phase, m, batch in cases:
            got = model_op_times(cm, batch)
            for name, shapes in gemm_shapes(tp).items():
                looks = [gemm.time(m, n, k) for n, k in shapes]
                meas = sum(float(lk.seconds[0]) for lk in looks)
                src = "+".join(str(lk.source[0]) for lk in looks)
                rows.append({"tp": tp, "phase": phase, "m": m, "op": name, "model_us": got[name] * 1e6,
                             "measured_us": meas * 1e6, "ratio": got[name] / meas, "source": src})
            if phase == "decode":
                lk = tables.mla_decode[128 // tp].time([m], [4096])
                rows.append({"tp": tp, "phase": phase, "m": m, "op": "attention (MLA decode, ctx 4096)",
                             "model_us": got["attention_full"] * 1e6, "measured_us": float(lk.seconds[0]) * 1e6,
                             "ratio": got["attention_full"] / float(lk.seconds[0]), "source": str(lk.source[0])})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for label, pick in (("dense GEMMs, M <= 128", lambda r: r["op"][0] != "a" and r["m"] <= 128),
                        ("dense GEMMs, M = 256", lambda r: r["op"][0] != "a" and r["m"] == 256),
                        ("dense GEMMs, M >= 4096", lambda r: r["op"][0] != "a" and r["m"] >= 4096),
                        ("MLA decode attention", lambda r: r["op"][0] == "a")):
        ratios = [r["ratio"] for r in rows if pick(r)]
        if ratios:
            worst = max(ratios, key=lambda x: abs(np.log(x)))
            out.append({"bucket": label, "n": len(ratios), "median_ratio": statistics.median(ratios), "worst_ratio": worst,
                        "within_15pct": sum(abs(x - 1) <= 0.15 for x in ratios)})
    return out


BASE_SHAPES = {(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (36864, 7168), (7168, 18432), (4096, 7168),
               (7168, 2048)}


def bf16_held_out() -> dict[str, np.ndarray]:
    """The measured cuBLAS BF16 table's shapes, each priced from the others alone (``GemmTable``'s nearest shape,
    scaled by roofline + latency, the rule an unmeasured BF16 weight takes): predicted over measured, by M bucket."""
    import copy
    g = op_table.load("H200").gemm["cublas", "bf16"]
    buckets: dict[str, list[float]] = {"M <= 128": [], "128 < M < 4096": [], "M >= 4096": []}
    for fam, (ms, ts) in g.families.items():
        held = copy.copy(g)
        held.families = {f: v for f, v in g.families.items() if f != fam}
        held.__dict__.pop("_family_memo", None)
        for m, t in zip(ms, ts):
            key = "M <= 128" if m <= 128 else ("M >= 4096" if m >= 4096 else "128 < M < 4096")
            buckets[key].append(held.time(m, *fam).seconds[0] / t)
    return {k: np.array(v) for k, v in buckets.items()}


def held_out() -> list[str]:
    """What the rules for unmeasured shapes predict for measured data they are not given: the TP-shard GEMMs from
    the 8 base shapes alone, and each MLA head count from the next measured one."""
    import copy
    tables = op_table.load("H200")
    g = tables.gemm["deepgemm", "fp8"]
    held = copy.copy(g)
    held.families = {f: v for f, v in g.families.items() if f in BASE_SHAPES}
    out, buckets = [], {"M <= 128": [], "128 < M < 4096": [], "M >= 4096": []}
    for fam, (ms, ts) in g.families.items():
        if fam not in BASE_SHAPES:
            for m, t in zip(ms, ts):
                key = "M <= 128" if m <= 128 else ("M >= 4096" if m >= 4096 else "128 < M < 4096")
                buckets[key].append(held.time(m, *fam).seconds[0] / t)
    for key, v in buckets.items():
        v = np.array(v)
        out.append(f"held-out TP-shard GEMMs, {key}: n={v.size}, median {np.median(v):.2f}x, p10 {np.percentile(v, 10):.2f}x, "
                   f"p90 {np.percentile(v, 90):.2f}x, within 15%: {int((abs(v - 1) <= 0.15).sum())}/{v.size}")
    for key, v in bf16_held_out().items():
        out.append(f"held-out BF16 GEMMs (each shape from the other measured ones), {key}: n={v.size}, median "
                   f"{np.median(v):.2f}x, p10 {np.percentile(v, 10):.2f}x, p90 {np.percentile(v, 90):.2f}x, "
                   f"within 15%: {int((abs(v - 1) <= 0.15).sum())}/{v.size}")
    for h, above in ((16, 32), (32, 64), (64, 128)):
        mine, nxt = tables.mla_decode[h], tables.mla_decode[above]
        r = np.array([nxt.time([b], [c]).seconds[0] / mine.seconds[i, j]
                      for i, b in enumerate(mine.xs) for j, c in enumerate(mine.ys)])
        out.append(f"held-out MLA {h} heads from the measured {above}: median {np.median(r):.2f}x, "
                   f"range {r.min():.2f}-{r.max():.2f}x")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--held-out", action="store_true", help="also the rules for unmeasured shapes on measured data they did not see")
    args = ap.parse_args()
    if args.held_out:
        print("\n".join(held_out()))
    rows = compare([int(t) for t in args.tp.split(",")])
    summ = summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summ}, indent=1))
        return
    print(f"{'TP':>3} {'phase':8} {'M':>6}  {'op':34} {'model us':>9} {'meas us':>9} {'ratio':>6}  source")
    for r in rows:
        print(f"{r['tp']:>3} {r['phase']:8} {r['m']:>6}  {r['op']:34} {r['model_us']:9.1f} {r['measured_us']:9.1f} "
              f"{r['ratio']:6.2f}  {r['source']}")
    print()
    for s in summ:
        print(f"{s['bucket']:24} n={s['n']:3}  median model/measured {s['median_ratio']:.2f}, worst {s['worst_ratio']:.2f}, "
              f"within 15%: {s['within_15pct']}/{s['n']}")


if __name__ == "__main__":
    main()
