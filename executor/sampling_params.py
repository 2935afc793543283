"""Per-request generation settings (pydantic, torch-free so the HTTP layer can import it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SamplingParams(BaseModel):
    """How one request samples and when it stops."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(16, ge=1, description="most tokens to generate")
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus mass kept (1 = off)")
    top_k: int = Field(-1, description="keep the k most likely tokens (-1 = off)")
    seed: int | None = Field(None, description="per-request sampling seed (None: derived from the engine seed and request id)")
    stop_token_ids: list[int] = Field(default_factory=list, description="stop after generating any of these")
    ignore_eos: bool = Field(False, description="keep generating past the EOS token")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v
