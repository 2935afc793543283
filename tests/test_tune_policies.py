"""``twinfer tune --gpus N``: EP width, async overlap and sliding-window replay searched together (issue 23)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.tune_explain import explanation, policy_gains
from planner.tune_plan import confirm, tuned_plan
from planner.tune_policies import (THE_THREE, Policy, Run, TuneSpace, baseline_policy, make_context, replay_policy,
                                   scheduler_of, search, simulate_policy, simulations_bound, values_of)
from sim.workload import preset
from twinfer.errors import TwinferError


# tiny reads 4,096 tokens: chat's lengths capped to fit (a longer request is refused, as the executor refuses it)
TINY_CHAT = {"input_len": {"kind": "lognormal", "mean": 1500, "sigma": 0.8, "min": 16, "max": 3072},
             "output_len": {"kind": "lognormal", "mean": 400, "sigma": 0.7, "min": 8, "max": 1024}}


def _ctx(model="tiny", hardware="h200", gpus=4, space=None, **kw):
    wl = preset("chat", num_requests=300, **(TINY_CHAT if model == "tiny" else {}))
    return make_context(model, hardware, gpus, wl, space or TuneSpace(), sim_requests=300, **kw)


def test_grid_holds_the_three_policies_on_a_window_model():
    ctx = _ctx("deepseek-v4-flash", "gb300", 8)
    vals = values_of(ctx, TuneSpace())
    assert vals["ep_width"] == [1, 2, 4, 8]        # everything fits on GB300 (288 GB)
    assert vals["async_overlap"] == [False, True]
    # V4-Flash: a 128-token window on its csa and hca layers: W = 64 and 128, on all of them or one kind
    assert (0, "none") in vals["replay"]
    assert {(64, "all"), (128, "all"), (64, "csa"), (128, "hca")} <= set(vals["replay"])
    assert set(THE_THREE) <= set(vals)


def test_replay_values_become_scheduler_policies():
    p = Policy(2, True, 64, "all", 32, 2048)
    sc = scheduler_of(p, 2)
    assert sc.swa_replay_tokens == 64 and sc.replay is None and sc.async_overlap and sc.max_num_seqs == 64
    per_kind = scheduler_of(p.with_value("replay", (64, "csa")), 2)
    assert per_kind.swa_replay_tokens == 0 and per_kind.replay == replay_policy(64, "csa")
    assert per_kind.replay.kinds["csa"].tokens == 64 and per_kind.replay.default.mode == "persist"
    # persist where the model ships persist: nothing set (scenario dumps unchanged); elsewhere an explicit persist
    assert scheduler_of(p.with_value("replay", (0, "none")), 2).replay is None
    assert scheduler_of(p.with_value("replay", (0, "none")), 2, shipped=(128, "all")).replay.default.mode == "persist"


def test_v41_replays_per_layer_kind_and_ships_bounded_replay():
    from costmodels.catalog import get_model

    ctx = _ctx("deepseek-v4.1-flash", "gb300", 8)
    assert "does not fit" in ctx.rejected[1]          # 306 GB of weights on one 288 GB GPU
    assert ctx.shipped_replay == (128, "all")          # V4.1 ships bounded replay of its window
    vals = values_of(ctx, TuneSpace())
    assert {(64, "sliding"), (64, "csa"), (64, "sparse"), (128, "all")} <= set(vals["replay"])
    assert baseline_policy(ctx, vals).replay == (128, "all")
    m = get_model("deepseek-v4.1-flash")
    modes = replay_policy(64, "sparse", m).resolve(m).modes
    assert [i for i, k in enumerate(m.kinds()) if modes[i] == "replay"] == [i for i, k in enumerate(m.kinds()) if k == "sparse"]


def test_memory_fit_rejects_widths_and_they_are_reported_not_tried():
    ctx = _ctx("deepseek-v4-flash", "h100", 4, TuneSpace(ep_widths=(1, 2, 4, 8)))
    assert sorted(ctx.options) == [4]
    assert "does not fit" in ctx.rejected[1] and "short by" in ctx.rejected[1]
    assert "does not fit" in ctx.rejected[2] and ctx.rejected[8] == "needs 8 GPUs, the budget is 4"
    vals = values_of(ctx, TuneSpace(ep_widths=(1, 2, 4, 8)))
    assert vals["ep_width"] == [4]
    with pytest.raises(TwinferError, match="--base-ep-width 2: not among"):
        baseline_policy(ctx, vals, ep_width=2)


def test_search_tries_each_policy_and_explains_the_winner():
    space = TuneSpace(ep_widths=(1, 2, 8), batch_per_rank=(16, 64), chunk_tokens=(2048,))
    ctx = _ctx(space=space)
    assert ctx.rejected == {8: "needs 8 GPUs, the budget is 4"}
    vals = values_of(ctx, space)
    base = baseline_policy(ctx, vals)
    assert (base.ep_width, base.async_overlap, base.replay, base.batch_per_rank) == (1, False, (0, "none"), 64)
    assert ctx.saturated                                  # default: each policy at its own capacity
    ctx.rate_per_gpu = 40.0                               # here: all at one offered rate
    res = search(ctx, base, vals, max_rounds=2)
    assert len(res.runs) <= simulations_bound(vals, 2)
    tried = {p.ep_width for p in res.runs}, {p.async_overlap for p in res.runs}
    assert tried == ({1, 2}, {False, True})               # width 8 never simulated
    assert res.best.feasible and res.best.thr_gpu >= res.baseline.thr_gpu
    assert res.best.policy.async_overlap                   # host work hides under the device step
    gains = {g.policy: g for g in policy_gains(ctx, res)}
    assert gains["async_overlap"].gain > 0 and gains["async_overlap"].without.policy.async_overlap is False
    lines = explanation(ctx, res)
    assert any(line.startswith("async overlap off -> on") and "exposed host time" in line for line in lines)
    assert any(line.startswith("EP width") and "MoE expert GEMMs" in line for line in lines)
    assert "EP8 not tried: needs 8 GPUs, the budget is 4" in lines


def test_plan_loads_in_serve_and_simulate_repeats_its_digest(tmp_path):
    pytest.importorskip("torch")
    from ui.cli import app
    from ui.serve_plan import serving_options

    space = TuneSpace(ep_widths=(1, 2), async_overlap=(True,), batch_per_rank=(16,), chunk_tokens=(2048,))
    ctx = _ctx(space=space, gpus=2)
    ctx.rate_per_gpu = 20.0
    for width in (1, 2):
        p = Policy(width, True, 0, "none", 16, 2048)
        plan = confirm(tuned_plan(ctx, p, ["test"], max_requests=400))
        path = tmp_path / f"ep{width}.yaml"
        plan.save(path)
        world, opts = serving_options(str(path), "cpu")
        assert world == width and opts["scheduler_config"].max_num_seqs == 16 * width
        assert opts["scheduler_config"].async_overlap is True
        res = CliRunner().invoke(app, ["simulate", "--plan", str(path), "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["digest"] == plan.predicted.sim_digest
        assert out["metrics"]["steady"]["output_throughput_per_gpu"] == pytest.approx(plan.predicted.output_tokens_per_s_per_gpu)


@pytest.mark.parametrize("args, words", [
    (["--ep-widths", "1,x"], "--ep-widths '1,x': expected comma-separated integers"),
    (["--ep-widths", "0,2"], "--ep-widths '0,2': expected comma-separated integers >= 1"),
    (["--async", "maybe"], "--async 'maybe': expected off, on or off,on"),
    (["--replay-layers", "mlp"], "--replay-layers 'mlp': allowed: all"),
    (["--replay-tokens", "64"], "--replay-tokens 64: tiny has no sliding-window layers"),
    (["--base-ep-width", "3"], "--base-ep-width 3: not among the values searched"),
    (["--ep-widths", "8"], "--ep-widths: no EP width fits"),
    ([], None),
])
def test_bad_values_name_the_flag_and_exit_2(args, words):
    from ui.cli import main
    import subprocess
    import sys

    if words is None:   # no --gpus and no --profile: told what to give
        cmd = [sys.executable, "-m", "ui.cli", "tune"]
        words = "give --gpus N"
    else:
        cmd = [sys.executable, "-m", "ui.cli", "tune", "-m", "tiny", "--hw", "h200", "-g", "2", *args]
    assert main  # the console entry point prints one line and exits 2 on a TwinferError
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert words in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_profile_mode_says_ep_width_stays_a_simulated_recommendation(tmp_path):
    from pathlib import Path

    import yaml

    from ui.cli import app

    prof = str(Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json")
    plan = tmp_path / "winner.yaml"
    res = CliRunner().invoke(app, ["tune", "--model", "deepseek-v3", "--num-layers", "5", "--profile", prof, "--requests", "12",
                                   "--max-input-len", "256", "--max-output-len", "8", "--plan-out", str(plan)])
    assert res.exit_code == 0, res.output
    assert "EP width: not searched here" in " ".join(res.output.split())
    assert "simulated recommendation" in yaml.safe_load(plan.read_text())["tune"]["ep_width"]


def test_simulate_plan_repeats_a_tuned_policys_figures(tmp_path):
    """A `tune --profile` winner written with --plan-out is simulated again by `simulate --plan`: the same requests,
    profile and scheduler give the same figures tune printed; options the file fixes are refused (exit 2, named); a
    changed profile is said."""
    import json
    import shutil
    from pathlib import Path

    import yaml

    from ui.cli import app

    src = Path(__file__).resolve().parents[1] / "profiles" / "h200" / "calibration_deepseek-v3-5layers_fp8.json"
    prof = tmp_path / "p.json"
    shutil.copy(src, prof)
    plan = tmp_path / "winner.yaml"
    res = CliRunner().invoke(app, ["tune", "--model", "deepseek-v3", "--num-layers", "5", "--profile", str(prof), "--requests", "16",
                                   "--max-input-len", "512", "--max-output-len", "16", "--load", "1.5", "--plan-out", str(plan)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(plan.read_text())
    said = doc["tune"]["predicted"]
    assert doc["simulation"]["profile"] == str(prof) and said["output_throughput"] > 0
    got = CliRunner().invoke(app, ["simulate", "--plan", str(plan), "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.output)
    assert out["same_as_tune"] and out["metrics"]["output_throughput"] == said["output_throughput"] and not out["notes"]
    assert out["metrics"]["tpot_p50"] == said["tpot_p50"] and out["metrics"]["ttft_p90"] == said["ttft_p90"]
    table = CliRunner().invoke(app, ["simulate", "--plan", str(plan)])
    assert table.exit_code == 0 and "the same figures as tune's winner" in table.output
    bad = CliRunner().invoke(app, ["simulate", "--plan", str(plan), "--rate", "3"])   # a user error (exit 2 at the console script)
    from twinfer.errors import TwinferError
    assert isinstance(bad.exception, TwinferError) and "drop --rate (only --json applies)" in str(bad.exception)
    # the profile edited after tune ran: still simulated, and said
    p = json.loads(prof.read_text())
    p["step"]["loop"]["fixed_s"] *= 1.5
    prof.write_text(json.dumps(p))
    changed = json.loads(CliRunner().invoke(app, ["simulate", "--plan", str(plan), "--json"]).output)
    assert any("changed since tune ran" in n for n in changed["notes"])
    # a key deleted from the simulation section is named, not defaulted
    cut = dict(doc)
    cut["simulation"] = {k: v for k, v in doc["simulation"].items() if k != "requests"}
    (tmp_path / "cut.yaml").write_text(yaml.safe_dump(cut))
    bad = CliRunner().invoke(app, ["simulate", "--plan", str(tmp_path / "cut.yaml")])
    assert isinstance(bad.exception, TwinferError) and "simulation" in str(bad.exception) and "requests" in str(bad.exception)
    # the plan runs from another directory: the profile is kept by absolute path
    assert Path(doc["simulation"]["profile"]).is_absolute()


def test_a_value_tried_only_beside_other_settings_is_named_with_them():
    """When the winner's value of a policy was never simulated against another value with everything else as the
    winner's (coordinate descent tried the others from the baseline), the explanation measures the winner against the
    best run of another value and names that run's whole policy, so its figures are the table's (no "no other value
    simulated" beside a table that shows them)."""
    space = TuneSpace(ep_widths=(1, 2), batch_per_rank=(16, 64), chunk_tokens=(2048,))
    ctx = _ctx(space=space)
    vals = values_of(ctx, space)
    res = search(ctx, baseline_policy(ctx, vals), vals, max_rounds=1)
    win = res.best.policy
    # keep only the runs of the other width that differ from the winner in more than the width
    alt = {p: r for p, r in res.runs.items() if p.ep_width != win.ep_width}
    assert alt, "the search tried the other width"
    res.runs = {p: r for p, r in res.runs.items() if p.ep_width == win.ep_width or p != win.with_value("ep_width", p.ep_width)}
    res.attribution["ep_width"] = res.best      # the winner keeps the baseline's width
    left = [r for p, r in res.runs.items() if p.ep_width != win.ep_width]
    if not left:
        pytest.skip("every run of the other width differed from the winner in the width only")
    ref = max(left, key=lambda r: (r.feasible, r.thr_gpu))
    line = next(x for x in explanation(ctx, res) if x.startswith("EP width"))
    assert "no other value simulated" not in line
    assert f"(the best EP{ref.policy.ep_width} simulated, as {ref.policy.describe()})" in line
    assert f"({ref.thr_gpu:,.0f} -> {res.best.thr_gpu:,.0f} tokens/s/GPU" in line


def test_requests_past_the_models_context_are_refused_and_said():
    """Plain chat traffic reaches 32k-token prompts; tiny reads 4,096 tokens. Those requests are refused (as the
    executor refuses them), and the policy's verdict names why instead of only counting them unfinished."""
    space = TuneSpace(ep_widths=(1,), async_overlap=(True,), batch_per_rank=(16,), chunk_tokens=(2048,))
    ctx = make_context("tiny", "h200", 1, preset("chat", num_requests=300), space, sim_requests=300)
    ctx.rate_per_gpu = 20.0
    run = simulate_policy(ctx, Policy(1, True, 0, "none", 16, 2048))
    assert not run.feasible and "refused, e.g. prompt_len + output_len" in run.why and "max_model_len=4096" in run.why, run.why


def test_explained_prefill_of_the_mean_prompt_is_priced_on_its_rank():
    """The replay line prices the mean prompt; on a DEP layout it runs whole on one attention-DP rank, as the simulator
    and `twinfer cost` price it (it was priced split over the ranks: 24.05 ms where `cost` says 29.14 ms for
    Qwen3-30B-A3B DEP2 on H100)."""
    import re

    from planner.tune_explain import why_replay
    from ui.cmd_cost import CostConfig, run_cost

    ctx = make_context("qwen3-30b-a3b", "h100", 2, preset("chat", num_requests=300), TuneSpace(ep_widths=(2,)), sim_requests=300)
    run = Run(Policy(2, True, 0, "none", 16, 8192))
    line = why_replay(ctx, run, run)
    ms = float(re.search(r"of the mean prompt \(([\d,]+) tokens, 0 cached\) ([\d.]+) ms", line).group(2))
    n = int(ctx.stats.mean_prompt)
    lay = ctx.options[2].layout
    cost = run_cost(CostConfig(model="qwen3-30b-a3b", hardware="h100", tp=lay.tp, dp=lay.dp, ep=lay.ep, batch=[f"prefill:1x{n}"]))
    assert lay.dp == 2 and ms == pytest.approx(cost["step_time_s"] * 1e3, abs=0.01), line
