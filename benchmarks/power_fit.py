"""Fit the board power model (``costmodels.power``) on validation-matrix runs' nvidia-smi traces, check it on others.

Each matrix run since 26 keeps ``gpu_clocks.csv`` (nvidia-smi every 0.5 s: SM clock, board power, clock event
reasons) and every step it ran (``samples_<class>_*.json``: composition, launch start, the CUDA events' device
seconds) with each replay's start (``replay_t0_unix``), so each step can be placed on the trace. Per step, the work
it did (FLOPs, HBM bytes) is the cost model's count for its composition (``StepCostModel.step``'s ops: what the
twin would count). The fit, on the ``--fit`` runs only:

1. power at full clock: the trace's samples at full clock and not power-capped, against the governor's averages of
   busy share, FLOP and HBM rate at that moment (``PowerGovernor`` fed the measured steps): least squares for
   ``busy_w``, ``w_per_pflops``, ``w_per_tbps``; ``idle_w`` from the samples with the GPU idle;
2. the limit: ``cap_w`` and ``gamma`` by the clock the samples with the limit holding (clock below full) ran at,
   least squares in clock fraction over a grid; ``tau_s`` from a grid, best clock error over all samples;
3. how device time follows the clock: the steps' measured device seconds over the run's own step model's, in log,
   against ``max / clock - 1`` with one intercept per class and level (their calibrations differ), prompt-bearing
   and decode steps apart (the clock from the trace at the step's start: 0.5 s samples, so the slope is
   attenuated, not inflated, by the sampling).

Then on the ``--check`` runs, nothing refitted: the clock predicted at each sample and at each level's prompt steps
against the trace's, and the power at full clock against the uncapped samples.

    python3 benchmarks/power_fit.py --fit 26-40 --check 41-44 [--out costmodels/data/power/h200.json]
"""

from __future__ import annotations

import argparse
import calendar
import csv
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodels.power import PowerGovernor, PowerModel  # noqa: E402

RUNS = Path(__file__).resolve().parent / "gpu" / "issue16_h200"
MAX_MHZ = 1980.0


def trace(run: Path) -> np.ndarray:
    """(unix s, SM MHz, W, capped) per nvidia-smi sample."""
    rows = []
    for r in list(csv.reader((run / "gpu_clocks.csv").open()))[1:]:
        try:
            t = dt.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
            rows.append((calendar.timegm(t.timetuple()) + t.microsecond / 1e6, float(r[1].split()[0]),
                         float(r[2].split()[0]), float(bool(int(r[4].strip(), 16) & 0x4))))
        except (ValueError, IndexError):
            continue
    return np.array(rows)


def run_dirs(spec: str) -> list[Path]:
    """Run folders by number: ``26-40`` or ``41,43``."""
    nums: list[int] = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        nums += list(range(int(a), int(b or a) + 1))
    out = []
    for n in nums:
        out += sorted(p for p in RUNS.glob(f"run{n}_*") if p.is_dir())
    return out


def load_run(run_dir: Path, work_cache: dict) -> dict | None:
    """The run's steps placed in time with their work and model device seconds, and its trace; None without them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from step_residuals import load_samples, rebuilt_steps, replay_numbers

    from costmodels.batch import BatchShape, decodes_then_chunks
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run
    run = unpacked_run(run_dir)
    if not (run / "gpu_clocks.csv").is_file():
        return None
    prof = run_profile(run, None)
    cost = ProfiledStepCost(prof).pipelined()
    base = cost.base
    samples = load_samples(run)
    cols: dict[str, list] = {k: [] for k in ("at", "md", "dev", "prompt", "flops", "bytes", "level")}
    for f in sorted(run.glob("validation_*_*.json")):
        cls = f.name.split("_")[1]
        for lv in json.loads(f.read_text()).get("levels", []):
            s, t0s = samples.get(cls, {}).get(lv["name"]), lv.get("diagnostics", {}).get("replay_t0_unix")
            if s is None or not t0s or not s.get("device_s") or not s.get("start_s"):
                continue
            rep = np.asarray(replay_numbers(s, len(t0s))) - 1
            cols["at"] += list(np.asarray(t0s, float)[rep] + np.asarray(s["start_s"], float))
            cols["md"] += [np.nan if x is None else x for x in s["device_s"]]
            for d, new, ctx in rebuilt_steps(s):
                key = (len(d), int(d.mean()) // 256 if len(d) else 0, tuple(x // 64 for x in new), tuple(c // 256 for c in ctx))
                if key not in work_cache:
                    n, c, isd = decodes_then_chunks(d, 0, new, ctx)
                    st = base.step(BatchShape(new_tokens=n, context_lens=c, is_decode=isd))
                    work_cache[key] = (sum(o.flops for o in st.ops), sum(o.bytes for o in st.ops))
                fl, by = work_cache[key]
                cols["flops"].append(fl)
                cols["bytes"].append(by)
                cols["dev"].append(cost.pipelined_parts(*decodes_then_chunks(d, 0, new, ctx))[0])
                cols["prompt"].append(bool(new))
            cols["level"] += [f"{run_dir.name[:5]} {cls} {lv['name']}"] * len(s["device_s"])
    if not cols["at"]:
        return None
    out = {k: np.asarray(v) for k, v in cols.items()}
    order = np.argsort(out["at"], kind="stable")
    out = {k: v[order] for k, v in out.items()}
    out["trace"] = trace(run)
    out["name"] = run_dir.name
    return out


def governor_at_samples(r: dict, model: PowerModel) -> np.ndarray:
    """(busy, PF/s, TB/s) of the governor fed the run's measured steps, at each trace sample (memoised per tau)."""
    memo = r.setdefault("_gv", {})
    if model.tau_s in memo:
        return memo[model.tau_s]
    g = PowerGovernor(model)
    at, md = r["at"], np.where(np.isfinite(r["md"]) & (r["md"] > 0), r["md"], 0.0)
    tr = r["trace"]
    out = np.zeros((len(tr), 3))
    j = 0
    for i, t in enumerate(tr[:, 0]):
        while j < at.size and at[j] + md[j] <= t:
            g.add(at[j], at[j] + md[j], r["flops"][j], r["bytes"][j])
            j += 1
        k = np.exp(-(t - g.t) / model.tau_s) if g.t is not None and t > g.t else 1.0
        out[i] = (g.u * k, g.f * k, g.b * k)
    memo[model.tau_s] = out
    return out


