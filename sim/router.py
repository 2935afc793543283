"""Cluster routers: which instance gets an arriving request (a pluggable policy class)."""

from __future__ import annotations

from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler.request import Request
from scheduler.scheduler import Scheduler

RouterKind = Literal["round_robin", "least_outstanding", "prefix_aware"]


class RouterConfig(BaseModel):
    """Routing policy; in YAML either a name (``router: prefix_aware``) or a mapping."""

    model_config = ConfigDict(extra="forbid")

    kind: RouterKind = Field("least_outstanding", description="round_robin | least_outstanding | prefix_aware")
    load_threshold: float = Field(
        0.25, ge=0.0, le=100.0,
        description="prefix_aware: an instance is a candidate if its outstanding tokens are within this fraction above the least loaded",
    )
    load_slack_tokens: int = Field(
        8192, ge=0, le=1 << 30,
        description="prefix_aware: ... plus this many tokens (so idle-ish clusters still follow the cache)",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data):
        return {"kind": data} if isinstance(data, str) else data


class Router:
    """Base policy: ``choose(request, schedulers) -> index``; schedulers expose load and cache state."""

    def choose(self, req: Request, schedulers: Sequence[Scheduler]) -> int:
        raise NotImplementedError


class RoundRobinRouter(Router):
    """Instances in turn, ignoring their state."""

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: Request, schedulers: Sequence[Scheduler]) -> int:
        i = self._next % len(schedulers)
        self._next = i + 1
        return i


class LeastOutstandingRouter(Router):
    """The instance with the fewest outstanding tokens (unprefilled prompt + ungenerated output); ties: lowest index."""

    def choose(self, req: Request, schedulers: Sequence[Scheduler]) -> int:
        best, best_load = 0, None
        for i, s in enumerate(schedulers):
            load = s.outstanding_tokens
            if best_load is None or load < best_load:
                best, best_load = i, load
        return best


class PrefixAwareRouter(Router):
    """Longest cached prefix among instances not overloaded (SGLang's cache-aware router, simplified).

    Candidates are instances whose outstanding tokens are at most ``(1 + load_threshold) * min +
    load_slack_tokens``; among them the longest prefix-cache match wins, then the lighter load,
    then the lower index. Without any match this is least-outstanding routing.
    """

    def __init__(self, load_threshold: float, load_slack_tokens: int):
        self.load_threshold = load_threshold
        self.load_slack_tokens = load_slack_tokens

    def choose(self, req: Request, schedulers: Sequence[Scheduler]) -> int:
        loads = [s.outstanding_tokens for s in schedulers]
        limit = (1.0 + self.load_threshold) * min(loads) + self.load_slack_tokens
        best, best_key = 0, None
        for i, s in enumerate(schedulers):
            if loads[i] > limit:
                continue
            key = (-s.prefix_match_tokens(req), loads[i], i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best


def make_router(config: RouterConfig) -> Router:
    """The Router object for ``config``."""
    if config.kind == "round_robin":
        return RoundRobinRouter()
    if config.kind == "least_outstanding":
        return LeastOutstandingRouter()
    return PrefixAwareRouter(config.load_threshold, config.load_slack_tokens)
