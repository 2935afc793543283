"""Parallel layout of one serving instance (a group of GPUs running one model replica)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer, model_validator

DType = Literal["bf16", "fp8", "fp4"]
CommOverlap = Literal["none", "combine_down", "tbo"]
DispatchDType = Literal["bf16", "fp8", "nvfp4"]
OffloadScope = Literal["routed_experts", "moe"]

MAX_DEGREE = 1024  # tp, dp and ep of one layout at most

# Knobs added after results were first digested: left out of dumps while at their defaults, so a
# layout that does not use them serialises (and digests) exactly as before they existed.
_OMIT_AT_DEFAULT = ("comm_overlap", "dispatch_dtype", "offload_fraction", "offload_scope")


class ParallelLayout(BaseModel):
    """How one instance spreads the model over its GPUs.

    Attention runs on ``tp * dp`` GPUs per pipeline stage: ``tp``-way tensor parallel inside
    each of ``dp`` attention data-parallel groups (attention-DP). MoE layers spread experts over
    ``ep`` GPUs with ``moe_tp = tp * dp // ep`` tensor parallelism inside each expert.
    """

    model_config = ConfigDict(extra="forbid")

    tp: int = Field(1, ge=1, le=MAX_DEGREE, description="tensor-parallel degree of attention/dense layers")
    dp: int = Field(1, ge=1, le=MAX_DEGREE, description="attention data-parallel groups (attention-DP)")
    ep: int = Field(1, ge=1, le=MAX_DEGREE, description="expert-parallel width of MoE layers")
    pp: int = Field(1, ge=1, le=64, description="pipeline-parallel stages")
    weight_dtype: DType = Field("bf16", description="dtype of dense/attention weights")
    expert_dtype: DType | None = Field(None, description="dtype of routed-expert weights (default: weight_dtype)")
    kv_dtype: DType = Field("bf16", description="dtype of the KV cache")
    two_micro_batch: bool = Field(False, description="overlap MoE all-to-all with compute using two micro-batches")
    eplb_redundant_experts: int = Field(0, ge=0, le=4096, description="extra expert replicas (EPLB)")
    comm_overlap: CommOverlap | None = Field(
        None,
        description="how the EP all-to-all overlaps compute: none | combine_down (each expert's combine sends start "
        "as its down GEMM finishes: single-batch overlap) | tbo (two micro-batches); unset: tbo when "
        "two_micro_batch, else none",
    )
    dispatch_dtype: DispatchDType | None = Field(
        None,
        description="EP dispatch payload: bf16 | fp8 (1x128 blocks, fp32 scales) | nvfp4 (16-value blocks, FP8 scales: "
        "4.5 bits/value; needs fp4 experts); unset: fp8 when experts are fp8/fp4, else bf16",
    )
    offload_fraction: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of the offload_scope weights of each MoE layer kept in host memory and prefetched over the "
        "host link one layer ahead (0: all in HBM)",
    )
    offload_scope: OffloadScope = Field("routed_experts", description="which weights offload_fraction applies to: routed_experts | moe (routed + shared experts)")

    @model_validator(mode="after")
    def _check_ep(self) -> "ParallelLayout":
        width = self.tp * self.dp
        if self.ep > width or width % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide tp*dp={width} (experts are spread over the attention GPUs of a stage)"
            )
        return self

    @model_validator(mode="after")
    def _check_overlap(self) -> "ParallelLayout":
        """comm_overlap and the older two_micro_batch flag must agree; ``tbo`` sets the flag the step model reads."""
        if self.comm_overlap not in (None, "none") and self.ep <= 1:
            raise ValueError(f"comm_overlap={self.comm_overlap} needs ep > 1 (there is no EP all-to-all to overlap at ep=1)")
        if self.comm_overlap == "tbo":
            self.two_micro_batch = True
        elif self.comm_overlap is not None and self.two_micro_batch:
            raise ValueError(f"comm_overlap={self.comm_overlap} contradicts two_micro_batch=true (that is comm_overlap=tbo); set one")
        if self.dispatch_dtype == "nvfp4" and self.experts_dtype != "fp4":
            raise ValueError(f"dispatch_dtype=nvfp4 needs fp4 experts (W4A4 grouped GEMM); expert dtype is {self.experts_dtype}: "
                             "set expert_dtype: fp4, or dispatch_dtype bf16/fp8")
        return self

    @model_validator(mode="after")
    def _check_ep_only(self) -> "ParallelLayout":
        """The EP all-to-all's knobs need ep > 1, as comm_overlap does: at ep=1 two_micro_batch was reported as 'tbo'
        and changed nothing, redundant experts added replica weights to every GPU, a dispatch dtype was shown unused."""
        if self.ep > 1:
            return self
        if self.two_micro_batch:   # comm_overlap=tbo sets it, and is refused at ep=1 above
            raise ValueError("two_micro_batch needs ep > 1 (two micro-batches hide the EP all-to-all; at ep=1 there is none)")
        if self.eplb_redundant_experts:
            raise ValueError(f"eplb_redundant_experts={self.eplb_redundant_experts} needs ep > 1 (EPLB replicas balance "
                             "experts over EP ranks; at ep=1 every GPU holds every expert)")
        if self.dispatch_dtype is not None:
            raise ValueError(f"dispatch_dtype={self.dispatch_dtype} needs ep > 1 (it is the EP all-to-all's payload; at "
                             "ep=1 nothing is dispatched)")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo):
        """The fields, less the newer knobs still at their defaults (see ``_OMIT_AT_DEFAULT``); all of them when the
        dump's context asks for ``all_fields`` (``model_dump(context={"all_fields": True})``, as
        ``twinfer simulate --print-scenario --all`` does)."""
        out = handler(self)
        if isinstance(out, dict) and not (info.context or {}).get("all_fields"):
            for name in _OMIT_AT_DEFAULT:
                if name in out and getattr(self, name) == type(self).model_fields[name].default:
                    del out[name]
        return out

    @property
    def overlap(self) -> CommOverlap:
        """The all-to-all overlap in force (``comm_overlap``, or what ``two_micro_batch`` says)."""
        if self.comm_overlap is not None:
            return self.comm_overlap
        return "tbo" if self.two_micro_batch else "none"

    @property
    def gpus(self) -> int:
        """GPUs one instance occupies."""
        return self.tp * self.dp * self.pp

    @property
    def moe_tp(self) -> int:
        """Tensor parallelism inside each expert."""
        return self.tp * self.dp // self.ep

    @property
    def experts_dtype(self) -> DType:
        return self.expert_dtype or self.weight_dtype

    def check_model(self, model, where: str = "layout") -> None:
        """Refuse a split ``model`` cannot take, naming the field (under ``where``), as vLLM and SGLang refuse it at
        start-up: attention heads that do not divide over ``tp`` (DeepSeek-V3's 128 over TP256 would leave half a head
        per GPU, and was priced), more pipeline stages than layers, or expert parallelism of a dense model (it was
        labelled 'DP8xEP8' with no all-to-all)."""
        from twinfer.errors import TwinferError

        heads = model.num_attention_heads
        if heads % self.tp:
            ok = [t for t in (1, 2, 4, 8, 16, 32, 64, 128) if t <= heads and heads % t == 0]
            raise TwinferError(f"{where}.tp: {self.tp} does not divide {model.name}'s {heads} attention heads "
                               f"(tensor parallelism splits them evenly); e.g. tp {', '.join(map(str, ok))}")
        if self.pp > model.num_layers:
            raise TwinferError(f"{where}.pp: {self.pp} pipeline stages for {model.name}'s {model.num_layers} layers "
                               f"(at most one stage per layer: pp 1..{model.num_layers})")
        if self.ep > 1 and not model.moe:
            raise TwinferError(f"{where}.ep: {self.ep} needs a MoE model; {model.name} is dense (no experts to spread "
                               "over EP ranks): ep 1")

    def describe(self) -> str:
        """Short human label, e.g. 'TP8 fp8' or 'DP8xEP8 fp8, fp4 experts' (the routed experts' dtype where it differs)."""
        parts = []
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        if self.tp > 1 or self.dp == 1:
            parts.append(f"TP{self.tp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        extra = ""
        if self.offload_fraction:
            extra = f" offload {self.offload_fraction:.0%} {'MoE' if self.offload_scope == 'moe' else 'experts'}"
        dtypes = self.weight_dtype if self.experts_dtype == self.weight_dtype else f"{self.weight_dtype}, {self.experts_dtype} experts"
        return "x".join(parts) + f" {dtypes}" + extra
