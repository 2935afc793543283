"""Per-step residuals of a validation-matrix run, by batch composition: where the executor twin's step model misses.

Reads a run directory (``benchmarks/gpu/issue16_h200/runN_*``): the ONE calibration profile and the per-step samples
of every class and level (``samples_<class>_*.json``), re-predicts every measured step with the step model at HEAD
(``--refit``: re-fitted from the run's own calibration points first, no validation data) and prints the error by
step kind and composition (decode batch, graph padding, prefill tokens, chunks, cached context), and the spread of the
calibration's repeated shapes (how noisy the eager host floor is).

    python3 benchmarks/step_residuals.py benchmarks/gpu/issue16_h200/run4_sync96 [--refit auto] [--sync] [--class reasoning]

A sample keeps only its decode count and mean context, and the prefill chunks' token and context sums: a step is
rebuilt as that many decodes at the mean context and equal chunks (exact for one chunk; attention is close to
linear in context, so the mean stands for the batch). ``--recorded`` compares the prediction the run itself
recorded instead (the model at the run's commit, exact batches).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodels.step_fit import errors  # noqa: E402  (MAPE, bias and p90 error, as sim.validate.step_comparison's)
from costmodels.batch import decodes_then_chunks  # noqa: E402
from costmodels.step_profile import HOST_PHASES  # noqa: E402
from sim.validate import read_backs  # noqa: E402,F401  (the pipelined loop's read-backs; used here and by tests)

LEVELS = ("low", "knee", "past saturation")
PHASES = HOST_PHASES   # the runner's host phases, as the samples' columns name them
PHASE_COLS = tuple(f"{k}_host_s" for k in PHASES)


def load_samples(run: Path, only: str | None = None) -> dict[str, dict[str, dict]]:
    """{class: {level: compact sample columns}} from ``samples_<class>_*.json``."""
    out = {}
    for f in sorted(run.glob("samples_*_*.json")):
        cls = f.name.split("_")[1]
        if only is None or cls == only:
            out[cls] = json.loads(f.read_text())
    return out


def rebuilt_steps(s: dict):
    """(decode contexts, prefill new tokens, prefill contexts) per sample, chunks split evenly."""
    for nd, dmean, pt, pc, pctx in zip(s["decodes"], s["decode_ctx_mean"], s["prefill_tokens"], s["prefill_chunks"], s["prefill_ctx"]):
        dctx = np.full(nd, int(round(dmean)), np.int64)
        new = [pt // pc + (1 if i < pt % pc else 0) for i in range(pc)] if pc else []
        ctx = [pctx // pc] * pc if pc else []
        yield dctx, new, ctx


def predict(cost, prof, s: dict, sync: bool, nums: list[int] | None = None) -> np.ndarray:
    """The twin's engine-loop iteration for each sample (runner step and loop, as ``twinfer validate`` predicts; a
    step after a prefill-bearing one of the same replay, ``nums``: each sample's replay, with the profile's
    ``after_eager_s``; the iteration's admissions at the profile's price)."""
    from types import SimpleNamespace

    from ui.cmd_validate import predict_steps
    pc = s["prefill_chunks"]
    n = len(pc)
    nums = nums or [1] * n
    # the iteration's own admissions (runs since 21 record their prompt tokens, since 29 their count too: before it
    # the per-request part, ~17 us on the H200, is left out)
    adm_tok = s.get("admitted_tokens") or [0] * n
    adm = s.get("admitted") or [0] * n
    steps = [SimpleNamespace(decode_ctx=dctx, prefill=list(zip(new, ctx)), draft_len=0, admitted=adm[i], admitted_tokens=adm_tok[i])
             for i, (dctx, new, ctx) in enumerate(rebuilt_steps(s))]
    # where the pipelined engine had idled (a step launched with nothing in flight), from the steps' launch starts
    starts = s.get("start_s")
    cold = idle = None
    if not sync and starts and all(x is not None for x in starts):
        from sim.validate import idle_gaps
        cold = read_backs(np.array(starts, float), np.array(s["measured_s"], float), nums)[1]
        idle = idle_gaps(np.array(starts, float), np.array(s["measured_s"], float), nums)
    out = np.zeros(n)
    for r in dict.fromkeys(nums):   # each replay a sequence of its own
        idx = [i for i in range(n) if nums[i] == r]
        c = None if cold is None else cold[idx]
        out[idx] = predict_steps(cost, prof, [steps[i] for i in idx], not sync, c, None if idle is None else idle[idx])
    return out


def replay_boundary(s: dict) -> int:
    """Index of the first step of a level's second replay (the samples of its replays are concatenated:
    ``sim.timeline_check.split_replays``), or the sample count when there is one replay."""
    nums = replay_numbers(s, 2)
    return nums.index(2) if 2 in nums else len(nums)


def replay_numbers(s: dict, replays: int) -> list[int]:
    """The replay (1-based) each sample of a level belongs to, its ``replays`` measured replays concatenated."""
    from sim.timeline_check import sample_steps, split_replays
    out: list[int] = []
    for r, (a, b) in enumerate(split_replays(sample_steps(s), replays), 1):
        out += [r] * (b - a)
    return out


def run_replays(run: Path) -> int:
    """Measured replays per level: the run's matrix command (``--runs N``), 2 when it does not say (runs 3-4)."""
    import re
    for f in run.glob("matrix_*.json"):
        m = re.search(r"--runs (\d+)", json.loads(f.read_text()).get("command", ""))
        if m:
            return int(m.group(1))
    return 2


