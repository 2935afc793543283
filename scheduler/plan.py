"""The seam between the scheduler and a backend: StepPlan in, StepResult out."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scheduler.request import Request


@dataclass(slots=True)
class ScheduledChunk:
    """A prefill (or recompute) chunk of one request in this step."""

    request: Request
    num_new_tokens: int      # tokens computed in this step
    context_len: int         # tokens already in KV before this chunk (prefix hits included)
    is_last_chunk: bool      # the chunk completes the prompt: the step samples a token
    # of num_new_tokens, the leading ones recomputed over KV the request already holds, because the prompt resumed
    # at context_len + replayed and the sliding-window replay policy (costmodels/replay.py) did not keep its window
    # state; layer j re-runs ResolvedReplay.extra_tokens(context_len + replayed)[j] of them (replayed = that at layer 0)
    replayed: int = 0


class StepPlan:
    """What one instance runs next: prefill chunks and decodes, for ``num_steps`` steps.

    ``num_steps > 1`` only for decode-only plans whose composition is fixed for k steps:
    each decode request's context grows by the tokens it produced in the previous step.
    A backend may stop early (after ``StepResult.num_steps`` steps), e.g. when the
    simulator sees an arrival that the scheduler must consider.

    Fields: ``instance_id``; ``prefills`` (ScheduledChunk list); ``decodes`` (requests);
    ``decode_context_lens`` (their context lengths, int64); ``num_steps``; ``draft_len`` (MTP/
    speculative draft tokens verified per decode per step); ``preempted``; ``loaded_blocks`` (prefix blocks
    this plan loads back into HBM from the host-memory and storage tiers, kv_tiers.py);
    ``decode_context_sum`` (sum of decode_context_lens where the scheduler knows it, so backends
    skip a pass; None: sum it).

    The simulator's scheduler may hand out ``decode_context_lens`` lazily (``contexts_from``): the
    array is read from the decode batch on first access, which must come before the scheduler's
    ``complete()`` of this plan (backends and metrics read it in between; a later first read raises).
    """

    __slots__ = ("instance_id", "prefills", "decodes", "_ctx_lens", "num_steps", "draft_len",
                 "preempted", "loaded_blocks", "decode_context_sum", "_ctx_src")

    def __init__(self, instance_id: int, prefills: list[ScheduledChunk] | None = None, decodes: list[Request] | None = None,
                 decode_context_lens: np.ndarray | None = None, num_steps: int = 1, draft_len: int = 0,
                 preempted: list[Request] | None = None,
                 loaded_blocks: tuple[int, int] = (0, 0), decode_context_sum: int | None = None):
        self.instance_id = instance_id
        self.prefills = [] if prefills is None else prefills
        self.decodes = [] if decodes is None else decodes
        self._ctx_lens = decode_context_lens   # None: none given (an empty array) or read lazily (_ctx_src)
        self.num_steps = num_steps
        self.draft_len = draft_len
        self.preempted = [] if preempted is None else preempted
        self.loaded_blocks = loaded_blocks
        self.decode_context_sum = decode_context_sum
        self._ctx_src = None

    def contexts_from(self, batch, version: int) -> "StepPlan":
        """Take ``decode_context_lens`` from ``batch`` (a DecodeBatch at ``version``) when first read."""
        self._ctx_src = (batch, version)
        return self

    @property
    def decode_context_lens(self) -> np.ndarray:
        a = self._ctx_lens
        if a is None:
            if self._ctx_src is None:
                a = self._ctx_lens = np.zeros(0, np.int64)
                return a
            batch, version = self._ctx_src
            if batch.version != version:
                raise RuntimeError("StepPlan.decode_context_lens first read after the scheduler applied the plan "
                                   "(read it between schedule() and complete())")
            a = self._ctx_lens = batch.context_lens()
            self._ctx_src = None
        return a

    @decode_context_lens.setter
    def decode_context_lens(self, value: np.ndarray) -> None:
        self._ctx_lens = value
        self._ctx_src = None

    def __repr__(self) -> str:
        return (f"StepPlan(instance_id={self.instance_id}, prefills={self.prefills!r}, decodes={len(self.decodes)} requests, "
                f"num_steps={self.num_steps}, draft_len={self.draft_len})")

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def num_batched_tokens(self) -> int:
        """Tokens the forward pass processes in one step (drafts included)."""
        return sum(c.num_new_tokens for c in self.prefills) + len(self.decodes) * (1 + self.draft_len)


@dataclass(slots=True)
class StepResult:
    """What a backend reports after running a plan.

    ``step_durations`` has one entry per executed step (wall or simulated seconds, host
    overhead included as the loop's async policy dictates). ``decode_tokens[s, i]`` is the
    number of tokens decode request ``i`` produced in step ``s`` (1 + accepted drafts;
    ``Scheduler.complete`` replaces it by the tokens delivered, none past a request's last);
    None means one token per decode per step. Prefill chunks that complete a prompt produce
    exactly one token each in their step. ``sampled_token_ids`` are real token ids when an executor ran
    the plan (None in the sim): per request id, the list of ids produced in this plan. ``host_s``
    is the host seconds per step the backend charged (the simulator's cost model; 0.0 where a
    backend does not report it, as the real executor, whose durations are measured).
    """

    step_durations: np.ndarray
    decode_tokens: np.ndarray | None = None
    sampled_token_ids: dict[str, list[int]] | None = None
    finished_early: set[str] = field(default_factory=set)  # e.g. EOS or stop string hit
    host_s: float = 0.0

    @property
    def num_steps(self) -> int:
        return int(len(self.step_durations))

    @property
    def duration(self) -> float:
        return float(np.sum(self.step_durations))

    def first(self, n: int) -> "StepResult":
        """The result of the first ``n`` steps only (an arrival cut a multi-step plan there).

        Only simulated results are cut this way (a real run stops itself): they carry no token ids."""
        if n >= len(self.step_durations):
            return self
        if self.sampled_token_ids is not None:
            raise ValueError("StepResult.first: a result with sampled token ids cannot be cut after the fact")
        tok = self.decode_tokens
        return StepResult(self.step_durations[:n], None if tok is None else tok[:n], None, self.finished_early, self.host_s)
