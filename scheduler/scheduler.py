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

from costmodels.replay import ResolvedReplay
from scheduler.config import SchedulerConfig
from scheduler.dp_attention import AttentionDPRanks
from scheduler.kv_manager import NO_MATCH, CountedKV, PagedKV
from scheduler.plan import ScheduledChunk, StepPlan, StepResult
from scheduler.request import Request, RequestStatus, this_request


def _delivered(made: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Per step and decode, the tokens of ``made`` (steps x decodes) a request keeps: its running total stops at
    ``left``, its output tokens still wanted (accepted drafts past its last token are never delivered)."""
    return np.diff(np.minimum(made.cumsum(axis=0), left), axis=0, prepend=0)


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

    def __init__(self, config: SchedulerConfig, num_kv_blocks: int, instance_id: int = 0, *, name_all_blocks: bool = True,
                 replay: ResolvedReplay | None = None):
        """``name_all_blocks=False`` (the simulator): KV held by count where no block id is needed
        (CountedKV, else PagedKV) and plans that read decode contexts on demand; scheduling decisions
        are identical either way. ``replay``: the sliding-window policy in force (``config.replay_for(model)``);
        None: ``config.swa_replay_tokens`` through every layer (needs ``config.replay`` unset)."""
        if replay is None and config.replay is not None:
            raise ValueError("SchedulerConfig.replay is set: pass Scheduler(..., replay=config.replay_for(model))")
        self.config = config
        self.instance_id = instance_id
        self.block_size = config.block_size
        self.kv = (PagedKV if name_all_blocks else CountedKV)(num_kv_blocks, config)
        self.replay = replay
        self.blocks = self.kv.blocks  # the block pool, for introspection (usage, invariant checks)
        self.batch = self.kv.new_decode_batch(config.max_num_seqs)
        self._no_decodes = self.kv.new_decode_batch(1)  # the (empty) decode batch of a prompts-only plan (mixed_batches off)
        self._prompts_only = False
        self._lazy_contexts = not name_all_blocks   # plans of the simulator read decode contexts on demand
        self.prefilling: list[Request] = []          # running, prompt (or recompute) not done; admission order
        self._fifo: deque[Request] = deque()         # waiting, policy fcfs
        self._prefilled: deque[Request] = deque()    # waiting, prompt KV computed elsewhere (add_prefilled)
        self._heap: list[tuple[int, float, int, Request]] = []  # waiting, policy priority
        self._priority = config.policy == "priority"
        self._live: dict[str, Request] = {}          # waiting + running, by id
        # simulator only (sim/instance.py): a pipelined engine scheduled this plan when its previous step started, so
        # a waiting request that arrived after this time (never preempted) does not start in it; None: no limit
        self.admit_before: float | None = None
        self._next_seq = 0
        self._in_flight: StepPlan | None = None
        # fewest output tokens any decode of the plan in flight had left (decode runs), else None
        self._in_flight_min_left: int | None = None
        self._pending_aborts: list[Request] = []
        self._tokens_per_decode = 1 + config.draft_len
        self._last_now = float("-inf")
        # tokens of work not yet done: whole prompt until its first token, then the remaining output
        self.outstanding_tokens = 0
        self.num_preemptions = 0
        self.num_dropped = 0
        self.num_finished = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        ad = config.attention_dp   # explicit attention-DP ranks (scheduler/dp_attention.py), else one pooled batch
        self.dp = AttentionDPRanks(config, num_kv_blocks) if ad is not None and (ad.ranks or 1) > 1 else None

    # ----------------------------------------------------------------- queue in
    @property
    def capacity_tokens(self) -> int:
        """KV tokens this instance can hold."""
        return self.kv.num_blocks * self.block_size

    @property
    def max_request_tokens(self) -> int:
        """Prompt + output tokens of the longest request this instance can ever admit: ``max_model_len``, or less
        where one request's KV (its attention-DP rank's share) cannot hold that many with its draft slots."""
        blocks = self.dp.kv_blocks if self.dp is not None else self.kv.num_blocks
        return min(self.config.request_tokens_limit, blocks * self.block_size - self.config.draft_len)

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
            return f"prompt_len and output_len must both be >= 1{this_request(f'prompt_len={req.prompt_len}, output_len={req.output_len}')}"
        total = req.prompt_len + req.output_len
        if total > cfg.request_tokens_limit:
            return f"prompt_len + output_len exceeds max_model_len={cfg.request_tokens_limit}{this_request(f'{total:,} tokens')}"
        need = -(-(total + cfg.draft_len) // self.block_size)
        if need > self.kv.num_blocks:
            return (f"needs more KV blocks than the instance has ({self.kv.num_blocks:,} blocks, {self.capacity_tokens:,} "
                    f"tokens){this_request(f'{need:,} blocks for {total:,} tokens + {cfg.draft_len} draft')}")
        if not cfg.enable_chunked_prefill and req.prompt_len > cfg.max_num_batched_tokens:
            return (f"prompt_len exceeds max_num_batched_tokens={cfg.max_num_batched_tokens} and chunked prefill is off"
                    f"{this_request(f'prompt_len={req.prompt_len:,}')}")
        return self.dp.refusal_reason(req) if self.dp is not None else None

    def _register(self, req: Request) -> bool:
        """Admission shared by both entry points: drop what can never be served, else mark it live. A prompt that
        fits with room for its first output token gets its output cut at the context window, as the executor's engine
        cuts it (``LLMEngine.add_request``) and vLLM / SGLang stop a sequence there (finish reason "length")."""
        room = self.config.request_tokens_limit - req.prompt_len
        if 1 <= room < req.output_len:
            req.output_len = room
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
        token, sampled by the prefill instance; its ``first_token_time`` is set when it joins the batch here, the
        time a client reading the decode instance's stream gets it). It joins the decode batch, holding blocks for its
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
        while self._prefilled and self.num_running < self.config.max_num_seqs:
            req = self._prefilled[0]
            # the transferred KV is not offered to this instance's prefix cache
            if not self.kv.admit(req, req.num_computed_tokens, cache=False):
                break
            self._prefilled.popleft()
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            if req.first_token_time is None:
                # the first token, sampled by the prefill instance, reaches the client through this instance: it is
                # streamed as the request joins the decode batch, after its KV transfer and any wait for a seat (a
                # P/D proxy's TTFT; the planner's screen prices prefill + queueing + transfer, plus a decode step)
                req.first_token_time = now
            self.batch.add(req)

    def abort(self, request_id: str) -> Request | None:
        """Drop a queued or running request (reason 'aborted'); returns it, or None if unknown."""
        req = self._live.get(request_id)
        if req is None:
            return None
        if req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self._dequeue(req)
            self._retire(req, RequestStatus.DROPPED, None)
            req.drop_reason = "aborted"
        elif self._in_flight is not None:
            self._pending_aborts.append(req)  # its slot is in the plan being run; drop it in complete()
        else:
            self._retire(req, RequestStatus.DROPPED, None)
            req.drop_reason = "aborted"
        return req

    def finish_late(self, request_id: str, num_output_tokens: int, now: float) -> Request | None:
        """Retire a request whose stop token a pipelined engine read back after it had already scheduled
        the request's next step (async overlap): finished, with only the ``num_output_tokens`` it keeps
        (the speculative one past the stop is dropped). None if unknown."""
        req = self._live.get(request_id)
        if req is None:
            return None
        if self._in_flight is not None:
            raise RuntimeError("finish_late() called while a plan is in flight")
        if req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            self._dequeue(req)
        self._retire(req, RequestStatus.FINISHED, now)   # (counts the speculative token as done: outstanding stays exact)
        req.num_output_tokens = num_output_tokens
        return req

    def _dequeue(self, req: Request) -> None:
        """Take a waiting request out of its queue."""
        if req in self._prefilled:
            self._prefilled.remove(req)
        elif self._priority:
            self._heap = [e for e in self._heap if e[3] is not req]
            heapq.heapify(self._heap)
        else:
            self._fifo.remove(req)

    # ----------------------------------------------------------------- plan out
    def schedule(self, now: float, max_steps: int = 1) -> StepPlan:
        """The next plan, in vLLM v1's order, of up to ``max_steps`` steps when only decodes run:

        1. prefilled requests (prompt KV computed elsewhere) join the decode batch while seats and KV last;
        2. if only decodes can run, reserve KV for the steps before the first can finish, if free now;
        3. otherwise every running decode gets its next step (preempting the latest arrivals for KV),
        4. running partial prefills continue, then waiting requests start, while budget lasts;
        5. a decode-only plan runs several steps where KV lasts.
        """
        if self._in_flight is not None:
            raise RuntimeError("schedule() called before complete() of the previous plan")
        if max_steps < 1:
            raise ValueError(f"max_steps={max_steps} must be >= 1")
        if self._prefilled:
            self._admit_prefilled(now)
        if max_steps > 1 and self.batch.reqs and not self.prefilling and not (self._fifo or self._heap):
            plan = self._schedule_decode_run(max_steps)
            if plan is not None:
                return plan
        preempted: list[Request] = []
        mixed = self.config.mixed_batches or not self.batch.reqs
        if not mixed and (self.prefilling or self._fifo or self._heap):
            plan = self._schedule_prompts_only(now, preempted)
            if plan is not None:
                return plan
        budget = self.config.max_num_batched_tokens
        if self.batch.reqs:
            budget -= self._schedule_decodes(preempted)
        if self.dp is not None:
            self.dp.begin_step(self.batch.reqs, True, self._tokens_per_decode)
        cap = self.config.long_prefill_threshold or budget  # most prompt tokens of one request per step
        chunks: list[ScheduledChunk] = []
        if self.prefilling and mixed:
            budget = self._schedule_prefills(chunks, budget, cap, preempted)
        loaded = (0, 0)
        # never start a waiting request right after a preemption (the next step may re-admit the victim)
        if not preempted and (self._fifo or self._heap) and mixed:
            loaded = self._schedule_waiting(now, chunks, budget, cap)
        steps = 1
        # (waiting requests held back by admit_before start next step: this plan is one step too)
        if max_steps > 1 and self.batch.n and not chunks and not preempted \
                and not (self.admit_before is not None and (self._fifo or self._heap)) \
                and not (self.dp is not None and self.dp.holding):
            steps = self._decode_horizon(max_steps)   # (a step that holds prompts is one step: the policy counts steps)
        return self._make_plan(chunks, steps, preempted, loaded)

    def _schedule_prompts_only(self, now: float, preempted: list[Request]) -> StepPlan | None:
        """Prefill-first (``mixed_batches`` off: vLLM v0, SGLang): a plan of prompt work alone while the
        decodes wait; None when no prompt can be scheduled (the decodes then run)."""
        budget = self.config.max_num_batched_tokens
        cap = self.config.long_prefill_threshold or budget
        chunks: list[ScheduledChunk] = []
        if self.dp is not None:
            self.dp.begin_step(self.batch.reqs, False, self._tokens_per_decode)
        if self.prefilling:
            self._prompts_only = True  # a preempted decode gives back no budget: it held none in this plan
            try:
                budget = self._schedule_prefills(chunks, budget, cap, preempted)
            finally:
                self._prompts_only = False
        loaded = (0, 0)
        if not preempted and (self._fifo or self._heap):
            loaded = self._schedule_waiting(now, chunks, budget, cap)
        if not chunks:
            return None
        return self._make_plan(chunks, 1, preempted, loaded, with_decodes=False)

    def _schedule_decode_run(self, max_steps: int) -> StepPlan | None:
        """Only decodes can run: k steps, the first decode finishing in the last, if their KV is free now
        (else None: the general path preempts for one step)."""
        batch, s = self.batch, self._tokens_per_decode
        min_left = batch.min_left()
        k = min(max_steps, (min_left - 1) // s + 1)
        if not self.kv.reserve_decodes(batch, k * s):
            return None
        plan = self._make_plan([], k, [], (0, 0))
        self._in_flight_min_left = min_left
        return plan

    def _schedule_decodes(self, preempted: list[Request]) -> int:
        """Reserve every running decode's next step, preempting the latest arrivals until the KV fits;
        returns the tokens the decodes take."""
        batch, s = self.batch, self._tokens_per_decode
        while not self.kv.reserve_decodes(batch, s):
            self._preempt(self._pick_victim(), preempted)
        return len(batch.reqs) * s

    def _schedule_prefills(self, chunks: list[ScheduledChunk], budget: int, cap: int, preempted: list[Request]) -> int:
        """Running partial prefills (chunked prompts, recomputes), oldest admission first, each a chunk of
        at most ``cap`` tokens: preempt the latest arrivals until its KV fits (stop if that is itself).
        Returns the budget left."""
        kv = self.kv
        for req in list(self.prefilling):
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted a moment ago by an older request
            done = req.num_computed_tokens
            new = min(req.num_tokens - done, budget, cap)
            if self.dp is not None:
                new = min(new, self.dp.room(req))
                if new <= 0:
                    continue   # its attention-DP rank's step budget is spent
            replayed = self.resume_tokens(done)  # the next chunk resumes the prompt: its window state per the policy
            while not kv.grow(req, done + new):
                victim = self._pick_victim()
                budget += self._unschedule(victim, chunks)
                self._preempt(victim, preempted)
                if victim is req:
                    return budget
            chunks.append(ScheduledChunk(req, replayed + new, done - replayed, done + new == req.num_tokens, replayed))
            budget -= replayed + new
            if self.dp is not None:
                self.dp.spend(req, new)
        return budget

    def resume_tokens(self, context: int) -> int:
        """Tokens recomputed (over KV already held) to resume a prompt at ``context`` computed tokens: the replay
        policy's deepest requirement (costmodels/replay.py), carried through every layer of the step.

        The budget and the long-prefill cap size a chunk's new tokens; the replayed ones ride on top (they are
        the price of resuming, and a recompute over the whole context could not fit any budget)."""
        if context <= 0:
            return 0
        if self.replay is not None:
            return self.replay.carried_tokens(context)
        return min(self.config.swa_replay_tokens, context)

    def _unschedule(self, victim: Request, chunks: list[ScheduledChunk]) -> int:
        """Take ``victim``'s work out of the plan being built; returns the tokens given back."""
        if victim._batch is not None:
            return 0 if self._prompts_only else self._tokens_per_decode  # its decode slot (if this plan has decodes)
        for c in chunks:
            if c.request is victim:  # it already holds a chunk of this plan
                chunks.remove(c)
                return c.num_new_tokens
        return 0

    @staticmethod
    def _arrived_after(req: Request, t: float) -> bool:
        """Whether waiting ``req`` arrived after time ``t`` (a preempted request never did: it had started)."""
        return req.num_preemptions == 0 and req.arrival_time > t + 1e-9

    def has_work_by(self, t: float) -> bool:
        """Work that a plan scheduled at time ``t`` would hold: running or prefilled requests, or a waiting request that
        had arrived by then (or was preempted). Arrival order: the head of the queue decides."""
        if self.batch.reqs or self.prefilling or self._prefilled:
            return True
        head = self._peek_waiting()
        return head is not None and not self._arrived_after(head, t)

    def _schedule_waiting(self, now: float, chunks: list[ScheduledChunk], budget: int, cap: int) -> tuple[int, int]:
        """Start waiting requests in policy order while budget, seats and KV last: each past its cached
        prefix, a chunk that fits, its KV admitted, it prefills. Returns the prefix blocks loaded back
        from the (host, storage) tiers."""
        cfg, kv = self.config, self.kv
        bs, chunked, caching = self.block_size, cfg.enable_chunked_prefill, cfg.enable_prefix_caching
        fifo = self._fifo if not self._priority else None
        host = storage = 0
        seats = cfg.max_num_seqs - self.num_running
        dp = self.dp
        if dp is not None and dp.hold(len(self._heap) if self._priority else len(self._fifo), self._peek_waiting()):
            return host, storage   # attention-DP balance: the prompts wait for every rank to have one
        before = self.admit_before   # (a pipelined engine's plan: requests that arrived later wait a step)
        while budget > 0 and seats > 0:
            req = fifo[0] if fifo else self._peek_waiting()
            if req is None or (before is not None and self._arrived_after(req, before)):
                break
            out_tokens = req.num_output_tokens
            num_tokens = req.prompt_len + out_tokens
            match, held, replayed = NO_MATCH, 0, 0
            if req.block_hashes:  # (a request without hashes has nothing to look up)
                match = kv.match_prefix(req, num_tokens)
                held = match.num_blocks * bs
                # the prefix's window state per the replay policy: its last tokens are recomputed (into the
                # blocks it already holds) where their window KV was not kept with the prefix
                replayed = self.resume_tokens(held)
            hit_tokens = held - replayed
            todo = num_tokens - held
            if chunked or out_tokens:  # recomputes may always chunk
                new = min(todo, budget, cap)
            elif todo > budget:
                break
            else:
                new = todo
            if dp is not None:   # a rank with a seat, the request's KV and step budget, least loaded
                rank = dp.place(req, 1 if (chunked or out_tokens) else new)
                if rank < 0:
                    break
                new = min(new, dp.tokens_left(rank))
            chunk = replayed + new
            if not kv.admit(req, held + new, match):
                break
            if fifo:
                fifo.popleft()
            else:
                self._pop_waiting()
            seats -= 1
            host += match.host
            storage += match.storage
            req._num_computed_tokens = hit_tokens  # (waiting: not in the decode batch)
            if req.num_preemptions == 0:
                req.num_cached_tokens = hit_tokens
                if caching:
                    self.prefix_query_tokens += req.prompt_len
                    self.prefix_hit_tokens += hit_tokens
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            self.prefilling.append(req)
            chunks.append(ScheduledChunk(req, chunk, hit_tokens, hit_tokens + chunk == num_tokens, replayed))
            budget -= chunk
            if dp is not None:
                dp.admit(req, rank, new)
        return host, storage

    def _decode_horizon(self, max_steps: int) -> int:
        """Reserve KV for, and return, the most steps (<= max_steps) a decode-only plan may run.

        No decode may finish before the last step (after k-1 steps a request has made at most
        (k-1)*(1+draft_len) tokens; it must still have some left), and the blocks for all k steps
        must be free now. Step 1's blocks are already reserved; a failed reservation changes
        nothing, a successful one is kept, so the bisection ends holding the blocks of the answer.
        """
        batch, s = self.batch, self._tokens_per_decode
        k = min(max_steps, (batch.min_left() - 1) // s + 1)
        if k <= 1 or self.kv.reserve_decodes(batch, k * s):
            return max(k, 1)
        lo, hi = 1, k  # lo's blocks are reserved, hi's are not free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.kv.reserve_decodes(batch, mid * s):
                lo = mid
            else:
                hi = mid
        return lo

    def _make_plan(self, chunks: list[ScheduledChunk], steps: int, preempted: list[Request], loaded: tuple[int, int],
                   with_decodes: bool = True) -> StepPlan:
        """Freeze the current decode batch (none when ``with_decodes`` is off) and ``chunks`` into the plan in flight."""
        batch = self.batch if with_decodes else self._no_decodes
        # positional: instance_id, prefills, decodes, decode_context_lens, num_steps, draft_len,
        # preempted, loaded_blocks, decode_context_sum
        plan = StepPlan(self.instance_id, chunks, batch.reqs[:], None if self._lazy_contexts else batch.context_lens(), steps,
                        self._tokens_per_decode - 1, preempted, loaded, batch.context_sum())
        if self._lazy_contexts:   # the simulator's backends mostly need only the sum: copy the contexts when read
            plan.contexts_from(batch, batch.version)
        if batch.reqs or chunks:
            self._in_flight = plan
        if self.dp is not None:
            self.dp.planned(plan)   # the cost model prices it at its requests' ranks (sim.effects.RankedStepCost)
        self._in_flight_min_left = None
        return plan

    # ----------------------------------------------------------------- result in
    def complete(self, plan: StepPlan, result: StepResult, now: float) -> list[Request]:
        """Apply the ``result.num_steps`` executed steps of ``plan`` at time ``now``; returns finished requests:
        1. the decodes' tokens (KV reserved for steps not run handed back), finished decodes retired; accepted drafts
           past a request's last token are discarded and ``result.decode_tokens`` is replaced by the tokens kept,
           so what reads the result after this (the metrics) counts only tokens delivered;
        2. the prefill chunks' tokens, completed prompts' first tokens, new decodes joining the batch;
        3. aborts that arrived while the plan ran."""
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
        if steps and plan.decodes:
            self._complete_decodes(plan, result, steps, now, finished)
        if steps and plan.prefills:
            self._complete_prefills(plan, result, now, finished)
        if self._pending_aborts:
            for req in self._pending_aborts:
                if req.request_id in self._live:
                    self._retire(req, RequestStatus.DROPPED, None)
                    req.drop_reason = "aborted"
            self._pending_aborts = []
        return finished

    def _complete_decodes(self, plan: StepPlan, result: StepResult, steps: int, now: float, finished: list[Request]) -> None:
        """Add the decodes' tokens of ``steps`` steps, trim their KV to what those steps need, retire the finished."""
        batch, nd, dt = self.batch, len(plan.decodes), result.decode_tokens
        if self._tokens_per_decode == 1 or dt is None:
            # one token per decode per step: the plan's horizon guarantees nobody had fewer than ``steps`` left
            tok: np.ndarray | int = steps
            last: np.ndarray | int = 1
            self.outstanding_tokens -= steps * nd
        else:
            last = dt[steps - 1]
            made = dt[0] if steps == 1 else dt[:steps].sum(axis=0)
            left = batch.left[:nd]
            tok = np.minimum(made, left)  # drafts past the last wanted token are discarded
            if (made > left).any():
                result.decode_tokens = _delivered(dt[:steps], left)
            self.outstanding_tokens -= int(tok.sum())
        batch.add_tokens(nd, tok)
        if plan.num_steps > 1 and (steps < plan.num_steps or self._tokens_per_decode > 1):
            self.kv.trim_decodes(batch, nd, last)
        sampled = result.sampled_token_ids
        if sampled is not None:
            for i, r in enumerate(plan.decodes):
                ids = sampled.get(r.request_id)
                if ids:
                    r.output_token_ids.extend(ids[: tok if isinstance(tok, int) else int(tok[i])])
        min_left = self._in_flight_min_left
        if (min_left is not None and isinstance(tok, int) and steps < min_left) or batch.min_left() > 0:
            done = []  # nobody reached the end
        else:
            done = batch.finished_slots(nd)
        early = result.finished_early
        if early:
            done = sorted(set(done) | {r._slot for r in plan.decodes if r.request_id in early})
        for slot in reversed(done):  # highest row first: swap-removal keeps lower rows in place
            req = batch.reqs[slot]
            self._retire(req, RequestStatus.FINISHED, now)
            finished.append(req)

    def _complete_prefills(self, plan: StepPlan, result: StepResult, now: float, finished: list[Request]) -> None:
        """Count the chunks' tokens as computed (cache their full blocks); a completed prompt samples its
        first token and joins the decode batch, or finishes."""
        sampled, early = result.sampled_token_ids, result.finished_early
        for c in plan.prefills:
            req = c.request
            if req.status is not RequestStatus.RUNNING:
                continue
            # a prefilling request holds its own counters (it joins the decode batch below)
            req._num_computed_tokens = c.context_len + c.num_new_tokens
            if req.block_hashes:
                self.kv.cache_computed(req)
            if not c.is_last_chunk:
                continue
            out = req._num_output_tokens
            self.outstanding_tokens -= 1 + (req.prompt_len if out == 0 else 0)
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
                self.batch.add(req)

    # ----------------------------------------------------------------- lifecycle helpers
    def _retire(self, req: Request, status: RequestStatus, now: float | None) -> None:
        """Take ``req`` out of the running/waiting sets, free its KV, and mark it finished or dropped."""
        if req._batch is not None:
            self.batch.remove(req)
        elif req.status is RequestStatus.RUNNING:
            self.prefilling.remove(req)
        self.kv.free(req)
        if self.dp is not None:
            self.dp.release(req)
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

    def _preempt(self, req: Request, preempted: list[Request]) -> None:
        """Free ``req``'s KV and put it back at the head of the queue to recompute later."""
        if req._batch is not None:
            self.batch.remove(req)
        else:
            self.prefilling.remove(req)
        self.kv.free(req)
        if self.dp is not None:
            self.dp.release(req)
        req.num_computed_tokens = 0
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
        if self.dp is not None:
            self.dp.queued(req)
        if self._priority:
            heapq.heappush(self._heap, (req.priority, req.arrival_time, req._seq, req))
        elif front:
            self._fifo.appendleft(req)
        else:
            self._fifo.append(req)

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
        return self.kv.cached_prefix_tokens(req)
