"""``twinfer simulate``: the one SLO syntax (flag and scenario file), the verdict, -n, progress and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from sim.runner import simulate as run_sim
from ui.cli import app
from sim.runner import scenario_requests
from ui.cmd_simulate import effective_scenario

runner = CliRunner()
SHORT = ["simulate", "-n", "200"]


def test_progress_requests_are_the_runners_own():
    # the CLI generates the requests (so a bar can count them); the runner must get the same digest
    for over in ({"requests": 300}, {"requests": 200, "instances": 2, "workload": "agentic"}):
        sc = effective_scenario(**over)
        assert run_sim(sc, requests=scenario_requests(sc)).result.digest == run_sim(sc).result.digest


def test_slo_flag_verdict_row_json_and_bar():
    r = runner.invoke(app, SHORT + ["--slo", "ttft_p99=10s,tpot_p99=1s"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert "meets the SLO (ttft_p99=10s,tpot_p99=1s, steady window)" in r.stdout and "goodput (TTFT<=10s, TPOT<=1000ms)" in r.stdout
    assert "simulate" in r.stderr and "200/200" in r.stderr and "ETA" in r.stderr
    r = runner.invoke(app, SHORT + ["--slo", "ttft_p90=1ms,tpot_p90=1ms", "--json"])
    check = json.loads(r.stdout)["slo_check"]
    assert check["meets"] is False and check["percentile"] == 90 and check["slo"] == "ttft_p90=1ms,tpot_p90=1ms"
    assert json.loads(r.stdout)["num_requests"] == 200  # -n: requests (not instances)


def test_slo_without_units_is_refused():
    r = subprocess.run([sys.executable, "-m", "ui.cli", "simulate", "--slo", "ttft_p90=2,tpot_p90=50"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "--slo" in r.stderr and "needs a unit" in r.stderr and "Traceback" not in r.stderr


def test_scenario_file_takes_the_slo_string(tmp_path):
    f = tmp_path / "s.yaml"
    base = yaml.safe_load(runner.invoke(app, ["simulate", "--print-scenario", "-n", "100"]).stdout)
    f.write_text(yaml.safe_dump({**base, "slo": "ttft_p50=3s,tpot_p50=80ms"}))
    sc = effective_scenario(str(f))
    assert (sc.slo.ttft_s, sc.slo.tpot_s) == (3.0, pytest.approx(0.08))
    r = runner.invoke(app, ["simulate", "--scenario", str(f), "--json"])
    assert json.loads(r.stdout)["slo_check"]["slo"] == "ttft_p50=3s,tpot_p50=80ms"
    f.write_text(yaml.safe_dump({**base, "slo": "ttft_p50=3,tpot_p50=80"}))
    r = subprocess.run([sys.executable, "-m", "ui.cli", "simulate", "--scenario", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "s.yaml: slo" in r.stderr and "needs a unit" in r.stderr


def test_ctrl_c_prints_partial_results():
    # a run far too long to finish; SIGINT once it has started simulating
    p = subprocess.Popen([sys.executable, "-m", "ui.cli", "simulate", "-n", "2000000", "--rate", "50"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "120"},
                         # Ctrl-C reaches it as at a terminal, whatever this process inherited (a shell's background job
                         # ignores SIGINT, and a child inherits that)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "simulating" in p.stdout.readline()
    time.sleep(1)  # into the event loop (the run cannot finish: 2M requests)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    assert "interrupted after" in err and "of 2,000,000 requests finished" in err and "Traceback" not in err


def test_disaggregated_header_names_both_pools_and_the_kv_figures_pool(tmp_path):
    f = tmp_path / "pd.yaml"
    f.write_text(yaml.safe_dump({
        "name": "pd", "model": "deepseek-v3", "hardware": "H200", "instances": 2, "layout": {"tp": 8},
        "disagg": {"prefill_layout": {"tp": 1, "dp": 8, "ep": 8}, "prefill_instances": 1},
        "workload": {"kind": "poisson", "rate": 5.0, "num_requests": 20},
    }))
    r = runner.invoke(app, ["simulate", "-s", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "on 24xH200 (prefill 1 x TP1 DP8 EP8 + decode 2 x TP8)" in r.stdout, r.stdout
    assert "tokens per decode instance" in r.stdout
    r = runner.invoke(app, SHORT, env={"COLUMNS": "300"})  # a plain scenario keeps its one pool
    assert "on 8xH200 (1 x TP8)" in r.stdout and "tokens per instance" in r.stdout, r.stdout


def test_a_mirrored_slices_header_says_it_is_one(tmp_path):
    """effects.mirror simulates 1/mirror of a wide attention-DP instance's ranks on that share of its GPUs: the header
    says so next to the full layout, and names the KV figure as the slice's."""
    f = tmp_path / "m.yaml"
    f.write_text(yaml.safe_dump({
        "name": "m", "model": "deepseek-v3", "hardware": "H200", "layout": {"tp": 1, "dp": 8, "ep": 8},
        "effects": {"mirror": 8}, "workload": {"kind": "poisson", "rate": 2.0, "num_requests": 20},
    }))
    r = runner.invoke(app, ["simulate", "-s", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "(1 x TP1 DP8 EP8; 1/8 of its DP ranks simulated, on the GPUs counted here (effects.mirror 8))" in r.stdout, r.stdout
    assert "tokens per simulated slice" in r.stdout


def test_header_layout_accounts_for_every_gpu_and_a_slow_rate(tmp_path):
    """A PP2 instance of TP8 is 16 GPUs: the header once said '16xH200 (1 x TP8)', leaving 8 unaccounted for; an
    offered rate of 0.01 req/s was printed as '0.0 req/s'."""
    sc = tmp_path / "pp2.yaml"
    sc.write_text(yaml.safe_dump({"model": "deepseek-v3", "hardware": "H200", "layout": {"tp": 8, "pp": 2},
                                  "workload": {"kind": "poisson", "rate": 0.01, "num_requests": 1,
                                               "input_len": {"kind": "fixed", "value": 512},
                                               "output_len": {"kind": "fixed", "value": 8}}}))
    r = runner.invoke(app, ["simulate", "-s", str(sc)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "on 16xH200 (1 x TP8 PP2)" in r.stdout and "offered at 0.01 req/s" in r.stdout, r.stdout


def test_header_kv_says_it_is_whole_blocks_of_the_memory_fits_figure():
    """`twinfer cost` and the JSON's kv.memory line say 679,346 KV tokens per instance for the default deployment;
    the header said 679,296 (the simulator's whole blocks of 64) with nothing telling the two apart."""
    r = runner.invoke(app, SHORT + ["--json"])
    kv = json.loads(r.stdout)["kv"]
    r = runner.invoke(app, SHORT, env={"COLUMNS": "300"})
    assert "679,346 tokens per DP rank (679,346 per instance)" in kv["memory"]
    assert kv["capacity_tokens"] == kv["num_blocks"] * kv["block_size"] == 679_296
    assert f"KV 679,296 tokens per instance ({kv['num_blocks']:,} whole blocks of 64)" in r.stdout, r.stdout


def test_the_slo_verdict_is_the_steady_windows_as_the_planner_judges():
    """`-n 200` of the default: TPOT p90 51.37 ms over the whole run, 51.66 ms in the steady window (40.86 and 41.04
    before the TP8 expert shards took the H100's measured kernels, not the bandwidth ramp, and the default's rate went
    7.3 -> 6.1 req/s to stay at 70% of capacity). A 51.5 ms target is met by the first and missed by the second; the
    verdict reads the steady window (planner.simulate.meets), and its line says which window it judged."""
    r = subprocess.run([sys.executable, "-m", "ui.cli", "simulate", "-n", "200", "--slo", "ttft_p90=2s,tpot_p90=51.5ms", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    m = d["metrics"]
    assert m["tpot_s"]["p90"] <= 0.0515 < m["steady"]["tpot_s"]["p90"]
    assert d["slo_check"]["meets"] is False and "(steady window: TTFT p90" in d["slo_check"]["line"]
