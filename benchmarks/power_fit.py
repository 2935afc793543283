"""Fit the board power model (``costmodels.power``) on validation-matrix runs' nvidia-smi traces, check it on others.

Each matrix run since 26 keeps ``gpu_clocks.csv`` (nvidia-smi every 0.5 s: SM clock, board power, clock event
reasons) and every step it ran (``samples_<class>_*.json``: composition, launch start, the CUDA events' device
seconds) with each replay's start (``replay_t0_unix``), so each step can be placed on the trace. Per step, the work
it did (FLOPs, HBM bytes) is the cost model's count for its composition (``StepCostModel.step``'s ops: what the
twin would count). The fit, on the ``--fit`` runs only:

1. power at full clock: the trace's samples at full clock and not power-capped, against the governor's averages of
   busy share, FLOP and HBM rate at that moment (``PowerGovernor`` fed the measured steps): non-negative least squares
   with one busy power per run (each run had its own board, and boards differ: 55-135 W on runs 26-40) and common
   ``w_per_pflops``, ``w_per_tbps``; ``idle_w`` from the samples with the GPU idle; ``tau_s`` the time constant that
   reproduces the reported power best (the driver's power.draw is itself an average: the limiter's own constant is not
   seen in 0.5 s samples);
2. the limit: ``cap_w`` and ``gamma`` over a grid, each run at its own board's busy power, by each level's prompt
   steps' median clock (what the twin prices prompt steps at);
3. how device time follows the clock (``clock_share_prompt``, ``clock_share_decode``): each level's mean log of the
   steps' measured device seconds over its run's step model's, against ``max / (its median clock) - 1``, one
   intercept per run and class (per step, the trace's 0.5 s snapshots attenuate the slope).

The kind's model (the median board) is what ``--out`` writes; a board's own terms come from its calibration's
reference loops (``PowerModel.for_board``). On the ``--check`` runs, nothing refitted, the median board's clock at
each sample and at each level's prompt steps against the trace's, and its power at full clock against the uncapped
samples: the spread is the boards' (run 44's drew 35-45 W more than run 43's at the same work).

    python3 benchmarks/power_fit.py --fit 26-40 --check 41-44 [--out costmodels/data/power/h200.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodels.power import PowerGovernor, PowerModel  # noqa: E402

RUNS = Path(__file__).resolve().parent / "gpu" / "issue16_h200"
MAX_MHZ = 1980.0


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
    from step_residuals import gpu_clocks, load_samples, rebuilt_steps, replay_numbers

    from costmodels.batch import decodes_then_chunks
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run
    run = unpacked_run(run_dir)
    if not (run / "gpu_clocks.csv").is_file():
        return None
    prof = run_profile(run, None)
    cost = ProfiledStepCost(prof, power=False).pipelined()
    cost._work = work_cache   # one memo over the runs: the work counted is the model's, not the calibration's
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
                fl, by = cost.step_work(d, 0, new, ctx)   # what the twin counts (ProfiledStepCost.step_work)
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
    out["trace"] = gpu_clocks(run)
    out["name"] = run_dir.name
    return out


def governor_at(r: dict, model: PowerModel, times: np.ndarray, key: str) -> np.ndarray:
    """(busy, PF/s, TB/s) of the governor fed the run's measured steps (each over its device seconds from its launch
    start), at each of the ascending ``times`` from the steps that ended by then (memoised per tau and ``key``)."""
    memo = r.setdefault("_gv", {})
    if (model.tau_s, key) in memo:
        return memo[(model.tau_s, key)]
    g = PowerGovernor(model)
    at, md = r["at"], np.where(np.isfinite(r["md"]) & (r["md"] > 0), r["md"], 0.0)
    out = np.zeros((len(times), 3))
    j = 0
    for i, t in enumerate(times):
        while j < at.size and at[j] + md[j] <= t:
            g.add(at[j], at[j] + md[j], r["flops"][j], r["bytes"][j])
            j += 1
        out[i] = g.at(t)
    memo[(model.tau_s, key)] = out
    return out


def governor_at_samples(r: dict, model: PowerModel) -> np.ndarray:
    """``governor_at`` the trace's samples."""
    return governor_at(r, model, r["trace"][:, 0], "samples")


def governor_at_prompts(r: dict, model: PowerModel) -> np.ndarray:
    """``governor_at`` each prompt-bearing step's launch start (the steps are in time order)."""
    return governor_at(r, model, r["at"][r["prompt"]], "prompts")


