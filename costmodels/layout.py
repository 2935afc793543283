"""Parallel layout of one serving instance (a group of GPUs running one model replica)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DType = Literal["bf16", "fp8", "fp4"]


class ParallelLayout(BaseModel):
    """How one instance spreads the model over its GPUs.

    Attention runs on ``tp * dp`` GPUs per pipeline stage: ``tp``-way tensor parallel inside
    each of ``dp`` attention data-parallel groups (attention-DP). MoE layers spread experts over
    ``ep`` GPUs with ``moe_tp = tp * dp // ep`` tensor parallelism inside each expert.
    """

    model_config = ConfigDict(extra="forbid")

    tp: int = Field(1, ge=1, le=1024, description="tensor-parallel degree of attention/dense layers")
    dp: int = Field(1, ge=1, le=1024, description="attention data-parallel groups (attention-DP)")
    ep: int = Field(1, ge=1, le=1024, description="expert-parallel width of MoE layers")
    pp: int = Field(1, ge=1, le=64, description="pipeline-parallel stages")
    weight_dtype: DType = Field("bf16", description="dtype of dense/attention weights")
    expert_dtype: DType | None = Field(None, description="dtype of routed-expert weights (default: weight_dtype)")
    kv_dtype: DType = Field("bf16", description="dtype of the KV cache")
    two_micro_batch: bool = Field(False, description="overlap MoE all-to-all with compute using two micro-batches")
    eplb_redundant_experts: int = Field(0, ge=0, le=4096, description="extra expert replicas (EPLB)")

    @model_validator(mode="after")
    def _check_ep(self) -> "ParallelLayout":
        width = self.tp * self.dp
        if self.ep > width or width % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide tp*dp={width} (experts are spread over the attention GPUs of a stage)"
            )
        return self

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

    def describe(self) -> str:
        """Short human label, e.g. 'TP8' or 'DP8xEP8 fp8'."""
        parts = []
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        if self.tp > 1 or self.dp == 1:
            parts.append(f"TP{self.tp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        return "x".join(parts) + f" {self.weight_dtype}"
