"""``twinfer replay``: prefill time of a prompt under two sliding-window replay policies (costmodels/replay.py)."""

from __future__ import annotations

import json
from typing import Optional

import typer
import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from twinfer.config import validate
from twinfer.errors import TwinferError

DEFAULT_NEW = "1024,2048,4096,8192,16384,32768,65536,131072"
MAX_CHUNKS = 4096  # chunks priced over all --new sizes (each on its own, ~1-3 ms): bounds the command's time
MAX_W = 1 << 20    # the most tokens a replay rule takes (costmodels.replay.LayerReplay.tokens)


def policy_mapping(text: str | None, option: str) -> dict | None:
    """The mapping of a replay policy given inline as YAML/JSON (``{layers: {42: recompute}}``) or as a bare rule
    for every window layer (``persist``, ``recompute``, ``replay:64``); None when not given."""
    if text is None:
        return None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TwinferError(f"{option} {text!r}: not YAML ({str(err).splitlines()[0]})") from None
    if isinstance(data, str):
        data = {"default": data}
    if not isinstance(data, dict):
        raise TwinferError(f"{option} {text!r}: expected a mapping such as '{{layers: {{42: recompute}}}}' or a rule "
                           "persist | recompute | replay:W")
    return data


def _policy(text: str | None, option: str):
    """A ReplayPolicy from ``policy_mapping``'s forms."""
    from costmodels.replay import ReplayPolicy

    data = policy_mapping(text, option)
    return None if data is None else validate(ReplayPolicy, data, option)


def _resolve(policy, model, option: str):
    """``policy`` on ``model`` (a layer past the model or without a window is an error naming ``option``)."""
    try:
        return policy.resolve(model)
    except ValueError as err:
        raise TwinferError(f"{option}: {err}") from None


