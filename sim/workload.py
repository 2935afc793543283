"""Workloads: what requests arrive when, with which lengths and shared prefixes.

``generate(spec, rng, block_size)`` turns a ``WorkloadSpec`` into sorted ``Request``s. Each
random quantity (arrivals, input lengths, output lengths, ...) draws from its own child
generator seeded from ``rng``, so changing e.g. the rate leaves the lengths of the first
requests unchanged (common random numbers across a sweep).

Prompt layout: ``shared_prefix_len`` tokens of a system prompt (one of
``num_prefix_groups``, picked uniformly per request / session) followed by ``input_len``
private tokens; the prompt is their sum. Only the shared-prefix blocks get hashes unless
``hash_private_blocks`` is on: private blocks can never hit, and leaving them out keeps a
million requests in memory (one Python int per block otherwise). Agentic sessions always
hash every full block, since the next turn reuses the conversation.

Agentic timing: arrivals are fixed before the simulation runs, so the next turn arrives at
``previous arrival + est_ttft_s + est_tpot_s * previous output_len + think time``, an
estimate of the previous turn's latency rather than its simulated finish.

Closed loop (``kind: closed``): ``concurrency`` users, each sending its next request when its
previous one finishes or is refused, after ``think_time_s`` (default 0); for ``num_requests``
requests in all and/or until ``duration_s``. Its arrivals depend on the run, so ``generate``
has no list for it: ``sim.closed_loop`` creates the requests during the simulation (and for
``twinfer bench``), each one's content fixed by (seed, user, k).
"""

from __future__ import annotations

import functools
import gc
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from scheduler.request import Request, new_requests
from sim.lengths import FixedLength, LengthDist, LognormalLength, UniformLength, check_support
from sim.traces import MAX_BLOCK_HASHES, MAX_TRACE_REQUESTS, ROOT_HASH, hash_pair, hash_pair_np, positional_hashes, read_trace
from twinfer.config import validate
from twinfer.errors import TwinferError, UnknownNameError

WorkloadKind = Literal["poisson", "gamma", "constant", "agentic", "trace", "closed"]

# content tags: keep the hash streams of different kinds of content apart
_TAG_PREFIX, _TAG_REQUEST, _TAG_SESSION = 0x505245, 0x524551, 0x534553

# Bounds on workload numbers: far past any real deployment, but small enough that arrival times,
# counts and lengths never overflow floats or int64 while requests are drawn.
MAX_RATE = 1e9            # requests/s
MIN_RATE = 1e-9
MAX_REQUESTS = 10**9      # requests in one workload
MAX_SECONDS = 1e10        # ~300 years of simulated time
MAX_TOKENS = 1e12         # a token length's largest value (lognormal lengths clip at 1e9 by default)
MAX_TURNS = 100_000       # turns of one agentic session
MAX_ROWS = 50_000_000     # requests (or agentic turns) drawn at once, and block hashes built (memory)
# closed-loop users: each keeps a request, a chunk of drawn content and a simpy process alive (~2.5 KB together,
# ~250 MB at the bound, measured with tracemalloc); far past the concurrencies fixed-concurrency benchmarks run
MAX_CONCURRENCY = 100_000

_AGENTIC_FIELDS = ("turns", "est_ttft_s", "est_tpot_s", "max_prompt_len")
_TRACE_FIELDS = ("trace_path", "trace_format", "time_scale", "time_unit", "max_requests")
_GENERATED_FIELDS = ("rate", "num_requests", "input_len", "output_len", "shared_prefix_len",
                     "num_prefix_groups", "hash_private_blocks", "priority_mix")


