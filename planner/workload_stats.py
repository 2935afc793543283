"""What the analytic screen needs to know about a workload: lengths, reuse, and their tails.

Measured on a sample of the workload itself (``sim.workload.generate`` with a fixed seed), so
agentic sessions (prompts that grow turn by turn and reuse the conversation) and traces are
handled like the simulator sees them. ``hit_fraction`` assumes an unbounded prefix cache and a
router that keeps a session on one instance: the best case, which the simulation then checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.workload import WorkloadSpec, generate, offered_rate, trace_arrivals

SAMPLE_REQUESTS = 4000
BLOCK = 64
OUTPUT_PERCENTILES = (50, 90, 99)   # the SLO's percentiles (planner/slo.py PERCENTILES)
# The fewest requests a simulation measures a percentile over: a slice of PlanRequest.sim_requests >= 100 requests,
# 90% of them in its steady window. Its output lengths are a sample of that size, so its p-th percentile can fall
# below the workload's; ``output_floor_at`` allows three standard errors of the sample quantile for that.
FEWEST_MEASURED = 90


@dataclass(frozen=True)
class WorkloadStats:
    """Means and tails of one workload's requests."""

    mean_prompt: float          # tokens, shared prefix included
    mean_output: float
    mean_new: float             # prompt tokens not served by an ideal prefix cache
    p90_new: float
    hit_fraction: float         # cached prompt tokens / prompt tokens (ideal cache)
    rate: float | None          # requests/s the spec offers (a trace's: its requests over their arrival span; None: at once)
    mean_context: float         # mean KV tokens of a request while it decodes (prompt + output / 2)
    # output tokens at the SLO percentiles (p50, p90, p99) of the sample; None where not measured (then the mean)
    output_percentiles: tuple[float, float, float] | None = None
    # the same, each at its lower bound for a sample of FEWEST_MEASURED requests (``output_floor_at``)
    output_floor_percentiles: tuple[float, float, float] | None = None
    # the sampled requests' prompt + output tokens, each (None where not measured)
    totals: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    # a trace's (requests, seconds from its first arrival to its last) as replayed; None for a generated workload
    arrivals: tuple[int, float] | None = None

    def over_context(self, limit: int) -> tuple[int, int, int]:
        """(sampled requests whose prompt + output exceed ``limit`` tokens, requests sampled, the longest)."""
        if not self.totals:
            return 0, 0, 0
        return sum(t > limit for t in self.totals), len(self.totals), max(self.totals)

    def describe(self) -> str:
        tail = "" if self.output_percentiles is None else f" (p90 {self.output_at(90):,.0f})"
        head = ""
        if self.arrivals is not None:   # a trace's own rate, which the planner's figures scale (offered rate below)
            n, span = self.arrivals
            head = (f"{n:,} requests arriving over {span:,.4g} s as recorded ({self.rate:,.3g} req/s); " if self.rate else
                    f"{n:,} requests arriving at one instant; ")
        return (head + f"mean prompt {self.mean_prompt:,.0f} tokens ({self.hit_fraction:.0%} reusable from the prefix cache, "
                f"{self.mean_new:,.0f} new, p90 {self.p90_new:,.0f}), mean output {self.mean_output:,.0f}{tail}")

    def output_at(self, percentile: int) -> float:
        """Output tokens at ``percentile`` (50, 90 or 99) of the sampled requests; the mean where not measured."""
        if self.output_percentiles is None:
            return self.mean_output
        return self.output_percentiles[OUTPUT_PERCENTILES.index(percentile)]

    def output_floor_at(self, percentile: int) -> float:
        """Output tokens the ``percentile`` of a simulation's requests is at least (three standard errors of the
        quantile of FEWEST_MEASURED requests below ``percentile``: ``lower_quantile``); 0 where not measured."""
        if self.output_floor_percentiles is None:
            return 0.0
        return self.output_floor_percentiles[OUTPUT_PERCENTILES.index(percentile)]


def lower_quantile(percentile: float, n: int = FEWEST_MEASURED, z: float = 3.0) -> float:
    """A lower percentile of the workload, ``p - z * sqrt(p (1 - p) / n)`` (at least 0), below which the
    ``percentile`` of a sample of ``n`` of its requests falls only ``z`` standard errors out (the share of the sample
    below a quantile is binomial; z = 3: one run in ~740)."""
    p = percentile / 100.0
    return max(0.0, 100.0 * (p - z * (p * (1.0 - p) / n) ** 0.5))


def workload_stats(spec: WorkloadSpec, seed: int = 0) -> WorkloadStats:
    """Sample the workload and measure it (deterministic for a given seed)."""
    if spec.kind != "trace":
        spec = spec.model_copy(update={"num_requests": SAMPLE_REQUESTS, "duration_s": None})
    reqs = generate(spec, np.random.default_rng(seed), BLOCK)
    rate, arrivals = offered_rate(spec), (trace_arrivals(spec) if spec.kind == "trace" else None)
    if not reqs:
        return WorkloadStats(0.0, 0.0, 0.0, 0.0, 0.0, rate, 0.0, arrivals=arrivals)
    reqs = reqs[:SAMPLE_REQUESTS]
    prompt = np.array([r.prompt_len for r in reqs], float)
    out = np.array([r.output_len for r in reqs], float)
    seen: set[int] = set()
    new = np.empty(len(reqs))
    for i, r in enumerate(reqs):  # arrival order: a block is reusable once an earlier request computed it
        k = 0
        for h in r.block_hashes:
            if h not in seen:
                break
            k += 1
        hit = min(k * BLOCK, r.prompt_len - 1)
        new[i] = r.prompt_len - hit
        seen.update(r.block_hashes)
    return WorkloadStats(
        mean_prompt=float(prompt.mean()), mean_output=float(out.mean()), mean_new=float(new.mean()),
        p90_new=float(np.percentile(new, 90)), hit_fraction=float(1.0 - new.sum() / prompt.sum()),
        rate=rate, mean_context=float(prompt.mean() + out.mean() / 2.0),
        output_percentiles=tuple(float(v) for v in np.percentile(out, OUTPUT_PERCENTILES)),
        output_floor_percentiles=tuple(float(v) for v in np.percentile(out, [lower_quantile(p) for p in OUTPUT_PERCENTILES])),
        totals=tuple(int(r.prompt_len + r.output_len) for r in reqs), arrivals=arrivals,
    )
