"""A simulation scenario: model, hardware, layout, instances, scheduler, workload, router, SLO, seed,
and optionally serving effects (``effects``) and a prefill pool (``disagg``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from costmodels.layout import ParallelLayout
from scheduler.config import SchedulerConfig
from sim.disagg import DisaggSpec
from sim.effects import EffectsSpec
from scheduler.metrics import SLO
from sim.router import RouterConfig
from sim.workload import WorkloadSpec
from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError

MAX_INSTANCES = 4096  # instances of one scenario (and of a plan's full-scale run, which is one)


class Scenario(BaseModel):
    """Everything one ``twinfer simulate`` run needs; loadable from YAML/JSON."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("custom", min_length=1, max_length=200)
    description: str = Field("", max_length=2000)
    model: str = Field("deepseek-v3", description="model catalog name (twinfer model lists them), an HF config.json (or its folder) or a ModelSpec YAML; paths relative to the scenario file")
    hardware: str = Field("H200", description="GPU name from the hardware catalog or a hardware YAML (twinfer hardware --template); paths relative to the scenario file")
    calibration: str | None = Field(None, description="calibration profile JSON (twinfer calibrate) whose efficiencies replace the defaults; relative to the scenario file")
    layout: ParallelLayout = Field(default_factory=ParallelLayout, description="parallel layout of one instance; dtypes left out follow the model's checkpoint (quantization_config)")
    instances: int = Field(1, ge=1, le=MAX_INSTANCES, description="identical instances (model replicas) behind the router")
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
    steady_after_s: float | None = Field(
        None, ge=0.0, le=1e9,
        description="where the steady window of the metrics starts (s; default: the 10th percentile arrival): the end of a "
                    "workload's ramp-up, e.g. agentic sessions filling up (twinfer plan sets it)",
    )
    max_decode_steps: int = Field(
        256, ge=1, le=65536,
        description="most decode steps one plan may cover (1: single-step; results agree up to float rounding)",
    )

    @model_validator(mode="before")
    @classmethod
    def _dtypes_follow_model(cls, data):
        """Layout dtypes a file leaves out follow the model's checkpoint (weights, experts, KV)."""
        return fill_layout_dtypes(data) if isinstance(data, dict) else data

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
    def _hardware_runs_dtypes(self) -> "Scenario":
        from costmodels.hardware import get_hardware

        hw = get_hardware(self.hardware)
        lays = [("layout", self.layout)] + ([("disagg.prefill_layout", self.disagg.prefill_layout)] if self.disagg else [])
        for where, lay in lays:
            hw.check_dtype(lay.weight_dtype, f"{where}.weight_dtype")
            hw.check_dtype(lay.experts_dtype, f"{where}.expert_dtype")
        return self

    @model_validator(mode="after")
    def _model_takes_layouts(self) -> "Scenario":
        """A split the model cannot take (ParallelLayout.check_model: heads over tp, stages over layers, EP of a dense
        model) is refused with the file, before a memory fit: TP3 of DeepSeek-V3 was said not to fit, and its hint led
        on to the heads error."""
        from costmodels.catalog import get_model

        m = get_model(self.model)
        lays = [("layout", self.layout)] + ([("disagg.prefill_layout", self.disagg.prefill_layout)] if self.disagg else [])
        for where, lay in lays:
            lay.check_model(m, where)
        return self

    @model_validator(mode="after")
    def _attention_dp_preset(self) -> "Scenario":
        """trtllm-attention-dp: one executor loop per attention-DP rank shares the host work (unless host_workers is set)."""
        if self.scheduler.preset == "trtllm-attention-dp":
            if self.layout.dp < 2:
                raise ValueError("scheduler.preset: trtllm-attention-dp needs an attention-DP layout (layout.dp >= 2, got 1)")
            if "host_workers" not in self.scheduler.model_fields_set:
                self.scheduler = self.scheduler.model_copy(update={"host_workers": self.layout.dp})
        return self

    @model_validator(mode="after")
    def _attention_dp_ranks(self) -> "Scenario":
        """scheduler.attention_dp drives the layout's layout.dp / effects.mirror ranks (filled in when left out)."""
        ad = self.scheduler.attention_dp
        if ad is None:
            return self
        want = self.layout.dp // self.effects.mirror
        if want < 2:
            raise ValueError(f"scheduler.attention_dp needs at least 2 attention-DP ranks per scheduler (layout.dp={self.layout.dp}, "
                             f"effects.mirror={self.effects.mirror})")
        if ad.ranks is not None and ad.ranks != want:
            raise ValueError(f"scheduler.attention_dp.ranks={ad.ranks} must be layout.dp / effects.mirror = {want} (or left out)")
        if self.disagg is not None:
            raise ValueError("scheduler.attention_dp: explicit attention-DP ranks are not modelled with a prefill pool (disagg) yet")
        if not self.effects.dp_balance:
            raise ValueError("effects.dp_balance: false (requests spread evenly) contradicts scheduler.attention_dp (requests on "
                             "explicit ranks): leave one of them out")
        if ad.ranks is None:
            sc = self.scheduler.model_copy(update={"attention_dp": ad.model_copy(update={"ranks": want})})
            sc._check_attention_dp(1 + sc.draft_len)   # the per-rank budgets, now that the ranks are known
            self.scheduler = sc
        return self

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
        return self.disagg is not None or self.effects != EffectsSpec() or self.scheduler.attention_dp is not None