class WorkloadSpec(BaseModel):
    """A workload: arrival process, lengths, shared prefixes, priorities (or a trace).

    ``{"preset": "chat", "rate": 20}`` starts from a preset and overrides fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: WorkloadKind = "poisson"
    rate: float | None = Field(None, gt=0, le=MAX_RATE, description="requests/s (agentic: sessions arrive at rate / mean turns)")
    num_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS, description="arrivals only before this time")
    cv: float | None = Field(None, ge=1e-4, le=1e4, description="gamma: coefficient of variation of inter-arrivals")
    input_len: LengthDist = FixedLength(value=1024)
    output_len: LengthDist = FixedLength(value=256)
    shared_prefix_len: int = Field(0, ge=0, le=1 << 24, description="tokens of system prompt shared within a group")
    num_prefix_groups: int = Field(1, ge=1, le=1_000_000)
    hash_private_blocks: bool = False
    priority_mix: dict[int, float] | None = Field(None, description="priority -> weight (lower is served first)")
    # closed loop
    concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY, description="closed: users, each with one request in flight")
    # agentic (think_time_s: closed too)
    turns: LengthDist = UniformLength(min=2, max=8)
    think_time_s: LengthDist = Field(FixedLength(value=5), description="seconds a user waits before its next request (agentic "
                                     "default 5; closed default 0; e.g. {kind: exponential, mean: 2}; lognormal/normal clip at min, default 1)")
    est_ttft_s: float = Field(1.0, ge=0, le=MAX_SECONDS)
    est_tpot_s: float = Field(0.03, ge=0, le=MAX_SECONDS)
    max_prompt_len: int | None = Field(None, ge=1, description="a session ends before a turn would exceed this")
    # trace
    trace_path: str | None = None
    trace_format: Literal["jsonl", "mooncake"] = "jsonl"
    time_scale: float = Field(1.0, gt=0, le=1e6, description="multiplies trace times (0.5: twice as fast)")
    time_unit: Literal["s", "ms"] | None = None
    max_requests: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data):
        if isinstance(data, dict) and "preset" in data:
            data = dict(data)
            name = data.pop("preset")
            if not isinstance(name, str) or name not in PRESETS:
                raise ValueError(f"preset: unknown {name!r}; known presets: {', '.join(sorted(PRESETS))}")
            full = PRESETS[name].model_dump()
            data = {**{f: full[f] for f in PRESETS[name].model_fields_set}, **data}
        if isinstance(data, dict) and data.get("kind") == "closed" and "think_time_s" not in data:
            data = {**data, "think_time_s": 0}  # a closed loop sends at once unless told (InferenceX, MLPerf); written out, so a dump reloads the same
        return data

    @model_serializer(mode="wrap")
    def _drop_unused_concurrency(self, handler):
        """Leave ``concurrency`` out where it is unset (every kind but closed), so the dumps and digests of the other
        kinds' results stay what they were before the field existed."""
        data = handler(self)
        if isinstance(data, dict) and data.get("concurrency", 0) is None:
            del data["concurrency"]
        return data

    @field_validator("priority_mix")
    @classmethod
    def _mix(cls, v):
        if v is not None:
            if not v or any(w < 0 or not math.isfinite(w) for w in v.values()) or sum(v.values()) <= 0:
                raise ValueError("weights must be finite, >= 0, not all zero")
            if any(abs(k) > 2**31 for k in v):
                raise ValueError("priorities must be integers in [-2**31, 2**31]")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        given = self.model_fields_set
        k = self.kind

        def only(fields, kinds):
            for f in fields:
                if f in given and k not in kinds and getattr(self, f) != type(self).model_fields[f].default:
                    raise ValueError(f"{f}: only used when kind is {' or '.join(kinds)} (kind is {k!r})")

        only(_AGENTIC_FIELDS, ("agentic",))
        only(("think_time_s",), ("agentic", "closed"))
        only(("concurrency",), ("closed",))
        only(_TRACE_FIELDS, ("trace",))
        only(("cv",), ("gamma",))
        if k == "trace":
            if self.num_requests is not None:
                raise ValueError("num_requests: a trace takes max_requests (its earliest requests)")
            if "rate" in given and self.rate is not None:   # not "... or closed": a closed loop has no rate either
                raise ValueError("rate: only used when kind is poisson, gamma, constant or agentic (kind is 'trace': a "
                                 "trace replays its own arrival times; time_scale speeds them up or slows them down, "
                                 "0.5: twice as fast)")
            only(_GENERATED_FIELDS, ("poisson", "gamma", "constant", "agentic", "closed"))
            if not self.trace_path:
                raise ValueError("trace_path: required when kind is 'trace'")
            return self
        if k == "closed":
            return self._check_closed(only)
        if self.rate is None:
            raise ValueError(f"rate: required when kind is {k!r}")
        if self.rate < MIN_RATE:
            raise ValueError(f"rate: {self.rate:g} requests/s is below {MIN_RATE:g} (one request in ~30 years)")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("num_requests or duration_s: give at least one")
        if self.num_requests is None and self.rate * self.duration_s > MAX_REQUESTS:
            raise ValueError(f"rate x duration_s = {self.rate * self.duration_s:.3g} requests expected; at most "
                             f"{MAX_REQUESTS:.0e} (set num_requests to cap the run)")
        if k == "gamma" and self.cv is None:
            raise ValueError("cv: required when kind is 'gamma'")
        check_support(self.input_len, "input_len", 1 if self.shared_prefix_len == 0 else 0)
        check_support(self.output_len, "output_len", 1)
        _check_range(self.input_len, "input_len", MAX_TOKENS)
        _check_range(self.output_len, "output_len", MAX_TOKENS)
        if k == "agentic":
            check_support(self.turns, "turns", 1)
            check_support(self.think_time_s, "think_time_s", 0)
            _check_range(self.turns, "turns", MAX_TURNS)
            _check_range(self.think_time_s, "think_time_s", MAX_SECONDS)
            shortest = self.shared_prefix_len + self.input_len.support()[0]
            if self.max_prompt_len is not None and self.max_prompt_len < shortest:
                raise ValueError(f"max_prompt_len: {self.max_prompt_len} is below the shortest first turn ({shortest:g})")
        return self

    def _check_closed(self, only):
        """A closed loop: concurrency instead of a rate, a run bound, lengths and think time in range."""
        if self.rate is not None:
            raise ValueError("rate: not used when kind is 'closed' (the concurrency users set the load; "
                             "think_time_s spaces their requests)")
        if self.concurrency is None:
            raise ValueError(f"concurrency: required when kind is 'closed' (users, 1 to {MAX_CONCURRENCY:,})")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("num_requests or duration_s: give at least one (the closed loop runs until either)")
        if self.num_requests is not None and self.num_requests > MAX_BUILT_REQUESTS:
            raise ValueError(f"num_requests: {self.num_requests:,}; a closed loop keeps every request it sends, at most "
                             f"{MAX_BUILT_REQUESTS:,}")
        check_support(self.input_len, "input_len", 1 if self.shared_prefix_len == 0 else 0)
        check_support(self.output_len, "output_len", 1)
        check_support(self.think_time_s, "think_time_s", 0)
        _check_range(self.input_len, "input_len", MAX_TOKENS)
        _check_range(self.output_len, "output_len", MAX_TOKENS)
        _check_range(self.think_time_s, "think_time_s", MAX_SECONDS)
        return self


