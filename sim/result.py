"""What a simulation run gives: ``SimResult`` (metrics plus what reproduces them, digested) and ``SimRun``."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from scheduler.metrics import MetricsCollector, SimMetrics
from scheduler.request import Request


class KVInfo(BaseModel):
    """KV cache of one instance, from costmodels.memory_fit."""

    block_size: int
    num_blocks: int
    capacity_tokens: int
    kv_bytes_per_token_per_gpu: float
    memory: str  # memory_fit's explanation


class SimResult(BaseModel):
    """A run's metrics with everything needed to reproduce it; ``digest`` is sha256 of the rest."""

    name: str
    description: str
    scenario: dict
    seed: int
    twinfer_version: str
    num_gpus: int
    kv: KVInfo
    cost_model_notes: list[str]
    num_requests: int
    simulated_s: float
    metrics: SimMetrics
    digest: str = ""


@dataclass
class SimRun:
    """A finished run: its result plus what exports need (the collector's step records, the requests)."""

    result: SimResult
    collector: MetricsCollector
    requests: list[Request]
    stopped_at_s: float | None = None   # a ``stop`` predicate ended the run here (sim.early_stop): partial figures
