"""What a user asks the planner: model, hardware, GPU budget, workload, SLO, prices, and the search space."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from costmodels.layout import DType
from costmodels.moe_load import ExpertLoadSpec
from scheduler.metrics import SLO
from sim.workload import WorkloadSpec, offered_rate, trace_arrivals

Mode = Literal["aggregated", "disaggregated"]

# DeepSeek API list prices for deepseek-chat (DeepSeek-V3), USD per million tokens:
# api-docs.deepseek.com/quick_start/pricing-details-usd (cache hit 0.07, cache miss 0.27, output 1.10).
DEFAULT_PRICE_INPUT = 0.27
DEFAULT_PRICE_CACHED_INPUT = 0.07
DEFAULT_PRICE_OUTPUT = 1.10


class Prices(BaseModel):
    """Token prices (USD per million tokens) for revenue, and an optional $/GPU-hour override."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_per_mtok: float = Field(DEFAULT_PRICE_INPUT, ge=0, le=1e4, description="prompt tokens not served from a cache")
    cached_input_per_mtok: float = Field(DEFAULT_PRICE_CACHED_INPUT, ge=0, le=1e4, description="prompt tokens served from the prefix cache")
    output_per_mtok: float = Field(DEFAULT_PRICE_OUTPUT, ge=0, le=1e4)
    gpu_hour: float | None = Field(None, ge=0, le=1e4, description="$/GPU-hour (default: the hardware catalog's TCO estimate)")


