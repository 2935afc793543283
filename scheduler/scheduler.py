"""The per-instance step scheduler: continuous batching, chunked prefill, preemption, multi-step decode.

vLLM v1 style: each step first gives every running decode its 1 + draft_len tokens, then spends the
rest of the token budget on running partial prefills and then on waiting requests (FCFS or
priority). When KV blocks run out, the latest-arrived running request is preempted: its KV is
freed and it later recomputes prompt + generated tokens. The same code drives the simulator and
the GPU server; only the backend that runs the plan differs.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from scheduler.block_manager import BlockManager
from scheduler.config import SchedulerConfig
from scheduler.decode_batch import DecodeBatch
from scheduler.kv_tiers import KVTiers
from scheduler.plan import ScheduledChunk, StepPlan, StepResult
from scheduler.request import Request, RequestStatus

# reductions without ndarray.sum/min's Python wrappers (same results; these run every step)
_sum, _min = np.add.reduce, np.minimum.reduce


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot of one scheduler's queues, KV usage and cache/preemption counters."""

    num_running: int
    num_waiting: int
    num_decoding: int
    num_prefilling: int
    kv_used_blocks: int        # not free: held by requests or kept by the prefix cache
    kv_held_blocks: int        # held by running requests
    kv_total_blocks: int
    prefix_query_tokens: int   # prompt tokens looked up on first admission
    prefix_hit_tokens: int     # of which served from the cache
    num_preemptions: int
    num_dropped: int
    num_finished: int
    outstanding_tokens: int

    @property
    def kv_usage(self) -> float:
        return self.kv_used_blocks / self.kv_total_blocks if self.kv_total_blocks else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0


