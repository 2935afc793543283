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


def simulation_section(*, profile: str, num_layers: int, workload: str, trace: str | None, requests: int | None, seed: int,
                       max_input_len: int | None, max_output_len: int | None, max_model_len: int, num_kv_blocks: int,
                       arrival_scale: float, rate_rps: float, load_x_capacity: float) -> dict:
    """What ``twinfer simulate --plan`` needs to rebuild tune's requests and cost model exactly."""
    return {"profile": str(profile), "profile_sha256": file_digest(profile), "num_layers": int(num_layers),
            "workload": workload, "trace": str(trace) if trace else None, "trace_sha256": file_digest(trace) if trace else None,
            "requests": requests, "seed": int(seed), "max_input_len": max_input_len, "max_output_len": max_output_len,
            "max_model_len": int(max_model_len), "block_size": BLOCK_SIZE, "num_kv_blocks": int(num_kv_blocks),
            "arrival_scale": float(arrival_scale), "rate_rps": float(rate_rps), "load_x_capacity": float(load_x_capacity)}


def is_tuned_policy(path: str) -> bool:
    """Whether ``path`` holds a tuned policy (not a ``twinfer plan`` deployment plan)."""
    return read_mapping(path).get("kind") == KIND


def resimulate(path: str) -> tuple[dict, dict, list[str]]:
    """(the figures of one simulation of the file's policy, tune's figures for it as written, notes)."""
    import numpy as np  # noqa: F401  (the simulator's dependency, imported here to keep the CLI start light)

    from costmodels.calibration import CalibrationProfile
    from costmodels.profiled import ProfiledStepCost
    from scheduler.config import SchedulerConfig
    from sim.validate import copy_requests, metric_values, simulate_requests
    from ui.cmd_validate import load_requests, sim_config

    doc = read_mapping(path)
    sim = doc.get("simulation")
    if not isinstance(sim, dict):
        raise TwinferError(f"{path}: simulation: missing; this tuned policy was written before tune recorded what it "
                           "simulated (run twinfer tune --profile ... --plan-out again)")
    need = ("profile", "num_layers", "workload", "seed", "max_model_len", "num_kv_blocks", "arrival_scale")
    missing = [k for k in need if sim.get(k) is None]
    if missing:
        raise TwinferError(f"{path}: simulation: missing {', '.join(missing)}")
    notes: list[str] = []
    prof_path = Path(sim["profile"])
    if not prof_path.is_file():
        raise TwinferError(f"{path}: simulation.profile: {prof_path}: no such file (the measured profile tune priced with)")
    if sim.get("profile_sha256") and file_digest(prof_path) != sim["profile_sha256"]:
        notes.append(f"the profile {prof_path} changed since tune ran: the figures may differ from tune's")
    trace = sim.get("trace")
    if trace and sim.get("trace_sha256") and Path(trace).is_file() and file_digest(trace) != sim["trace_sha256"]:
        notes.append(f"the trace {trace} changed since tune ran: the figures may differ from tune's")
    sched = validate(SchedulerConfig, doc.get("scheduler"), f"{path}: scheduler")
    prof = CalibrationProfile.load(prof_path)
    if prof.step is None:
        raise TwinferError(f"{path}: simulation.profile: {prof_path} has no measured step model")
    cost = ProfiledStepCost(prof, num_layers=int(sim["num_layers"]))
    reqs = load_requests(trace, sim["workload"], sim.get("requests"), int(sim.get("block_size") or BLOCK_SIZE), int(sim["seed"]),
                         sim.get("max_input_len"), sim.get("max_output_len"), int(sim["max_model_len"]))
    reqs = copy_requests(reqs, float(sim["arrival_scale"]))
    m = metric_values(simulate_requests(cost, sim_config(sched, prof), int(sim["num_kv_blocks"]), copy_requests(reqs),
                                        seed=int(sim["seed"])))
    said = (doc.get("tune") or {}).get("predicted") or {}
    return m, said, notes