def columns(samples: dict[str, dict], cost, prof, sync: bool, recorded: bool, replays: int = 2) -> dict[str, np.ndarray]:
    """All samples of all levels as flat arrays, with a predicted column and the class/level of each."""
    cols: dict[str, list] = {}
    for cls, levels in samples.items():
        for lv, s in levels.items():
            n = len(s["measured_s"])
            nums = replay_numbers(s, replays)
            pred = np.array([np.nan if p is None else p for p in s["predicted_s"]], float) if recorded else predict(cost, prof, s, sync, nums)
            for k in ("decodes", "decode_ctx_mean", "prefill_tokens", "prefill_chunks", "prefill_ctx", "graph_bs", "measured_s"):
                cols.setdefault(k, []).extend(s[k])
            for k in ("device_s", "forward_s", "forward_host_s", "runner_s", "admit_s", "schedule_s", "complete_s", "admitted", "admitted_tokens") + PHASE_COLS:
                # recorded since runs 6 / 9 / 20 / 21 (the runner's host phases since run 28); nan where absent
                cols.setdefault(k, []).extend(np.nan if x is None else x for x in s.get(k) or [None] * n)
            cols.setdefault("pred", []).extend(pred)
            cols.setdefault("cls", []).extend([cls] * n)
            cols.setdefault("level", []).extend([lv] * n)
            # the step before (same replay order): a step right after an eager one, or the first of a level
            prev = ["first"] + ["eager" if (s["graph_bs"][i - 1] == 0) else "graph" for i in range(1, n)]
            cols.setdefault("prev", []).extend(prev)
            cols.setdefault("replay", []).extend(nums)
    return {k: np.array(v) for k, v in cols.items()}


def row(label: str, m: np.ndarray, p: np.ndarray) -> str:
    if m.size == 0:
        return ""
    e = errors(p, m)
    return (f"  {label:34} {m.size:6d} {m.mean() * 1e3:9.2f} {p.mean() * 1e3:9.2f} {e['bias'] * 100:+7.1f}% "
            f"{e['mape'] * 100:6.1f}% {e['p90_abs_err_s'] * 1e3:7.2f}")


def table(c: dict[str, np.ndarray], title: str, mask: np.ndarray) -> None:
    """Residuals by composition for the samples in ``mask``."""
    m, p = c["measured_s"], c["pred"]
    nd, pt, pc, pctx, g = c["decodes"], c["prefill_tokens"], c["prefill_chunks"], c["prefill_ctx"], c["graph_bs"]
    kind = np.where(pc == 0, "decode", np.where(nd == 0, "prefill", "mixed"))
    print(f"{title}\n  {'bin':34} {'steps':>6} {'meas ms':>9} {'pred ms':>9} {'bias':>8} {'MAPE':>7} {'p90 abs':>7}")

    def out(label, sel):
        sel = sel & mask
        if sel.any():
            print(row(label, m[sel], p[sel]))
    for k in ("decode", "prefill", "mixed"):
        out(f"kind {k}", kind == k)
    dec = kind == "decode"
    for lo, hi in ((1, 1), (2, 8), (9, 16), (17, 32), (33, 64), (65, 128)):
        out(f"decode batch {lo}-{hi}", dec & (nd >= lo) & (nd <= hi))
    pad = g - nd
    for lo, hi in ((0, 0), (1, 3), (4, 7)):
        out(f"decode graph padding {lo}-{hi} rows", dec & (g > 0) & (pad >= lo) & (pad <= hi))
    for pv in ("first", "eager", "graph"):
        out(f"decode after {pv} step", dec & (c["prev"] == pv))
    eager = ~dec
    for lo, hi in ((1, 128), (129, 512), (513, 1024), (1025, 2048), (2049, 4096), (4097, 1 << 30)):
        out(f"eager prefill tokens {lo}-{hi}", eager & (pt >= lo) & (pt <= hi))
    for lo, hi in ((0, 0), (1, 8), (9, 32), (33, 128)):
        out(f"eager with {lo}-{hi} decodes", eager & (nd >= lo) & (nd <= hi))
    out("eager, chunks 1", eager & (pc == 1))
    out("eager, chunks 2+", eager & (pc >= 2))
    out("eager, cached context > 0", eager & (pctx > 0))
    out("eager, predicted < 40 ms (host-bound)", eager & (p < 0.040))
    out("eager, predicted >= 40 ms", eager & (p >= 0.040))
    for pv in ("first", "eager", "graph"):
        out(f"eager after {pv} step", eager & (c["prev"] == pv))


def calibration_spread(prof) -> None:
    """The calibration's eager shapes: median of repeats and spread ((max - min) / median), host- vs device-bound."""
    st = prof.step
    pts = [p for p in st.points if p.graph_bs == 0 and p.repeats > 1]
    if not pts:
        return
    small = [p for p in pts if p.wall_s < 0.040]
    big = [p for p in pts if p.wall_s >= 0.040]
    print("calibration eager shapes (median of repeats): spread = (max - min) / median of the repeats")
    for label, sel in (("wall < 40 ms (host-bound)", small), ("wall >= 40 ms (device-bound)", big)):
        if sel:
            w = np.array([p.wall_s for p in sel]) * 1e3
            sp = np.array([p.spread for p in sel]) * 100
            print(f"  {label:30} {len(sel):3d} shapes: wall {w.min():.1f}-{w.max():.1f} ms (mean {w.mean():.1f}, sd {w.std():.1f}); "
                  f"spread median {np.median(sp):.1f}%, max {sp.max():.1f}%")


def serving_clocks(run: Path) -> None:
    """The SM clock serving ran at (each level's NVML readings, every 25th step), next to the grid's in
    ``grid_vs_serving``: GPU Boost clocks lower as the chip warms, so the two measure at different clocks."""
    for f in sorted(run.glob("validation_*_*.json")):
        d = json.loads(f.read_text())
        parts = [f"{lv['name']} {lv['diagnostics']['sm_clock_mhz_mean']:.0f}" for lv in d.get("levels", [])
                 if lv.get("diagnostics", {}).get("sm_clock_mhz_mean")]
        if parts:
            print(f"serving SM clock, mean MHz ({d.get('workload')}): " + ", ".join(parts))


