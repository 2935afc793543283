"""``twinfer tune`` on a catalog model and GPU: EP width, async overlap and sliding-window replay, searched together.

A policy is one instance shape and its serving policies (:class:`Policy`): the EP width of a
DEP layout (attention-DP x EP, one rank per GPU; width 1 is one GPU), async CPU/GPU overlap,
the replay length W of sliding-window layers and which layers replay, next to the scheduler
knobs max batch per rank and prefill chunk. Every candidate is simulated on a slice with the
same per-GPU behaviour (``planner.simulate``: one instance, wide ones cut to a share of their
ranks), all at the same offered request rate per GPU, so output tokens/s per GPU compare.

By default every candidate is compared at its capacity: all its requests queued at once, output
tokens/s per GPU in the steady window (the middle of the run, TPOT at full batch). An offered rate
per GPU (``TuneContext.rate_per_gpu``) compares them at one load instead (a rate below some
candidates' capacity ties them at the rate delivered).

The search is coordinate descent (:func:`search`): from the baseline, each policy in turn is
set to every allowed value with the others held, the best feasible one kept, until a round
changes nothing (at most ``max_rounds``). That is ``sum(len(values))`` simulations a round
instead of their product. EP widths the memory fit rejects are never simulated; they are
returned with the fit's reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import MAX_DEGREE
from costmodels.model_spec import ModelSpec
from costmodels.moe_load import ExpertLoadSpec
from costmodels.replay import LayerReplay, ReplayPolicy, effective_replay_policy, window_layers
from planner.request import SearchSpace
from planner.search import host_cache_gb, prefix_router
from planner.simulate import ranks_in_slice, scheduler_for, slice_requests, slice_seats, steady_workload
from planner.space import LayoutOption, enumerate_layouts
from planner.workload_stats import WorkloadStats, workload_stats
from scheduler.config import SchedulerConfig
from scheduler.metrics import SLO
from sim.effects import EffectsSpec
from sim.router import RouterConfig
from sim.scenario import MAX_INSTANCES, Scenario
from sim.workload import WorkloadSpec
from twinfer.errors import TwinferError

ReplayLayers = str   # "none" (W = 0: every window layer keeps its KV), "all" window layers, or one window kind
WINDOW_KINDS = ("sliding", "csa", "hca")          # ReplayPolicy.kinds keys
LAYER_GROUPS = WINDOW_KINDS + ("sparse",)         # layer kinds that may hold a window (sparse: V4.1, per-layer rules)
POLICIES = ("ep_width", "async_overlap", "replay", "batch_per_rank", "chunk_tokens")
THE_THREE = ("ep_width", "async_overlap", "replay")   # the policies the product names (issue 23)
MIN_FINISHED = 0.99       # a candidate that leaves more than 1% of its requests unfinished is infeasible
SATURATE_RATE_PER_GPU = 1e4  # requests/s per GPU that queue everything at once: the baseline's capacity run
MIN_RATE_PER_GPU = 1e-3      # the slowest offered rate a slice runs at as asked (slice_scenario's floor)
MAX_BATCH_PER_RANK = 65536   # SchedulerConfig.max_num_seqs' bound
MAX_CHUNK_TOKENS = 1 << 22   # SchedulerConfig.max_num_batched_tokens' bound


def check_rate_per_gpu(rate: float, what: str) -> None:
    """Refuse, naming ``what``, an offered rate per GPU the search cannot run as asked: not finite, below the slices'
    floor (they would run faster than offered and the plan slower), or at/above the rate that queues everything at
    once (compared at capacity instead, and the plan run at 90% of the winner's capacity, not at this rate)."""
    if not math.isfinite(rate) or not MIN_RATE_PER_GPU <= rate < SATURATE_RATE_PER_GPU:
        raise TwinferError(f"{what}: {rate:.3g} requests/s per GPU offered; allowed: {MIN_RATE_PER_GPU:g} up to (not "
                           f"including) {SATURATE_RATE_PER_GPU:g} (leave --load and --rate-per-gpu out to compare the "
                           "policies at capacity, every request queued at once)")


class TuneSpace(BaseModel):
    """The values each policy may take (the search tries each, one policy at a time)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ep_widths: tuple[int, ...] | None = Field(None, description="EP widths of DEP layouts (default: 1, 2, 4, ... up to the GPU budget)")
    async_overlap: tuple[bool, ...] = Field((False, True), min_length=1)
    replay_tokens: tuple[int, ...] | None = Field(
        None, description="sliding-window replay lengths W in tokens (default: 0, half the window, the window; 0 only without sliding layers)")
    replay_layers: tuple[str, ...] | None = Field(
        None, description="which window layers replay W: all, or one layer kind (sliding, csa, hca) each (default: all, "
        "plus each window kind of a model that has several)")
    batch_per_rank: tuple[int, ...] = Field((32, 64, 128), min_length=1, description="max running requests per attention-DP rank")
    chunk_tokens: tuple[int, ...] = Field((2048, 8192), min_length=1, description="prefill tokens per rank per step")

    @field_validator("ep_widths", "batch_per_rank", "chunk_tokens")
    @classmethod
    def _positive(cls, v, info):
        top = {"batch_per_rank": MAX_BATCH_PER_RANK, "chunk_tokens": MAX_CHUNK_TOKENS}.get(info.field_name)
        if v is not None and (not v or any(x < 1 for x in v)):
            raise ValueError("give one or more entries, each >= 1")
        if v is not None and top is not None and max(v) > top:
            raise ValueError(f"each entry at most {top:,} (a scheduler's bound; got {max(v):,})")
        return None if v is None else tuple(sorted(set(v)))

    @field_validator("replay_layers")
    @classmethod
    def _layers(cls, v):
        if v is not None and (not v or any(x not in ("all",) + LAYER_GROUPS for x in v)):
            raise ValueError(f"entries must be all or a window layer kind ({', '.join(LAYER_GROUPS)})")
        return v

    @field_validator("replay_tokens")
    @classmethod
    def _replay(cls, v):
        if v is not None and (not v or any(not 0 <= x <= 1 << 20 for x in v)):
            raise ValueError("give one or more entries, each in 0..1048576 tokens")
        return None if v is None else tuple(sorted(set(v)))


@dataclass(frozen=True, order=True)
class Policy:
    """One candidate: an instance shape and its serving policies."""

    ep_width: int
    async_overlap: bool
    replay_tokens: int
    replay_layers: ReplayLayers
    batch_per_rank: int
    chunk_tokens: int

    @property
    def replay(self) -> tuple[int, str]:
        """The replay policy as one search coordinate: (W, layers); W = 0 keeps the window KV (no replay)."""
        return (self.replay_tokens, self.replay_layers if self.replay_tokens else "none")

    def with_value(self, policy: str, value) -> "Policy":
        if policy == "replay":
            return Policy(self.ep_width, self.async_overlap, value[0], value[1], self.batch_per_rank, self.chunk_tokens)
        return Policy(**{**self.__dict__, policy: value})

    def value(self, policy: str):
        return self.replay if policy == "replay" else getattr(self, policy)

    def describe(self) -> str:
        w, layers = self.replay
        rep = "W=0 (window KV kept)" if not w else f"replay W={w} ({'every' if layers == 'all' else layers} window layer{'s' if layers != 'all' else ''})"
        return (f"EP{self.ep_width} {'DEP' if self.ep_width > 1 else 'one GPU'}, async {'on' if self.async_overlap else 'off'}, "
                f"{rep}, batch {self.batch_per_rank}/rank, chunk {self.chunk_tokens}")


def replay_policy(tokens: int, layers: str, model: ModelSpec | None = None) -> ReplayPolicy:
    """The per-layer window policy of one replay value: W = 0 keeps every window layer's KV (persist); "all" replays W
    on every window layer; a kind name replays W on that kind's window layers and keeps the others' (a kind the
    policy has no ``kinds`` key for, e.g. V4.1's 'sparse', is written per layer: needs ``model``)."""
    if not tokens or layers == "none":
        return ReplayPolicy()
    rule = LayerReplay(mode="replay", tokens=tokens)
    if layers == "all":
        return ReplayPolicy(default=rule, tokens=tokens)
    if layers in WINDOW_KINDS:
        return ReplayPolicy(kinds={layers: rule}, tokens=tokens)
    if model is None:
        raise ValueError(f"replay layers {layers!r}: per-layer rules need the model")
    kinds = model.kinds()
    return ReplayPolicy(layers={i: rule for i in sorted(window_layers(model)) if kinds[i] == layers}, tokens=tokens)


def scheduler_of(p: Policy, ranks: int, draft_len: int = 0, shipped: tuple[int, str] = (0, "none"),
                 model: ModelSpec | None = None) -> SchedulerConfig:
    """The scheduler of an instance (or slice) of ``ranks`` attention-DP ranks running policy ``p``.

    Replay on every window layer is written as ``swa_replay_tokens`` (the scheduler's whole-model knob, the same
    policy as ``ReplayPolicy(default=replay W)``); per-kind replay as an explicit ``replay`` policy; persist (W = 0)
    as nothing where it is the model's ``shipped`` policy, else as an explicit persist policy."""
    sc = scheduler_for(p.batch_per_rank, ranks, draft_len, p.async_overlap, p.chunk_tokens)
    if p.replay_tokens and p.replay_layers == "all":
        return sc.model_copy(update={"swa_replay_tokens": p.replay_tokens})
    if not p.replay_tokens and shipped == (0, "none"):
        return sc
    return sc.model_copy(update={"replay": replay_policy(p.replay_tokens, p.replay_layers, model)})


def shipped_replay(model: str) -> tuple[int, str]:
    """The model's shipped window policy as a replay value (V4.1: W = its window on every layer; others: keep)."""
    pol = effective_replay_policy(get_model(model), None, 0)
    if pol.default.mode == "replay" and not pol.kinds and not pol.layers:
        return (pol.default.tokens or pol.tokens, "all")
    return (0, "none")


@dataclass
class Run:
    """One simulated candidate (a slice at the common per-GPU rate)."""

    policy: Policy
    thr_gpu: float = 0.0          # output tokens/s per GPU, steady window
    tps_user: float = 0.0
    ttft_s: float = math.inf      # p90 when an SLO is given, else p50
    tpot_s: float = math.inf
    finished: float = 0.0
    req_gpu: float = 0.0          # requests/s per GPU finished in the steady window
    prefill_tokens_per_request: float = 0.0   # computed prompt tokens per finished request (replay shows here)
    hit_rate: float = 0.0
    digest: str = ""
    feasible: bool = False
    why: str = ""


@dataclass
class TuneContext:
    """What every candidate's simulation shares."""

    model: str
    hardware: str
    gpus: int
    workload: WorkloadSpec
    stats: WorkloadStats
    options: dict[int, LayoutOption]           # EP width -> its layout (only widths the memory fit allows)
    rejected: dict[int, str]                   # EP width -> why it is not tried
    slo: SLO | None = None
    slo_percentile: int = 90
    seed: int = 0
    sim_requests: int = 1500
    draft_len: int = 0
    calibration: str | None = None
    expert_load: ExpertLoadSpec = field(default_factory=ExpertLoadSpec)
    rate_per_gpu: float = SATURATE_RATE_PER_GPU  # offered requests/s per GPU (default: everything queued at once)

    @property
    def saturated(self) -> bool:
        """Candidates compared at their capacity (every request queued at once), not at an offered rate."""
        return self.rate_per_gpu >= SATURATE_RATE_PER_GPU

    @property
    def shipped_replay(self) -> tuple[int, str]:
        return shipped_replay(self.model)

    @property
    def router(self) -> RouterConfig:
        return prefix_router(self.stats)

    @property
    def effects(self) -> EffectsSpec:
        # prefix reuse keeps evicted KV in a host tier (the planner's rule)
        return EffectsSpec(expert_load=self.expert_load, host_cache_gb=host_cache_gb(self.stats, get_hardware(self.hardware)))


def ep_layouts(model: str, hardware: str, gpus: int, widths: tuple[int, ...] | None, space: TuneSpace,
               mem_fraction: float = 0.9) -> tuple[dict[int, LayoutOption], dict[int, str]]:
    """EP width -> fitting DEP layout, and EP width -> why it is rejected (over the GPU budget, or the memory fit's reason).

    Reuses the planner's enumeration (``planner.space.enumerate_layouts``: TP1 for width 1, DEP w above) and its
    memory fit at the smallest per-rank limits searched."""
    m, hw = get_model(model), get_hardware(hardware)
    widths = widths or tuple(sorted({w for w in (1, 2, 4, 8, 16, 32, 64, 72) if w <= gpus} | {gpus}))
    rejected = {w: f"needs {w} GPUs, the budget is {gpus}" for w in widths if w > gpus}
    rejected.update({w: f"wider than the {MAX_DEGREE:,} GPUs an EP group spans (layout.ep)"
                     for w in widths if MAX_DEGREE < w <= gpus})
    rejected.update({w: f"{gpus // w:,} instances of {w} GPU{'s' if w > 1 else ''}: more than the {MAX_INSTANCES:,} a "
                        "deployment holds (a wider EP, or fewer --gpus)"
                     for w in widths if w <= min(gpus, MAX_DEGREE) and gpus // w > MAX_INSTANCES})
    if m.moe is None:
        rejected.update({w: "dense model: no experts to spread" for w in widths if 1 < w <= gpus})
    tries = [w for w in widths if w not in rejected]
    sp = SearchSpace(modes=("aggregated",), tp=(1,), dep=tuple(w for w in tries if w > 1) or (2,), pp=(1,),
                     two_micro_batch=(False,), eplb=("off",), table_placement=("host",),
                     batch_per_rank=space.batch_per_rank, chunk_tokens=space.chunk_tokens)
    ok, bad = enumerate_layouts(m, hw, max(tries, default=1), sp, mem_fraction=mem_fraction)
    options = {o.layout.ep if o.layout.dp > 1 else 1: o for o in ok if o.layout.tp == 1}
    options = {w: o for w, o in options.items() if w in tries}
    for b in bad:
        w = b.gpus
        if w in tries and w not in options:
            rejected[w] = f"{b.label}: {b.reason}"
    for w in tries:
        if w not in options and w not in rejected:
            rejected[w] = "no layout of this width was enumerated"
    return options, dict(sorted(rejected.items()))


def values_of(ctx: TuneContext, space: TuneSpace) -> dict[str, list]:
    """Every policy's allowed values (EP widths: the ones that fit; replay: W x layers, W clipped to the window)."""
    model = get_model(ctx.model)
    window = int(model.sliding_window or 0)
    ws = space.replay_tokens if space.replay_tokens is not None else ((0, window // 2, window) if window else (0,))
    kinds = sorted({model.kinds()[i] for i in window_layers(model)})
    groups = space.replay_layers if space.replay_layers is not None else (("all",) + tuple(kinds) if len(kinds) > 1 else ("all",))
    for g in groups:
        if g != "all" and g not in kinds:
            raise TwinferError(f"--replay-layers {g}: {model.name} has no {g} layers with a sliding window "
                               f"(window layer kinds: {', '.join(kinds) or 'none'})")
    if any(ws) and not window:
        raise TwinferError(f"--replay-tokens {','.join(map(str, ws))}: {model.name} has no sliding-window layers; give 0")
    replay = sorted({(0, "none")} | {(w, g) for w in ws if w for g in groups})
    return {"ep_width": sorted(ctx.options), "async_overlap": sorted(set(space.async_overlap)), "replay": replay,
            "batch_per_rank": list(space.batch_per_rank), "chunk_tokens": list(space.chunk_tokens)}


def slice_workload(spec: WorkloadSpec, rate: float, n: int, most: int) -> tuple[WorkloadSpec, float]:
    """The slice's workload at ``rate`` and where its steady window starts: ``planner.simulate.steady_workload``
    (``n`` requests after the agentic session ramp-up), with the whole run held to ``most`` requests. An agentic
    ramp-up at a high rate would otherwise dwarf the search (150 s of sessions at 10^4 req/s); cut short, the
    window starts halfway, before every session has reached its last turns, the same for every candidate."""
    wl, warmup = steady_workload(spec, rate, n)
    if wl.duration_s is not None and rate * wl.duration_s > most:
        duration = most / rate
        return wl.model_copy(update={"duration_s": duration}), min(warmup, duration / 2)
    return wl, warmup


def slice_scenario(ctx: TuneContext, p: Policy, rate_per_gpu: float) -> tuple[Scenario, float]:
    """The scenario of one instance of ``p`` (a wide one cut to a share of its ranks) at ``rate_per_gpu``, and its GPUs."""
    opt = ctx.options[p.ep_width]
    lay = opt.layout
    ranks = ranks_in_slice(lay.dp, p.batch_per_rank, slice_seats(ctx.workload.kind))
    mirror = lay.dp // ranks
    gpus = lay.gpus / mirror
    sc = scheduler_of(p, ranks, ctx.draft_len, ctx.shipped_replay, get_model(ctx.model))
    wl, warmup = slice_workload(ctx.workload, max(rate_per_gpu * gpus, 1e-3), slice_requests(sc.max_num_seqs, ctx.sim_requests),
                                ctx.sim_requests)
    scen = Scenario(name="tune-slice", model=ctx.model, hardware=ctx.hardware, calibration=ctx.calibration, layout=lay,
                    instances=1, scheduler=sc, workload=wl, router=ctx.router, slo=ctx.slo, seed=ctx.seed,
                    steady_after_s=warmup or None)
    eff = ctx.effects.model_copy(update={"mirror": mirror, "eplb": False, "table_placement": opt.table_placement})
    return scen.model_copy(update={"effects": eff}), gpus


def simulate_policy(ctx: TuneContext, p: Policy, rate_per_gpu: float | None = None) -> Run:
    """Simulate ``p`` on its slice at the context's rate (or ``rate_per_gpu``); feasible if it finishes its requests
    and meets the SLO (if any)."""
    from sim.runner import simulate

    scen, gpus = slice_scenario(ctx, p, ctx.rate_per_gpu if rate_per_gpu is None else rate_per_gpu)
    try:
        r = simulate(scen).result
    except (TwinferError, ValueError) as e:
        return Run(p, why=str(e).splitlines()[0])
    m = r.metrics
    w = m.steady or m.whole_run
    if w is None or not m.requests_finished:
        refused = next(iter(m.dropped_by_reason), None)   # e.g. every request past the model's context
        return Run(p, why="no request finished" + (f" ({m.requests_dropped:,} refused, e.g. {refused})" if refused else ""))
    pct = ctx.slo_percentile if ctx.slo is not None else 50
    stat = lambda s: math.inf if getattr(s, f"p{pct}") is None else float(getattr(s, f"p{pct}"))  # noqa: E731
    run = Run(p, thr_gpu=w.output_throughput / gpus, req_gpu=w.request_throughput / gpus, tps_user=w.per_user_output_tps_mean or 0.0, ttft_s=stat(w.ttft_s),
              tpot_s=stat(w.tpot_s), finished=m.requests_finished / max(m.requests_arrived, 1),
              prefill_tokens_per_request=m.computed_prefill_tokens / max(m.requests_finished, 1),
              hit_rate=m.prefix_cache_hit_rate or 0.0, digest=r.digest, feasible=True)
    if run.finished < MIN_FINISHED:
        why = next(iter(m.dropped_by_reason), None)  # a request the deployment can never serve (e.g. past the model's context)
        run.feasible, run.why = False, f"{1 - run.finished:.0%} of requests unfinished" + (
            f" ({m.requests_dropped:,} refused, e.g. {why})" if why else "")
    elif ctx.slo is not None and run.tpot_s > ctx.slo.tpot_s:
        run.feasible, run.why = False, f"TPOT p{pct} {run.tpot_s * 1e3:.1f} ms > SLO {ctx.slo.tpot_s * 1e3:g} ms"
    elif ctx.slo is not None and run.ttft_s > ctx.slo.ttft_s and not ctx.saturated:
        run.feasible, run.why = False, f"TTFT p{pct} {run.ttft_s:.2f} s > SLO {ctx.slo.ttft_s:g} s"
    return run


def capacity_per_gpu(ctx: TuneContext, p: Policy) -> float:
    """Requests/s per GPU policy ``p`` finishes when every request queues at once (its saturated capacity)."""
    from sim.runner import simulate

    scen, gpus = slice_scenario(ctx, p, SATURATE_RATE_PER_GPU)
    m = simulate(scen).result.metrics
    w = m.steady or m.whole_run
    return (w.request_throughput if w is not None else 0.0) / gpus


def better(a: Run, b: Run | None) -> bool:
    """``a`` beats ``b``: feasible first, then more output tokens/s per GPU (ties keep ``b``: stable)."""
    if b is None:
        return True
    if a.feasible != b.feasible:
        return a.feasible
    return a.thr_gpu > b.thr_gpu * (1 + 1e-9)


@dataclass
class SearchResult:
    baseline: Run
    best: Run
    runs: dict[Policy, Run]
    rounds: int
    values: dict[str, list]
    attribution: dict[str, Run] = field(default_factory=dict)   # policy -> the winner with that policy at its baseline value


def search(ctx: TuneContext, base: Policy, values: dict[str, list], *, max_rounds: int = 2,
           tick: Callable[[Run], None] | None = None) -> SearchResult:
    """Coordinate descent from ``base`` over ``values`` (see the module docstring); then the winner with each of the
    three policies set back to its baseline value, for the per-policy gains. ``tick`` hears each new run."""
    runs: dict[Policy, Run] = {}

    def run(p: Policy) -> Run:
        if p not in runs:
            runs[p] = simulate_policy(ctx, p)
            if tick:
                tick(runs[p])
        return runs[p]

    best = run(base)
    baseline = best
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        moved = False
        for pol in POLICIES:
            for v in values[pol]:
                cand = run(best.policy.with_value(pol, v))
                if better(cand, best):
                    best, moved = cand, True
        if not moved:
            break
    attribution = {pol: run(best.policy.with_value(pol, base.value(pol))) for pol in THE_THREE}
    return SearchResult(baseline, best, runs, rounds, values, attribution)


def _pick(values: list, given, default, flag: str):
    """One policy's baseline value: ``given`` (must be among ``values``), else ``default`` if allowed, else the first."""
    if given is not None:
        if given not in values:
            raise TwinferError(f"{flag} {given}: not among the values searched ({', '.join(map(str, values))})")
        return given
    return default if default in values else values[0]


def baseline_policy(ctx: TuneContext, values: dict[str, list], *, ep_width: int | None = None, async_overlap: bool | None = None,
                    replay_tokens: int | None = None, batch_per_rank: int | None = None, chunk_tokens: int | None = None) -> Policy:
    """The policy gains are measured against: the values given, else the narrowest EP width that fits, async overlap
    off, the model's shipped window policy, 64 requests per rank, 8192-token chunks."""
    if replay_tokens is None:
        replay = ctx.shipped_replay
    elif replay_tokens == 0:
        replay = (0, "none")
    else:
        options = [v for v in values["replay"] if v[0] == replay_tokens]
        if not options:
            raise TwinferError(f"--base-replay-tokens {replay_tokens}: not among the replay lengths searched "
                               f"({', '.join(sorted({str(v[0]) for v in values['replay']}))})")
        replay = (replay_tokens, "all") if (replay_tokens, "all") in options else options[0]
    return Policy(ep_width=_pick(values["ep_width"], ep_width, values["ep_width"][0], "--base-ep-width"),
                  async_overlap=_pick(values["async_overlap"], async_overlap, False, "--base-async"),
                  replay_tokens=replay[0], replay_layers=replay[1],
                  batch_per_rank=_pick(values["batch_per_rank"], batch_per_rank, 64, "--base-batch-per-rank"),
                  chunk_tokens=_pick(values["chunk_tokens"], chunk_tokens, 8192, "--base-chunk-tokens"))


def simulations_bound(values: dict[str, list], max_rounds: int) -> int:
    """Most simulations ``search`` runs (the progress bar's total): a round tries every value of every policy."""
    return 1 + max_rounds * sum(len(v) for v in values.values()) + len(THE_THREE)


def make_context(model: str, hardware: str, gpus: int, workload: WorkloadSpec, space: TuneSpace, *, slo: SLO | None = None,
                 slo_percentile: int = 90, seed: int = 0, sim_requests: int = 1500, calibration: str | None = None,
                 mem_fraction: float = 0.9) -> TuneContext:
    """The shared context: the workload measured, the EP widths fitted."""
    options, rejected = ep_layouts(model, hardware, gpus, space.ep_widths, space, mem_fraction)
    return TuneContext(model, hardware, gpus, workload, workload_stats(workload, seed), options, rejected, slo=slo,
                       slo_percentile=slo_percentile, seed=seed, sim_requests=sim_requests, calibration=calibration)
