"""Line up a device matrix run's serving steps with its host samplers (issue 16): per 2-second window of the replays,
the decode steps' host part (iteration - forward) over the model's, next to /proc/stat's CPU shares (user, system,
steal) and the core each python3 process last ran on (``scripts/device_matrix.sh``'s ``cpu_stat.txt``). Replays are
placed on the Unix clock by validate's ``replay_t0_unix`` (runs from 215088b on); the host part by batch size comes
after, per class.

    python3 benchmarks/host_samplers.py RUN      # RUN: a run folder with reports.tgz unpacked (or a copy of it)
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def host_ratios(run: Path, cost) -> list[tuple]:
    """(unix time, measured/model host part, class, level, batch) for every decode-graph step of every replay (the
    model's part as ``twinfer validate``'s decode host drift takes it)."""
    from ui.cmd_validate import decode_host_model_s

    rows = []
    for f in sorted(glob.glob(str(run / "samples_*.json"))):
        cls = Path(f).name.split("samples_")[1].split("_")[0]
        samples = json.loads(Path(f).read_text())
        rep = json.loads(Path(f.replace("samples_", "validation_")).read_text())
        for lv in rep["levels"]:
            s = samples[lv["name"]]
            t0s = (lv.get("diagnostics") or {}).get("replay_t0_unix")
            if not t0s:
                raise SystemExit(f"{f}: no replay_t0_unix (a run before 215088b): the steps cannot be placed on the clock")
            start = np.array(s["start_s"], float)
            edges = [0] + list(np.where(np.diff(start) < 0)[0] + 1) + [len(start)]
            for r, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
                for i in range(lo, hi):
                    if s["graph_bs"][i] <= 0 or s["prefill_chunks"][i] or not s["decodes"][i] or s["forward_s"][i] is None:
                        continue
                    n = s["decodes"][i]
                    rest = decode_host_model_s(cost, cost.step, n, s["decode_ctx_mean"][i] * n)
                    rows.append((t0s[r] + start[i], (s["measured_s"][i] - s["forward_s"][i]) / rest, cls, lv["name"], n))
    return sorted(rows)


def read_stat(run: Path):
    """(times, /proc/stat cpu fields per sample, {pid: core} per sample)."""
    t, fields, cores = [], [], []
    for line in (run / "cpu_stat.txt").read_text().splitlines():
        a, _, b = line.partition("|")
        f = a.split()
        if len(f) < 12:
            continue
        t.append(float(f[0]))
        fields.append([int(x) for x in f[2:12]])
        p = b.split()
        cores.append(dict(zip(p[0::2], p[1::2])))
    return np.array(t), np.array(fields), cores


def main(argv=None) -> None:
    from costmodels.calibration import CalibrationProfile
    from costmodels.profiled import ProfiledStepCost

    run = Path((argv or sys.argv[1:])[0])
    prof = CalibrationProfile.load(next(run.glob("calibration_*.json")))
    rows = host_ratios(run, ProfiledStepCost(prof))
    t, fields, cores = read_stat(run)
    tt = np.array([x[0] for x in rows])
    rr = np.array([x[1] for x in rows])
    at = lambda x: int(min(max(np.searchsorted(t, x), 0), len(t) - 1))  # noqa: E731
    print("window   steps  host/model   user   system  steal   cores (pid: core)   class level")
    for w in np.arange(tt[0], tt[-1], 2.0):
        m = (tt >= w) & (tt < w + 2)
        if m.sum() < 20:
            continue
        d = fields[at(w + 2)] - fields[at(w)]
        tot = max(int(d.sum()), 1)
        first = rows[int(np.argmax(m))]
        print(f"t+{w - tt[0]:6.1f} {m.sum():6d} {np.median(rr[m]):10.3f} {d[0] / tot * 100:6.1f}% {d[2] / tot * 100:6.1f}% "
              f"{d[7] / tot * 100:5.1f}%   {cores[at(w + 2)]}   {first[2]} {first[3]}")
    print("\nhost part over the model's by decode batch (median)")
    for cls in sorted({x[2] for x in rows}):
        n = np.array([x[4] for x in rows if x[2] == cls])
        r = np.array([x[1] for x in rows if x[2] == cls])
        parts = [f"{lo}-{hi}: {np.median(r[(n >= lo) & (n <= hi)]):.3f}" for lo, hi in ((1, 1), (2, 8), (9, 16), (17, 32), (33, 64))
                 if ((n >= lo) & (n <= hi)).sum() >= 30]
        print(f"  {cls:10} " + "  ".join(parts))


if __name__ == "__main__":
    main()
