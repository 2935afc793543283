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


def test_simulate_says_when_outputs_stop_at_the_context_window(tmp_path):
    """Outputs past the context window stop there (finish reason 'length'), and simulate says how many and how much of
    what was asked was produced (a new user's 1,000,000-token outputs were cut to the window without a word)."""
    sc = tmp_path / "cut.yaml"
    sc.write_text("model: llama-3.1-8b\nhardware: H100\nlayout: {tp: 1}\nscheduler: {max_model_len: 1024}\n"
                  "workload: {kind: poisson, rate: 2, num_requests: 4, input_len: 100, output_len: 5000}\n")
    r = runner.invoke(app, ["simulate", "-s", str(sc)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "4 request(s) asked for more output than the context window leaves" in text
    assert "of the 20,000 output tokens they asked for" in text
    sc.write_text(sc.read_text().replace("output_len: 5000", "output_len: 50"))
    r = runner.invoke(app, ["simulate", "-s", str(sc)], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "asked for more output" not in " ".join(r.stdout.split())