def _check_range(dist, field: str, most: float) -> None:
    """A length model whose numbers overflow (a mean of 1e300, a uniform max past int64) is refused here,
    naming the field, rather than failing later while requests are drawn."""
    try:
        lo, hi = dist.support()
        m = dist.mean()
    except (OverflowError, ValueError, ZeroDivisionError) as err:
        raise ValueError(f"{field}: parameters out of range ({err})") from None
    if not (math.isfinite(m) and hi <= most):
        raise ValueError(f"{field}: values must stay <= {most:.3g} (this distribution reaches {hi:.3g}; set its max)")


@contextmanager
def _no_gc():
    """Pause the cyclic GC while building many acyclic objects: otherwise it rescans the
    growing list of young objects over and over (halves the time for 1M requests)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# Preset numbers are representative shapes, not measurements: chat ~ ShareGPT-like
# (lognormal ~1.5k in / ~400 out); reasoning = short prompt, long chain of thought.
PRESETS: dict[str, WorkloadSpec] = {
    "chat": WorkloadSpec(
        kind="poisson", rate=10.0, num_requests=1000,
        input_len=LognormalLength(mean=1500, sigma=0.8, min=16, max=32768),
        output_len=LognormalLength(mean=400, sigma=0.7, min=8, max=4096),
    ),
    "long-context": WorkloadSpec(
        kind="poisson", rate=1.0, num_requests=500,
        input_len=UniformLength(min=16384, max=32768),
        output_len=LognormalLength(mean=500, sigma=0.6, min=16, max=4096),
    ),
    "summarize": WorkloadSpec(
        kind="poisson", rate=2.0, num_requests=500,
        input_len=LognormalLength(mean=6000, sigma=0.5, min=1024, max=32768),
        output_len=LognormalLength(mean=300, sigma=0.5, min=32, max=2048),
        shared_prefix_len=256, num_prefix_groups=4,
    ),
    "agentic": WorkloadSpec(
        kind="agentic", rate=5.0, num_requests=1000,
        input_len=LognormalLength(median=400, p90=2000, min=16, max=16384),
        output_len=LognormalLength(median=250, p90=800, min=8, max=4096),
        shared_prefix_len=4096, num_prefix_groups=8,
        turns=UniformLength(min=4, max=16),
        think_time_s=LognormalLength(median=2.0, p90=10.0, min=0.1, max=120),
        max_prompt_len=131072,
    ),
    "reasoning": WorkloadSpec(
        kind="poisson", rate=2.0, num_requests=500,
        input_len=LognormalLength(mean=500, sigma=0.8, min=16, max=8192),
        output_len=LognormalLength(mean=4000, sigma=0.6, min=256, max=32768),
    ),
}


def preset(name: str, **overrides) -> WorkloadSpec:
    """A preset with fields overridden (validated); unknown names list the known ones."""
    if name not in PRESETS:
        raise UnknownNameError("workload preset", name, list(PRESETS))
    return validate(WorkloadSpec, {"preset": name, **overrides}, f"preset {name!r}")


RATE_KINDS = ("poisson", "gamma", "constant")  # kinds whose requests differ only in when they arrive


def trace_arrivals(spec: WorkloadSpec) -> tuple[int, float]:
    """(requests, seconds from the first arrival to the last) of a trace workload as it is replayed: its time_scale,
    time_unit, max_requests and duration_s applied (the requests ``generate`` gives)."""
    if spec.kind != "trace":
        raise TwinferError(f"workload: kind {spec.kind!r} is not a trace")
    p = Path(spec.trace_path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        key = (str(p), 0, 0)   # read_trace names the missing file
    n, first, last = _trace_times(key, spec.trace_format, spec.time_unit, spec.max_requests, spec.time_scale, spec.duration_s)
    return n, last - first


@functools.lru_cache(maxsize=32)
def _trace_times(key: tuple, fmt: str, time_unit, max_requests, time_scale: float, duration_s) -> tuple[int, float, float]:
    reqs = read_trace(key[0], 1 << 30, fmt, time_scale=time_scale, time_unit=time_unit,   # huge block: no hashing work
                      max_requests=max_requests)
    if duration_s is not None:
        reqs = [r for r in reqs if r.arrival_time < duration_s]
    if not reqs:
        return 0, 0.0, 0.0
    return len(reqs), reqs[0].arrival_time, reqs[-1].arrival_time


def offered_rate(spec: WorkloadSpec) -> float | None:
    """Requests/s a workload offers: an open kind's ``rate``; a trace's requests over their arrival span (one less
    than the requests, over the seconds from the first arrival to the last: the inverse of the mean gap, as
    replayed); None for a closed loop (its users set the load) and for a trace whose requests all arrive at once."""
    if spec.kind == "closed":
        return None
    if spec.kind != "trace":
        return spec.rate
    n, span = trace_arrivals(spec)
    return (n - 1) / span if n > 1 and span > 0 else None


def at_rate(spec: WorkloadSpec, rate: float, num_requests: int | None = None) -> WorkloadSpec:
    """``spec`` offering ``rate`` requests/s: an open kind's rate replaced (``num_requests`` requests, no duration); a
    trace replayed faster or slower (its time_scale, and a duration_s with it, scaled so that ``offered_rate`` is
    ``rate``), its earliest ``num_requests`` requests where given (those scaled to ``rate``; where they arrive at one
    instant, the whole trace is). A trace whose requests all arrive at once has no rate to scale: refused."""
    if not rate > 0:
        raise TwinferError(f"rate: {rate:g} requests/s; must be > 0")
    if spec.kind == "closed":
        raise TwinferError("workload: kind 'closed' has no arrival rate (its concurrency users set the load)")
    if spec.kind != "trace":
        return spec.model_copy(update={"rate": rate, "num_requests": num_requests, "duration_s": None})
    whole = spec
    if num_requests is not None:
        spec = spec.model_copy(update={"max_requests": min(num_requests, spec.max_requests or num_requests)})
    own = offered_rate(spec)
    if own is None:   # its first requests arrive at once (or it is one request): scaled as the whole trace is
        own = offered_rate(whole)
    if own is None:
        n, _ = trace_arrivals(whole)
        raise TwinferError(f"workload: the trace {spec.trace_path} has no arrival rate to scale: its {n:,} request(s) "
                           "arrive at one instant (a trace's rate is its requests over the span of their arrival times)")
    k = own / rate
    upd = {"time_scale": spec.time_scale * k}
    if spec.duration_s is not None:
        upd["duration_s"] = spec.duration_s * k
    return spec.model_copy(update=upd)


def as_closed(spec: WorkloadSpec, concurrency: int | None = None, think_time_s: float | None = None) -> WorkloadSpec:
    """``spec`` as a closed loop of ``concurrency`` users (validated, errors name the field): a closed spec with the
    user count / think time replaced, or a poisson/gamma/constant one with the same lengths, prefixes, priorities and
    request count or duration (its rate and cv dropped; think time 0 unless given)."""
    return validate(WorkloadSpec, closed_mapping(spec.model_dump(mode="json", exclude_unset=True), concurrency, think_time_s),
                    "workload")


def closed_mapping(data: dict, concurrency: int | None = None, think_time_s: float | None = None) -> dict:
    """A workload mapping (not yet validated, no preset) made a closed loop's, as ``as_closed`` makes a spec: so a
    scenario file's ``kind: closed`` without ``concurrency`` takes ``--concurrency`` before it is validated."""
    kind = data.get("kind", "poisson")
    if kind not in RATE_KINDS + ("closed",):
        raise TwinferError(f"workload.kind: {kind!r} cannot run as a closed loop (poisson, gamma, constant or closed can)")
    data = dict(data)
    if kind != "closed":
        data = {k: v for k, v in data.items() if k not in ("rate", "cv")}
        data.update(kind="closed", think_time_s=0)
    data.update({k: v for k, v in (("concurrency", concurrency), ("think_time_s", think_time_s)) if v is not None})
    return data


