"""EP-sharded MoE layer: each rank holds some expert slots, tokens travel to them and back.

A placement lists, per rank, the logical expert held in each of its *physical slots*; slots
are numbered rank by rank (rank 0's first, ...), as DeepEP and EPLB number them. Without
EPLB experts sit contiguously (``E / ep`` per rank); with EPLB's ``redundant`` extra slots the
hottest experts get replicas and replicas are packed to balance rank load
(:func:`costmodels.moe_load.eplb_placement`, the same code the simulator prices).

Forward on every rank, for its own (attention-DP) tokens:
route (replicated router) -> pick a replica slot per choice -> dispatch (:mod:`executor.ep`)
-> local grouped expert FFN over the received rows -> combine -> + shared experts (replicated).
A rank with no tokens still takes part in every collective (an *idle pass*: ``[0, hidden]``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from costmodels.moe_load import contiguous_placement, eplb_placement
from executor.ep import EPGroup, Received, make_dispatcher
from executor.moe import Experts, MoE
from kernels import ops
from kernels import reference as ref
from twinfer.errors import TwinferError

ReplicaPolicy = Literal["round_robin", "local_first"]


@dataclass(frozen=True)
class ExpertPlacement:
    """Logical expert id of every physical slot, per rank."""

    ranks: tuple[tuple[int, ...], ...]
    n_experts: int

    def __post_init__(self):
        held = {e for r in self.ranks for e in r}
        if any(not 0 <= e < self.n_experts for e in held):
            raise TwinferError(f"placement: expert ids must be in [0, {self.n_experts})")
        missing = sorted(set(range(self.n_experts)) - held)
        if missing:
            raise TwinferError(f"placement: experts {missing[:8]} have no slot on any rank")
        if any(len(r) == 0 for r in self.ranks):
            raise TwinferError("placement: every rank needs at least one expert slot")

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def n_slots(self) -> int:
        return sum(len(r) for r in self.ranks)

    @property
    def redundant(self) -> int:
        return self.n_slots - self.n_experts

    def slot_rank(self) -> torch.Tensor:
        """``[S]`` rank of each physical slot."""
        return torch.tensor([r for r, ids in enumerate(self.ranks) for _ in ids], dtype=torch.int64)

    def slot_offset(self) -> torch.Tensor:
        """``[world]`` first physical slot id of each rank."""
        sizes = torch.tensor([len(r) for r in self.ranks], dtype=torch.int64)
        return torch.cumsum(sizes, 0) - sizes

    def replicas(self) -> list[list[int]]:
        """Physical slot ids of each logical expert."""
        out: list[list[int]] = [[] for _ in range(self.n_experts)]
        s = 0
        for ids in self.ranks:
            for e in ids:
                out[e].append(s)
                s += 1
        return out

    # --- constructors
    @staticmethod
    def contiguous(n_experts: int, ep: int) -> "ExpertPlacement":
        """No EPLB: consecutive expert ids, ``n / ep`` per rank."""
        return ExpertPlacement(tuple(tuple(int(e) for e in a) for a in contiguous_placement(n_experts, ep)), n_experts)

    @staticmethod
    def eplb(popularity, ep: int, redundant: int) -> "ExpertPlacement":
        """EPLB: replicate the hottest experts ``redundant`` times, pack replicas to balance rank load."""
        pop = np.asarray(popularity, dtype=float)
        pop = pop / pop.sum() if pop.sum() > 0 else np.full(pop.size, 1.0 / pop.size)
        return ExpertPlacement(tuple(tuple(int(e) for e in a) for a in eplb_placement(pop, ep, redundant)), pop.size)

    def to_dict(self) -> dict:
        return {"n_experts": self.n_experts, "ranks": [list(r) for r in self.ranks]}

    @staticmethod
    def from_dict(d: dict) -> "ExpertPlacement":
        return ExpertPlacement(tuple(tuple(int(e) for e in r) for r in d["ranks"]), int(d["n_experts"]))


def placements_for(n_layers: int, n_experts: int, ep: int, redundant: int = 0,
                   popularity: list | None = None) -> list[ExpertPlacement]:
    """One placement per MoE layer: contiguous without redundancy, else EPLB on ``popularity[l]``
    (measured tokens per expert, e.g. ``MoE.expert_counts`` summed over a warm-up; uniform if None)."""
    if redundant == 0 and popularity is None:
        p = ExpertPlacement.contiguous(n_experts, ep)
        return [p] * n_layers
    out = []
    for i in range(n_layers):
        pop = popularity[i] if popularity is not None else np.ones(n_experts)
        out.append(ExpertPlacement.eplb(pop, ep, redundant))
    return out


def placements_from_plan(layout, effects, n_experts: int, n_layers: int) -> list[ExpertPlacement]:
    """Placements a plan implies: its EP width and redundant experts; with EPLB (``effects.eplb`` or
    redundancy) the plan's expert-load assumption (``effects.expert_load``, default skew) as popularity,
    layer ``l`` taking the simulator's sampled layer ``l mod 12``."""
    from costmodels.moe_load import ExpertLoad, ExpertLoadSpec
    redundant = layout.eplb_redundant_experts
    eplb = bool(getattr(effects, "eplb", False)) or redundant > 0
    if not eplb:
        return placements_for(n_layers, n_experts, layout.ep)
    spec = getattr(effects, "expert_load", None) or ExpertLoadSpec()
    load = ExpertLoad.initial(spec, n_experts, layout.ep, redundant, True)
    return [ExpertPlacement(tuple(tuple(int(e) for e in a) for a in load.placements[i % len(load.placements)]), n_experts)
            for i in range(n_layers)]


