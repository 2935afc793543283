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


MAX_RUN_REQUESTS = 100_000   # most requests a plan's run simulates (a run's memory and time grow with them)


class RunShare(BaseModel):
    """The part of a deployment its run simulates, where the whole would need more requests than a run holds.

    Identical instances behind a router carry equal shares of the traffic, so a run of ``instances`` of the mixed or
    decode pool's instances (and, disaggregated, the prefill instances in the same ratio, rounded up: never fewer than
    the whole's share) at the same share of the request rate is the deployment's per-GPU behaviour, router included,
    over a run long enough to reach its steady state. A run of the whole deployment on ``MAX_RUN_REQUESTS`` would
    end before its seats turned over (100,000 x GB300 DeepSeek-V3: 0.09 s of arrivals, 56 output tokens/s per GPU
    where its slice simulated 5,269)."""

    model_config = ConfigDict(extra="forbid")
    instances: int = Field(..., ge=1, le=100_000, description="instances of the mixed or decode pool the run simulates")
    whole_requests: int = Field(..., ge=1, description="requests a run of the whole deployment would need")

    def pool_instances(self, pool: "PoolPlan", main: "PoolPlan") -> int:
        """Instances of ``pool`` in the run: the main pool's ``instances``, another pool's in the same ratio rounded
        up (at most the pool's own)."""
        k = min(self.instances, main.instances)
        if pool is main:
            return k
        return min(pool.instances, max(1, -(-pool.instances * k // main.instances)))

    @staticmethod
    def best_instances(most: int, main: int, others: list[int]) -> int:
        """Of 1..``most`` main-pool instances, the one whose other pools round up least past their exact share (the
        most instances among ties): 41 prefill per 5 decode instances take 9 of 41 with 1 decode, 33 with 4."""
        def excess(k: int) -> float:
            return max([0.0] + [-(-n * k // main) / (n * k / main) - 1.0 for n in others])
        return min(range(1, most + 1), key=lambda k: (round(excess(k), 6), -k))


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
    run_share: RunShare | None = Field(None, description="the part of the deployment the plan's run simulates (None: all of it)")
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
        if self.run_share is not None:
            if self.workload.kind == "trace":
                raise ValueError("run_share: a trace replays its own arrivals, which a share of the deployment cannot "
                                 "take; remove run_share to replay the trace on the whole deployment")
            if self.run_share.instances > self.main_pool.instances:
                raise ValueError(f"run_share.instances: {self.run_share.instances} is more than the "
                                 f"{self.main_pool.role} pool's {self.main_pool.instances} instances")
        return self

    @property
    def gpus_used(self) -> int:
        return sum(p.gpus for p in self.pools)

    def pool(self, role: str) -> PoolPlan:
        for p in self.pools:
            if p.role == role:
                return p
        raise KeyError(role)

    @property
    def main_pool(self) -> PoolPlan:
        return self.pool("mixed" if self.mode == "aggregated" else "decode")

    @property
    def run_fraction(self) -> float:
        """The share of the deployment's request rate (and of its mixed or decode instances) the plan's run carries."""
        if self.run_share is None:
            return 1.0
        main = self.main_pool
        return self.run_share.pool_instances(main, main) / main.instances

    def per_gpu(self, run_output_tps: float) -> float:
        """Output tokens/s per GPU of the whole plan from its run's output tokens/s: the run carries ``run_fraction``
        of the rate, over the plan's GPUs (``planner.simulate.outcome_of``'s rule, a slice's too)."""
        return run_output_tps / self.run_fraction / self.gpus_used

    def run_users(self, users: int) -> int:
        """The closed-loop users of the plan's run for ``users`` across the whole deployment (at least one)."""
        return max(1, round(users * self.run_fraction))

    def run_instances(self, role: str) -> int:
        """Instances of the ``role`` pool the plan's run simulates."""
        pool = self.pool(role)
        return pool.instances if self.run_share is None else self.run_share.pool_instances(pool, self.main_pool)

    def run_description(self) -> str | None:
        """What the plan's run simulates when it is not the whole deployment, in words (None: the whole)."""
        if self.run_share is None:
            return None
        f = self.run_fraction
        parts = [f"{self.run_instances(p.role):,} of {p.instances:,} {p.role} instances"
                 + ("" if p is self.main_pool or self.run_instances(p.role) == p.instances * f else
                    f" (its exact share {p.instances * f:.3g}, rounded up)") for p in self.pools]
        gpus = sum(self.run_instances(p.role) * p.layout.gpus for p in self.pools)
        return (f"{' and '.join(parts)} ({gpus:,} of {self.gpus_used:,} GPUs) at {f:.4g} of the request rate: "
                f"a run of the whole deployment would need ~{self.run_share.whole_requests:,} requests to reach its steady "
                f"state, a run holds {MAX_RUN_REQUESTS:,}; identical instances behind the router carry equal shares, so "
                f"the whole plan's output is the run's / {f:.4g}, over its {self.gpus_used:,} GPUs")

    def to_scenario(self, *, num_requests: int | None = None) -> Scenario:
        """The Scenario of this plan's run (effects and prefill pool included): ``twinfer simulate --plan``. The whole
        deployment, or the part ``run_share`` names at its share of the request rate."""
        scenario, effects, disagg = self.to_simulation(num_requests=num_requests)
        return scenario.model_copy(update={"effects": effects, "disagg": disagg})

    def to_simulation(self, *, num_requests: int | None = None) -> tuple[Scenario, EffectsSpec, DisaggSpec | None]:
        """The scenario (mixed or decode pool), effects and prefill pool that simulate this plan at full scale."""
        main = self.main_pool
        wl = self.workload
        if num_requests is not None and wl.kind == "trace":   # a trace's first requests (num_requests was ignored)
            wl = wl.model_copy(update={"max_requests": num_requests})
        elif num_requests is not None:
            wl = wl.model_copy(update={"num_requests": num_requests, "duration_s": None})
        if self.run_share is not None and wl.rate:
            wl = wl.model_copy(update={"rate": wl.rate * self.run_fraction})
        # through validate(): a plan naming an unknown model or GPU is a user error, not a crash
        scenario = validate(Scenario, dict(
            name=self.name, description=f"twinfer plan: {self.mode} {self.model} on {self.gpus_used}x{self.hardware}",
            model=self.model, hardware=self.hardware, calibration=self.calibration, layout=main.layout, instances=self.run_instances(main.role),
            scheduler=main.scheduler, workload=wl, router=self.router, slo=self.slo, seed=self.seed,
            steady_after_s=self.steady_after_s,
        ), "plan")
        disagg = None
        if self.mode == "disaggregated":
            pre = self.pool("prefill")
            disagg = DisaggSpec(prefill_layout=pre.layout, prefill_instances=self.run_instances("prefill"), prefill_scheduler=pre.scheduler,
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
