"""The offline replay loop: requests join when the engine clock reaches their arrival, idle gaps are skipped,
and every loop iteration is timed with its batch composition. ``twinfer run`` (with a step log),
``twinfer calibrate`` (engine-loop points), ``twinfer validate`` and ``twinfer tune --measure`` all drive the
engine through ``replay``; ``fresh_engine`` gives a new scheduler on the same model and KV cache."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from executor.engine import LLMEngine, SamplingParams
from executor.request_state import request_seed
from scheduler.config import SchedulerConfig
from scheduler.request import Request


@dataclass
class ReplayStep:
    """One engine-loop iteration that executed a plan."""

    start_s: float                 # engine clock at the plan's start
    iter_s: float                  # real seconds of the whole iteration (arrivals, schedule, run, complete, bookkeeping)
    runner_s: float                # the runner's measured wall seconds (sum over the plan's steps)
    num_steps: int
    decode_ctx: list[int]
    prefill: list[tuple[int, int]]
    draft_len: int = 0
    sm_clock_mhz: float | None = None   # GPU SM clock read after the step (NVML), a diagnostic
    graph_bs: int = 0                   # captured CUDA-graph size the step replayed (0: eager)
    device_s: float = float("nan")      # CUDA-event device seconds of the plan's steps (nan: not timed, e.g. on CPU)
    forward_s: float = float("nan")     # CUDA-event seconds of the steps' forwards alone (inputs built, before sampling)
    forward_host_s: float = float("nan")  # host seconds the steps' forward calls took to return (their launch issue)
    host_phases: dict = field(default_factory=dict)   # the runner's host phases, seconds summed over the plan's steps
    # the loop's own parts of the iteration (host seconds; nan where not measured): admitting the requests that arrived
    # before it (``admitted`` of them, ``admitted_tokens`` prompt tokens), scheduling the plan, completing it
    admit_s: float = float("nan")
    admitted: int = 0
    admitted_tokens: int = 0
    schedule_s: float = float("nan")
    complete_s: float = float("nan")


def sum_phases(recs: list[dict]) -> dict[str, float]:
    """The runner's host phases (``step_record``'s ``host_phases``) summed over a plan's steps; {} unless every step
    timed them."""
    phases = [r.get("host_phases") or {} for r in recs]
    if not phases or not all(phases):
        return {}
    return {k: float(sum(p.get(k, float("nan")) for p in phases)) for k in phases[0]}


@dataclass
class ReplayResult:
    metrics: object                # scheduler.metrics.SimMetrics
    steps: list[ReplayStep] = field(default_factory=list)
    wall_s: float = 0.0
    kernels: dict = field(default_factory=dict)        # op -> implementations, most used first
    kernel_steps: dict = field(default_factory=dict)   # op -> implementation -> steps it ran in


class ReplayInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`replay`: the metrics of the requests finished so far (the rest count as arrived
    only), the plans executed and the wall seconds, so a caller can print partial figures."""

    def __init__(self, metrics, plans: int, wall_s: float):
        super().__init__("replay interrupted")
        self.metrics, self.plans, self.wall_s = metrics, plans, wall_s