def save_placements(placements: list[ExpertPlacement], path: str | Path) -> None:
    Path(path).write_text(json.dumps({"layers": [p.to_dict() for p in placements]}, indent=1))


def load_placements(path: str | Path) -> list[ExpertPlacement]:
    return [ExpertPlacement.from_dict(d) for d in json.loads(Path(path).read_text())["layers"]]


class EPMoE(nn.Module):
    """A :class:`executor.moe.MoE` with its routed experts sharded over an EP group.

    Router and shared experts stay replicated (each rank runs them on its own tokens); the
    routed experts keep only this rank's slots (``experts.w13 [local slots, 2I, D]``).
    """

    route = MoE.route   # same routing code, same parameters

    def __init__(self, moe: MoE, g: EPGroup, placement: ExpertPlacement, two_micro_batch: bool = False,
                 replica_policy: ReplicaPolicy = "round_robin", dispatcher: str | None = None):
        super().__init__()
        if placement.world != g.world:
            raise TwinferError(f"placement has {placement.world} ranks, the EP group {g.world}")
        if placement.n_experts != moe.cfg.n_routed_experts:
            raise TwinferError(f"placement covers {placement.n_experts} experts, the layer has {moe.cfg.n_routed_experts}")
        self.cfg, self.scaling, self.norm_topk_prob = moe.cfg, moe.scaling, moe.norm_topk_prob
        self.g, self.placement, self.two_micro_batch = g, placement, two_micro_batch
        self.gate, self.shared_experts = moe.gate, moe.shared_experts
        self.register_buffer("router_bias", moe.router_bias.clone(), persistent=False)
        self.expert_counts: torch.Tensor | None = None
        local = torch.tensor(placement.ranks[g.rank], dtype=torch.int64)
        src = moe.experts
        with torch.device("meta"):
            self.experts = Experts(len(local), src.w13.shape[2], src.w2.shape[2], src.fp8)
        dev = src.w13.device
        for name in ("w13", "w2", "w13_scale_inv", "w2_scale_inv"):
            if hasattr(src, name):
                setattr(self.experts, name, nn.Parameter(getattr(src, name).data[local.to(dev)].clone(), requires_grad=False))
        self.local_experts = local
        self._build_tables(replica_policy, dev)
        hidden = src.w13.shape[2]
        self.dispatcher = make_dispatcher(g, placement.slot_rank(), placement.slot_offset(), moe.cfg.top_k,
                                          hidden * max(src.w13.element_size(), 2), dispatcher)

    def _build_tables(self, policy: ReplicaPolicy, dev) -> None:
        reps = self.placement.replicas()
        cmax = max(len(r) for r in reps)
        table = torch.tensor([r + [r[0]] * (cmax - len(r)) for r in reps], dtype=torch.int64)
        count = torch.tensor([len(r) for r in reps], dtype=torch.int64)
        if policy == "local_first":
            off, n_local = int(self.placement.slot_offset()[self.g.rank]), len(self.placement.ranks[self.g.rank])
            for e, r in enumerate(reps):
                mine = [s for s in r if off <= s < off + n_local]
                if mine:   # only the local replica: no traffic for this expert
                    table[e] = mine[0]
                    count[e] = 1
        self.register_buffer("replica_table", table.to(dev), persistent=False)
        self.register_buffer("replica_count", count.to(dev), persistent=False)

    def pick_slots(self, ids: torch.Tensor) -> torch.Tensor:
        """Physical slot for each (token, choice): replicas of an expert take turns by token row (offset by rank)."""
        row = torch.arange(ids.shape[0], device=ids.device)[:, None] + self.g.rank
        return self.replica_table[ids, row % self.replica_count[ids]]

    def expert_ffn(self, r: Received) -> torch.Tensor:
        """This rank's experts over received rows: ``sum_k w * expert_k(x)`` per row, in the rows' dtype."""
        x = r.x
        row, col = (r.slot >= 0).nonzero(as_tuple=True)
        if row.numel() == 0:
            return torch.zeros_like(x)
        e = self.experts
        ids, w = r.slot[row, col][:, None], r.weight[row, col][:, None]
        if e.fp8:
            y = ops.moe_experts(x[row], w, ids, e.w13, e.w2, e.w13_scale_inv, e.w2_scale_inv)
        else:
            y = ops.moe_experts(x[row], w, ids, e.w13, e.w2)
        acc = ref._up(x).dtype
        return torch.zeros(x.shape, dtype=acc, device=x.device).index_add_(0, row, y.to(acc)).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, ids = self.route(x)
        self.expert_counts = torch.bincount(ids.reshape(-1), minlength=self.cfg.n_routed_experts)
        slots = self.pick_slots(ids)
        if self.two_micro_batch:
            from executor.two_micro_batch import moe_forward_two_batches
            return moe_forward_two_batches(self, x, slots, w)
        rec = self.dispatcher.dispatch(x, slots, w)
        y = self.dispatcher.combine(self.expert_ffn(rec), rec.handle).to(x.dtype)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y


