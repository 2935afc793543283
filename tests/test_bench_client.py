"""The benchmark client: arrivals, ramps, synthetic prompts, summaries, and a run against a fake server (no torch)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from executor import bench_client as bc
from executor.serve.app import create_app
from executor.serve.fake_engine import FakeEngine, FakeSamplingParams
from executor.serve.server import BackgroundServer
from executor.serve.tokenizer import ByteTokenizer


def test_bench_client_and_cli_modules_do_not_import_torch():
    code = ("import sys, executor.bench_client, ui.cmd_bench, ui.cmd_serve, executor.serve.app; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rescale_arrivals_keeps_shape_and_sets_rate():
    items = [bc.BenchItem(i, t, 10, 5) for i, t in enumerate([0.0, 1.0, 1.5, 4.0])]
    out = bc.rescale_arrivals(items, rate=3.0)
    times = [it.arrival_time for it in out]
    assert times[-1] == pytest.approx(1.0)  # (n - 1) / rate
    assert np.allclose(np.array(times) / times[-1], [0, 0.25, 0.375, 1.0])
    assert [it.arrival_time for it in bc.rescale_arrivals(items[:1], 2.0)] == [0.0]


def test_ramp_time_is_continuous_and_monotone():
    ts = np.linspace(0, 10, 1001)
    us = np.array([bc.ramp_time(t, 4.0) for t in ts])
    assert np.all(np.diff(us) > 0) and us[0] == 0
    assert bc.ramp_time(2.0, 4.0) == pytest.approx(4.0) and bc.ramp_time(6.0, 4.0) == pytest.approx(8.0)
    assert bc.ramp_time(3.3, 0.0) == 3.3


def test_prompts_share_words_exactly_where_blocks_are_shared():
    cal = bc.Calibration(per_word=4.0, overhead=1.0)  # a byte tokenizer: " the" is 4 tokens, plus BOS
    maker = bc.PromptMaker("text", block_size=16, calibration=cal)
    a = maker.prompt(bc.BenchItem(0, 0, 129, 1, block_hashes=(11, 22)))
    b = maker.prompt(bc.BenchItem(1, 0, 129, 1, block_hashes=(11, 33)))
    c = maker.prompt(bc.BenchItem(2, 0, 129, 1))
    wa, wb, wc = a.split(), b.split(), c.split()
    assert len(wa) == 32 and len(ByteTokenizer().encode(a)) == 128  # 32 words: 31 spaces + 96 letters + BOS
    assert wa[:4] == wb[:4] and wa[4:8] != wb[4:8] and wa[:4] != wc[:4]
    assert maker.prompt(bc.BenchItem(0, 0, 129, 1, block_hashes=(11, 22))) == a  # deterministic
    assert maker.prompt(bc.BenchItem(0, 0, 129, 1, block_hashes=(11, 22)), salt=1) != a


def test_id_prompts_have_the_exact_length():
    maker = bc.PromptMaker("ids", block_size=4)
    ids = maker.prompt(bc.BenchItem(3, 0, 37, 1, block_hashes=(1 << 62, 5)))
    assert len(ids) == 37 and all(32 <= t < 127 for t in ids)
    other = maker.prompt(bc.BenchItem(4, 0, 20, 1, block_hashes=(1 << 62, 6)))
    assert ids[:4] == other[:4] and ids[4:8] != other[4:8]


def test_fit_context_clips_to_the_server_limit():
    items = [bc.BenchItem(0, 0, 100, 10), bc.BenchItem(1, 0, 500, 10), bc.BenchItem(2, 0, 5, 900)]
    out, n = bc.fit_context(items, 256)
    assert n == 2 and out[0] == items[0]
    assert (out[1].prompt_len, out[1].output_len) == (246, 10)
    assert (out[2].prompt_len, out[2].output_len) == (1, 255)


def test_items_from_workload_requests():
    pytest.importorskip("sim.workload")
    from sim import workload as wl

    spec = wl.preset("chat", num_requests=5, rate=50.0)
    items = bc.items_from_requests(wl.generate(spec, np.random.default_rng(0), 16))
    assert [it.index for it in items] == list(range(5)) and items[0].arrival_time == 0.0
    assert all(it.prompt_len >= 1 and it.output_len >= 1 for it in items)


def test_summarize_numbers():
    recs = [bc.RequestRecord(i, 0.0, prompt_len=10, output_len=3, prompt_tokens=11, output_tokens=3, ttft_s=0.1 * (i + 1),
                             tpot_s=0.01, e2e_s=0.2, itl_s=[0.01, 0.01], success=True) for i in range(4)]
    recs.append(bc.RequestRecord(9, 0.0, prompt_len=10, output_len=3, success=False, error="boom"))
    s = bc.summarize(bc.BenchRun(recs, duration_s=2.0, model="m", url="u", prompt_mode="text"))
    assert (s["completed"], s["failed"], s["input_tokens"], s["output_tokens"]) == (4, 1, 44, 12)
    assert s["request_throughput"] == 2.0 and s["output_throughput"] == 6.0 and s["total_token_throughput"] == 28.0
    assert s["ttft_mean_s"] == pytest.approx(0.25) and s["ttft_p50_s"] == pytest.approx(0.25)
    assert s["itl_p99_s"] == pytest.approx(0.01) and s["e2e_p90_s"] == pytest.approx(0.2)


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
                                   "--records", str(out), "--json", "--slo-ttft-s", "10", "--slo-tpot-s", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    m = doc["metrics"]  # the SimMetrics schema of `twinfer simulate`
    assert m["requests_finished"] == 6 and m["requests_dropped"] == 0 and m["ttft_s"]["mean"] > 0
    assert m["output_throughput"] > 0 and m["output_tokens"] == 48 and doc["config"]["model"] == "fake"
    assert m["itl_s"]["count"] == 6 * 7 and m["tpot_s"]["p99"] > 0 and m["goodput_fraction"] == 1.0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 6 and all(x["success"] and x["output_tokens"] == 8 for x in lines)