def allocator_counts(device: torch.device) -> dict[str, int]:
    """The CUDA caching allocator's device allocations and frees (cudaMalloc/cudaFree: synchronising, ~ms; new step
    shapes can fragment the pool), its retries and OOMs so far; {} off CUDA."""
    if device.type != "cuda":
        return {}
    st = torch.cuda.memory_stats(device)
    return {k: int(st.get(k, 0)) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")}


def host_counters(device: torch.device) -> dict[str, int]:
    """Counters a serving slowdown may come from, to difference around a replay: the allocator's
    (``allocator_counts``) and the garbage collector's generation-2 collections."""
    import gc

    return {"gc_gen2_collections": int(gc.get_stats()[2]["collections"]), **allocator_counts(device)}


def replay(engine: LLMEngine, items: list[tuple[float, str, list[int], int]], temperature: float = 0.0, seed: int = 0,
           on_plan: Callable[[int, float, list[dict], object], None] | None = None) -> ReplayResult:
    """Replay ``(arrival_s, request_id, prompt_ids, output_len)`` (sorted by arrival) through the engine loop.

    Sampling (``temperature`` > 0) gives each request its own generator, seeded from ``seed`` and the request id
    (``request_state.request_seed``, as the engine seeds a request that names no seed): the same replay samples the same tokens, and two requests never share a random stream.
    One shared seed made every request draw the same uniform at the same output index, so at a high temperature
    (near-uniform probabilities) requests decoding in step sampled the same token and routed to the same experts: a
    decode batch of 64 touched 55 experts per MoE layer where random tokens touch 221 (H200, run 6).

    ``on_plan(plan_index, start_s, step_records, scheduler_stats)`` is called after every executed plan (the
    runner's per-step records: batch, times, kernels), e.g. to write a step log."""
    from scheduler.metrics import MetricsCollector

    metrics = MetricsCollector(record_steps=False)
    steps: list[ReplayStep] = []
    kern: dict[str, dict[str, int]] = {}
    current: dict = {}
    plans = [0]

    def observe(start_s, plan, result):
        st = engine.scheduler.stats()
        # the metrics put a plan's tokens at its start plus its durations: its share of the wall clock's start (the
        # pipelined loop launches a plan before the one ahead of it is read back: from its launch, the first gap of a
        # request whose prompt completed in that plan ahead came out negative), the launch kept for the step record
        metrics.on_step(0, engine.share_start_s, plan, result, st.kv_used_blocks, st.kv_total_blocks)
        recs = engine.runner.step_records
        if on_plan is not None:
            on_plan(plans[0], start_s, recs, st)
        plans[0] += 1
        for rec in recs:
            for op, impl in rec["backends"].items():
                kern.setdefault(op, {}).setdefault(impl, 0)
                kern[op][impl] += 1
        current["step"] = ReplayStep(start_s, 0.0, float(sum(r["wall_s"] for r in recs)), len(recs),
                                     [int(c) for c in plan.decode_context_lens],
                                     [(c.num_new_tokens, c.context_len) for c in plan.prefills], plan.draft_len,
                                     graph_bs=int(recs[0].get("graph_bs", 0)) if len(recs) == 1 else 0,
                                     device_s=float(sum(r.get("device_s", float("nan")) for r in recs)),
                                     forward_s=float(sum(r.get("forward_s", float("nan")) for r in recs)),
                                     forward_host_s=float(sum(r.get("forward_host_s", float("nan")) for r in recs)),
                                     host_phases=sum_phases(recs))

    engine.step_observer = observe
    clock = None
    if engine.runner.device.type == "cuda":
        try:
            torch.cuda.clock_rate(engine.runner.device)
            clock = torch.cuda.clock_rate
        except Exception:  # noqa: BLE001  (no NVML bindings: no clock diagnostic)
            clock = None
    live: dict[str, Request] = {}
    if not engine.has_unfinished():
        engine.restart_clock()   # arrival times count from the replay's start, not from the engine's build and warm-up
    t_run = time.perf_counter()
    try:
        _loop(engine, items, temperature, seed, metrics, steps, current, live, clock)
    except KeyboardInterrupt:
        engine.step_observer = None
        raise ReplayInterrupted(metrics.summarize(num_gpus=1, slo=None), plans[0], time.perf_counter() - t_run) from None
    engine.step_observer = None
    wall = time.perf_counter() - t_run
    return ReplayResult(metrics.summarize(num_gpus=1, slo=None), steps, wall,
                        {op: sorted(v, key=v.get, reverse=True) for op, v in kern.items()}, kern)


def _loop(engine: LLMEngine, items, temperature: float, seed: int, metrics, steps: list, current: dict,
          live: dict, clock) -> None:
    """The replay loop: admit arrivals up to the engine clock, step, record finishes and the step's sample."""
    from twinfer.errors import TwinferError

    i = 0
    while i < len(items) or engine.has_unfinished():
        t0 = time.perf_counter()
        if not engine.has_unfinished() and i < len(items):
            engine.advance_clock(items[i][0])
        now = engine.now()
        ta, n_adm, tok_adm = time.perf_counter(), 0, 0
        while i < len(items) and items[i][0] <= now:
            arrival, rid, prompt, olen = items[i]
            i += 1
            try:
                req = engine.add_request(rid, prompt, SamplingParams(max_tokens=olen, temperature=temperature, ignore_eos=True,
                                                                  seed=request_seed(seed, rid)),
                                         arrival_time=arrival)
            except TwinferError as e:
                dropped = Request(rid, arrival, len(prompt), olen)
                dropped.drop_reason = str(e).split(": ", 1)[-1][:200]
                metrics.on_drop(dropped)
                continue
            metrics.on_arrival(req)
            live[rid] = req
            n_adm += 1
            tok_adm += len(prompt)
        admit_s = time.perf_counter() - ta
        current.clear()
        for out in engine.step():
            if out.finished and out.request_id in live:
                metrics.on_finish(live.pop(out.request_id))
        s = current.get("step")
        if s is not None:
            if clock is not None and len(steps) % 25 == 0:  # sparse: an NVML read costs real time (counted in this step)
                s.sm_clock_mhz = float(clock(engine.runner.device))
            s.iter_s = time.perf_counter() - t0
            s.admit_s, s.admitted, s.admitted_tokens = admit_s, n_adm, tok_adm
            ph = getattr(engine, "last_phases", None) or {}
            s.schedule_s, s.complete_s = ph.get("schedule_s", float("nan")), ph.get("complete_s", float("nan"))
            steps.append(s)


def fresh_engine(engine: LLMEngine, scheduler_config: SchedulerConfig) -> LLMEngine:
    """A new engine (new scheduler, empty prefix cache, clock at zero) on the same model and KV cache."""
    from scheduler.scheduler import Scheduler

    cfg = scheduler_config.model_copy(update={"max_model_len": engine.max_model_len})
    sched = Scheduler(cfg, engine.scheduler.blocks.num_blocks)
    runner = engine.runner
    runner.states.clear()
    return LLMEngine(engine.cfg, runner, sched, engine.max_model_len, engine.eos_token_id, engine.model_name, 1, None)
