"""Timeline check: the simulator's loop with each step taking the time the executor measured for the same step.

A validation replay keeps every engine-loop iteration it ran, in order, with its batch composition and measured time
(``sim.validate.StepSample``; a matrix run's ``samples_<class>_*.json``). Feeding those times back into the
simulator, step by step, separates the two ways a prediction can miss:

- while the simulated plans have the measured compositions (decodes, prefill tokens, prefill chunks), the two loops
  run the same schedule on the same clock, so any difference left in TTFT, TPOT or throughput is the timeline's
  (scheduler, chunk order, when arrivals join, when the first token counts), not the step model's;
- the first step whose composition differs is where the timelines part (an arrival on the other side of a step
  boundary, a different prefix hit); from there on the cost model prices the steps, as in a plain simulation.

Run 4 of issue 16's H200 matrix (``scripts/timeline_check.py``): every level whose compositions stayed equal
reproduces the measured throughput, TPOT p50 and TTFT p50/p90 within 0.1%, where the cost model misses TTFT by
-15..-70%: those misses are step times.
"""

from __future__ import annotations

import atexit
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from scheduler.config import SchedulerConfig
from scheduler.metrics import SimMetrics
from scheduler.plan import StepPlan
from scheduler.request import Request
from sim.backend import SimBackend
from sim.validate import simulate_requests

Composition = tuple[int, int, int]   # (decodes, prefill tokens, prefill chunks)


def composition(plan: StepPlan) -> Composition:
    """What a step ran, as the executor's step samples record it."""
    return len(plan.decodes), sum(c.num_new_tokens for c in plan.prefills), len(plan.prefills)


def sample_steps(cols: dict) -> list[tuple[Composition, float]]:
    """(composition, measured seconds) per step from a report's compact sample columns (``compact_samples``)."""
    return [((int(d), int(p), int(c)), float(m))
            for d, p, c, m in zip(cols["decodes"], cols["prefill_tokens"], cols["prefill_chunks"], cols["measured_s"])]


def split_replays(steps: Sequence[tuple[Composition, float]], replays: int) -> list[tuple[int, int]]:
    """[start, end) of each of ``replays`` replays in samples that concatenate them: the replays of a level start
    from the same requests on an idle engine, so each begins with the first replay's first step and follows its
    compositions until their timelines part; the starts are the steps that follow the first replay longest."""
    comps = [c for c, _ in steps]
    n = len(comps)
    if replays <= 1 or n < 2:
        return [(0, n)]
    scored = sorted(((_common_prefix(comps, i), -i) for i in range(1, n) if comps[i] == comps[0]), reverse=True)
    starts = sorted(-i for _, i in scored[: replays - 1])
    bounds = [0] + starts + [n]
    return list(zip(bounds, bounds[1:]))


def _common_prefix(comps: list[Composition], i: int, cap: int = 200) -> int:
    """Steps from ``i`` on equal to the first steps (at most ``cap``)."""
    k = 0
    while k < cap and i + k < len(comps) and comps[i + k] == comps[k]:
        k += 1
    return k



REPORT_ARCHIVES = ("reports.tar.xz", "reports.tgz")


def reports_archive(run: str | Path) -> Path | None:
    """A matrix run folder's packed reports: ``reports.tar.xz`` (the archived runs, repacked from the device's gzip by
    ``scripts/repack_reports.py``: 28% smaller, which keeps the working tree the device copies under its limit), else
    ``reports.tgz`` (as a device call returns it); None where the folder has neither."""
    return next((Path(run) / n for n in REPORT_ARCHIVES if (Path(run) / n).is_file()), None)


