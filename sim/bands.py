"""Which validation's error band applies to a simulation: a band only where a validation measured the
same thing, otherwise "no band" with the reason.

A ``twinfer validate`` report measures the twin of one model stack (name, layer count, dtype) priced
by one calibrated step profile against the executor on one GPU. Its band says nothing about another
model, a full-depth model when a 5-layer stack was validated, or the analytic cost model: printing
it there would lend those figures an accuracy nobody measured (issue 19).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from sim.scenario import Scenario
from sim.validate import band_line, band_line_of, find_reports, load_bands
from twinfer.errors import TwinferError


def load_report_header(path: Path) -> dict:
    """The top-level fields of a validation report (what it validated)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise TwinferError(f"--error-band: {path}: not a twinfer validate report ({str(err).splitlines()[0][:200]})") from None
    if not isinstance(data, dict) or "levels" not in data or "model" not in data:
        load_bands(path)  # raises the field-named error of a file that is not a validate report
        raise TwinferError(f"--error-band: {path}: not a twinfer validate report")
    return data


def check_band_source(source: str) -> None:
    """Refuse a ``--error-band`` file that is missing or not a validate report (before a run, not after it)."""
    if source == "auto":  # committed reports: unreadable ones are skipped where they are found
        return
    path = Path(source)
    if not path.is_file():
        raise TwinferError(f"--error-band: {source}: no such file (give a `twinfer validate` report JSON, or 'auto')")
    load_report_header(path)
    load_bands(path)


def mismatch(report: dict, scenario: Scenario) -> str:
    """Why ``report`` (a validation report's header) does not cover ``scenario`` ('' when it does)."""
    from costmodels.catalog import get_model

    model = get_model(scenario.model)
    wanted = (report.get("model"), report.get("num_layers"), report.get("dtype"))
    have = (model.name, model.num_layers, scenario.layout.weight_dtype)
    if wanted != have:
        return (f"it validated {wanted[0]} ({wanted[1]} layers, {wanted[2]}), this run is {have[0]} "
                f"({have[1]} layers, {have[2]})")
    profile = Path(str(report.get("profile") or "")).name
    if not scenario.calibration or Path(scenario.calibration).name != profile:
        return (f"it validated the step model calibrated in {profile or '?'}, this run prices steps with "
                f"{'the analytic cost model' if not scenario.calibration else Path(scenario.calibration).name}")
    # the name is not the profile: a profile measured on another GPU (an H200 profile pricing an H100) is a step model
    # those reports never validated
    ran_on, measured_on = (report.get("provenance") or {}).get("gpu"), _profile_gpu(scenario.calibration)
    if ran_on and measured_on and ran_on != measured_on:
        return f"it validated a step model measured on {ran_on}, this run's {Path(scenario.calibration).name} was measured on {measured_on}"
    # `twinfer validate` serves one instance on one GPU through its own loop: a band says nothing of a router over
    # instances, a prefill pool, another layout, another loop (async overlap) or MTP drafting it never ran
    lay = scenario.layout
    if lay.gpus != 1 or scenario.instances != 1 or scenario.disagg is not None:
        where = ("a disaggregated deployment" if scenario.disagg is not None else
                 f"{scenario.instances} instance(s) of {lay.gpus} GPU(s) (tp {lay.tp}, dp {lay.dp}, ep {lay.ep}, pp {lay.pp})")
        return f"it validated one instance on one GPU, this run is {where}"
    sched = report.get("scheduler") or {}
    for field, label in (("async_overlap", "async overlap"), ("draft_len", "MTP draft length")):
        if field in sched and sched[field] != getattr(scenario.scheduler, field):
            return f"it validated {label} {sched[field]}, this run has {getattr(scenario.scheduler, field)}"
    return ""


def _profile_gpu(path) -> str | None:
    """The GPU a calibration profile was measured on (its provenance), None where the file does not say. Read once per
    file version: ``mismatch`` asks it for every committed report (37 for the H200)."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return _profile_gpu_of(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _profile_gpu_of(path: str, _mtime_ns: int, _size: int) -> str | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    prov = data.get("provenance") if isinstance(data, dict) else None
    gpu = prov.get("gpu") if isinstance(prov, dict) else None
    return gpu if isinstance(gpu, str) and gpu else None


def applicable_band_line(source: str, scenario: Scenario) -> str:
    """The error-band line for ``scenario``: the reports' bands if one applies, else 'no band' and why."""
    paths = find_reports(scenario.hardware) if source == "auto" else [Path(source)]
    if source != "auto" or not paths:
        if source != "auto" and paths[0].is_file():
            why = mismatch(load_report_header(paths[0]), scenario)
            if why:
                return f"error band: no band ({paths[0].name} does not apply: {why})"
        return band_line(source, scenario.hardware)
    applies = [p for p in paths if not mismatch(load_report_header(p), scenario)]
    if not applies:
        why = mismatch(load_report_header(paths[0]), scenario)
        return (f"error band: no band (none of the {len(paths)} validation reports for {scenario.hardware} applies; "
                f"the newest, {paths[0].name}: {why})")
    # every applicable report counts (a validation matrix writes one per workload class): the band is the largest
    # error any of them saw, so the worst class sets it
    return band_line_of(applies)
