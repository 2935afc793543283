"""``twinfer bench``: the one SLO syntax and its verdict, the .../v1 URL serve prints, -n."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from typer.testing import CliRunner  # noqa: E402

from test_bench_run import fake_server  # noqa: E402,F401  (the module-scoped fake OpenAI server)
from ui.cli import app  # noqa: E402

ARGS = ["bench", "--workload", "chat", "-n", "3", "--rate", "50", "--input-len", "32", "--output-len", "4"]


def test_v1_url_slo_verdict_and_n(fake_server):  # noqa: F811
    r = CliRunner().invoke(app, ARGS + ["--url", fake_server.url + "/v1/", "--json", "--slo", "ttft_p90=10s,tpot_p90=1s"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["config"]["num_requests"] == 3 and doc["metrics"]["requests_finished"] == 3
    assert doc["slo_check"]["meets"] is True and doc["slo_check"]["slo"] == "ttft_p90=10s,tpot_p90=1s"
    r = CliRunner().invoke(app, ARGS + ["--url", fake_server.url, "--slo", "ttft_p90=1us,tpot_p90=1us"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "meets the SLO ttft_p90=1us,tpot_p90=1us: no" in r.stdout


def test_bad_slo_and_url_are_exit_2():
    r = CliRunner().invoke(app, ARGS + ["--slo", "ttft=2,tpot=50"])
    assert r.exit_code != 0 and "needs its percentile" in str(r.exception)
    r = CliRunner().invoke(app, ARGS + ["--url", "localhost:8000"])
    assert "--url" in str(r.exception) and "http://HOST:PORT/v1" in str(r.exception)