def placeholder(tau: float) -> PowerModel:
    return PowerModel(gpu="h200", max_mhz=MAX_MHZ, cap_w=700, idle_w=0, busy_w=0, w_per_pflops=1, w_per_tbps=0, gamma=1,
                      tau_s=tau, clock_share_prompt=0, clock_share_decode=0)


def in_window(r: dict, tr: np.ndarray) -> np.ndarray:
    """Trace samples inside the run's serving (from its first step to its last)."""
    return (tr[:, 0] >= r["at"][0]) & (tr[:, 0] <= r["at"][-1])


def fit_power(runs: list[dict], tau: float) -> tuple[dict, float]:
    """busy_w, w_per_pflops, w_per_tbps by least squares on the full-clock, uncapped samples; idle_w from idle ones."""
    X, y, idle = [], [], []
    for r in runs:
        tr = r["trace"]
        gv = governor_at_samples(r, placeholder(tau))
        ok = in_window(r, tr) & (tr[:, 1] >= MAX_MHZ - 20) & (tr[:, 3] == 0)
        busy = ok & (gv[:, 0] > 0.05)
        X.append(gv[busy])
        y.append(tr[busy, 2])
        idle += list(tr[(tr[:, 0] < r["at"][0] - 2) & (tr[:, 1] >= MAX_MHZ - 20), 2])
    X, y = np.vstack(X), np.concatenate(y)
    idle_w = float(np.median(idle)) if idle else 0.0
    from scipy.optimize import nnls
    c, _ = nnls(X, y - idle_w)
    rms = float(np.sqrt(np.mean((X @ c - (y - idle_w)) ** 2)))
    return {"idle_w": idle_w, "busy_w": float(c[0]), "w_per_pflops": float(c[1]), "w_per_tbps": float(c[2])}, rms


def clock_error(runs: list[dict], model: PowerModel, only_limited: bool) -> float:
    """Mean absolute error of the predicted clock fraction over the runs' serving samples (or the limited ones)."""
    errs = []
    for r in runs:
        tr = r["trace"]
        gv = governor_at_samples(r, model)
        ok = in_window(r, tr) & (gv[:, 0] > 0.5)
        if only_limited:
            ok &= tr[:, 1] < MAX_MHZ - 30
        phi = np.array([model.phi(*x) for x in gv[ok]])
        errs += list(np.abs(phi - tr[ok, 1] / MAX_MHZ))
    return float(np.mean(errs)) if errs else float("nan")


def clock_shares(runs: list[dict]) -> dict[str, float]:
    """Slope of log(measured / model device seconds) on (max / clock - 1), one intercept per level; prompt-bearing and
    decode steps apart."""
    out = {}
    for kind in ("prompt", "decode"):
        xs, ys, gs = [], [], []
        for r in runs:
            tr = r["trace"]
            m = np.isfinite(r["md"]) & (r["md"] > 0) & (r["dev"] > 0) & (r["prompt"] if kind == "prompt" else ~r["prompt"])
            clk = np.interp(r["at"][m], tr[:, 0], tr[:, 1])
            xs.append(MAX_MHZ / clk - 1)
            ys.append(np.log(r["md"][m] / r["dev"][m]))
            gs.append(r["level"][m])
        x, y, g = np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)
        levels = sorted(set(g))
        A = np.zeros((x.size, len(levels) + 1))
        for i, lv in enumerate(levels):
            A[g == lv, i] = 1.0
        A[:, -1] = x
        c, *_ = np.linalg.lstsq(A, y, rcond=None)
        out[kind] = float(np.clip(c[-1], 0.0, 1.0))
    return out


