"""A simulation scenario: model, hardware, layout, instances, scheduler, workload, router, SLO, seed,
and optionally serving effects (``effects``) and a prefill pool (``disagg``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from costmodels.layout import ParallelLayout
from scheduler.config import SchedulerConfig
from sim.disagg import DisaggSpec
from sim.effects import EffectsSpec
from scheduler.metrics import SLO
from sim.router import RouterConfig
from sim.workload import WorkloadSpec
from twinfer.config import load_model_file, validate
from twinfer.errors import TwinferError


class Scenario(BaseModel):
    """Everything one ``twinfer simulate`` run needs; loadable from YAML/JSON."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("custom", min_length=1, max_length=200)
    description: str = Field("", max_length=2000)
    model: str = Field("deepseek-v3", description="model catalog name (twinfer cost lists them) or a config.json path")
    hardware: str = Field("H200", description="GPU name from the hardware catalog")
    layout: ParallelLayout = Field(default_factory=ParallelLayout, description="parallel layout of one instance")
    instances: int = Field(1, ge=1, le=4096, description="identical instances (model replicas) behind the router")
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    workload: WorkloadSpec
    router: RouterConfig = Field(default_factory=RouterConfig)
    slo: SLO | None = Field(None, description="latency targets for goodput")
    seed: int = Field(0, ge=0, le=2**63 - 1)
    gpu_memory_fraction: float = Field(0.9, gt=0.0, le=1.0, description="share of HBM for weights + workspace + KV (vLLM's gpu_memory_utilization)")
    effects: EffectsSpec = Field(
        default_factory=EffectsSpec,
        description="serving effects beyond the step cost model: expert-load skew/drift, EPLB, attention-DP stragglers, lookup tables",
    )
    disagg: DisaggSpec | None = Field(
        None, description="prefill pool of a prefill/decode-disaggregated deployment (layout/instances/scheduler are then the decode pool)",
    )
    max_decode_steps: int = Field(
        256, ge=1, le=65536,
        description="most decode steps one plan may cover (1: single-step; results agree up to float rounding)",
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        from costmodels.catalog import get_model

        try:
            get_model(v)
        except TwinferError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("hardware")
    @classmethod
    def _known_hardware(cls, v: str) -> str:
        from costmodels.hardware import get_hardware

        try:
            get_hardware(v)
        except TwinferError as e:
            raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _drafts_need_mtp(self) -> "Scenario":
        if self.scheduler.draft_len:
            from costmodels.catalog import get_model

            m = get_model(self.model)
            if not m.mtp_layers:
                raise ValueError(
                    f"scheduler.draft_len={self.scheduler.draft_len} needs a multi-token-prediction head; {m.name} has mtp_layers=0"
                )
        return self

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole cluster (both pools when disaggregated)."""
        pre = self.disagg.prefill_instances * self.disagg.prefill_layout.gpus if self.disagg is not None else 0
        return self.instances * self.layout.gpus + pre

    @property
    def needs_deployment_runner(self) -> bool:
        """True when effects or disaggregation ask for ``sim.deployment`` rather than the plain runner."""
        return self.disagg is not None or self.effects != EffectsSpec()


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario file; errors name the offending field."""
    return load_model_file(Scenario, path)


def scenario_from_dict(data: dict, source: str = "scenario") -> Scenario:
    """Validate a scenario mapping; errors name the offending field."""
    return validate(Scenario, data, source)


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped in sim/data."""
    return sorted(p.name[: -len(".yaml")] for p in resources.files("sim").joinpath("data").iterdir() if p.name.endswith(".yaml"))


def builtin_scenario(name: str = "default") -> Scenario:
    """A built-in scenario by name (``default``: DeepSeek-V3 FP8 on one 8xH200 node)."""
    if name not in builtin_scenarios():
        from twinfer.errors import UnknownNameError

        raise UnknownNameError("built-in scenario", name, builtin_scenarios())
    with resources.as_file(resources.files("sim").joinpath("data", f"{name}.yaml")) as p:
        return load_scenario(p)
