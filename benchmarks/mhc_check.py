"""The mHC kernels as measured (op tables, stage ``mhc``) beside what the cost model prices without a table.

For each GPU folder of ``costmodels/data/op_tables`` holding ``mhc.csv`` and each measured width: per kernel and token
count the measured device time, the analytic fallback the cost model uses where no table holds a model's width
(``StepOps._mhc_rows``: bytes at the catalog's streaming rate plus one launch; the projection by its TF32 math where
that is longer), their ratio, the achieved bandwidth as a fraction of the GPU's HBM peak, and what one Sinkhorn
iteration costs in the pre kernel (its time at the model's iterations minus at one, per iteration). Then the same
kernels on the other GPUs of the catalog as the table transfers (``op_table.MhcKernels``). Prints the worst ratios.

    python -m benchmarks.mhc_check [--json]
"""

from __future__ import annotations

import argparse
import csv
import json

import numpy as np

from costmodels import op_table
from costmodels.calibration_source import profile_for
from costmodels.hardware import get_hardware
from costmodels.op_table import MHC_OPS, MhcKernels, mhc_bytes

PRE_OPS = ("mhc_pre", op_table.MHC_CHAIN_OP, op_table.MHC_PRE_V2_OP)   # pre-kernel rows, keyed by their iterations


def analytic(op: str, t: float, n: int, h: int, hw) -> float:
    """The cost model's fallback for one kernel (``StepOps._mhc_rows`` without a table: ``op_table.mhc_fallback_s``)."""
    cal = profile_for(hw)
    tf32 = hw.tf32_rate * cal.gemm_compute_eff.get("bf16", 0.662)
    return float(op_table.mhc_fallback_s(op, t, n, h, hw.hbm_bw * cal.mem_eff, cal.launch_overhead_s, tf32))


def rows_of(gpu: str) -> list[dict]:
    path = op_table.DATA / gpu.lower() / "mhc.csv"
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if r.get("device_us")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = []
    for gpu in op_table.measured_gpus():
        if not (op_table.DATA / gpu.lower() / "mhc.csv").is_file():
            continue
        hw = get_hardware(gpu)
        tabs = op_table.load(gpu)
        best: dict[tuple, float] = {}
        for r in rows_of(gpu):
            n, k, t = int(r["groups"]), int(r["k"]), float(r["m"])
            key = (r["op"], n, k // n, t, int(float(r["context"])) if r["op"] in PRE_OPS else 0)
            best[key] = min(best.get(key, np.inf), float(r["device_us"]) * 1e-6)
        for (op, n, h, t, it), s in sorted(best.items()):
            kind = "mhc_pre" if op in PRE_OPS else op
            a = analytic(kind, t, n, h, hw)
            row = {"gpu": tabs.gpu, "op": op, "n": n, "hidden": h, "tokens": t, "iters": it, "measured_us": s * 1e6,
                   "analytic_us": a * 1e6, "analytic/measured": a / s,
                   "hbm_fraction": float(mhc_bytes(kind, t, n, h)) / s / hw.hbm_bw}
            if kind == "mhc_pre":
                # what the cost model prices (no pre table: bytes plus launch plus the measured chain, StepOps._mhc_rows)
                mk = MhcKernels.on(tabs, hw, n, h, it, profile_for(hw).mem_eff, 0.749)
                if mk is not None and "mhc_pre" not in mk.series:
                    row["priced_us"] = (a + it * mk.chain_s) * 1e6
                    row["priced/measured"] = row["priced_us"] / row["measured_us"]
            out.append(row)
        pre = {(op, h, t, it): s for (op, n, h, t, it), s in best.items() if op in PRE_OPS}
        for (op, h, t, it), s in sorted(pre.items()):
            if it > 1 and (op, h, t, 1) in pre:
                out.append({"gpu": tabs.gpu, "op": "sinkhorn_per_iteration", "kernel": op, "hidden": h, "tokens": t,
                            "us": (s - pre[(op, h, t, 1)]) / (it - 1) * 1e6})
        for target in ("H200", "H100", "B200", "GB300"):
            thw = get_hardware(target)
            for (_, n, h, it), _ser in tabs.mhc.items():
                if _ != "mhc_post" or thw.name == tabs.gpu:
                    continue
                mk = MhcKernels.on(tabs, thw, n, h, 20, profile_for(thw).mem_eff, 0.749)
                if mk is None:
                    continue
                for op in (o for o in MHC_OPS if o in mk.series):
                    ts = np.array([1.0, 64.0, 1024.0, 16384.0])
                    out.append({"gpu": f"{tabs.gpu} -> {thw.name}", "op": op, "n": n, "hidden": h,
                                "us_at_1_64_1024_16384": [round(float(x) * 1e6, 2) for x in mk.seconds(op, ts)]})
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for r in out:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    ratios = [r["analytic/measured"] for r in out if "analytic/measured" in r]
    if ratios:
        print(f"analytic fallback / measured: min {min(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} rows")


if __name__ == "__main__":
    main()