def forward_text(grid_fwd, ctx: np.ndarray, fwd: np.ndarray, dev: np.ndarray) -> str:
    """Where a decode step's time goes, grid against serving: the forward alone (graph replay, CUDA events) and the
    rest of the runner's event span (input build, sampling, host gaps the GPU waits through). Empty where not recorded."""
    ok = np.isfinite(fwd)
    if not ok.any():
        return ""
    out = f"; forward: serving {np.mean(fwd[ok]) * 1e3:.2f}"
    if grid_fwd and len(grid_fwd) >= 2:
        x, y = np.array(sorted(grid_fwd)).T
        g = np.interp(ctx[ok], x, y)
        out += f", grid {g.mean() * 1e3:.2f} ({np.mean(fwd[ok] / g - 1) * 100:+.1f}%)"
    rest = dev[ok] - fwd[ok]
    if np.isfinite(rest).any():
        out += f"; rest of the step {np.nanmean(rest) * 1e3:.2f}"
    return out


def iteration_boundaries(samples: dict[str, dict], c: dict[str, np.ndarray], cost, replays: int) -> None:
    """Pipelined runs: where an iteration's time goes, by the kinds of this step and the next. The loop launches step
    N+1 before it reads step N back, so iteration N runs from read-back N-1 through the loop's bookkeeping to the
    start of N+1's launch ("book"), then through that launch and the wait for N's device work to read-back N
    ("launch+wait"; of it, the launch as the engine timed it where recorded: input build, forward and sampler issue).
    Beside them, the model's device work of step N and its host work for launching N+1
    (``ProfiledStepCost.pipelined_parts``), which the twin charges launch by launch (``costmodels.host.pipeline_step``:
    iteration N = max(host of launching N+1, what is left of N's device work)), and per level the step MAPE as charged
    and as the per-step rule max(device, host) of N alone would charge it (the simulator's rule before 2026-12-04).
    ``c``: the samples' columns (``columns``), whose ``pred`` is validate's prediction of each step."""
    from costmodels.step_fit import errors
    pc_ = cost.pipelined()
    print("pipelined iterations by this step -> next (medians, ms): wall = book + launch+wait | model device of this, "
          "host of the next's launch")
    for cls, levels in samples.items():
        for lv, s in levels.items():
            if not s.get("start_s") or any(x is None for x in s["start_s"]):
                continue
            nums = replay_numbers(s, replays)
            parts = [pc_.pipelined_parts(*decodes_then_chunks(d, 0, new, ctx)) for d, new, ctx in rebuilt_steps(s)]
            dev = np.array([a for a, _ in parts])
            host = np.array([b for _, b in parts])
            wall = np.array(s["measured_s"], float)
            start = np.array(s["start_s"], float)
            rb, cold = read_backs(start, wall, nums)
            eager = np.array(s["prefill_chunks"]) > 0
            n = len(wall)
            # each step's launch on the host as recorded (runs since this was recorded: the input build, the forward's
            # issue and the sampler's; nan before)
            launch = np.zeros(n)
            for k in ("inputs_host_s", "forward_host_s", "sample_host_s"):
                v = s.get(k)
                launch = launch + (np.array([np.nan if x is None else x for x in v], float) if v else np.full(n, np.nan))
            nxt = np.array([i + 1 < n and nums[i + 1] == nums[i] and not cold[i + 1] for i in range(n)])
            for name, a_e, b_e in (("decode -> decode", False, False), ("decode -> prompt", False, True),
                                   ("prompt -> decode", True, False), ("prompt -> prompt", True, True)):
                ids = np.array([i for i in range(1, n - 1) if nxt[i] and not cold[i] and eager[i] == a_e
                                and eager[i + 1] == b_e], int)
                if ids.size < 5:
                    continue
                book = start[ids + 1] - rb[ids - 1]
                lw = rb[ids] - start[ids + 1]
                nl = launch[ids + 1]
                meas = f" (launch {np.median(nl[np.isfinite(nl)]) * 1e3:6.2f})" if np.isfinite(nl).any() else ""
                print(f"  {cls:10} {lv:16} {name:17} {ids.size:6d}: wall {np.median(wall[ids]) * 1e3:7.2f} = book "
                      f"{np.median(book) * 1e3:5.2f} + launch+wait {np.median(lw) * 1e3:7.2f}{meas} | device "
                      f"{np.median(dev[ids]) * 1e3:7.2f}, next launch {np.median(host[ids + 1]) * 1e3:6.2f}")
            # validate's own prediction (what the simulator charges), and each step's max(device, host) alone with the
            # same extras (what the per-step rule charged)
            charged = c["pred"][(c["cls"] == cls) & (c["level"] == lv)]
            alone = np.array([pc_.mixed_step_time(*decodes_then_chunks(d, 0, new, ctx)) for d, new, ctx in rebuilt_steps(s)])
            ok = wall > 0
            print(f"  {cls:10} {lv:16} step MAPE as charged (launch by launch) {errors(charged[ok], wall[ok])['mape'] * 100:5.2f}%, "
                  f"each step's max(device, host) alone {errors(alone[ok], wall[ok])['mape'] * 100:5.2f}%")


