"""Simulator speed: simulated requests per wall-second and peak memory, at 10k / 100k (/ 1M) requests.

    python benchmarks/bench_sim.py              # 10k and 100k requests of the default scenario
    python benchmarks/bench_sim.py --million    # also 1M
    python benchmarks/bench_sim.py --sizes 2000,20000 --scenario my.yaml
    python benchmarks/bench_sim.py --repeat 3     # each size 3 times: the row of the median CPU time, and the best

Each size runs in its own process, so the peak RSS reported is that run's. ``cpu req/s`` uses
the process's CPU time, which is less disturbed than wall time on a shared machine. The rate is the
scenario's (default: ~70% of one 8xH200 node's capacity); more requests simply means a longer
simulated time, so requests/s should stay flat if the simulator is linear in request count.
On a shared machine CPU time still varies by 10-30% from run to run (other processes share the
caches and cores); ``--repeat`` runs each size several times and prints the median run with
the best CPU rate next to it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

# runnable from a checkout without installing: the repository root first on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time_calls(split: dict) -> None:
    """Wrap the cost-model and metrics entry points so their share of the run's CPU time is measured."""
    import sim.backend as sb
    import scheduler.metrics as sm

    def wrap(cls, name, label):
        f = getattr(cls, name)

        def timed(*a, **k):
            t = time.process_time()  # CPU time: a busy shared machine inflates wall time unevenly
            try:
                return f(*a, **k)
            finally:
                split[label] = split.get(label, 0.0) + time.process_time() - t

        setattr(cls, name, timed)

    wrap(sb.MemoStepCost, "chunked_step_time", "cost model: mixed prefill/decode steps")
    wrap(sb.MemoStepCost, "_block", "cost model: decode tables")
    wrap(sm.MetricsCollector, "on_step", "metrics: on_step")
    wrap(sm.MetricsCollector, "on_finish", "metrics: on_finish")
    wrap(sm.MetricsCollector, "summarize", "metrics: summarize")


def one(n: int, scenario: str | None, split: bool = False) -> dict:
    """Run the scenario with ``n`` requests in this process; timings and counters as a dict."""
    from sim.runner import simulate
    from sim.scenario import Scenario, builtin_scenario, load_scenario

    shares: dict[str, float] = {}
    if split:
        _time_calls(shares)

    base = load_scenario(scenario) if scenario else builtin_scenario()
    data = base.model_dump(mode="json", exclude_none=True)
    data["workload"]["num_requests"] = n
    data["workload"].pop("duration_s", None)
    sc = Scenario.model_validate(data)
    t0, c0 = time.perf_counter(), time.process_time()
    run = simulate(sc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    m = run.result.metrics
    return {
        "requests": n, "wall_s": wall, "cpu_s": cpu, "requests_per_s": n / wall,
        "plans": m.num_plans, "steps": m.num_steps, "simulated_s": run.result.simulated_s,
        "finished": m.requests_finished, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "split_s": shares,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated request counts")
    ap.add_argument("--million", action="store_true", help="also run 1,000,000 requests")
    ap.add_argument("--scenario", default=None, help="scenario file (default: the built-in default)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON line per size")
    ap.add_argument("--split", action="store_true", help="also time the cost-model and metrics calls in CPU seconds (adds ~1 us a call)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size (separate processes): print the median, and the best CPU rate")
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.scenario, args.split)))
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.million:
        sizes.append(1_000_000)
    if not args.json:
        best = f" {'best cpu req/s':>14}" if args.repeat > 1 else ""
        print(f"{'requests':>10} {'wall s':>8} {'req/s':>9} {'cpu req/s':>9} {'plans/req':>9} {'steps/req':>9} {'sim s':>10} {'peak RSS MB':>11}{best}")
    for n in sizes:
        cmd = [sys.executable, __file__, "--one", str(n)] + (["--scenario", args.scenario] if args.scenario else [])
        cmd += ["--split"] if args.split else []
        runs = []
        for _ in range(max(1, args.repeat)):
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        runs.sort(key=lambda x: x["cpu_s"])
        r = runs[(len(runs) - 1) // 2]  # the median run (the faster one of the middle two)
        if args.json:
            print(json.dumps(dict(r, cpu_s_all=[x["cpu_s"] for x in runs])))
        else:
            best = f" {n / runs[0]['cpu_s']:>14,.0f}" if len(runs) > 1 else ""
            print(f"{n:>10,} {r['wall_s']:>8.2f} {r['requests_per_s']:>9,.0f} {n / r['cpu_s']:>9,.0f} {r['plans'] / n:>9.2f} "
                  f"{r['steps'] / n:>9.2f} {r['simulated_s']:>10,.0f} {r['peak_rss_mb']:>11,.0f}{best}")
            rest = r["cpu_s"] - sum(r["split_s"].values())
            for label, sec in list(r["split_s"].items()) + [("scheduler + simulator core + workload", rest)] * bool(r["split_s"]):
                print(f"{'':>10} {sec:>8.2f}  {100 * sec / r['cpu_s']:5.1f}%  {label}  ({sec / n * 1e6:,.0f} us/request, CPU)")


if __name__ == "__main__":
    main()
