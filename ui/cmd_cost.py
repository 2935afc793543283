"""``twinfer cost``: one step's time, where it goes, and whether the model fits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal, NamedTuple, Optional

import numpy as np
import typer
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rich.console import Console
from rich.table import Table

from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError

DT = Literal["bf16", "fp8", "fp4"]
SKEW = Literal["zipf", "uniform"]  # expert-load models of costmodels.moe_load (sampled per batch size)
MAX_BATCH = 1_000_000   # requests in one priced step, over all --batch groups


class BatchSpec(BaseModel):
    """One group of identical requests: ``decode:BxL`` or ``prefill:BxL[+cached]``."""

    model_config = ConfigDict(extra="forbid")
    phase: Literal["decode", "prefill"]
    batch_size: int = Field(..., ge=1, le=MAX_BATCH, description="batch size")
    tokens: int = Field(..., ge=1, le=100_000_000, description="context length (decode) or prompt length (prefill)")
    cached: int = Field(0, ge=0, description="prefix-cache hit tokens of a prefill")

    @staticmethod
    def parse(text: str) -> "BatchSpec":
        """Parse 'decode:64x4096' / 'prefill:2x8192' / 'prefill:1x8192+4096'."""
        t = text.strip().lower()
        if ":" not in t or "x" not in t.split(":", 1)[1]:
            raise TwinferError(f"--batch {text!r}: expected PHASE:BATCHxTOKENS, e.g. decode:64x4096 or prefill:2x8192")
        phase, rest = t.split(":", 1)
        bs, tok = rest.split("x", 1)
        cached = "0"
        if "+" in tok:
            tok, cached = tok.split("+", 1)
        try:
            data = {"phase": phase, "batch_size": int(bs), "tokens": int(tok), "cached": int(cached)}
        except ValueError:
            raise TwinferError(f"--batch {text!r}: batch size and token counts must be integers") from None
        if data["batch_size"] < 1:
            raise TwinferError(f"--batch {text!r}: batch size must be >= 1 (got {data['batch_size']})")
        if data["tokens"] < 1:
            raise TwinferError(f"--batch {text!r}: token count must be >= 1 (got {data['tokens']})")
        spec = validate(BatchSpec, data, f"--batch {text}")
        if spec.phase == "decode" and "+" in rest:   # a decode's context is its cached KV: '+C' would be dropped unread
            raise TwinferError(f"--batch {text!r}: '+CACHED' is for prefill only; a decode's context is its KV "
                               "(decode:BATCHxCONTEXT, e.g. decode:64x4096)")
        if spec.phase == "prefill" and spec.cached >= spec.tokens:
            raise TwinferError(f"--batch {text!r}: cached tokens ({spec.cached}) must be < prompt length ({spec.tokens})")
        return spec


class CostConfig(BaseModel):
    """Everything ``twinfer cost`` takes (also loadable from ``--config file.yaml``)."""

    model_config = ConfigDict(extra="forbid")
    model: str = "deepseek-v3"
    hardware: str = "h200"
    tp: int = Field(8, ge=1, le=1024)
    dp: int = Field(1, ge=1, le=1024)
    ep: int = Field(1, ge=1, le=1024)
    pp: int = Field(1, ge=1, le=64)
    dtype: Optional[DT] = Field(None, description="weight dtype (default: the checkpoint's)")
    expert_dtype: Optional[DT] = None
    kv_dtype: Optional[DT] = None
    two_micro_batch: bool = False
    eplb_redundant_experts: int = Field(0, ge=0, le=4096)
    mem_fraction: float = Field(0.9, gt=0, le=1)
    batch: list[str] = Field(default_factory=lambda: ["decode:64x4096"])
    draft_len: int = Field(0, ge=0, le=16, description="MTP draft tokens per decode step")
    acceptance: Optional[list[float]] = Field(
        None, description="acceptance of each draft position (marginal, non-increasing; default the simulator's 0.85**i)")
    expert_imbalance: Optional[float | SKEW] = Field(
        None, description="busiest EP rank's routed load over the mean (1 = balanced routing, at most ep), or zipf / "
        "uniform: the expert-load model at this batch; default 1.2 without EPLB, 1.05 with >= ep redundant experts")
    dp_imbalance: Optional[float] = Field(
        None, ge=1.0, description="busiest attention-DP rank's requests over the mean (1 = balanced, at most dp); default the "
        "batch's own spread, as the simulator places it (a request lives on one rank: one prompt on 8 ranks is 8)")
    comm_overlap: Optional[Literal["none", "combine_down", "tbo"]] = None
    dispatch_dtype: Optional[Literal["bf16", "fp8", "nvfp4"]] = None
    offload_fraction: float = Field(0.0, ge=0.0, le=1.0, description="share of each MoE layer's expert weights in host memory, prefetched")
    offload_scope: Literal["routed_experts", "moe"] = "routed_experts"
    allow_no_fit: bool = Field(False, description="price a layout that does not fit in memory, or a batch whose KV does not "
                               "fit the KV pool or whose requests pass the model's context (with a warning), instead of "
                               "refusing it")
    calibration: Optional[str] = None
    top_ops: int = Field(10, ge=0, le=1000)

    @field_validator("batch")
    @classmethod
    def _nonempty(cls, v):
        if not v:
            raise ValueError("at least one batch is needed")
        # each group holds at most MAX_BATCH requests; so does the step (its arrays are per request: ~45 MB a million)
        total = sum(BatchSpec.parse(b).batch_size for b in v)
        if total > MAX_BATCH:
            raise ValueError(f"{total:,} requests in all over {len(v)} batch groups; at most {MAX_BATCH:,} in one step")
        return v

    @field_validator("acceptance", mode="before")
    @classmethod
    def _split(cls, v):
        """'0.8,0.6' (the command line) or a list (a config file)."""
        if isinstance(v, str):
            try:
                return [float(x) for x in v.split(",") if x.strip()]
            except ValueError:
                raise ValueError("expected comma-separated numbers in [0, 1], e.g. 0.8,0.6") from None
        return v

    @field_validator("expert_imbalance", mode="before")
    @classmethod
    def _number_or_skew(cls, v):
        """A number >= 1 (the command line gives text) or the name of an expert-load model."""
        if isinstance(v, str) and v.strip().lower() in ("zipf", "uniform"):
            return v.strip().lower()
        try:
            x = float(v) if v is not None else None
        except (TypeError, ValueError):
            raise ValueError("expected a number in [1, ep] (1 = balanced routing) or zipf / uniform") from None
        if x is not None and not x >= 1.0:
            raise ValueError("must be >= 1 (the busiest rank's load over the mean; 1 = balanced routing)")
        return x

    @model_validator(mode="after")
    def _check(self) -> "CostConfig":
        if self.acceptance is not None:
            check_acceptance(self.acceptance, self.draft_len)
        if self.dp_imbalance is not None and self.dp_imbalance > self.dp:
            raise ValueError(f"dp_imbalance={self.dp_imbalance} must be in [1, dp={self.dp}] (all requests on one rank is dp)")
        if isinstance(self.expert_imbalance, float) and self.expert_imbalance > max(self.ep, 1):
            raise ValueError(f"expert_imbalance={self.expert_imbalance} must be in [1, ep={self.ep}] (all routed tokens on one "
                             "EP rank is ep)")
        return self


def check_acceptance(acc: list[float], draft_len: int) -> None:
    """One marginal acceptance per draft position, each in [0, 1], non-increasing (ValueError naming the entry)."""
    if len(acc) != draft_len:
        raise ValueError(f"acceptance has {len(acc)} entries but draft_len={draft_len}: give one per draft position")
    for i, a in enumerate(acc):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"acceptance[{i}]={a} must be in [0, 1]")
        if i and a > acc[i - 1]:
            raise ValueError(f"acceptance must be non-increasing: position {i + 1} ({a}) cannot be accepted more often "
                             f"than position {i} ({acc[i - 1]})")


def run_cost(cfg: CostConfig) -> dict:
    """Evaluate a CostConfig into a JSON-able result (the CLI's table is a view of it): build the layout, refuse
    it when it does not fit (unless ``allow_no_fit``), price the batch's step, count the tokens it makes."""
    from costmodels.calibration_source import profile_for
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.memory import memory_fit

    model = get_model(cfg.model)
    hw = get_hardware(cfg.hardware)
    _check_offload(cfg, model)
    layout = _layout(cfg, model)
    layout.check_model(model)   # a split the model cannot take is refused before the fit (--allow-no-fit cannot price it)
    if cfg.draft_len and not model.mtp_layers:
        raise TwinferError(f"draft_len={cfg.draft_len} needs an MTP head; {model.name} has mtp_layers=0")
    fit = memory_fit(model, hw, layout, mem_fraction=cfg.mem_fraction, mtp=cfg.draft_len > 0)
    layout_problems = _fit_problems(fit, model, hw, layout)
    warnings = refuse_unless_allowed(f"layout {layout.describe()}", layout_problems, cfg.allow_no_fit,
                                     lambda p: f"LAYOUT DOES NOT FIT, priced anyway (--allow-no-fit): {p}")
    specs = [BatchSpec.parse(b) for b in cfg.batch]
    batch, n_dec, prefill_tokens = _batch(cfg)
    cal = profile_for(hw, cfg.calibration) if cfg.calibration else None  # its notes name the file as the efficiencies' source
    dp = _dp_split(cfg, model, hw, layout, batch, cal)
    kv_problem = _kv_problem(specs, fit, layout, cfg, dp, batch)
    long_requests = context_problems(specs, model, cfg.draft_len)
    batch_problems = long_requests + ([kv_problem] if kv_problem else [])
    warnings += refuse_unless_allowed(f"batch {' '.join(cfg.batch)} on {layout.describe()}", batch_problems,
                                      cfg.allow_no_fit, lambda p: f"{p} (priced anyway: --allow-no-fit)")
    cm, expert_source = _step_model(cfg, model, hw, layout, cal, dp.imbalance)
    sc = cm.step(batch)
    acc = _acceptance(cfg)
    per_decode = 1.0 + sum(acc)  # tokens a decode makes per step: the token it samples + the accepted drafts
    tokens = prefill_tokens + n_dec * per_decode
    t = sc.time_s
    return {
        "model": model.name, "hardware": hw.name, "layout": layout.model_dump(), "layout_label": layout.describe(),
        "gpus": layout.gpus, "batch": cfg.batch, "draft_len": cfg.draft_len,
        "acceptance": acc, "tokens_per_decode_step": per_decode,
        "imbalance": {"expert": float(np.max(cm.expert_imbalance_at(np.array([float(batch.num_tokens)])))) if model.moe and layout.ep > 1 else 1.0,
                      "expert_source": expert_source, "dp": cm.dp_imbalance, "dp_source": dp.source},
        "comm_overlap": layout.overlap,
        "comm_overlap_applied": layout.overlap != "tbo" or cm.tbo_applies(batch.num_requests),
        "dispatch_dtype": cm.disp_dtype if model.moe and layout.ep > 1 else None,
        "offload": _offload_summary(cm),
        "step_time_s": t,
        "tokens_per_s": tokens / t if t > 0 else 0.0,
        "tokens_per_s_per_gpu": tokens / t / layout.gpus if t > 0 else 0.0,
        "decode_tokens_per_s_per_user": per_decode / t if n_dec and t > 0 else None,
        "breakdown_s": sc.breakdown,
        "top_ops": [o.to_dict() for o in sc.ops[: cfg.top_ops]],
        "memory": fit.model_dump(),
        # FIT_FIELDS: ``fits`` (the step can run) is layout_fits and batch_fits and context_fits, each named, and
        # fits_reason says which failed (``fits: false`` beside ``memory.fits: true`` had said neither)
        "fits": not layout_problems and not batch_problems,
        "fits_reason": "; ".join(layout_problems + batch_problems) or None,
        "layout_fits": not layout_problems,
        "batch_fits": kv_problem is None,
        "context_fits": not long_requests,
        "warnings": warnings,
        "notes": sc.notes + [f"model assumption: {a}" for a in model.assumptions],
    }


def _check_offload(cfg: CostConfig, model) -> None:
    """Refuse an offload or an expert dtype that would change nothing (it was priced as given and labelled 'offload 50%
    experts' or 'fp4 experts'):
    ``costmodels.offload`` moves only MoE layers' expert weights to host memory, so a dense model has none to move,
    and ``offload_scope`` only says which expert weights ``offload_fraction`` moves."""
    if cfg.offload_fraction and not model.moe:
        raise TwinferError(f"--offload-fraction {cfg.offload_fraction:g}: {model.name} is dense (no MoE layers); offload "
                           "keeps a share of each MoE layer's expert weights in host memory, so it applies to MoE models "
                           "only: leave it out (or 0)")
    if cfg.expert_dtype is not None and not model.moe:
        raise TwinferError(f"--expert-dtype {cfg.expert_dtype}: {model.name} is dense (no routed experts); its weights "
                           "take --dtype: leave --expert-dtype out")
    if "offload_scope" in cfg.model_fields_set and not cfg.offload_fraction:
        raise TwinferError(f"--offload-scope {cfg.offload_scope}: only with --offload-fraction > 0 (it says which expert "
                           "weights that share is taken from)")


# the JSON's fit fields (``--json``'s help prints them): each check, and the step's verdict
FIT_FIELDS = {
    "fits": "the step can run: layout_fits and batch_fits and context_fits (else refused, exit 2, or priced with "
            "--allow-no-fit and a warning)",
    "fits_reason": "why it cannot (each failed check's line, '; '-joined), null when fits",
    "layout_fits": "the layout fits: memory.fits (HBM: weights, workspace, >= 2048 KV tokens) and, with offload, host "
                   "memory (memory.host_fits)",
    "batch_fits": "the batch's KV fits the KV pool (on its busiest DP rank)",
    "context_fits": "every request is within the model's max context",
}


def _layout(cfg: CostConfig, model):
    """The ParallelLayout of the options (dtypes left out follow the checkpoint)."""
    from costmodels.layout import ParallelLayout

    wdt = cfg.dtype or model.checkpoint_dtype
    knobs = {"comm_overlap": cfg.comm_overlap, "dispatch_dtype": cfg.dispatch_dtype}
    try:
        return validate(ParallelLayout, {
            "tp": cfg.tp, "dp": cfg.dp, "ep": cfg.ep, "pp": cfg.pp, "weight_dtype": wdt,
            "expert_dtype": cfg.expert_dtype or (model.checkpoint_expert_dtype if cfg.dtype is None else None),
            "kv_dtype": cfg.kv_dtype or model.default_kv_dtype, "two_micro_batch": cfg.two_micro_batch,
            "eplb_redundant_experts": cfg.eplb_redundant_experts, "offload_fraction": cfg.offload_fraction,
            "offload_scope": cfg.offload_scope, **{k: v for k, v in knobs.items() if v is not None},
        }, "layout")
    except TwinferError as e:   # the layout's rule names its field; say the flag that sets it too ('--eplb' is no field)
        msg = str(e)
        for field, flag in LAYOUT_FLAGS.items():
            named = re.sub(rf"^layout: (?={field}[= ])", f"{flag}: ", msg)
            if named != msg:
                raise TwinferError(named) from None
        raise


# layout fields whose rules (ParallelLayout) name them first, and the flag of `cost` that sets each
LAYOUT_FLAGS = {"two_micro_batch": "--two-micro-batch", "eplb_redundant_experts": "--eplb", "dispatch_dtype": "--dispatch-dtype",
                "comm_overlap": "--comm-overlap"}


def _fit_problems(fit, model, hw, layout) -> list[str]:
    """What does not fit of the layout: HBM, or host memory for host lookup tables and offloaded weights (empty: it
    fits)."""
    from costmodels.memory import host_problem

    host = host_problem(fit, model, layout, hw)   # lookup tables kept in host memory, offloaded weights
    return ([] if fit.fits else [fit.explanation]) + ([host] if host else [])


def refuse_unless_allowed(what: str, problems: list[str], allow: bool, warning, command: str = "twinfer cost") -> list[str]:
    """Refuse ``what`` (a layout that does not fit, a batch that cannot run as one step) unless ``allow``
    (--allow-no-fit); else one ``warning(problem)`` each (a planner may want the price of a step no server would run:
    docs/costmodel.md). ``twinfer replay`` refuses its prompts through it too (``command`` names the command)."""
    if problems and not allow:
        from twinfer.errors import DoesNotFitError

        raise DoesNotFitError(f"{command}: {what}: " + "; ".join(problems) + " (--allow-no-fit prices it anyway)")
    return [warning(p) for p in problems]


def _request_tokens(s: BatchSpec, draft_len: int) -> int:
    """Tokens one request of the group holds in KV after this step: a decode's context + the 1 + draft_len it verifies,
    a prefill's whole prompt (its cached prefix too)."""
    return s.tokens + 1 + draft_len if s.phase == "decode" else s.tokens


def context_problems(specs: list[BatchSpec], model, draft_len: int) -> list[str]:
    """One line per batch group whose requests are longer than the model's context (no server would run it); also
    ``twinfer replay``'s check of its prompts (cached + new tokens)."""
    out = []
    for s in specs:
        n = _request_tokens(s, draft_len)
        if n > model.max_context:
            what = (f"context {s.tokens:,} + {1 + draft_len} verified token{'s' if draft_len else ''} = {n:,} tokens"
                    if s.phase == "decode" else f"prompt of {n:,} tokens")
            out.append(f"REQUEST LONGER THAN THE MODEL'S CONTEXT: {s.phase}:{s.batch_size}x{s.tokens}"
                       f"{f'+{s.cached}' if s.cached else ''} holds a {what}, past {model.name}'s max context of "
                       f"{model.max_context:,} tokens (max_position_embeddings)")
    return out


def _kv_problem(specs: list[BatchSpec], fit, layout, cfg: CostConfig, dp: DPSplit, batch) -> str | None:
    """What is wrong when the batch's KV does not fit the KV pool (None when it does).

    DP ranks hold disjoint requests: the busiest rank holds its own requests where the batch is placed as the step is
    priced (``dp.ranks``), else ``dp_imbalance / dp`` of the batch's KV (``--dp-imbalance``), and at least its
    longest request."""
    per_tok, fixed = fit.kv_bytes_per_token, fit.kv_fixed_bytes_per_request
    if per_tok <= 0 and fixed <= 0:
        return None
    tokens = sum(_request_tokens(s, cfg.draft_len) * s.batch_size for s in specs)
    longest = max(_request_tokens(s, cfg.draft_len) for s in specs)
    n_req = sum(s.batch_size for s in specs)
    if dp.ranks is not None:   # each request's KV (context + the tokens it computes now) on the rank it was placed on
        kv = batch.context_lens + batch.new_tokens
        held = np.bincount(dp.ranks, weights=kv * per_tok + fixed, minlength=layout.dp)
        busiest = int(held.argmax())
        rank_bytes, rank_tokens = float(held[busiest]), int(kv[dp.ranks == busiest].sum())
        how = "as the step is priced"
    else:
        share = max(1.0, dp.imbalance) / layout.dp if layout.dp > 1 else 1.0
        rank_bytes = max((tokens * per_tok + n_req * fixed) * share, longest * per_tok + fixed)
        rank_tokens = max(int(np.ceil(tokens * share)), longest)
        how = f"dp_imbalance {dp.imbalance:g} / dp {layout.dp}, at least its longest request"
    if rank_bytes <= max(fit.kv_pool_bytes, 0.0):
        return None
    on_rank = f", {rank_tokens:,} on its busiest DP rank ({how})" if layout.dp > 1 else ""
    window = f" plus {n_req * fixed / 2**30:,.1f} GiB of sliding-window KV" if fixed > 0 else ""
    return (f"BATCH KV DOES NOT FIT THE KV POOL: the batch holds {tokens:,} KV tokens{window}{on_rank}; "
            f"the pool holds {fit.max_kv_tokens_per_dp_rank:,} per DP rank ({fit.max_kv_tokens:,} per instance), so it "
            "cannot run as one step on this layout")


class DPSplit(NamedTuple):
    """The attention-DP imbalance a step is priced at, where it comes from, and each request's rank (None: not placed)."""

    imbalance: float
    source: str
    ranks: Optional[np.ndarray]


def _dp_split(cfg: CostConfig, model, hw, layout, batch, cal) -> DPSplit:
    """``--dp-imbalance``, else the batch's own spread as the simulator places it (``costmodels.effective.
    batch_dp_split``): an even split is only possible for whole requests, so one prompt on 8 ranks runs on one."""
    from costmodels.effective import batch_dp_split

    if layout.dp <= 1:
        return DPSplit(1.0, "one attention-DP rank", None)
    if cfg.dp_imbalance is not None:
        return DPSplit(cfg.dp_imbalance, "given (--dp-imbalance)", None)
    imb, ranks = batch_dp_split(model, hw, layout, batch, cal)
    return DPSplit(imb, f"this batch on {layout.dp} DP ranks as the simulator places it (decodes round-robin, prompts to "
                        "the least-loaded rank)", ranks)


def _step_model(cfg: CostConfig, model, hw, layout, cal, dp_imbalance: float):
    """The StepCostModel with the asked imbalance, and a line saying where the expert imbalance comes from."""
    from costmodels.step import StepCostModel
    from costmodels.step_ops import default_expert_imbalance

    kw: dict = {"dp_imbalance": dp_imbalance}
    ei = cfg.expert_imbalance
    if not model.moe or layout.ep <= 1:
        source = "no EP all-to-all (ep=1): every GPU holds every expert"
    elif ei is None:
        source = f"default {default_expert_imbalance(layout):.2f} (1.2 without EPLB, 1.05 with >= ep redundant experts: an assumption)"
    elif isinstance(ei, float):
        kw["expert_imbalance"] = ei
        source = "given (--expert-imbalance)" + (": balanced routing" if ei == 1.0 else "")
    else:
        from costmodels.moe_load import ExpertLoad, ExpertLoadSpec

        kw["expert_load"] = ExpertLoad.initial(ExpertLoadSpec(skew=ei), model.moe.n_routed_experts, layout.ep,
                                               layout.eplb_redundant_experts)
        source = f"{ei} expert popularity (costmodels.moe_load), busiest rank at this batch's assignments"
    return StepCostModel(model, hw, layout, cal, **kw), source


def _batch(cfg: CostConfig):
    """The BatchShape of ``cfg.batch`` (decodes verify 1 + draft_len tokens), its decodes and its prefill tokens."""
    from costmodels.batch import BatchShape

    new, ctx, dec = [], [], []
    prefill_tokens = 0
    for s in (BatchSpec.parse(b) for b in cfg.batch):
        if s.phase == "decode":
            new += [1 + cfg.draft_len] * s.batch_size
            ctx += [s.tokens] * s.batch_size
            dec += [True] * s.batch_size
        else:
            new += [s.tokens - s.cached] * s.batch_size
            ctx += [s.cached] * s.batch_size
            dec += [False] * s.batch_size
            prefill_tokens += (s.tokens - s.cached) * s.batch_size
    return BatchShape.from_lists(new, ctx, dec), int(np.sum(dec)), prefill_tokens


def _acceptance(cfg: CostConfig) -> list[float]:
    """Per draft position acceptance: the given one, else the simulator's default (scheduler.config)."""
    if cfg.acceptance is not None:
        return list(cfg.acceptance)
    from scheduler.config import SchedulerConfig

    return SchedulerConfig(draft_len=cfg.draft_len).effective_acceptance_rates() if cfg.draft_len else []


def _offload_summary(cm) -> dict | None:
    """What the weight offload moves per layer and how long that takes (None without offload)."""
    p = cm.prefetch
    if p is None:
        return None
    return {"fraction": cm.layout.offload_fraction, "scope": cm.layout.offload_scope, "bytes_per_layer": p.bytes_per_layer,
            "offloaded_layers": p.offloaded_layers, "transfer_s_per_layer": p.transfer_s, "link_bytes_per_s": p.link_bytes_per_s}


def _print(res: dict) -> None:
    con = Console()
    t = res["step_time_s"]
    head = Table(title=f"{res['model']} on {res['gpus']}x{res['hardware']} ({res['layout_label']}, kv {res['layout']['kv_dtype']}) — batch {' '.join(res['batch'])}", show_header=False)
    for w in res["warnings"]:
        con.print(f"[bold red]WARNING: {w}[/]", highlight=False)
    head.add_row("step time", f"{t * 1e3:.3f} ms")
    head.add_row("tokens/s (instance)", f"{res['tokens_per_s']:,.0f}")
    head.add_row("tokens/s per GPU", f"{res['tokens_per_s_per_gpu']:,.0f}")
    if res["decode_tokens_per_s_per_user"]:
        head.add_row("decode tokens/s per user", f"{res['decode_tokens_per_s_per_user']:,.1f}")
    for label, value in _assumption_rows(res):
        head.add_row(label, value)
    con.print(head)
    bd = Table(title="time by category")
    bd.add_column("category")
    bd.add_column("ms", justify="right")
    bd.add_column("%", justify="right")
    for k, v in res["breakdown_s"].items():
        bd.add_row(k, f"{v * 1e3:.3f}", f"{100 * v / t:.1f}" if t else "-")
    con.print(bd)
    if res["top_ops"]:
        ops = Table(title="top ops (per GPU, summed over layers)")
        for c in ("op", "category", "kind", "count", "ms", "GFLOP", "MB"):
            ops.add_column(c, justify="left" if c in ("op", "category", "kind") else "right", overflow="fold")  # op names whole
        for o in res["top_ops"]:
            ops.add_row(o["name"], o["category"], o["layer_kind"], str(o["count"]), f"{o['time_s'] * 1e3:.3f}", f"{o['flops'] / 1e9:,.1f}", f"{o['bytes'] / 1e6:,.1f}")
        con.print(ops)
    m = res["memory"]
    mem = Table(title="memory per GPU", show_header=False)
    gb = lambda x: f"{x / 2**30:,.2f} GiB"  # noqa: E731  (binary: what CUDA and nvidia-smi report, and what the catalog's HBM means)
    mem.add_row("HBM", gb(m["hbm_bytes"]))
    mem.add_row("weights", gb(m["weight_bytes"]) + "  (" + ", ".join(f"{k} {v / 2**30:.1f}" for k, v in m["weight_breakdown"].items()) + ")")
    mem.add_row("workspace", gb(m["workspace_bytes"]))
    mem.add_row("KV pool", gb(max(m["kv_pool_bytes"], 0)))
    mem.add_row("free (outside mem_fraction)", gb(m["free_bytes"]))
    # the model figure is the papers' (its main layers, unsharded); the per-GPU one holds this GPU's share of every
    # cache it keeps, the MTP layers' too
    model_label = "model, main layers" if "mtp" in m["weight_breakdown"] else "model"
    mem.add_row(f"KV bytes/token (per GPU / {model_label})", f"{m['kv_bytes_per_token']:,.0f} / {m['kv_bytes_per_token_model']:,.0f}")
    mem.add_row("max KV tokens (per DP rank / instance)", f"{m['max_kv_tokens_per_dp_rank']:,} / {m['max_kv_tokens']:,}")
    no = "[red]NO[/] (priced with --allow-no-fit)"
    mem.add_row("layout fits", "[green]yes[/]" if res["layout_fits"] else no)
    mem.add_row("batch KV fits the pool", "[green]yes[/]" if res["batch_fits"] else no)
    mem.add_row("requests within the context", "[green]yes[/]" if res["context_fits"] else no)
    mem.add_row("step fits (all three)", "[green]yes[/]" if res["fits"] else "[red]NO[/] (the warnings above say why)")
    con.print(mem)
    con.print(f"layout memory (memory.fits): {m['explanation']}", highlight=False)   # the layout's alone, not the step's
    for n in res["notes"]:
        con.print(f"[dim]- {n}[/]", highlight=False)


def _assumption_rows(res: dict) -> list[tuple[str, str]]:
    """The head table's lines for the values the step was priced with (acceptance, imbalance, overlap, offload)."""
    rows = []
    if res["draft_len"]:
        acc = " + ".join(f"{a:.2f}" for a in res["acceptance"])
        rows.append(("tokens per decode step", f"{res['tokens_per_decode_step']:.2f} = 1 + {acc} (draft acceptance by position)"))
    imb = res["imbalance"]
    rows.append(("expert imbalance (busiest EP rank / mean)", f"{imb['expert']:.2f}: {imb['expert_source']}"))
    rows.append(("DP imbalance (busiest DP rank / mean)", f"{imb['dp']:.2f}: {imb['dp_source']}"))
    rows.append(("all-to-all overlap", res["comm_overlap"]
                 + ("" if res["comm_overlap_applied"] else " (not applied: two micro-batches split a step's requests, "
                                                           "and this batch has one)")
                 + (f", dispatch {res['dispatch_dtype']}" if res["dispatch_dtype"] else "")))
    off = res["offload"]
    if off:
        rows.append(("weight offload", f"{off['fraction']:.0%} of {off['scope']}: {off['bytes_per_layer'] / 1e9:.2f} GB/layer over "
                                        f"{off['link_bytes_per_s'] / 1e9:.0f} GB/s = {off['transfer_s_per_layer'] * 1e3:.2f} ms/layer "
                                        f"x {off['offloaded_layers']} layers"))
    return rows


def register(app: typer.Typer) -> None:
    @app.command("cost")
    def cost(
        model: Optional[str] = typer.Option(None, "--model", "-m", help="catalog name, HF config.json (or its folder), or ModelSpec YAML [deepseek-v3]"),
        hardware: Optional[str] = typer.Option(None, "--hardware", "--hw", help="catalog GPU name or hardware YAML [h200]"),
        tp: Optional[int] = typer.Option(None, "--tp", help="tensor parallel [8]"),
        dp: Optional[int] = typer.Option(None, "--dp", help="attention data parallel [1]"),
        ep: Optional[int] = typer.Option(None, "--ep", help="expert parallel [1]"),
        pp: Optional[int] = typer.Option(None, "--pp", help="pipeline stages [1]"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="weight dtype bf16|fp8|fp4 [checkpoint's]"),
        expert_dtype: Optional[str] = typer.Option(None, "--expert-dtype", help="routed expert dtype [weight dtype]"),
        kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="KV cache dtype [model default]"),
        two_micro_batch: Optional[bool] = typer.Option(None, "--two-micro-batch/--no-two-micro-batch", help="overlap EP all-to-all with compute"),
        eplb: Optional[int] = typer.Option(None, "--eplb", help="EPLB redundant experts [0]"),
        batch: Optional[list[str]] = typer.Option(None, "--batch", "-b", help="decode:BxCTX or prefill:BxPROMPT[+CACHED], repeatable [decode:64x4096]"),
        draft_len: Optional[int] = typer.Option(None, "--draft-len", help="MTP draft tokens per decode step [0]"),
        acceptance: Optional[str] = typer.Option(None, "--acceptance", help="acceptance per draft position, e.g. 0.8,0.6 [0.85**i]"),
        expert_imbalance: Optional[str] = typer.Option(None, "--expert-imbalance", help="busiest EP rank's load / mean, 1..ep (1 = balanced), or zipf|uniform [1.2; 1.05 with EPLB]"),
        dp_imbalance: Optional[float] = typer.Option(None, "--dp-imbalance", help="busiest attention-DP rank's requests / mean, 1..dp (1 = balanced) [the batch's spread as the simulator places it]"),
        comm_overlap: Optional[str] = typer.Option(None, "--comm-overlap", help="EP all-to-all overlap: none|combine_down|tbo [tbo with --two-micro-batch, else none]"),
        dispatch_dtype: Optional[str] = typer.Option(None, "--dispatch-dtype", help="EP dispatch payload bf16|fp8|nvfp4 [fp8 for fp8/fp4 experts]"),
        offload_fraction: Optional[float] = typer.Option(None, "--offload-fraction", help="share of each MoE layer's expert weights kept in host memory, prefetched a layer ahead (MoE models only) [0]"),
        offload_scope: Optional[str] = typer.Option(None, "--offload-scope", help="with --offload-fraction: routed_experts|moe (routed + shared) [routed_experts]"),
        allow_no_fit: Optional[bool] = typer.Option(None, "--allow-no-fit", help="price a layout that does not fit in memory, or a batch past the KV pool or the model's context (with a warning)"),
        calibration: Optional[str] = typer.Option(None, "--calibration", help="calibration profile JSON"),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON holding any of these options"),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables; its fit fields: "
                                     + "; ".join(f"{k}: {v}" for k, v in FIT_FIELDS.items())
                                     + "; memory.fits: the layout's HBM fit alone"),
    ) -> None:
        """How long one forward step takes, where the time goes, and whether the model fits."""
        data: dict = dict(read_mapping(config)) if config else {}
        given = {"model": model, "hardware": hardware, "tp": tp, "dp": dp, "ep": ep, "pp": pp, "dtype": dtype,
                 "expert_dtype": expert_dtype, "kv_dtype": kv_dtype, "two_micro_batch": two_micro_batch,
                 "eplb_redundant_experts": eplb, "batch": batch, "draft_len": draft_len, "calibration": calibration,
                 "acceptance": acceptance, "expert_imbalance": expert_imbalance, "dp_imbalance": dp_imbalance,
                 "comm_overlap": comm_overlap, "dispatch_dtype": dispatch_dtype, "offload_fraction": offload_fraction,
                 "offload_scope": offload_scope, "allow_no_fit": allow_no_fit}
        data.update({k: v for k, v in given.items() if v is not None})
        cfg = validate(CostConfig, data, str(config) if config else "twinfer cost")
        res = run_cost(cfg)
        if as_json:
            print(json.dumps(res, indent=1, default=float))
        else:
            _print(res)
