"""Decode steps' host phases measured three ways, rounds interleaved: which way the calibration should measure them.

Issue 16, H200 runs 28-29: at the same batch, serving's decode steps ran their runner host phases (inputs built,
sampler issued, bookkeeping after; ``costmodels.step_profile.HOST_PHASES``) 25-60% above the calibration grid's, and
run 29's grid read 30-50% above run 28's with the same code, while serving's stayed put. The grid runs one synthetic
plan back to back; serving never repeats a step. This measures, per batch:

- ``same``: one plan back to back, ``--repeats`` times (what ``executor.calibrate.measure_steps`` does);
- ``rotate``: every batch's plan in turn, ``--repeats`` rounds (each step follows a different plan);
- ``serve``: the engine loop (``executor.replay``) with that many requests decoding together (short prompts, all
  arriving at once), its steady decode steps at exactly that batch;

and the three modes alternate ``--rounds`` times (same, rotate, serve, same, ...), so a drift of the host's speed
during the run shows as a difference between rounds of one mode, not between modes. Per mode, batch and round: the
median of each host phase and of the step's wall time (ms).

    python -m benchmarks.gpu.decode_grid_modes --out modes.json [--layers 5] [--batches 1,4,16,64] [--rounds 3]
    python -m benchmarks.gpu.decode_grid_modes --out /tmp/m.json --smoke      # the tiny model on the CPU (a check)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODES = ("same", "rotate", "serve")


def _medians(records: list[dict]) -> dict[str, float]:
    """Median ms of each host phase and of the wall over step records (``ModelRunner.step_records`` rows)."""
    from costmodels.step_profile import HOST_PHASES
    out = {k: round(statistics.median(r["host_phases"][k] for r in records) * 1e3, 4) for k in HOST_PHASES}
    out["wall"] = round(statistics.median(r["wall_s"] for r in records) * 1e3, 4)
    out["steps"] = len(records)
    return out


def _same(engine, plans: dict[int, object], repeats: int) -> dict[int, list[dict]]:
    runner = engine.runner
    got: dict[int, list[dict]] = {}
    for b, plan in plans.items():
        runner.execute(plan)   # untimed, as the grid's warm-up run
        got[b] = []
        for _ in range(repeats):
            runner.execute(plan)
            got[b].append(dict(runner.step_records[0]))
    return got


def _rotate(engine, plans: dict[int, object], repeats: int) -> dict[int, list[dict]]:
    runner = engine.runner
    got: dict[int, list[dict]] = {b: [] for b in plans}
    for _ in range(repeats):
        for b, plan in plans.items():
            runner.execute(plan)
            got[b].append(dict(runner.step_records[0]))
    return got


def _serve(engine, batches: list[int], prompt: int, out_len: int, temperature: float, seed: int) -> dict[int, list[dict]]:
    import numpy as np

    from executor.replay import fresh_engine, replay
    got: dict[int, list[dict]] = {}
    rng = np.random.default_rng(seed)
    for b in batches:
        items = [(0.0, f"srv{seed}_{b}_{i}", rng.integers(0, engine.vocab_size, prompt).tolist(), out_len) for i in range(b)]
        res = replay(fresh_engine(engine, engine.scheduler.config), items, temperature, seed=seed)
        steady = [s for s in res.steps if s.num_steps == 1 and not s.prefill and len(s.decode_ctx) == b and s.host_phases]
        got[b] = [{"host_phases": s.host_phases, "wall_s": s.runner_s} for s in steady]
    return got


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.gpu.decode_bench import build, engine_args
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    engine_args(ap, "1,4,16,64")
    ap.add_argument("--ctx", type=int, default=1024, help="the grid plans' context (serve: the prompts' length)")
    ap.add_argument("--repeats", type=int, default=20, help="steps per batch per round in same / rotate")
    ap.add_argument("--out-len", type=int, default=40, help="serve: output tokens per request (its steady steps)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import torch

    from executor.synthetic_steps import MEASURE_TEMPERATURE, drop_plan, synthetic_plan
    batches = [int(x) for x in a.batches.split(",") if x.strip()]
    if not batches or min(batches) < 1:
        raise SystemExit(f"--batches {a.batches!r}: expected batch sizes >= 1, comma-separated")
    if a.smoke:
        a.ctx, a.repeats, a.out_len = 48, 3, 6
    mml = max(2 * a.ctx, a.ctx + a.out_len + 64)
    engine, device = build(a, max(batches), mml, max(batches) * 2 * (-(-mml // 64)) + 64)
    t0 = time.perf_counter()
    if device == "cuda":
        engine.warmup()
    res: dict = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)", "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": a.model, "layers": a.layers,
                 "dtype": a.dtype, "ctx": a.ctx, "repeats": a.repeats, "out_len": a.out_len, "batches": batches,
                 "engine_start_s": round(time.perf_counter() - t0, 1), "temperature": MEASURE_TEMPERATURE,
                 "command": "python -m benchmarks.gpu.decode_grid_modes " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "rounds": []}
    plans = {b: synthetic_plan(engine, [a.ctx] * b, [], f"dgm{b}_", temperature=MEASURE_TEMPERATURE) for b in batches}
    try:
        for r in range(a.rounds):
            row: dict = {"round": r + 1}
            for mode in MODES:
                t = time.perf_counter()
                if mode == "same":
                    got = _same(engine, plans, a.repeats)
                elif mode == "rotate":
                    got = _rotate(engine, plans, a.repeats)
                else:
                    got = _serve(engine, batches, a.ctx, a.out_len, MEASURE_TEMPERATURE, seed=r)
                row[mode] = {str(b): _medians(v) for b, v in got.items() if v}
                row[f"{mode}_s"] = round(time.perf_counter() - t, 2)
                for b, m in row[mode].items():
                    print(f"round {r + 1} {mode:6s} b={int(b):3d}: " + " ".join(f"{k} {v:7.3f}" for k, v in m.items()
                                                                            if k != "steps") + f" ms ({m['steps']} steps)",
                          flush=True)
            res["rounds"].append(row)
            Path(a.out).write_text(json.dumps(res, indent=1))
    finally:
        for plan in plans.values():
            drop_plan(engine, plan)
    print("per batch, median over rounds of each way's host work before and after the wait (inputs + sample + post, ms):")
    for b in batches:
        per = {mode: [sum(rw[mode][str(b)][k] for k in ("inputs", "sample", "post")) for rw in res["rounds"] if str(b) in rw[mode]]
               for mode in MODES}
        print(f"  b={b}: " + ", ".join(f"{mode} {statistics.median(v):.3f}" for mode, v in per.items() if v))
    print(f"wrote {a.out}")
    return res


if __name__ == "__main__":
    main()
