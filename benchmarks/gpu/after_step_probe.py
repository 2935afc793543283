"""What a step pays for the step before it (issue 16): the executor twin prices every step alone, and the
calibration grid times each shape back to back (decode graphs after decode graphs; eager shapes after one decode
graph), but serving interleaves them. H200 matrix run 17 measured a decode graph step right after an eager
(prefill-bearing) step 0.4-0.7 ms slower than the same batch after another decode step, nearly all of it outside the
graph's forward (the step's device span less its forward: inputs and sampler, +0.4 ms; the host around it +0.15 ms),
and serving's eager steps 0.3-1.0 ms more outside their forwards than the grid's. This probe finds which predecessor
causes it, on the engine the matrix serves (5-layer DeepSeek-V3 FP8, CUDA graphs and piecewise graphs):

- the probe steps: a decode graph step (``--decode`` decodes at ``--ctx`` context) and a mixed eager step (one
  ``--chunk``-token prefill chunk beside the same decodes);
- each timed right after one of these predecessors, rounds rotated over the conditions (so drift hits all alike):
  ``graph`` (the same decode step), ``eager`` (the mixed step, same requests every round), ``eager_new`` (a mixed step
  of a fresh request every round, as serving admits them), ``sleep`` (the host sleeps ``--idle-ms``, GPU and CPU
  idle), ``gpu_busy`` (a GPU spin kernel of ``--idle-ms`` the host waits on in a synchronize), ``cpu_busy`` (the
  host spins ``--idle-ms`` in Python, GPU idle), ``eager_nogc`` (``eager`` with the garbage collector off);
- per probe step: the runner's wall, its device span (start to end event: host gaps the GPU waits through count),
  its forward (events around the forward alone), so ``device - forward`` is input build + sampler and ``wall -
  device`` the host outside the events.

    python3 -m benchmarks.gpu.after_step_probe --out $OUT/after_step.json [--rounds 30]

Prints one table (medians, ms) and writes it with every sample to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch


def _spin_host(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--num-layers", type=int, default=5)
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=3072)
    ap.add_argument("--chunk", type=int, default=3072)
    ap.add_argument("--idle-ms", type=float, default=50.0)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--device", default="cuda", help="cuda (the probe); cpu: a smoke run of the script (no events, no GPU spin)")
    a = ap.parse_args()

    from executor.calibrate import build_engine, gpu_state
    from executor.synthetic_steps import MEASURE_TEMPERATURE, drop_plan, fresh_chunk_step, synthetic_plan

    t0 = time.perf_counter()
    cuda = a.device == "cuda"
    engine = build_engine(a.model, a.num_layers, a.device, a.dtype, 128, 8192, num_kv_blocks=128 * 128 + 64)
    runner = engine.runner
    print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
    T = MEASURE_TEMPERATURE
    dec = synthetic_plan(engine, [a.ctx] * a.decode, [], "pd_", temperature=T)
    mixed_plan = synthetic_plan(engine, [a.ctx] * a.decode, [(a.chunk, 0)], "pm_", temperature=T)
    # the mixed step's decodes are the decode step's requests (same pages, same sampling state): only the chunk differs
    mixed_plan.decodes[:] = dec.decodes

    def run(plan) -> dict:
        runner.execute(plan)
        if cuda:
            torch.cuda.synchronize()
        r = runner.step_records[0]
        return {"wall": r["wall_s"], "device": r["device_s"], "forward": r["forward_s"], "graph_bs": r.get("graph_bs", 0)}

    fresh = [0]

    def eager_new() -> None:
        fresh[0] += 1
        fresh_chunk_step(engine, dec, a.chunk, f"pn{fresh[0]}_", run, T)

    cycles = None

    def gpu_busy() -> None:
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()

    def eager_nogc() -> None:
        gc.disable()
        try:
            run(mixed_plan)
        finally:
            gc.enable()

    # warm every path once (graph capture is at engine build; the eager shapes specialise on first use)
    for _ in range(3):
        run(dec)
        run(mixed_plan)
        eager_new()
    if cuda:   # GPU spin cycles for --idle-ms at the current clock
        probe = 10_000_000
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        torch.cuda._sleep(probe)
        en.record()
        en.synchronize()
        cycles = int(probe * a.idle_ms / max(st.elapsed_time(en), 1e-3))

    before = {"graph": lambda: run(dec), "eager": lambda: run(mixed_plan), "eager_new": eager_new,
              "sleep": lambda: time.sleep(a.idle_ms / 1e3), "gpu_busy": gpu_busy,
              "cpu_busy": lambda: _spin_host(a.idle_ms / 1e3), "eager_nogc": eager_nogc}
    if not cuda:
        del before["gpu_busy"]
    probes = {"decode": dec, "mixed": mixed_plan}
    samples: dict[str, dict[str, list[dict]]] = {p: {c: [] for c in before} for p in probes}
    t_end = time.perf_counter() + a.budget_s
    rounds = 0
    names = list(before)
    for r in range(a.rounds):
        if time.perf_counter() > t_end:
            break
        order = names[r % len(names):] + names[: r % len(names)]   # rotated: no condition always first
        for pname, plan in probes.items():
            for c in order:
                run(dec)          # a common start: every predecessor follows the same decode step
                before[c]()
                samples[pname][c].append(run(plan))
        rounds += 1
    drop_plan(engine, dec)
    for c in mixed_plan.prefills:
        runner.remove_request(c.request.request_id)

    def med(xs, f):
        v = [f(x) for x in xs]
        return statistics.median(v) * 1e3 if v else float("nan")

    table = {}
    print(f"\n{rounds} rounds; medians in ms (device - forward: inputs + sampler; wall - device: host outside the events)")
    print(f"{'probe':7} {'after':11} {'wall':>7} {'device':>7} {'forward':>7} {'dev-fwd':>7} {'wall-dev':>8} {'vs graph':>8}")
    for pname in probes:
        base = med(samples[pname]["graph"], lambda x: x["wall"])
        for c in names:
            xs = samples[pname][c]
            row = {"wall": med(xs, lambda x: x["wall"]), "device": med(xs, lambda x: x["device"]),
                   "forward": med(xs, lambda x: x["forward"]), "dev_minus_fwd": med(xs, lambda x: x["device"] - x["forward"]),
                   "wall_minus_dev": med(xs, lambda x: x["wall"] - x["device"]), "n": len(xs)}
            row["vs_after_graph_ms"] = row["wall"] - base
            table.setdefault(pname, {})[c] = row
            print(f"{pname:7} {c:11} {row['wall']:7.3f} {row['device']:7.3f} {row['forward']:7.3f} {row['dev_minus_fwd']:7.3f} "
                  f"{row['wall_minus_dev']:8.3f} {row['vs_after_graph_ms']:+8.3f}")
    out = {"what": "probe steps timed right after different predecessors (benchmarks/gpu/after_step_probe.py)",
           "args": vars(a), "rounds": rounds, "gpu_state_end": gpu_state(runner.device),
           "torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu", "table_ms": table,
           "samples_s": {p: {c: [{k: v for k, v in x.items()} for x in xs] for c, xs in d.items()} for p, d in samples.items()},
           "graph_bs": {p: samples[p]["graph"][0]["graph_bs"] if samples[p]["graph"] else None for p in probes}}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
