"""Scheduler policy knobs: one pydantic model shared by the simulator and the server."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from costmodels.model_spec import ModelSpec
from costmodels.replay import ReplayPolicy, ResolvedReplay, effective_replay_policy

# DeepSeek-V3 technical report (arXiv 2412.19437, section 5.4.3): "the acceptance rate of the
# second token prediction ranges between 85% and 90%". We take the low end for draft position 1.
# Deeper draft positions have no published number for V3's single MTP layer; we ASSUME each further
# position is accepted with the same conditional probability, so position i is accepted with
# probability 0.85**i (marginal). Override ``acceptance_rates`` when you have measurements.
DEFAULT_FIRST_ACCEPTANCE = 0.85

# Host (CPU) overhead of one engine step. Sources: the WukLab study of vLLM/SGLang scheduling
# overhead (mlsys.wuklab.io/posts/scheduling_overhead) finds vLLM's per-step scheduling plus tensor
# pre/post-processing can exceed half of the inference time at small batch, and SGLang v0.4's blog
# (lmsys.org/blog/2024-12-04-sglang-v0-4) says an unoptimised engine "can spend as much as half of its
# time on CPU overhead" (their overlap scheduler hides it: +10% throughput). Engine write-ups put
# "scheduling + preparation" at 1-5 ms per step growing with batch size. Our defaults: 2 ms fixed
# + 20 us per scheduled request + 0.5 us per batched token, i.e. ~2.3 ms at batch 16 and ~4.6 ms
# for a 128-request decode step; calibrate against a real engine when one is available.
DEFAULT_HOST_STEP_S = 2.0e-3
DEFAULT_HOST_PER_REQUEST_S = 20e-6
DEFAULT_HOST_PER_TOKEN_S = 0.5e-6

# Scheduler policies of other engines, as the knobs that define them (docs/byo.md has the table).
# A preset fills only the fields a file leaves out; "attention_dp_host" asks the scenario to split
# host work over the layout's attention-DP ranks (one scheduler per rank).
# - vLLM v0: "By default, vLLM scheduler prioritizes prefills ... Once chunked prefill is enabled, the
#   policy is changed to prioritize decode requests" (vLLM docs, quoted in vllm-project/vllm PR #7874);
#   chunked prefill off by default below 32K context; no CPU/GPU overlap.
# - vLLM v1: one token budget shared by decodes and prompt chunks (mixed batches, chunked prefill on);
#   async scheduling is opt-in (--async-scheduling), so no overlap by default.
# - SGLang: a new prefill batch runs before decoding resumes (prefill-first), mixing only with
#   --enable-mixed-chunk (off by default); chunked prefill on; overlap scheduler on by default
#   (--disable-overlap-schedule turns it off; lmsys.org/blog/2024-12-04-sglang-v0-4).
# - TensorRT-LLM (PyTorch backend) with attention-DP: in-flight batching schedules context and
#   generation requests in one step (TensorRT-LLM performance tuning guide), enable_chunked_prefill
#   false by default, overlap scheduler on by default (disable_overlap_scheduler: false), one
#   executor loop per attention-DP rank.
SCHEDULER_PRESETS: dict[str, dict] = {
    "vllm-v0": {"mixed_batches": False, "enable_chunked_prefill": False, "async_overlap": False},
    "vllm-v1": {"mixed_batches": True, "enable_chunked_prefill": True, "async_overlap": False},
    "sglang": {"mixed_batches": False, "enable_chunked_prefill": True, "async_overlap": True},
    "trtllm-attention-dp": {"mixed_batches": True, "enable_chunked_prefill": False, "async_overlap": True},
}
PresetName = Literal["vllm-v0", "vllm-v1", "sglang", "trtllm-attention-dp"]


class SchedulerConfig(BaseModel):
    """Per-instance step scheduler: batching limits, chunked prefill, caching, speculation, host cost."""

    model_config = ConfigDict(extra="forbid")

    preset: PresetName | None = Field(
        None, description="another engine's scheduling policy (vllm-v0, vllm-v1, sglang, trtllm-attention-dp): sets the knobs "
        "that define it (SCHEDULER_PRESETS) unless given here too; none: twinfer's defaults",
    )
    mixed_batches: bool = Field(
        True, description="decodes and prompt chunks share a step (vLLM v1, chunked prefill); False: a step with prompt "
        "work runs no decodes (vLLM v0 / SGLang prefill-first), decodes run when no prompt can be scheduled",
    )
    block_size: int = Field(64, ge=1, le=4096, description="tokens per paged-KV block (FlashMLA uses 64)")
    max_num_seqs: int = Field(256, ge=1, le=65536, description="most requests running at once")
    max_num_batched_tokens: int = Field(8192, ge=1, le=1 << 22, description="token budget of one step (prefill chunks + decodes + drafts)")
    enable_chunked_prefill: bool = Field(True, description="split long prompts across steps to fit the token budget")
    long_prefill_threshold: int = Field(0, ge=0, le=1 << 22, description="cap on one request's prefill chunk per step (0: no cap beyond the budget)")
    policy: Literal["fcfs", "priority"] = Field("fcfs", description="waiting-queue order: arrival time, or priority (lower first) then arrival")
    enable_prefix_caching: bool = Field(True, description="reuse KV blocks of shared prompt prefixes (radix tree over block hashes)")
    host_cache_blocks: int = Field(0, ge=0, le=1 << 40, description="prefix-cache tier in host memory (HiCache L2): KV blocks kept after HBM eviction")
    storage_cache_blocks: int = Field(0, ge=0, le=1 << 44, description="prefix-cache tier in storage (L3): blocks kept after host eviction")
    swa_replay_tokens: int = Field(
        0, ge=0, le=1 << 20,
        description="sliding-window bounded replay: on a prefix-cache hit or the next prompt chunk, recompute the last "
        "this many cached tokens through every layer instead of keeping their sliding-window KV (shorthand for "
        "replay {default: replay, tokens: N}; 0: the replay policy decides)",
    )
    replay: ReplayPolicy | None = Field(
        None, description="per-layer sliding-window policy on resume (persist / replay W / recompute, costmodels/replay.py); "
        "null: swa_replay_tokens if set, else the model's shipped policy",
    )
    draft_len: int = Field(0, ge=0, le=16, description="speculative (MTP) draft tokens verified per decode step")
    acceptance_rates: list[float] = Field(
        default_factory=list,
        description="marginal probability that draft position i (1-based) is accepted, non-increasing; "
        "empty: 0.85**i (DeepSeek-V3 report: 85-90% for the first draft token)",
    )
    max_model_len: int = Field(131072, ge=1, le=1 << 24, description="most tokens (prompt + output) one request may hold")
    async_overlap: bool = Field(True, description="prepare step N+1 on the CPU while the GPU runs step N")
    host_step_s: float = Field(DEFAULT_HOST_STEP_S, ge=0.0, le=1.0, description="host overhead per step, fixed part (s)")
    host_per_request_s: float = Field(DEFAULT_HOST_PER_REQUEST_S, ge=0.0, le=0.01, description="host overhead per scheduled request per step (s)")
    host_workers: int = Field(
        1, ge=1, le=4096,
        description="scheduler processes sharing the per-request and per-token host work in parallel "
        "(SGLang's attention-DP runs one scheduler per DP rank)",
    )
    host_per_token_s: float = Field(DEFAULT_HOST_PER_TOKEN_S, ge=0.0, le=0.001, description="host overhead per batched token per step (s)")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data):
        """Fill the preset's knobs under the fields given explicitly (an unknown preset is left to the field's error)."""
        if isinstance(data, dict) and data.get("preset") in SCHEDULER_PRESETS:
            return {**SCHEDULER_PRESETS[data["preset"]], **data}
        return data

    @model_serializer(mode="wrap")
    def _drop_unset_replay(self, handler):
        """Leave ``replay`` out of dumps while it is null, so scenario dumps (and result digests) from before
        per-layer replay policies stay byte-identical."""
        data = handler(self)
        if isinstance(data, dict) and data.get("replay", 0) is None:
            del data["replay"]
        return data

    @model_validator(mode="after")
    def _check(self) -> "SchedulerConfig":
        if self.replay is not None and self.swa_replay_tokens:
            raise ValueError(f"swa_replay_tokens={self.swa_replay_tokens} and replay are both set: give the replay "
                             "length as replay.tokens (or leave replay out)")
        for i, a in enumerate(self.acceptance_rates):
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"acceptance_rates[{i}]={a} must be in [0, 1]")
            if i and a > self.acceptance_rates[i - 1]:
                raise ValueError(
                    f"acceptance_rates must be non-increasing (position {i + 1} cannot be accepted more often than position {i})"
                )
        if self.acceptance_rates and len(self.acceptance_rates) != self.draft_len:
            raise ValueError(
                f"acceptance_rates has {len(self.acceptance_rates)} entries but draft_len={self.draft_len} "
                "(give one per draft position, or leave it empty for the default)"
            )
        per_seq = 1 + self.draft_len
        if self.max_num_batched_tokens < per_seq:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens} cannot hold one decode of {per_seq} tokens (1 + draft_len)")
        if self.max_num_seqs * per_seq > self.max_num_batched_tokens:
            # Every running decode must fit in one step's token budget, as in vLLM's defaults
            # (max_num_seqs 256 <= max_num_batched_tokens 8192); otherwise decodes would starve.
            raise ValueError(
                f"max_num_seqs * (1 + draft_len) = {self.max_num_seqs * per_seq} exceeds max_num_batched_tokens="
                f"{self.max_num_batched_tokens}: raise max_num_batched_tokens or lower max_num_seqs"
            )
        return self

    def replay_for(self, model: ModelSpec) -> ResolvedReplay:
        """The per-layer replay policy in force on ``model`` (``replay``, else ``swa_replay_tokens``, else shipped)."""
        return effective_replay_policy(model, self.replay, self.swa_replay_tokens).resolve(model)

    def effective_acceptance_rates(self) -> list[float]:
        """Per draft position acceptance probability (marginal), defaults filled in."""
        if self.acceptance_rates:
            return list(self.acceptance_rates)
        return [DEFAULT_FIRST_ACCEPTANCE ** (i + 1) for i in range(self.draft_len)]

    def expected_tokens_per_decode(self) -> float:
        """1 + sum of acceptance rates: mean tokens a decode step produces per request."""
        return 1.0 + sum(self.effective_acceptance_rates())

    def host_overhead_s(self, num_requests: int, num_tokens: int) -> float:
        """Host time of one step scheduling ``num_requests`` requests and ``num_tokens`` tokens."""
        return self.host_step_s + (self.host_per_request_s * num_requests + self.host_per_token_s * num_tokens) / self.host_workers
