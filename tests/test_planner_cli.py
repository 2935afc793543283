"""``twinfer plan`` end to end: table, JSON, plan file, infeasible requests, clean errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from planner.plan import load_plan
from ui.cli import app
from ui.cmd_plan import parse_slo
from twinfer.errors import TwinferError

runner = CliRunner()
SMALL = ["plan", "--model", "qwen3-30b-a3b", "--hardware", "h200", "--gpus", "8", "--workload", "chat",
         "--slo", "ttft=2s,tpot=50ms", "--simulate", "1", "--sim-requests", "300", "--workers", "1"]


def test_table_plan_file_and_json(tmp_path):
    out = tmp_path / "plan.yaml"
    r = runner.invoke(app, SMALL + ["--out", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for words in ("Pareto frontier", "recommended", "per million output tokens", "why it won", "tok/s/GPU", "wrote plan"):
        assert words in r.output
    plan = load_plan(out)
    assert plan.kind == "twinfer-plan" and plan.gpus_used <= 8 and plan.predicted.source == "simulation"
    r = runner.invoke(app, SMALL + ["--json"])
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["status"] == "ok" and d["recommended"]["model"] == "qwen3-30b-a3b" and d["frontier"]


def test_infeasible_requests_exit_1_with_the_explanation():
    r = runner.invoke(app, ["plan", "--model", "deepseek-v3", "--hardware", "h100", "--gpus", "4", "--slo", "ttft=2s,tpot=50ms",
                            "--simulate", "0", "--workers", "1"], env={"COLUMNS": "200"})
    assert r.exit_code == 1
    assert "does not fit" in r.output and "closest options" in r.output
    r = runner.invoke(app, SMALL[:-6] + ["--slo", "ttft=1ms,tpot=1ms", "--simulate", "0", "--workers", "1"], env={"COLUMNS": "200"})
    assert r.exit_code == 1 and "no deployment meets the SLO" in r.output


def test_slo_parsing():
    assert parse_slo("ttft=2s,tpot=50ms") == {"ttft_s": 2.0, "tpot_s": pytest.approx(0.05)}
    assert parse_slo("tpot=0.03, ttft=500ms, e2e=60") == {"ttft_s": 0.5, "tpot_s": 0.03, "e2e_s": 60.0}
    with pytest.raises(TwinferError, match="tpot is required"):
        parse_slo("ttft=2s")
    with pytest.raises(TwinferError, match="cannot read"):
        parse_slo("ttft=fast")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ui.cli", *args], capture_output=True, text=True, timeout=120)


def test_bad_input_is_one_clean_line():
    r = _cli("plan", "--gpus", "8", "--slo", "ttft=2s")
    assert r.returncode == 2 and "tpot is required" in r.stderr and "Traceback" not in r.stderr
    r = _cli("plan", "--gpus", "0", "--slo", "ttft=2s,tpot=50ms")
    assert r.returncode == 2 and "gpus" in r.stderr and "Traceback" not in r.stderr
    r = _cli("plan", "--gpus", "8", "--hardware", "tpu9", "--slo", "ttft=2s,tpot=50ms")
    assert r.returncode == 2 and "unknown hardware" in r.stderr


def test_ray_flag_without_ray_is_a_clear_error():
    try:
        import ray  # noqa: F401
        pytest.skip("ray is installed here")
    except ImportError:
        pass
    r = _cli(*SMALL, "--ray", "auto")
    assert r.returncode == 2 and "'ray' package is not installed" in r.stderr


def test_simulate_takes_the_plan_file_as_it_is(tmp_path):
    out = tmp_path / "plan.yaml"
    r = runner.invoke(app, SMALL + ["--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    r = runner.invoke(app, ["simulate", "--plan", str(out), "--requests", "200", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["num_gpus"] == plan.gpus_used and res["metrics"]["requests_finished"] == 200
    assert res["scenario"]["model"] == plan.model and res["scenario"]["effects"]["expert_load"]["skew"] == "zipf"
    r = _cli("simulate", "--plan", str(out), "--tp", "4")
    assert r.returncode == 2 and "the plan fixes the deployment" in r.stderr


def test_disaggregated_plan_simulates_with_both_pools(tmp_path):
    out = tmp_path / "pd.yaml"
    r = runner.invoke(app, SMALL[:-6] + ["--modes", "disagg", "--simulate", "1", "--sim-requests", "300", "--workers", "1",
                                          "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = load_plan(out)
    assert plan.mode == "disaggregated" and {p.role for p in plan.pools} == {"prefill", "decode"}
    r = runner.invoke(app, ["simulate", "--plan", str(out), "--requests", "200", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["num_gpus"] == plan.gpus_used and res["scenario"]["disagg"]["prefill_instances"] >= 1
    assert res["metrics"]["requests_finished"] == 200
