"""Per replay of archived H200 validation matrices: TPOT's error against how fast the host ran (issue 16).

For every class, load level and replay of each run folder (``benchmarks/gpu/issue16_h200/run*``: ``reports.tar.xz`` with
the per-class ``validation_*.json``): the replay's TPOT p50 error ((predicted - measured) / measured, the level's one
prediction against that replay's figure), its decode host part against the calibration's
(``decode_host_vs_calibration``: measured from the replay's own steps) and, in runs that recorded it, the host probe
against the calibration's (``host_probe_vs_calibration``: a fixed piece of host work timed before the replay,
``executor/host_probe.py``). Then the correlation and least-squares line of the error on each, over all replays.

    python benchmarks/host_drift.py benchmarks/gpu/issue16_h200/run2{6,7,8,9}_* benchmarks/gpu/issue16_h200/run30_*
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

import numpy as np

from sim.timeline_check import reports_archive


def replays(run: Path) -> list[dict]:
    """One row per replay: run, class, level, TPOT error, decode host drift, probe drift (None where not recorded)."""
    tgz = reports_archive(run)
    if tgz is None:
        raise SystemExit(f"{run}: no reports.tar.xz or reports.tgz (a validation matrix run folder holds one)")
    out = []
    with tarfile.open(tgz) as t:
        for name in sorted(n for n in t.getnames() if Path(n).name.startswith("validation_")):
            rep = json.load(t.extractfile(name))
            cls = Path(name).name.split("_")[1]
            for lv in rep.get("levels", []):
                pred = (lv.get("predicted") or {}).get("tpot_p50")
                diag = lv.get("diagnostics") or {}
                drift = diag.get("decode_host_vs_calibration") or []
                probe = diag.get("host_probe_vs_calibration") or []
                for i, r in enumerate(lv.get("runs") or []):
                    meas = r.get("tpot_p50")
                    if not pred or not meas:
                        continue
                    out.append({"run": run.name, "class": cls, "level": lv.get("name"), "replay": i + 1,
                                "tpot_err": pred / meas - 1.0,
                                "host_drift": drift[i] if i < len(drift) else None,
                                "probe_drift": probe[i] if i < len(probe) else None})
    return out


def fit_line(rows: list[dict], key: str) -> dict | None:
    """Correlation and least-squares line of the TPOT error on ``key`` over the rows that have it (None under 3)."""
    pts = [(r[key], r["tpot_err"]) for r in rows if r[key] is not None]
    if len(pts) < 3:
        return None
    x, y = np.array(pts).T
    slope, icept = np.polyfit(x, y, 1)
    resid = y - (slope * x + icept)
    return {"n": len(pts), "r": float(np.corrcoef(x, y)[0, 1]), "slope": float(slope), "intercept": float(icept),
            "err_std": float(y.std()), "resid_std": float(resid.std())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="validation matrix run folders")
    ap.add_argument("--quiet", action="store_true", help="only the fits")
    a = ap.parse_args(argv)
    rows = [r for run in a.runs for r in replays(run)]
    if not a.quiet:
        print(f"{'run':36s} {'class':10s} {'level':16s} rep  TPOT err  host drift  probe drift")
        for r in rows:
            f = lambda v: "-" if v is None else f"{v:+.3f}"  # noqa: E731
            print(f"{r['run'][:36]:36s} {r['class']:10s} {str(r['level'])[:16]:16s} {r['replay']:3d}  {r['tpot_err']:+.3f}   "
                  f"{f(r['host_drift']):>9s}  {f(r['probe_drift']):>10s}")
    fits = {k: fit_line(rows, k) for k in ("host_drift", "probe_drift")}
    for k, v in fits.items():
        print(f"TPOT error on {k}: " + ("fewer than 3 replays recorded it" if v is None else
              f"{v['n']} replays, r {v['r']:+.2f}, slope {v['slope']:+.3f}, intercept {v['intercept']:+.3f}; "
              f"error std {v['err_std'] * 100:.1f}% -> {v['resid_std'] * 100:.1f}% around the line"))
    return {"rows": rows, "fits": fits}


if __name__ == "__main__":
    main()
