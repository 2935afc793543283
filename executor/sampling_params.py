"""Per-request generation settings (pydantic, torch-free so the HTTP layer can import it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


MIN_TEMPERATURE = 1e-4
MAX_TEMPERATURE = 1e4
MIN_TOP_P = 1e-6


class SamplingParams(BaseModel):
    """How one request samples and when it stops."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(16, ge=1, description="most tokens to generate")
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus mass kept (1 = off)")
    # bounded: an out-of-range value would overflow a tensor or torch.Generator inside a step,
    # and a step that raises ends the serving loop for every request
    top_k: int = Field(-1, le=2**31 - 1, description="keep the k most likely tokens (-1 = off)")
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1,
                             description="per-request sampling seed (None: derived from the engine seed and request id)")
    stop_token_ids: list[int] = Field(default_factory=list, description="stop after generating any of these")
    ignore_eos: bool = Field(False, description="keep generating past the EOS token")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v

    # The sampler divides logits by the temperature and keeps the nucleus in float32: a temperature
    # near 0 overflows the logits to inf and a top_p that rounds to 0 keeps no token, and either way
    # the step fails (NaN probabilities). Both limits are far below any useful setting.
    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if not (v == 0.0 or MIN_TEMPERATURE <= v <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}] (got {v!r})")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float) -> float:
        if v < MIN_TOP_P:
            raise ValueError(f"top_p must be in [{MIN_TOP_P:g}, 1] (got {v!r}); for the single most likely token use top_k=1")
        return v
