"""Sliding-window bounded replay: recompute the last W tokens on resume instead of keeping their window KV.

Sliding-window layers (and the uncompressed window of V4's csa/hca layers) need the KV of the
last ``sliding_window`` tokens to continue a sequence. A request that pauses (between agentic
turns, or a prompt that hits a cached prefix) can keep that window KV alive — a fixed
``window_bytes`` per resumable sequence (DeepSeek-V4-Flash FP4: ~2 MB, the KV of ~750 tokens
of its compressed layers) — or drop part of it and recompute. With replay length ``W``
(0 <= W <= window) the last W tokens are recomputed on resume (W more prefill tokens) and only
``window - W`` entries per layer are kept, so kept bytes fall linearly with W while prefill
compute rises by W tokens per resume. Our reading of the V4 mechanism ("recompute only the
last W tokens when a request resumes or a prefix hits"); the exact V4 policy is not public.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodels.layout import DType
from costmodels.memory import kv_rates
from costmodels.model_spec import ModelSpec


@dataclass(frozen=True)
class ReplayTradeoff:
    """What replay length ``replay_tokens`` costs and saves per resumable sequence (unsharded, whole model)."""

    replay_tokens: int           # tokens recomputed on every resume / prefix hit
    window_tokens: int           # the model's sliding window (0: no sliding layers, nothing to trade)
    kept_window_bytes: float     # window KV kept per paused sequence
    full_window_bytes: float     # the same with no replay (W = 0)

    @property
    def saved_bytes(self) -> float:
        return self.full_window_bytes - self.kept_window_bytes


def replay_tradeoff(model: ModelSpec, kv_dtype: DType, replay_tokens: int) -> ReplayTradeoff:
    """KV kept and tokens recomputed per paused sequence for replay length ``replay_tokens`` (clipped to the window)."""
    window = int(model.sliding_window or 0)
    full = kv_rates(model, kv_dtype)[1] if window else 0.0
    w = max(0, min(int(replay_tokens), window))
    kept = full * (1.0 - w / window) if window else 0.0
    return ReplayTradeoff(replay_tokens=w, window_tokens=window, kept_window_bytes=kept, full_window_bytes=full)
