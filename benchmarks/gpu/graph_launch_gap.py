"""A CUDA-graph decode step timed with the GPU idle (as the calibration grid times it) and with the GPU held busy
(as a pipelined loop runs it): how much of the grid's forward is the GPU waiting for the host.

Issue 16, H200 runs 31-33 (pipelined loop): serving's decode steps ran 3-4% under the model at 16-40 rows, and
0.1-0.3 ms under the calibration grid's forward plus the sampler's table at the same shape. The grid's
``forward_s`` is timed by CUDA events recorded around the forward call on an idle GPU (the previous step synced), so
it includes the time the GPU waits for the call to fill the static inputs and launch the graph; in a pipelined loop
the GPU is still busy with the previous step when that happens. Per batch this times, median of ``--repeats``:

- ``idle``: the step as the grid runs it: ``forward_s``, the step's ``device_s`` (forward, logits, sampler, with
  any gap inside), its wall;
- ``held``: the same step behind a spin kernel long enough to cover its whole issue
  (``executor.calibrate.queued_forward``'s method): the forward's and the step's device work alone;

and the difference (``gap``). Alternating idle / held per repeat, so a drift of the host's speed hits both.

    python -m benchmarks.gpu.graph_launch_gap --out gap.json [--layers 5] [--batches 1,4,8,16,24,32,64] [--repeats 30]
    python -m benchmarks.gpu.graph_launch_gap --out /tmp/g.json --smoke      # tiny on the CPU: a check of the script
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _rec(runner) -> dict:
    r = runner.step_records[0] if runner.step_records else {}
    return {"forward_s": r.get("forward_s"), "device_s": r.get("device_s"), "wall_s": r.get("wall_s"),
            "graph_bs": int(r.get("graph_bs", 0))}


def _med_ms(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None and r[key] == r[key]]
    return round(statistics.median(xs) * 1e3, 4) if xs else None


def measure(engine, plan, repeats: int, spin=None, cycles: int = 0) -> dict:
    """``repeats`` rounds of the step idle then held (held only with ``spin``); medians in ms."""
    import torch
    runner = engine.runner
    runner.execute(plan)   # untimed, as the grid's warm-up run
    idle, held = [], []
    for _ in range(repeats):
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        runner.execute(plan)
        idle.append(_rec(runner))
        if spin is not None:
            torch.cuda.synchronize(runner.device)
            spin(cycles)
            runner.execute(plan)
            held.append(_rec(runner))
    out = {"graph_bs": idle[-1]["graph_bs"], "idle": {k: _med_ms(idle, k) for k in ("forward_s", "device_s", "wall_s")}}
    if held:
        out["held"] = {k: _med_ms(held, k) for k in ("forward_s", "device_s")}
        out["gap"] = {k: round(out["idle"][k] - out["held"][k], 4) for k in ("forward_s", "device_s")
                      if out["idle"][k] is not None and out["held"][k] is not None}
    return out


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.gpu.decode_bench import build, engine_args
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    engine_args(ap, "1,4,8,16,24,32,64")
    ap.add_argument("--ctx", type=int, default=1024, help="every sequence's context")
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    import torch

    from executor.calibrate import _spin_cycles
    from executor.synthetic_steps import MEASURE_TEMPERATURE, drop_plan, synthetic_plan
    try:
        batches = [int(x) for x in a.batches.split(",") if x.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        ap.error(f"--batches {a.batches!r}: expected batch sizes >= 1, comma-separated")
    if a.repeats < 1 or a.ctx < 1:
        ap.error(f"--repeats {a.repeats} / --ctx {a.ctx}: both must be >= 1")
    if a.smoke:
        a.ctx, a.repeats = 48, 2
    mml = 2 * a.ctx + 64
    engine, device = build(a, max(batches), mml, max(batches) * (-(-mml // 64)) + 64)
    t0 = time.perf_counter()
    if device == "cuda":
        engine.warmup()
    spin = getattr(torch.cuda, "_sleep", None) if device == "cuda" else None
    res: dict = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": a.model, "layers": a.layers,
                 "dtype": a.dtype, "ctx": a.ctx, "repeats": a.repeats, "engine_start_s": round(time.perf_counter() - t0, 1),
                 "command": "python -m benchmarks.gpu.graph_launch_gap " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "batches": {}}
    for b in batches:
        plan = synthetic_plan(engine, [a.ctx] * b, [], f"gap{b}_", temperature=MEASURE_TEMPERATURE)
        try:
            engine.runner.execute(plan)
            wall = engine.runner.step_records[0]["wall_s"] if engine.runner.step_records else 0.01
            m = measure(engine, plan, a.repeats, spin, _spin_cycles(3.0 * wall + 1e-3) if spin else 0)
        finally:
            drop_plan(engine, plan)
        res["batches"][str(b)] = m
        Path(a.out).write_text(json.dumps(res, indent=1))
        i, h, g = m["idle"], m.get("held", {}), m.get("gap", {})
        print(f"b={b:3d} graph {m['graph_bs']:3d}: idle forward {i['forward_s']} device {i['device_s']} wall {i['wall_s']} ms"
              + (f" | held forward {h['forward_s']} device {h['device_s']} ms | gap forward {g.get('forward_s')} "
                 f"device {g.get('device_s')} ms" if h else ""), flush=True)
    return res


if __name__ == "__main__":
    main()