def grid_vs_serving(prof, c: dict[str, np.ndarray]) -> None:
    """Decode steps: serving's measured iteration against the calibration grid's own measurement of the same batch
    (its CUDA-graph points at that batch, linear in context between them) plus the fitted loop time: what differs
    between the two measurements is the conditions, not the model."""
    st = prof.step
    grid: dict[int, list[tuple[float, float]]] = {}
    fwd: dict[int, list[tuple[float, float]]] = {}
    clocks: dict[int, list[float]] = {}
    for p in st.points:
        if p.graph_bs > 0 and p.repeats > 1 and p.loop_s is None and not p.prefill:
            grid.setdefault(len(p.decode_ctx), []).append((float(np.mean(p.decode_ctx)), p.wall_s))
            if p.forward_s:
                fwd.setdefault(len(p.decode_ctx), []).append((float(np.mean(p.decode_ctx)), p.forward_s))
            if p.sm_clock_mhz:
                clocks.setdefault(len(p.decode_ctx), []).append(p.sm_clock_mhz)
    dec = (c["prefill_chunks"] == 0) & (c["graph_bs"] > 0)
    print("decode steps: serving minus the calibration grid at the same batch (grid runner + fitted loop, ms)")
    for b in sorted(grid):
        sel = dec & (c["decodes"] == b)
        if sel.sum() < 20 or len(grid[b]) < 2:
            continue
        x, y = np.array(sorted(grid[b])).T
        ctx = c["decode_ctx_mean"][sel]
        ref = np.interp(ctx, x, y) + np.asarray(st.loop(b, b), float)
        m = c["measured_s"][sel]
        print(f"  b={b:3d}: {sel.sum():5d} steps, serving {m.mean() * 1e3:6.2f}, grid {ref.mean() * 1e3:6.2f}, "
              f"difference {np.mean(m / ref - 1) * 100:+5.1f}%" + (f" (grid at {np.mean(clocks[b]):.0f} MHz)" if b in clocks else "")
              + forward_text(fwd.get(b), ctx, c["forward_s"][sel], c["device_s"][sel]))


AFTER_BINS = ((1, 512), (513, 1024), (1025, 2048), (2049, 4096), (4097, 8192), (8193, 10**9))


def after_eager_by_tokens(prof, c: dict[str, np.ndarray]) -> list[dict]:
    """Decode steps right after a prompt-bearing step of the same replay, by that step's prompt tokens: measured minus
    predicted (ms; the prediction already charges the profile's decay behind its one chunk size), beside decode steps
    after a decode step; and the calibration's first-step decay behind each chunk size where it measured several
    (``provenance.after_eager.decode_after_ms_by_tokens``)."""
    dec = c["prefill_chunks"] == 0
    prev_tok = np.r_[0, c["prefill_tokens"][:-1]]
    same = np.r_[False, (c["cls"][1:] == c["cls"][:-1]) & (c["level"][1:] == c["level"][:-1])
                 & (c["replay"][1:] == c["replay"][:-1])]
    res = c["measured_s"] - c["pred"]
    ok = np.isfinite(res)
    rows = []
    for lo, hi in AFTER_BINS:
        m = dec & same & ok & (prev_tok >= lo) & (prev_tok <= hi)
        if m.sum() >= 10:
            rows.append({"bin": f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}", "steps": int(m.sum()),
                         "residual_ms": float(np.mean(res[m]) * 1e3)})
    base = dec & same & ok & (prev_tok == 0)
    if not rows:
        return rows
    ae = (getattr(prof, "provenance", None) or {}).get("after_eager") or {}
    sized = ae.get("decode_after_ms_by_tokens") or {}
    print("decode steps right after a prompt-bearing step, by its prompt tokens: measured - predicted (mean ms)"
          + (f"; after a decode step {np.mean(res[base]) * 1e3:+.2f} ms ({int(base.sum())} steps)" if base.any() else ""))
    for r in rows:
        print(f"  after {r['bin']:>11s} tokens: {r['steps']:5d} steps, {r['residual_ms']:+.2f} ms")
    if sized:
        step = getattr(prof, "step", None)
        priced = bool(step is not None and step.host.after_eager_decode_by_tokens)
        how = "the model prices it by the prompt step's size" if priced else \
            f"the model charges the {ae.get('chunk_tokens', '?')}-token one"
        print(f"  calibration, first decode step after a chunk (over a decode step's; {how}): "
              + ", ".join(f"{n} tok {v[0]:+.3f} ms" for n, v in sized.items() if v)
              + f", {ae.get('chunk_tokens', '?')} tok {(ae.get('decode_after_ms') or [0.0])[0]:+.3f} ms")
    return rows


def phases_vs_grid(prof, c: dict[str, np.ndarray]) -> None:
    """Decode-graph steps: the runner's host phases (inputs built, sampler issued, tokens read back, bookkeeping) in
    serving against the calibration grid's points at the same batch (means, ms); the forward's own host call beside
    them. Prints nothing unless both the samples and the grid recorded the phases."""
    grid: dict[int, list[dict]] = {}
    for p in prof.step.points:
        if p.graph_bs > 0 and p.loop_s is None and not p.prefill and p.host_phases:
            grid.setdefault(len(p.decode_ctx), []).append({**p.host_phases, "forward": p.forward_host_s or np.nan})
    if not grid or not np.isfinite(c["inputs_host_s"]).any():
        return
    dec = (c["prefill_chunks"] == 0) & (c["graph_bs"] > 0) & np.isfinite(c["inputs_host_s"])
    print("decode steps' runner host phases, serving vs the grid at the same batch (means, ms): "
          + " | ".join(PHASES + ("forward call",)))
    for b in sorted(grid):
        sel = dec & (c["decodes"] == b)
        if sel.sum() < 20:
            continue
        parts = []
        for k, col in zip(PHASES + ("forward",), PHASE_COLS + ("forward_host_s",)):
            g = np.array([q[k] for q in grid[b]], float)
            m = c[col][sel]
            # a phase the loop does not time (a pipelined launch has no read-back or post phase of its own): n/a
            fm = f"{np.nanmean(m) * 1e3:5.2f}" if np.isfinite(m).any() else "  n/a"
            fg = f"{np.nanmean(g) * 1e3:5.2f}" if np.isfinite(g).any() else "  n/a"
            parts.append(f"{fm} vs {fg}")
        print(f"  b={b:3d}: {sel.sum():5d} steps: " + " | ".join(parts))


