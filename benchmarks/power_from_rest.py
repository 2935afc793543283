"""What a board's power model says of the probe's after-long step from rest (issue 16).

The beyond-grid probe (``benchmarks/gpu/beyond_grid.py`` ``after_long``) times a 2,048-token prompt step over 8,192
cached right after an 8,192-token prompt step from rest: 4.6-4.9% slower than after a decode step on two H100 boards
(runs 65 and ``beyond_probe_24c871d``), about 0.3-0.8% after 0.3 s idle. This prints, for a matrix run's board (its
calibration's reference loops and the GPU kind's committed model: ``ProfiledStepCost.power``), the long step's and the
next step's demand at full clock, the governor's clock fraction and the next step's stretch when read at the next
step's start (as the simulator and ``validate`` read it), in its middle (its own work folded in for half its time) and
at its end, after no gap and after 0.3 s idle, and the clock fraction under sustained long steps:

    python3 benchmarks/power_from_rest.py RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LONG, NEXT = ((8192, 0), 0.1169), ((2048, 8192), 0.0496)   # (new, cached), device seconds measured (run 65)


def from_rest(run: Path, log=print, update: dict | None = None) -> dict:
    from costmodels.power import PowerGovernor
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run

    path = unpacked_run(run)
    cost = ProfiledStepCost(run_profile(path, None))
    pm = cost.power
    if pm is None:
        raise SystemExit(f"{run}: no board power model (a calibration without reference loops)")
    if update:   # the board's model with other limiter terms (``--attack``, ``--tau``)
        pm = pm.model_copy(update=update)
    (ln, lc), dl = LONG
    (nn, nc), dn = NEXT
    fl, bl = cost.step_work([], 0, [ln], [lc])
    fn, bn = cost.step_work([], 0, [nn], [nc])
    out = {"cap_w": pm.cap_w, "long_w": pm.demand_w(1.0, fl / dl / 1e15, bl / dl / 1e12),
           "next_w": pm.demand_w(1.0, fn / dn / 1e15, bn / dn / 1e12)}
    log(f"{run.name}: limit {pm.cap_w:.0f} W; at full clock the long step draws {out['long_w']:.0f} W, the next "
        f"{out['next_w']:.0f} W (tau {pm.tau_s} s, attack window {pm.attack_s} s, prompt clock share "
        f"{pm.clock_share_prompt})")
    for gap in (0.0, 0.3):
        row = {}
        for where, frac in (("start", 0.0), ("middle", 0.5), ("end", 1.0)):
            g = PowerGovernor(pm)
            g.add(0.0, dl, fl, bl)
            t0 = dl + gap
            if frac:
                g.add(t0, t0 + dn * frac, fn * frac, bn * frac)
            u, f, b = g.at(t0 + dn * frac)
            phi = g.phi_at(t0 + dn * frac)
            row[where] = (pm.demand_w(u, f, b), phi, pm.stretch(phi, True) - 1.0)
        out[f"gap {gap}"] = row
        log(f"  after {gap:.1f} s: " + "; ".join(f"at the next step's {w}: averaged {v[0]:.0f} W, phi {v[1]:.3f}, "
                                              f"stretch {v[2] * 100:+.1f}%" for w, v in row.items()))
    g, t = PowerGovernor(pm), 0.0
    for _ in range(10):
        g.add(t, t + dl, fl, bl)
        t += dl + 0.002
    out["sustained_phi"] = g.phi_at(t)
    log(f"  ten long steps back to back: phi {out['sustained_phi']:.3f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--attack", type=float, default=None, help="the limiter's control window (s; default: the model's)")
    ap.add_argument("--tau", type=float, default=None, help="its time constant (s; default: the model's)")
    a = ap.parse_args()
    if (a.attack is not None and not 0 < a.attack <= 1) or (a.tau is not None and not 0 < a.tau <= 10):
        ap.error("--attack in (0, 1] s, --tau in (0, 10] s")
    upd = {k: v for k, v in (("attack_s", a.attack), ("tau_s", a.tau)) if v is not None}
    for run in a.runs:
        from_rest(run, update=upd)


if __name__ == "__main__":
    main()