def unpacked_run(run: str | Path) -> Path:
    """A matrix run's folder ready to read: the folder itself where its per-class reports lie loose
    (``samples_<class>_*.json``), else a temporary copy of its JSON files with its packed reports
    (``reports_archive``) unpacked beside them (the device returns at most 8 files, so runs since 10 pack their
    reports; older ones were packed later to keep the working tree under the device copy's limit). Raises
    ``FileNotFoundError`` where the folder has neither."""
    run = Path(run)
    if any(run.glob("samples_*_*.json")):
        return run
    tgz = reports_archive(run)
    if tgz is None:
        raise FileNotFoundError(f"{run}: no samples_<class>_*.json and no reports.tar.xz or reports.tgz: not a matrix "
                                "run folder")
    dst = Path(tempfile.mkdtemp(prefix=f"{run.name}_"))
    atexit.register(shutil.rmtree, dst, ignore_errors=True)   # the copy lives as long as the process reading it
    for f in run.glob("*.json"):
        shutil.copy(f, dst / f.name)
    with tarfile.open(tgz) as t:
        t.extractall(dst, filter="data")
    return dst

@dataclass
class Divergence:
    """The first step whose simulated composition differs from the measured one."""

    step: int
    simulated: Composition
    measured: Composition
    clock_s: float


@dataclass
class MeasuredTrace:
    """The measured steps to replay and what the replay did: every step priced, and where it parted."""

    measured: Sequence[tuple[Composition, float]]
    steps: list[tuple[Composition, float]] = field(default_factory=list)
    divergence: Divergence | None = None

    @property
    def matched(self) -> int:
        """Steps that ran at their measured time."""
        return self.divergence.step if self.divergence is not None else min(len(self.steps), len(self.measured))


class MeasuredSteps(SimBackend):
    """SimBackend whose steps take the trace's measured times, in order, while each plan's composition equals the
    measured step's; after the first difference (``trace.divergence``), the cost model's times. One step per plan
    (run the instance with ``max_steps=1``: a multi-step plan is cut at arrivals exactly as single steps are)."""

    def __init__(self, *args, trace: MeasuredTrace, **kw):
        super().__init__(*args, **kw)
        self.trace = trace
        # a measured iteration already runs from read-back to read-back, the next step's launch in it: each plan
        # takes its measured wall as it stands (the per-step loop), not priced launch by launch
        self.lead = False

    def step_times(self, plan: StepPlan, cold_start: bool = False, host: float | None = None) -> np.ndarray:
        if plan.num_steps != 1:
            raise ValueError("MeasuredSteps prices one step per plan: simulate with max_steps=1")
        tr = self.trace
        comp = composition(plan)
        i = len(tr.steps)
        if tr.divergence is None and i < len(tr.measured):
            want, seconds = tr.measured[i]
            if want == comp:
                tr.steps.append((comp, seconds))
                return np.array([seconds])
            tr.divergence = Divergence(i, comp, want, self.clock())
        t = super().step_times(plan, cold_start, host)
        tr.steps.append((comp, float(t[0])))
        return t

    def transition_extras(self, plan: StepPlan) -> np.ndarray:
        """A measured step's time already holds what its predecessors cost it; priced steps pay it as usual. Asked
        before the plan is priced: the plan's step is measured when the trace has not parted, has a step left, and
        that step's composition is the plan's (what ``step_times`` then checks)."""
        tr = self.trace
        i = len(tr.steps)
        if tr.divergence is None and i < len(tr.measured) and tr.measured[i][0] == composition(plan):
            return np.zeros(0)
        return super().transition_extras(plan)


def replay_measured(step_cost, sched_cfg: SchedulerConfig, num_blocks: int, requests: list[Request],
                    measured: Sequence[tuple[Composition, float]], seed: int = 0) -> tuple[SimMetrics, MeasuredTrace]:
    """Simulate ``requests`` (fresh Request objects) with the measured step times of one replay; the metrics and the
    trace (steps matched, first divergence)."""
    trace = MeasuredTrace(measured)
    m = simulate_requests(step_cost, sched_cfg, num_blocks, requests, seed=seed, max_steps=1,
                          backend_cls=MeasuredSteps, backend_kw={"trace": trace})
    return m, trace
