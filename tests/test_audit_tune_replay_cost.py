"""Audit of ``twinfer tune``, ``twinfer replay`` and ``twinfer cost``: inputs refused cleanly (exit 2, the flag named, no
traceback, no runaway), figures that agree with each other, and labels that say what the figures are."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from twinfer.errors import TwinferError
from ui.cli import app

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
CATALOG = ["-m", "tiny", "--hw", "h200", "-g", "1"]
SMALL = ["--ep-widths", "1", "--async", "off", "--batch-per-rank", "16", "--chunk-tokens", "2048", "--sim-requests", "100",
         "--plan-requests", "200", "--rounds", "1"]
FEW = ["--requests", "8", "--max-input-len", "64", "--max-output-len", "4"]


def _flat(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------ twinfer cost
def test_cost_refuses_a_cached_prefix_on_a_decode(cli_exit_2):
    """``decode:1x10+5`` was priced as ``decode:1x10``: the '+5' was dropped unread."""
    err = cli_exit_2("cost", "-b", "decode:1x10+5")
    assert "--batch 'decode:1x10+5': '+CACHED' is for prefill only" in err


def test_cost_bounds_the_requests_of_all_batch_groups(cli_exit_2):
    """Each group was capped at 1,000,000 requests but not their sum: a config of many such groups grew ~45 MB per
    million requests (two groups here; refused before any pricing)."""
    err = cli_exit_2("cost", "-b", "decode:600000x10", "-b", "prefill:600000x10")
    assert "1,200,000 requests in all over 2 batch groups; at most 1,000,000 in one step" in err


# ---------------------------------------------------------------------------------------------- twinfer replay
def _replay(model="deepseek-v4-flash", layer=None, tokens=128, new="8192", dp=4, ep=4):
    from ui.cmd_replay import run_replay

    return run_replay(model, "gb300", 1, dp, ep, None, layer, tokens, None, None, new, 8192, 0)


def test_replay_prices_a_prompt_as_cost_and_the_simulator_do():
    """One 8192-token chunk on DP4xEP4 was 28 ms in ``replay`` (spread over the 4 ranks) against 64 ms in
    ``cost -b prefill:1x8192`` (whole on its rank, as the simulator prices it); now the same figure."""
    from ui.cmd_cost import CostConfig, run_cost

    row = _replay(new="8192")["rows"][0]
    step = run_cost(CostConfig(model="deepseek-v4-flash", hardware="gb300", tp=1, dp=4, ep=4, batch=["prefill:1x8192"]))
    assert row["chunks"] == 1 and row["base_s"] == pytest.approx(step["step_time_s"], rel=1e-9)
    assert row["base_tok_s_per_gpu"] == pytest.approx(8192 / step["step_time_s"] / 4, rel=1e-9)


def test_replay_w_past_its_bound_and_a_bad_layer_name_the_flag(cli_exit_2):
    """``--layer 42 --tokens 99999999999`` was an internal error (pydantic's, exit 1); the layer errors did not say
    which flag they came from."""
    err = cli_exit_2("replay", "--layer", "42", "--tokens", "99999999999", "--new", "8192")
    assert "--tokens" in err and "1048576" in err
    with pytest.raises(TwinferError, match=r"--tokens 2097152: W must be in 1\.\.1,048,576"):
        _replay(layer=42, tokens=1 << 21)
    with pytest.raises(TwinferError, match="--layer: replay.layers: index 99999 is past"):
        _replay(layer=99999)
    err = cli_exit_2("replay", "--with", "{layers: {999: recompute}}", "--new", "1024")
    assert "--with: replay.layers: index 999 is past" in err


def test_replay_says_when_the_model_has_no_window_and_prints_milliseconds():
    """On a model without sliding-window layers both policies price the same, silently; the table's '0.000 s'
    columns (tiny) hid the JSON's figures."""
    res = _replay(model="llama-3.1-8b", new="1024", dp=1, ep=1)
    assert res["warnings"] == [] and "llama-3.1-8b has no sliding-window layers" in res["notes"][0]
    r = CliRunner().invoke(app, ["replay", "-m", "tiny", "--dp", "1", "--ep", "1", "--new", "1024"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    ms = _replay(model="tiny", new="1024", dp=1, ep=1)["rows"][0]["base_s"] * 1e3
    assert "base ms" in r.output and f"{ms:,.3f}" in r.output and ms < 1.0
    assert "tiny has no sliding-window layers" in _flat(r.output)


# ------------------------------------------------------------------------------------------------ twinfer tune
@pytest.mark.parametrize("args, words", [
    (CATALOG + ["--rate-per-gpu", "inf"], "--rate-per-gpu inf: inf requests/s per GPU offered; allowed: 0.001"),  # was: at capacity
    (CATALOG + ["--rate-per-gpu", "1e-300"], "--rate-per-gpu 1e-300"),          # was: an internal error after the search
    (CATALOG + ["--rate-per-gpu", "10000"], "up to (not including) 10000"),     # was: at capacity, plan not at this rate
    (CATALOG + ["--load", "inf"], "--load inf: allowed: a finite multiple"),    # was: at capacity
    (["--profile", PROFILE, "--load", "1e-300"], "--load 1e-300: allowed"),      # was: arrivals spread over 1e300 s
    (CATALOG + ["--batch-per-rank", "99999999999"], "--batch-per-rank '99999999999': each value at most 65,536"),
    (CATALOG + ["--chunk-tokens", "99999999999"], "--chunk-tokens '99999999999': each value at most 4,194,304"),
    (["--profile", PROFILE, "--model", "tiny"], "--model tiny: " + PROFILE + " measured deepseek-v3"),
    (["--profile", PROFILE, "--num-layers", "100000000"], "--num-layers 100000000: deepseek-v3 has 61 layers"),  # was: 5.5 GB
    (["--profile", PROFILE, "--num-kv-blocks", "2", "--requests", "8"], "finished no request of the 8 queued at once on 2 KV blocks"),
])
def test_tune_refuses_up_front_naming_the_flag(cli_exit_2, args, words):
    err = cli_exit_2("tune", *args)
    assert "internal error" not in err and words in err, err


def test_tune_profile_mode_runs_the_profiles_model_at_its_depth(monkeypatch, tmp_path):
    """--model defaulted to tiny in --profile mode: the plan said ``model: tiny`` for a deepseek-v3 prediction and
    --measure built tiny (at every layer) after the search; now the profile's model at the profile's depth, and the
    engine is built before the search (a bad --device is refused before minutes of search)."""
    plan = tmp_path / "p.yaml"
    r = CliRunner().invoke(app, ["tune", "--profile", PROFILE, *FEW, "--plan-out", str(plan)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(plan.read_text())["model"] == "deepseek-v3"
    built = []

    def build_engine(model, num_layers, device, dtype, *a, **k):
        built.append((model, num_layers, device, dtype))
        raise TwinferError(f"device {device!r}: expected 'cpu' or 'cuda'")

    monkeypatch.setitem(sys.modules, "executor.calibrate", types.SimpleNamespace(build_engine=build_engine))
    import planner.tune

    monkeypatch.setattr(planner.tune, "tune", lambda *a, **k: pytest.fail("searched before the engine was built"))
    r = CliRunner().invoke(app, ["tune", "--profile", PROFILE, *FEW, "--measure", "--device", "foo"])
    assert isinstance(r.exception, TwinferError) and "device 'foo'" in str(r.exception)
    assert built == [("deepseek-v3", 5, "foo", "fp8")]


def test_tune_says_when_no_policy_is_feasible(tmp_path):
    """tiny (4,096-token context) on the chat preset: every candidate refuses some requests; the output called the
    best of them 'winner' and 'why it won' without saying so. The JSON said rate_per_gpu 10000 for 'at capacity'."""
    import json

    out = tmp_path / "r.json"
    r = CliRunner().invoke(app, ["tune", *CATALOG, *SMALL, "--out", str(out)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    text = _flat(r.stdout)
    assert "no policy simulated is feasible" in text and "(INFEASIBLE: " in text and "none of them feasible" in text
    doc = json.loads(out.read_text())
    assert doc["compared_at_capacity"] is True and doc["rate_per_gpu"] is None


def test_tune_profile_table_shows_the_winner_below_infeasible_candidates():
    """With a TPOT SLO the winner (32 seats, 2,238 tok/s) ranked below 30 infeasible faster candidates and was not in
    the 'best policies' table at all."""
    args = ["tune", "--profile", PROFILE, "--requests", "48", "--max-input-len", "512", "--max-output-len", "32",
            "--load", "10", "--slo", "tpot_p50=10.2ms"]
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ winner")]
    assert len(rows) == 1 and "2238" in rows[0] and "output_throughput tok/s" in r.stdout


@pytest.mark.parametrize("extra, words", [
    ([], "no policy simulated produced output (no request finished (100 refused, e.g. prompt_len + output_len"),  # was: exit 1
    (["--load", "2"], "--load 2: the baseline (EP1 one GPU"),   # was: an internal error after the whole search
])
def test_tune_with_no_request_served_exits_2_without_a_plan(cli_exit_2, extra, words):
    err = cli_exit_2("tune", *CATALOG, *SMALL, "-w", "long-context", *extra)
    assert words in err and "internal error" not in err, err


def test_tune_help_tells_the_truth():
    r = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "300"})
    text = _flat(r.stdout)
    assert "tpot_p90" in text and "hca, sparse" in text and "powers of 2" not in text
    from planner.tune import OBJECTIVES

    assert all(o in text for o in OBJECTIVES)


def test_tune_profile_mode_says_when_no_policy_is_feasible():
    """A TPOT SLO no policy meets: the baseline was printed as 'winner' with a '+0.0%' gain and nothing else."""
    r = CliRunner().invoke(app, ["tune", "--profile", PROFILE, *FEW, "--slo", "tpot_p50=1ms"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "no policy simulated is feasible (the baseline: TPOT p50" in _flat(r.stdout)
