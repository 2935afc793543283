"""Serving effects in simulated time: expert load that drifts, EPLB rebalancing, attention-DP stragglers.

``EffectsSpec`` is the YAML-facing switchboard; :func:`build_step_cost` turns it into the
object the SimBackend asks for step times. With the defaults that is what ``sim.runner``
uses: ``EffectiveStepCost`` (per-step attention-DP imbalance, the cost model's constant
expert imbalance), memoised.

Time-varying load (``DriftingStepCost``): the simulator's clock is cut into epochs of
``epoch_s``; in each epoch the expert popularity has drifted (``ExpertLoadSpec.drift_*``)
and, every ``eplb_period_s``, EPLB re-places experts from the popularity it sees then. A
rebalance stalls the instance while expert weights move (bulk mode, as TensorRT-LLM's first
implementation): the busiest rank's moved expert bytes over the scale-up (or, for EP groups
wider than a scale-up domain, scale-out) link, plus ``eplb_move_overhead_s``. The stall is
added to the first step that starts after the rebalance. A plan spanning an epoch boundary is
costed with the epoch it started in (plans last at most ``max_decode_steps`` steps).

``host_cache_gb`` / ``storage_cache_gb`` give the prefix cache lower tiers
(``scheduler/kv_tiers.py``): capacities in blocks per instance follow from the KV bytes of a
block on one GPU; loading a block back costs those bytes over the host link or at
``storage_gbps``, overlapped layer by layer with the step's compute.

``mirror`` is a simulation shortcut for wide attention-DP instances: the instance is
simulated as ``dp / mirror`` of its DP ranks (with that share of the traffic, seats and KV)
and the cost model sees the batch repeated ``mirror`` times, i.e. the other ranks carry
statistically identical batches. It keeps a DP72 instance's simulation at the size of a DP8.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from costmodels.batch import decodes_then_chunks
from costmodels.calibration import CalibrationProfile
from costmodels.effective import DP_SPLIT_NOTE, EffectiveStepCost, TablePlacement
from costmodels.hardware import Hardware
from costmodels.layout import ParallelLayout
from costmodels.model_spec import ModelSpec
from costmodels.moe_load import ExpertLoad, ExpertLoadSpec, cached_initial
from costmodels.params import WEIGHT_BYTES
from sim.backend import MemoStepCost


class EffectsSpec(BaseModel):
    """Which serving effects the simulation models beyond the plain step cost model (all off by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expert_load: ExpertLoadSpec | None = Field(None, description="per-expert load skew/drift (None: the cost model's constant imbalance)")
    eplb: bool = Field(False, description="place experts with EPLB (balanced packing + the layout's redundant experts) instead of contiguously")
    eplb_period_s: float | None = Field(None, gt=0, le=1e6, description="re-run EPLB every this many seconds (None: place once, from the initial load)")
    eplb_move_overhead_s: float = Field(
        0.5, ge=0, le=60,
        description="fixed stall per rebalance on top of the copy time: TensorRT-LLM's large-EP blog estimates a bulk "
        "rebalance stalls serving for 0.5-1 s (synchronisation, reloading weights from host memory); 0.5 s is the low end",
    )
    epoch_s: float = Field(30.0, gt=0, le=1e6, description="how often drifting expert load is re-evaluated (simulated seconds)")
    dp_balance: bool = Field(True, description="each step waits for its busiest attention-DP rank (False: requests spread evenly, the StepCostModel's assumption)")
    table_placement: TablePlacement = Field("host", description="lookup tables (Engram / n-gram) in host memory or sharded in HBM")
    table_prefetch: bool = Field(True, description="issue table lookups ahead of the step (they depend only on token ids)")
    mirror: int = Field(1, ge=1, le=4096, description="simulate 1/mirror of the DP ranks; the cost model sees the batch mirror times")
    host_cache_gb: float = Field(0.0, ge=0, le=1e5, description="host memory per GPU for the prefix cache's second tier (HiCache L2); 0: none")
    storage_cache_gb: float = Field(0.0, ge=0, le=1e8, description="storage per GPU for the third tier (3FS / Mooncake store L3); 0: none")
    storage_gbps: float = Field(
        5.0, gt=0, le=1e4,
        description="GB/s per GPU reading KV back from storage (deepseek-ai/3FS README: KVCache reads peak ~40 GiB/s per "
        "8-GPU client node, ~5 per GPU)",
    )

    @model_validator(mode="after")
    def _check(self) -> "EffectsSpec":
        if self.eplb_period_s is not None and not self.eplb:
            raise ValueError("eplb_period_s: periodic rebalancing needs eplb: true")
        return self

    @property
    def active(self) -> bool:
        """True if anything differs from the plain cost model."""
        return self != EffectsSpec()


class MirroredStepCost:
    """The cost of a batch that ``factor`` DP-rank groups each run a copy of (see ``EffectsSpec.mirror``)."""

    def __init__(self, inner, factor: int):
        self.inner, self.factor = inner, factor
        self.notes = list(getattr(inner, "notes", [])) + [f"simulated {1}/{factor} of the DP ranks; the others assumed to carry the same load"]

    def mixed_step_time(self, new_tokens, context_lens, is_decode) -> float:
        k = self.factor
        return self.inner.mixed_step_time(np.tile(new_tokens, k), np.tile(context_lens, k), np.tile(is_decode, k))

    def decode_times(self, context_lens, num_steps: int, draft_len: int = 0) -> np.ndarray:
        return self.inner.decode_times(np.tile(np.asarray(context_lens), self.factor), num_steps, draft_len)


class RankedStepCost(MemoStepCost):
    """Step times at the attention-DP ranks the scheduler assigned (``scheduler.dp_attention``).

    The backend prices exactly the plan in flight (schedule -> execute -> complete), so each call
    reads that plan's ranks from the scheduler (``AttentionDPRanks.plan_ranks``, decodes then
    chunks: the order of the arrays it is given) and passes them to ``EffectiveStepCost``: the
    assignment the scheduler made is the one priced. With ``mirror`` the other rank groups carry
    copies of the batch on their own ranks. No memo: prices depend on the ranks, not only on sums.
    """

    def __init__(self, memo: MemoStepCost, dp_ranks):
        inner = memo.cost_model
        self.mirror = inner.factor if isinstance(inner, MirroredStepCost) else 1
        self.cost_model = inner.inner if isinstance(inner, MirroredStepCost) else inner
        if not isinstance(self.cost_model, EffectiveStepCost):
            raise TypeError("RankedStepCost prices an EffectiveStepCost (no drifting expert load)")
        if dp_ranks.ranks * self.mirror > self.cost_model.layout.dp:
            raise ValueError(f"attention_dp.ranks={dp_ranks.ranks} x mirror {self.mirror} exceeds layout.dp={self.cost_model.layout.dp}")
        self.dp = dp_ranks
        self.notes = list(getattr(memo, "notes", []))
        self.sum_only = False
        self.chunked_sum = None
        self._blocks = {}

    def _tile(self, a: np.ndarray) -> np.ndarray:
        return np.tile(a, self.mirror) if self.mirror > 1 else a

    def _ranks(self, n: int) -> np.ndarray:
        ranks = self.dp.plan_ranks()
        if ranks.size != n:
            raise RuntimeError(f"RankedStepCost: {n} requests priced, the plan in flight has {ranks.size}")
        if self.mirror > 1:
            ranks = np.concatenate([ranks + j * self.dp.ranks for j in range(self.mirror)])
        return ranks

    def mixed_step_time(self, new_tokens, context_lens, is_decode) -> float:
        new = np.asarray(new_tokens, np.int64)
        ranks = self._ranks(new.size)
        return self.cost_model.mixed_step_time(self._tile(new), self._tile(np.asarray(context_lens, np.int64)),
                                               self._tile(np.asarray(is_decode, bool)), ranks=ranks)

    def chunked_step_time(self, decode_context_lens, draft_len: int, prefill_new: list[int], prefill_ctx: list[int]) -> float:
        return self.mixed_step_time(*decodes_then_chunks(decode_context_lens, draft_len, prefill_new, prefill_ctx))

    def decode_times(self, context_lens, num_steps: int, draft_len: int = 0) -> np.ndarray:
        ctx = np.asarray(context_lens)
        ranks = self._ranks(ctx.size)
        return self.cost_model.decode_times(self._tile(ctx), num_steps, draft_len, ranks=ranks)


def attention_dp_notes(config) -> list[str]:
    """What a SchedulerConfig with explicit attention-DP ranks changes in the pricing, for a result's notes."""
    ad = config.attention_dp
    if ad is None or (ad.ranks or 1) < 2:
        return []
    policy = (f"balance (prompts held until every rank can take one, at most {ad.timeout_iters} steps each; "
              f"{ad.batching_wait_iters} more to gather)" if ad.prefill == "balance" else "immediate")
    return [f"attention-DP ranks scheduled explicitly ({ad.ranks} ranks, prefill {policy}): each step priced at the "
            f"ranks the scheduler assigned (not the round-robin / least-loaded split); per rank {config.rank_token_budget()} tokens/step, {config.rank_seats()} "
            "requests, KV reserved per request within the rank's share"]


def pricing_notes(cost, config) -> list[str]:
    """A run's cost-model notes: ``cost``'s, and with explicit attention-DP ranks their note in place of the
    round-robin / least-loaded split's (the scheduler's assignment prices every step then, not that split)."""
    ranked = attention_dp_notes(config)
    notes = list(getattr(cost, "notes", []))
    return [n for n in notes if not (ranked and n == DP_SPLIT_NOTE)] + ranked


def ranked_cost(cost, scheduler):
    """The step cost one instance's backend uses: ``cost`` priced at ``scheduler``'s attention-DP ranks where it
    assigns them (``RankedStepCost``), else ``cost`` itself."""
    if getattr(scheduler, "dp", None) is None:
        return cost
    if isinstance(cost, DriftingStepCost):
        raise ValueError("scheduler.attention_dp: explicit attention-DP ranks are not modelled with drifting expert load / "
                         "periodic EPLB (effects.expert_load drift, effects.eplb_period_s)")
    return RankedStepCost(cost, scheduler.dp)


class DriftingStepCost(MemoStepCost):
    """Step times whose expert load changes with simulated time (drift, periodic EPLB), plus rebalance stalls.

    A MemoStepCost (so the backend uses it as is) whose memo is the current epoch's: each epoch's
    load gets its own memoised cost model, and every call first moves to the clock's epoch.
    """

    def __init__(self, make: Callable[[ExpertLoad], MemoStepCost], spec: ExpertLoadSpec, load: ExpertLoad, effects: EffectsSpec,
                 move_bytes_per_slot: float, link_bw: float, clock: Callable[[], float]):
        self.make, self.spec, self.effects, self.clock = make, spec, effects, clock
        self.move_bytes_per_slot, self.link_bw = move_bytes_per_slot, link_bw
        self.load = load
        self.epoch = 0
        self.current = make(load)
        self.cost_model = self.current.cost_model
        self.notes = list(getattr(self.current, "notes", []))
        self._stall = 0.0
        self.rebalances = 0
        self.stall_s = 0.0
        self._last_rebalance = 0

    @property
    def sum_only(self) -> bool:
        return self.current.sum_only

    def _advance(self) -> None:
        e = int(self.clock() // self.effects.epoch_s)
        if e <= self.epoch:
            return
        eff = self.effects
        load = self.load
        changed = False
        for k in range(self.epoch + 1, e + 1):
            drifted = load.drifted(self.spec, eff.epoch_s / 60.0, k)
            changed |= drifted is not load
            load = drifted
            if eff.eplb_period_s is not None:
                due = int(k * eff.epoch_s // eff.eplb_period_s)
                if due > self._last_rebalance:
                    self._last_rebalance = due
                    new = load.rebalanced()
                    moved = new.moved_slots(load)
                    self._stall += moved * self.move_bytes_per_slot / self.link_bw + eff.eplb_move_overhead_s
                    self.rebalances += 1
                    load, changed = new, True
        self.epoch = e
        if changed:
            self.load = load
            self.current = self.make(load)

    def _take_stall(self) -> float:
        s, self._stall = self._stall, 0.0
        self.stall_s += s
        return s

    def mixed_step_time(self, new_tokens, context_lens, is_decode) -> float:
        self._advance()
        return self.current.mixed_step_time(new_tokens, context_lens, is_decode) + self._take_stall()

    def decode_times(self, context_lens, num_steps: int, draft_len: int = 0) -> np.ndarray:
        self._advance()
        t = np.array(self.current.decode_times(context_lens, num_steps, draft_len), float)
        if t.size and self._stall:
            t[0] += self._take_stall()
        return t

    def decode_times_at(self, n: int, draft_len: int, context_sums: np.ndarray) -> np.ndarray:
        self._advance()
        t = np.array(self.current.decode_times_at(n, draft_len, context_sums), float)
        if t.size and self._stall:
            t[0] += self._take_stall()
        return t


def kv_tiers(effects: EffectsSpec, sc, hw: Hardware, layout: ParallelLayout, kv_bytes_per_token_per_gpu: float):
    """(scheduler config with tier capacities, seconds to load one block from host, from storage) for one pool."""
    if not (effects.host_cache_gb or effects.storage_cache_gb):
        return sc, (0.0, 0.0)
    eff = CalibrationProfile.default(hw).comm_eff
    block_bytes = sc.block_size * kv_bytes_per_token_per_gpu      # one block, on each GPU of the DP rank holding it
    ranks = max(1, layout.dp // effects.mirror)                   # DP ranks hold disjoint blocks
    per_rank = lambda gb: int(gb * 1e9 // block_bytes) if block_bytes > 0 else 0  # noqa: E731
    sc = sc.model_copy(update={
        "host_cache_blocks": max(sc.host_cache_blocks, ranks * per_rank(effects.host_cache_gb)),
        "storage_cache_blocks": max(sc.storage_cache_blocks, ranks * per_rank(effects.storage_cache_gb)),
    })
    return sc, (block_bytes / (hw.host_bw * eff), block_bytes / (effects.storage_gbps * 1e9 * eff))


def initial_expert_load(model: ModelSpec, layout: ParallelLayout, effects: EffectsSpec | None) -> ExpertLoad | None:
    """The expert load a pool's steps start priced with (None: the cost model's constant imbalance): a stated skew, or
    EPLB balancing the default (measured) skew; only with experts spread over EP ranks."""
    eff = effects or EffectsSpec()
    if model.moe is None or layout.ep <= 1 or (eff.expert_load is None and not eff.eplb):
        return None
    return cached_initial(eff.expert_load or ExpertLoadSpec(), model.moe.n_routed_experts, layout.ep,
                          layout.eplb_redundant_experts, eff.eplb)


def build_step_cost(model: ModelSpec, hw: Hardware, layout: ParallelLayout, effects: EffectsSpec | None,
                    clock: Callable[[], float] | None = None, calibration: CalibrationProfile | None = None):
    """The step-cost object for one pool's instances (a StepCost, as ``sim.backend.SimBackend`` takes)."""
    eff = effects or EffectsSpec()
    spec = eff.expert_load or ExpertLoadSpec()

    def make(load: ExpertLoad | None):
        inner = EffectiveStepCost(model, hw, layout, calibration, expert_load=load, dp_balance=eff.dp_balance,
                                  table_placement=eff.table_placement, table_prefetch=eff.table_prefetch)
        if eff.mirror > 1:
            inner = MirroredStepCost(inner, eff.mirror)
        memo = MemoStepCost(inner)
        memo.notes = list(getattr(inner, "notes", []))
        return memo

    load = initial_expert_load(model, layout, eff)
    if load is None:
        return make(None)
    timed = spec.drift_fraction_per_min > 0 or eff.eplb_period_s is not None
    if not timed:
        return make(load)
    if clock is None:
        raise ValueError("drifting expert load / periodic EPLB need the simulation clock")
    per_slot = model.num_layers and (
        3 * model.hidden_size * model.moe.moe_intermediate_size / layout.moe_tp * WEIGHT_BYTES[layout.experts_dtype]
        * sum(1 for i in range(model.num_layers) if model.is_moe_layer(i))
    )
    link = hw.scaleup_bw if layout.ep <= hw.scaleup_domain else hw.scaleout_bw
    eff_bw = link * CalibrationProfile.default(hw).comm_eff
    return DriftingStepCost(make, spec, load, eff, float(per_slot), eff_bw, clock)
