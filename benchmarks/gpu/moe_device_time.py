"""Issue 16: one MoE layer's routed experts, eager wall vs device time inside a CUDA graph, on the calibration's engine.

Runs ``executor.calibrate.bench_ops`` on the 5-layer DeepSeek-V3 FP8 engine (dummy weights) exactly as a calibration
does and prints its ``moe_experts`` points: tokens, backend, eager wall (``time_s``, synchronised host clock, median)
and ``device_s`` (the same call captured in a CUDA graph, replayed back to back, CUDA events). The step model prices
the routed experts with the cost model's roofline; this says where the eager time is launch-bound (small batches)
and what the device pays at prefill sizes, the input for pricing the experts from measured device time.

    python -m benchmarks.gpu.moe_device_time OUT.json [--repeats 10]
"""

from __future__ import annotations

import argparse
import json

import torch

from executor.calibrate import bench_ops, build_engine, device_provenance


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    engine = build_engine("deepseek-v3", 5, "cuda", "fp8", 128, 8192)
    pts = bench_ops(engine, a.repeats)
    moe = [p for p in pts if p["op"] == "moe_experts"]
    print(f"{'tokens':>7} {'backend':>9} {'eager ms':>9} {'device ms':>10} {'device/eager':>12}")
    for p in moe:
        d = p.get("device_s")
        print(f"{p['tokens']:7d} {p['backend']:>9} {p['time_s'] * 1e3:9.3f} "
              + (f"{d * 1e3:10.3f} {d / p['time_s']:12.2f}" if d else f"{'n/a':>10} {'':>12}"))
    with open(a.out, "w") as f:
        json.dump({"env": device_provenance("cuda"), "torch": torch.__version__, "points": pts}, f, indent=1)


if __name__ == "__main__":
    main()
