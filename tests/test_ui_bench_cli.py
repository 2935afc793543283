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


def test_partial_summary_says_when_nothing_completed():
    from rich.console import Console

    from executor.bench_client import RequestRecord
    from ui.cmd_bench import print_partial

    for recs, says in (([], "interrupted: 0 of 8 requests completed; no figures to report"),
                       ([RequestRecord(0, 0.0, success=False)], "1 of 8 requests completed (all 1 failed); no figures")):
        con = Console(record=True, width=200)
        print_partial(con, recs, 8)
        text = con.export_text()   # it was a heading, "partial figures over the successful ones:", over nothing
        assert says in text and "partial figures" not in text


def _cut_after(monkeypatch, completed: int):
    """bench's run stands in for one that Ctrl-C cuts after ``completed`` requests came back."""
    from executor import bench_client as bc

    async def server_info(url, model, api_key):
        return "m", 4096

    async def run_benchmark(url, items, *, on_record, **kw):
        for i in range(completed):
            on_record(bc.RequestRecord(i, 0.0, start_s=0.1 * i, prompt_len=32, output_len=4, output_tokens=4,
                                       ttft_s=0.01, tpot_s=0.002, e2e_s=0.02, success=True))
        raise KeyboardInterrupt

    monkeypatch.setattr(bc, "server_info", server_info)
    monkeypatch.setattr(bc, "run_benchmark", run_benchmark)


@pytest.mark.parametrize("completed", [2, 0])
def test_ctrl_c_still_writes_records_and_json_of_what_completed(monkeypatch, tmp_path, completed):
    # exit 130 printed the partial line, but --records was never written and --json printed nothing
    _cut_after(monkeypatch, completed)
    out = tmp_path / "r.jsonl"
    r = CliRunner().invoke(app, ARGS + ["--url", "http://127.0.0.1:1", "--records", str(out), "--json"])
    assert r.exit_code == 130, r.output
    lines = out.read_text().splitlines()
    assert [json.loads(x)["index"] for x in lines] == list(range(completed))
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["config"]["interrupted"] is True and doc["config"]["num_requests_planned"] == 3
    assert doc["config"]["num_requests"] == completed and doc["metrics"]["requests_finished"] == completed
    if completed:
        assert doc["metrics"]["duration_s"] == pytest.approx(0.12)   # first send to last completion
    else:
        assert "interrupted: 0 of 3 requests completed; no figures to report" in r.stderr


def test_ctrl_c_without_json_prints_the_partial_figures_only(monkeypatch):
    _cut_after(monkeypatch, 2)
    r = CliRunner().invoke(app, ARGS + ["--url", "http://127.0.0.1:1"], env={"COLUMNS": "200"})
    assert r.exit_code == 130 and "interrupted: 2 of 3 requests completed (0 failed)" in r.stderr
    assert "twinfer bench:" not in r.stdout   # not the whole-run table as well


def test_rate_and_duration_help_shows_the_bound_that_is_checked():
    # --duration-s showed [x>=0.0] while 0 was refused "must be > 0"
    r = CliRunner().invoke(app, ["bench", "--help"])
    assert r.exit_code == 0
    for flag in ("--rate", "--duration-s"):
        entry = r.stdout[r.stdout.index(f"  {flag} "):]
        entry = entry[:entry.index("\n  --", 1)]   # the option's help, up to the next option
        assert "> 0" in entry and "x>=" not in entry, entry
        r2 = CliRunner().invoke(app, ARGS + ["--url", "http://127.0.0.1:1", flag, "-1"])
        assert r2.exit_code != 0 and f"{flag} must be > 0 (got -1)" in str(r2.exception)


def test_a_workload_file_takes_the_flags_before_it_is_validated(tmp_path):
    """`bench --workload FILE` validated the file alone before --rate/--concurrency applied: a file without a rate was
    refused with --rate given, and a `kind: closed` file without its users with --concurrency given (as `simulate`
    was until 2026-12-06)."""
    from twinfer.errors import TwinferError
    from ui.cmd_bench import closed_workload, load_workload

    common = dict(requests=None, trace=None, trace_format="jsonl", input_len=None, output_len=None)
    open_file = tmp_path / "open.yaml"
    open_file.write_text("input_len: 64\noutput_len: 8\nnum_requests: 12\n")
    spec = load_workload(str(open_file), rate=3.0, **common)
    assert spec.kind == "poisson" and spec.rate == 3.0 and spec.num_requests == 12
    with pytest.raises(TwinferError, match="rate: required"):
        load_workload(str(open_file), rate=None, **common)
    closed_file = tmp_path / "closed.yaml"
    closed_file.write_text("kind: closed\ninput_len: 64\noutput_len: 8\nnum_requests: 12\n")
    spec = load_workload(str(closed_file), rate=None, concurrency=4, think_time_s=0.5, **common)
    assert spec.kind == "closed" and spec.concurrency == 4
    closed = closed_workload(spec, concurrency=4, rate=None, think_time_s=0.5)
    assert closed.concurrency == 4 and closed.num_requests == 12
    with pytest.raises(TwinferError, match="concurrency: required"):
        load_workload(str(closed_file), rate=None, **common)
