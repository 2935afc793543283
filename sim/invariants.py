"""Invariants of a simulation run, checked as it goes and at its end (debug mode).

A run in debug mode (``simulate(..., debug=True)`` or ``TWINFER_DEBUG_INVARIANTS=1``) swaps the
metrics collector for a :class:`CheckingCollector`, which checks every event the instance loops
report, and calls :func:`check_end` once the event queue is empty:

* every request accounted for: arrived = finished + dropped = requests in the workload, each
  finished request has status FINISHED, each dropped one status DROPPED and a reason, nothing is
  left queued or running on any instance;
* token conservation: every output token a step produced (one per completed prompt, the
  accepted tokens of each decode, capped at what the request still wanted) lands in exactly one
  finished request, and each finished request got exactly ``output_len`` tokens; a request that
  was never preempted computed exactly ``prompt_len - cached`` prompt tokens (after a
  preemption it recomputes, and may hit blocks cached since, so there is no exact count);
* KV within capacity: every step reports ``0 <= used <= total`` blocks; at the end no block is
  held by a request (every block is free or an unused prefix-cache block), no block is counted
  twice, and no counted (unnamed) block is left reserved;
* monotone time: an instance's plans start no earlier than its previous plan ended, and for
  each request arrival <= first scheduled <= first token <= finish <= end of the run.

The collector keeps only per-instance state and a dict of the requests being prefilled, so the
checks cost O(live requests) memory: a million-request soak runs with them on.
"""

from __future__ import annotations

import math
import os
from typing import Iterable

import numpy as np

from scheduler.plan import StepPlan, StepResult
from scheduler.request import Request, RequestStatus
from scheduler.metrics import MetricsCollector

ENV_VAR = "TWINFER_DEBUG_INVARIANTS"
TIME_EPS_S = 1e-9  # float rounding of start + duration sums (the cluster's arrival tolerance)
_MAX_REPORTED = 20


class InvariantViolation(RuntimeError):
    """A simulation broke one of its invariants: a bug in the scheduler or the simulator, not bad input."""


def enabled(debug: bool | None = None) -> bool:
    """Whether to check invariants: ``debug`` if given, else the TWINFER_DEBUG_INVARIANTS env var."""
    if debug is not None:
        return bool(debug)
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("", "0", "false", "no", "off")


