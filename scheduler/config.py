"""Scheduler policy knobs: one pydantic model shared by the simulator and the server."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from costmodels.host import HOST_PROFILES
from costmodels.memory import per_rank_share
from costmodels.model_spec import ModelSpec
from costmodels.replay import ReplayPolicy, ResolvedReplay, effective_replay_policy

# DeepSeek-V3 technical report (arXiv 2412.19437, section 5.4.3): "the acceptance rate of the
# second token prediction ranges between 85% and 90%". We take the low end for draft position 1.
# Deeper draft positions have no published number for V3's single MTP layer; we ASSUME each further
# position is accepted with the same conditional probability, so position i is accepted with
# probability 0.85**i (marginal). Override ``acceptance_rates`` when you have measurements.
DEFAULT_FIRST_ACCEPTANCE = 0.85
MAX_MODEL_LEN_LIMIT = 1 << 24   # the most tokens a request may hold in any config (sim.traces.MAX_LINE_TOKENS)

# Host (CPU) overhead of one engine step. Sources: the WukLab study of vLLM/SGLang scheduling
# overhead (mlsys.wuklab.io/posts/scheduling_overhead) finds vLLM's per-step scheduling plus tensor
# pre/post-processing can exceed half of the inference time at small batch, and SGLang v0.4's blog
# (lmsys.org/blog/2024-12-04-sglang-v0-4) says an unoptimised engine "can spend as much as half of its
# time on CPU overhead" (their overlap scheduler hides it: +10% throughput). Engine write-ups put
# "scheduling + preparation" at 1-5 ms per step growing with batch size. Our defaults: 2 ms fixed
# + 20 us per scheduled request + 0.5 us per batched token, i.e. ~2.3 ms at batch 16 and ~4.6 ms
# for a 128-request decode step (costmodels.host.HOST_PROFILES["twinfer-default"]); the other engine
# styles' profiles (``host_profile``, filled by each preset) carry their own sources.
DEFAULT_HOST_STEP_S = HOST_PROFILES["twinfer-default"].step_s
DEFAULT_HOST_PER_REQUEST_S = HOST_PROFILES["twinfer-default"].per_request_s
DEFAULT_HOST_PER_TOKEN_S = HOST_PROFILES["twinfer-default"].per_token_s
HostProfileName = Literal["twinfer-default", "twinfer-executor-measured", "vllm-v0", "vllm-v1", "sglang", "trtllm"]

class AttentionDPConfig(BaseModel):
    """Attention-DP scheduling of one instance: each request on one DP rank, per-rank budgets, prefill policy.

    ``prefill``: ``immediate`` starts a prompt on the least-loaded rank as soon as it fits (SGLang's
    DP attention: the DataParallelController sends each request to one rank's scheduler, which
    prefills it at once while the other ranks run their own batches and wait for it in the MoE
    layers); ``balance`` is TensorRT-LLM's ADP balance (``attention_dp_config: {enable_balance: true,
    timeout_iters, batching_wait_iters}``, py_executor ``_balance_adp_requests``): prompts are held
    until every rank can take one, for at most ``timeout_iters`` steps per prompt, and, when every rank
    is decoding, for ``batching_wait_iters`` more steps to gather a batch (scheduler/dp_attention.py).
    """

    model_config = ConfigDict(extra="forbid")

    ranks: int | None = Field(
        None, ge=1, le=1024,
        description="attention-DP ranks this scheduler drives (a scenario fills it: layout.dp / effects.mirror)",
    )
    prefill: Literal["immediate", "balance"] = Field(
        "immediate", description="immediate: a prompt starts on the least-loaded rank as soon as it fits (SGLang); "
        "balance: prompts wait until every rank can take one (TensorRT-LLM enable_balance)",
    )
    timeout_iters: int = Field(
        50, ge=0, le=100_000,
        description="balance: most steps any prompt is held waiting for every rank to have one (TensorRT-LLM default 50)",
    )
    batching_wait_iters: int = Field(
        10, ge=0, le=100_000,
        description="balance: extra steps to gather prompts once every rank has one and every rank is decoding "
        "(TensorRT-LLM default 10; still within timeout_iters per prompt)",
    )
    rank_token_budget: int | None = Field(
        None, ge=1, le=1 << 22,
        description="most tokens (decodes + prompt chunks) one rank runs per step, at most (and by default) "
        "max_num_batched_tokens / ranks: the share the memory fit sizes each GPU's workspace for",
    )


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
#   attention_dp_config.enable_balance (the ADP balance strategy, TensorRT-LLM tech blog 10: "ADP
#   Balance Strategy") holds context requests until every rank has one: AttentionDPConfig below.
SCHEDULER_PRESETS: dict[str, dict] = {
    "vllm-v0": {"mixed_batches": False, "enable_chunked_prefill": False, "async_overlap": False, "host_profile": "vllm-v0"},
    "vllm-v1": {"mixed_batches": True, "enable_chunked_prefill": True, "async_overlap": False, "host_profile": "vllm-v1"},
    "sglang": {"mixed_batches": False, "enable_chunked_prefill": True, "async_overlap": True, "host_profile": "sglang"},
    "trtllm-attention-dp": {"mixed_batches": True, "enable_chunked_prefill": False, "async_overlap": True, "host_profile": "trtllm",
                            "attention_dp": AttentionDPConfig(prefill="balance")},
}
PresetName = Literal["vllm-v0", "vllm-v1", "sglang", "trtllm-attention-dp"]


def token_budget_for(max_num_seqs: int, tokens: int) -> int:
    """A step's token budget at least ``max_num_seqs`` (each running request's decode fits one step): ``max(tokens,
    max_num_seqs)`` with ``max_num_seqs`` held to its own bound, so a --max-num-seqs past it is named once, as itself,
    not again as the budget derived from it."""
    seqs_max = SchedulerConfig.model_fields["max_num_seqs"].metadata
    cap = min((m.le for m in seqs_max if getattr(m, "le", None) is not None), default=max_num_seqs)
    return max(tokens, min(max_num_seqs, cap))


def _apply_host_profile(data):
    """Fill the named host profile's terms under the fields given explicitly (an unknown name is left to the
    field's error)."""
    if not isinstance(data, dict) or data.get("host_profile") not in HOST_PROFILES:
        return data
    p = HOST_PROFILES[data["host_profile"]]
    return {"host_step_s": p.step_s, "host_per_request_s": p.per_request_s, "host_per_token_s": p.per_token_s,
            "async_overlap_hides": p.overlap_hides, **data}


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
    max_model_len: int | None = Field(None, ge=1, le=MAX_MODEL_LEN_LIMIT, description="most tokens (prompt + output) one request may "
                                      "hold; null: the model's context (for_model), as vLLM and SGLang default it; at "
                                      "most that context")
    async_overlap: bool = Field(True, description="prepare step N+1 on the CPU while the GPU runs step N")
    async_overlap_hides: float = Field(
        1.0, gt=0.0, le=1.0, description="share of the host work async overlap hides under the device (1: all; "
        "vLLM v0's async output processor ~0.25); the rest runs between steps. Set by host_profile",
    )
    host_profile: HostProfileName | None = Field(
        None, description="an engine style's host step time and overlap share (costmodels.host.HOST_PROFILES: "
        "twinfer-default, twinfer-executor-measured, vllm-v0, vllm-v1, sglang, trtllm; each preset names its own): "
        "fills host_step_s, host_per_request_s, host_per_token_s and async_overlap_hides unless given here too",
    )
    host_step_s: float = Field(DEFAULT_HOST_STEP_S, ge=0.0, le=1.0, description="host overhead per step, fixed part (s)")
    host_per_request_s: float = Field(DEFAULT_HOST_PER_REQUEST_S, ge=0.0, le=0.01, description="host overhead per scheduled request per step (s)")
    host_workers: int = Field(
        1, ge=1, le=4096,
        description="scheduler processes sharing the per-request and per-token host work in parallel "
        "(SGLang's attention-DP runs one scheduler per DP rank)",
    )
    host_per_token_s: float = Field(DEFAULT_HOST_PER_TOKEN_S, ge=0.0, le=0.001, description="host overhead per batched token per step (s)")
    host_admit_s: float = Field(0.0, ge=0.0, le=0.01, description="host time admitting one request (s), charged once, to "
                                "the step of its first prompt chunk (a measured profile's loop.admit_s; 0: not priced)")
    host_admit_per_token_s: float = Field(0.0, ge=0.0, le=1e-5, description="admission host time per prompt token (s): "
                                          "token-id checks and the prefix cache's block hashes")
    host_after_eager_s: float = Field(0.0, ge=0.0, le=0.01, description="seconds the step right after a prefill-bearing "
                                      "step pays (a measured profile's host.after_eager_s; 0: not priced)")
    host_after_eager_decode_s: list[Annotated[float, Field(ge=0.0, le=0.01)]] = Field(
        default_factory=list, max_length=16, description="seconds the j-th decode step after a prefill-bearing step pays, "
        "j = 1..len (a measured profile's host.after_eager_decode_s; empty: host_after_eager_s for the first step)")
    host_after_eager_decode_by_tokens: list[tuple[Annotated[int, Field(ge=1)],
                                                 list[Annotated[float, Field(ge=0.0, le=0.01)]]]] = Field(
        default_factory=list, max_length=8, description="that decay measured behind prompt steps of several sizes, as "
        "(prompt tokens, [seconds per decode step]) pairs; where given it replaces host_after_eager_decode_s, priced at "
        "the prompt-bearing step's token count (a measured profile's host.after_eager_decode_by_tokens; empty: not)")
    attention_dp: AttentionDPConfig | None = Field(
        None, description="attention-DP ranks scheduled explicitly: request -> rank, per-rank token/KV/seat budgets, "
        "prefill policy (immediate / balance); null: one pooled batch, the cost model splits each step over the ranks",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data):
        """Fill the preset's knobs under the fields given explicitly (an unknown preset is left to the field's error)."""
        if isinstance(data, dict) and data.get("preset") in SCHEDULER_PRESETS:
            preset = SCHEDULER_PRESETS[data["preset"]]
            merged = {**preset, **data}
            if isinstance(data.get("attention_dp"), dict) and "attention_dp" in preset:   # a file may tune one knob
                merged["attention_dp"] = {**preset["attention_dp"].model_dump(exclude_unset=True), **data["attention_dp"]}
            data = merged
        return _apply_host_profile(data)

    @model_serializer(mode="wrap")
    def _drop_unset_replay(self, handler, info):
        """Leave ``replay`` out of dumps while it is null, so scenario dumps (and result digests) from before
        per-layer replay policies stay byte-identical (a dump with context ``{"all_fields": True}`` keeps them:
        ``twinfer simulate --print-scenario --all``)."""
        data = handler(self)
        if info.context and info.context.get("all_fields"):
            return data
        if isinstance(data, dict) and data.get("replay", 0) is None:
            del data["replay"]
        if isinstance(data, dict) and data.get("attention_dp", 0) is None:
            del data["attention_dp"]   # likewise for dumps from before explicit attention-DP ranks
        if isinstance(data, dict) and data.get("host_profile", 0) is None and data.get("async_overlap_hides") == 1.0:
            del data["host_profile"], data["async_overlap_hides"]   # and from before host profiles
        if isinstance(data, dict) and data.get("host_after_eager_decode_s", 0) == []:
            del data["host_after_eager_decode_s"]   # and from before the measured decay after a prefill-bearing step
        if isinstance(data, dict) and data.get("host_after_eager_decode_by_tokens", 0) == []:
            del data["host_after_eager_decode_by_tokens"]   # and from before it was measured by prompt size
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
        self._check_attention_dp(per_seq)
        return self

    def _check_attention_dp(self, per_seq: int) -> None:
        """Each rank's token budget must hold its share of the running decodes (as the instance's must)."""
        ad = self.attention_dp
        if ad is None or not ad.ranks:
            return
        seats, budget = self.rank_seats(), self.rank_token_budget()
        if budget > per_rank_share(self.max_num_batched_tokens, ad.ranks):
            # one definition: the memory fit sizes each GPU's workspace for the instance budget's per-rank share
            raise ValueError(
                f"attention_dp.rank_token_budget={budget} exceeds max_num_batched_tokens / attention_dp.ranks = "
                f"{per_rank_share(self.max_num_batched_tokens, ad.ranks)} (the share each GPU's workspace is sized for): "
                f"raise max_num_batched_tokens to {budget * ad.ranks} instead"
            )
        if seats * per_seq > budget:
            raise ValueError(
                f"attention_dp.rank_token_budget={budget} cannot hold one rank's {seats} running decodes of {per_seq} tokens "
                f"(max_num_seqs {self.max_num_seqs} over attention_dp.ranks={ad.ranks}): raise attention_dp.rank_token_budget "
                "or max_num_batched_tokens, or lower max_num_seqs"
            )
        if not self.enable_chunked_prefill and budget < per_seq + 1:
            raise ValueError(f"attention_dp.rank_token_budget={budget} leaves no room for a prompt next to a decode")

    def rank_seats(self) -> int:
        """Requests one attention-DP rank may run at once: its share of max_num_seqs (costmodels.memory.per_rank_share)."""
        return per_rank_share(self.max_num_seqs, self.attention_dp.ranks or 1)

    def rank_token_budget(self) -> int:
        """Tokens one attention-DP rank may run per step: attention_dp.rank_token_budget, else its share of max_num_batched_tokens."""
        ad = self.attention_dp
        return ad.rank_token_budget or per_rank_share(self.max_num_batched_tokens, ad.ranks or 1)

    def for_model(self, model: ModelSpec) -> "SchedulerConfig":
        """This config serving ``model``: ``max_model_len`` at most the model's context (``max_position_embeddings``),
        as the executor's engine caps it (``LLMEngine.from_args``), so both backends refuse the same requests."""
        if self.max_model_len is not None and self.max_model_len <= model.max_context:
            return self
        return self.model_copy(update={"max_model_len": model.max_context})

    @property
    def request_tokens_limit(self) -> int:
        """``max_model_len``, or where it is unset (no model applied: ``for_model``) the largest it may be."""
        return self.max_model_len if self.max_model_len is not None else MAX_MODEL_LEN_LIMIT

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

    def overlap(self) -> bool | float:
        """The overlap rule's argument (costmodels.host.wall_time): False, True, or the share hidden."""
        if not self.async_overlap:
            return False
        return True if self.async_overlap_hides >= 1.0 else self.async_overlap_hides

    def host_overhead_s(self, num_requests: int, num_tokens: int) -> float:
        """Host time of one step scheduling ``num_requests`` requests and ``num_tokens`` tokens."""
        return self.host_step_s + (self.host_per_request_s * num_requests + self.host_per_token_s * num_tokens) / self.host_workers