def report(runs: list[dict], model: PowerModel, title: str) -> dict:
    """Per run and level: the prompt steps' median clock, measured vs predicted (the governor fed the measured
    steps); over all samples: clock MAE; uncapped full-clock samples: power rms."""
    print(title)
    res = {}
    for r in runs:
        tr = r["trace"]
        gv = governor_at_samples(r, model)
        ok = in_window(r, tr) & (gv[:, 0] > 0.5)
        phi = np.array([model.phi(*x) for x in gv])
        mae = float(np.mean(np.abs(phi[ok] - tr[ok, 1] / MAX_MHZ))) * MAX_MHZ
        full = ok & (tr[:, 1] >= MAX_MHZ - 20) & (tr[:, 3] == 0)
        pw = np.array([model.demand_w(*x) for x in gv])
        rms = float(np.sqrt(np.mean((pw[full] - tr[full, 2]) ** 2))) if full.any() else float("nan")
        print(f"  {r['name']}: clock MAE {mae:5.0f} MHz over {ok.sum()} samples; power at full clock rms {rms:4.0f} W "
              f"(bias {float(np.mean(pw[full] - tr[full, 2])) if full.any() else float('nan'):+4.0f} W)")
        # each prompt step's clock: measured (trace at its start) and predicted (governor at its start)
        pred_step = np.interp(r["at"], tr[:, 0], phi) * MAX_MHZ
        meas_step = np.interp(r["at"], tr[:, 0], tr[:, 1])
        for lv in dict.fromkeys(r["level"]):
            m = (r["level"] == lv) & r["prompt"]
            if m.sum() < 5:
                continue
            a, b = float(np.median(meas_step[m])), float(np.median(pred_step[m]))
            res[lv] = (a, b)
            print(f"    {lv[6:]:28s} prompt steps at {a:5.0f} MHz, predicted {b:5.0f} ({b - a:+4.0f})")
        res[r["name"]] = {"clock_mae_mhz": mae, "power_rms_w": rms}
    return res


def main(argv: list[str] | None = None) -> PowerModel:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", default="26-40", help="runs to fit on (numbers: 26-40)")
    ap.add_argument("--check", default="41-44", help="held-out runs")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cache: dict = {}
    fit_runs = [r for r in (load_run(p, cache) for p in run_dirs(a.fit)) if r is not None]
    check_runs = [r for r in (load_run(p, cache) for p in run_dirs(a.check)) if r is not None]
    print(f"fit on {len(fit_runs)} runs ({', '.join(r['name'][:5] for r in fit_runs)}); held out {len(check_runs)}")
    best = None
    for tau in (0.25, 0.5, 1.0, 2.0):
        terms, rms = fit_power(fit_runs, tau)
        for cap in np.arange(600.0, 721.0, 10.0):
            for gamma in (0.5, 1.0, 1.5, 2.0, 3.0, 4.0):
                m = PowerModel(gpu="h200", max_mhz=MAX_MHZ, cap_w=float(cap), gamma=gamma, tau_s=tau, clock_share_prompt=0,
                               clock_share_decode=0, **terms)
                e = clock_error(fit_runs, m, only_limited=False) + clock_error(fit_runs, m, only_limited=True)
                if best is None or e < best[0]:
                    best = (e, m, rms)
        print(f"  tau {tau:4.2f} s: power rms {rms:.0f} W; best so far cap {best[1].cap_w:.0f} W gamma {best[1].gamma} "
              f"tau {best[1].tau_s} (clock error {best[0]:.4f})", flush=True)
    _, model, rms = best
    shares = clock_shares(fit_runs)
    model = model.model_copy(update={"clock_share_prompt": shares["prompt"], "clock_share_decode": shares["decode"]})
    print(f"fitted: {model.model_dump(exclude={'fit', 'source'})}")
    fit_res = report(fit_runs, model, "fit runs")
    check_res = report(check_runs, model, "held-out runs (nothing refitted)")
    model = model.model_copy(update={
        "source": f"benchmarks/power_fit.py --fit {a.fit} --check {a.check}: H200 matrix runs' nvidia-smi traces "
                  "(gpu_clocks.csv) and per-step device seconds",
        "fit": {"fit_runs": [r["name"] for r in fit_runs], "power_rms_w": rms,
                "clock_mae_mhz": {k: v["clock_mae_mhz"] for k, v in fit_res.items() if isinstance(v, dict)},
                "held_out_clock_mae_mhz": {k: v["clock_mae_mhz"] for k, v in check_res.items() if isinstance(v, dict)},
                "held_out_prompt_clock_mhz": {k: [round(x) for x in v] for k, v in check_res.items() if isinstance(v, tuple)}}})
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(model.model_dump(), indent=1) + "\n")
        print(f"wrote {a.out}")
    return model


if __name__ == "__main__":
    main()