class CheckingCollector(MetricsCollector):
    """A MetricsCollector that also checks each step, finish and drop against the invariants."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.violations: list[str] = []
        self.num_violations = 0
        self.n_arrived = 0
        self.n_finished = 0
        self.n_dropped = 0
        self.tokens_produced = 0        # output tokens steps produced (as the scheduler keeps them)
        self.tokens_finished = 0        # output tokens of finished requests
        self.prefill_computed = 0       # prompt (and recompute) tokens computed in steps
        self._plan_end: dict[int, float] = {}
        self._prefilled: dict[int, int] = {}   # id(request) -> prompt tokens computed so far (live only)
        self._last_finish = -math.inf
        self.blocks_leaked: int | None = None  # set by check_end: KV blocks held once the run is over

    def fail(self, msg: str) -> None:
        """Record one violation (the first few are kept verbatim)."""
        self.num_violations += 1
        if len(self.violations) < _MAX_REPORTED:
            self.violations.append(msg)

    # ------------------------------------------------------------ events
    def on_arrival(self, req: Request) -> None:
        super().on_arrival(req)
        self.n_arrived += 1
        if not (math.isfinite(req.arrival_time) and req.arrival_time >= 0):
            self.fail(f"request {req.request_id}: arrival_time {req.arrival_time!r} is not a finite time >= 0")

    def on_step(self, instance_id: int, start_s: float, plan: StepPlan, result: StepResult,
                kv_used_blocks: int, kv_total_blocks: int) -> None:
        super().on_step(instance_id, start_s, plan, result, kv_used_blocks, kv_total_blocks)
        d = np.asarray(result.step_durations, float)
        k = d.size
        if k == 0:
            return
        if not (0 <= kv_used_blocks <= kv_total_blocks):
            self.fail(f"instance {instance_id} at t={start_s}: KV used {kv_used_blocks} blocks outside [0, {kv_total_blocks}]")
        if not np.all(np.isfinite(d)) or np.any(d < 0):
            self.fail(f"instance {instance_id} at t={start_s}: step durations not finite and >= 0: {d[:8].tolist()}")
        prev_end = self._plan_end.get(instance_id, -math.inf)
        if start_s < prev_end - TIME_EPS_S:
            self.fail(f"instance {instance_id}: plan starts at t={start_s}, before its previous plan ended ({prev_end})")
        self._plan_end[instance_id] = start_s + float(d.sum())
        if k > plan.num_steps:
            self.fail(f"instance {instance_id} at t={start_s}: {k} steps run of a {plan.num_steps}-step plan")

    def on_plan(self, instance_id: int, start_s: float, plan: StepPlan, result: StepResult) -> None:
        """Check a plan's tokens against its requests as the scheduler has them before it applies the plan (the
        loops call this right before ``Scheduler.complete``; ``on_step`` may come later, at the plan's read-back)."""
        d = np.asarray(result.step_durations, float)
        k = d.size
        if k == 0:
            return
        cs = plan.decode_context_sum
        if cs is not None and cs != int(np.asarray(plan.decode_context_lens).sum()):
            self.fail(f"instance {instance_id} at t={start_s}: plan's decode_context_sum {cs} is not the sum of its contexts")
        # tokens as Scheduler.complete will keep them (called right after this, on the same plan)
        n_dec = len(plan.decodes)
        if n_dec:
            tok = np.asarray(result.decode_tokens)
            if tok.shape != (k, n_dec):
                tok = np.ones((k, n_dec), np.int64)
            if plan.draft_len == 0 and tok.max() != 1 or tok.min() < 1 or tok.max() > 1 + plan.draft_len:
                self.fail(f"instance {instance_id} at t={start_s}: decode tokens per step outside [1, {1 + plan.draft_len}]")
            if plan.draft_len == 0:  # one token per decode per step; the plan's horizon leaves none short
                self.tokens_produced += k * n_dec
            else:  # accepted drafts past a request's last wanted token are discarded
                want = np.fromiter((r.remaining_output for r in plan.decodes), np.int64, n_dec)
                self.tokens_produced += int(np.minimum(tok[:k].sum(axis=0), want).sum())
        for c in plan.prefills:
            req = c.request
            if req.status is not RequestStatus.RUNNING:
                continue
            self.prefill_computed += c.num_new_tokens
            key = id(req)
            # a resumed chunk's replayed tokens recompute KV already counted (the sliding-window replay policy);
            # a prefix hit's (the first chunk's) come out of the request's cached tokens instead
            self._prefilled[key] = self._prefilled.get(key, 0) + c.num_new_tokens - (c.replayed if key in self._prefilled else 0)
            if c.is_last_chunk:
                self.tokens_produced += 1
                if c.context_len + c.num_new_tokens != req.num_tokens:
                    self.fail(f"request {req.request_id}: last chunk ends at token {c.context_len + c.num_new_tokens}, "
                              f"the request has {req.num_tokens}")

    def on_finish(self, req: Request) -> None:
        super().on_finish(req)
        self.n_finished += 1
        self.tokens_finished += req.num_output_tokens
        rid = req.request_id
        if req.status is not RequestStatus.FINISHED:
            self.fail(f"request {rid}: reported finished with status {req.status.value}")
        if req.num_output_tokens != req.output_len:
            self.fail(f"request {rid}: finished with {req.num_output_tokens} output tokens, wanted {req.output_len}")
        if req.block_ids or req._anon_blocks:
            self.fail(f"request {rid}: finished still holding {len(req.block_ids)} named + {req._anon_blocks} counted KV blocks")
        times = (("arrival", req.arrival_time), ("first scheduled", req.first_scheduled_time),
                 ("first token", req.first_token_time), ("finish", req.finish_time))
        if any(t is None for _, t in times):
            self.fail(f"request {rid}: finished without a timestamp: {dict(times)}")
        else:
            for (na, a), (nb, b) in zip(times, times[1:]):
                if b < a - TIME_EPS_S:
                    self.fail(f"request {rid}: {nb} at t={b} is before {na} at t={a}")
            if req.finish_time < self._last_finish:
                self.fail(f"request {rid}: finishes at t={req.finish_time}, before an earlier-reported finish at {self._last_finish}")
            self._last_finish = max(self._last_finish, req.finish_time)
        computed = self._prefilled.pop(id(req), 0)
        need = req.prompt_len - req.num_cached_tokens
        if req.num_preemptions == 0 and computed != need:
            self.fail(f"request {rid}: computed {computed} prompt tokens, expected prompt_len - cached = {need}")

    def on_drop(self, req: Request) -> None:
        super().on_drop(req)
        self.n_dropped += 1
        self._prefilled.pop(id(req), None)
        if req.status is not RequestStatus.DROPPED or not req.drop_reason:
            self.fail(f"request {req.request_id}: dropped with status {req.status.value} and reason {req.drop_reason!r}")
        if req.block_ids or req._anon_blocks:
            self.fail(f"request {req.request_id}: dropped still holding KV blocks")


