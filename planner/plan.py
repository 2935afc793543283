"""The exported deployment plan: a YAML ``twinfer simulate --plan`` takes as it is.

A plan holds the scenario pieces (model, hardware, pools with their layouts and scheduler
policies, routers, KV link, serving effects, workload at the planned rate, SLO, seed), what the
planner predicted (and whether the simulator confirmed it), its economics, why it won, and the
assumptions behind the numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from costmodels.layout import ParallelLayout
from planner.economics import Economics
from scheduler.config import SchedulerConfig
from sim.disagg import DisaggSpec, LinkKind
from sim.effects import EffectsSpec
from scheduler.metrics import SLO
from sim.router import RouterConfig
from sim.scenario import Scenario
from sim.workload import WorkloadSpec
from twinfer.config import load_model_file, validate
from twinfer.errors import TwinferError

PLAN_VERSION = 1


class PoolPlan(BaseModel):
    """One pool of identical instances."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["mixed", "prefill", "decode"]
    instances: int = Field(..., ge=1, le=100_000)
    layout: ParallelLayout
    scheduler: SchedulerConfig
    label: str = ""

    @property
    def gpus(self) -> int:
        return self.instances * self.layout.gpus


class Predicted(BaseModel):
    """The plan's expected performance and where the numbers come from."""

    model_config = ConfigDict(extra="forbid")
    source: Literal["screen", "simulation"]
    request_rate: float = Field(..., description="requests/s the deployment is planned for")
    output_tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    ttft_s: float = Field(..., description="at the SLO percentile (screen: estimate)")
    tpot_s: float
    screen_output_tokens_per_s_per_gpu: float | None = None
    simulated_requests: int | None = None
    simulated_gpus: float | None = None
    goodput_fraction: float | None = None
    sim_digest: str | None = None
    window: str | None = Field(None, description="which run and window the figures cover (a simulation's steady window, or the screen)")


class Plan(BaseModel):
    """A deployment plan (YAML / JSON)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["twinfer-plan"] = "twinfer-plan"
    version: int = Field(PLAN_VERSION, ge=1, le=PLAN_VERSION)
    name: str = Field("plan", min_length=1, max_length=200)
    model: str
    hardware: str
    calibration: str | None = Field(None, description="calibration profile JSON the plan was made with")
    gpus_budget: int = Field(..., ge=1)
    mode: Literal["aggregated", "disaggregated"]
    pools: list[PoolPlan] = Field(..., min_length=1, max_length=2)
    router: RouterConfig = Field(default_factory=RouterConfig, description="mixed pool (aggregated) or prefill pool (disaggregated) router")
    decode_router: RouterConfig = Field(default_factory=lambda: RouterConfig(kind="least_outstanding"))
    kv_link: LinkKind = "auto"
    effects: EffectsSpec = Field(default_factory=EffectsSpec)
    workload: WorkloadSpec
    slo: SLO
    slo_percentile: Literal[50, 90, 99] = 90
    seed: int = Field(0, ge=0)
    steady_after_s: float | None = Field(None, ge=0, description="end of the workload's ramp-up: where the steady window starts")
    predicted: Predicted | None = None
    economics: Economics | None = None
    why: list[str] = Field(default_factory=list)
    defaults: list[str] = Field(default_factory=list, description="defaults the planner applied that change the answer (MTP, acceptance, expert skew)")
    assumptions: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _pools(self) -> "Plan":
        roles = [p.role for p in self.pools]
        if self.mode == "aggregated" and roles != ["mixed"]:
            raise ValueError(f"pools: an aggregated plan has one pool with role 'mixed' (got {roles})")
        if self.mode == "disaggregated" and sorted(roles) != ["decode", "prefill"]:
            raise ValueError(f"pools: a disaggregated plan has one 'prefill' and one 'decode' pool (got {roles})")
        if self.gpus_used > self.gpus_budget:
            raise ValueError(f"pools use {self.gpus_used} GPUs, more than gpus_budget={self.gpus_budget}")
        return self

    @property
    def gpus_used(self) -> int:
        return sum(p.gpus for p in self.pools)

    def pool(self, role: str) -> PoolPlan:
        for p in self.pools:
            if p.role == role:
                return p
        raise KeyError(role)

    def to_scenario(self, *, num_requests: int | None = None) -> Scenario:
        """The full-scale Scenario of this plan (effects and prefill pool included): ``twinfer simulate --plan``."""
        scenario, effects, disagg = self.to_simulation(num_requests=num_requests)
        return scenario.model_copy(update={"effects": effects, "disagg": disagg})

    def to_simulation(self, *, num_requests: int | None = None) -> tuple[Scenario, EffectsSpec, DisaggSpec | None]:
        """The scenario (mixed or decode pool), effects and prefill pool that simulate this plan at full scale."""
        main = self.pool("mixed" if self.mode == "aggregated" else "decode")
        wl = self.workload
        if num_requests is not None:
            wl = wl.model_copy(update={"num_requests": num_requests, "duration_s": None})
        # through validate(): a plan naming an unknown model or GPU is a user error, not a crash
        scenario = validate(Scenario, dict(
            name=self.name, description=f"twinfer plan: {self.mode} {self.model} on {self.gpus_used}x{self.hardware}",
            model=self.model, hardware=self.hardware, calibration=self.calibration, layout=main.layout, instances=main.instances,
            scheduler=main.scheduler, workload=wl, router=self.router, slo=self.slo, seed=self.seed,
            steady_after_s=self.steady_after_s,
        ), "plan")
        disagg = None
        if self.mode == "disaggregated":
            pre = self.pool("prefill")
            disagg = DisaggSpec(prefill_layout=pre.layout, prefill_instances=pre.instances, prefill_scheduler=pre.scheduler,
                                prefill_router=self.router, decode_router=self.decode_router, kv_link=self.kv_link)
        return scenario, self.effects.model_copy(update={"mirror": 1}), disagg

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False, width=120)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml(), encoding="utf-8")


def load_plan(path: str | Path) -> Plan:
    """Read a plan file; errors name the offending field."""
    data_path = Path(path)
    if not data_path.is_file():
        raise TwinferError(f"{path}: no such plan file")
    return load_model_file(Plan, path)