# ---------------------------------------------------------------- generation
class _Streams:
    """One child generator per random quantity, seeded from the caller's generator."""

    NAMES = ("arrival", "input", "output", "group", "priority", "turns", "think")

    def __init__(self, rng: np.random.Generator):
        seeds = rng.integers(0, 2**63, size=len(self.NAMES))
        for name, s in zip(self.NAMES, seeds.tolist()):
            setattr(self, name, np.random.default_rng(s))


def _interarrivals(spec: WorkloadSpec, rng: np.random.Generator, n: int, rate: float, kind: str) -> np.ndarray:
    if kind == "constant":
        return np.full(n, 1.0 / rate)
    if kind == "gamma":
        shape = 1.0 / spec.cv**2  # cv of a gamma is 1/sqrt(shape); mean shape*scale = 1/rate
        return rng.gamma(shape, 1.0 / (rate * shape), n)
    return rng.exponential(1.0 / rate, n)


def _arrivals(spec: WorkloadSpec, rng: np.random.Generator, n: int | None, duration: float | None,
              rate: float, kind: str) -> np.ndarray:
    """Arrival times starting at 0: the first ``n`` and/or those before ``duration``."""
    if duration is None:
        ia = _interarrivals(spec, rng, n, rate, kind)
        return np.concatenate(([0.0], np.cumsum(ia[:-1])))
    expect = rate * duration
    chunk = int(expect + 6 * math.sqrt(expect) + 16)
    if n is not None:
        chunk = min(chunk, n)
    parts, total, last = [], 0, 0.0
    while last < duration and (n is None or total < n):
        ia = _interarrivals(spec, rng, chunk, rate, kind)
        parts.append(ia)
        total += chunk
        last += float(ia.sum())
    t = np.concatenate(([0.0], np.cumsum(np.concatenate(parts))[:-1]))
    t = t[t < duration]
    return t if n is None else t[:n]