def _ints(text: str, option: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TwinferError(f"{option} {text!r}: expected comma-separated token counts, e.g. {DEFAULT_NEW}") from None
    if not out or min(out) < 1:
        raise TwinferError(f"{option} {text!r}: token counts must be >= 1")
    return out


def _chunk_count(sizes: list[int], chunk: int) -> None:
    """Refuse sizes whose prompts split into more than ``MAX_CHUNKS`` chunks in all (each chunk is priced)."""
    total = sum(-(-n // chunk) for n in sizes)
    if total > MAX_CHUNKS:
        raise TwinferError(f"--new {','.join(map(str, sizes))} in --chunk {chunk} prefills {total:,} chunks; at most "
                           f"{MAX_CHUNKS:,} are priced: raise --chunk or give fewer or smaller --new sizes")


def _prompt_checks(m, sizes: list[int], cached: int, allow_no_fit: bool) -> list[str]:
    """Each prompt (``cached`` + a ``--new`` size) through `twinfer cost`'s checks of ``prefill:1x(cached+new)+cached``
    (ui.cmd_cost: BatchSpec's bounds, context_problems, refuse_unless_allowed): the warnings of those priced anyway
    (--allow-no-fit); a prompt cost refuses is refused (it was priced with a warning: --cached 1000000000)."""
    from ui.cmd_cost import BatchSpec, context_problems, refuse_unless_allowed

    specs = [validate(BatchSpec, {"phase": "prefill", "batch_size": 1, "tokens": cached + n, "cached": cached},
                      f"--cached {cached} --new {n} (twinfer cost -b prefill:1x{cached + n}+{cached})") for n in sizes]
    return refuse_unless_allowed(f"--cached {cached:,} --new {','.join(map(str, sizes))} on {m.name}",
                                 context_problems(specs, m, 0), allow_no_fit,
                                 lambda p: f"{p} (priced anyway: --allow-no-fit)", command="twinfer replay")


def run_replay(model: str, hardware: str, tp: int, dp: int, ep: int, kv_dtype: str | None, layer: int | None, tokens: int,
               base: str | None, cand: str | None, new: str, chunk: int, cached: int, allow_no_fit: bool = False) -> dict:
    """Both policies' prefill times per prompt size, and what each keeps per paused sequence. A prompt is checked as
    ``twinfer cost -b prefill:1x(cached+new)+cached`` is, by cost's own checks: past cost's token bound it is refused,
    past the model's context refused unless ``allow_no_fit`` (then priced with a warning)."""
    from costmodels.catalog import get_model
    from costmodels.hardware import get_hardware
    from costmodels.layout import ParallelLayout
    from costmodels.replay import (compare_policies, kept_window_bytes, one_layer_policies, shipped_replay_policy,
                                   window_layers)
    from costmodels.step import StepCostModel

    m, hw = get_model(model), get_hardware(hardware)
    if chunk < 1:
        raise TwinferError(f"--chunk {chunk}: must be >= 1 (tokens per prefill chunk)")
    if cached < 0:
        raise TwinferError(f"--cached {cached}: must be >= 0 (prefix-cache hit tokens)")
    if not 1 <= tokens <= MAX_W:
        raise TwinferError(f"--tokens {tokens}: W must be in 1..{MAX_W:,} tokens (replay.tokens)")
    pb, pc = _policy(base, "--base"), _policy(cand, "--with")
    if layer is not None:
        if pb is not None or pc is not None:
            raise TwinferError("--layer sets both policies (that layer recomputing vs replaying --tokens): leave out --base/--with")
        pb, pc = one_layer_policies(m, layer, tokens)
    names = ("--layer", "--layer") if layer is not None else ("--base", "--with")
    pb, pc = pb or shipped_replay_policy(m), pc or shipped_replay_policy(m)
    rb, rc = (_resolve(pol, m, name) for pol, name in ((pb, names[0]), (pc, names[1])))
    kv = kv_dtype or m.default_kv_dtype
    lay = validate(ParallelLayout, {"tp": tp, "dp": dp, "ep": ep, "weight_dtype": m.checkpoint_dtype,
                                    "expert_dtype": m.checkpoint_expert_dtype, "kv_dtype": kv}, "layout")
    sizes = _ints(new, "--new")
    _chunk_count(sizes, chunk)
    warnings = _prompt_checks(m, sizes, cached, allow_no_fit)
    # a prompt runs whole on its attention-DP rank, as the simulator (EffectiveStepCost, depth_correction), `twinfer
    # cost` and tune's replay line price it: spread over the ranks, DP4 priced an 8192-token chunk at a third of
    # `cost -b prefill:1x8192`
    ops = StepCostModel(m, hw, lay, dp_imbalance=float(lay.dp))
    rows = compare_policies(ops, rb, rc, sizes, chunk, cached)
    notes = [] if window_layers(m) else [f"{m.name} has no sliding-window layers: every policy prices the same "
                                           "(persist, replay and recompute act on window layers only)"]
    return {
        "warnings": warnings, "notes": notes,
        "model": m.name, "hardware": hw.name, "layout": lay.describe(), "gpus": lay.gpus, "chunk": chunk, "cached": cached,
        "base": str(pb), "with": str(pc),
        "kept_window_bytes_per_seq": {"base": kept_window_bytes(m, kv, rb), "with": kept_window_bytes(m, kv, rc)},
        "rows": [{"new_tokens": r.new_tokens, "chunks": r.chunks, "base_s": r.base_s, "with_s": r.cand_s,
                  "base_tok_s_per_gpu": r.new_tokens / r.base_s / lay.gpus, "with_tok_s_per_gpu": r.new_tokens / r.cand_s / lay.gpus,
                  "gain": r.gain, "base_extra_layer_tokens": r.base_extra_tokens, "with_extra_layer_tokens": r.cand_extra_tokens}
                 for r in rows],
    }


def _print(res: dict) -> None:
    con = Console()
    con.print(f"{res['model']} on {res['hardware']}, {res['layout']} ({res['gpus']} GPUs); prompt prefilled in chunks of "
              f"{res['chunk']} tokens after {res['cached']} cached", highlight=False)
    kb = res["kept_window_bytes_per_seq"]
    con.print(f"base: {res['base']}  (window KV kept per paused sequence {kb['base'] / 1e6:.3f} MB)", highlight=False)
    con.print(f"with: {res['with']}  (window KV kept per paused sequence {kb['with'] / 1e6:.3f} MB)", highlight=False)
    # no box, one space between columns, the headers on two lines where on one the table is wider than the terminal,
    # and cells folded, never cut with '…' (the boxed table cut '29,292,2…' ms and 'tok/s/G…' at COLUMNS=80)
    rows = [(f"{r['new_tokens']:,}", str(r["chunks"]), f"{r['base_s'] * 1e3:,.3f}", f"{r['with_s'] * 1e3:,.3f}",
             f"{r['base_tok_s_per_gpu']:,.0f}", f"{r['with_tok_s_per_gpu']:,.0f}", f"{r['gain']:.3f}x") for r in res["rows"]]
    heads = ("new tokens", "chunks", "base ms", "with ms", "base tok/s/GPU", "with tok/s/GPU", "gain")
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(heads)]
    if sum(widths) + len(widths) - 1 > con.width:
        heads = ("new\ntokens", "chunks", "base\nms", "with\nms", "base\ntok/s/GPU", "with\ntok/s/GPU", "gain")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0))
    for c in heads:
        t.add_column(c, justify="right", overflow="fold")
    for row in rows:
        t.add_row(*row)
    con.print(t)
    for w in res["warnings"]:
        con.print(f"[yellow]{w}[/]", highlight=False)
    for n in res["notes"]:
        con.print(f"[yellow]note: {n}[/]", highlight=False)
    con.print(f"[dim]- the prompt runs whole on one attention-DP rank (as the simulator and twinfer cost price it); "
              f"tok/s/GPU = new tokens / prefill time / the {res['gpus']} GPUs of the instance[/]", highlight=False)
    con.print("[dim]- gain = base prefill time / with prefill time (prefill throughput ratio); a layer's extra tokens "
              "run through every layer below it (no hidden states are kept); --json adds the extra layer-tokens each recomputes[/]", highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("replay")
    def replay(
        model: str = typer.Option("deepseek-v4-flash", "--model", "-m", help="catalog name or model file"),
        hardware: str = typer.Option("gb300", "--hardware", "--hw", help="catalog GPU name or hardware YAML"),
        tp: int = typer.Option(1, "--tp", help="tensor parallel"),
        dp: int = typer.Option(4, "--dp", help="attention data parallel"),
        ep: int = typer.Option(4, "--ep", help="expert parallel"),
        kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="KV cache dtype [model default]"),
        layer: Optional[int] = typer.Option(None, "--layer", min=0, help="compare this layer recomputing (base) with it replaying --tokens "
                                            "(with); other layers as shipped"),
        tokens: int = typer.Option(128, "--tokens", min=1, max=MAX_W, help="W of --layer's bounded replay"),
        base: Optional[str] = typer.Option(None, "--base", help="base policy, YAML: '{layers: {42: recompute}}' or a rule for every "
                                           "window layer: persist | recompute | replay:W [shipped]"),
        cand: Optional[str] = typer.Option(None, "--with", help="candidate policy, same forms [shipped]"),
        new: str = typer.Option(DEFAULT_NEW, "--new", help="prompt sizes (new tokens), comma-separated"),
        chunk: int = typer.Option(8192, "--chunk", help="prefill chunk (the scheduler's max_num_batched_tokens)"),
        cached: int = typer.Option(0, "--cached", help="prefix-cache hit tokens before the prompt's new tokens "
                                  "(with each --new size at most the model's context, unless --allow-no-fit)"),
        allow_no_fit: bool = typer.Option(False, "--allow-no-fit", help="price a prompt (--cached + --new) past the "
                                          "model's context, with a warning, instead of refusing it (as twinfer cost "
                                          "--allow-no-fit)"),
        as_json: bool = typer.Option(False, "--json", help="print JSON"),
    ):
        """Prefill time of a prompt under two sliding-window replay policies (persist / replay W / recompute per layer)."""
        res = run_replay(model, hardware, tp, dp, ep, kv_dtype, layer, tokens, base, cand, new, chunk, cached, allow_no_fit)
        if as_json:
            typer.echo(json.dumps(res, indent=1))
        else:
            _print(res)
