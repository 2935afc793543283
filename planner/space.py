"""Enumerate the parallel layouts a GPU budget allows, memory fit first.

A layout is one instance's parallelism and dtypes plus its EPLB policy (:class:`LayoutOption`).
Families: TP (attention and experts split ``tp`` ways, EP = TP for MoE), DEP / wide EP
(``dp`` attention-DP ranks of one GPU each, experts over all ``dp``: DeepSeek's deployment),
and PP stages on top of either, tried only when nothing fits without them. Each candidate is
checked with ``costmodels.effective.fit_with_policies`` (weights, workspace, KV, tables); the
ones that do not fit are kept with their reason for the "why nothing fits" explanation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from costmodels.effective import fit_with_policies
from costmodels.hardware import Hardware
from costmodels.layout import ParallelLayout
from costmodels.memory import MemoryFit
from costmodels.model_spec import ModelSpec
from planner.request import SearchSpace

EplbMode = Literal["off", "rebalance", "redundant"]


@dataclass(frozen=True)
class LayoutOption:
    """One instance layout the planner may use, with the policies that change its memory or step cost."""

    layout: ParallelLayout = field(compare=False, hash=False)
    key: tuple = field(repr=False)
    eplb: EplbMode
    table_placement: Literal["host", "hbm"]
    max_kv_tokens_per_rank: int        # at the smallest per-rank limits the search tries (see enumerate_layouts)
    fit_explanation: str
    fit: MemoryFit | None = field(default=None, compare=False, hash=False, repr=False)   # without the MTP layers
    fit_mtp: MemoryFit | None = field(default=None, compare=False, hash=False, repr=False)  # with them (drafting)

    def kv_tokens_per_rank(self, model: ModelSpec, batched_tokens_per_rank: int, running_per_rank: int,
                           mtp: bool = False) -> int:
        """KV tokens per DP rank with the workspace of a rank running these limits: the simulator's figure for
        the scheduler ``planner.simulate.scheduler_for`` builds (one definition: ``MemoryFit.kv_tokens_per_dp_rank_at``);
        ``mtp``: with the MTP layers loaded, as a candidate that drafts serves (``memory_fit``'s ``mtp``)."""
        fit = self.fit_mtp if mtp and self.fit_mtp is not None else self.fit
        if fit is None:
            return self.max_kv_tokens_per_rank
        if not fit.fits:
            return 0
        return fit.kv_tokens_per_dp_rank_at(model, self.layout, batched_tokens_per_rank, running_per_rank, sched_ranks=1)

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    @property
    def dp(self) -> int:
        return self.layout.dp

    def describe(self) -> str:
        """Short label: 'DEP8 fp8 tbo eplb+8' style."""
        lay = self.layout
        if lay.dp > 1 and lay.tp == 1 and lay.ep in (1, lay.dp):
            base = f"{'DEP' if lay.ep > 1 else 'DP'}{lay.dp}"
        else:
            base = f"TP{lay.tp}" + (f"xDP{lay.dp}" if lay.dp > 1 else "") + (f"xEP{lay.ep}" if lay.ep > 1 else "")
        if lay.pp > 1:
            base += f"xPP{lay.pp}"
        parts = [base, lay.weight_dtype if lay.experts_dtype == lay.weight_dtype else f"{lay.weight_dtype}/{lay.experts_dtype}"]
        if lay.kv_dtype != "bf16":
            parts.append(f"kv-{lay.kv_dtype}")
        if lay.two_micro_batch:
            parts.append("tbo")
        if self.eplb == "rebalance":
            parts.append("eplb")
        elif self.eplb == "redundant":
            parts.append(f"eplb+{lay.eplb_redundant_experts}")
        if self.table_placement == "hbm":
            parts.append("tables-hbm")
        return " ".join(parts)


@dataclass
class Rejected:
    """A layout that was considered and why it cannot be used."""

    label: str
    gpus: int
    reason: str
    short_by_bytes: float = 0.0


def _option_key(lay: ParallelLayout, eplb: str, tables: str) -> tuple:
    return (lay.tp, lay.dp, lay.ep, lay.pp, lay.weight_dtype, lay.experts_dtype, lay.kv_dtype, lay.two_micro_batch,
            lay.eplb_redundant_experts, eplb, tables)


def _shapes(model: ModelSpec, hw: Hardware, budget: int, space: SearchSpace, pp: int) -> list[tuple[int, int, int]]:
    """(tp, dp, ep) triples of the TP and DEP families that fit the budget with ``pp`` stages."""
    moe = model.moe is not None
    out: list[tuple[int, int, int]] = []
    for tp in space.tp:
        if tp * pp > budget or tp > max(model.num_attention_heads, 1):
            continue
        out.append((tp, 1, tp if moe else 1))
        if moe and tp > 1:
            out.append((tp, 1, 1))  # TP-only MoE (experts split moe_tp ways)
    for w in space.dep:
        if w < 2 or w * pp > budget:
            continue
        # TP x DP hybrids (tp * dp = w) and MoE TP x EP mixes (ep = w / moe_tp), where the space asks for them
        for a_tp in space.dep_attention_tp:
            if w % a_tp or w // a_tp < 2 or a_tp > max(model.num_attention_heads, 1):
                continue
            if not moe:
                out.append((a_tp, w // a_tp, 1))
                continue
            for m_tp in space.dep_moe_tp:
                if w % m_tp == 0:
                    out.append((a_tp, w // a_tp, w // m_tp))
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def enumerate_layouts(model: ModelSpec, hw: Hardware, budget: int, space: SearchSpace, *,
                      mem_fraction: float = 0.9) -> tuple[list[LayoutOption], list[Rejected]]:
    """Every layout option that fits in memory within ``budget`` GPUs, and the ones that do not (with reasons).

    The fit reserves workspace for the smallest per-rank limits the search tries (smallest chunk
    plus smallest batch, smallest batch): a layout fits if any candidate of it can run; the
    screen then checks each candidate's KV at its own limits (``LayoutOption.kv_tokens_per_rank``).

    PP > 1 is tried only if no layout fits without pipeline stages ("where it matters": PP
    adds a bubble-free but serial stage chain in our cost model, so it only wins on memory).
    """
    w_dtype = space.weight_dtype or model.checkpoint_dtype
    e_dtype = space.expert_dtype or model.checkpoint_expert_dtype or w_dtype
    kv_dtypes = space.kv_dtypes or (model.default_kv_dtype,)
    has_tables = model.host_table_bytes > 0 and model.host_table_bytes_per_token > 0
    table_opts = space.table_placement if has_tables else ("host",)
    ok: list[LayoutOption] = []
    rejected: list[Rejected] = []
    fit_cache: dict[tuple, MemoryFit] = {}
    rank_running = min(space.batch_per_rank)
    rank_tokens = min(space.chunk_tokens) + rank_running
    for pp in space.pp:
        if pp > 1 and ok:
            break  # pipeline stages only where nothing fits without them
        for tp, dp, ep in _shapes(model, hw, budget, space, pp):
            for kv in kv_dtypes:
                for tbo in (space.two_micro_batch if ep > 1 else (False,)):
                    for eplb in (space.eplb if ep > 1 else ("off",)):
                        redundant = ep if eplb == "redundant" else 0
                        try:
                            lay = ParallelLayout(tp=tp, dp=dp, ep=ep, pp=pp, weight_dtype=w_dtype, expert_dtype=e_dtype,
                                                 kv_dtype=kv, two_micro_batch=tbo, eplb_redundant_experts=redundant)
                        except ValueError as e:  # pragma: no cover - shapes are built valid
                            rejected.append(Rejected(f"tp{tp} dp{dp} ep{ep} pp{pp}", tp * dp * pp, str(e)))
                            continue
                        for tables in table_opts:
                            fkey = (tp, dp, ep, pp, kv, redundant, tables)
                            fits = fit_cache.get(fkey)
                            if fits is None:   # without the MTP layers (no drafts) and, where the model has them, with
                                fits = fit_cache[fkey] = tuple(
                                    fit_with_policies(model, hw, lay, table_placement=tables, mem_fraction=mem_fraction,
                                                      max_batched_tokens=rank_tokens, max_running_requests=rank_running,
                                                      sched_ranks=1, mtp=mtp)
                                    for mtp in ((False, True) if model.mtp_layers else (False,)))
                            fit = fits[0]
                            opt = LayoutOption(lay, _option_key(lay, eplb, tables), eplb, tables,
                                               fit.max_kv_tokens_per_dp_rank, fit.explanation, fit, fits[-1] if len(fits) > 1 else None)
                            if fit.fits and (tables == "hbm" or fit.host_fits):
                                ok.append(opt)
                            else:
                                reason = fit.explanation if fit.fits is False else (
                                    f"lookup tables need {fit.host_table_bytes_per_gpu / 1e9:.0f} GB of host memory per GPU, "
                                    f"{hw.name} has {hw.host_mem_gb:.0f} GB")
                                rejected.append(Rejected(opt.describe(), lay.gpus, reason, max(0.0, -fit.kv_pool_bytes)))
    return ok, rejected
