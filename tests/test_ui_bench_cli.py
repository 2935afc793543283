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


@pytest.mark.parametrize("flag", ["--rate", "--duration-s"])
def test_zero_rate_or_duration_is_refused_not_ignored(flag):
    # `if rate:` took 0 for unset: the preset's rate ran while --json reported "rate": 0.0
    r = CliRunner().invoke(app, ARGS + ["--url", "http://127.0.0.1:1", flag, "0"])
    assert r.exit_code != 0 and f"{flag} must be > 0 (got 0)" in str(r.exception)


def test_partial_summary_of_a_cut_bench():
    from rich.console import Console

    from executor.bench_client import RequestRecord
    from ui.cmd_bench import print_partial

    recs = [RequestRecord(i, 0.0, ttft_s=0.1 * (i + 1), tpot_s=0.01, e2e_s=1.0, success=i != 2) for i in range(3)]
    con = Console(record=True, width=200)
    print_partial(con, recs, 10)
    text = con.export_text()
    assert "3 of 10 requests completed (1 failed)" in text and "TTFT ms p50/p90/p99: 150.0" in text and "(2 requests)" in text
