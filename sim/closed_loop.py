"""Closed-loop workload (``kind: closed``): N users, each sending its next request when its last one ends.

How InferenceX, MLPerf's fixed-concurrency runs and most vendor benchmarks load a server: the
number in flight, not the arrival rate, is fixed. The arrivals therefore depend on the run, and
there is no list to generate up front:

- ``UserContent`` fixes what user ``u``'s ``k``-th request holds (prompt and output lengths,
  prefix group, priority, block hashes, the think time after it) as a function of (seed, u, k)
  alone: the draws come from a generator keyed on (seed, u, k // CHUNK), CHUNK requests at a
  time in a fixed order, so timing, routing, drops and preemption never change any request's
  content. The length / prefix / priority machinery is the open-loop kinds' (sim.workload).
- ``ClosedLoop`` runs one simpy process per user in the simulation's one event loop: create the
  request (arrival = now), hand it to the deployment, wait for its completion, think, repeat. A
  completion is a finish or a drop, seen where every request ends: the metrics collector's
  ``on_finish`` / ``on_drop`` (``watch`` wraps it), so a refused request frees its user's slot too.
  The wait is a simpy event resumed after the instance's step boundary: the next request reaches
  the engine no sooner than the step after its predecessor finished, as a client's would.
- ``OpenLoop`` gives a pre-generated list the same three-call interface, so a runner wires
  either without asking which it has.

A user stops sending once ``num_requests`` requests were sent in all, or at ``duration_s``;
requests in flight then finish.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import simpy

from scheduler.request import Request
from sim.traces import MAX_BLOCK_HASHES, hash_pair, positional_hashes
from sim.workload import MAX_BUILT_REQUESTS, WorkloadSpec, _group_prefixes, _priorities, generate
from twinfer.errors import TwinferError

CHUNK = 16            # requests of one user drawn at once (a fixed size: the draws do not depend on timing)
# refused-on-arrival requests in a row, with no simulated time passing, after which a run bounded only by
# duration_s stops with an error: with nothing but instant refusals and no think time it would never advance
MAX_INSTANT_DROPS = 10_000
_TAG_CLOSED = 0x434C4F  # keeps closed-loop private block hashes apart from the open-loop kinds'


class Drawn(NamedTuple):
    """User ``u``'s ``k``-th request, as drawn."""

    key: int                       # (u << 32) | k: unique per request, the same in simulate and bench
    prompt_len: int
    output_len: int
    block_hashes: tuple[int, ...]
    priority: int
    think_s: float                 # the user's pause after this request ends


