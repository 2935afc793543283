"""The power limiter's time constant and the prompt steps' clock share, from the steps after long prompt steps (issue 16).

A prompt-bearing step right after a long prompt step runs 2-5 ms longer than the step model prices it, on every board
of runs 56-64 (H100 and H200), where the same step after a decode step is priced within a point or so: the limiter
brought the clock down during the long step (nvidia-smi read 1,800-1,850 MHz on the steps after one, 1,965-1,980 on
the rest) and the next step starts there. The governor (``costmodels.power.PowerGovernor``) prices each prompt step
at the clock its history allows; how fast that history fades (``tau_s``) and how much of a prompt step follows the
clock (``clock_share_prompt``) set the size of the effect. Neither is visible in the board's calibration loops (the
prompt loop's first ten steps already run under the limit) or in nvidia-smi's traces (its power reading is itself a
~1 s average). The share is read from a power probe's loops from rest, their first step against their settle
(``costmodels/data/power/*.json`` ``fit.limiter.share``: 0.5); the time constant here, for the GPU kind, off the step
residuals of FIT runs, and checked on CHECK runs that the choice never saw:

    python3 benchmarks/power_fast_fit.py --fit RUN... --check RUN... [--taus 0.05,0.075,0.1] [--shares 0.5]

Time constant and share trade off along a ridge (a shorter memory and a larger share price the step after a long one
alike): scanning both (``--shares 0.4,0.5,0.6``) picks 0.1 s / 0.6 on runs 56, 59, 61 by 0.06 points over 0.075 s /
0.5, which then over-prices sustained prompt load (the fit runs' past-saturation TTFT p50 +1 point higher).

For every (tau, share) and run: the mean bias (predicted / measured - 1) of the prompt steps after a prompt step of
at least 4,096 tokens, of the other prompt steps and of the decode steps, and the worst per-level step MAPE; the
pair with the least mean |bias| after long steps over the FIT runs is printed last, with the CHECK runs at it and at
the committed model. Every step is priced as ``twinfer validate`` prices it (``ui.cmd_validate.predict_steps``).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LONG = 4096   # prompt tokens of a step that brings the clock down for the next


def _load(run: str):
    import step_residuals as sr
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile
    from sim.timeline_check import unpacked_run
    path = unpacked_run(run)
    prof = run_profile(path, None)
    return path, prof, sr.load_samples(path, None), ProfiledStepCost(prof)


_KEEP = object()


def figures(loaded, tau: float | None, share: float | None, attack=_KEEP) -> dict:
    """Bias after long prompt steps, after others, of decode steps, and the worst per-level step MAPE, with the board's
    power model at ``tau`` / ``share`` (None: as committed) and control window ``attack`` (s; None: the one
    exponential average; not given: as committed)."""
    import step_residuals as sr
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import errors
    path, prof, samples, cost = loaded
    pm = cost.power
    if pm is None:
        raise SystemExit(f"{path.name}: no board power model (a calibration without reference loops)")
    upd = {k: v for k, v in (("tau_s", tau), ("clock_share_prompt", share)) if v is not None}
    if attack is not _KEEP:
        upd["attack_s"] = attack
    if upd:   # the board's model with those terms, given as ProfiledStepCost's power model
        cost = ProfiledStepCost(prof, power=pm.model_copy(update=upd))
    c = sr.columns(samples, cost, prof, False, False, sr.run_replays(path))
    m, p = c["measured_s"], c["pred"]
    pt, pc = c["prefill_tokens"], c["prefill_chunks"]
    prev = np.r_[0, pt[:-1]]
    ok = np.isfinite(p) & (m > 0)
    out = {}
    for name, sel in (("after_long", (pc > 0) & (prev >= LONG)), ("after_other", (pc > 0) & (prev < LONG)), ("decode", pc == 0)):
        s = sel & ok
        out[name] = float(np.mean(p[s] / m[s] - 1)) if s.any() else float("nan")
    out["mape_max"] = max(errors(p[s], m[s])["mape"] for s in
                          (ok & (c["cls"] == k) & (c["level"] == lv) for k in set(c["cls"]) for lv in set(c["level"])) if s.any())
    return out


def line(label: str, f: dict) -> str:
    return (f"  {label:46s} after long {f['after_long'] * 100:+5.1f}% | other prompt {f['after_other'] * 100:+5.1f}% | "
            f"decode {f['decode'] * 100:+5.1f}% | step MAPE worst level {f['mape_max'] * 100:.2f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", nargs="+", required=True, help="matrix run folders the choice reads")
    ap.add_argument("--check", nargs="*", default=[], help="matrix run folders held out")
    ap.add_argument("--taus", default="0.05,0.075,0.1")
    ap.add_argument("--shares", default="0.5", help="prompt clock shares to scan (default: the power probe's 0.5 alone)")
    ap.add_argument("--attacks", default=None, help="the limiter's control windows to scan (s; 'none': the one "
                    "exponential average; default: as committed)")
    a = ap.parse_args()
    try:
        taus = [float(x) for x in a.taus.split(",")]
        shares = [float(x) for x in a.shares.split(",")]
        attacks = [_KEEP] if a.attacks is None else [None if x.strip().lower() == "none" else float(x)
                                                      for x in a.attacks.split(",")]
    except ValueError:
        ap.error("--taus, --shares and --attacks: comma lists of numbers ('none' among --attacks)")
    if not all(0 < t <= 10 for t in taus) or not all(0 <= s <= 1 for s in shares) or \
            not all(x is _KEEP or x is None or 0 < x <= 1 for x in attacks):
        ap.error("--taus in (0, 10] s, --shares in [0, 1], --attacks in (0, 1] s")
    fit = {r: _load(r) for r in a.fit}
    score = {}
    for r, ld in fit.items():
        print(f"{Path(r).name} (fit): board model cap {ld[3].power.cap_w:.0f} W" if ld[3].power else Path(r).name)
        print(line("as committed", figures(ld, None, None)))
        for tau, share, att in itertools.product(taus, shares, attacks):
            f = figures(ld, tau, share, att)
            score.setdefault((tau, share, att), []).append(abs(f["after_long"]))
            print(line(label(tau, share, att), f))
    best = min(score, key=lambda k: float(np.nanmean(score[k])))
    print(f"best over the fit runs: {label(*best)} (mean |bias after long| {np.nanmean(score[best]) * 100:.2f}%)")
    for r in a.check:
        ld = _load(r)
        print(f"{Path(r).name} (held out)")
        print(line("as committed", figures(ld, None, None)))
        print(line(label(*best), figures(ld, *best)))


def label(tau: float, share: float, att=_KEEP) -> str:
    return f"tau {tau:.3f} s, share {share:.2f}" + ("" if att is _KEEP else f", window {att if att is None else f'{att:.2f} s'}")


if __name__ == "__main__":
    main()
