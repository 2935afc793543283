"""A prompt chunk's forward issue on the host, with its KV pages laid out as the calibration grid lays them
(contiguous, fresh) and as serving's do (scattered over the cache), with and without a cached prefix.

Issue 16, H200 run 36 (pipelined loop): agentic's prompt steps (median 371-789 new tokens on 4.6-6.1k cached, 4-50
decodes beside them) issued their forward in 5.2-6.7 ms on the host, where the calibration's points with 4-6k cached
tokens issued theirs in 3.0-3.4 ms, as its points without cached tokens do; summarize's (few cached tokens) issued as
calibrated. The calibration's synthetic plans take their pages in order from page 0 (``executor.synthetic_steps``);
serving's requests hold pages scattered over the cache. Per shape and layout this times, median of ``--repeats``, each
step behind a spin kernel that covers its issue (``executor.calibrate.queued_forward``'s method): the forward call's
host time (``forward_host_s``, the issue), the runner's host phases (input build, sampler issue), the forward's
device work, and the step's wall on an idle GPU; layouts alternate per repeat, so a drift of the host's speed hits
both.

    python -m benchmarks.gpu.prefix_issue_probe --out probe.json [--layers 5] [--repeats 15]
    python -m benchmarks.gpu.prefix_issue_probe --out /tmp/p.json --smoke      # tiny on the CPU: a check of the script
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (decodes, their context, prompt chunk new tokens, its cached tokens): run 36 agentic's medians at low / knee / past
# saturation, the same chunks without their prefix, and a summarize-like chunk
SHAPES = [(4, 2048, 384, 4608), (22, 2048, 448, 4736), (50, 2048, 768, 6144),
          (22, 2048, 448, 0), (50, 2048, 768, 0), (16, 2048, 2816, 256)]
SMOKE_SHAPES = [(2, 40, 16, 64), (2, 40, 16, 0)]


def _scatter(engine, plan, rng) -> None:
    """Give the plan's requests pages drawn at random from the whole cache (distinct), as serving's are laid out."""
    n = engine.scheduler.blocks.num_blocks
    perm = rng.permutation(n).tolist()
    reqs = list(plan.decodes) + [c.request for c in plan.prefills]
    for r in reqs:
        k = len(r.block_ids)
        r.block_ids, perm = perm[:k], perm[k:]


def _med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None and x == x]
    return round(statistics.median(xs) * 1e3, 4) if xs else None


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.gpu.decode_bench import build, engine_args
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    engine_args(ap, "")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats {a.repeats}: must be >= 1")
    import numpy as np
    import torch

    from executor.calibrate import _spin_cycles
    from executor.synthetic_steps import MEASURE_TEMPERATURE, drop_plan, synthetic_plan
    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    if a.smoke:
        a.repeats = 2
    mml = max(c + n for _, _, n, c in shapes) + max(d for _, d, _, _ in shapes) + 256
    mml = -(-mml // 64) * 64
    max_b = max(d for d, _, _, _ in shapes) + 1
    engine, device = build(a, max_b, mml, 4 * max_b * (-(-mml // 64)) + 64)
    t0 = time.perf_counter()
    if device == "cuda":
        engine.warmup()
    spin = getattr(torch.cuda, "_sleep", None) if device == "cuda" else None
    runner = engine.runner
    rng = np.random.default_rng(0)
    res: dict = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": a.model, "layers": a.layers,
                 "dtype": a.dtype, "repeats": a.repeats, "engine_start_s": round(time.perf_counter() - t0, 1),
                 "command": "python -m benchmarks.gpu.prefix_issue_probe " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "shapes": []}
    for j, (nd, dctx, new, cached) in enumerate(shapes):
        plans = {"contiguous": synthetic_plan(engine, [dctx] * nd, [(new, cached)], f"pc{j}_", temperature=MEASURE_TEMPERATURE),
                 "scattered": synthetic_plan(engine, [dctx] * nd, [(new, cached)], f"ps{j}_", temperature=MEASURE_TEMPERATURE)}
        _scatter(engine, plans["scattered"], rng)
        rows: dict = {k: [] for k in plans}
        try:
            for p in plans.values():   # first use of the shape, untimed
                runner.execute(p)
                runner.execute(p)
            for _ in range(a.repeats):
                for name, p in plans.items():
                    if device == "cuda":
                        torch.cuda.synchronize(runner.device)
                    runner.execute(p)
                    idle = dict(runner.step_records[0]) if runner.step_records else {}
                    held = {}
                    if spin is not None:
                        torch.cuda.synchronize(runner.device)
                        spin(_spin_cycles(2.0 * float(idle.get("wall_s", 0.01)) + 1e-3))
                        runner.execute(p)
                        held = dict(runner.step_records[0]) if runner.step_records else {}
                    ph = held.get("host_phases") or idle.get("host_phases") or {}
                    rows[name].append({"wall_s": idle.get("wall_s"), "idle_forward_host_s": idle.get("forward_host_s"),
                                       "forward_host_s": held.get("forward_host_s"), "forward_s": held.get("forward_s"),
                                       "inputs_s": ph.get("inputs"), "sample_s": ph.get("sample")})
        finally:
            for p in plans.values():
                drop_plan(engine, p)
        out = {"decodes": nd, "decode_ctx": dctx, "new": new, "cached": cached}
        for name, rs in rows.items():
            out[name] = {k: _med([r[k] for r in rs]) for k in rs[0]}
        res["shapes"].append(out)
        Path(a.out).write_text(json.dumps(res, indent=1))
        c, s = out["contiguous"], out["scattered"]
        print(f"{nd:3d} decodes + {new:5d} new on {cached:5d} cached | issue held (idle): contiguous {c['forward_host_s']} "
              f"({c['idle_forward_host_s']}) scattered {s['forward_host_s']} ({s['idle_forward_host_s']}) ms | inputs "
              f"{c['inputs_s']} / {s['inputs_s']} | sample {c['sample_s']} / {s['sample_s']} | forward device "
              f"{c['forward_s']} / {s['forward_s']} | wall {c['wall_s']} / {s['wall_s']} ms", flush=True)
    return res


if __name__ == "__main__":
    main()
