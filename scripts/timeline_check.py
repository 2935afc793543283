"""Timeline vs step model on a validation-matrix run, offline: each level simulated twice on the run's profile, with
the cost model's step times (what ``matrix_offline.py`` prints) and with the executor's measured step times replayed
in order (sim.timeline_check), against the measured figures (median of the replays, as the run reports them).

    python3 scripts/timeline_check.py benchmarks/gpu/issue16_h200/run4_sync96 [--sync]

Needs the run's per-step samples (``samples_<class>_*.json``, run 4 on). Per level: the relative errors of both, and
per replay how many steps kept the measured composition (where the two timelines parted, and the next arrival's
distance from the simulated clock there), and the predicted/measured ratio of its mixed (prefill-bearing) steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def samples_of(run: Path, cls: str) -> dict | None:
    f = next(run.glob(f"samples_{cls}_*.json"), None)
    return json.loads(f.read_text()) if f is not None else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--sync", action="store_true", help="the engine's loop was synchronous (async overlap off)")
    a = ap.parse_args()

    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from device_matrix import FIGURES
    from matrix_offline import (class_requests, engine_config, kv_blocks, level_requests, measured_levels, predict_level,
                                run_class_requests, run_max_model_len, run_replays, run_requests)
    from sim.timeline_check import replay_measured, sample_steps, split_replays
    from sim.validate import median_runs, metric_values, natural_rate
    from ui.cmd_validate import sim_config

    from sim.timeline_check import unpacked_run
    try:
        run = unpacked_run(a.run)   # reports.tgz unpacked to a temporary copy where needed
    except FileNotFoundError as e:
        ap.error(str(e))
    prof = run_profile(run)
    cost = ProfiledStepCost(prof)
    mml = run_max_model_len(run)
    blocks = kv_blocks(mml)
    cfg = sim_config(engine_config(a.sync, mml), prof)
    nreq, replays = run_requests(run), run_replays(run)
    per_class = run_class_requests(run)   # --class-requests overrides (e.g. reasoning=32), as matrix_offline reads them
    print(f"{'class':10} {'level':16} {'':9}" + " ".join(f"{f:>18}" for f in FIGURES))
    for cls, levels in measured_levels(run).items():
        samp = samples_of(run, cls)
        if samp is None:
            print(f"{cls}: no samples_{cls}_*.json in {run}")
            continue
        reqs = class_requests(cls, per_class.get(cls, nreq), mml)
        for name, lv in levels.items():
            scale = natural_rate(reqs) / lv["rate_rps"]
            meas = lv["measured"]
            plain = predict_level(cost, cfg, reqs, lv["rate_rps"], blocks)
            steps = sample_steps(samp[name])
            figs, notes = [], []
            for i0, i1 in split_replays(steps, replays):
                m, tr = replay_measured(cost, cfg, blocks, level_requests(reqs, lv["rate_rps"]), steps[i0:i1], seed=0)
                figs.append(metric_values(m))
                notes.append(_replay_note(tr, i1 - i0, reqs, scale, samp[name], i0, i1))
            timed = median_runs(figs)[0] if len(figs) > 1 else figs[0]
            for label, p in (("cost model", plain), ("measured steps", timed)):
                err = {f: p[f] / meas[f] - 1 if meas.get(f) else float("nan") for f in FIGURES}
                print(f"{cls:10} {name:16} {label:>14} " + " ".join(f"{err[f] * 100:+17.1f}%" for f in FIGURES))
            for n in notes:
                print(f"{'':28}{n}")


def _replay_note(tr, n: int, reqs, scale: float, cols: dict, i0: int, i1: int) -> str:
    """One replay: steps kept at the measured composition, where it parted, and its mixed steps' predicted/measured."""
    pt = np.asarray(cols["prefill_tokens"][i0:i1], float)
    m = np.asarray(cols["measured_s"][i0:i1], float)
    p = np.asarray([np.nan if x is None else x for x in cols["predicted_s"][i0:i1]], float)
    mix = pt > 0
    ratio = f"mixed steps predicted/measured {np.nansum(p[mix]) / m[mix].sum() - 1:+.1%}" if mix.any() else ""
    if tr.divergence is None:
        return f"replay of {n} steps: every step at its measured composition; {ratio}"
    d = tr.divergence
    arrivals = np.sort([r.arrival_time * scale for r in reqs])
    k = int(np.searchsorted(arrivals, d.clock_s, side="right"))
    near = f", next arrival {(arrivals[k] - d.clock_s) * 1e3:+.2f} ms from the simulated clock" if k < len(arrivals) else ""
    return (f"replay of {n} steps: parted at step {d.step} (simulated {d.simulated}, measured {d.measured} as "
            f"decodes/prefill tokens/chunks{near}); {ratio}")


if __name__ == "__main__":
    main()