class Scheduler:
    """Turns queued requests into StepPlans and applies StepResults (one serving instance)."""

    def __init__(self, config: SchedulerConfig, num_kv_blocks: int, instance_id: int = 0, *, name_all_blocks: bool = True):
        """``name_all_blocks=False`` (the simulator) names only blocks that can enter the prefix cache
        and counts the rest; scheduling decisions are identical either way."""
        self.config = config
        self.name_all_blocks = name_all_blocks
        self.instance_id = instance_id
        self.block_size = config.block_size
        self.blocks = BlockManager(num_kv_blocks, config.block_size, config.enable_prefix_caching)
        self.tiers = KVTiers(config.host_cache_blocks, config.storage_cache_blocks) if config.enable_prefix_caching else None
        if self.tiers is not None and self.tiers.enabled:
            self.blocks.cache.on_evict = self.tiers.on_evicted
        else:
            self.tiers = None
        # the simulator without drafts keeps decode KV implicit (DecodeBatch's block_size argument)
        implicit = not name_all_blocks and config.draft_len == 0
        self.batch = DecodeBatch(config.max_num_seqs, config.block_size if implicit else None)
        self._lazy_contexts = not name_all_blocks   # plans of the simulator read decode contexts on demand
        self.prefilling: list[Request] = []          # running, prompt (or recompute) not done; admission order
        self._fifo: deque[Request] = deque()         # waiting, policy fcfs
        self._prefilled: deque[Request] = deque()    # waiting, prompt KV computed elsewhere (add_prefilled)
        self._heap: list[tuple[int, float, int, Request]] = []  # waiting, policy priority
        self._priority = config.policy == "priority"
        self._live: dict[str, Request] = {}          # waiting + running, by id
        self._next_seq = 0
        self._in_flight: StepPlan | None = None
        # fewest output tokens any decode of the plan in flight had left (decode runs), else None
        self._in_flight_min_left: int | None = None
        self._pending_aborts: list[Request] = []
        self._tokens_per_decode = 1 + config.draft_len
        w = config.host_workers  # per-rank schedulers work on their shares in parallel
        self._host_coeffs = (config.host_step_s, config.host_per_request_s / w, config.host_per_token_s / w)
        self._last_now = float("-inf")
        # tokens of work not yet done: whole prompt until its first token, then the remaining output
        self.outstanding_tokens = 0
        self.num_preemptions = 0
        self.num_dropped = 0
        self.num_finished = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    # ----------------------------------------------------------------- queue in
    @property
    def capacity_tokens(self) -> int:
        """KV tokens this instance can hold."""
        return self.blocks.num_blocks * self.block_size

    @property
    def num_waiting(self) -> int:
        return len(self._live) - self.num_running

    @property
    def num_running(self) -> int:
        return len(self.batch.reqs) + len(self.prefilling)

    @property
    def has_work(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self._live)

    def refusal_reason(self, req: Request) -> str | None:
        """Why ``req`` can never be served by this instance, or None."""
        cfg = self.config
        if req.prompt_len < 1 or req.output_len < 1:
            return f"prompt_len={req.prompt_len} and output_len={req.output_len} must both be >= 1"
        total = req.prompt_len + req.output_len
        if total > cfg.max_model_len:
            return f"prompt_len + output_len = {total} exceeds max_model_len={cfg.max_model_len}"
        need = -(-(total + cfg.draft_len) // self.block_size)
        if need > self.blocks.num_blocks:
            return (
                f"needs {need} KV blocks for {total} tokens (+{cfg.draft_len} draft), "
                f"the instance has {self.blocks.num_blocks} ({self.capacity_tokens} tokens)"
            )
        if not cfg.enable_chunked_prefill and req.prompt_len > cfg.max_num_batched_tokens:
            return (
                f"prompt_len={req.prompt_len} exceeds max_num_batched_tokens={cfg.max_num_batched_tokens} "
                "and chunked prefill is off"
            )
        return None

    def _register(self, req: Request) -> bool:
        """Admission shared by both entry points: drop what can never be served, else mark it live."""
        reason = self.refusal_reason(req)
        if reason is not None:
            req.status = RequestStatus.DROPPED
            req.drop_reason = reason
            self.num_dropped += 1
            return False
        if req.request_id in self._live:
            raise ValueError(f"request id {req.request_id!r} is already queued on instance {self.instance_id}")
        req._seq = self._next_seq
        self._next_seq += 1
        req.status = RequestStatus.WAITING
        self._live[req.request_id] = req
        return True

    def add_request(self, req: Request) -> bool:
        """Queue ``req``; False (and status DROPPED with a reason) if it can never be served."""
        if not self._register(req):
            return False
        self._push_waiting(req, front=False)
        self.outstanding_tokens += req.prompt_len + req.output_len - req.num_output_tokens
        return True

    def add_prefilled(self, req: Request) -> bool:
        """Queue a request whose prompt KV was computed elsewhere (a prefill instance) and has arrived here.

        ``req`` carries ``num_computed_tokens`` (the prompt) and ``num_output_tokens`` (the first
        token, sampled by the prefill instance). It joins the decode batch, holding blocks for its
        KV, as soon as a seat and the blocks are free (before any waiting prompt: its KV is
        already paid for). False (and DROPPED with a reason) if it can never be served.
        """
        if not self._register(req):
            return False
        self._prefilled.append(req)
        self.outstanding_tokens += req.output_len - req.num_output_tokens
        return True

    def _admit_prefilled(self, now: float) -> None:
        """Move queued prefilled requests into the decode batch while seats and KV blocks last (arrival order)."""
        bs = self.block_size
        while self._prefilled and self.num_running < self.config.max_num_seqs:
            req = self._prefilled[0]
            need = -(-req.num_computed_tokens // bs)
            if need > self.blocks.num_free:
                break
            self._prefilled.popleft()
            req.block_ids = []
            req._anon_blocks = 0
            req._cached_blocks = 0
            req._cache_done = True  # the transferred KV is not offered to this instance's prefix cache
            self._grow_request(req, need)
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            self.batch.add(req, bs)

    def abort(self, request_id: str) -> Request | None:
        """Drop a queued or running request (reason 'aborted'); returns it, or None if unknown."""
        req = self._live.get(request_id)
        if req is None:
            return None
        if req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            if req in self._prefilled:
                self._prefilled.remove(req)
            elif self._priority:
                self._heap = [e for e in self._heap if e[3] is not req]
                heapq.heapify(self._heap)
            else:
                self._fifo.remove(req)
            self._retire(req, RequestStatus.DROPPED, None)
            req.drop_reason = "aborted"
        elif self._in_flight is not None:
            self._pending_aborts.append(req)  # its slot is in the plan being run; drop it in complete()
        else:
            self._retire(req, RequestStatus.DROPPED, None)
            req.drop_reason = "aborted"
        return req

    # ----------------------------------------------------------------- plan out
    def schedule(self, now: float, max_steps: int = 1) -> StepPlan:
        """The next plan: decodes first, then prefill chunks; up to ``max_steps`` steps if decode-only."""
        if self._in_flight is not None:
            raise RuntimeError("schedule() called before complete() of the previous plan")
        if max_steps < 1:
            raise ValueError(f"max_steps={max_steps} must be >= 1")
        if self._prefilled:
            self._admit_prefilled(now)
        if max_steps > 1 and self.batch.reqs and not self.prefilling and not self._has_waiting():
            plan = self._schedule_decode_run(max_steps)
            if plan is not None:
                return plan
        cfg = self.config
        bs = self.block_size
        s = self._tokens_per_decode
        blocks = self.blocks
        batch = self.batch
        budget = cfg.max_num_batched_tokens
        preempted: list[Request] = []

        # 1. every running decode gets its next step; preempt the latest arrivals until KV suffices
        if batch.reqs:
            while True:
                need, total = batch.blocks_needed(s, bs)
                if total <= blocks.num_free:
                    break
                self._preempt(self._pick_victim(), preempted)
            self._grow_decodes(need, total)
            budget -= len(batch.reqs) * s

        # 2. running partial prefills (chunked prompts, recomputes), oldest admission first
        chunks: list[ScheduledChunk] = []
        threshold = cfg.long_prefill_threshold or budget
        for req in list(self.prefilling):
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted a moment ago by an older request
            done = req.num_computed_tokens
            chunk = min(req.num_tokens - done, budget, threshold)
            stop = False
            while True:
                need_n = -(-(done + chunk) // bs) - len(req.block_ids) - req._anon_blocks
                if need_n <= blocks.num_free:
                    break
                victim = self._pick_victim()
                if victim._batch is not None:
                    budget += s  # its decode slot is given back
                else:
                    for c in chunks:  # it may already hold a chunk of this plan: take it back
                        if c.request is victim:
                            budget += c.num_new_tokens
                            chunks.remove(c)
                            break
                self._preempt(victim, preempted)
                if victim is req:
                    stop = True
                    break
            if stop:
                break
            if need_n > 0:
                self._grow_request(req, need_n)
            chunks.append(ScheduledChunk(req, chunk, done, done + chunk == req.num_tokens))
            budget -= chunk

        # 3. waiting requests, in policy order, while budget, seats and KV last (never after a preemption)
        loaded = [0, 0]
        if not preempted:
            cache = blocks.cache
            max_seqs = cfg.max_num_seqs
            chunked = cfg.enable_chunked_prefill
            fifo = not self._priority
            while budget > 0 and self.num_running < max_seqs:
                req = self._fifo[0] if fifo and self._fifo else self._peek_waiting()
                if req is None:
                    break
                out_tokens = req.num_output_tokens
                num_tokens = req.prompt_len + out_tokens
                lh = ls = 0
                if req.block_hashes and (cache is not None or self.tiers is not None):
                    hits = []
                    if cache is not None:
                        # at least one token must be computed to produce logits, so never hit the whole prompt
                        hits = cache.match(req.block_hashes, (num_tokens - 1) // bs)
                    # blocks past the HBM hits that lower tiers hold: loaded back instead of recomputed
                    if self.tiers is not None:
                        lh, ls = self.tiers.match(req.block_hashes, len(hits), (num_tokens - 1) // bs)
                    held = (len(hits) + lh + ls) * bs
                    # sliding-window bounded replay: the cached prefix's last tokens are recomputed (into the
                    # blocks it already holds) because their window KV was not kept with the prefix
                    hit_tokens = held - (min(cfg.swa_replay_tokens, held) if held else 0)
                else:
                    hits = []
                    hit_tokens = 0
                todo = num_tokens - hit_tokens
                if chunked or out_tokens:  # recomputes may always chunk
                    chunk = min(todo, budget, threshold)
                elif todo > budget:
                    break
                else:
                    chunk = todo
                need_n = max(0, -(-(hit_tokens + chunk) // bs) - len(hits))
                pinned_free = cache.count_unused(hits) if hits else 0
                if need_n > blocks.num_free - pinned_free:
                    break
                self._pop_waiting()
                if lh or ls:
                    self.tiers.take(req.block_hashes[len(hits): len(hits) + lh + ls])
                    loaded[0] += lh
                    loaded[1] += ls
                if hits:
                    blocks.pin(hits)
                req._cached_blocks = len(hits)
                req.block_ids = hits
                req._anon_blocks = 0
                if need_n:
                    self._grow_request(req, need_n)
                req._cache_done = False
                req._num_computed_tokens = hit_tokens  # (waiting: not in the decode batch)
                if req.num_preemptions == 0:
                    req.num_cached_tokens = hit_tokens
                    if cache is not None:
                        self.prefix_query_tokens += req.prompt_len
                        self.prefix_hit_tokens += hit_tokens
                req.status = RequestStatus.RUNNING
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
                self.prefilling.append(req)
                chunks.append(ScheduledChunk(req, chunk, hit_tokens, hit_tokens + chunk == num_tokens))
                budget -= chunk

        # 4. decode-only: run k identical-composition steps if nobody can finish and KV lasts (not
        # right after a preemption: the next step may re-admit the preempted request)
        steps = 1
        if max_steps > 1 and batch.n and not chunks and not preempted:
            steps = self._decode_horizon(max_steps)
        plan = self._make_plan(chunks, steps, preempted)
        if loaded[0] or loaded[1]:
            plan.loaded_blocks = (loaded[0], loaded[1])
        return plan

    def _schedule_decode_run(self, max_steps: int) -> StepPlan | None:
        """Fast path when only decodes run: k steps if their KV is free now, else None (general path)."""
        batch, s = self.batch, self._tokens_per_decode
        min_left = batch.min_left()
        k = min(max_steps, (min_left - 1) // s + 1)
        need, total = batch.blocks_needed(k * s, self.block_size)
        if total > self.blocks.num_free:
            return None
        self._grow_decodes(need, total)  # (with nothing to add, an implicit batch still notes the k steps reserved)
        plan = self._make_plan([], k, [])
        self._in_flight_min_left = min_left
        return plan

    def _make_plan(self, chunks: list[ScheduledChunk], steps: int, preempted: list[Request]) -> StepPlan:
        """Freeze the current decode batch and ``chunks`` into the plan in flight."""
        batch = self.batch
        n = len(batch.reqs)
        num_tokens = n * self._tokens_per_decode
        if chunks:
            if len(chunks) == 1:
                num_tokens += chunks[0].num_new_tokens
            else:
                num_tokens += sum(c.num_new_tokens for c in chunks)
        h0, h_req, h_tok = self._host_coeffs
        # positional: instance_id, prefills, decodes, decode_context_lens, num_steps, draft_len,
        # host_overhead_s, preempted, loaded_blocks, decode_context_sum
        plan = StepPlan(self.instance_id, chunks, batch.reqs[:], None if self._lazy_contexts else batch.context_lens(), steps,
                        self._tokens_per_decode - 1, h0 + h_req * (n + len(chunks)) + h_tok * num_tokens, preempted, (0, 0),
                        batch.context_sum())
        if self._lazy_contexts:   # the simulator's backends mostly need only the sum: copy the contexts when read
            plan.contexts_from(batch, batch.version)
        if n or chunks:
            self._in_flight = plan
        self._in_flight_min_left = None
        return plan

    def _decode_horizon(self, max_steps: int) -> int:
        """Reserve KV for, and return, the most steps (<= max_steps) a decode-only plan may run.

        No decode may finish before the last step (after k-1 steps a request has made at most
        (k-1)*(1+draft_len) tokens; it must still have some left), and the blocks for all k steps
        must be free now. Step 1's blocks are already reserved.
        """
        batch, s, bs = self.batch, self._tokens_per_decode, self.block_size
        k = min(max_steps, (batch.min_left() - 1) // s + 1)
        if k <= 1:
            return 1
        free = self.blocks.num_free

        def need(steps: int) -> tuple[np.ndarray, int]:
            return batch.blocks_needed(steps * s, bs)

        blocks, total = need(k)
        if total > free:
            lo, hi = 1, k  # need(lo) fits (step 1 is reserved), need(hi) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if need(mid)[1] <= free:
                    lo = mid
                else:
                    hi = mid
            k = lo
            if k == 1:
                return 1
            blocks, total = need(k)
        self._grow_decodes(blocks, total)
        return k

    def _grow_request(self, req: Request, n: int) -> None:
        """Give a request that is not decoding ``n`` more blocks, named where the prefix cache may need them."""
        if self.name_all_blocks:
            req.block_ids.extend(self.blocks.allocate(n))
            return
        named = 0
        if self.blocks.cache is not None and not req._anon_blocks:
            named = max(0, min(n, len(req.block_hashes) - len(req.block_ids)))
        if named:
            req.block_ids.extend(self.blocks.allocate(named))
        if n > named:
            self.blocks.reserve(n - named)
            req._anon_blocks += n - named

    def _grow_decodes(self, need: np.ndarray, total: int) -> None:
        """Give each decode slot ``need[slot]`` more blocks, ``total`` in all (one allocation, split in slot order)."""
        if total == 0:
            if self.batch.implicit:
                self.batch.grow(need, self.block_size)  # records the tokens reserved ahead
            return
        if self.name_all_blocks:
            ids = self.blocks.allocate(total)
            reqs = self.batch.reqs
            pos = 0
            rows = need.nonzero()[0]
            for i, k in zip(rows.tolist(), need[rows].astype(np.int64).tolist()):
                reqs[i].block_ids.extend(ids[pos : pos + k])
                pos += k
        else:  # decode growth never enters the prefix cache: count it
            self.blocks.reserve(total)
        self.batch.grow(need, self.block_size)

    def _trim_decode_blocks(self, nd: int, last_tokens: np.ndarray | int) -> None:
        """After a multi-step plan, hand back blocks reserved for steps not run or drafts not accepted.

        Each decode keeps what a single-step plan would hold after the same last step (blocks for
        its context before that step plus 1 + draft_len tokens), so a k-step plan, even one cut
        short, leaves the KV state that k single steps would leave.
        """
        batch, bs, s = self.batch, self.block_size, self._tokens_per_decode
        if batch.implicit:  # every decode keeps the blocks of its context: drop what is reserved ahead
            total = batch.trim_ahead()
            if total:
                self.blocks.unreserve(total)
            return
        room = batch.room[:nd]
        if s == 1 and not self.name_all_blocks:
            # room and the single-step room agree mod bs; the latter is < bs: keep room mod bs
            before = int(_sum(room))
            room %= bs
            total = (before - int(_sum(room))) // bs
            if total:
                self.blocks.unreserve(total)  # the tail blocks of a decode are the counted ones
            return
        if s == 1:
            excess = room // bs
        else:
            ctx = batch.ctx[:nd]
            before = ctx - last_tokens
            keep_room = (before + (s + bs - 1)) // bs * bs - ctx
            excess = (room - keep_room) // bs
        np.maximum(excess, 0, out=excess)
        total = int(_sum(excess))
        if total == 0:
            return
        if self.name_all_blocks:
            reqs, release = batch.reqs, self.blocks.release
            rows = excess.nonzero()[0]
            for i, k in zip(rows.tolist(), excess[rows].tolist()):
                ids = reqs[i].block_ids
                release(ids[-k:])
                del ids[-k:]
        else:  # the tail blocks of a decode are the counted ones
            self.blocks.unreserve(total)
        excess *= bs
        room -= excess

    # ----------------------------------------------------------------- result in
    def complete(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply the ``result.num_steps`` executed steps of ``plan`` at time ``now``; returns finished requests."""
        if plan is not self._in_flight:
            raise RuntimeError("complete() got a plan that is not the one in flight")
        if now < self._last_now:
            raise RuntimeError(f"time went backwards: {now} < {self._last_now}")
        self._last_now = now
        self._in_flight = None
        steps = len(result.step_durations)
        if steps > plan.num_steps:
            raise ValueError(f"result has {steps} steps, the plan only {plan.num_steps}")
        finished: list[Request] = []
        early = result.finished_early
        sampled = result.sampled_token_ids
        batch = self.batch

        nd = len(plan.decodes)
        if nd and steps:
            if self._tokens_per_decode == 1:
                # no drafts: every decode made exactly one token per step, and the plan's horizon
                # guarantees nobody had fewer than ``steps`` left
                tok: np.ndarray | int = steps
                last: np.ndarray | int = 1
                self.outstanding_tokens -= steps * nd
            else:
                dt = result.decode_tokens
                last = dt[steps - 1]
                tok = dt[0] if steps == 1 else dt[:steps].sum(axis=0)
                tok = np.minimum(tok, batch.left[:nd])  # drafts past the last wanted token are discarded
                self.outstanding_tokens -= int(tok.sum())
            batch.add_tokens(nd, tok)
            if plan.num_steps > 1 and (steps < plan.num_steps or self._tokens_per_decode > 1):
                self._trim_decode_blocks(nd, last)
            if sampled is not None:
                for i, r in enumerate(plan.decodes):
                    ids = sampled.get(r.request_id)
                    if ids:
                        r.output_token_ids.extend(ids[: tok if isinstance(tok, int) else int(tok[i])])
            min_left = self._in_flight_min_left
            if min_left is not None and isinstance(tok, int) and steps < min_left:
                done = []  # one token a step each: nobody reached the end
            elif batch.min_left() > 0:
                done = []
            else:
                done = batch.finished_slots(nd)
            if early:
                done = sorted(set(done) | {r._slot for r in plan.decodes if r.request_id in early})
            for slot in reversed(done):  # highest row first: swap-removal keeps lower rows in place
                req = batch.reqs[slot]
                self._retire(req, RequestStatus.FINISHED, now)
                finished.append(req)

        if steps and plan.prefills:
            for c in plan.prefills:
                req = c.request
                if req.status is not RequestStatus.RUNNING:
                    continue
                # a prefilling request holds its own counters (it joins the decode batch below)
                req._num_computed_tokens = c.context_len + c.num_new_tokens
                if req.block_hashes and not req._cache_done and self.blocks.cache is not None:
                    self._cache_computed_blocks(req)
                if not c.is_last_chunk:
                    continue
                out = req._num_output_tokens
                if out == 0:
                    self.outstanding_tokens -= req.prompt_len + 1
                else:
                    self.outstanding_tokens -= 1
                req._num_output_tokens = out = out + 1
                if sampled is not None:
                    req.output_token_ids.extend(sampled.get(req.request_id, [])[:1])
                if req.first_token_time is None:
                    req.first_token_time = now
                if out >= req.output_len or (early and req.request_id in early):
                    self._retire(req, RequestStatus.FINISHED, now)
                    finished.append(req)
                else:
                    self.prefilling.remove(req)
                    batch.add(req, self.block_size)

        if self._pending_aborts:
            for req in self._pending_aborts:
                if req.request_id in self._live:
                    self._retire(req, RequestStatus.DROPPED, None)
                    req.drop_reason = "aborted"
            self._pending_aborts = []
        return finished

    def _cache_computed_blocks(self, req: Request) -> None:
        """Insert the request's newly completed full prompt blocks into the prefix cache."""
        cache = self.blocks.cache
        full = min(len(req.block_hashes), req.num_computed_tokens // self.block_size)
        i = req._cached_blocks
        ids, hashes = req.block_ids, req.block_hashes
        while i < full:
            if not cache.insert(ids[i - 1] if i else -1, hashes[i], ids[i]):
                # another request cached this content first: keep ours private and stop here, so a
                # request's cached blocks are always one chain from the root that it holds
                req._cache_done = True
                break
            i += 1
        req._cached_blocks = i

    # ----------------------------------------------------------------- lifecycle helpers
    def _retire(self, req: Request, status: RequestStatus, now: float | None) -> None:
        """Take ``req`` out of the running/waiting sets, free its KV, and mark it finished or dropped."""
        if req._batch is not None:
            self.batch.remove(req, self.block_size)
        elif req.status is RequestStatus.RUNNING:
            self.prefilling.remove(req)
        self._free_blocks(req)
        out = req.num_output_tokens
        self.outstanding_tokens -= req.output_len - out + (req.prompt_len if out == 0 else 0)
        req.status = status
        if now is not None:
            req.finish_time = now
        if status is RequestStatus.FINISHED:
            self.num_finished += 1
        else:
            self.num_dropped += 1
        del self._live[req.request_id]

    def _free_blocks(self, req: Request) -> None:
        """Release all KV blocks of a request that left the running set."""
        if req.block_ids:
            self.blocks.release(req.block_ids)
            req.block_ids = []
        if req._anon_blocks:
            self.blocks.unreserve(req._anon_blocks)
            req._anon_blocks = 0

    def _preempt(self, req: Request, preempted: list[Request]) -> None:
        """Free ``req``'s KV and put it back at the head of the queue to recompute later."""
        if req._batch is not None:
            self.batch.remove(req, self.block_size)
        else:
            self.prefilling.remove(req)
        self._free_blocks(req)
        req.num_computed_tokens = 0
        req._cached_blocks = 0
        req._cache_done = False
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._push_waiting(req, front=True)
        preempted.append(req)

    def _pick_victim(self) -> Request:
        """The running request to preempt: the latest arrival (lowest priority first under 'priority')."""
        if self._priority:
            key = lambda r: (r.priority, r.arrival_time, r._seq)  # noqa: E731
        else:
            key = lambda r: (r.arrival_time, r._seq)  # noqa: E731
        cands = [max(x, key=key) for x in (self.prefilling, self.batch.reqs) if x]
        return max(cands, key=key)

    def _push_waiting(self, req: Request, front: bool) -> None:
        if self._priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_time, req._seq, req))
        elif front:
            self._fifo.appendleft(req)
        else:
            self._fifo.append(req)

    def _has_waiting(self) -> bool:
        return bool(self._heap) if self._priority else bool(self._fifo)

    def _peek_waiting(self) -> Request | None:
        if self._priority:
            return self._heap[0][3] if self._heap else None
        return self._fifo[0] if self._fifo else None

    def _pop_waiting(self) -> None:
        if self._priority:
            heapq.heappop(self._heap)
        else:
            self._fifo.popleft()

    # ----------------------------------------------------------------- introspection
    def stats(self) -> SchedulerStats:
        """Current queue sizes, KV usage and counters."""
        b = self.blocks
        return SchedulerStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_decoding=self.batch.n,
            num_prefilling=len(self.prefilling),
            kv_used_blocks=b.num_used,
            kv_held_blocks=b.num_held,
            kv_total_blocks=b.num_blocks,
            prefix_query_tokens=self.prefix_query_tokens,
            prefix_hit_tokens=self.prefix_hit_tokens,
            num_preemptions=self.num_preemptions,
            num_dropped=self.num_dropped,
            num_finished=self.num_finished,
            outstanding_tokens=self.outstanding_tokens,
        )

    def prefix_match_tokens(self, req: Request) -> int:
        """Prompt tokens of ``req`` this instance's prefix cache holds now (for cache-aware routing)."""
        cache = self.blocks.cache
        if cache is None or not req.block_hashes:
            return 0
        return len(cache.match(req.block_hashes, len(req.block_hashes))) * self.block_size
