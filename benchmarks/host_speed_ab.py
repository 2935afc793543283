"""Per-level step MAPE of a validation-matrix run priced on the calibration's host and on the host speed each level's
probes read (``twinfer validate --host-speed probe`` and ``issue``): the A/B behind that option's default (docs/twin.md).

    python3 benchmarks/host_speed_ab.py benchmarks/gpu/issue16_h100/run54_async_triton_summarize_agentic_longctx_2c8ed9c

Each level's ratio is the median of its replays' host probes over the calibration's (the reports'
``diagnostics.host_probe_vs_calibration``, each probe timed before its replay); every step is re-predicted with the
profile's host terms times that ratio (``CalibrationProfile.at_host_speed``), the device terms as calibrated. Where
the reports kept them, the same with the issue probe's ratio (``issue_probe_vs_calibration``: a fixed mixed step's
forward issue timed before each replay), and in hindsight with the ratio the replays' own prompt-bearing steps issued
their forwards at (``eager_issue_vs_calibration``, measured in the replays themselves, so not a prediction: what a
host measure that read serving's host exactly would give).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_residuals as sr  # noqa: E402

from costmodels.profiled import ProfiledStepCost  # noqa: E402
from costmodels.step_fit import errors, run_profile  # noqa: E402
from sim.timeline_check import unpacked_run  # noqa: E402


# the speed columns: (report diagnostic, label); a level lacks a column where its report did not keep that diagnostic
SPEEDS = (("probe", "host_probe_vs_calibration"), ("issue", "issue_probe_vs_calibration"),
          ("hindsight", "eager_issue_vs_calibration"))


def level_ab(run: Path) -> list[dict]:
    """[{class, level, recorded, mape_calibration, speed_<k>, mape_<k> for k in probe / issue / hindsight where
    kept}] for every level whose report kept its input-build probes."""
    prof = run_profile(run, None)
    samples = sr.load_samples(run)
    replays = sr.run_replays(run)
    base = ProfiledStepCost(prof)
    out = []
    for f in sorted(run.glob("validation_*_*.json")):
        rep = json.loads(f.read_text())
        cls = f.name.split("_")[1]
        for lv in rep["levels"]:
            diag = lv.get("diagnostics") or {}
            s = samples.get(cls, {}).get(lv["name"])
            if not diag.get("host_probe_vs_calibration") or s is None:
                continue
            nums = sr.replay_numbers(s, replays)
            meas = np.array(s["measured_s"], float)
            ok = meas > 0
            p0 = sr.predict(base, prof, s, False, nums)
            row = {"class": cls, "level": lv["name"], "recorded": lv["step"]["mape"],
                   "mape_calibration": errors(p0[ok], meas[ok])["mape"]}
            for k, key in SPEEDS:
                d = [x for x in diag.get(key) or [] if x is not None]
                if not d:
                    continue
                speed = 1.0 + float(np.median(d))
                ph = prof.at_host_speed(speed)
                p1 = sr.predict(ProfiledStepCost(ph), ph, s, False, nums)
                row.update({f"speed_{k}": speed, f"mape_{k}": errors(p1[ok], meas[ok])["mape"]})
            row["speed"], row["mape_probe"] = row["speed_probe"], row["mape_probe"]
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="+")
    a = ap.parse_args(argv)
    rows = []
    for r in a.run:
        run = unpacked_run(r)
        got = level_ab(run)
        print(f"== {Path(r).name}" + ("" if got else ": no level kept its host probes"))
        for x in got:
            print(f"{x['class']:10} {x['level']:16} step MAPE {x['mape_calibration'] * 100:5.2f}% (calibration's host)"
                  + "".join(f" | {k} x{x[f'speed_{k}']:4.2f}: {x[f'mape_{k}'] * 100:5.2f}%" for k, _ in SPEEDS
                            if f"mape_{k}" in x))
        rows += got
    return rows


if __name__ == "__main__":
    main()
