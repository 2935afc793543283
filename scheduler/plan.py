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


@dataclass(slots=True)
class StepPlan:
    """What one instance runs next: prefill chunks and decodes, for ``num_steps`` steps.

    ``num_steps > 1`` only for decode-only plans whose composition is fixed for k steps:
    each decode request's context grows by the tokens it produced in the previous step.
    A backend may stop early (after ``StepResult.num_steps`` steps), e.g. when the
    simulator sees an arrival that the scheduler must consider.
    """

    instance_id: int
    prefills: list[ScheduledChunk] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    decode_context_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    num_steps: int = 1
    draft_len: int = 0           # MTP/speculative draft tokens verified per decode per step
    host_overhead_s: float = 0.0 # scheduling + input preparation cost of this plan, per step
    preempted: list[Request] = field(default_factory=list)
    # prefix blocks this plan loads back into HBM from the host-memory and storage tiers (kv_tiers.py)
    loaded_blocks: tuple[int, int] = (0, 0)
    # sum of decode_context_lens where the scheduler knows it (backends then skip a pass); None: sum it
    decode_context_sum: int | None = None

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
    number of tokens decode request ``i`` produced in step ``s`` (1 + accepted drafts).
    Prefill chunks that complete a prompt produce exactly one token each in their step.
    ``sampled_token_ids`` are real token ids when an executor ran the plan (None in the sim):
    per request id, the list of ids produced in this plan.
    """

    step_durations: np.ndarray
    decode_tokens: np.ndarray
    sampled_token_ids: dict[str, list[int]] | None = None
    finished_early: set[str] = field(default_factory=set)  # e.g. EOS or stop string hit

    @property
    def num_steps(self) -> int:
        return int(len(self.step_durations))

    @property
    def duration(self) -> float:
        return float(np.sum(self.step_durations))
