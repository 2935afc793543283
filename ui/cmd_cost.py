"""``twinfer cost``: one step's time, where it goes, and whether the model fits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import typer
from pydantic import BaseModel, ConfigDict, Field, field_validator
from rich.console import Console
from rich.table import Table

from twinfer.config import read_mapping, validate
from twinfer.errors import TwinferError

DT = Literal["bf16", "fp8", "fp4"]


class BatchSpec(BaseModel):
    """One group of identical requests: ``decode:BxL`` or ``prefill:BxL[+cached]``."""

    model_config = ConfigDict(extra="forbid")
    phase: Literal["decode", "prefill"]
    batch_size: int = Field(..., ge=1, le=1_000_000, description="batch size")
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
    calibration: Optional[str] = None
    top_ops: int = Field(10, ge=0, le=1000)

    @field_validator("batch")
    @classmethod
    def _nonempty(cls, v):
        if not v:
            raise ValueError("at least one batch is needed")
        return v


def run_cost(cfg: CostConfig) -> dict:
    """Evaluate a CostConfig into a JSON-able result (the CLI's table is a view of it)."""
    from costmodels.batch import BatchShape
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.step import StepCostModel

    model = get_model(cfg.model)
    hw = get_hardware(cfg.hardware)
    wdt = cfg.dtype or model.checkpoint_dtype
    layout = validate(ParallelLayout, {
        "tp": cfg.tp, "dp": cfg.dp, "ep": cfg.ep, "pp": cfg.pp, "weight_dtype": wdt,
        "expert_dtype": cfg.expert_dtype or (model.checkpoint_expert_dtype if cfg.dtype is None else None),
        "kv_dtype": cfg.kv_dtype or model.default_kv_dtype, "two_micro_batch": cfg.two_micro_batch,
        "eplb_redundant_experts": cfg.eplb_redundant_experts,
    }, "layout")
    from costmodels.calibration_source import profile_for

    cal = profile_for(hw, cfg.calibration) if cfg.calibration else None  # its notes name the file as the efficiencies' source
    cm = StepCostModel(model, hw, layout, cal)
    specs = [BatchSpec.parse(b) for b in cfg.batch]
    new, ctx, dec = [], [], []
    for s in specs:
        if s.phase == "decode":
            new += [1 + cfg.draft_len] * s.batch_size
            ctx += [s.tokens] * s.batch_size
            dec += [True] * s.batch_size
        else:
            new += [s.tokens - s.cached] * s.batch_size
            ctx += [s.cached] * s.batch_size
            dec += [False] * s.batch_size
    batch = BatchShape.from_lists(new, ctx, dec)
    if cfg.draft_len and not model.mtp_layers:
        raise TwinferError(f"draft_len={cfg.draft_len} needs an MTP head; {model.name} has mtp_layers=0")
    sc = cm.step(batch)
    from costmodels.memory import memory_fit
    fit = memory_fit(model, hw, layout, mem_fraction=cfg.mem_fraction)
    tokens = batch.num_tokens
    n_dec = int(np.sum(dec))
    return {
        "model": model.name, "hardware": hw.name, "layout": layout.model_dump(), "layout_label": layout.describe(),
        "gpus": layout.gpus, "batch": cfg.batch, "draft_len": cfg.draft_len,
        "step_time_s": sc.time_s,
        "tokens_per_s": tokens / sc.time_s if sc.time_s > 0 else 0.0,
        "tokens_per_s_per_gpu": tokens / sc.time_s / layout.gpus if sc.time_s > 0 else 0.0,
        "decode_tokens_per_s_per_user": (1 + cfg.draft_len) / sc.time_s if n_dec and sc.time_s > 0 else None,
        "breakdown_s": sc.breakdown,
        "top_ops": [o.to_dict() for o in sc.ops[: cfg.top_ops]],
        "memory": fit.model_dump(),
        "fits": fit.fits,
        "notes": sc.notes + [f"model assumption: {a}" for a in model.assumptions],
    }


def _print(res: dict) -> None:
    con = Console()
    t = res["step_time_s"]
    head = Table(title=f"{res['model']} on {res['gpus']}x{res['hardware']} ({res['layout_label']}, kv {res['layout']['kv_dtype']}) — batch {' '.join(res['batch'])}", show_header=False)
    head.add_row("step time", f"{t * 1e3:.3f} ms")
    head.add_row("tokens/s (instance)", f"{res['tokens_per_s']:,.0f}")
    head.add_row("tokens/s per GPU", f"{res['tokens_per_s_per_gpu']:,.0f}")
    if res["decode_tokens_per_s_per_user"]:
        head.add_row("decode tokens/s per user", f"{res['decode_tokens_per_s_per_user']:,.1f}")
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
            ops.add_column(c, justify="left" if c in ("op", "category", "kind") else "right")
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
    mem.add_row("KV bytes/token (per GPU / model)", f"{m['kv_bytes_per_token']:,.0f} / {m['kv_bytes_per_token_model']:,.0f}")
    mem.add_row("max KV tokens (per DP rank / instance)", f"{m['max_kv_tokens_per_dp_rank']:,} / {m['max_kv_tokens']:,}")
    mem.add_row("fits", ("[green]yes[/]" if m["fits"] else "[red]NO[/]"))
    con.print(mem)
    con.print(m["explanation"], highlight=False)
    for n in res["notes"]:
        con.print(f"[dim]- {n}[/]", highlight=False)


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
        calibration: Optional[str] = typer.Option(None, "--calibration", help="calibration profile JSON"),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON holding any of these options"),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables"),
    ) -> None:
        """How long one forward step takes, where the time goes, and whether the model fits."""
        data: dict = dict(read_mapping(config)) if config else {}
        given = {"model": model, "hardware": hardware, "tp": tp, "dp": dp, "ep": ep, "pp": pp, "dtype": dtype,
                 "expert_dtype": expert_dtype, "kv_dtype": kv_dtype, "two_micro_batch": two_micro_batch,
                 "eplb_redundant_experts": eplb, "batch": batch, "draft_len": draft_len, "calibration": calibration}
        data.update({k: v for k, v in given.items() if v is not None})
        cfg = validate(CostConfig, data, str(config) if config else "twinfer cost")
        res = run_cost(cfg)
        if as_json:
            print(json.dumps(res, indent=1, default=float))
        else:
            _print(res)
