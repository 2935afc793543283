"""``twinfer plan --ray``: the sweep on a real local Ray cluster returns the plan the in-process sweep returns."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ui.cli import app

ray = pytest.importorskip("ray")

# the smallest search that still screens several layouts and simulates one candidate
SMALL = ["plan", "--model", "qwen3-30b-a3b", "--hardware", "h200", "--gpus", "2", "--workload", "chat",
         "--slo", "ttft_p90=2s,tpot_p90=50ms", "--simulate", "1", "--sim-requests", "100", "--json"]


def _plan(*extra: str) -> dict:
    r = CliRunner().invoke(app, SMALL + list(extra))
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    runner = rep.pop("timings")["runner"]
    return rep, runner


@pytest.fixture(scope="module")
def local_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_plan_on_ray_equals_in_process(local_cluster):
    on_ray, where = _plan("--ray", "auto")
    assert where.startswith("Ray cluster")
    in_process, here = _plan("--workers", "1")
    assert here == "this process"
    assert on_ray == in_process
    assert on_ray["status"] == "ok" and on_ray["recommended"]
