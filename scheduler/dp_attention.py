"""Attention-DP ranks scheduled explicitly: which rank runs each request, per-rank budgets, the prefill policy.

With ``SchedulerConfig.attention_dp`` (ranks > 1) one Scheduler drives the instance's attention-DP
ranks as a global scheduler would (TensorRT-LLM's attention-DP executor gathers every rank's
requests each iteration; SGLang's DataParallelController hands each request to one rank):

- **placement**: a prompt is placed on a rank when it is admitted and stays there until it finishes
  or is preempted (its KV lives there). The rank is ``costmodels.dp_ranks.least_loaded`` over the
  ranks with room: least reserved KV, then fewest tokens this step, then lowest rank (TensorRT-LLM's
  ``_balance_requests_across_ranks`` keys ranks by active tokens). The cost model prices each step
  at these ranks (``EffectiveStepCost.mixed_step_time(..., ranks=)``, wired by ``sim.effects``), so
  the assignment scheduled is the assignment priced.
- **per-rank budgets**, enforced here, not only in the memory fit: a rank runs at most
  ``rank_token_budget`` tokens per step (decodes + prompt chunks), holds at most ``rank_seats``
  requests, and its KV never exceeds ``num_kv_blocks / ranks`` blocks (the memory fit's KV tokens
  per DP rank). KV is reserved for the whole request (prompt + output + drafts) when it is placed,
  TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` capacity policy, so a rank never has to evict to
  let its decodes grow.
- **prefill policy** ``balance`` (TensorRT-LLM ``attention_dp_config.enable_balance``; tech blog 10,
  "ADP Balance Strategy"; py_executor ``_balance_adp_requests``): while some rank could not take a
  waiting prompt this step, prompts are held (a prompt alone on one rank makes every other rank
  wait for it); once every rank can, and every rank is decoding, they are held ``batching_wait_iters``
  more steps to gather a batch; when some rank has no decodes, nothing is held (waiting gains
  nothing). Unlike TensorRT-LLM's global counters, the bound is per prompt: no prompt is held more
  than ``timeout_iters`` steps in all (``held_steps`` records each one's count). ``immediate``
  never holds (SGLang's DP attention).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from costmodels.dp_ranks import least_loaded
from scheduler.config import SchedulerConfig
from scheduler.request import Request, this_request


class AttentionDPRanks:
    """The rank ledger and prefill policy of one attention-DP Scheduler (see the module docstring)."""

    def __init__(self, config: SchedulerConfig, num_kv_blocks: int):
        ad = config.attention_dp
        self.ranks = r = ad.ranks
        self.policy = ad.prefill
        self.timeout_iters, self.batching_wait_iters = ad.timeout_iters, ad.batching_wait_iters
        self.block_size, self.draft_len = config.block_size, config.draft_len
        self.kv_blocks = num_kv_blocks // r        # per-rank KV budget
        self.seats = config.rank_seats()
        self.token_budget = config.rank_token_budget()
        self.whole_prompts = not config.enable_chunked_prefill
        self.rank_of: dict[str, int] = {}          # running requests
        self._reserved: dict[str, int] = {}        # KV blocks reserved per running request
        self.kv_used = np.zeros(r, np.int64)       # KV blocks reserved per rank
        self.running = np.zeros(r, np.int64)       # requests per rank
        self.decoding = np.zeros(r, np.int64)      # decodes per rank, this step
        self.step_tokens = np.zeros(r, np.int64)   # tokens scheduled per rank, this step
        # balance policy: hold steps so far, when each waiting prompt was queued (in hold steps), counters
        self.hold_steps = 0
        self._queued: dict[str, int] = {}
        self._queue_order: deque[tuple[int, Request]] = deque()
        self._gather = 0
        self.holding = False
        self.held_steps: dict[str, int] = {}       # per request: most hold steps it waited before a start
        self.in_flight = None                      # the StepPlan last made (``planned``)

    # ----------------------------------------------------------------- admission
    def blocks_for(self, req: Request) -> int:
        """KV blocks a request reserves on its rank: prompt + output + drafts."""
        return -(-(req.prompt_len + req.output_len + self.draft_len) // self.block_size)

    def refusal_reason(self, req: Request) -> str | None:
        """Why ``req`` can never run on one rank of this instance, or None."""
        need = self.blocks_for(req)
        if need > self.kv_blocks:
            return (f"needs more KV blocks than an attention-DP rank has ({self.kv_blocks:,} blocks, "
                    f"{self.kv_blocks * self.block_size:,} tokens; attention_dp.ranks={self.ranks})"
                    f"{this_request(f'{need:,} blocks')}")
        if self.whole_prompts and req.prompt_len > self.token_budget:
            return (f"prompt_len exceeds attention_dp.rank_token_budget={self.token_budget} and chunked prefill is off"
                    f"{this_request(f'prompt_len={req.prompt_len:,}')}")
        return None

    def queued(self, req: Request) -> None:
        """``req`` joined the waiting queue (new or preempted): its hold count starts now."""
        self._queued[req.request_id] = self.hold_steps
        self._queue_order.append((self.hold_steps, req))

    def begin_step(self, decodes: list[Request], decodes_run: bool, tokens_per_decode: int) -> None:
        """A new step: count each rank's decodes; they take ``tokens_per_decode`` tokens each if they run."""
        r = self.ranks
        rank_of = self.rank_of
        self.decoding = np.bincount(np.fromiter((rank_of[q.request_id] for q in decodes), np.int64, len(decodes)),
                                    minlength=r) if decodes else np.zeros(r, np.int64)
        self.step_tokens = self.decoding * tokens_per_decode if decodes_run else np.zeros(r, np.int64)

    def place(self, req: Request, min_tokens: int) -> int:
        """The rank ``req`` starts on (-1: none has a seat, its KV and ``min_tokens`` of step budget free)."""
        room = ((self.running < self.seats) & (self.kv_used + self.blocks_for(req) <= self.kv_blocks)
                & (self.token_budget - self.step_tokens >= min_tokens))
        return least_loaded(self.kv_used, tie=self.step_tokens, eligible=room)

    def tokens_left(self, rank: int) -> int:
        return int(self.token_budget - self.step_tokens[rank])

    def room(self, req: Request) -> int:
        """Step tokens left on the rank of running request ``req``."""
        return self.tokens_left(self.rank_of[req.request_id])

    def admit(self, req: Request, rank: int, chunk: int) -> None:
        """``req`` starts on ``rank`` with a first chunk of ``chunk`` tokens."""
        rid = req.request_id
        need = self.blocks_for(req)
        self.rank_of[rid], self._reserved[rid] = rank, need
        self.kv_used[rank] += need
        self.running[rank] += 1
        self.step_tokens[rank] += chunk
        h0 = self._queued.pop(rid, None)
        if h0 is not None:
            self.held_steps[rid] = max(self.held_steps.get(rid, 0), self.hold_steps - h0)

    def spend(self, req: Request, tokens: int) -> None:
        """A running request's chunk of ``tokens`` runs this step on its rank."""
        self.step_tokens[self.rank_of[req.request_id]] += tokens

    def release(self, req: Request) -> None:
        """``req`` left its rank (finished, dropped, preempted) or left the queue (aborted)."""
        rid = req.request_id
        self._queued.pop(rid, None)
        rank = self.rank_of.pop(rid, None)
        if rank is not None:
            self.kv_used[rank] -= self._reserved.pop(rid)
            self.running[rank] -= 1

    # ----------------------------------------------------------------- prefill policy
    def hold(self, num_waiting: int, head: Request | None) -> bool:
        """Whether this step starts no waiting prompt (``balance``; the module docstring has the rule)."""
        if self.policy != "balance" or num_waiting == 0 or head is None:
            self._gather = 0
            return False
        if self._oldest_held() >= self.timeout_iters:
            return self._release()
        can_take = (self.running < self.seats) & (self.kv_used + self.blocks_for(head) <= self.kv_blocks)
        all_decoding = bool((self.decoding > 0).all())
        if num_waiting >= self.ranks and can_take.all():   # every rank gets a prompt if released now
            if not all_decoding or self._gather >= self.batching_wait_iters:
                return self._release()
            self._gather += 1
        elif not all_decoding:
            return self._release()                          # a rank without decodes gains nothing by waiting
        self.holding = True
        self.hold_steps += 1
        return True

    def _release(self) -> bool:
        self._gather = 0
        return False

    def _oldest_held(self) -> int:
        """Hold steps the longest-held waiting prompt has waited."""
        order, queued = self._queue_order, self._queued
        while order and queued.get(order[0][1].request_id) != order[0][0]:
            order.popleft()   # started, dropped, or queued again later (a newer entry)
        return self.hold_steps - order[0][0] if order else 0

    def planned(self, plan) -> None:
        """The Scheduler made ``plan`` (the one the backend prices next); a hold decided for it is spent."""
        self.in_flight = plan
        self.holding = False

    # ----------------------------------------------------------------- the plan's ranks, for the cost model
    def plan_ranks(self) -> np.ndarray:
        """Ranks of the plan in flight: its decodes, then its prompt chunks (the order of the cost model's arrays)."""
        plan, rank_of = self.in_flight, self.rank_of
        reqs = [*plan.decodes, *(c.request for c in plan.prefills)]
        return np.fromiter((rank_of[q.request_id] for q in reqs), np.int64, len(reqs))

    def check(self) -> None:
        """Invariant: no rank over its KV, seat budget (and this step, its token budget)."""
        if (self.kv_used > self.kv_blocks).any() or (self.running > self.seats).any() or (self.step_tokens > self.token_budget).any():
            raise AssertionError(f"attention-DP rank over budget: kv {self.kv_used.tolist()} / {self.kv_blocks}, "
                                 f"running {self.running.tolist()} / {self.seats}, tokens {self.step_tokens.tolist()} / {self.token_budget}")
