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

import torch

from executor.forward_batch import build_forward_batch, synthetic_seqs

SHAPES = {   # name -> (decode contexts, prompt chunks (new, cached))
    "decode b=16 @2048": ([2048] * 16, []),
    "decode b=64 @2048": ([2048] * 64, []),
    "mixed 22 dec@2000 + 430 over 2000": ([2000] * 22, [(430, 2000)]),
    "prefill 2048 over 1024": ([], [(2048, 1024)]),
    "mixed 16 dec@2000 + 2 x 2048": ([2000] * 16, [(2048, 0), (2048, 1024)]),
    "prefill 4096": ([], [(4096, 0)]),
}
QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def start_smi(path: str) -> subprocess.Popen | None:
    """nvidia-smi every 100 ms into ``path`` (None where it is absent)."""
    try:
        return subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                                stdout=open(path, "w"), stderr=subprocess.DEVNULL)
    except OSError:
        return None


def read_smi(path: str) -> list[tuple[float, float, float, float, int]]:
    """(unix seconds, SM MHz, watts, deg C, event reasons) per sample."""
    import calendar
    import datetime as dt
    out = []
    for line in open(path):
        p = [x.strip() for x in line.split(",")]
        try:
            t = dt.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f")
            out.append((calendar.timegm(t.timetuple()) + t.microsecond / 1e6, float(p[1]), float(p[2]), float(p[3]),
                        int(p[4], 16)))
        except (ValueError, IndexError):
            continue
    return out


def run_shape(runner, dec, pre, seconds: float) -> dict:
    """Back-to-back forwards of one shape for ``seconds``: (unix start, device seconds) per step."""
    dev = runner.device
    vocab = runner.model.cfg.spec.vocab_size
    seqs, _ = synthetic_seqs(dec, pre, 1, vocab, runner.page_size, seed=len(dec) + 3 * len(pre))
    batch = build_forward_batch(seqs, runner.page_size, runner.kv.null_page, dev)
    with torch.inference_mode():
        for _ in range(3):   # first calls of the shape (JIT, allocator) outside the window
            batch.memo.clear()
            runner.forward(batch)
        torch.cuda.synchronize(dev)
        time.sleep(1.5)
        evs, t_wall = [], []
        t_end = time.time() + seconds
        while time.time() < t_end:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            batch.memo.clear()
            t_wall.append(time.time())
            a.record()
            runner.forward(batch)
            b.record()
            evs.append((a, b))
            if len(evs) % 8 == 0:   # keep the host within a few steps of the device: steps start when they run
                b.synchronize()
        torch.cuda.synchronize(dev)
    return {"t": t_wall, "dev": [a.elapsed_time(b) / 1e3 for a, b in evs]}


def summarise(name: str, r: dict, smi: list) -> dict:
    t, d = r["t"], r["dev"]
    t0, t1 = t[0], t[-1] + d[-1]
    first = [s for s in smi if t0 <= s[0] < t0 + 0.3]
    late = [s for s in smi if (t0 + t1) / 2 <= s[0] <= t1]
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    n = len(d)
    out = {"shape": name, "steps": n, "seconds": t1 - t0,
           "dev_first_ms": med(d[: min(10, n)]) * 1e3, "dev_late_ms": med(d[n // 2:]) * 1e3,
           "mhz_first": med([s[1] for s in first]), "mhz_late": med([s[1] for s in late]),
           "watts_first": med([s[2] for s in first]), "watts_late": med([s[2] for s in late]),
           "watts_late_max": max((s[2] for s in late), default=float("nan")),
           "capped_late": sum(bool(s[4] & 0x4) for s in late) / max(len(late), 1),
           "temp_late": med([s[3] for s in late])}
    out["slowdown"] = out["dev_late_ms"] / out["dev_first_ms"]
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
    smi = start_smi(log)
    runs = {}
    try:
        for name, (dec, pre) in SHAPES.items():
            runs[name] = run_shape(engine.runner, dec, pre, a.seconds)
            print(f"  {name}: {len(runs[name]['dev'])} steps", flush=True)
    finally:
        if smi is not None:
            time.sleep(0.3)
            smi.terminate()
    samples = read_smi(log) if smi is not None else []
    rows = [summarise(n, r, samples) for n, r in runs.items()]
    print(f"{'shape':36s} {'steps':>5s} {'dev first':>9s} {'dev late':>9s} {'x':>5s} | {'MHz':>11s} {'x':>5s} | "
          f"{'W first':>7s} {'W late':>6s} {'max':>5s} capped")
    for r in rows:
        print(f"{r['shape']:36s} {r['steps']:5d} {r['dev_first_ms']:8.2f}ms {r['dev_late_ms']:8.2f}ms {r['slowdown']:5.3f} | "
              f"{r['mhz_first']:5.0f}>{r['mhz_late']:5.0f} {r['clock_ratio']:5.3f} | {r['watts_first']:7.0f} {r['watts_late']:6.0f} "
              f"{r['watts_late_max']:5.0f} {r['capped_late']:5.0%}", flush=True)
    res = {"rows": rows, "seconds": a.seconds, "smi_samples": len(samples)}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
