"""Issue 19: every figure names its window. `twinfer simulate` prints the whole run and the steady window under
their names (text and --json), and the steady one is what `plan` quotes."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ui.cli import app

runner = CliRunner()


def test_simulate_names_both_windows_in_text_and_json():
    r = runner.invoke(app, ["simulate", "-n", "300"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "throughput and load (whole run: first arrival to last finish)" in text
    assert "steady window: latencies of the requests arriving between the 10th and the 90th percentile arrival" in text
    assert "(whole run)" in text  # the latency table's title says it is the whole run's
    r = runner.invoke(app, ["simulate", "-n", "300", "--json"])
    m = json.loads(r.stdout)["metrics"]
    assert m["steady"]["window"] == "steady" and m["whole_run"]["window"] == "whole_run"
    # the top-level figures are the whole run's (the steady window's differ: it leaves out fill and drain)
    assert m["output_throughput_per_gpu"] == m["whole_run"]["output_throughput_per_gpu"]
    assert m["steady"]["output_throughput_per_gpu"] != m["whole_run"]["output_throughput_per_gpu"]


def test_simulate_plan_says_whether_it_is_the_plans_own_run(tmp_path):
    """`simulate --plan` sets its run beside the plan's prediction: the same run (same digest) or, after -n, not."""
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["plan", "--model", "qwen3-30b-a3b", "--hardware", "h200", "--gpus", "8", "--slo",
                            "ttft_p90=2s,tpot_p90=50ms", "--simulate", "1", "--sim-requests", "300", "--workers", "1",
                            "--out", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    from planner.plan import load_plan

    pr = load_plan(out).predicted
    # the plan's req/s is the offered rate it is sized for, and simulate --plan names the same offered rate
    assert f"at an offered {pr.request_rate:,.1f} req/s" in " ".join(r.stdout.split())
    r = runner.invoke(app, ["simulate", "--plan", str(out)], env={"COLUMNS": "200"})
    text = " ".join(r.stdout.split())
    assert f"requests offered at {pr.request_rate:,.1f} req/s" in text
    assert f"the plan's own run (digest {pr.sim_digest[:16]} = the plan's)" in text
    assert f"the plan predicted {pr.output_tokens_per_s_per_gpu:,.0f} output tok/s/GPU" in text
    r = runner.invoke(app, ["simulate", "--plan", str(out), "-n", "200"], env={"COLUMNS": "200"})
    assert "not the plan's run (--requests changed it" in " ".join(r.stdout.split())
    # the flags that changed it, named: --concurrency too (it once read '--requests/--rate/--seed changed it')
    r = runner.invoke(app, ["simulate", "--plan", str(out), "-n", "200", "--concurrency", "4"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "not the plan's run (--requests/--concurrency changed it" in " ".join(r.stdout.split())
    # --slo alone: only the verdict and goodput differ, and --requests (not given) is not blamed (it once was: the
    # request count the run took from the plan read as the flag)
    r = runner.invoke(app, ["simulate", "--plan", str(out), "--slo", "ttft_p90=1s,tpot_p90=10ms"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "not the plan's run (--slo (the goodput and verdict only) changed it" in text and "--requests/--slo" not in text
