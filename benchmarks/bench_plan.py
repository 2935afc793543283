"""Planner speed: candidates screened and simulated per second on 2 cores, and the 72-GPU search time.

    python benchmarks/bench_plan.py            # the acceptance search + screen-only rates
    python benchmarks/bench_plan.py --cores 4  # another core count
    python benchmarks/bench_plan.py --quick    # only the acceptance search
    python benchmarks/bench_plan.py --quick --profile 30   # ... in this process (1 worker) under cProfile: top 30

The acceptance search is ``twinfer plan --model deepseek-v3 --hardware gb300 --gpus 72
--workload agentic --slo ttft_p90=2s,tpot_p90=50ms``: aggregated and disaggregated deployments, memory
fit, analytic screen, simulation of the shortlist, frontier and plan. It must finish in under
30 s (NVIDIA AIConfigurator's full search takes about that without simulating anything).

The process is pinned to ``--cores`` CPUs (``sched_setaffinity``, inherited by the worker
processes) and runs that many workers. ``cpu s`` adds this process's and its workers' CPU time:
on a shared machine the wall time also contains other people's work, the CPU time does not.
``--profile N`` runs the acceptance search in this process (worker jobs too, so the profile sees
them) and prints the N functions with the most cumulative and the most own time.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _pin(cores: int) -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))
    use = cpus[:cores]
    os.sched_setaffinity(0, use)
    return use


def _search(model: str, hardware: str, gpus: int, workload: str, slo: dict, simulate_top: int, workers: int, profile: int = 0):
    from planner.request import PlanRequest
    from planner.search import plan_deployment
    from sim.workload import preset

    req = PlanRequest(model=model, hardware=hardware, gpus=gpus, workload=preset(workload), slo=slo, simulate_top=simulate_top)
    prof = None
    if profile:
        import cProfile

        prof, workers = cProfile.Profile(), 1   # in this process: the profile sees the worker jobs
        prof.enable()
    t0, c0 = time.perf_counter(), _cpu()
    rep = plan_deployment(req, workers=workers)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    if prof is not None:
        import pstats

        prof.disable()
        for key in ("cumulative", "tottime"):
            pstats.Stats(prof).sort_stats(key).print_stats(profile)
    return rep, wall, cpu


def main() -> int:
    from planner.confirm import STOPPED_EARLY

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--limit", type=float, default=30.0, help="seconds the 72-GPU search may take")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="run the acceptance search in this process under cProfile and print its top N functions (slower)")
    args = ap.parse_args()
    cpus = _pin(args.cores)
    workers = len(cpus)
    print(f"pinned to CPUs {cpus}; {workers} worker processes; python {sys.version.split()[0]}")

    slo = {"ttft_s": 2.0, "tpot_s": 0.05}
    rep, wall, cpu = _search("deepseek-v3", "gb300", 72, "agentic", slo, 6, workers, args.profile)
    t = rep.timings
    print("\n72 x GB300, DeepSeek-V3, agentic, TTFT <= 2 s, TPOT <= 50 ms, aggregated + disaggregated:")
    print(f"  layouts: {rep.layouts_fitting} fit of {rep.layouts_considered}")
    print(f"  screen:   {rep.candidates_screened:,} candidates ({rep.candidates_evaluated:,} evaluated, rest dominated) "
          f"in {t.screen_s:.2f} s = {rep.candidates_screened / max(t.screen_s, 1e-9):,.0f} candidates/s; "
          f"{rep.candidates_meeting_slo:,} meet the SLO")
    print(f"  simulate: {rep.candidates_simulated} candidates, {rep.simulations_run} runs in {t.simulate_s:.2f} s "
          f"= {rep.simulations_run / max(t.simulate_s, 1e-9):.2f} simulations/s")
    if rep.recommended is not None:
        p = rep.recommended.predicted
        print(f"  result:   {rep.message}")
        print(f"            {p.output_tokens_per_s_per_gpu:,.0f} output tok/s/GPU, {p.tokens_per_s_per_user:,.1f} tok/s/user ({p.source}, "
              f"sim digest {(p.sim_digest or '-')[:8]})")
        stopped = [w for w in rep.recommended.why if STOPPED_EARLY in w]   # full-scale misses ended at a certain miss
        print(f"            {len(stopped)} rejected full-scale run(s) stopped early at a certain SLO miss")
    ok = wall < args.limit
    print(f"  total:    {wall:.1f} s wall, {cpu:.1f} s CPU on {workers} cores -> {'PASS' if ok else 'FAIL'} (limit {args.limit:g} s)")

    if not args.quick:
        print("\nscreen only (no simulation), candidates per second:")
        print(f"  {'case':42s} {'candidates':>11s} {'screen s':>9s} {'cand/s':>10s} {'total s':>8s}")
        for model, hw, gpus in (("deepseek-v3", "h200", 16), ("deepseek-v3", "h200", 64), ("deepseek-v3", "gb300", 72),
                                ("qwen3-235b-a22b", "b200", 32), ("deepseek-v4-flash", "b300", 16)):
            r, w, _ = _search(model, hw, gpus, "chat", slo, 0, workers)
            print(f"  {model + ' on ' + str(gpus) + ' x ' + hw:42s} {r.candidates_screened:>11,} {r.timings.screen_s:>9.2f} "
                  f"{r.candidates_screened / max(r.timings.screen_s, 1e-9):>10,.0f} {w:>8.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