def level_clock_error(runs: list[dict], model: PowerModel) -> float:
    """Mean over the levels (5+ prompt steps) of |predicted - measured| median clock of their prompt steps, as a
    fraction of the maximum: the clock the twin prices prompt steps at, level by level."""
    errs = []
    for r in runs:
        tr = r["trace"]
        gv = governor_at_prompts(r, model)
        pred = model.phis(gv[:, 0], gv[:, 1], gv[:, 2]) * MAX_MHZ
        meas = np.interp(r["at"][r["prompt"]], tr[:, 0], tr[:, 1])
        lv = r["level"][r["prompt"]]
        for name in dict.fromkeys(lv):
            m = lv == name
            if m.sum() >= 5:
                errs.append(abs(float(np.median(pred[m])) - float(np.median(meas[m]))) / MAX_MHZ)
    return float(np.mean(errs)) if errs else float("nan")


def placeholder(tau: float) -> PowerModel:
    return PowerModel(gpu="h200", max_mhz=MAX_MHZ, cap_w=700, idle_w=0, busy_w=0, w_per_pflops=1, w_per_tbps=0, gamma=1,
                      tau_s=tau, clock_share_prompt=0, clock_share_decode=0)


def in_window(r: dict, tr: np.ndarray) -> np.ndarray:
    """Trace samples inside the run's serving (from its first step to its last)."""
    return (tr[:, 0] >= r["at"][0]) & (tr[:, 0] <= r["at"][-1])


def fit_power(runs: list[dict], tau: float) -> tuple[dict, dict, float]:
    """The power at full clock on the runs' full-clock, uncapped serving samples: least squares (non-negative) with one
    busy power per run (each run had its own board: they draw different power for the same work) and common per-FLOP
    and per-byte terms; ``idle_w`` from the idle samples before serving. Returns (the kind's terms, with the median
    board's busy power; each run's busy power; rms W)."""
    from scipy.optimize import nnls
    rows, y, idle, owner = [], [], [], []
    for k, r in enumerate(runs):
        tr = r["trace"]
        gv = governor_at_samples(r, placeholder(tau))
        ok = in_window(r, tr) & (tr[:, 1] >= MAX_MHZ - 20) & (tr[:, 3] == 0) & (gv[:, 0] > 0.05)
        rows.append(gv[ok])
        y.append(tr[ok, 2])
        owner += [k] * int(ok.sum())
        idle += list(tr[(tr[:, 0] < r["at"][0] - 2) & (tr[:, 1] >= MAX_MHZ - 20), 2])
    G, y, owner = np.vstack(rows), np.concatenate(y), np.array(owner)
    idle_w = float(np.median(idle)) if idle else 0.0
    X = np.zeros((y.size, len(runs) + 2))
    X[np.arange(y.size), owner] = G[:, 0]       # busy share x the run's board
    X[:, -2:] = G[:, 1:]
    c, _ = nnls(X, y - idle_w)
    rms = float(np.sqrt(np.mean((X @ c - (y - idle_w)) ** 2)))
    per_run = {r["name"]: float(c[k]) for k, r in enumerate(runs)}
    return ({"idle_w": idle_w, "busy_w": float(np.median(c[: len(runs)])), "w_per_pflops": float(c[-2]),
             "w_per_tbps": float(c[-1])}, per_run, rms)


