"""Serving metrics of a run: collected per executed plan and per finished request.

The collector keeps running sums per plan and per-request scalars in flat arrays, and does
all per-request arithmetic with numpy in ``summarize``. Definitions:

* TTFT = first_token_time - arrival; E2E = finish - arrival; TPOT (per request) =
  (finish - first_token) / (output tokens - 1), for requests with >= 2 output tokens. A
  disaggregated request's first token is the client's: when it joins the decode batch, after
  its KV transfer (``Scheduler._admit_prefilled``).
* ITL is a weighted histogram of the gaps a reader of each request's stream sees: every output
  token after a request's first is one sample, the time since the request's previous token.
  A decode whose previous token came at the end of its instance's previous plan (the common
  case) sees the step's duration, so a step adds weight = decodes that produced a token.
  With MTP a step that yields n tokens for a request counts n gaps of step / n (the tokens
  arrive together, but per-token latency is what a reader of the stream averages to). A
  request whose previous token is older than its plan's start waited, and its first gap there
  spans the wait: behind prompt-only plans (``mixed_batches`` off), preempted until its
  recompute samples its next token, its KV moving from a prefill instance (disaggregated).
  So a finished request's gaps add up to finish - first token, as a benchmark client's do.
  Percentiles come from log-spaced bins 0.5% wide (error < 0.25%); the mean is exact.
* Throughput counts tokens of finished requests over ``duration_s`` (default: first
  arrival to last finish or step end). Goodput counts finished requests meeting every SLO
  bound; its fraction is over all arrived requests (drops and unfinished ones miss).
* Two windows, both in ``SimMetrics`` under their names (``whole_run`` and ``steady``, same
  schema, :class:`WindowMetrics`): the whole run is first arrival to last finish (the
  top-level throughput fields are this window); the steady window is the middle 80% of the
  requests, leaving out the fill of an empty system and the drain after the last arrivals: its
  latencies are those of the requests arriving between the 10th and 90th percentile arrival
  times (from ``steady_after_s`` instead when the caller knows the ramp-up), its throughput
  the tokens delivered between the 10th and 90th percentile finish times (each request's
  tokens after the first spread evenly up to its finish). Timed by finishes, it is the served
  rate both below saturation (the offered rate) and past it (the capacity, with the queue
  full): it cannot fall as the offered rate rises because of the drain.
* KV utilisation: mean is weighted by plan duration over all instances' plans (the
  utilisation while busy); max is the largest any instance reported; the timeline is the
  cluster's used / total blocks after each plan, downsampled to at most ~2000 points
  keeping each bucket's peak.
"""

from __future__ import annotations

import math
from array import array
from itertools import chain
from typing import Literal, NamedTuple

import numpy as np
import numpy.ma  # noqa: F401  (np.percentile/np.unique load it lazily: at import time here, not inside the first summarize())
from pydantic import BaseModel, ConfigDict, Field

from scheduler.plan import StepPlan, StepResult
from scheduler.request import Request, RequestStatus, drop_kind

_F64 = np.dtype(np.float64)
_WAITING = RequestStatus.WAITING


def _fold(x0: float, xs: np.ndarray) -> float:
    """``x0 + xs[0] + xs[1] + ...`` left to right (what ``x0 += x`` in a loop gives)."""
    return float(np.add.accumulate(np.concatenate(([x0], xs)))[-1])


class SLO(BaseModel):
    """Latency targets a request must meet to count toward goodput (seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ttft_s: float = Field(gt=0)
    tpot_s: float = Field(gt=0)
    e2e_s: float | None = Field(None, gt=0)


class Stat(BaseModel):
    """Mean and percentiles of one latency (seconds); None when there are no samples."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, x: np.ndarray) -> "Stat":
        """Exact stats of samples (numpy's linear-interpolation percentiles)."""
        if x.size == 0:
            return cls()
        p50, p90, p99 = np.percentile(x, [50, 90, 99]).tolist()
        return cls(count=int(x.size), mean=float(np.mean(x)), p50=p50, p90=p90, p99=p99)


class StepRecord(NamedTuple):
    """One executed plan, for the Perfetto timeline."""

    instance_id: int
    start_s: float
    duration_s: float
    num_steps: int
    num_prefills: int
    prefill_tokens: int
    num_decodes: int
    decode_tokens: int
    draft_len: int
    host_overhead_s: float
    kv_used_blocks: int
    kv_total_blocks: int