# ----------------------------------------------------------------------------- whole models

def moe_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) of every MoE / EPMoE, in registration order (main layers, then MTP)."""
    out = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, (MoE, EPMoE)):
                out.append((parent, name, child))
    return out


def shard_moe_layers(model: nn.Module, g: EPGroup, placements: list[ExpertPlacement] | ExpertPlacement | None = None,
                     redundant: int = 0, two_micro_batch: bool = False, replica_policy: ReplicaPolicy = "round_robin",
                     dispatcher: str | None = None) -> list[EPMoE]:
    """Replace every MoE of ``model`` by its EP shard for rank ``g.rank``; returns the new layers.

    ``placements``: one per MoE layer (or one for all); default contiguous, or EPLB with
    ``redundant`` replicas on uniform popularity. Frees the non-local expert weights.
    """
    found = [(p, n, m) for p, n, m in moe_modules(model) if isinstance(m, MoE)]
    if not found:
        return []
    n_exp = found[0][2].cfg.n_routed_experts
    if placements is None:
        placements = placements_for(len(found), n_exp, g.world, redundant)
    elif isinstance(placements, ExpertPlacement):
        placements = [placements] * len(found)
    if len(placements) < len(found):
        raise TwinferError(f"{len(placements)} placements for {len(found)} MoE layers")
    new = []
    for (parent, name, moe), pl in zip(found, placements):
        ep = EPMoE(moe, g, pl, two_micro_batch, replica_policy, dispatcher)
        setattr(parent, name, ep)
        new.append(ep)
    return new


def main_stack_ep_layers(model: nn.Module) -> list[EPMoE]:
    """The EP layers one ordinary forward calls, in call order (the MTP layers are not in it)."""
    return [layer.mlp for layer in model.model.layers if isinstance(getattr(layer, "mlp", None), EPMoE)]


@torch.inference_mode()
def idle_pass(model: nn.Module) -> None:
    """Take part in one forward's collectives with no tokens (an attention-DP rank with nothing to run)."""
    w = model.model.embed_tokens.weight
    empty = torch.zeros(0, w.shape[1], dtype=w.dtype, device=w.device)
    for layer in main_stack_ep_layers(model):
        layer(empty)