def clock_shares(runs: list[dict]) -> dict[str, float]:
    """How device time follows the clock, per step kind: each level's mean log(measured / model device seconds) of its
    steps against ``max / (its median clock) - 1``, one intercept per run and class (their calibrations and kernels
    differ), least squares over the levels. Per level, not per step: the trace's 0.5 s snapshots of a clock that
    moves within a step's milliseconds attenuate a per-step slope (0.06 on runs 26-40 where the levels give 0.15)."""
    out = {}
    for kind in ("prompt", "decode"):
        xs, ys, gs = [], [], []
        for r in runs:
            tr = r["trace"]
            m0 = np.isfinite(r["md"]) & (r["md"] > 0) & (r["dev"] > 0) & (r["prompt"] if kind == "prompt" else ~r["prompt"])
            for lv in dict.fromkeys(r["level"]):
                m = m0 & (r["level"] == lv)
                if m.sum() < 20:
                    continue
                clk = float(np.median(np.interp(r["at"][m], tr[:, 0], tr[:, 1])))
                xs.append(MAX_MHZ / clk - 1)
                ys.append(float(np.mean(np.log(r["md"][m] / r["dev"][m]))))
                gs.append(lv.rsplit(" ", 1)[0] if not lv.endswith("past saturation") else lv[: -len(" past saturation")])
        x, y, g = np.array(xs), np.array(ys), np.array(gs)
        groups = sorted(set(g))
        A = np.zeros((x.size, len(groups) + 1))
        for i, lv in enumerate(groups):
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
        phi = model.phis(gv[:, 0], gv[:, 1], gv[:, 2])
        mae = float(np.mean(np.abs(phi[ok] - tr[ok, 1] / MAX_MHZ))) * MAX_MHZ
        full = ok & (tr[:, 1] >= MAX_MHZ - 20) & (tr[:, 3] == 0)
        pw = np.array([model.demand_w(*x) for x in gv])
        rms = float(np.sqrt(np.mean((pw[full] - tr[full, 2]) ** 2))) if full.any() else float("nan")
        print(f"  {r['name']}: clock MAE {mae:5.0f} MHz over {ok.sum()} samples; power at full clock rms {rms:4.0f} W "
              f"(bias {float(np.mean(pw[full] - tr[full, 2])) if full.any() else float('nan'):+4.0f} W)")
        # each prompt step's clock: measured (trace at its start) and predicted (governor at its start)
        gp = governor_at_prompts(r, model)
        pred_step = np.full(r["at"].size, np.nan)
        pred_step[r["prompt"]] = model.phis(gp[:, 0], gp[:, 1], gp[:, 2]) * MAX_MHZ
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
    ap.add_argument("--cache", default=None, help="pickle of the loaded runs (made when absent): refits skip the loading")
    a = ap.parse_args(argv)
    import pickle
    loaded: dict = {}
    if a.cache and Path(a.cache).is_file():
        loaded = pickle.loads(Path(a.cache).read_bytes())
    cache: dict = {}

    def get(p: Path):
        if p.name not in loaded:
            loaded[p.name] = load_run(p, cache)
        return loaded[p.name]
    fit_runs = [r for r in (get(p) for p in run_dirs(a.fit)) if r is not None]
    check_runs = [r for r in (get(p) for p in run_dirs(a.check)) if r is not None]
    if a.cache:
        Path(a.cache).write_bytes(pickle.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "_gv"} if v else v)
                                                for k, v in loaded.items()}))
    print(f"fit on {len(fit_runs)} runs ({', '.join(r['name'][:5] for r in fit_runs)}); held out {len(check_runs)}")
    # the power terms at the time constant that best reproduces the reported power (nvidia-smi's power.draw is itself
    # an average: the limiter's own time constant is not seen in 0.5 s samples, and the board's reference loops in
    # calibration set the limit's terms; costmodels.power.PowerModel.for_board)
    fits = {tau: fit_power(fit_runs, tau) for tau in (0.1, 0.25, 0.5, 1.0, 2.0)}
    for tau, (_, _, rms) in fits.items():
        print(f"  tau {tau:4.2f} s: power at full clock rms {rms:.0f} W")
    tau = min(fits, key=lambda t: fits[t][2])
    terms, per_run, rms = fits[tau]
    print(f"  each run's board, busy power (W): " + ", ".join(f"{k[:5]} {v:.0f}" for k, v in per_run.items()))
    # the limit and the clocked power's exponent: each level's prompt steps' median clock, each run at its board's busy
    # power (as a board's reference loops would set it)
    best = None
    for cap in np.arange(640.0, 721.0, 10.0):
        for gamma in (0.5, 0.75, 1.0, 1.5, 2.0, 3.0):
            e = 0.0
            for r in fit_runs:
                m = PowerModel(gpu="h200", max_mhz=MAX_MHZ, cap_w=float(cap), gamma=gamma, tau_s=tau, clock_share_prompt=0,
                               clock_share_decode=0, **{**terms, "busy_w": per_run[r["name"]]})
                e += level_clock_error([r], m)
            if best is None or e < best[0]:
                best = (e, cap, gamma)
    model = PowerModel(gpu="h200", max_mhz=MAX_MHZ, cap_w=float(best[1]), gamma=best[2], tau_s=tau, clock_share_prompt=0,
                       clock_share_decode=0, **terms)
    print(f"  limit {model.cap_w:.0f} W, clocked-power exponent {model.gamma} (each level's prompt-step clock, mean error "
          f"{best[0] / len(fit_runs) * MAX_MHZ:.0f} MHz)")
    shares = clock_shares(fit_runs)
    model = model.model_copy(update={"clock_share_prompt": shares["prompt"], "clock_share_decode": shares["decode"]})
    print(f"fitted: {model.model_dump(exclude={'fit', 'source'})}")
    fit_res = report(fit_runs, model, "fit runs")
    check_res = report(check_runs, model, "held-out runs (nothing refitted)")
    model = model.model_copy(update={
        "source": f"benchmarks/power_fit.py --fit {a.fit} --check {a.check}: H200 matrix runs' nvidia-smi traces "
                  "(gpu_clocks.csv) and per-step device seconds",
        "fit": {"fit_runs": [r["name"] for r in fit_runs], "power_rms_w": rms, "busy_w_by_run": per_run,
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
