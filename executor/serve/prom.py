"""Prometheus metrics for /metrics, named as vLLM names them (and again under ``twinfer:``).

Both prefixes carry the same numbers: ``vllm:`` so dashboards and benchmark tooling written
for vLLM read twinfer unchanged, ``twinfer:`` as the project's own name. Latency histograms
are observed by the app per request; engine state (running/waiting, KV usage, prefix cache,
prompt tokens) is read from ``engine.stats()`` at scrape time, so it can never drift. Generation
tokens are the app's count of those it kept: the engine also counts tokens generated past a stop
string (the rest of a multi-token output, steps run before the abort took effect), which no client gets.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIXES = ("vllm", "twinfer")

# Bucket edges copied from vLLM v1 (vllm/v1/metrics/loggers.py) so histograms line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)
ITL_BUCKETS = TPOT_BUCKETS   # vLLM v1 uses the same edges for inter-token latency
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out, mag = [], 1
    while True:
        for m in (1, 2, 5):
            v = m * mag
            if v > max_value:
                return tuple(out)
            out.append(v)
        mag *= 10


class _EngineStatsCollector(Collector):
    """Gauges and counters read from ``engine.stats()`` on every scrape."""

    def __init__(self, stats: Callable[[], object], model_name: str, generated: Callable[[], int],
                 inflight: Callable[[], int] | None = None):
        self._stats, self._model, self._generated, self._inflight = stats, model_name, generated, inflight

    def collect(self) -> Iterable:
        s = self._stats()
        kv = s.kv_used_blocks / s.kv_total_blocks if s.kv_total_blocks else 0.0
        gauges = {
            "num_requests_running": ("Requests in the running batch.", s.num_running),
            "num_requests_waiting": ("Requests waiting to be scheduled.", s.num_waiting),
            "kv_cache_usage_perc": ("KV-cache usage; 1 means 100 percent.", kv),
        }
        counters = {
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
            "prefix_cache_hits": ("Prompt tokens found in the prefix cache.", s.prefix_cache_hits),
            "prompt_tokens": ("Prefill tokens processed.", s.prompt_tokens_total),
            "generation_tokens": ("Generation tokens returned (none past a stop string).", self._generated()),
        }
        for prefix in PREFIXES:
            for name, (doc, value) in gauges.items():
                g = GaugeMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
                g.add_metric([self._model], float(value))
                yield g
            for name, (doc, value) in counters.items():
                c = CounterMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
                c.add_metric([self._model], float(value))
                yield c
        # twinfer only: block counts that tell a leak from the prefix cache (cached blocks with no
        # user count as used in kv_cache_usage_perc, but an allocation may evict them)
        held = getattr(s, "kv_held_blocks", None)
        own = {"kv_blocks_total": ("KV blocks of the instance.", s.kv_total_blocks),
               "kv_blocks_used": ("KV blocks not free: held by requests or kept by the prefix cache.", s.kv_used_blocks)}
        if held is not None:
            own["kv_blocks_held"] = ("KV blocks held by queued or running requests (0 when idle: no leak).", held)
            own["kv_blocks_cached_unused"] = ("Prefix-cache KV blocks no request holds (evictable).", s.kv_used_blocks - held)
        if self._inflight is not None:
            own["http_requests_in_flight"] = ("Admitted HTTP requests not yet answered (max_queue bounds it).", self._inflight())
        for name, (doc, value) in own.items():
            g = GaugeMetricFamily(f"twinfer:{name}", doc, labels=["model_name"])
            g.add_metric([self._model], float(value))
            yield g


class ServeMetrics:
    """The app's per-request observations plus the engine collector, in one registry."""

    def __init__(self, stats: Callable[[], object], model_name: str, registry: CollectorRegistry | None = None,
                 inflight: Callable[[], int] | None = None, max_model_len: int = 1 << 20):
        # a registry per app: tests run several apps in one process
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        self.generated_tokens = 0   # kept by the app (tokens_generated)
        # engine request id -> [its scheduler Request, engine time of its finish or latest token], kept by
        # observe_step for the requests the app runs: one that the app ends itself (a stop string) never finishes
        # in the engine, so the app observes every request's phases when it ends, each once
        self._live: dict[str, list] = {}
        self.registry.register(_EngineStatsCollector(stats, model_name, lambda: self.generated_tokens, inflight))
        lbl = ["model_name"]
        self._ttft = [Histogram(f"{p}:time_to_first_token_seconds", "Time to first token.", lbl,
                                buckets=TTFT_BUCKETS, registry=self.registry) for p in PREFIXES]
        self._tpot = [Histogram(f"{p}:time_per_output_token_seconds", "Time between output tokens.", lbl,
                                buckets=TPOT_BUCKETS, registry=self.registry) for p in PREFIXES]
        self._e2e = [Histogram(f"{p}:e2e_request_latency_seconds", "End-to-end request latency.", lbl,
                               buckets=E2E_BUCKETS, registry=self.registry) for p in PREFIXES]
        self._success = [Counter(f"{p}:request_success", "Finished requests by finish reason.",
                                 lbl + ["finished_reason"], registry=self.registry) for p in PREFIXES]
        # vLLM v1's request and iteration metrics (vllm/v1/metrics/loggers.py)
        self._itl = [Histogram(f"{p}:inter_token_latency_seconds", "Time between consecutive output tokens.", lbl,
                               buckets=ITL_BUCKETS, registry=self.registry) for p in PREFIXES]
        token_buckets = build_1_2_5_buckets(max_model_len)
        self._prompt_tokens = [Histogram(f"{p}:request_prompt_tokens", "Prompt tokens of finished requests.", lbl,
                                         buckets=token_buckets, registry=self.registry) for p in PREFIXES]
        self._gen_tokens = [Histogram(f"{p}:request_generation_tokens", "Generated tokens of finished requests.", lbl,
                                      buckets=token_buckets, registry=self.registry) for p in PREFIXES]
        phases = {"queue": "Arrival in the engine to first scheduled.", "prefill": "First scheduled to first token.",
                  "decode": "First token to the last.", "inference": "First scheduled to the last token."}
        self._phase = {ph: [Histogram(f"{p}:request_{ph}_time_seconds", doc, lbl, buckets=E2E_BUCKETS,
                                      registry=self.registry) for p in PREFIXES] for ph, doc in phases.items()}
        self._iter_tokens = [Histogram(f"{p}:iteration_tokens_total", "Tokens processed per engine step.", lbl,
                                       buckets=ITERATION_TOKEN_BUCKETS, registry=self.registry) for p in PREFIXES]
        self._preempt = [Counter(f"{p}:num_preemptions", "Requests preempted (KV exhausted) and later resumed.", lbl,
                                 registry=self.registry) for p in PREFIXES]
        for fam in [self._itl, self._prompt_tokens, self._gen_tokens, self._iter_tokens, self._preempt,
                    *self._phase.values()]:
            for m in fam:   # exported at 0 before the first observation (a dashboard sees the family)
                m.labels(model_name)
        self._rejected = Counter("twinfer:request_rejected", "Requests answered with an error and never run, by reason "
                                 "(the error code: invalid_json, context_length_exceeded, rate_limit_exceeded, ...).",
                                 lbl + ["reason"], registry=self.registry)

    def observe_ttft(self, seconds: float) -> None:
        """Arrival to first token of one request."""
        for h in self._ttft:
            h.labels(self.model_name).observe(seconds)

    def observe_token_gap(self, seconds: float, num_tokens: int = 1) -> None:
        """Gap between two outputs of one request, spread over the tokens the later one carried."""
        per = seconds / max(num_tokens, 1)
        for h in self._tpot + self._itl:
            for _ in range(max(num_tokens, 1)):
                h.labels(self.model_name).observe(per)

    def tokens_generated(self, n: int) -> None:
        """``n`` tokens of a request were kept (sent, or part of the whole response)."""
        self.generated_tokens += n

    def request_started(self, request_id: str) -> None:
        """The app runs engine request ``request_id``: ``observe_step`` keeps its times until it ends."""
        self._live[request_id] = [None, None]

    def request_ended(self, request_id: str, finished: bool) -> None:
        """The app is done with ``request_id``; if it ``finished`` (not aborted), its queue/prefill/decode times.
        A stop string ends it at its latest token the engine reported (the one that completed the match, or
        with async overlap at most one step later): the app calls this before it aborts the engine request."""
        req, end_s = self._live.pop(request_id, None) or (None, None)
        if finished and req is not None and end_s is not None:
            self._observe_phases(req, end_s)

    def request_finished(self, e2e_seconds: float, finish_reason: str, prompt_tokens: int | None = None,
                         generation_tokens: int | None = None) -> None:
        """A request left the server: its latency, why it ended, and (if it ran) its token counts."""
        for h in self._e2e:
            h.labels(self.model_name).observe(e2e_seconds)
        for c in self._success:
            c.labels(self.model_name, finish_reason).inc()
        if prompt_tokens is not None:
            for h in self._prompt_tokens:
                h.labels(self.model_name).observe(prompt_tokens)
        if generation_tokens is not None:
            for h in self._gen_tokens:
                h.labels(self.model_name).observe(generation_tokens)

    def observe_step(self, start_s: float, plan, result, now: float | None = None) -> None:
        """An engine step (the executor's ``step_observer``; runs in the engine's thread): its tokens, the
        requests it preempted, and, for the phases of the requests the app runs, their times on the engine's
        clock (``now``: the step's end, when it gave them their tokens)."""
        m = self.model_name
        for h in self._iter_tokens:
            h.labels(m).observe(plan.num_batched_tokens)
        if plan.preempted:
            for c in self._preempt:
                c.labels(m).inc(len(plan.preempted))
        for r in list(plan.decodes) + [c.request for c in plan.prefills]:
            live = self._live.get(r.request_id)   # one lookup: the app may drop the entry meanwhile
            if live is not None and r.first_token_time is not None:
                live[:] = [r, now if r.finish_time is None else r.finish_time]

    def _observe_phases(self, r, finish_s: float) -> None:
        """Queue, prefill, decode and inference time of a request that finished at ``finish_s`` (engine clock)."""
        times = {"queue": r.first_scheduled_time - r.arrival_time,
                 "prefill": r.first_token_time - r.first_scheduled_time,
                 "decode": finish_s - r.first_token_time,
                 "inference": finish_s - r.first_scheduled_time}
        for ph, v in times.items():
            for h in self._phase[ph]:
                h.labels(self.model_name).observe(max(0.0, v))

    def request_rejected(self, reason: str | None) -> None:
        """A request was refused (4xx/5xx) before it ran, or the engine refused it."""
        self._rejected.labels(self.model_name, reason or "invalid_request_error").inc()
