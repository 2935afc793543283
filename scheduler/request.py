"""A request and its lifecycle inside one serving instance."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestStatus(enum.Enum):
    WAITING = "waiting"        # queued, no KV held
    RUNNING = "running"        # holds KV; prefilling (chunks) or decoding
    PREEMPTED = "preempted"    # KV freed, will recompute prompt + generated tokens
    FINISHED = "finished"      # produced output_len tokens (or stopped)
    DROPPED = "dropped"        # refused, with drop_reason


@dataclass(eq=False)
class Request:
    """One generation request as the scheduler sees it.

    Lengths are in tokens. ``block_hashes`` are chained content hashes of the prompt's
    full KV blocks (one per ``block_size`` tokens, a hash depending on the whole prefix), used
    by the prefix cache; empty means "no reuse possible".
    """

    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    block_hashes: tuple[int, ...] = ()
    priority: int = 0          # lower is served first under the priority policy
    session_id: str | None = None
    # real token ids when an executor drives the scheduler (the simulator leaves them None)
    prompt_token_ids: list[int] | None = None

    # --- lifecycle state, owned by the scheduler ---
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0   # tokens whose KV is in cache (prefix hits included)
    num_output_tokens: int = 0     # generated tokens so far
    num_cached_tokens: int = 0     # prompt tokens served by the prefix cache on first schedule
    num_preemptions: int = 0
    drop_reason: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    # paged-KV block ids holding this request's tokens, in order (the executor's block table);
    # the leading ones may be shared prefix-cache blocks
    block_ids: list[int] = field(default_factory=list, repr=False)

    # --- timestamps, set by the loop that drives the scheduler ---
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

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


# While a request is in an instance's decode batch, its two token counters live in that batch's
# numpy arrays (struct-of-arrays: one vectorised update per step instead of a Python loop over the
# batch; see scheduler/decode_batch.py). These properties keep ``req.num_computed_tokens`` and
# ``req.num_output_tokens`` exact for every reader and writer either way. The dataclass __init__
# assigns the fields through the setters, so constructor arguments keep working.
Request._batch = None   # the DecodeBatch holding the counters, or None (then they live in __dict__)
Request._slot = -1      # row in that batch
Request._seq = 0        # admission order inside a scheduler: the stable tie-break
Request._cached_blocks = 0  # leading blocks that are prefix-cache nodes (scheduler bookkeeping)
Request._cache_done = False  # stop inserting this request's blocks into the prefix cache
Request._anon_blocks = 0     # KV blocks held by count after the named ``block_ids`` (simulator)


def _batched_counter(name: str, column: int, doc: str) -> property:
    key = "_" + name

    def get(self: Request) -> int:
        batch = self._batch
        if batch is None:
            return self.__dict__[key]
        return batch.value(self._slot, column)

    def set_(self: Request, value: int) -> None:
        batch = self._batch
        if batch is None:
            self.__dict__[key] = value
        else:
            batch.set_value(self._slot, column, value)

    return property(get, set_, doc=doc)


def new_requests(rows) -> list[Request]:
    """Requests from ``(request_id, arrival_time, prompt_len, output_len, block_hashes, priority)`` rows:
    the same objects ``Request(*row)`` builds, without the per-field __init__ (workload generation
    makes millions)."""
    new, waiting = object.__new__, RequestStatus.WAITING
    out = []
    append = out.append
    for rid, arrival, prompt, output, hashes, prio in rows:
        r = new(Request)
        r.__dict__.update(
            request_id=rid, arrival_time=arrival, prompt_len=prompt, output_len=output, block_hashes=hashes,
            priority=prio, session_id=None, prompt_token_ids=None, status=waiting, _num_computed_tokens=0,
            _num_output_tokens=0, num_cached_tokens=0, num_preemptions=0, drop_reason=None, output_token_ids=[],
            block_ids=[], first_scheduled_time=None, first_token_time=None, finish_time=None)
        append(r)
    return out


# columns of scheduler.decode_batch.DecodeBatch (CTX, OUT)
Request.num_computed_tokens = _batched_counter(
    "num_computed_tokens", 0, "Tokens whose KV is in cache (prefix hits included)."
)
Request.num_output_tokens = _batched_counter("num_output_tokens", 1, "Generated tokens so far.")