def run_seeds(scenario: Scenario) -> tuple[int, int]:
    """(workload seed, backend seed): one seeded generator's first two draws, so the workload's and the
    backends' streams do not depend on how many numbers the other consumes."""
    rng = np.random.default_rng(scenario.seed)
    workload_seed, backend_seed = (int(x) for x in rng.integers(0, 2**63 - 1, size=2))
    return workload_seed, backend_seed


_LAYOUT_DTYPES = ("weight_dtype", "expert_dtype", "kv_dtype")


def fill_layout_dtypes(data: dict) -> dict:
    """``data`` with the layout dtypes it leaves out taken from its model's checkpoint.

    ``weight_dtype`` <- the checkpoint's (``quantization_config``); ``expert_dtype`` <- the
    checkpoint's expert dtype unless ``weight_dtype`` was set; ``kv_dtype`` <- the model's default.
    An unknown model is left for the ``model`` field's own error.
    """
    from costmodels.catalog import get_model

    try:
        m = get_model(str(data.get("model", Scenario.model_fields["model"].default)))
    except (TwinferError, OSError):
        return data
    out = dict(data)
    for key in ("layout",) + (("disagg",) if isinstance(data.get("disagg"), dict) else ()):
        node = out.get(key) if key == "layout" else out["disagg"].get("prefill_layout")
        if node is None:
            node = {}
        if not isinstance(node, dict):  # a ParallelLayout object (Python callers): its dtypes are already set
            continue
        node = dict(node)
        if "weight_dtype" not in node:
            node["weight_dtype"] = m.checkpoint_dtype
            if "expert_dtype" not in node and m.checkpoint_expert_dtype is not None:
                node["expert_dtype"] = m.checkpoint_expert_dtype
        node.setdefault("kv_dtype", m.default_kv_dtype)
        if key == "layout":
            out["layout"] = node
        else:
            out["disagg"] = {**out["disagg"], "prefill_layout": node}
    return out


def drop_layout_dtypes(data: dict) -> dict:
    """``data`` without layout dtypes, so they follow a model given on top of it (``--model`` without ``--dtype``)."""
    out = dict(data)
    for key in ("layout", "disagg"):
        node = out.get(key)
        if not isinstance(node, dict):
            continue
        if key == "layout":
            out[key] = {k: v for k, v in node.items() if k not in _LAYOUT_DTYPES}
        elif isinstance(node.get("prefill_layout"), dict):
            out[key] = {**node, "prefill_layout": {k: v for k, v in node["prefill_layout"].items() if k not in _LAYOUT_DTYPES}}
    return out


def resolve_relative_paths(data: dict, folder: str | Path) -> dict:
    """``data`` with its file paths (model, hardware, calibration, workload.trace_path) taken relative to ``folder``.

    Catalog names and absolute paths stay as they are.
    """
    from costmodels.catalog import model_aliases
    from costmodels.hardware import list_hardware

    base = Path(folder)
    names = {"model": set(model_aliases()), "hardware": {h.name.lower() for h in list_hardware()}, "calibration": set()}

    def rel(value):
        return isinstance(value, str) and value.strip() and not Path(value).is_absolute()

    out = dict(data)
    for key, known in names.items():
        v = out.get(key)
        if rel(v) and v.strip().lower() not in known:
            out[key] = str(base / v)
    wl = out.get("workload")
    if isinstance(wl, dict) and rel(wl.get("trace_path")):
        out["workload"] = {**wl, "trace_path": str(base / wl["trace_path"])}
    return out


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario file; its relative paths are taken from the file's folder; errors name the offending field."""
    data = resolve_relative_paths(read_mapping(path), Path(path).parent)
    return validate(Scenario, data, str(path))


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