class LogHistogram:
    """Weighted histogram on log-spaced bins from 1 us to 1000 s (out-of-range values clip)."""

    LO, HI, RATIO = 1e-6, 1e3, 1.005

    def __init__(self) -> None:
        self._log_ratio = math.log(self.RATIO)
        self.nbins = int(math.ceil(math.log(self.HI / self.LO) / self._log_ratio))
        self.weights = np.zeros(self.nbins)
        self.total_w = 0.0
        self.sum_wx = 0.0

    def add(self, values: np.ndarray, weights: np.ndarray) -> None:
        """Add ``values`` with ``weights`` (same shape)."""
        v = np.asarray(values, float).ravel()
        w = np.asarray(weights, float).ravel()
        idx = np.floor(np.log(np.maximum(v, self.LO) / self.LO) / self._log_ratio).astype(np.int64)
        np.add.at(self.weights, np.clip(idx, 0, self.nbins - 1), w)
        self.total_w += float(w.sum())
        self.sum_wx += float(np.dot(v, w))

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile as numpy's linear-interpolation percentile takes it of the samples (the weights as counts),
        each sample at its bin's geometric centre: rank ``q * (W - 1)`` between its two neighbouring order statistics.
        So it agrees with the exact percentiles TTFT and TPOT get (``Stat.of``) to within a bin (0.25%) at any sample
        count; the smallest bin where the CDF reaches ``q`` did not where the rank falls in a gap (a prompt step among
        decode steps: 50 inter-token gaps, 1.5% of them 10x the rest, read a p99 of 227 ms against numpy's 126)."""
        if self.total_w <= 0:
            return None
        cum = np.cumsum(self.weights)
        r = max(0.0, float(q) * (cum[-1] - 1.0))
        j = math.floor(r)
        lo = min(int(np.searchsorted(cum, j, side="right")), self.nbins - 1)   # the bin of the j-th sample (0-based)
        hi = min(int(np.searchsorted(cum, j + 1, side="right")), self.nbins - 1) if r > j else lo
        c_lo, c_hi = (self.LO * self.RATIO ** (i + 0.5) for i in (lo, hi))
        return float(c_lo + (r - j) * (c_hi - c_lo))

    def stat(self) -> Stat:
        if self.total_w <= 0:
            return Stat()
        return Stat(count=int(round(self.total_w)), mean=self.sum_wx / self.total_w,
                    p50=self.quantile(0.5), p90=self.quantile(0.9), p99=self.quantile(0.99))


class _Timeline:
    """(time, value) samples kept to at most ``cap`` points: when full, adjacent pairs
    merge (first time, larger value) and later buckets hold twice as many samples."""

    def __init__(self, cap: int) -> None:
        self.cap = max(2, cap - cap % 2)
        self.stride = 1
        self.points: list[tuple[float, float]] = []
        self._n = 0
        self._t0 = 0.0
        self._v = 0.0

    def add(self, t: float, v: float) -> None:
        n = self._n
        if n == 0:
            self._t0, self._v = t, v
        elif v > self._v:
            self._v = v
        self._n = n = n + 1
        if n == self.stride:
            self._emit()

    def _emit(self) -> None:
        """Close the current bucket (``stride`` samples): append its point, halve the points when full."""
        self.points.append((self._t0, self._v))
        self._n = 0
        if len(self.points) >= self.cap:
            p = self.points
            self.points = [(p[i][0], max(p[i][1], p[i + 1][1])) for i in range(0, len(p), 2)]
            self.stride *= 2

    def get(self) -> list[tuple[float, float]]:
        return self.points + ([(self._t0, self._v)] if self._n else [])


# arrival- and finish-time percentiles bounding the steady window (fill before, drain after)
STEADY_ARRIVAL_PERCENTILES = (10.0, 90.0)


class WindowMetrics(BaseModel):
    """One time window of a run: latencies of the requests arriving in it, throughput delivered in it."""

    window: Literal["whole_run", "steady"]
    definition: str
    start_s: float                    # throughput: tokens delivered in [start_s, end_s)
    end_s: float
    duration_s: float
    arrivals_from_s: float            # latencies: requests arriving in [arrivals_from_s, arrivals_to_s)
    arrivals_to_s: float
    requests_arrived: int             # arriving in the window (finished or dropped)
    requests_finished: int
    finished_fraction: float | None
    ttft_s: Stat
    tpot_s: Stat
    e2e_s: Stat
    output_tokens: float              # delivered inside the window
    output_throughput: float
    output_throughput_per_gpu: float
    input_throughput: float           # prompt tokens of requests whose first token is inside the window
    total_throughput_per_gpu: float
    request_throughput: float         # requests finishing inside the window, per second
    per_user_output_tps_mean: float | None
    requests_meeting_slo: int | None
    goodput: float | None             # requests finishing in the window and meeting the SLO, per second
                                      # (request_throughput's requests; the whole run: all of them)
    goodput_fraction: float | None    # of the requests arriving in the window, the share meeting the SLO


def _delivered_tokens(first: np.ndarray, finish: np.ndarray, out: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Output tokens each request delivered inside [lo, hi): the first at ``first``, the rest spread evenly over (first, finish]."""
    first_in = ((first >= lo) & (first < hi)).astype(float)
    span = finish - first
    overlap = np.clip(np.minimum(finish, hi) - np.maximum(first, lo), 0.0, None)
    rest = np.where(span > 0, overlap / np.where(span > 0, span, 1.0), first_in)
    return first_in * (out >= 1) + np.maximum(out - 1, 0) * rest


def _meets(ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray, multi: np.ndarray, slo: SLO) -> np.ndarray:
    """Which requests meet ``slo``: their TTFT, TPOT (``tpot`` of the ``multi``-token ones; a single-token request has
    none to miss) and, where the SLO has one, end-to-end latency."""
    ok = np.isfinite(ttft) & (ttft <= slo.ttft_s)
    tpot_all = np.zeros(ttft.size)
    tpot_all[multi] = tpot
    ok &= tpot_all <= slo.tpot_s
    if slo.e2e_s is not None:
        ok &= np.isfinite(e2e) & (e2e <= slo.e2e_s)
    return ok


def _meeting_finished(a: np.ndarray, f: np.ndarray, e: np.ndarray, o: np.ndarray, slo: SLO) -> int:
    """How many of these finished requests (arrival, first token, finish, output tokens) meet ``slo``."""
    multi = o > 1
    return int(_meets(f - a, (e[multi] - f[multi]) / (o[multi] - 1), e - a, multi, slo).sum())


def _latencies(a: np.ndarray, f: np.ndarray, e: np.ndarray, o: np.ndarray, slo: SLO | None,
               p50: bool = False) -> tuple[dict, int | None]:
    """Latency stats of finished requests (arrival, first token, finish, output tokens) and how many meet ``slo``
    (None without one); ``p50`` adds the median per-user output rate."""
    ttft, e2e = f - a, e - a
    multi = o > 1
    tpot = (e[multi] - f[multi]) / (o[multi] - 1)
    ok_ttft, ok_tpot = np.isfinite(ttft), np.isfinite(tpot)
    user = 1.0 / tpot[ok_tpot & (tpot > 0)]
    meeting = None if slo is None else int(_meets(ttft, tpot, e2e, multi, slo).sum())
    latency = dict(ttft_s=Stat.of(ttft[ok_ttft]), tpot_s=Stat.of(tpot[ok_tpot]), e2e_s=Stat.of(e2e[np.isfinite(e2e)]),
                   per_user_output_tps_mean=float(user.mean()) if user.size else None)
    if p50:
        latency["per_user_output_tps_p50"] = float(np.percentile(user, 50)) if user.size else None
    return latency, meeting


def window_metrics(name: str, arrivals: tuple[float, float], lo: float, hi: float, num_gpus: int, slo: SLO | None,
                   arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, prompt: np.ndarray, out: np.ndarray,
                   dropped_arrival: np.ndarray, definition: str,
                   latencies: tuple[dict, int | None] | None = None) -> WindowMetrics:
    """The figures of a window from the finished requests' arrays and the dropped ones' arrival times: latencies
    of the requests arriving in ``arrivals`` = [from, to), throughput delivered in [lo, hi). ``latencies``: the
    window's ``_latencies`` where the caller has them (the whole run's are the top-level ones)."""
    dur = max(hi - lo, 0.0)
    per_s = (lambda x: x / dur) if dur > 0 else (lambda x: 0.0)
    a_lo, a_hi = arrivals
    whole = name == "whole_run"  # the whole run holds every request, the last arrival included
    if whole:
        n_fin, n_drop = int(arrival.size), int(dropped_arrival.size)
    else:
        sel = (arrival >= a_lo) & (arrival < a_hi)
        n_fin, n_drop = int(sel.sum()), int(((dropped_arrival >= a_lo) & (dropped_arrival < a_hi)).sum())
    if latencies is None:
        # the whole run reads the arrays themselves (no copies: this runs once per simulation over every request)
        cols = (arrival, first, finish, out) if whole else (arrival[sel], first[sel], finish[sel], out[sel])
        latencies = _latencies(*cols, slo)
        del cols   # before the throughput's temporaries (peak memory)
    latency, meeting = latencies
    arrived = n_fin + n_drop
    if meeting is None or whole:
        goodput = per_s(meeting) if meeting is not None else None
    else:   # the requests finishing in [lo, hi) that meet the SLO: request_throughput's population, so never above it
        done = (finish >= lo) & (finish < hi)
        goodput = per_s(_meeting_finished(arrival[done], first[done], finish[done], out[done], slo))
    fraction = (meeting / arrived if arrived else None) if meeting is not None else None
    if whole:  # every token, prompt and finish is the run's: no masks
        tokens, in_tok = float(out.sum()), float(prompt.sum())
        n_fin_in = int(np.isfinite(finish).sum())
    else:
        fin_ok = np.isfinite(first) & np.isfinite(finish)
        tokens = float(_delivered_tokens(first[fin_ok], finish[fin_ok], out[fin_ok], lo, hi).sum())
        in_tok = float(prompt[fin_ok & (first >= lo) & (first < hi)].sum())
        n_fin_in = int(((finish >= lo) & (finish < hi)).sum())
    g = 1.0 / max(num_gpus, 1)
    return WindowMetrics(
        window=name, definition=definition, start_s=float(lo), end_s=float(hi), duration_s=float(dur),
        arrivals_from_s=float(a_lo), arrivals_to_s=float(a_hi),
        requests_arrived=arrived, requests_finished=n_fin, finished_fraction=(n_fin / arrived) if arrived else None,
        output_tokens=tokens, output_throughput=per_s(tokens), output_throughput_per_gpu=per_s(tokens) * g,
        input_throughput=per_s(in_tok), total_throughput_per_gpu=per_s(tokens + in_tok) * g,
        request_throughput=per_s(n_fin_in),
        requests_meeting_slo=meeting, goodput=goodput, goodput_fraction=fraction, **latency,
    )


def steady_bounds(arrival: np.ndarray, finish: np.ndarray, steady_after_s: float | None = None):
    """((arrivals from, to), (throughput from, to)) of the steady window, or None if either is empty: the 10th to
    90th percentile arrival and finish times; ``steady_after_s`` replaces both starts where it is later."""
    finish = finish[np.isfinite(finish)]
    if arrival.size < 2 or finish.size < 2:
        return None
    a_lo, a_hi = np.percentile(arrival, STEADY_ARRIVAL_PERCENTILES).tolist()
    lo, hi = np.percentile(finish, STEADY_ARRIVAL_PERCENTILES).tolist()
    if steady_after_s is not None:
        a_lo, lo = float(steady_after_s), max(lo, float(steady_after_s))
    return ((a_lo, a_hi), (lo, hi)) if a_hi > a_lo and hi > lo else None


class SimMetrics(BaseModel):
    """Summary of a run (times in seconds, throughputs in tokens/s or requests/s).

    The top-level throughputs and latencies are the whole run's (``whole_run`` repeats them
    under its name); ``steady`` is the steady window (see the module docstring).
    """

    duration_s: float
    num_gpus: int
    requests_arrived: int
    requests_finished: int
    requests_dropped: int
    dropped_by_reason: dict[str, int]
    requests_unfinished: int
    preemptions: int  # preemption events in executed plans
    requests_preempted: int  # finished requests preempted at least once
    ttft_s: Stat
    tpot_s: Stat
    itl_s: Stat
    e2e_s: Stat
    input_tokens: int
    output_tokens: int
    input_throughput: float
    output_throughput: float
    total_throughput: float
    input_throughput_per_gpu: float
    output_throughput_per_gpu: float
    total_throughput_per_gpu: float
    per_user_output_tps_mean: float | None
    per_user_output_tps_p50: float | None
    request_throughput: float
    slo: SLO | None
    requests_meeting_slo: int | None
    goodput: float | None
    goodput_fraction: float | None
    prefix_cache_hit_rate: float | None
    computed_prefill_tokens: int
    decode_tokens: int
    kv_util_mean: float | None
    kv_util_max: float | None
    kv_timeline: list[tuple[float, float]]
    num_plans: int
    num_steps: int
    mean_batch_requests: float | None
    mean_batch_tokens: float | None
    busy_s: float
    step_records_dropped: int
    whole_run: WindowMetrics | None = None
    steady: WindowMetrics | None = None


class _Stream:
    """One instance's decode stream as the collector follows it, plan by plan, to date each request's previous token
    without a per-request update per step: a decode plan holds the whole decode batch (``Scheduler._make_plan``), so a
    request in it made its previous token at the end of the instance's latest decode plan, unless it joined the batch
    since (a prompt completed, a recompute resumed it, its KV came from a prefill instance). Mixed batches (the common
    case) leave no plan without decodes while the batch holds any, so only ``dec_end`` moves and nothing waits."""

    __slots__ = ("dec_end", "stale", "joined", "handed")

    def __init__(self) -> None:
        self.dec_end: float | None = None   # when the instance's latest decode plan ended (its decodes' latest tokens)
        self.stale = False                  # a plan without decodes ran since then (the batch, if any, waited)
        # since then (that plan included), plans that completed prompts: (their end, their prefill chunks); a chunk's
        # request that is in a later decode plan joined the batch at that end
        self.joined: list[tuple[float, list]] = []
        # requests handed over by a prefill instance, not yet in a decode plan here (their first token's time is set
        # as they join the batch: ``Request.first_token_time``)
        self.handed: dict[Request, None] = {}   # (a dict, not a set: insertion order keeps runs reproducible)

    def last_token(self, req: Request, start_s: float) -> float:
        """When ``req``, of this instance's decode batch and preempted by the plan starting at ``start_s``, made its
        latest token (``start_s``, a lower bound, where no decode plan of the instance was seen)."""
        if req in self.handed:
            del self.handed[req]
            return req.first_token_time
        for end, chunks in reversed(self.joined):
            for c in chunks:
                if c.request is req and c.is_last_chunk:
                    return end
        return self.dec_end if self.dec_end is not None else start_s

    def late(self, start_s: float, decodes: list[Request]) -> tuple[float, dict[int, float]] | None:
        """For a decode plan starting at ``start_s`` (after a plan without decodes, or with requests handed over), how
        long before ``start_s`` its decodes' previous tokens came: ``(wait, newcomers)``, ``wait`` that of the batch's
        decodes (its latest decode plan's end), ``newcomers`` {index in ``decodes``: its own} for requests that joined
        the batch since; None when every one came at ``start_s``. Forgets the newcomers: from this plan on they are
        the batch's."""
        joined, self.joined = self.joined, []
        self.stale = False
        new: dict[int, float] = {}   # index in decodes -> how long before start_s it joined the batch, since its last plan
        if joined:
            index = decodes.index
            # the batch appends newcomers (a removal moves its last request into the hole): look at its tail first
            tail = max(0, len(decodes) - sum(len(chunks) for _, chunks in joined))
            for end, chunks in joined:   # (oldest first: a request preempted and resumed again keeps its latest)
                g = start_s - end
                for c in chunks:
                    if c.is_last_chunk:
                        r = c.request
                        try:
                            new[index(r, tail)] = g
                        except ValueError:
                            try:
                                new[index(r, 0, tail)] = g
                            except ValueError:
                                pass   # finished with its first token, or preempted since
        handed = self.handed
        if handed:
            # those admitted to the batch: this plan's decodes (the lead loop may have admitted some to the next plan)
            admitted = [r for r in handed if r.status is not _WAITING]
            if admitted:
                members = set(decodes)
                for r in admitted:
                    if r in members:
                        del handed[r]
                        new[decodes.index(r)] = start_s - r.first_token_time
        wait = start_s - self.dec_end if self.dec_end is not None and len(decodes) > len(new) else 0.0
        if not wait and not any(new.values()):
            return None
        return wait, new


class MetricsCollector:
    """Accumulates a run's metrics; the instance loops call ``on_step``/``on_finish``/``on_drop``."""

    ITL_BUFFER = 1 << 16  # ITL samples kept before they are added to the histogram in one go
    ROW_BUFFER = 1 << 14  # plans queued before their figures are added up (_flush_rows)

    def __init__(self, *, record_steps: bool = False, max_step_records: int = 200_000,
                 kv_timeline_points: int = 2000) -> None:
        self.record_steps = record_steps
        self.max_step_records = max_step_records
        self.step_records: list[StepRecord] = []
        self.step_records_dropped = 0
        # per finished request, in finish order
        self._arrival, self._first, self._finish = array("d"), array("d"), array("d")
        self._prompt, self._out, self._cached, self._preempt = array("q"), array("q"), array("q"), array("q")
        self._dropped: dict[str, int] = {}
        self._drop_arrival = array("d")
        self._arrived = 0
        self._first_arrival = math.inf
        self._last_time = 0.0
        # per plan running sums
        self._num_plans = 0
        self._num_steps = 0
        # per-plan figures (start, duration, steps, prefills, prefill tokens, decodes, draft_len,
        # preemptions, decode tokens, KV used, KV total, instance) queued here and added up in bulk
        # (_flush_rows) in the same order, so every sum is the one a plan-by-plan update gives
        self._rows: list[tuple] = []
        self._batch_requests = 0
        self._batch_tokens = 0
        self._prefill_tokens = 0
        self._decode_tokens = 0
        self._preemptions = 0
        self._busy_s = 0.0
        self._itl = LogHistogram()
        # ITL samples (step duration, weight) buffered here and histogrammed in bulk (see itl)
        self._itl_v = np.empty(self.ITL_BUFFER)
        self._itl_w = np.empty(self.ITL_BUFFER)
        self._itl_n = 0
        # preempted requests that had made tokens -> the time of their latest one (their recompute's token ends the gap)
        self._stalled: dict[Request, float] = {}
        # per instance: when its decode batch last made tokens, and who joined the batch since (see _Stream)
        self._streams: dict[int, _Stream] = {}
        # KV
        self._kv_last: dict[int, tuple[int, int]] = {}
        self._kv_used = 0
        self._kv_total = 0
        self._kv_wsum = 0.0
        self._kv_wdur = 0.0
        self._kv_max: float | None = None
        self._timeline = _Timeline(kv_timeline_points)

    # ------------------------------------------------------------ events
    def on_arrival(self, req: Request) -> None:
        """Optional: count an arrival (else arrivals = finished + dropped)."""
        self._arrived += 1
        self._first_arrival = min(self._first_arrival, req.arrival_time)

    @property
    def itl(self) -> LogHistogram:
        """The inter-token latency histogram (buffered samples added first)."""
        self._flush_itl()
        return self._itl

    def _flush_itl(self) -> None:
        n = self._itl_n
        if n:
            self._itl_n = 0
            self._itl.add(self._itl_v[:n], self._itl_w[:n])

    def _buffer(self, values: np.ndarray, weights) -> None:
        """Queue ITL samples (``weights``: an array like ``values`` or one number for all) for the histogram."""
        n = values.size
        p = self._itl_n
        if p + n > self.ITL_BUFFER:
            self._flush_itl()
            p = 0
            if n > self.ITL_BUFFER:
                self._itl.add(values, np.broadcast_to(weights, values.shape))
                return
        self._itl_v[p : p + n] = values
        self._itl_w[p : p + n] = weights
        self._itl_n = p + n

    def on_plan(self, instance_id: int, start_s: float, plan: StepPlan, result: StepResult) -> None:
        """A plan about to be applied to its requests (right before ``Scheduler.complete``): nothing to account here
        (a checking collector checks its tokens); its figures come with ``on_step``, after ``complete``, at its
        read-back."""

    def on_handover(self, instance_id: int, req: Request) -> None:
        """``req``, whose first token a prefill instance sampled, was queued at decode instance ``instance_id``
        (disaggregated serving) after its KV transfer: its first token reaches the client as it joins the decode
        batch there (``req.first_token_time``, set then: TTFT spans the prefill, the transfer and any wait for a seat),
        and its first decode token is one ITL gap from that."""
        s = self._streams.get(instance_id)
        if s is None:
            s = self._streams[instance_id] = _Stream()
        s.handed[req] = None

    def on_step(self, instance_id: int, start_s: float, plan: StepPlan, result: StepResult,
                kv_used_blocks: int, kv_total_blocks: int) -> None:
        """Account one executed plan (``result.num_steps`` steps starting at ``start_s``), after ``Scheduler.complete``
        applied it (``result.decode_tokens`` then holds the tokens delivered, no drafts past a request's end).

        Every output token after a request's first is a decode token and one ITL sample, the time since the
        request's previous token. A plan's tokens come at its steps' ends (its last at ``start_s`` plus its
        durations, a read-back delay included). A decode's gap is its step (a step's tokens share it evenly), in
        the plan's first step plus however long before the plan's start its previous token came (``_Stream.late``:
        none for a decode of the instance's previous plan; prompt-only plans ran in between, or its KV came from a
        prefill instance). The token a recompute samples at the end of its prompt, after a preemption, spans the
        stall since the request's last token before the preemption."""
        d = result.step_durations
        if d.__class__ is not np.ndarray or d.dtype is not _F64:   # (identity: a float64 dtype that is another object only costs asarray)
            d = np.asarray(d, float)
        k = d.size
        if k == 0:
            return
        dur = d.item(0) if k == 1 else float(np.add.reduce(d))
        n_dec = len(plan.decodes)
        prefills = plan.prefills
        if prefills:  # prefills run in the first step only
            n_pre = len(prefills)
            pre_tokens = prefills[0].num_new_tokens if n_pre == 1 else sum(c.num_new_tokens for c in prefills)
        else:
            n_pre = pre_tokens = 0
        s = self._streams.get(instance_id)
        if s is None:
            s = self._streams[instance_id] = _Stream()
        stalled = self._stalled
        for r in plan.preempted:
            if r.num_output_tokens and r not in stalled:   # (preempted again mid-recompute: its last token is older)
                stalled[r] = s.last_token(r, start_s)
        dec_tokens = 0
        draft_len = plan.draft_len
        if n_dec:
            tok = result.decode_tokens
            if tok is None:  # one token per decode per step
                made = k * n_dec
            else:
                if tok.__class__ is not np.ndarray:
                    tok = np.asarray(tok)
                made = int(tok.sum())
            dec_tokens = made
            # (the decodes' previous tokens came at this plan's start, the end of the previous one, unless that one
            # had no decodes or some came from a prefill instance)
            if s.stale or s.handed:
                late = s.late(start_s, plan.decodes)
            else:
                late = None
                if s.joined:   # their prompts completed in the previous plan
                    s.joined = []
            s.dec_end = start_s + dur
            dd, kk, d1 = d, k, dur
            if late is not None:
                # the first step: each decode's tokens share the time since its previous token; the rest as below
                wait, new = late
                d0 = d.item(0)
                if tok is None:   # the batch's decodes share one gap, each newcomer has its own
                    p = self._itl_n
                    if p + len(new) >= self.ITL_BUFFER:
                        self._flush_itl()
                        p = 0
                    v, w = self._itl_v, self._itl_w
                    for g in new.values():
                        v[p] = d0 + g
                        w[p] = 1.0
                        p += 1
                    if n_dec > len(new):
                        v[p] = d0 + wait
                        w[p] = n_dec - len(new)
                        p += 1
                    self._itl_n = p
                else:
                    gap = np.full(n_dec, wait)
                    if new:
                        gap[list(new)] = list(new.values())
                    t0 = tok[0]
                    self._buffer((d0 + gap) / np.maximum(t0, 1), t0)
                kk = k - 1
                dd = d[1:]
                if kk == 1:
                    d1 = dd.item(0)
                if tok is not None:
                    tok = tok[1:]
                    made -= int(t0.sum())
            if not kk:
                pass
            elif tok is None or (draft_len == 0 and made == kk * n_dec):
                # one token per decode per step (without drafts a decode makes at most one): each
                # step is one gap for each decode
                p = self._itl_n
                if p + kk > self.ITL_BUFFER:
                    self._flush_itl()
                    p = 0
                if kk == 1:
                    self._itl_v[p] = d1
                    self._itl_w[p] = n_dec
                    self._itl_n = p + 1
                elif kk > self.ITL_BUFFER:
                    self._itl.add(dd, np.full(kk, float(n_dec)))
                else:
                    self._itl_v[p : p + kk] = dd
                    self._itl_w[p : p + kk] = n_dec
                    self._itl_n = p + kk
            elif tok.max() <= 1:
                self._itl.add(dd, (tok > 0).sum(axis=1))
            else:
                mask = tok > 0
                self._itl.add((dd[:, None] / np.where(mask, tok, 1))[mask], tok[mask])
        else:
            s.stale = True
        if n_pre:
            end0 = start_s + (dur if k == 1 else d.item(0))   # first and recompute tokens: at the first step's end
            gaps = [end0 - stalled.pop(c.request, start_s) for c in prefills
                    if c.is_last_chunk and c.context_len + c.num_new_tokens > c.request.prompt_len]
            if gaps:  # recomputes that resumed a request's output
                dec_tokens += len(gaps)
                self._itl.add(np.array(gaps), np.ones(len(gaps)))
            s.joined.append((end0, prefills))   # (the requests of its last chunks decode next, unless they finished)

        rows = self._rows
        rows.append((start_s, dur, k, n_pre, pre_tokens, n_dec, draft_len, len(plan.preempted), dec_tokens,
                     kv_used_blocks, kv_total_blocks, instance_id))
        if len(rows) >= self.ROW_BUFFER:
            self._flush_rows()

        if self.record_steps:
            if len(self.step_records) < self.max_step_records:
                self.step_records.append(StepRecord(
                    instance_id, float(start_s), dur, k, n_pre, pre_tokens, n_dec, dec_tokens,
                    plan.draft_len, float(result.host_s), kv_used_blocks, kv_total_blocks))
            else:
                self.step_records_dropped += 1

    @property
    def num_plans(self) -> int:
        """Plans accounted so far."""
        self._flush_rows()
        return self._num_plans

    @property
    def num_steps(self) -> int:
        """Steps accounted so far."""
        self._flush_rows()
        return self._num_steps

    def _flush_rows(self) -> None:
        """Add the queued plans' figures to the running totals, in plan order.

        Integer sums are order-free; float sums are sequential folds (np.add.accumulate, never
        pairwise), so each total is bit for bit what adding plan by plan gives."""
        rows = self._rows
        if not rows:
            return
        self._rows = []
        # every integer here is far below 2**53: exact (fromiter over the flat rows: a third faster than np.array)
        a = np.fromiter(chain.from_iterable(rows), np.float64, len(rows) * len(rows[0])).reshape(len(rows), -1)
        start, dur = a[:, 0], a[:, 1]
        k, n_pre, pre_tok, n_dec, draft, n_preempt, dec_tok, used, total, iid = a[:, 2:].astype(np.int64).T
        self._num_plans += len(rows)
        self._num_steps += int(k.sum())
        self._busy_s = _fold(self._busy_s, dur)
        self._batch_requests += int((n_pre + n_dec * k).sum())
        self._batch_tokens += int((pre_tok + n_dec * (1 + draft) * k).sum())
        self._preemptions += int(n_preempt.sum())
        self._prefill_tokens += int(pre_tok.sum())
        self._decode_tokens += int(dec_tok.sum())
        last = float((start + dur).max())
        if last > self._last_time:
            self._last_time = last

        # KV: the cluster's used/total blocks after each plan (each instance's latest figures summed)
        d_used, d_total = used.copy(), total.copy()
        for i in sorted(set(iid.tolist())):  # (np.unique would import numpy.ma on first use)
            idx = (iid == i).nonzero()[0]
            pu, pt = self._kv_last.get(i, (0, 0))
            u, t = used[idx], total[idx]
            d_used[idx[0]] -= pu
            d_total[idx[0]] -= pt
            d_used[idx[1:]] -= u[:-1]
            d_total[idx[1:]] -= t[:-1]
            self._kv_last[i] = (int(u[-1]), int(t[-1]))
        run_used = np.cumsum(d_used) + self._kv_used
        run_total = np.cumsum(d_total) + self._kv_total
        self._kv_used, self._kv_total = int(run_used[-1]), int(run_total[-1])
        has = total > 0
        if has.all():
            util, dh = used / total, dur
        else:
            util, dh = used[has] / total[has], dur[has]
        if util.size:
            self._kv_wsum = _fold(self._kv_wsum, util * dh)
            self._kv_wdur = _fold(self._kv_wdur, dh)
            mx = float(util.max())
            if self._kv_max is None or mx > self._kv_max:
                self._kv_max = mx
        ok = run_total > 0
        if ok.any():
            add = self._timeline.add
            for t, v in zip(start[ok].tolist(), (run_used[ok] / run_total[ok]).tolist()):
                add(t, v)

    def on_finish(self, req: Request) -> None:
        """Record a finished request's timestamps and counts."""
        first = req.first_token_time if req.first_token_time is not None else math.nan
        finish = req.finish_time if req.finish_time is not None else math.nan
        self._arrival.append(req.arrival_time)
        self._first.append(first)
        self._finish.append(finish)
        self._prompt.append(req.prompt_len)
        self._out.append(req.num_output_tokens)
        self._cached.append(req.num_cached_tokens)
        self._preempt.append(req.num_preemptions)
        self._first_arrival = min(self._first_arrival, req.arrival_time)
        if req.finish_time is not None:
            self._last_time = max(self._last_time, req.finish_time)

    def on_drop(self, req: Request) -> None:
        """Count a dropped request under its ``drop_reason``."""
        self._stalled.pop(req, None)
        if req.num_output_tokens:
            for st in self._streams.values():
                if st.handed:
                    st.handed.pop(req, None)
        reason = drop_kind(req.drop_reason)
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        self._drop_arrival.append(req.arrival_time)
        self._first_arrival = min(self._first_arrival, req.arrival_time)

    # ------------------------------------------------------------ summary
    def summarize(self, num_gpus: int, slo: SLO | None, duration_s: float | None = None,
                  steady_after_s: float | None = None) -> SimMetrics:
        """All metrics of the run so far; deterministic for the same sequence of events.

        ``steady_after_s``: where the steady window starts (default: the 10th percentile arrival).
        """
        self._flush_rows()
        arrival = np.frombuffer(self._arrival, float) if len(self._arrival) else np.zeros(0)
        first = np.frombuffer(self._first, float) if len(self._first) else np.zeros(0)
        finish = np.frombuffer(self._finish, float) if len(self._finish) else np.zeros(0)
        prompt = np.frombuffer(self._prompt, np.int64) if len(self._prompt) else np.zeros(0, np.int64)
        out = np.frombuffer(self._out, np.int64) if len(self._out) else np.zeros(0, np.int64)
        cached = np.frombuffer(self._cached, np.int64) if len(self._cached) else np.zeros(0, np.int64)
        preempt = np.frombuffer(self._preempt, np.int64) if len(self._preempt) else np.zeros(0, np.int64)

        n_fin = int(arrival.size)
        n_drop = sum(self._dropped.values())
        arrived = max(self._arrived, n_fin + n_drop)
        if duration_s is None:
            duration_s = self._last_time - self._first_arrival if math.isfinite(self._first_arrival) else 0.0
        duration_s = max(float(duration_s), 0.0)

        def rate(x: float) -> float:
            return x / duration_s if duration_s > 0 else 0.0

        in_tok, out_tok = int(prompt.sum()), int(out.sum())
        # the latency temporaries live only inside _latencies: one set alive at a time (peak memory)
        latency, meeting = _latencies(arrival, first, finish, out, slo, p50=True)
        goodput = rate(meeting) if meeting is not None else None
        fraction = (meeting / arrived if arrived else None) if meeting is not None else None

        per_gpu = 1.0 / max(num_gpus, 1)
        steps = self.num_steps
        whole_latency = ({k: v for k, v in latency.items() if k != "per_user_output_tps_p50"}, meeting)
        windows = self._windows(num_gpus, slo, duration_s, steady_after_s, arrival, first, finish, prompt, out,
                                whole_latency)
        return SimMetrics(
            duration_s=duration_s,
            num_gpus=num_gpus,
            requests_arrived=arrived,
            requests_finished=n_fin,
            requests_dropped=n_drop,
            dropped_by_reason=dict(sorted(self._dropped.items())),
            requests_unfinished=arrived - n_fin - n_drop,
            preemptions=self._preemptions,
            requests_preempted=int((preempt > 0).sum()),
            itl_s=self.itl.stat(),  # (flushes the buffered samples)
            input_tokens=in_tok,
            output_tokens=out_tok,
            input_throughput=rate(in_tok),
            output_throughput=rate(out_tok),
            total_throughput=rate(in_tok + out_tok),
            input_throughput_per_gpu=rate(in_tok) * per_gpu,
            output_throughput_per_gpu=rate(out_tok) * per_gpu,
            total_throughput_per_gpu=rate(in_tok + out_tok) * per_gpu,
            request_throughput=rate(n_fin),
            slo=slo,
            requests_meeting_slo=meeting,
            goodput=goodput,
            goodput_fraction=fraction,
            prefix_cache_hit_rate=float(cached.sum() / in_tok) if in_tok else None,
            computed_prefill_tokens=self._prefill_tokens,
            decode_tokens=self._decode_tokens,
            kv_util_mean=self._kv_wsum / self._kv_wdur if self._kv_wdur > 0 else None,
            kv_util_max=self._kv_max,
            kv_timeline=self._timeline.get(),
            num_plans=self.num_plans,
            num_steps=steps,
            mean_batch_requests=self._batch_requests / steps if steps else None,
            mean_batch_tokens=self._batch_tokens / steps if steps else None,
            busy_s=self._busy_s,
            step_records_dropped=self.step_records_dropped,
            **latency,
            **windows,
        )

    def _windows(self, num_gpus, slo, duration_s, steady_after_s, arrival, first, finish, prompt, out,
                 whole_latency) -> dict:
        """The whole-run and steady windows (module docstring), from the finished and dropped requests;
        ``whole_latency``: the top-level latencies and SLO count, which are the whole run's."""
        dropped = np.frombuffer(self._drop_arrival, float) if len(self._drop_arrival) else np.zeros(0)
        if arrival.size + dropped.size == 0:
            return {}
        start = self._first_arrival if math.isfinite(self._first_arrival) else 0.0
        args = (num_gpus, slo, arrival, first, finish, prompt, out, dropped)
        last = float(max(arrival.max(initial=start), dropped.max(initial=start)))
        whole = window_metrics("whole_run", (start, last), start, start + duration_s, *args,
                               definition="whole run: first arrival to last finish (fill and drain included)",
                               latencies=whole_latency)
        bounds = steady_bounds(np.concatenate([arrival, dropped]), finish, steady_after_s)
        if bounds is None:
            return {"whole_run": whole}
        arrivals, (lo, hi) = bounds
        lo_txt = f"after the {steady_after_s:g} s ramp-up" if steady_after_s is not None else "the 10th"
        steady = window_metrics("steady", arrivals, lo, hi, *args,
                                definition=f"steady: latencies of the requests arriving between {lo_txt} and the 90th "
                                           "percentile arrival, output delivered between the 10th and 90th percentile finish")
        return {"whole_run": whole, "steady": steady}
