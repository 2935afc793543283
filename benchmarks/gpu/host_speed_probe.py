"""How fast the host runs the engine's host work, CPU by CPU and over time (issue 16).

The H200 matrix runs' misses follow the host's speed: a replay's eager issue and input build ran 0.75-1.8x the
calibration's for the same shapes, and the host probe (``executor/host_probe.py``: one 64-sequence decode step's input
build) read bimodal between replays, ~140-160 us or ~270-370 us, with the same code in the same process. A speed that
takes one of two values suggests where the loop's thread runs (which CPU, which core it shares, which memory node),
not what it runs. This probe times the same piece of host work pinned to each CPU in turn (``sched_setaffinity``), in
rounds spread over time, with the GPU idle and then held busy by a second process, and unpinned between them; with the
machine's CPU topology. If each CPU keeps its own speed, pinning the engine's loop to a fast one fixes the host's speed
for calibration and serving alike; if every CPU moves together over time, pinning cannot.

Two kinds of work are timed, each the median of ``--repeats`` after a tenth as many unmeasured: ``input_build``
(``build_forward_batch`` of 64 decodes at 1024 tokens: numpy and one host-to-device copy, what the host probe times)
and ``python`` (a fixed pure-Python loop: the interpreter alone).

    python3 -m benchmarks.gpu.host_speed_probe --out $OUT/host_speed.json          # on the device (about 1 minute)
    python3 -m benchmarks.gpu.host_speed_probe --cpu --rounds 1 --repeats 5        # CPU smoke mode
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BUSY = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < float(sys.argv[1]):
    for _ in range(8):
        b = a @ a
    torch.cuda.synchronize()
"""


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def topology() -> dict:
    """Each CPU's core, package and hyperthread siblings, the memory nodes' CPUs, and lscpu's summary."""
    cpus = {}
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu[0-9]*")):
        c = int(d.rsplit("cpu", 1)[1])
        cpus[c] = {k: _read(f"{d}/topology/{k}") for k in ("core_id", "physical_package_id", "thread_siblings_list")}
    nodes = {Path(d).name: _read(f"{d}/cpulist") for d in sorted(glob.glob("/sys/devices/system/node/node[0-9]*"))}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        lscpu = ""
    return {"cpus": cpus, "nodes": nodes, "lscpu": lscpu}


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after ``repeats // 10`` unmeasured."""
    out = []
    for j in range(repeats + repeats // 10):
        t0 = time.perf_counter()
        fn()
        if j >= repeats // 10:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _python_loop() -> int:
    s = 0
    for i in range(20000):
        s += i * i % 7
    return s


def measure(cpus: list[int], rounds: int, repeats: int, device, phase: str, log) -> list[dict]:
    """``rounds`` rounds, each every CPU in turn (the order rotated per round) and then unpinned (cpu -1)."""
    import torch

    from executor.forward_batch import build_forward_batch, synthetic_seqs
    seqs, _ = synthetic_seqs([1024] * 64, [], 1, 2, 64, seed=0)
    dev = torch.device(device)
    every = set(cpus)
    rows = []
    for r in range(rounds):
        order = cpus[r % len(cpus):] + cpus[: r % len(cpus)]
        for c in order + [-1]:
            os.sched_setaffinity(0, every if c < 0 else {c})
            ib = timed(lambda: build_forward_batch(seqs, 64, 0, dev), repeats)
            py = timed(_python_loop, max(repeats // 4, 3))
            rows.append({"phase": phase, "round": r, "cpu": c, "input_build_s": ib, "python_s": py, "t": time.time()})
        os.sched_setaffinity(0, every)
        got = [x for x in rows if x["round"] == r and x["phase"] == phase and x["cpu"] >= 0]
        log(f"  {phase} round {r}: input build median over CPUs {statistics.median(x['input_build_s'] for x in got) * 1e6:.1f} us "
            f"(min {min(x['input_build_s'] for x in got) * 1e6:.1f}, max {max(x['input_build_s'] for x in got) * 1e6:.1f}); "
            f"python {statistics.median(x['python_s'] for x in got) * 1e3:.3f} ms")
    return rows


def summary(rows: list[dict], cpus: list[int]) -> dict:
    """Per CPU (and unpinned) per phase: median and min/max of each kind over rounds; and how much of the spread is
    between CPUs (spread of the CPUs' medians) against within a CPU over rounds (median of each CPU's max/min)."""
    out = {}
    for phase in dict.fromkeys(x["phase"] for x in rows):
        per = {}
        for c in cpus + [-1]:
            got = [x for x in rows if x["phase"] == phase and x["cpu"] == c]
            if got:
                per[str(c)] = {k: {"median": statistics.median(x[k] for x in got), "min": min(x[k] for x in got),
                                   "max": max(x[k] for x in got)} for k in ("input_build_s", "python_s")}
        meds = [per[str(c)]["input_build_s"]["median"] for c in cpus if str(c) in per]
        within = [per[str(c)]["input_build_s"]["max"] / per[str(c)]["input_build_s"]["min"] for c in cpus if str(c) in per]
        out[phase] = {"per_cpu": per, "between_cpus_max_over_min": max(meds) / min(meds),
                      "within_cpu_max_over_min_median": statistics.median(within)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "host_speed.json"))
    ap.add_argument("--rounds", type=int, default=8, help="rounds over every CPU per phase (>= 1)")
    ap.add_argument("--repeats", type=int, default=60, help="timed calls per measurement (>= 3)")
    ap.add_argument("--busy-s", type=float, default=40.0, help="seconds the second process keeps the GPU busy")
    ap.add_argument("--cpu", action="store_true", help="no GPU: the copy goes to the CPU, no busy phase (smoke mode)")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.repeats < 3 or not (0 < a.busy_s <= 600):
        print(f"--rounds must be >= 1 (got {a.rounds}), --repeats >= 3 (got {a.repeats}), --busy-s in (0, 600] "
              f"(got {a.busy_s})", file=sys.stderr)
        return 2
    import torch
    if not a.cpu and not torch.cuda.is_available():
        print("no CUDA device: use --cpu for the smoke mode", file=sys.stderr)
        return 2
    device = "cpu" if a.cpu else "cuda"
    cpus = sorted(os.sched_getaffinity(0))
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"host speed probe: {len(cpus)} CPUs {cpus}, {a.rounds} rounds x {a.repeats} repeats, device {device}")
    rows = measure(cpus, a.rounds, a.repeats, device, "gpu_idle", log)
    if not a.cpu:
        busy = subprocess.Popen([sys.executable, "-c", BUSY, str(a.busy_s)])
        time.sleep(3.0)
        try:
            rows += measure(cpus, a.rounds, a.repeats, device, "gpu_busy", log)
        finally:
            busy.kill()
            busy.wait()
    res = {"cpus": cpus, "rounds": a.rounds, "repeats": a.repeats, "device": device, "topology": topology(),
           "rows": rows, "summary": summary(rows, cpus), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    for phase, s in res["summary"].items():
        log(f"{phase}: CPUs' medians max/min {s['between_cpus_max_over_min']:.2f}, a CPU's rounds max/min (median over "
            f"CPUs) {s['within_cpu_max_over_min_median']:.2f}")
        for c, v in s["per_cpu"].items():
            ib = v["input_build_s"]
            log(f"  cpu {c:>3}: input build {ib['median'] * 1e6:7.1f} us (min {ib['min'] * 1e6:7.1f}, max {ib['max'] * 1e6:7.1f}), "
                f"python {v['python_s']['median'] * 1e3:.3f} ms")
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
