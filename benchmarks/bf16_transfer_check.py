"""The FP8-to-other-dtype rule against BF16 GEMMs timed on the device (held out: no BF16 kernel enters the rule).

A row whose weights are not FP8 and have no measured table of their dtype is priced from the FP8 table
(``costmodels.op_table.TableGemms``: the FP8 kernel at the shape, its floor kept, the rest scaled by the bytes and
the dtype's math rate): FP4 weights everywhere, and BF16 ones until the H200's cuBLAS BF16 table was measured
(2026-12-05; on that run the rule was 16% off at the median, +155% at worst: BF16 weights now use the table). ``python -m benchmarks.gpu.op_tables --tables dense_bf16`` times cuBLAS BF16 next to
DeepGEMM FP8 at the same shapes in one run; this prints, per shape and M, the measured BF16 time and two predictions:

- ``same run``: the rule applied to the FP8 kernel timed in the same run at the same shape (the rule alone);
- ``table``: the rule applied to the committed H200 FP8 table, as ``twinfer cost`` prices it (rule and table drift),

with the worst and median relative errors of each.

    python3 benchmarks/bf16_transfer_check.py RUN/op_tables.csv [--gpu H200]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def read_rows(path: str | Path) -> list[dict]:
    """The CSV's timed dense GEMM rows (no ``error``), fields as numbers where they are."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r.get("op") == "dense_gemm" and r.get("device_us") and not r.get("error")]
    for r in rows:
        r["m"], r["n"], r["k"], r["device_us"] = int(r["m"]), int(r["n"]), int(r["k"]), float(r["device_us"])
    return rows


def bf16_seconds(table, hw, cal, n: int, k: int, m: np.ndarray) -> np.ndarray:
    """A BF16 weight row ``n x k`` at ``m`` rows from the FP8 ``table`` on ``hw``: ``StepOps.g_table``'s arguments."""
    from costmodels.op_table import TableGemms
    g = TableGemms.on(table, hw, [[(n, k)]], np.array([True]), ["bf16"], np.array([2.0]), cal.mem_eff, cal.gemm_compute_eff)
    return g.seconds(0, np.asarray(m, float))


def compare(rows: list[dict], gpu: str = "H200") -> list[dict]:
    """Per measured BF16 row: measured seconds, the rule on the same run's FP8 kernel, the rule on the committed table."""
    from costmodels import op_table
    from costmodels.calibration_source import profile_for
    from costmodels.hardware import get_hardware
    from costmodels.op_table import GemmTable
    hw = get_hardware(gpu)
    cal = profile_for(hw)
    committed = op_table.load(gpu).gemm_table("fp8") if op_table.load(gpu) else None
    bf16 = op_table.load(gpu).gemm_table("bf16") if op_table.load(gpu) else None
    fp8 = [r for r in rows if r["dtype"] == "fp8"]
    same = GemmTable(fp8[0]["lib"] if fp8 else "?", "fp8", peak_flops=hw.tflops("fp8") * 1e12, hbm_bw=hw.hbm_bw,
                     measured_on=hw.name, source="the same run")
    for n, k in sorted({(r["n"], r["k"]) for r in fp8}):
        pts = sorted((r["m"], r["device_us"] * 1e-6) for r in fp8 if (r["n"], r["k"]) == (n, k))
        if len(pts) >= 2:
            same.families[(n, k)] = (np.array([p[0] for p in pts], float), np.array([p[1] for p in pts]))
    if committed is not None and same.families:   # one GEMM's floor on this GPU: the shortest kernel either timed
        same.__dict__["floor_s"] = min(same.floor_s, committed.floor_s)
    out = []
    for r in rows:
        if r["dtype"] != "bf16":
            continue
        m = np.array([r["m"]], float)
        row = {"name": r["name"], "m": r["m"], "n": r["n"], "k": r["k"], "measured_s": r["device_us"] * 1e-6}
        if (r["n"], r["k"]) in same.families:
            row["same_run_s"] = float(bf16_seconds(same, hw, cal, r["n"], r["k"], m)[0])
        if committed is not None:
            row["table_s"] = float(bf16_seconds(committed, hw, cal, r["n"], r["k"], m)[0])
        if bf16 is not None:   # the committed BF16 table itself (what the cost model prices since 2026-12-05)
            row["bf16_table_s"] = float(bf16.time(m, r["n"], r["k"]).seconds[0])
            row["bf16_held_out"] = (r["n"], r["k"]) not in bf16.families
        out.append(row)
    return out


def summary(out: list[dict], key: str) -> tuple[float, float, dict] | None:
    """(median |error|, worst signed error, the worst row) of prediction ``key`` over the rows that have it."""
    errs = [(o[key] / o["measured_s"] - 1, o) for o in out if key in o]
    if not errs:
        return None
    worst = max(errs, key=lambda e: abs(e[0]))
    return statistics.median(abs(e) for e, _ in errs), worst[0], worst[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="op_tables.csv of a dense_bf16 run")
    ap.add_argument("--gpu", default="H200", help="the GPU it ran on (catalog name)")
    a = ap.parse_args(argv)
    if not Path(a.csv).is_file():
        print(f"csv: no such file {a.csv}", file=sys.stderr)
        return 2
    out = compare(read_rows(a.csv), a.gpu)
    if not out:
        print(f"csv: {a.csv} has no timed BF16 dense_gemm rows (run --tables dense_bf16)", file=sys.stderr)
        return 2
    print(f"{'gemm':18} {'M':>6} {'N':>6} {'K':>6} {'BF16 us':>9} {'same run':>14} {'table':>14} {'BF16 table':>15}")
    for o in out:
        cells = [f"{o[k] * 1e6:7.2f} {o[k] / o['measured_s'] - 1:+5.0%}" if k in o else f"{'-':>13}"
                 for k in ("same_run_s", "table_s", "bf16_table_s")]
        mark = "*" if o.get("bf16_held_out") else " "
        print(f"{o['name']:18} {o['m']:6d} {o['n']:6d} {o['k']:6d} {o['measured_s'] * 1e6:9.2f} {cells[0]:>14} {cells[1]:>14} "
              f"{cells[2]:>14}{mark}")
    held = [o for o in out if o.get("bf16_held_out")]
    for key, label, rows in (("same_run_s", "rule on the same run's FP8 kernels", out),
                             ("table_s", "rule on the committed FP8 table", out),
                             ("bf16_table_s", "the committed BF16 table, shapes it does not hold (* held out)", held)):
        s = summary(rows, key)
        if s:
            print(f"{label}: median |error| {s[0]:.1%}, worst {s[1]:+.1%} ({s[2]['name']} M={s[2]['m']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
