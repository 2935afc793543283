"""The GPU's power cap as a step-time mechanism (issue 16): each step shape run back to back for a few seconds, its
device time per step (CUDA events) against the SM clock and the board power the driver reports over the same seconds.

Why: H200 run 44's prefill-heavy levels ran their prompt steps at a median 1603-1721 MHz under the 700 W cap (clock
event reason 0x4, SW power cap), where the calibration grid had timed the same shapes at ~1935 MHz, and the twin
predicted them 4-7% short. A power model needs, per step kind: the board power it draws at full clock, the clock it
settles at when run back to back, and how its device time follows the clock. This measures the three on the 5-layer
DeepSeek-V3 FP8 engine of the matrix (``executor.calibrate.build_engine``, dummy weights; forwards only, no sampling).

Per shape: 1.5 s idle (the clock recovers), then ``--seconds`` of back-to-back forwards; nvidia-smi samples clock,
power and clock event reasons every 100 ms in the background. Reported: power and clock in the first 0.3 s and over
the last half; device time per step over the first 10 steps and the last half; the slowdown against the clock ratio.

    python3 -m benchmarks.gpu.power_probe --out power_probe.json [--seconds 3]     (on the GPU: scripts/device_power.sh)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from executor.power_ref import loop_summary, make_batch, read_smi, run_loop as run_shape, smi_target, start_smi

SHAPES = {   # name -> (decode contexts, prompt chunks (new, cached))
    "decode b=16 @2048": ([2048] * 16, []),
    "decode b=64 @2048": ([2048] * 64, []),
    "mixed 22 dec@2000 + 430 over 2000": ([2000] * 22, [(430, 2000)]),
    "prefill 2048 over 1024": ([], [(2048, 1024)]),
    "mixed 16 dec@2000 + 2 x 2048": ([2000] * 16, [(2048, 0), (2048, 1024)]),
    "prefill 4096": ([], [(4096, 0)]),
}
# duty mixes: one prompt step then k decode steps, repeated (the share of time in prompt steps that serving shows)
MIXES = {"4096 prefill + 2 x decode b=64": ("prefill 4096", "decode b=64 @2048", 2),
         "4096 prefill + 8 x decode b=64": ("prefill 4096", "decode b=64 @2048", 8),
         "4096 prefill + 24 x decode b=16": ("prefill 4096", "decode b=16 @2048", 24)}
QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
QUERY_INSTANT = QUERY + ",power.draw.instant"


def smi_query() -> str:
    """The sampling query: with the driver's instantaneous power where it reports one (power.draw is a 1 s average on
    recent drivers)."""
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY_INSTANT}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and "Not Supported" not in r.stdout and "[N/A]" not in r.stdout:
            return QUERY_INSTANT
    except (OSError, subprocess.TimeoutExpired):
        pass
    return QUERY


def summarise(name: str, r: dict, smi: list) -> dict:
    t, d, w = r["t"], r["dev"], r["which"]
    ref = loop_summary(r, smi)   # the calibration's reference-loop figures: busy share, last half's power / clock / cap
    t0, t1 = t[0], r.get("t_done", t[-1] + d[-1])
    first = [s for s in smi if t0 <= s[0] < t0 + 0.3]
    late = [s for s in smi if (t0 + t1) / 2 <= s[0] <= t1]
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    out = {"shape": name, "steps": len(d), "seconds": t1 - t0, "busy": ref["busy"],
           "mhz_first": med([s[1] for s in first]), "mhz_late": ref["mhz"] if late else float("nan"),
           "watts_first": med([s[2] for s in first]), "watts_late": ref["watts"] if late else float("nan"),
           "watts_late_max": max((s[2] for s in late), default=float("nan")),
           "capped_late": ref["capped"], "temp_late": med([s[3] for s in late])}
    if late and len(late[0]) > 5:
        out["watts_instant_first"] = med([s[5] for s in first])
        out["watts_instant_late"] = med([s[5] for s in late])
    # device time per step kind (a mix alternates kinds): the first 10 of each against the last half's
    for k in sorted(set(w)):
        dk = [x for x, j in zip(d, w) if j == k]
        sfx = "" if len(set(w)) == 1 else f"_{k}"
        out[f"dev_first_ms{sfx}"] = med(dk[: min(10, len(dk))]) * 1e3
        out[f"dev_late_ms{sfx}"] = med(dk[len(dk) // 2:]) * 1e3
        out[f"slowdown{sfx}"] = out[f"dev_late_ms{sfx}"] / out[f"dev_first_ms{sfx}"]
        out[f"time_share{sfx}"] = sum(dk) / sum(d)
    out["clock_ratio"] = out["mhz_first"] / out["mhz_late"] if out["mhz_late"] else float("nan")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from executor.calibrate import build_engine
    t0 = time.perf_counter()
    engine = build_engine("deepseek-v3", a.layers, "cuda", "fp8", max_num_seqs=64, max_model_len=8192,
                          num_kv_blocks=4096, max_batched_tokens=8192)
    print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
    log = (a.out or "power_probe.json") + ".smi.csv"
    query = smi_query()
    smi = start_smi(log, query, target=smi_target(engine.runner.device))
    runs = {}
    batches = {name: make_batch(engine.runner, dec, pre) for name, (dec, pre) in SHAPES.items()}
    try:
        time.sleep(2.0)   # the idle board at full clock
        for name in SHAPES:
            runs[name] = run_shape(engine.runner, [batches[name]], a.seconds)
            print(f"  {name}: {len(runs[name]['dev'])} steps", flush=True)
        for name, (pre, dec, k) in MIXES.items():
            runs[name] = run_shape(engine.runner, [batches[pre]] + [batches[dec]] * k, a.seconds)
            print(f"  {name}: {len(runs[name]['dev'])} steps", flush=True)
    finally:
        if smi is not None:
            time.sleep(0.3)
            smi.terminate()
    samples = read_smi(log) if smi is not None else []
    rows = [summarise(n, r, samples) for n, r in runs.items()]
    idle = [s for s in samples if s[0] < min(r["t"][0] for r in runs.values()) - 0.2]
    print(f"smi query: {query}; idle before the shapes: {statistics.median([s[2] for s in idle]) if idle else float('nan'):.0f} W "
          f"at {statistics.median([s[1] for s in idle]) if idle else float('nan'):.0f} MHz")
    print(f"{'shape':36s} {'steps':>5s} {'busy':>4s} {'dev first':>9s} {'dev late':>9s} {'x':>5s} | {'MHz':>11s} {'x':>5s} | "
          f"{'W first':>7s} {'W late':>6s} {'max':>5s} capped")
    for r in rows:
        kinds = [k[len("slowdown"):] for k in r if k.startswith("slowdown")]
        for sfx in kinds:
            print(f"{r['shape'] + sfx:36s} {r['steps']:5d} {r['busy']:4.2f} {r['dev_first_ms' + sfx]:8.2f}ms {r['dev_late_ms' + sfx]:8.2f}ms "
                  f"{r['slowdown' + sfx]:5.3f} | {r['mhz_first']:5.0f}>{r['mhz_late']:5.0f} {r['clock_ratio']:5.3f} | "
                  f"{r['watts_first']:7.0f} {r['watts_late']:6.0f} {r['watts_late_max']:5.0f} {r['capped_late']:5.0%}"
                  + (f" | instant {r['watts_instant_first']:.0f} > {r['watts_instant_late']:.0f} W" if "watts_instant_late" in r else ""),
                  flush=True)
    res = {"rows": rows, "seconds": a.seconds, "smi_samples": len(samples), "smi_query": query,
           "idle_watts": statistics.median([s[2] for s in idle]) if idle else None,
           "steps": {n: {"t": [round(x - r["t"][0], 5) for x in r["t"]], "dev_ms": [round(x * 1e3, 4) for x in r["dev"]],
                         "which": r["which"], "t0_unix": r["t"][0]} for n, r in runs.items()}}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
