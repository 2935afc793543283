"""New-user audit of ``twinfer tune`` / ``replay`` / ``cost``: defaults that work out of the box, a prompt length cost
refuses refused by replay too (through cost's own check), a replay table readable at 80 and 100 columns, an offload
that would change nothing refused, and fit fields that say what each one means."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ui.cli import app

FAST = ["--sim-requests", "100", "--plan-requests", "100", "--rounds", "1", "--async", "on", "--batch-per-rank", "64",
        "--chunk-tokens", "8192"]


def _flat(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------ twinfer tune
def test_tune_defaults_give_a_feasible_winner():
    """``tune -g 8`` ran tiny (a 4,096-token context) on chat (prompts up to 32k): every policy INFEASIBLE. The default
    model is now plan's (deepseek-v3, with plan's gb300 and chat), which the chat workload fits."""
    from planner.request import PlanRequest

    r = CliRunner().invoke(app, ["tune", "-g", "8", *FAST], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = _flat(r.stdout)
    assert "on deepseek-v3 x gb300, 8 GPUs" in text and "winner: EP" in text
    assert "INFEASIBLE" not in text and "no policy simulated is feasible" not in text and "refused" not in text
    assert (PlanRequest.model_fields["model"].default, PlanRequest.model_fields["hardware"].default) == ("deepseek-v3", "gb300")


def test_tune_default_model_on_too_few_gpus_names_gpus(cli_exit_2):
    """Too few GPUs for the default model: the flag to change is --gpus (or --model), not --ep-widths (not given)."""
    err = cli_exit_2("tune", "-g", "1", *FAST)
    assert "--gpus 1: deepseek-v3 fits at no EP width on 1 x gb300 (reasons above): give more --gpus, or a smaller --model" in err
    err = cli_exit_2("tune", "-g", "1", "--ep-widths", "1", *FAST)
    assert "--ep-widths: no EP width fits deepseek-v3 on 1 x gb300" in err


# ---------------------------------------------------------------------------------------------- twinfer replay
def test_replay_refuses_what_cost_refuses(cli_exit_2):
    """``replay --cached 1000000000`` was priced with a warning; ``cost -b prefill:1x1000001024+1000000000`` refuses it.
    Both go through cost's check now: past its token bound refused always, past the context unless --allow-no-fit."""
    err = cli_exit_2("replay", "--cached", "1000000000", "--new", "1024")
    assert "--cached 1000000000 --new 1024 (twinfer cost -b prefill:1x1000001024+1000000000): tokens:" in err
    assert "less than or equal to 100000000" in err
    err = cli_exit_2("replay", "--cached", "1000000000", "--new", "1024", "--allow-no-fit")   # cost's bound: always
    assert "less than or equal to 100000000" in err
    cost_err = cli_exit_2("cost", "-m", "deepseek-v4-flash", "--hw", "gb300", "--tp", "1", "--dp", "4", "--ep", "4",
                          "-b", "prefill:1x1065536+1000000")
    err = cli_exit_2("replay", "--cached", "1000000", "--new", "1024,65536")
    assert err.startswith("error: twinfer replay: --cached 1,000,000 --new 1024,65536 on deepseek-v4-flash: ")
    problem = "REQUEST LONGER THAN THE MODEL'S CONTEXT: prefill:1x1065536+1000000 holds a prompt of 1,065,536 tokens"
    assert problem in err and problem in cost_err and err.endswith("(--allow-no-fit prices it anyway)")
    assert "prefill:1x1001024" not in err   # the prompt within the context is not named

    from ui.cmd_replay import run_replay

    res = run_replay("deepseek-v4-flash", "gb300", 1, 4, 4, None, None, 128, None, None, "1024,65536", 8192, 1_000_000,
                     allow_no_fit=True)
    assert len(res["rows"]) == 2 and len(res["warnings"]) == 1
    assert problem in res["warnings"][0] and res["warnings"][0].endswith("(priced anyway: --allow-no-fit)")


