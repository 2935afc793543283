"""The whole twin loop in one process on one engine (no drift between processes): calibrate, validate at
three load levels, tune and measure. What scripts/device_twin.sh runs on the H200.

    python3 scripts/device_twin.py --out DIR [--model deepseek-v3 --num-layers 5 --dtype fp8 --device cuda]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--num-layers", type=int, default=5)
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--max-input-len", type=int, default=1024)
    ap.add_argument("--max-output-len", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--levels", default="0.3,0.8,2.0")
    ap.add_argument("--tune-load", type=float, default=2.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--skip-tune", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="replays per load level (median and spread reported)")
    ap.add_argument("--ab-interleave", action="store_true", help="first time eager steps back to back vs after a graph step")
    a = ap.parse_args()

    from costmodels.profiled import ProfiledStepCost
    from executor.calibrate import build_engine, calibrate
    from planner.tune import default_grid, tune
    from scheduler.config import SchedulerConfig
    from sim.validate import copy_requests, natural_rate, saturation_rps
    from ui.cmd_tune import measure_gain
    from ui.cmd_validate import load_requests, run_levels, sim_config, write_plot

    con = Console(width=120)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{a.model}-{a.num_layers}layers_{a.dtype}"
    cmd = "python3 scripts/device_twin.py " + " ".join(sys.argv[1:])
    max_seqs = 128 if not a.quick else 32
    bs = 64
    blocks = max_seqs * (-(-a.max_model_len // bs)) + 64
    t0 = time.perf_counter()
    engine = build_engine(a.model, a.num_layers, a.device, a.dtype, max_seqs, a.max_model_len, num_kv_blocks=blocks)
    con.print(f"engine built in {time.perf_counter() - t0:.1f} s")

    if a.ab_interleave:  # eager prompt-chunk steps back to back vs after a CUDA-graph decode step (serving's order)
        from executor.calibrate import measure_steps
        ab = [([], [(256, 0)]), ([], [(1024, 0)]), ([1000] * 8, [(512, 0)]), ([1000] * 48, [(128, 0)]), ([1000] * 64, [(1024, 0)])]
        quiet = lambda x: None  # noqa: E731
        for rnd in range(2):
            for inter in (False, True):
                pts = measure_steps(engine, ab, 7, quiet, interleave=inter)
                con.print(f"A/B round {rnd + 1} {'after a graph step' if inter else 'back to back':>18}: "
                          + "  ".join(f"{len(p.decode_ctx)}d+{p.prefill[0][0]}t {p.wall_s * 1e3:.2f} ms" for p in pts), highlight=False)

    prof = calibrate(a.model, a.num_layers, a.device, a.dtype, engine=engine, quick=a.quick, repeats=a.repeats, max_model_len=a.max_model_len,
                     max_num_seqs=max_seqs, command=cmd, log=lambda x: con.print(x, highlight=False))
    ppath = out / f"calibration_{tag}.json"
    prof.save(ppath)
    st = prof.step
    con.print(f"step model: max(H, D) + {st.overlap:.2f} min; host {st.host}; scales {st.category_scale}; loop {st.loop}; "
              f"fit MAPE {st.fit.mape * 100:.1f}% on {st.fit.points}", highlight=False)

    cost = ProfiledStepCost(prof)
    reqs = load_requests(a.trace, "chat", None, bs, 0, a.max_input_len, a.max_output_len, a.max_model_len)
    base_v = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=a.max_model_len, block_size=bs)
    fracs = [float(x) for x in a.levels.split(",")]
    rep, samples = run_levels(cost, prof, reqs, base_v, blocks, fracs, engine, device=a.device, model=a.model, dtype=a.dtype,
                              workload=a.trace, profile_path=str(ppath), log=con, runs=a.runs)
    rep.command = cmd
    (out / f"validation_{tag}.json").write_text(json.dumps(rep.model_dump(), indent=1) + "\n", encoding="utf-8")
    con.print(f"plot: {write_plot(rep, samples, out / f'validation_{tag}.png')}")
    with open(out / f"validation_steps_{tag}.jsonl", "w", encoding="utf-8") as f:  # every measured step, for offline refits
        for level, ss in samples.items():
            for x in ss:
                row = {k: (None if isinstance(v, float) and v != v else v) for k, v in x.model_dump().items()}  # NaN: not JSON
                f.write(json.dumps({"level": level, **row}) + "\n")

    if a.skip_tune:
        return
    base_t = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=a.max_model_len, block_size=bs)
    sbase = sim_config(base_t, prof)
    cap = saturation_rps(cost, sbase, blocks, reqs)
    treqs = copy_requests(reqs, natural_rate(reqs) / (a.tune_load * cap))
    t1 = time.perf_counter()
    res = tune(cost, sbase, blocks, treqs, grid=default_grid(base_t, 64, bool(cost.model.mtp_layers)))
    con.print(f"tune: {len(res.candidates)} policies in {time.perf_counter() - t1:.1f} s; baseline {res.baseline.knobs} -> "
              f"{res.best.knobs}: predicted {res.predicted_gain * 100:+.1f}%", highlight=False)
    if res.best_predicted_only is not None:
        con.print(f"predicted only: {res.best_predicted_only.knobs} {res.predicted_only_gain * 100:+.1f}%", highlight=False)
    measured = measure_gain(engine, treqs, base_t, res, "output_throughput", log=con)
    doc = {"result": res.model_dump(), "measured": measured, "profile": str(ppath), "provenance": prof.provenance,
           "load_x_capacity": a.tune_load, "rate_rps": a.tune_load * cap, "requests": len(treqs), "command": cmd,
           "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    (out / f"tune_{tag}.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    con.print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
