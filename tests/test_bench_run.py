"""The benchmark client and `twinfer bench` against a fake-engine server (no torch)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

# the serve extra; skipped where it is not installed
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from executor import bench_client as bc  # noqa: E402
from executor.serve.app import create_app  # noqa: E402
from executor.serve.fake_engine import FakeEngine, FakeSamplingParams  # noqa: E402
from executor.serve.server import BackgroundServer  # noqa: E402
from executor.serve.tokenizer import ByteTokenizer  # noqa: E402


def test_bench_client_and_cli_modules_do_not_import_torch():
    code = ("import sys, executor.bench_client, ui.cmd_bench, ui.cmd_serve, executor.serve.app; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture(scope="module")
def fake_server():
    engine = FakeEngine(max_model_len=1024, step_s=0.002, max_running=16)
    app = create_app(engine, ByteTokenizer(), served_model_name="fake", sampling_params_cls=FakeSamplingParams)
    srv = BackgroundServer(app).start()
    srv.engine = engine
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode, closed", [("text", False), ("ids", True)])
def test_run_against_a_server(fake_server, mode, closed):
    items = [bc.BenchItem(i, 0.005 * i, 40 + 8 * i, 12, block_hashes=(7,) if i % 2 else ()) for i in range(12)]
    seen = []
    run = asyncio.run(bc.run_benchmark(fake_server.url, items, warmup=2, prompt_mode=mode, concurrency=4 if closed else None,
                                       closed_loop=closed, ramp_s=0.02, on_record=seen.append))
    s = bc.summarize(run)
    assert s["completed"] == 12 and s["failed"] == 0 and len(seen) == 12
    assert all(r.output_tokens == 12 and len(r.itl_s) == 11 and r.ttft_s > 0 and r.tpot_s > 0 for r in run.records)
    if mode == "ids":
        assert [r.prompt_tokens for r in run.records] == [it.prompt_len for it in items]
    else:  # calibrated words: a byte tokenizer is 4 tokens a word, within a word of the target
        assert run.tokens_per_word == pytest.approx(4.0)
        assert all(abs(r.prompt_tokens - r.prompt_len) <= 4 for r in run.records)
    assert s["output_throughput"] > 0 and s["e2e_p99_s"] >= s["ttft_p99_s"] > 0


def test_failed_requests_are_recorded_not_raised(fake_server):
    items = [bc.BenchItem(0, 0.0, 5000, 4)]  # over the server's 1024-token context: a 400
    run = asyncio.run(bc.run_benchmark(fake_server.url, items, prompt_mode="ids"))
    assert not run.records[0].success and "400" in run.records[0].error


def test_twinfer_bench_cli(fake_server, tmp_path):
    from typer.testing import CliRunner

    from ui.cli import app

    pytest.importorskip("sim.workload")
    out = tmp_path / "records.jsonl"
    res = CliRunner().invoke(app, ["bench", "--url", fake_server.url, "--workload", "chat", "--requests", "6",
                                   "--rate", "50", "--input-len", "64", "--output-len", "8", "--warmup", "1",
                                   "--records", str(out), "--json", "--slo", "ttft_p99=10s,tpot_p99=1s"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    m = doc["metrics"]  # the SimMetrics schema of `twinfer simulate`
    assert m["requests_finished"] == 6 and m["requests_dropped"] == 0 and m["ttft_s"]["mean"] > 0
    assert m["output_throughput"] > 0 and m["output_tokens"] == 48 and doc["config"]["model"] == "fake"
    assert m["itl_s"]["count"] == 6 * 7 and m["tpot_s"]["p99"] > 0 and m["goodput_fraction"] == 1.0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 6 and all(x["success"] and x["output_tokens"] == 8 for x in lines)


@pytest.mark.parametrize("mode", ["text", "ids"])
def test_requests_over_the_context_are_clipped_to_fit(fake_server, mode):
    items = [bc.BenchItem(0, 0.0, 5000, 30), bc.BenchItem(1, 0.0, 100, 4)]
    run = asyncio.run(bc.run_benchmark(fake_server.url, items, prompt_mode=mode, max_model_len=1024))
    assert run.clipped == 1 and all(r.success for r in run.records), [r.error for r in run.records]
    assert run.records[0].prompt_tokens + run.records[0].output_tokens <= 1024