def _priorities(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    if not spec.priority_mix:
        return np.zeros(n, np.int64)
    levels = np.array(sorted(spec.priority_mix), np.int64)
    w = np.array([spec.priority_mix[int(k)] for k in levels], float)
    cum = np.cumsum(w) / w.sum()
    return levels[np.minimum(np.searchsorted(cum, rng.random(n), side="right"), len(levels) - 1)]


MAX_PREFIX_BLOCKS = 20_000_000  # block hashes of all shared prefixes together (~1 GB of Python ints)


def _check_hash_count(n: int, block_size: int) -> None:
    """Private block hashes are Python ints kept per request: refuse a workload that needs too many."""
    if n > MAX_BLOCK_HASHES:
        raise TwinferError(f"hash_private_blocks: the prompts need {n:,} private {block_size}-token block hashes; "
                           f"at most {MAX_BLOCK_HASHES:,} (shorter prompts, fewer requests, or hash_private_blocks: false)")


def _group_prefixes(spec: WorkloadSpec, block_size: int) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Hash tuple of each group's shared prefix blocks, and each group's last chain hash."""
    n_blocks = spec.shared_prefix_len // block_size
    groups = spec.num_prefix_groups if spec.shared_prefix_len else 1
    if groups * n_blocks > MAX_PREFIX_BLOCKS:
        raise TwinferError(f"num_prefix_groups x shared_prefix_len: {groups} groups of {n_blocks} {block_size}-token blocks "
                           f"= {groups * n_blocks:,} prefix blocks; at most {MAX_PREFIX_BLOCKS:,}")
    anchors = hash_pair_np(hash_pair(ROOT_HASH, _TAG_PREFIX), np.arange(groups, dtype=np.uint64))
    rows = positional_hashes(anchors, np.zeros(groups, np.int64), np.full(groups, n_blocks, np.int64))
    tuples = [tuple(r) for r in rows]
    tails = np.array([r[-1] if r else ROOT_HASH for r in rows], np.uint64)
    return tuples, tails


MAX_BUILT_REQUESTS = MAX_TRACE_REQUESTS  # requests built at once (~1 KB each while simulated)


def _check_request_budget(spec: WorkloadSpec) -> None:
    """Refuse, before drawing anything, a workload that would build more requests than memory allows
    (the spec's own bound, MAX_REQUESTS, is for streamed runs: benchmarks/soak_sim.py builds in chunks)."""
    want = spec.num_requests
    if want is None and spec.rate is not None and spec.duration_s is not None:
        want = spec.rate * spec.duration_s
    if want is not None and want > MAX_BUILT_REQUESTS:
        field = "num_requests" if spec.num_requests is not None else "rate x duration_s"
        raise TwinferError(f"{field}: {want:,.0f} requests; at most {MAX_BUILT_REQUESTS:,} are built at once "
                           f"(~1 KB each); stream longer runs (benchmarks/soak_sim.py)")


def generate(spec: WorkloadSpec, rng: np.random.Generator, block_size: int) -> list[Request]:
    """The workload's requests, sorted by arrival, ids ``r0, r1, ...``; deterministic per seed."""
    if block_size < 1:
        raise TwinferError(f"block_size: must be >= 1 (got {block_size})")
    if spec.kind == "closed":
        raise TwinferError("workload: kind 'closed' has no arrival list (a user's next request is sent when its last one "
                           "finishes); simulate it (sim.runner) or bench it (twinfer bench)")
    if spec.kind == "trace":
        reqs = read_trace(spec.trace_path, block_size, spec.trace_format, time_scale=spec.time_scale,
                          time_unit=spec.time_unit, max_requests=spec.max_requests)
        if spec.duration_s is not None:
            reqs = [r for r in reqs if r.arrival_time < spec.duration_s]
        return reqs
    _check_request_budget(spec)
    streams = _Streams(rng)
    if spec.kind == "agentic":
        return _generate_agentic(spec, streams, block_size)

    t = _arrivals(spec, streams.arrival, spec.num_requests, spec.duration_s, spec.rate, spec.kind)
    n = len(t)
    prompt = spec.input_len.sample(streams.input, n) + spec.shared_prefix_len
    out = spec.output_len.sample(streams.output, n)
    prio = _priorities(spec, streams.priority, n)
    prefixes, tails = _group_prefixes(spec, block_size)
    group = (streams.group.integers(0, spec.num_prefix_groups, n) if spec.shared_prefix_len
             else np.zeros(n, np.int64))
    if spec.hash_private_blocks:
        n_pb = spec.shared_prefix_len // block_size
        _check_hash_count(int((prompt // block_size).sum()) - n_pb * n, block_size)
        anchors = hash_pair_np(hash_pair_np(tails[group], _TAG_REQUEST), np.arange(n, dtype=np.uint64))
        private = positional_hashes(anchors, np.full(n, n_pb), prompt // block_size)
        hashes = [prefixes[g] + tuple(p) for g, p in zip(group.tolist(), private)]
    else:
        hashes = [prefixes[g] for g in group.tolist()]  # shared tuples: no per-request memory
    with _no_gc():
        return new_requests(zip([f"r{i}" for i in range(n)], t.tolist(), prompt.tolist(), out.tolist(), hashes, prio.tolist()))


def _segment_cumsum(x: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Cumulative sum restarting at each segment (segments given by first index and length)."""
    cs = np.cumsum(x)
    before = cs[first] - x[first]
    return cs - np.repeat(before, counts)


def _agentic_turns(spec: WorkloadSpec, streams: _Streams, starts: np.ndarray) -> dict[str, np.ndarray]:
    """Per-turn arrays for sessions starting at ``starts`` (turns past max_prompt_len removed)."""
    s = len(starts)
    turns = spec.turns.sample(streams.turns, s)
    first = np.concatenate(([0], np.cumsum(turns)[:-1])).astype(np.int64)
    n = int(turns.sum())
    sess = np.repeat(np.arange(s), turns)
    k = np.arange(n) - np.repeat(first, turns)  # turn index within its session
    user = spec.input_len.sample(streams.input, n)
    out = spec.output_len.sample(streams.output, n)
    think = spec.think_time_s.sample_float(streams.think, n)
    prev_out = np.concatenate(([0], out[:-1]))
    # each turn's prompt = previous prompt + previous output + new user tokens
    grow = user + np.where(k == 0, spec.shared_prefix_len, prev_out)
    prompt = _segment_cumsum(grow, first, turns)
    gap = np.where(k == 0, 0.0, spec.est_ttft_s + spec.est_tpot_s * prev_out + think)
    arrival = starts[sess] + _segment_cumsum(gap, first, turns)
    keep = np.ones(n, bool) if spec.max_prompt_len is None else prompt <= spec.max_prompt_len
    return {"sess": sess[keep], "turn": k[keep], "prompt": prompt[keep], "out": out[keep], "arrival": arrival[keep]}


def _agentic_arrays(spec: WorkloadSpec, streams: _Streams, n_max: int | None, duration: float | None):
    """Session starts and per-turn arrays, enough to hold the first n_max / pre-duration turns."""
    mean_turns = max(spec.turns.mean(), 1.0)
    session_rate = spec.rate / mean_turns
    chunk = 64 if n_max is None else max(64, int(1.2 * n_max / mean_turns))
    if duration is not None:
        chunk = max(64, int(session_rate * duration * 1.1 + 16))
    if chunk * mean_turns > MAX_ROWS:
        raise TwinferError(f"agentic workload: {chunk:,} sessions of {mean_turns:.3g} turns on average would be drawn at "
                           f"once (rate, duration_s, turns); at most {MAX_ROWS:,} turns")
    starts_all, parts = np.zeros(0), []
    while True:
        ia = streams.arrival.exponential(1.0 / session_rate, chunk)
        if starts_all.size == 0:
            starts = np.concatenate(([0.0], np.cumsum(ia[:-1])))  # first session at t = 0
        else:
            starts = starts_all[-1] + np.cumsum(ia)
        part = _agentic_turns(spec, streams, starts)
        if part["arrival"].size == 0 and not parts:  # every session cut by max_prompt_len
            raise TwinferError("max_prompt_len: every session's first turn is longer; no requests")
        part["sess"] = part["sess"] + starts_all.size
        parts.append(part)
        starts_all = np.concatenate((starts_all, starts))
        horizon = starts_all[-1]  # no later session has a turn before its start
        done_d = duration is not None and horizon >= duration
        done_n = n_max is not None and sum(int(np.sum(p["arrival"] < horizon)) for p in parts) >= n_max
        if done_d or done_n:
            break
    cols = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    order = np.lexsort((cols["turn"], cols["sess"], cols["arrival"]))
    cols = {key: v[order] for key, v in cols.items()}
    keep = len(cols["arrival"]) if duration is None else int(np.searchsorted(cols["arrival"], duration, "left"))
    if n_max is not None:
        keep = min(keep, n_max)
    return len(starts_all), {key: v[:keep] for key, v in cols.items()}


def _generate_agentic(spec: WorkloadSpec, streams: _Streams, block_size: int) -> list[Request]:
    n_sessions, c = _agentic_arrays(spec, streams, spec.num_requests, spec.duration_s)
    group = (streams.group.integers(0, spec.num_prefix_groups, n_sessions) if spec.shared_prefix_len
             else np.zeros(n_sessions, np.int64))
    prio = _priorities(spec, streams.priority, n_sessions)  # one priority per session
    prefixes, tails = _group_prefixes(spec, block_size)
    # hash each session's conversation once, up to its longest kept turn; turns slice it
    used = np.unique(c["sess"])
    longest = np.zeros(n_sessions, np.int64)
    np.maximum.at(longest, c["sess"], c["prompt"] // block_size)
    n_pb = spec.shared_prefix_len // block_size
    _check_hash_count(int(longest[used].sum()) - n_pb * len(used), block_size)
    anchors = hash_pair_np(hash_pair_np(tails[group[used]], _TAG_SESSION), used.astype(np.uint64))
    private = positional_hashes(anchors, np.full(len(used), n_pb), longest[used])
    conv = {int(s): prefixes[group[s]] + tuple(p) for s, p in zip(used.tolist(), private)}
    sess = c["sess"].tolist()
    prio_l = prio.tolist()
    with _no_gc():
        return [
            Request(f"r{i}", a, p, o, conv[s][: p // block_size], prio_l[s], f"s{s}")
            for i, (a, p, o, s) in enumerate(zip(c["arrival"].tolist(), c["prompt"].tolist(), c["out"].tolist(), sess))
        ]


def expected_tokens(spec: WorkloadSpec) -> tuple[float, float]:
    """Mean prompt (prefix included) and output tokens per request, for capacity estimates.

    Closed form for generated kinds; agentic averages the turns of whole sessions drawn
    with seed 0, ~20k turns (prompts grow with the turn, max_prompt_len truncates
    sessions); traces average the file.
    """
    if spec.kind == "trace":
        reqs = generate(spec, np.random.default_rng(0), 1 << 30)  # huge block: no hashing work
        if not reqs:
            return 0.0, 0.0
        return (float(np.mean([r.prompt_len for r in reqs])), float(np.mean([r.output_len for r in reqs])))
    if spec.kind == "agentic":
        n_sessions = max(1, math.ceil(20_000 / max(spec.turns.mean(), 1.0)))
        c = _agentic_turns(spec, _Streams(np.random.default_rng(0)), np.zeros(n_sessions))
        if c["prompt"].size == 0:
            return 0.0, 0.0
        return float(c["prompt"].mean()), float(c["out"].mean())
    return spec.shared_prefix_len + spec.input_len.mean(), spec.output_len.mean()