def short_eager_grid(prof) -> dict[int, list[tuple[int, float, float | None]]]:
    """The calibration grid's host-bound eager points: one prompt chunk of <= 512 tokens, no cached context, <= 16
    decodes; {decodes: [(tokens, runner wall, forward or None)]}."""
    grid: dict[int, list[tuple[int, float, float | None]]] = {}
    for p in prof.step.points:
        if (p.graph_bs == 0 and p.repeats > 1 and p.loop_s is None and len(p.prefill) == 1 and p.prefill[0][1] == 0
                and p.prefill[0][0] <= 512 and len(p.decode_ctx) <= 16):
            grid.setdefault(len(p.decode_ctx), []).append((p.prefill[0][0], p.wall_s, p.forward_s))
    return grid


def eager_vs_grid(prof, samples: dict[str, dict]) -> None:
    """Serving's short eager steps (the grid's kind: one chunk of <= 512 new tokens, no cached context, <= 16
    decodes) against the grid point of the nearest decode count, interpolated in log tokens: runner wall and, where
    both recorded it, the forward alone. What the step model cannot see when serving's host-bound steps run longer
    than the same steps in the calibration grid (issue 16, runs 8-9: reasoning's TTFT miss)."""
    grid = short_eager_grid(prof)
    if not grid:
        return

    def ref(nd: int, tok: int, idx: int) -> float:
        """The grid's time at this shape, nan outside its token range (no extrapolation)."""
        k = min(grid, key=lambda g: (abs(g - nd), g))
        v = sorted(grid[k])
        y = [a[idx] for a in v]
        if any(x is None for x in y) or not v[0][0] <= tok <= v[-1][0]:
            return float("nan")
        return float(np.interp(np.log(tok), np.log([a[0] for a in v]), y))

    print("short eager steps (1 chunk <= 512 tokens, no cached context, <= 16 decodes): serving over the grid's")
    for cls, levels in samples.items():
        for lv, s in levels.items():
            fw = s.get("forward_s") or [None] * len(s["decodes"])
            r, rf, skipped = [], [], 0
            for i, nd in enumerate(s["decodes"]):
                if s["prefill_chunks"][i] == 1 and s["prefill_ctx"][i] == 0 and s["prefill_tokens"][i] <= 512 and nd <= 16:
                    tok = s["prefill_tokens"][i]
                    g = ref(nd, tok, 1)
                    if not np.isfinite(g):
                        skipped += 1
                        continue
                    if s.get("runner_s") and s["runner_s"][i]:
                        r.append(s["runner_s"][i] / g - 1)
                    g = ref(nd, tok, 2)
                    if fw[i] and np.isfinite(g):
                        rf.append(fw[i] / g - 1)
            if not r:
                continue
            a = np.array(r) * 100
            line = (f"  {cls:10} {lv:16} {a.size:4d} steps: runner {a.mean():+5.1f}% (median {np.median(a):+5.1f}%, "
                    f"p10 {np.percentile(a, 10):+5.1f}%, p90 {np.percentile(a, 90):+5.1f}%)")
            if rf:
                line += f"; forward {np.mean(rf) * 100:+5.1f}%"
            print(line + (f" ({skipped} outside the grid's token range left out)" if skipped else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--refit", default=None, help="auto|none|LO,HI: refit the step model from the run's calibration points")
    ap.add_argument("--sync", action="store_true", help="the run's loop was synchronous (loop time adds to the runner)")
    ap.add_argument("--idle-graph-forwards", action="store_true",
                    help="with --refit: pin the device scale to the CUDA-graph forwards timed on an idle GPU, setting "
                         "aside those timed with the GPU held busy (queued_forward_s, calibrations since ae91d90), which "
                         "the fit prefers since 2026-12-04")
    ap.add_argument("--class", dest="cls", default=None)
    ap.add_argument("--recorded", action="store_true", help="use the predictions the run recorded")
    ap.add_argument("--no-power-limit", action="store_true", help="prompt steps at the op tables' full clock (costmodels.power off)")
    a = ap.parse_args()
    from costmodels.profiled import ProfiledStepCost
    from costmodels.step_fit import run_profile

    from sim.timeline_check import unpacked_run
    try:
        run = unpacked_run(a.run)   # reports.tgz unpacked to a temporary copy where needed
    except FileNotFoundError as e:
        ap.error(str(e))
    try:
        prof = run_profile(run, a.refit, idle_graph=a.idle_graph_forwards)
    except ValueError as e:
        ap.error(str(e))
    if a.refit is not None:
        st2 = prof.step
        print(f"refit ({a.refit}): in-sample MAPE {st2.fit.mape * 100:.2f}%; host {st2.host.model_dump()}; overlap {st2.overlap:.2f}")
    calibration_spread(prof)
    samples = load_samples(run, a.cls)
    if not samples:
        raise SystemExit(f"{run}: no samples_<class>_*.json")
    c = columns(samples, ProfiledStepCost(prof, power=not a.no_power_limit), prof, a.sync, a.recorded, run_replays(run))
    serving_clocks(run)
    ok = np.isfinite(c["pred"]) & (c["measured_s"] > 0)
    for cls in samples:
        table(c, f"== {cls} (all levels)", ok & (c["cls"] == cls))
    kind_mape(c, ok)
    host_drift(samples, ProfiledStepCost(prof), prof, run_replays(run))
    eager_split(c, ProfiledStepCost(prof), prof)
    loop_split(c, prof)
    if not a.sync:
        iteration_boundaries(samples, c, ProfiledStepCost(prof), run_replays(run))
    grid_vs_serving(prof, c)
    phases_vs_grid(prof, c)
    after_eager_by_tokens(prof, c)
    eager_vs_grid(prof, samples)
    device_errors(samples, ProfiledStepCost(prof))
    host_speed_windows(samples, c, prof, run_replays(run))
    clock_bias(run, samples, prof)


def gpu_clocks(run: Path) -> np.ndarray:
    """``gpu_clocks.csv`` (nvidia-smi every 0.5 s through the matrix, scripts/device_matrix.sh), one row per sample:
    unix seconds, SM MHz, board watts, and 1.0 where the SW power cap was holding the clock down (clock event reason
    bit 0x4). An empty (0, 4) array without the file."""
    import calendar
    import csv
    import datetime as dt
    f = run / "gpu_clocks.csv"
    rows = []
    if f.is_file():
        for r in list(csv.reader(f.open()))[1:]:
            try:
                t = dt.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                rows.append((calendar.timegm(t.timetuple()) + t.microsecond / 1e6, float(r[1].split()[0]),
                             float(r[2].split()[0]), float(bool(int(r[4].strip(), 16) & 0x4)) if len(r) > 4 else 0.0))
            except (ValueError, IndexError):
                continue
    return np.asarray(rows, float).reshape(-1, 4)


def gpu_clock_trace(run: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``gpu_clocks``' unix seconds, SM MHz and whether the SW power cap was holding the clock down."""
    g = gpu_clocks(run)
    return g[:, 0], g[:, 1], g[:, 3].astype(bool)


def clock_bias(run: Path, samples: dict[str, dict], prof) -> dict:
    """The SM clock each step ran at (the run's ``gpu_clocks.csv``, placed by each replay's start,
    ``replay_t0_unix``) against the grid's, and the recorded prediction's bias by step kind: under sustained
    prefill-heavy load the H200 reaches its power cap (700 W) and lowers its clock, where the grid timed its prompt
    shapes at near full clock (run 44: summarize's knee ran its prompt steps at a median 1721 MHz, the grid's at 1935).
    Returns ``{(class, level): {"prompt_mhz", "decode_mhz", "prompt_bias", "decode_bias", "capped"}}``."""
    ts, mhz, capped = gpu_clock_trace(run)
    if ts.size == 0:
        return {}
    grid = prof.step.prompt_clock_mhz()
    print("SM clock per step (gpu_clocks.csv)" + (f": the grid's prompt steps of >= 2048 tokens at a median "
                                                   f"{grid:.0f} MHz" if grid else ""))
    out = {}
    for f in sorted(run.glob("validation_*_*.json")):
        d = json.loads(f.read_text())
        cls = f.name.split("_")[1]
        if cls not in samples:
            continue
        for lv in d.get("levels", []):
            s, t0s = samples[cls].get(lv["name"]), lv.get("diagnostics", {}).get("replay_t0_unix")
            if s is None or not t0s:
                continue
            st = np.asarray(s["start_s"], float)
            rep = np.asarray(replay_numbers(s, len(t0s))) - 1
            at = np.asarray(t0s, float)[rep] + st
            clk = np.interp(at, ts, mhz)
            cap = capped[np.clip(np.searchsorted(ts, at), 0, ts.size - 1)]
            meas, pred = np.asarray(s["measured_s"], float), np.asarray(s["predicted_s"], float)
            prompt = np.asarray(s["prefill_chunks"]) > 0
            ok = np.isfinite(pred) & (meas > 0)
            err = np.where(ok, (pred - meas) / np.where(meas > 0, meas, 1.0), np.nan)
            med = lambda m, x: float(np.median(x[m])) if m.any() else float("nan")  # noqa: E731
            avg = lambda m, x: float(np.nanmean(x[m])) if m.any() else float("nan")  # noqa: E731
            r = out[(cls, lv["name"])] = {"prompt_mhz": med(prompt, clk), "decode_mhz": med(~prompt, clk),
                                          "prompt_bias": avg(prompt, err), "decode_bias": avg(~prompt, err),
                                          "capped": avg(prompt, cap.astype(float))}
            print(f"  {cls:10s} {lv['name']:16s} prompt steps at {r['prompt_mhz']:5.0f} MHz ({r['capped']:4.0%} power-capped), "
                  f"bias {r['prompt_bias'] * 100:+5.1f}% | decode steps at {r['decode_mhz']:5.0f} MHz, "
                  f"bias {r['decode_bias'] * 100:+5.1f}%")
    return out


def device_errors(samples: dict[str, dict], cost) -> dict:
    """The step model's device work (``pipelined_parts``' first part: the forward's and the sampler's kernels) against
    each step's device seconds as the runner's CUDA events measured them (``device_s``), per class, level and kind:
    MAPE and bias. Separates the cost model's device side from the host and the loop, which the iteration adds.
    Returns ``{(cls, level, kind): errors}``."""
    from costmodels.step_fit import errors
    pc_ = cost.pipelined()
    out = {}
    for cls, levels in samples.items():
        for lv, s in levels.items():
            md = np.array([np.nan if x is None else x for x in s.get("device_s") or []], float)
            if not md.size or not np.isfinite(md).any():
                continue
            dev = np.array([pc_.pipelined_parts(*decodes_then_chunks(d, 0, new, ctx))[0] for d, new, ctx in rebuilt_steps(s)])
            eager = np.array(s["prefill_chunks"]) > 0
            for kind, m in (("decode", ~eager), ("prompt", eager), ("all", np.ones_like(eager))):
                ok = m & np.isfinite(md) & (md > 0)
                if ok.sum() >= 5:
                    out[(cls, lv, kind)] = errors(dev[ok], md[ok])
    if out:
        print("device work per step, the model's against the CUDA events' (MAPE, bias): decode | prompt-bearing | all")
        for cls, levels in samples.items():
            for lv in levels:
                parts = [f"{out[(cls, lv, k)]['mape'] * 100:4.1f}% ({out[(cls, lv, k)]['bias'] * 100:+4.1f}%)"
                         if (cls, lv, k) in out else f"{'n/a':>14}" for k in ("decode", "prompt", "all")]
                print(f"  {cls:10} {lv:16} " + " | ".join(parts))
    return out


def host_speed_windows(samples: dict[str, dict], c: dict[str, np.ndarray], prof, replays: int, window_s: float = 2.0,
                       slow: float = 1.2) -> dict:
    """The lent host's speed through serving, as the sampler's issue shows it: per ``window_s`` of each replay, the
    median over the decode steps of their measured sampler issue (``sample_host_s``: the same Python and launches at
    every step) over the calibration's fitted term at the same rows (``HostTerms.sample_issue``). Then each level's
    step MAPE over the windows at most ``slow`` times the calibrated speed and over the rest: how much of a level's
    miss comes from periods the host ran slower than it did while calibrated. A diagnosis, not a fit: nothing here
    feeds a prediction. Returns ``{(cls, level): {"windows": [...], "mape_near": x, "mape_slow": y, "slow_share":
    z}}`` (runs without the sampler's term or its timing: {})."""
    from costmodels.step_fit import errors
    host = prof.step.host
    if host.sample_issue_s <= 0:
        return {}
    out = {}
    for cls, levels in samples.items():
        for lv, s in levels.items():
            sh = s.get("sample_host_s")
            if not sh or not s.get("start_s") or any(x is None for x in s["start_s"]):
                continue
            sel = (c["cls"] == cls) & (c["level"] == lv)
            pred, meas = c["pred"][sel], c["measured_s"][sel]
            start = np.array(s["start_s"], float)
            nums = np.array(replay_numbers(s, replays))
            ratio = np.array([np.nan if x is None else x for x in sh], float) / np.maximum(
                host.sample_issue(np.array(s["decodes"], float)), 1e-9)
            dec = np.array(s["prefill_chunks"]) == 0
            win = np.full(len(start), -1)
            speed, rows = [], []
            for r in sorted(set(nums)):
                m = nums == r
                first = len(speed)   # this replay's windows are speed[first:]
                t0 = start[m].min()
                w = np.floor((start - t0) / window_s).astype(int)
                for k in sorted(set(w[m])):
                    mk = m & (w == k)
                    rk = ratio[mk & dec & np.isfinite(ratio)]
                    if rk.size >= 5:
                        win[mk] = len(speed)
                        speed.append(float(np.median(rk)))
                rows.append(" ".join(f"{x:4.2f}" for x in speed[first:]))
            if not speed:
                continue
            sp = np.array(speed)
            is_slow = np.where(win >= 0, sp[np.maximum(win, 0)] > slow, False)
            ok = np.isfinite(pred) & (meas > 0) & (win >= 0)
            near, slo = ok & ~is_slow, ok & is_slow
            res = {"windows": speed, "slow_share": float(slo.sum() / max(ok.sum(), 1)),
                   "mape_near": errors(pred[near], meas[near])["mape"] if near.any() else float("nan"),
                   "mape_slow": errors(pred[slo], meas[slo])["mape"] if slo.any() else float("nan")}
            out[(cls, lv)] = res
            if len(out) == 1:
                print(f"the host's speed through serving: per {window_s:g} s of each replay, the decode steps' sampler issue over "
                      f"its calibrated term (median); step MAPE of the steps in windows up to {slow:g}x and beyond")
            print(f"  {cls:10} {lv:16} " + " | ".join(rows))
            print(f"  {'':10} {'':16} MAPE {res['mape_near'] * 100:5.2f}% near calibrated speed, {res['mape_slow'] * 100:5.2f}% "
                  f"slower ({res['slow_share'] * 100:.0f}% of steps)")
    return out


def host_drift(samples: dict[str, dict], cost, prof, replays: int) -> None:
    """Per class, level and replay: the decode graph steps' host part (iteration less forward) against the model's
    (``ui.cmd_validate.decode_host_drift``, what ``twinfer validate`` reports per replay), each step at its mean
    context."""
    from types import SimpleNamespace

    from ui.cmd_validate import decode_host_drift
    print("decode steps' host part (iteration - forward) vs the model's, per replay")
    for cls, levels in samples.items():
        parts = []
        for lv, s in levels.items():
            nums = replay_numbers(s, replays)
            fwd = [np.nan if x is None else x for x in s.get("forward_s") or [None] * len(nums)]
            got = []
            for r in sorted(set(nums)):
                steps = [SimpleNamespace(iter_s=s["measured_s"][i], forward_s=fwd[i], graph_bs=s["graph_bs"][i],
                                         decode_ctx=[int(round(s["decode_ctx_mean"][i]))] * s["decodes"][i],
                                         prefill=[0] * s["prefill_chunks"][i], num_steps=1) for i in range(len(nums)) if nums[i] == r]
                d = decode_host_drift(steps, cost, prof)
                got.append("n/a" if d is None else f"{d * 100:+.1f}%")
            parts.append(f"{lv} {' / '.join(got)}")
        print(f"  {cls:10} " + " | ".join(parts))


def eager_split(c: dict[str, np.ndarray], cost, prof) -> None:
    """Serving's eager steps (runs since 20 record each forward call's host seconds): the forward's measured issue
    against the model's host term H, and the measured forward against the model's device terms D and its
    ``max(H, D) + overlap x min(H, D)``, medians by kind and prefill size. Says where the forward's time comes from:
    a forward that measures more than both its issue and D waits inside for something the model does not see."""
    fh = c.get("forward_host_s")
    if fh is None or not np.isfinite(fh).any():
        return
    st = prof.step
    rows: dict[str, list] = {}
    for i in np.flatnonzero(np.isfinite(fh) & (c["prefill_chunks"] > 0) & np.isfinite(c["forward_s"])):
        nd, pc, pt = int(c["decodes"][i]), int(c["prefill_chunks"][i]), int(c["prefill_tokens"][i])
        new = np.array([1] * nd + [pt // pc + (1 if j < pt % pc else 0) for j in range(pc)])
        ctx = np.array([int(round(c["decode_ctx_mean"][i]))] * nd + [int(c["prefill_ctx"][i]) // pc] * pc)
        dec = np.array([True] * nd + [False] * pc)
        h = cost.host_time(new.size, int(new.sum()), pc)
        d = cost.eager_device(new, ctx, dec)
        key = f"{'mixed' if nd else 'prefill'} {'<=512' if pt <= 512 else '513-2048' if pt <= 2048 else '>2048'} tok"
        bucket = st.piecewise_bucket(int(new.sum())) or int(new.sum())
        rows.setdefault(key, []).append((fh[i], h, c["forward_s"][i], d, cost.eager_forward(h, d, bucket, cost.category_times(new, ctx, dec))))
    print("eager steps' forward: measured issue (host) vs the model's H, measured forward vs the model's D and "
          "combination (medians, ms)")
    for key in sorted(rows):
        a = np.array(rows[key]) * 1e3
        mi, mh, mf, md, mc = np.median(a, 0)
        print(f"  {key:22} {len(a):5d} steps: issue {mi:6.2f} vs H {mh:6.2f} | forward {mf:6.2f} vs D {md:6.2f}, "
              f"model {mc:6.2f} ({(mc / mf - 1) * 100:+.1f}%)")


def loop_split(c: dict[str, np.ndarray], prof) -> None:
    """Where the loop's own time went (runs since 21 record it): per class and step kind, the iteration less the
    runner, the admissions of the requests that arrived before it, the plan's scheduling and completion, against the
    model's loop term (medians, ms)."""
    ad = c.get("admit_s")
    if ad is None or not np.isfinite(ad).any():
        return
    st = prof.step
    kind = np.where(c["prefill_chunks"] == 0, "decode", np.where(c["decodes"] == 0, "prefill", "mixed"))
    n = c["decodes"] + c["prefill_chunks"]
    tok = c["decodes"] + c["prefill_tokens"]
    model = st.loop.fixed_s + st.loop.per_request_s * n + st.loop.per_token_s * tok
    # the iteration's own admissions at the profile's price (nan or absent where not recorded: none)
    zero = np.zeros(len(n))
    adm_model = (st.loop.admit_s * np.nan_to_num(c.get("admitted", zero))
                 + st.loop.admit_per_token_s * np.nan_to_num(c.get("admitted_tokens", zero)))
    print("the loop's own time: iteration - runner, admissions, scheduling, completion vs the model's loop and its "
          "admissions (medians, ms)")
    for cls in sorted(set(c["cls"])):
        for k in ("decode", "prefill", "mixed"):
            m = (c["cls"] == cls) & (kind == k) & np.isfinite(ad) & np.isfinite(c["runner_s"])
            if m.sum() < 3:
                continue
            med = [float(np.median(x[m])) * 1e3 for x in (c["measured_s"] - c["runner_s"], ad, c["schedule_s"], c["complete_s"],
                                                           model + adm_model, adm_model)]
            print(f"  {cls:10} {k:8} {int(m.sum()):6d} steps: loop {med[0]:5.2f} = admit {med[1]:5.2f} + schedule {med[2]:5.2f} "
                  f"+ complete {med[3]:5.2f} + rest | model {med[4]:5.2f} (admit {med[5]:5.2f})")


def kind_mape(c: dict[str, np.ndarray], ok: np.ndarray) -> None:
    """One line per class: per-step MAPE (and bias) by kind (decode, prefill, mixed) and overall; then the same per
    level and replay (a level's first replay against its second: the same trace, so a difference is the engine's
    state, not the batch)."""
    m, p = c["measured_s"], c["pred"]
    kind = np.where(c["prefill_chunks"] == 0, "decode", np.where(c["decodes"] == 0, "prefill", "mixed"))

    def line(sel_base) -> str:
        parts = []
        for k in ("decode", "prefill", "mixed", "all"):
            sel = sel_base & ((kind == k) if k != "all" else True)
            if sel.any():
                e = errors(p[sel], m[sel])
                parts.append(f"{k} {e['mape'] * 100:5.1f}% ({e['bias'] * 100:+5.1f}%)")
            else:
                parts.append(f"{k} {'n/a':>15}")
        return "  ".join(parts)
    print("per-step MAPE (bias) by kind")
    for cls in dict.fromkeys(c["cls"]):
        print(f"  {cls:10} " + line(ok & (c["cls"] == cls)))
    print("per level and replay")
    for cls in dict.fromkeys(c["cls"]):
        for lv in dict.fromkeys(c["level"][c["cls"] == cls]):
            for r in range(1, int(c["replay"].max()) + 1):
                sel = ok & (c["cls"] == cls) & (c["level"] == lv) & (c["replay"] == r)
                if sel.any():
                    print(f"  {cls:10} {lv:16} r{r} {line(sel)}")


if __name__ == "__main__":
    main()