def check_blocks(sched) -> list[str]:
    """KV bookkeeping of an idle scheduler: every block free or cached-unused, each exactly once."""
    out: list[str] = []
    b = sched.blocks
    iid = sched.instance_id
    free = b._free
    if len(set(free)) != len(free):
        out.append(f"instance {iid}: the free list names a block twice")
    cached = b.cache._by_block if b.cache is not None else {}
    both = set(free) & set(cached)
    if both:
        out.append(f"instance {iid}: blocks {sorted(both)[:8]} are both free and in the prefix cache")
    never = b.num_blocks - len(b.ref)   # blocks never handed out: free without being listed
    if len(free) + never + len(cached) != b.num_blocks:
        out.append(f"instance {iid}: {len(free) + never} free + {len(cached)} cached blocks != {b.num_blocks} blocks (leak)")
    if b.num_reserved:
        out.append(f"instance {iid}: {b.num_reserved} counted KV blocks still reserved with no request running (leak)")
    held = [i for i, r in enumerate(b.ref) if r != 0]
    if held:
        out.append(f"instance {iid}: {len(held)} KV blocks still referenced with no request running, e.g. {held[:8]}")
    if b.cache is not None and b.cache.num_unused != len(cached):
        out.append(f"instance {iid}: prefix cache counts {b.cache.num_unused} unused of {len(cached)} blocks, all should be")
    if b.num_held != 0:
        out.append(f"instance {iid}: {b.num_held} KV blocks held after the run")
    return out


def check_end(collector: CheckingCollector, schedulers: Iterable, num_requests: int, end_time: float) -> None:
    """End-of-run checks; raises InvariantViolation listing every violation seen during and at the end of the run."""
    c = collector
    c._flush_rows()  # the collector's per-plan totals are added up in bulk
    c.blocks_leaked = 0
    for s in schedulers:
        c.blocks_leaked += max(0, s.blocks.num_held)
        if s.has_work or s.num_running or s.num_waiting:
            c.fail(f"instance {s.instance_id}: {s.num_running} running and {s.num_waiting} waiting after the run")
        for msg in check_blocks(s):
            c.fail(msg)
        if s.outstanding_tokens != 0:
            c.fail(f"instance {s.instance_id}: outstanding_tokens is {s.outstanding_tokens} after the run, not 0")
    if not (c.n_arrived == num_requests == c.n_finished + c.n_dropped):
        c.fail(f"requests not accounted for: {num_requests} in the workload, {c.n_arrived} arrived, "
               f"{c.n_finished} finished + {c.n_dropped} dropped")
    if c.tokens_produced != c.tokens_finished:
        c.fail(f"token conservation: steps produced {c.tokens_produced} output tokens, finished requests hold {c.tokens_finished}")
    if c.prefill_computed != c._prefill_tokens:
        c.fail(f"prefill tokens: {c.prefill_computed} checked vs {c._prefill_tokens} in the metrics")
    if c._prefilled:
        c.fail(f"{len(c._prefilled)} requests were prefilled but never finished or dropped")
    if c._last_finish > end_time + TIME_EPS_S:
        c.fail(f"a request finished at t={c._last_finish}, after the run ended at {end_time}")
    for iid, t in c._plan_end.items():
        if t > end_time + TIME_EPS_S * max(1.0, abs(end_time)):
            c.fail(f"instance {iid}: its last plan ends at t={t}, after the run ended at {end_time}")
    if c.num_violations:
        more = f" (first {len(c.violations)} shown)" if c.num_violations > len(c.violations) else ""
        raise InvariantViolation(f"{c.num_violations} simulation invariant(s) violated{more}:\n" + "\n".join(c.violations))


def check_pools(schedulers: Iterable, num_requests: int, metrics) -> None:
    """End-of-run checks for runs whose requests move between pools (prefill -> decode): KV and accounting."""
    out: list[str] = []
    for s in schedulers:
        if s.has_work:
            out.append(f"instance {s.instance_id}: work left after the run")
        out.extend(check_blocks(s))
    n = metrics.requests_finished + metrics.requests_dropped
    if n != num_requests or metrics.requests_unfinished:
        out.append(f"requests not accounted for: {num_requests} in the workload, {metrics.requests_finished} finished + "
                   f"{metrics.requests_dropped} dropped, {metrics.requests_unfinished} unfinished")
    if out:
        raise InvariantViolation(f"{len(out)} simulation invariant(s) violated:\n" + "\n".join(out[:_MAX_REPORTED]))
