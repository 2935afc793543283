"""Simulator soak: a million requests through one run, in bounded memory, with the invariants checked.

    python benchmarks/soak_sim.py                      # 1,000,000 requests of the default scenario
    python benchmarks/soak_sim.py --requests 50000     # a shorter soak
    python benchmarks/soak_sim.py --scenario my.yaml --chunk 20000 --json

The workload is generated lazily, ``--chunk`` requests at a time, as the simulation reaches them:
the simulator only ever indexes the next undispatched request, so requests it has dispatched and
finished are freed (a finished request leaves ~60 bytes of per-request metrics behind). Peak
memory therefore grows with the requests *in flight*, not with the run's length; the script
prints RSS as the run progresses to show it, then the figures:

    requests, completed, dropped, lost (must be 0), invariant violations (must be 0),
    KV blocks leaked (must be 0), peak RSS, requests/s (wall and CPU)

Each chunk draws from its own seeded generator (seed, chunk index) and continues the arrival
process where the previous chunk ended, so a run is deterministic. Invariants (sim.invariants)
are checked as the run goes and at its end; a violation exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Sequence

import numpy as np


def rss_mb() -> float:
    """Current resident set size of this process, MiB (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class StreamedRequests(Sequence):
    """``n`` requests of a workload, generated ``chunk`` at a time as the simulator asks for them.

    Only forward access is supported (the simulator's Cluster reads ``reqs[next]`` with ``next``
    increasing); the previous chunk is dropped once the next one is built.
    """

    def __init__(self, spec, n: int, chunk: int, seed: int, block_size: int, on_chunk=None):
        from sim.workload import generate

        self._generate = generate
        self.spec, self.n, self.chunk, self.seed, self.block_size = spec, n, chunk, seed, block_size
        self.on_chunk = on_chunk          # called with the index of each new chunk's first request
        self._start = -1
        self._items: list = []
        self._next_t = 0.0                # arrival time the next chunk starts at
        self._mean_gap = 1.0 / spec.rate  # gap between the last arrival of a chunk and the next one

    def __len__(self) -> int:
        return self.n

    def _build(self, start: int) -> None:
        m = min(self.chunk, self.n - start)
        spec = self.spec.model_copy(update={"num_requests": m, "duration_s": None})
        reqs = self._generate(spec, np.random.default_rng([self.seed, start // self.chunk]), self.block_size)
        t0 = self._next_t
        for i, r in enumerate(reqs):
            r.request_id = f"r{start + i}"
            r.arrival_time += t0
        self._next_t = (reqs[-1].arrival_time if reqs else t0) + self._mean_gap
        self._start, self._items = start, reqs
        if self.on_chunk is not None:
            self.on_chunk(start)

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        if i < self._start:
            raise IndexError(f"request {i} was already handed out and freed (streamed workloads are forward-only)")
        while i >= self._start + len(self._items):
            self._build(self._start + len(self._items) if self._start >= 0 else 0)
        return self._items[i - self._start]


def soak(n: int, scenario_path: str | None, chunk: int, *, check: bool = True, quiet: bool = False) -> dict:
    """Run the soak in this process; the figures as a dict."""
    from sim import invariants
    from sim.runner import simulate
    from sim.scenario import builtin_scenario, load_scenario

    sc = load_scenario(scenario_path) if scenario_path else builtin_scenario()
    if sc.workload.kind not in ("poisson", "gamma", "constant"):
        raise SystemExit(f"soak_sim: the workload must be generated (poisson/gamma/constant), not {sc.workload.kind!r}")
    t0, c0 = time.perf_counter(), time.process_time()
    samples: list[tuple[int, float, float]] = []  # (requests handed out, seconds, RSS MiB)

    def progress(start: int) -> None:
        samples.append((start, time.perf_counter() - t0, rss_mb()))
        if not quiet and start and (start // chunk) % max(1, (n // chunk) // 10) == 0:
            print(f"  {start:>10,} requests dispatched  {time.perf_counter() - t0:8.1f} s  RSS {rss_mb():7.1f} MiB",
                  file=sys.stderr, flush=True)

    reqs = StreamedRequests(sc.workload, n, chunk, sc.seed, sc.scheduler.block_size, progress)
    violations = 0
    error = ""
    try:
        run = simulate(sc, requests=reqs, debug=check)
    except invariants.InvariantViolation as err:
        violations, error, run = str(err).count("\n"), str(err), None
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"requests": n, "chunk": chunk, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "requests_per_s": round(n / wall, 1), "cpu_requests_per_s": round(n / cpu, 1),
           "peak_rss_mb": round(peak_rss_mb(), 1), "invariants_checked": check, "invariant_violations": violations,
           "rss_mb_by_requests": [(s, round(r, 1)) for s, _, r in samples[:: max(1, len(samples) // 10)]]}
    if run is not None:
        m = run.result.metrics
        c = run.collector
        leaked = c.blocks_leaked if check else None
        out.update(completed=m.requests_finished, dropped=m.requests_dropped, unfinished=m.requests_unfinished,
                   lost=n - m.requests_finished - m.requests_dropped, blocks_leaked=leaked,
                   simulated_s=round(run.result.simulated_s, 1), output_tokens=m.output_tokens,
                   preemptions=m.preemptions, digest=run.result.digest)
        if check:
            out["tokens_conserved"] = c.tokens_produced == c.tokens_finished
    else:
        out.update(error=error)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=10_000, help="requests generated at a time")
    ap.add_argument("--scenario", default=None, help="scenario file (default: the built-in default)")
    ap.add_argument("--no-check", action="store_true", help="skip the invariant checks (speed comparison)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = ap.parse_args()
    r = soak(args.requests, args.scenario, args.chunk, check=not args.no_check, quiet=args.json)
    if args.json:
        print(json.dumps(r))
    else:
        rows = [("requests", f"{r['requests']:,}"), ("completed", f"{r.get('completed', '-'):,}" if "completed" in r else "-"),
                ("dropped (refused, with a reason)", f"{r.get('dropped', '-')}"), ("lost", f"{r.get('lost', '-')}"),
                ("invariant violations", f"{r['invariant_violations']}"), ("KV blocks leaked", f"{r.get('blocks_leaked', '-')}"),
                ("simulated time", f"{r.get('simulated_s', 0):,.0f} s"), ("wall time", f"{r['wall_s']:,.1f} s"),
                ("requests/s (wall)", f"{r['requests_per_s']:,.0f}"), ("requests/s (CPU)", f"{r['cpu_requests_per_s']:,.0f}"),
                ("peak RSS", f"{r['peak_rss_mb']:,.0f} MiB")]
        for k, v in rows:
            print(f"{k:<34} {v:>16}")
        print("RSS by requests dispatched: " + ", ".join(f"{s:,}: {m:.0f} MiB" for s, m in r["rss_mb_by_requests"]))
        if r.get("error"):
            print(r["error"], file=sys.stderr)
    bad = r["invariant_violations"] or r.get("lost", 1) or r.get("blocks_leaked", 1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