@pytest.mark.parametrize("columns", [80, 100])
def test_replay_table_is_not_cut_at_terminal_widths(columns):
    """At 80 columns the boxed table cut '29,292,2…' ms and 'tok/s/G…': every figure is printed whole now."""
    from ui.cmd_replay import run_replay

    args = ["--new", "1000,1040000", "--cached", "8000", "--chunk", "512", "--base", "recompute", "--with", "persist"]
    r = CliRunner().invoke(app, ["replay", *args], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= columns
    res = run_replay("deepseek-v4-flash", "gb300", 1, 4, 4, None, None, 128, "recompute", "persist", "1000,1040000", 512, 8000)
    for row in res["rows"]:
        for figure in (f"{row['base_s'] * 1e3:,.3f}", f"{row['with_s'] * 1e3:,.3f}", f"{row['base_tok_s_per_gpu']:,.0f}",
                       f"{row['with_tok_s_per_gpu']:,.0f}", f"{row['gain']:.3f}x", f"{row['new_tokens']:,}"):
            assert figure in r.stdout, (figure, r.stdout)
    assert "tok/s/GPU" in r.stdout and "ms" in r.stdout


# ------------------------------------------------------------------------------------------------ twinfer cost
def test_cost_refuses_offload_on_a_dense_model(cli_exit_2):
    """``--offload-fraction 0.5`` on llama-3.1-8b priced the same step as without it (offload moves MoE expert
    weights only) and labelled the layout 'offload 50% experts'."""
    err = cli_exit_2("cost", "-m", "llama-3.1-8b", "--tp", "1", "--offload-fraction", "0.5")
    assert ("--offload-fraction 0.5: llama-3.1-8b is dense (no MoE layers); offload keeps a share of each MoE layer's "
            "expert weights in host memory, so it applies to MoE models only") in err
    err = cli_exit_2("cost", "--offload-scope", "moe")
    assert "--offload-scope moe: only with --offload-fraction > 0" in err
    from ui.cmd_cost import CostConfig, run_cost

    assert run_cost(CostConfig(model="llama-3.1-8b", tp=1, offload_fraction=0.0))["offload"] is None
    res = run_cost(CostConfig(tp=4, dtype="fp8", offload_fraction=0.6, offload_scope="moe", batch=["prefill:1x8192"]))
    assert res["offload"]["scope"] == "moe" and res["offload"]["fraction"] == 0.6   # an MoE model: applied


@pytest.mark.parametrize("batch, failed", [
    ("decode:1000x100000", "batch_fits"),     # KV past the pool: was fits false, batch_fits false, memory.fits true
    ("prefill:1x200000", "context_fits"),     # past the context: was fits false with every other fit field true
])
def test_cost_json_fit_fields_say_which_check_failed(batch, failed):
    r = CliRunner().invoke(app, ["cost", "-b", batch, "--allow-no-fit", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    checks = ("layout_fits", "batch_fits", "context_fits")
    assert d["fits"] is False and d["memory"]["fits"] is True
    assert {k: d[k] for k in checks} == {k: k != failed for k in checks}
    assert d["fits"] == all(d[k] for k in checks)
    assert d["fits_reason"] and d["warnings"] == [f"{d['fits_reason']} (priced anyway: --allow-no-fit)"]
    text = _flat(CliRunner().invoke(app, ["cost", "-b", batch, "--allow-no-fit"], env={"COLUMNS": "200"}).stdout)
    rows = {"layout_fits": "layout fits", "batch_fits": "batch KV fits the pool", "context_fits": "requests within the context"}
    for key, label in rows.items():
        assert f"│ {label} │ {'yes' if d[key] else 'NO (priced with --allow-no-fit)'}" in text
    ok = json.loads(CliRunner().invoke(app, ["cost", "--json"]).stdout)
    assert ok["fits"] and ok["fits_reason"] is None and all(ok[k] for k in checks)


def test_cost_json_help_documents_the_fit_fields():
    r = CliRunner().invoke(app, ["cost", "--help"], env={"COLUMNS": "300"})
    text = _flat(r.stdout)
    for key in ("fits:", "fits_reason:", "layout_fits:", "batch_fits:", "context_fits:", "memory.fits:"):
        assert key in text, key
