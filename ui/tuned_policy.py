"""A tuned policy (``twinfer tune --profile ... --plan-out FILE``, ``kind: tuned-policy``) simulated again.

``twinfer serve --plan FILE`` runs its ``scheduler`` section; ``twinfer simulate --plan FILE`` repeats the figures tune
printed for the winner: the same requests (rebuilt from the file's ``simulation`` section: workload or trace, count,
seed, length caps, the arrival scale tune chose), the same measured profile and the same scheduler, through the same
call tune's search made (``planner.tune.evaluate``'s ``simulate_requests``). A profile or trace that changed since tune
ran (their SHA-256 is kept) is said next to the figures, which may then differ.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError

KIND = "tuned-policy"
BLOCK_SIZE = 64          # twinfer tune --profile's KV block (the executor's page)
FIGURES = ("output_throughput", "tpot_p50", "tpot_p90", "ttft_p50", "ttft_p90", "e2e_p50", "requests_finished", "duration_s")


def file_digest(path: str | Path | None) -> str | None:
    """SHA-256 of a file's bytes (None for no file)."""
    if path is None:
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class TunedSimulation(BaseModel):
    """A tuned policy's ``simulation`` section: every key is required (null where tune had no value: no trace, no
    request count or length cap given), so a deleted key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid")
    profile: str = Field(..., min_length=1, description="the measured profile tune priced with (absolute path)")
    profile_sha256: Optional[str] = Field(..., description="its SHA-256 when tune ran")
    num_layers: int = Field(..., ge=1)
    workload: str = Field(..., min_length=1, description="the workload preset or file tune generated requests from")
    trace: Optional[str] = Field(..., description="the JSONL trace tune replayed instead (absolute path), or null")
    trace_sha256: Optional[str] = Field(...)
    requests: Optional[int] = Field(..., ge=1, description="request count (null: the preset's or the trace's)")
    seed: int = Field(...)
    max_input_len: Optional[int] = Field(..., ge=1)
    max_output_len: Optional[int] = Field(..., ge=1)
    max_model_len: int = Field(..., ge=16)
    block_size: int = Field(..., ge=1)
    num_kv_blocks: int = Field(..., ge=2)
    arrival_scale: float = Field(..., ge=0.0, description="the factor tune scaled the arrival times by (its --load)")
    rate_rps: float = Field(..., ge=0.0)
    load_x_capacity: float = Field(..., ge=0.0)


def simulation_section(*, profile: str, num_layers: int, workload: str, trace: str | None, requests: int | None, seed: int,
                       max_input_len: int | None, max_output_len: int | None, max_model_len: int, num_kv_blocks: int,
                       arrival_scale: float, rate_rps: float, load_x_capacity: float) -> dict:
    """What ``twinfer simulate --plan`` needs to rebuild tune's requests and cost model exactly (files by absolute path:
    the plan runs from any directory)."""
    sec = TunedSimulation(profile=str(Path(profile).resolve()), profile_sha256=file_digest(profile), num_layers=int(num_layers),
                          workload=workload, trace=str(Path(trace).resolve()) if trace else None,
                          trace_sha256=file_digest(trace) if trace else None, requests=requests, seed=int(seed),
                          max_input_len=max_input_len, max_output_len=max_output_len, max_model_len=int(max_model_len),
                          block_size=BLOCK_SIZE, num_kv_blocks=int(num_kv_blocks), arrival_scale=float(arrival_scale),
                          rate_rps=float(rate_rps), load_x_capacity=float(load_x_capacity))
    return sec.model_dump()


def is_tuned_policy(path: str) -> bool:
    """Whether a ``--plan`` file holds a tuned policy; False for a ``twinfer plan`` deployment plan (``pools``); a file
    that is neither is a user error."""
    doc = read_mapping(path)
    if doc.get("kind") == KIND:
        return True
    if "pools" not in doc:
        raise TwinferError(f"--plan {path}: not a plan file: give a `twinfer plan --out` plan (it has pools) or a "
                           f"`twinfer tune --profile ... --plan-out` tuned policy (kind: {KIND})")
    return False


def resimulate(path: str) -> tuple[dict, dict, list[str]]:
    """(the figures of one simulation of the file's policy, tune's figures for it as written, notes)."""

    from costmodels.calibration import CalibrationProfile
    from costmodels.profiled import ProfiledStepCost
    from scheduler.config import SchedulerConfig
    from sim.validate import copy_requests, metric_values, simulate_requests
    from ui.cmd_validate import load_requests, sim_config

    doc = read_mapping(path)
    if not isinstance(doc.get("simulation"), dict):
        raise TwinferError(f"{path}: simulation: missing; this tuned policy was written before tune recorded what it "
                           "simulated (run twinfer tune --profile ... --plan-out again)")
    sim = validate(TunedSimulation, doc["simulation"], f"{path}: simulation")
    notes: list[str] = []
    prof_path = Path(sim.profile)
    if not prof_path.is_file():
        raise TwinferError(f"{path}: simulation.profile: {prof_path}: no such file (the measured profile tune priced with)")
    if sim.profile_sha256 and file_digest(prof_path) != sim.profile_sha256:
        notes.append(f"the profile {prof_path} changed since tune ran: the figures may differ from tune's")
    trace = sim.trace
    if trace and not Path(trace).is_file():
        raise TwinferError(f"{path}: simulation.trace: {trace}: no such file (the trace tune replayed)")
    if trace and sim.trace_sha256 and file_digest(trace) != sim.trace_sha256:
        notes.append(f"the trace {trace} changed since tune ran: the figures may differ from tune's")
    sched = validate(SchedulerConfig, doc.get("scheduler"), f"{path}: scheduler")
    prof = CalibrationProfile.load(prof_path)
    if prof.step is None:
        raise TwinferError(f"{path}: simulation.profile: {prof_path} has no measured step model")
    cost = ProfiledStepCost(prof, num_layers=sim.num_layers)
    reqs = load_requests(trace, sim.workload, sim.requests, sim.block_size, sim.seed, sim.max_input_len, sim.max_output_len,
                         sim.max_model_len)
    reqs = copy_requests(reqs, sim.arrival_scale)
    m = metric_values(simulate_requests(cost, sim_config(sched, prof), sim.num_kv_blocks, copy_requests(reqs), seed=sim.seed))
    said = (doc.get("tune") or {}).get("predicted") or {}
    differ = [k for k in FIGURES if k in said and said[k] != m.get(k)]
    if differ and not notes:
        notes.append(f"{', '.join(differ)} differ from the figures tune wrote, with the same profile and trace: the file's "
                     "scheduler or simulation section was edited, or the simulator changed since")
    return m, said, notes
