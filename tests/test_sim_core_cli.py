"""``twinfer simulate``: smoke tests through the real console entry point, and the router policies."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from scheduler.config import SchedulerConfig
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from sim.router import RouterConfig, make_router


def twinfer(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ui.cli import main; main()", "simulate", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)


def test_simulate_json_smoke():
    p = twinfer("--requests", "200", "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["metrics"]["requests_finished"] == 200
    assert len(res["digest"]) == 64 and res["scenario"]["workload"]["num_requests"] == 200
    assert res["scenario"]["model"] == "deepseek-v3" and res["num_gpus"] == 8


def test_same_seed_same_bytes_across_processes():
    import os

    outs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        p = subprocess.run([sys.executable, "-c", "from ui.cli import main; main()", "simulate", "--requests", "60", "--json"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1]


def test_simulate_table_flags_and_exports(tmp_path):
    csv, trace = tmp_path / "m.csv", tmp_path / "t.json"
    p = twinfer("--requests", "80", "--rate", "3", "--max-num-seqs", "64", "--no-async-overlap", "--draft-len", "1",
                "--csv", str(csv), "--perfetto", str(trace), "--seed", "7")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for needle in ("default", "TTFT", "TPOT", "output tokens/s", "--scenario"):
        assert needle in out
    assert csv.read_text().startswith("metric,value")
    assert json.loads(trace.read_text())["traceEvents"]


def test_print_scenario_round_trips(tmp_path):
    p = twinfer("--print-scenario", "--tp", "8", "--rate", "2.5", "--requests", "40")
    assert p.returncode == 0, p.stderr
    data = yaml.safe_load(p.stdout)
    assert data["workload"]["rate"] == 2.5 and data["layout"]["tp"] == 8
    f = tmp_path / "s.yaml"
    f.write_text(p.stdout)
    q = twinfer("--scenario", str(f), "--json")
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)["metrics"]["requests_finished"] == 40


def test_errors_name_the_field_without_traceback(tmp_path):
    p = twinfer("--tp", "3", "--ep", "2", "--requests", "10")
    assert p.returncode == 2 and "layout" in p.stderr and "Traceback" not in p.stderr
    p = twinfer("--max-num-seqs", "0")
    assert p.returncode == 2 and "scheduler.max_num_seqs" in p.stderr
    p = twinfer("--model", "nope")
    assert p.returncode == 2 and "model" in p.stderr and "deepseek-v3" in p.stderr
    p = twinfer("--scenario", str(tmp_path / "missing.yaml"))
    assert p.returncode == 2 and "no such file" in p.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: {preset: chat, rate: 1, num_requests: 5}\nscheduler: {policy: lifo}\n")
    p = twinfer("--scenario", str(bad))
    assert p.returncode == 2 and "scheduler.policy" in p.stderr and str(bad) in p.stderr


def test_routers():
    cfg = SchedulerConfig(block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
    scheds = [Scheduler(cfg, 100, i) for i in range(3)]
    rr = make_router(RouterConfig(kind="round_robin"))
    assert [rr.choose(Request(f"x{i}", 0.0, 4, 4), scheds) for i in range(4)] == [0, 1, 2, 0]
    lo = make_router(RouterConfig.model_validate("least_outstanding"))
    scheds[0].add_request(Request("a", 0.0, 40, 40))
    scheds[1].add_request(Request("b", 0.0, 4, 4))
    assert lo.choose(Request("c", 0.0, 4, 4), scheds) == 2
    # prefix-aware: instance 1 holds the prefix (cached after its prefill) and is not overloaded
    pa = make_router(RouterConfig(kind="prefix_aware", load_threshold=0.0, load_slack_tokens=100))
    holder = Request("h", 0.0, 12, 2, block_hashes=(7, 8, 9))
    scheds[1].add_request(holder)
    plan = scheds[1].schedule(0.0)
    from scheduler.plan import StepResult
    import numpy as np

    scheds[1].complete(plan, StepResult(np.ones(1), np.ones((1, len(plan.decodes)), np.int64)), 1.0)
    probe = Request("p", 0.0, 16, 2, block_hashes=(7, 8, 9, 10))
    assert scheds[1].prefix_match_tokens(probe) == 12
    assert pa.choose(probe, scheds) == 1
    # ... unless it is overloaded
    pa_strict = make_router(RouterConfig(kind="prefix_aware", load_threshold=0.0, load_slack_tokens=0))
    assert pa_strict.choose(probe, scheds) == 2
