"""Held-out shapes in and beyond the calibration grid, priced by the run's own calibration (issue 16).

Reads a run folder whose matrix call had ``--beyond-probe`` (``beyond_grid_*.json``, benchmarks/gpu/beyond_grid.py)
and its ``calibration_*.json``, and prints, with nothing refitted:

- each chunk-attention point (one layer, device seconds) against the profile's ``attn_prefill_chunk`` table, and each
  K/V expansion against its ``kv_expand`` table, marked ``beyond`` where the table extrapolates;
- each whole step against the step model's price of that step (``ProfiledStepCost.point_time``, as the fit prices the
  grid's own points), in the grid's cached levels and beyond them.

    python3 benchmarks/beyond_grid_check.py benchmarks/gpu/issue16_h100/run64_beyond_probe_longctx_d62ff6a
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _seconds(p: dict) -> float:
    return float(p.get("device_s") or p["time_s"])


def check(run: Path, out=print) -> dict:
    """Errors (predicted / measured - 1) of the probe's ops and steps: ``{"chunk": {"in": [...], "beyond": [...]},
    "steps": {...}}``, each a list of (shape, error)."""
    from costmodels.calibration import CalibrationProfile
    from costmodels.step_profile import StepPoint
    from costmodels.profiled import ProfiledStepCost

    probe_file = next(run.glob("beyond_grid_*.json"), None)
    if probe_file is None:
        raise FileNotFoundError(f"{run}: no beyond_grid_*.json (a matrix call with --beyond-probe)")
    probe = json.loads(probe_file.read_text())
    prof = CalibrationProfile.load(run / probe["profile"]) if probe.get("profile") and (run / probe["profile"]).is_file() \
        else CalibrationProfile.load(next(run.glob("calibration_*.json")))
    res: dict = {"chunk": {"in": [], "beyond": []}, "kv_expand": {"in": [], "beyond": []}, "steps": {"in": [], "beyond": []}}
    ct, kx = prof.tables.get("attn_prefill_chunk"), prof.tables.get("kv_expand")
    out(f"{run.name}: chunk ops and steps priced by its own calibration ({prof.measured_on}); error = predicted / measured - 1")
    if ct is not None:
        out("  chunk attention, one layer (device us): new x cached   measured  predicted  error")
        for p in (q for q in probe["ops"] if q["op"] == "attn_prefill_chunk"):
            t, ext = ct([p["new"]], [p["cached"]])
            m = _seconds(p)
            e = float(t[0]) / m - 1
            res["chunk"]["beyond" if ext[0] else "in"].append(((p["new"], p["cached"]), e))
            out(f"    {p['new']:5d} x {p['cached']:5d}  {m * 1e6:9.0f}  {float(t[0]) * 1e6:9.0f}  {e * 100:+6.1f}%" + ("  beyond" if ext[0] else ""))
    if kx is not None:
        out("  K/V expansion, one layer (device us): keys   measured  predicted  error")
        for p in (q for q in probe["ops"] if q["op"] == "kv_expand"):
            t, ext = kx(np.array([float(p["keys"])]))
            m = _seconds(p)
            e = float(t[0]) / m - 1
            res["kv_expand"]["beyond" if ext[0] else "in"].append((p["keys"], e))
            out(f"    {p['keys']:6d}  {m * 1e6:9.0f}  {float(t[0]) * 1e6:9.0f}  {e * 100:+6.1f}%" + ("  beyond" if ext[0] else ""))
    cost = ProfiledStepCost(prof)
    top = probe.get("grid_cached_max", 6144)
    out(f"  whole steps (runner wall ms; the grid's chunks reach {top} cached, its decodes ~6,144 context): decodes, "
        "chunk   measured  predicted  error")
    for d in probe["steps"]:
        p = StepPoint.model_validate(d)
        pred = cost.point_time(p)
        e = pred / p.wall_s - 1
        beyond = any(c > top for _, c in p.prefill) or (not p.prefill and max(p.decode_ctx, default=0) > 1.5 * 4096)
        res["steps"]["beyond" if beyond else "in"].append(((len(p.decode_ctx), tuple(map(tuple, p.prefill))), e))
        ctx = f" at {int(np.mean(p.decode_ctx))}" if p.decode_ctx else ""
        out(f"    {len(p.decode_ctx):3d}{ctx}, {p.prefill}  {p.wall_s * 1e3:8.2f}  {pred * 1e3:8.2f}  {e * 100:+6.1f}%" + ("  beyond" if beyond else ""))
    after = probe.get("after_long") or []
    if after:
        out("  a prompt step right after the long one (device ms, the runner's CUDA events; SM clock read just before):")
        base = {(r["new"], r["cached"]): r["device_s"] for r in after if r["condition"].startswith("after a decode")}
        for r in after:
            b = base.get((r["new"], r["cached"]))
            rel = f"{(r['device_s'] / b - 1) * 100:+5.1f}%" if b and r["device_s"] else "  n/a"
            out(f"    {r['new']:5d} over {r['cached']:5d} {r['condition']:42s} {r['device_s'] * 1e3:8.2f}  {rel}"
                + (f"  {r['mhz_before']:.0f} MHz" if r.get("mhz_before") else ""))
        res["after_long"] = after
    for k, v in res.items():
        if k == "after_long":
            continue
        for side in ("in", "beyond"):
            errs = np.array([e for _, e in v[side]])
            if errs.size:
                out(f"  {k:10s} {side:6s}: {errs.size:2d} points, mean {errs.mean() * 100:+.1f}%, worst {errs[np.argmax(np.abs(errs))] * 100:+.1f}%")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    a = ap.parse_args()
    from sim.timeline_check import unpacked_run
    try:
        check(unpacked_run(a.run))
    except FileNotFoundError as e:
        ap.error(str(e))


if __name__ == "__main__":
    main()
