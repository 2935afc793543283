"""Decode steps at one batch and one mean context, with the contexts spread and the KV pages scattered as serving has them.

Issue 16, H200 run 29: at the same batch and mean context, chat's and agentic's decode steps ran their runner 5-8%
above the calibration grid, at every distance from the last prompt step (so not the decay after one), while
reasoning's ran at the grid's speed (`benchmarks/gpu/issue16_h200/run29_agentic_chat_reasoning_266caf6`). The grid's
decode plans give every sequence the same context on pages taken in order (``executor.synthetic_steps``); serving's
contexts spread (prompts of many lengths, prefix hits) and its pages come back scattered as requests finish. This times,
per batch and mean context, the same decode step four ways, rounds interleaved:

- ``equal``: every sequence at the mean context, pages in order (the grid);
- ``spread``: contexts evenly from 0.1x to 1.9x the mean, pages in order;
- ``bimodal``: half at 0.25x, half at 1.75x;
- ``scattered``: the mean context for all, each page drawn at random from the whole KV pool.

Per way, batch, context and round: the median step wall, forward (device-bound in a CUDA graph) and the runner's host
phases over ``--repeats`` steps (``ModelRunner.step_records``).

    python -m benchmarks.gpu.decode_ctx_mix --out mix.json [--batches 16,64] [--ctx 512,2048] [--rounds 3]
    python -m benchmarks.gpu.decode_ctx_mix --out /tmp/x.json --smoke      # the tiny model on the CPU (a check)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WAYS = ("equal", "spread", "bimodal", "scattered")


def contexts(way: str, b: int, c: int) -> list[int]:
    """The decode contexts of ``way`` at batch ``b`` and mean ``c`` (the mean kept within rounding)."""
    if way == "spread":
        return [max(1, int(round(x))) for x in np.linspace(0.1 * c, 1.9 * c, b)] if b > 1 else [c]
    if way == "bimodal":
        return [max(1, int(round((0.25 if i % 2 == 0 else 1.75) * c))) for i in range(b)] if b > 1 else [c]
    return [c] * b


def scatter(plan, num_blocks: int, rng: np.random.Generator) -> None:
    """Give the plan's requests pages drawn at random from the whole pool (distinct), in place."""
    need = sum(len(r.block_ids) for r in plan.decodes)
    pool = rng.permutation(num_blocks)[:need].tolist()
    for r in plan.decodes:
        n = len(r.block_ids)
        r.block_ids, pool = pool[:n], pool[n:]


def time_plan(runner, plan, repeats: int) -> dict:
    runner.execute(plan)    # warm-up
    walls, fwds, phases = [], [], []
    for _ in range(repeats):
        res = runner.execute(plan)
        walls.append(float(res.step_durations[0]))
        fwds.append(float(runner.step_records[0].get("forward_s", float("nan"))))
        phases.append(runner.step_records[0].get("host_phases") or {})
    out = {"wall": round(statistics.median(walls) * 1e3, 4), "forward": round(statistics.median(fwds) * 1e3, 4)}
    if phases and all(phases):   # the runner's host phases (inputs, sample, readback, post), median ms
        out.update({k: round(statistics.median(p[k] for p in phases) * 1e3, 4) for k in phases[0]})
    return out


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.gpu.decode_bench import build, engine_args
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    engine_args(ap, "16,64")
    ap.add_argument("--ctx", default="512,2048", help="mean decode contexts")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import torch

    from executor.synthetic_steps import MEASURE_TEMPERATURE, drop_plan, synthetic_plan
    try:
        batches = [int(x) for x in a.batches.split(",")]
        ctxs = [int(x) for x in a.ctx.split(",")]
    except ValueError:
        batches, ctxs = [], []
    if not batches or not ctxs or min(batches) < 1 or min(ctxs) < 8 or max(batches) > 256 or max(ctxs) > 16384:
        raise SystemExit(f"--batches {a.batches!r} / --ctx {a.ctx!r}: batches 1..256 and mean contexts 8..16384, comma-separated")
    if a.smoke:
        a.repeats = 3
    mml = 2 * max(ctxs) + 64
    pages_per = -(-mml // 64)
    blocks = 2 * max(batches) * pages_per + 64
    engine, device = build(a, max(batches), mml, blocks)
    if device == "cuda":
        engine.warmup()
    res: dict = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": a.model, "layers": a.layers,
                 "dtype": a.dtype, "batches": batches, "ctx": ctxs, "repeats": a.repeats, "kv_blocks": blocks,
                 "command": "python -m benchmarks.gpu.decode_ctx_mix " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "rounds": []}
    rng = np.random.default_rng(0)
    runner = engine.runner
    for r in range(a.rounds):
        row: dict = {"round": r + 1}
        for b in batches:
            for c in ctxs:
                for way in WAYS:
                    plan = synthetic_plan(engine, contexts(way, b, c), [], f"mix{r}_{b}_{c}_{way}_", temperature=MEASURE_TEMPERATURE)
                    if way == "scattered":
                        scatter(plan, blocks, rng)
                    try:
                        got = time_plan(runner, plan, a.repeats)
                    finally:
                        drop_plan(engine, plan)
                    row[f"{way} b={b} c={c}"] = got
                    print(f"round {r + 1} b={b:3d} c={c:5d} {way:9s}: wall {got['wall']:7.3f} forward {got['forward']:7.3f} ms", flush=True)
        res["rounds"].append(row)
        Path(a.out).write_text(json.dumps(res, indent=1))
    lines = ["per batch and mean context, each way's wall over equal's (median over rounds of the per-round ratio):"]
    for b in batches:
        for c in ctxs:
            ratios = {w: statistics.median(rw[f"{w} b={b} c={c}"]["wall"] / rw[f"equal b={b} c={c}"]["wall"] for rw in res["rounds"])
                      for w in WAYS[1:]}
            lines.append(f"  b={b} c={c}: " + ", ".join(f"{w} {v:.3f}" for w, v in ratios.items()))
    res["summary"] = lines
    Path(a.out).write_text(json.dumps(res, indent=1))
    print("\n".join(lines), flush=True)
    return res


if __name__ == "__main__":
    main()
