"""A request and its lifecycle inside one serving instance."""

from __future__ import annotations

import enum
from operator import attrgetter


class RequestStatus(enum.Enum):
    WAITING = "waiting"        # queued, no KV held
    RUNNING = "running"        # holds KV; prefilling (chunks) or decoding
    PREEMPTED = "preempted"    # KV freed, will recompute prompt + generated tokens
    FINISHED = "finished"      # produced output_len tokens (or stopped)
    DROPPED = "dropped"        # refused, with drop_reason


_FIELDS = ("request_id", "arrival_time", "prompt_len", "output_len", "block_hashes", "priority", "session_id",
           "prompt_token_ids", "status", "num_computed_tokens", "num_output_tokens", "num_cached_tokens",
           "num_preemptions", "drop_reason", "output_token_ids", "first_scheduled_time", "first_token_time", "finish_time")


class Request:
    """One generation request as the scheduler sees it.

    Lengths are in tokens. ``block_hashes`` are chained content hashes of the prompt's
    full KV blocks (one per ``block_size`` tokens, a hash depending on the whole prefix), used
    by the prefix cache; empty means "no reuse possible".

    Fields: ``request_id``, ``arrival_time``, ``prompt_len``, ``output_len``, ``block_hashes``,
    ``priority`` (lower is served first under the priority policy), ``session_id``,
    ``prompt_token_ids`` (real token ids when an executor drives the scheduler; the simulator
    leaves them None); lifecycle state owned by the scheduler: ``status``,
    ``num_computed_tokens`` (tokens whose KV is in cache, prefix hits included),
    ``num_output_tokens``, ``num_cached_tokens`` (prompt tokens served by the prefix cache on
    first schedule), ``num_preemptions``, ``drop_reason``, ``output_token_ids``, ``block_ids``
    (paged-KV block ids holding this request's tokens, in order: the executor's block table; the
    leading ones may be shared prefix-cache blocks); timestamps set by the loop that drives the
    scheduler: ``first_scheduled_time``, ``first_token_time``, ``finish_time``.

    A plain class with ``__slots__`` (no per-request dict: a simulation holds millions), compared
    by identity.
    """

    __slots__ = ("request_id", "arrival_time", "prompt_len", "output_len", "block_hashes", "priority", "session_id",
                 "prompt_token_ids", "status", "_num_computed_tokens", "_num_output_tokens", "num_cached_tokens",
                 "num_preemptions", "drop_reason", "output_token_ids", "block_ids", "first_scheduled_time",
                 "first_token_time", "finish_time",
                 # scheduler bookkeeping: the DecodeBatch holding the token counters (or None) and the row
                 # there; admission order (the stable tie-break); leading blocks that are prefix-cache
                 # nodes; stop inserting this request's blocks into the prefix cache; KV blocks held by
                 # count after the named ``block_ids`` (CountedKV)
                 "_batch", "_slot", "_seq", "_cached_blocks", "_cache_done", "_anon_blocks")

    def __init__(self, request_id: str, arrival_time: float, prompt_len: int, output_len: int,
                 block_hashes: tuple[int, ...] = (), priority: int = 0, session_id: str | None = None,
                 prompt_token_ids: list[int] | None = None, status: "RequestStatus" = RequestStatus.WAITING,
                 num_computed_tokens: int = 0, num_output_tokens: int = 0, num_cached_tokens: int = 0,
                 num_preemptions: int = 0, drop_reason: str | None = None, output_token_ids: list[int] | None = None,
                 block_ids: list[int] | None = None, first_scheduled_time: float | None = None,
                 first_token_time: float | None = None, finish_time: float | None = None):
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.block_hashes = block_hashes
        self.priority = priority
        self.session_id = session_id
        self.prompt_token_ids = prompt_token_ids
        self.status = status
        self._num_computed_tokens = num_computed_tokens
        self._num_output_tokens = num_output_tokens
        self.num_cached_tokens = num_cached_tokens
        self.num_preemptions = num_preemptions
        self.drop_reason = drop_reason
        self.output_token_ids = [] if output_token_ids is None else output_token_ids
        self.block_ids = [] if block_ids is None else block_ids
        self.first_scheduled_time = first_scheduled_time
        self.first_token_time = first_token_time
        self.finish_time = finish_time
        self._batch = None
        self._slot = -1
        self._seq = 0
        self._cached_blocks = 0
        self._cache_done = False
        self._anon_blocks = 0

    def __repr__(self) -> str:
        return "Request(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in _FIELDS) + ")"

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV the request needs: prompt plus generated so far."""
        return self.prompt_len + self.num_output_tokens

    @property
    def remaining_output(self) -> int:
        """Output tokens still to generate."""
        return self.output_len - self.num_output_tokens

    @property
    def is_prefilling(self) -> bool:
        """True while prompt (or recompute) tokens remain to be computed."""
        return self.num_computed_tokens < self.num_tokens - (1 if self.num_output_tokens else 0)

    @property
    def is_finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.DROPPED)


# While a request is in an instance's decode batch, its two token counters live in that batch's numpy
# arrays (struct-of-arrays: one vectorised update per step instead of a Python loop over the batch; see
# scheduler/decode_batch.py). These properties keep ``req.num_computed_tokens`` and ``req.num_output_tokens``
# exact for every reader and writer either way (outside a batch they live in the ``_<name>`` slots).
def _batched_counter(name: str, column: int, doc: str) -> property:
    stored = attrgetter("_" + name)
    key = "_" + name

    def get(self: Request) -> int:
        batch = self._batch
        return stored(self) if batch is None else batch.value(self._slot, column)

    def set_(self: Request, value: int) -> None:
        batch = self._batch
        if batch is None:
            setattr(self, key, value)
        else:
            batch.set_value(self._slot, column, value)

    return property(get, set_, doc=doc)


# columns of scheduler.decode_batch.DecodeBatch (CTX, OUT)
Request.num_computed_tokens = _batched_counter("num_computed_tokens", 0, "Tokens whose KV is in cache (prefix hits included).")
Request.num_output_tokens = _batched_counter("num_output_tokens", 1, "Generated tokens so far.")


def new_requests(rows) -> list[Request]:
    """Requests from ``(request_id, arrival_time, prompt_len, output_len, block_hashes, priority)`` rows:
    the same objects ``Request(*row)`` builds (workload generation makes millions)."""
    return [Request(rid, arrival, prompt, output, hashes, prio) for rid, arrival, prompt, output, hashes, prio in rows]


THIS_REQUEST = " (this request: "   # where a refusal's own figures begin: runs count refusals by what precedes it


def this_request(detail: str) -> str:
    """A refusal reason's suffix with the request's own figures (``drop_kind`` leaves it out)."""
    return f"{THIS_REQUEST}{detail})"


def drop_kind(reason: str | None) -> str:
    """A refusal reason without the request's own figures: what every request refused alike shares, so a run counts
    them under one line (a run of 10,000 over-long prompts printed 10,000 lines, one per prompt length)."""
    return (reason or "unknown").split(THIS_REQUEST, 1)[0]