class UserContent:
    """The content of every user's k-th request, a pure function of (seed, u, k)."""

    def __init__(self, spec: WorkloadSpec, rng: np.random.Generator, block_size: int):
        if spec.kind != "closed":
            raise TwinferError(f"workload.kind: a closed loop needs kind 'closed' (got {spec.kind!r})")
        if block_size < 1:
            raise TwinferError(f"block_size: must be >= 1 (got {block_size})")
        self.spec, self.block_size = spec, block_size
        self.seed = int(rng.integers(0, 2**63))
        self.prefixes, self.tails = _group_prefixes(spec, block_size)
        self._chunks: dict[int, tuple[int, tuple]] = {}   # user -> (chunk index, drawn columns)
        self._private_hashes = 0

    def draw(self, u: int, k: int) -> Drawn:
        """User ``u``'s ``k``-th request."""
        c, i = divmod(k, CHUNK)
        got = self._chunks.get(u)
        if got is None or got[0] != c:
            got = (c, self._draw_chunk(u, c))
            self._chunks[u] = got
        ints, think = got[1]
        prompt, out, group, prio = ints[:, i].tolist()
        key = (u << 32) | k
        return Drawn(key, prompt, out, self._hashes(key, group, prompt), prio, float(think[i]))

    def _draw_chunk(self, u: int, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows (prompt, output, group, priority) and the think times of requests ``c*CHUNK ..`` of user ``u``;
        one generator per (seed, u, c), its draws always in this order and size. Arrays, not lists: a user keeps
        its chunk for the whole run (~0.7 KB, a third of the lists')."""
        spec, rng = self.spec, np.random.default_rng([self.seed, u, c])
        prompt = spec.input_len.sample(rng, CHUNK) + spec.shared_prefix_len
        out = spec.output_len.sample(rng, CHUNK)
        group = (rng.integers(0, spec.num_prefix_groups, CHUNK) if spec.shared_prefix_len
                 else np.zeros(CHUNK, np.int64))
        prio = _priorities(spec, rng, CHUNK)
        think = spec.think_time_s.sample_float(rng, CHUNK)
        return np.stack([prompt, out, group, prio]).astype(np.int64), think

    def _hashes(self, key: int, group: int, prompt: int) -> tuple[int, ...]:
        """The shared prefix's block hashes, then (hash_private_blocks) the request's own."""
        shared = self.prefixes[group]
        if not self.spec.hash_private_blocks:
            return shared
        n_pb = self.spec.shared_prefix_len // self.block_size
        n = prompt // self.block_size
        self._private_hashes += max(0, n - n_pb)
        if self._private_hashes > MAX_BLOCK_HASHES:
            raise TwinferError(f"hash_private_blocks: the closed loop's prompts need more than {MAX_BLOCK_HASHES:,} private "
                               "block hashes (fewer or shorter requests, or hash_private_blocks: false)")
        anchor = hash_pair(hash_pair(int(self.tails[group]), _TAG_CLOSED), key)
        return shared + tuple(positional_hashes(np.array([anchor], np.uint64), np.array([n_pb]), np.array([n]))[0])


class _Watched:
    """The metrics collector as the deployment sees it: every call forwarded; a finish or drop also ends
    the request's turn in the closed loop."""

    def __init__(self, metrics, on_done: Callable[[Request], None]):
        self._metrics, self._on_done = metrics, on_done

    def __getattr__(self, name):
        return getattr(self._metrics, name)

    def on_finish(self, req: Request) -> None:
        self._metrics.on_finish(req)
        self._on_done(req)

    def on_drop(self, req: Request) -> None:
        self._metrics.on_drop(req)
        self._on_done(req)


class ClosedLoop:
    """``spec.concurrency`` simpy processes, one per user; ``requests`` holds what they sent, in sending order."""

    def __init__(self, env: simpy.Environment, spec: WorkloadSpec, rng: np.random.Generator, block_size: int,
                 sink: list[Request] | None = None):
        self.env, self.spec = env, spec
        self.content = UserContent(spec, rng, block_size)
        self.requests: list[Request] = sink if sink is not None else []
        if self.requests:
            raise TwinferError("a closed loop creates its requests during the run; pass an empty list to collect them")
        self.initial: list[Request] = []     # nothing arrives on a schedule
        self._turn_ends: dict[str, simpy.Event] = {}   # request id -> its user's wake-up
        self._instant_drops = 0

    def watch(self, metrics):
        """``metrics`` as the deployment should call it: completions also wake the request's user."""
        return _Watched(metrics, self._done)

    def start(self, submit: Callable[[Request], None]) -> None:
        """Start every user; ``submit(req)`` hands a new request to the deployment at the current time."""
        for u in range(self.spec.concurrency):
            self.env.process(self._user(u, submit))

    def _may_send(self) -> bool:
        spec, n = self.spec, len(self.requests)
        if spec.num_requests is not None and n >= spec.num_requests:
            return False
        if spec.duration_s is not None and self.env.now >= spec.duration_s:
            return False
        if n >= MAX_BUILT_REQUESTS:
            raise TwinferError(f"duration_s: the closed loop sent {n:,} requests before {spec.duration_s:g} s; at most "
                               f"{MAX_BUILT_REQUESTS:,} are kept (set num_requests, or a shorter duration_s)")
        return True

    def _user(self, u: int, submit: Callable[[Request], None]):
        """simpy process of user ``u``: send, wait for the end, think, repeat while the run allows."""
        env, k = self.env, 0
        while self._may_send():
            d = self.content.draw(u, k)
            req = Request(f"r{len(self.requests)}", float(env.now), d.prompt_len, d.output_len, d.block_hashes,
                          d.priority, f"u{u}")
            self.requests.append(req)
            end = self._turn_ends[req.request_id] = env.event()
            submit(req)
            yield end
            if d.think_s > 0:
                yield env.timeout(d.think_s)
            k += 1

    def _done(self, req: Request) -> None:
        end = self._turn_ends.pop(req.request_id, None)
        if end is None:
            return
        end.succeed()
        instant = req.finish_time is None and req.arrival_time == self.env.now
        self._instant_drops = self._instant_drops + 1 if instant else 0
        if self._instant_drops > MAX_INSTANT_DROPS and self.spec.num_requests is None:
            raise TwinferError(f"workload: {self._instant_drops:,} closed-loop requests in a row were refused on arrival at "
                               f"t={self.env.now:g} s ({req.drop_reason}); the run cannot advance (fix the lengths, "
                               "or set num_requests)")


class OpenLoop:
    """A pre-generated arrival list behind ClosedLoop's interface: nothing to watch, nothing to start."""

    def __init__(self, requests: list[Request]):
        self.requests = self.initial = requests

    def watch(self, metrics):
        return metrics

    def start(self, submit) -> None:
        pass


def arrival_source(env: simpy.Environment, spec: WorkloadSpec, rng: np.random.Generator, block_size: int,
                   requests: list[Request] | None = None) -> ClosedLoop | OpenLoop:
    """Where a run's requests come from: a closed loop for ``kind: closed`` (``requests``, if given, an empty list
    it fills as users send), else ``requests`` or the workload generated with ``rng``."""
    if spec.kind == "closed":
        return ClosedLoop(env, spec, rng, block_size, requests)
    return OpenLoop(requests if requests is not None else generate(spec, rng, block_size))