class SearchSpace(BaseModel):
    """Which deployments the planner enumerates. Defaults cover what SGLang/vLLM/TensorRT-LLM ship for MoE serving."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    modes: tuple[Mode, ...] = Field(("aggregated", "disaggregated"), min_length=1)
    tp: tuple[int, ...] = Field((1, 2, 4, 8), min_length=1, description="tensor-parallel degrees of TP layouts (EP = TP or none)")
    dep: tuple[int, ...] = Field((2, 4, 8, 16, 32, 64, 72, 128, 256), description="attention-DP x EP widths of DEP / wide-EP layouts (tp 1)")
    dep_attention_tp: tuple[int, ...] = Field(
        (1,), min_length=1, description="attention tensor-parallel degrees inside DEP layouts (tp x dp GPUs = the DEP width; "
        "AIConfigurator's tp x dp): 1 = pure attention DP; more add TP x DP hybrids")
    dep_moe_tp: tuple[int, ...] = Field(
        (1,), min_length=1, description="MoE tensor-parallel degrees inside DEP layouts (experts over width / moe_tp EP ranks, "
        "each split moe_tp ways; AIConfigurator's etp x ep): 1 = pure EP")
    pp: tuple[int, ...] = Field((1, 2, 4), min_length=1, description="pipeline stages, tried only when nothing fits without them")
    prefill_max_gpus: int = Field(16, ge=1, le=4096, description="widest prefill-pool instance (DEP at small width for prefill)")
    weight_dtype: DType | None = Field(None, description="dense/attention weights (default: the checkpoint's)")
    expert_dtype: DType | None = Field(None, description="routed experts (default: the checkpoint's)")
    kv_dtypes: tuple[DType, ...] | None = Field(None, description="KV cache dtypes to try (default: the model's)")
    two_micro_batch: tuple[bool, ...] = Field((False, True), min_length=1)
    eplb: tuple[Literal["off", "rebalance", "redundant"], ...] = Field(
        ("off", "redundant"), min_length=1,
        description="off: contiguous experts; rebalance: EPLB placement, no extra replicas; redundant: EPLB + one replica per EP rank",
    )
    batch_per_rank: tuple[int, ...] = Field((8, 16, 32, 64, 128, 256), min_length=1, description="max running requests per attention-DP rank (max batch)")
    draft_len: tuple[int, ...] | None = Field(None, description="MTP draft lengths (default 0..3 with an MTP head, else 0)")
    async_overlap: tuple[bool, ...] = Field((True, False), min_length=1)
    chunk_tokens: tuple[int, ...] = Field((4096, 8192, 16384), min_length=1, description="prefill tokens per attention-DP rank per step (chunk size)")
    table_placement: tuple[Literal["host", "hbm"], ...] = Field(("host", "hbm"), min_length=1, description="lookup tables (models that have them)")

    @field_validator("tp", "dep", "dep_attention_tp", "dep_moe_tp", "pp", "batch_per_rank", "chunk_tokens")
    @classmethod
    def _positive(cls, v):
        if any(x < 1 for x in v):
            raise ValueError("entries must be >= 1")
        return tuple(sorted(set(v)))

    @field_validator("draft_len")
    @classmethod
    def _drafts(cls, v):
        if v is not None and any(not 0 <= x <= 16 for x in v):
            raise ValueError("entries must be in 0..16")
        return None if v is None else tuple(sorted(set(v)))


class PlanRequest(BaseModel):
    """Everything ``twinfer plan`` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("deepseek-v3", description="model catalog name or config.json path")
    hardware: str = Field("gb300", description="GPU name from the hardware catalog or a YAML file")
    calibration: str | None = Field(None, description="calibration profile JSON whose efficiencies replace the defaults (twinfer calibrate)")
    gpus: int = Field(..., ge=1, le=100_000, description="GPU budget")
    workload: WorkloadSpec
    slo: SLO
    slo_percentile: Literal[50, 90, 99] = Field(90, description="the latency percentile the SLO bounds")
    prices: Prices = Field(default_factory=Prices)
    space: SearchSpace = Field(default_factory=SearchSpace)
    expert_load: ExpertLoadSpec = Field(default_factory=ExpertLoadSpec, description="per-expert load skew the plan must survive")
    host_cache_fraction: float = Field(
        0.5, ge=0, le=1,
        description="share of each GPU's host memory given to the prefix cache's host tier (HiCache L2) when the workload reuses prefixes",
    )
    simulate_top: int = Field(6, ge=0, le=256, description="candidates the simulator checks after the analytic screen")
    sim_requests: int = Field(2500, ge=100, le=1_000_000, description="most requests per simulation")
    seed: int = Field(0, ge=0, le=2**63 - 1)
    mem_fraction: float = Field(0.9, gt=0, le=1)

    @field_validator("hardware")
    @classmethod
    def _catalog_spelling(cls, v: str) -> str:
        """A catalog GPU under its catalog name (``h200`` -> ``H200``): the same plan, whatever the spelling, saves
        and digests the same; a file path is left as given."""
        from costmodels.hardware import catalog_name
        return catalog_name(v) or v

    @model_validator(mode="after")
    def _check(self) -> "PlanRequest":
        if self.workload.kind == "trace" and offered_rate(self.workload) is None:
            # the planner replays a trace at the rate it sizes each deployment for (sim.workload.at_rate, its arrival
            # times scaled): a trace arriving at one instant has no rate to scale
            n, _ = trace_arrivals(self.workload)
            raise ValueError(f"workload: the trace {self.workload.trace_path} has no arrival rate: its {n:,} request(s) "
                             "arrive at one instant (a trace's rate is its requests over the span of their arrival times); "
                             "the planner sizes a deployment for a rate, so give a trace whose arrivals spread over time "
                             "(`twinfer simulate --trace` runs a burst on a given deployment)")
        if self.workload.kind == "closed":
            raise ValueError("workload.kind: 'closed' fixes a concurrency, not a rate; the planner sizes a deployment "
                             "for a request rate (give kind poisson, gamma, constant or agentic); `twinfer simulate` "
                             "runs a closed loop on a given deployment")
        if set(self.space.modes) == {"disaggregated"} and self.gpus < 2:   # refused here, not screened into an empty table
            raise ValueError(f"space.modes: disaggregated alone needs gpus >= 2 (a prefill and a decode instance); "
                             f"gpus is {self.gpus}: plan more GPUs, or include aggregated")
        return self
