"""A decode graph's pipelined launch against the parts the calibration times apart (issue 16; H100 runs 45-46: serving's
decode steps' device work 0.04-0.13 ms over the model of the held forward and the sampler at 1-16 rows).

On the matrix's engine (5-layer DeepSeek-V3 FP8, Triton GEMMs, CUDA graphs), for decode batches of 1-64 at 2,048-token
contexts: the held forward (``queued_forward_s``), the whole pipelined launch held the same way (``queued_launch_s``:
inputs' copies, replay, sampler, the sampled ids' read-back; what serving's ``device_s`` spans) and the sampler table's
device work at the same rows (``bench_sampler``); then ``step_fit.fit_launch_device`` over them. Prints one line a
batch and writes ``$OUT/launch_span.json``. Run on the device: ``bash scripts/device_launch_span.sh``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import torch

    from costmodels.step_fit import fit_launch_device
    from executor.calibrate import bench_sampler, build_engine, measure_steps

    t0 = time.perf_counter()
    # MODEL=tiny DEVICE=cpu DTYPE=fp32 LAYERS=0 runs it on a CPU (no held times there: a smoke of the calls)
    model, dev, dtype = os.environ.get("MODEL", "deepseek-v3"), os.environ.get("DEVICE", "cuda"), os.environ.get("DTYPE", "fp8")
    layers = int(os.environ.get("LAYERS", "5")) or None
    engine = build_engine(model, layers, dev, dtype, 128, 4096, num_kv_blocks=128 * 64 + 64)
    print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
    batches = [int(x) for x in os.environ.get("BATCHES", "1,2,4,8,16,32,64").split(",")]
    temp = float(os.environ.get("TEMPERATURE", "10000"))
    shapes = [([2048] * b, []) for b in batches]
    pts = measure_steps(engine, shapes, repeats=5, log=print, temperature=temp)
    gen = torch.Generator(device=dev).manual_seed(0)
    spec = engine.cfg.spec
    smp = bench_sampler(engine.runner.model.compute_logits, engine.vocab_size, spec.hidden_size, engine.runner.device,
                        engine.runner.kv.dtype, 10, batches, gen)
    sdev = {p["batch"]: p.get("device_s") for p in smp}
    rows = []
    for b, p in zip(batches, pts):
        rest = None if not (p.queued_launch_s and p.queued_forward_s and sdev.get(b)) else p.queued_launch_s - p.queued_forward_s - sdev[b]
        rows.append({"batch": b, "graph_bs": p.graph_bs, "wall_s": p.wall_s, "forward_s": p.forward_s,
                     "queued_forward_s": p.queued_forward_s, "queued_launch_s": p.queued_launch_s, "sample_device_s": sdev.get(b),
                     "launch_beyond_s": rest})
        print(f"b={b:3d} graph {p.graph_bs:3d}: held forward {(p.queued_forward_s or float('nan')) * 1e3:.3f} ms, sampler device "
              f"{(sdev.get(b) or float('nan')) * 1e3:.3f}, held launch {(p.queued_launch_s or float('nan')) * 1e3:.3f}: "
              f"beyond the two {(rest if rest is not None else float('nan')) * 1e3:+.3f} ms", flush=True)
    fit = fit_launch_device(pts, lambda r: sdev.get(int(r)), min_points=3)
    print(f"fit_launch_device: {fit}", flush=True)
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "launch_span.json").write_text(json.dumps({"rows": rows, "fit": fit, "temperature": temp,
                                                       "gpu": torch.cuda.get_device_name() if dev == "cuda" else dev,
                                                       "torch": torch.__version__}, indent=1))


if __name__ == "__main__":
    main()
