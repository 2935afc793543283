"""Prefill/decode disaggregation: two pools of instances and the KV transfer between them.

A request arrives at the **prefill pool** (its own router, prefix-cache aware by default) as a
prompt-only copy (output 1 token: the first token is sampled where the prompt is computed, as
in Mooncake / Dynamo). When that copy finishes, the original request carries the first token's
timestamp and its KV is shipped to a **decode instance** chosen by the decode router (least
outstanding tokens): ``prompt * kv_bytes_per_token + window bytes`` (one copy: MLA latents
are replicated over TP, so any TP rank can send) over

- scale-up links (NVLink) when both pools sit in one scale-up domain, else the scale-out NIC;
- at ``per-GPU link bandwidth x GPUs of one DP rank (tp x pp, they send layer shards in
  parallel) x efficiency``, plus a fixed latency;
- with queueing: every prefill instance has a sender and every decode instance a receiver
  (``simpy.Resource`` with one slot per DP rank); a transfer holds one slot of each.

The decode instance admits the request straight into its decode batch once it has KV blocks
for the prompt (``Scheduler.add_prefilled``); it never recomputes the prompt unless preempted.
"""

from __future__ import annotations

from typing import Literal

import simpy
from pydantic import BaseModel, ConfigDict, Field

from costmodels.layout import ParallelLayout
from scheduler.config import SchedulerConfig
from scheduler.request import Request, RequestStatus
from sim.router import RouterConfig

LinkKind = Literal["auto", "scaleup", "scaleout"]


class DisaggSpec(BaseModel):
    """The prefill pool of a disaggregated deployment (the scenario's layout/instances/scheduler are the decode pool)."""

    model_config = ConfigDict(extra="forbid")

    prefill_layout: ParallelLayout = Field(..., description="parallel layout of one prefill instance")
    prefill_instances: int = Field(1, ge=1, le=4096)
    prefill_scheduler: SchedulerConfig | None = Field(None, description="prefill pool scheduler (default: the decode pool's, draft_len 0)")
    prefill_router: RouterConfig = Field(default_factory=lambda: RouterConfig(kind="prefix_aware"))
    decode_router: RouterConfig = Field(default_factory=lambda: RouterConfig(kind="least_outstanding"))
    kv_link: LinkKind = Field("auto", description="auto: scale-up if all GPUs fit in one scale-up domain, else scale-out")
    link_efficiency: float = Field(0.8, gt=0, le=1, description="achieved share of link bandwidth for KV transfers (assumption)")
    transfer_latency_s: float = Field(20e-6, ge=0, le=1, description="fixed cost per transfer (RDMA / NVLink setup)")
    prefill_mirror: int = Field(1, ge=1, le=4096, description="simulate 1/mirror of each prefill instance's DP ranks (see EffectsSpec.mirror)")

    def prefill_config(self, decode: SchedulerConfig) -> SchedulerConfig:
        """The prefill pool's scheduler: as given, or the decode pool's without speculative drafts."""
        if self.prefill_scheduler is not None:
            return self.prefill_scheduler
        return decode.model_copy(update={"draft_len": 0, "acceptance_rates": []})


class _PrefillMetrics:
    """The prefill pool's view of the metrics collector: steps count, finishes hand over to the transfer."""

    def __init__(self, collector, originals: dict[str, Request], on_prefilled):
        self.collector, self.originals, self.on_prefilled = collector, originals, on_prefilled

    def on_arrival(self, req: Request) -> None:
        self.collector.on_arrival(self.originals[req.request_id])

    def on_plan(self, *args, **kw) -> None:
        self.collector.on_plan(*args, **kw)

    def on_step(self, *args, **kw) -> None:
        self.collector.on_step(*args, **kw)

    def on_finish(self, req: Request) -> None:
        self.on_prefilled(req)

    def on_drop(self, req: Request) -> None:
        orig = self.originals[req.request_id]
        orig.status = RequestStatus.DROPPED
        orig.drop_reason = req.drop_reason
        self.collector.on_drop(orig)


def prompt_copy(req: Request) -> Request:
    """The prefill pool's copy of ``req``: same prompt, one output token (the first)."""
    return Request(req.request_id, req.arrival_time, req.prompt_len, 1, req.block_hashes, req.priority, req.session_id)


class KVLinks:
    """Senders per prefill instance and receivers per decode instance, each a simpy Resource (one slot per DP rank)."""

    def __init__(self, env: simpy.Environment, prefill_slots: list[int], decode_slots: list[int], bandwidth: float, latency_s: float):
        self.env = env
        self.send = [simpy.Resource(env, capacity=s) for s in prefill_slots]
        self.recv = [simpy.Resource(env, capacity=s) for s in decode_slots]
        self.bandwidth, self.latency_s = bandwidth, latency_s
        self.transfers = 0
        self.bytes = 0.0
        self.busy_s = 0.0
        self.wait_s = 0.0

    def transfer(self, src: int, dst: int, nbytes: float, done):
        """simpy process: hold a sender slot of ``src`` and a receiver slot of ``dst`` for the copy, then ``done()``."""
        t0 = self.env.now
        with self.send[src].request() as s:
            yield s
            with self.recv[dst].request() as r:
                yield r
                self.wait_s += self.env.now - t0
                dt = nbytes / self.bandwidth + self.latency_s
                yield self.env.timeout(dt)
                self.busy_s += dt
        self.transfers += 1
        self.bytes += nbytes
        done()


def link_bandwidth(spec: DisaggSpec, hw, total_gpus: int) -> tuple[float, str]:
    """Bytes/s of one KV transfer lane and the link it uses."""
    kind = spec.kv_link
    if kind == "auto":
        kind = "scaleup" if total_gpus <= hw.scaleup_domain else "scaleout"
    per_gpu = hw.scaleup_bw if kind == "scaleup" else hw.scaleout_bw
    lanes = spec.prefill_layout.tp * spec.prefill_layout.pp
    return per_gpu * lanes * spec.link_efficiency, kind


def transfer_bytes(per_token: float, fixed: float, req: Request) -> float:
    """KV bytes of ``req``'s prompt."""
    return req.prompt_len * per_token + fixed
