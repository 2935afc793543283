"""`twinfer serve` on the real executor (tiny model, dummy weights, CPU) driven by real clients.

One server subprocess for the module, started through the CLI exactly as a user would; it
prints its URL once the engine is up. Needs torch (CPU is enough).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("executor.async_engine")

import openai  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from executor.serve.launch import start_serve  # noqa: E402

MAX_LEN = 512


@pytest.fixture(scope="module")
def server():
    try:
        sp = start_serve(["--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--port", "0",
                          "--max-model-len", str(MAX_LEN), "--dtype", "fp32"], timeout_s=180)
    except RuntimeError as e:
        pytest.fail(str(e))
    yield sp.url
    sp.stop()  # graceful: uvicorn drains, the lifespan shuts the engine down


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def _metrics(url: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)}


def _gauge(url: str, name: str) -> float:
    return _metrics(url)[name].samples[0].value


def test_models_lists_tiny(server):
    data = httpx.get(server + "/v1/models").json()["data"]
    assert data[0]["id"] == "tiny" and data[0]["max_model_len"] == MAX_LEN


def test_completion_and_usage(client):
    r = client.completions.create(model="tiny", prompt="hello world", max_tokens=12, extra_body={"ignore_eos": True})
    assert r.id.startswith("cmpl-") and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (12, 12, 24)  # BOS + 11 bytes


def test_completion_stream_usage_matches(client):
    chunks = list(client.completions.create(model="tiny", prompt=[256, 104, 105], max_tokens=10, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.prompt_tokens == 3 and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_whole_and_streamed(client):
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, extra_body={"ignore_eos": True})
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_seeded_sampling_repeats_and_greedy_stop_string_cuts(client):
    kw = dict(model="tiny", prompt="abc", max_tokens=24, extra_body={"ignore_eos": True})
    a = client.completions.create(temperature=0.9, seed=7, **kw).choices[0].text
    b = client.completions.create(temperature=0.9, seed=7, **kw).choices[0].text
    assert a == b
    full = client.completions.create(temperature=0.0, **kw).choices[0].text
    if len(full) < 4:
        pytest.skip("random weights printed too little text to pick a stop string from")
    stop = full[2:4]
    cut = client.completions.create(temperature=0.0, stop=[stop], **kw).choices[0]
    assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop"


def test_bad_requests_are_400(server):
    r = httpx.post(server + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server + "/v1/completions", json={"prompt": "x", "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = httpx.post(server + "/v1/completions", json={"prompt": "x" * (MAX_LEN + 10)})
    assert r.status_code == 400 and str(MAX_LEN) in r.json()["error"]["message"]


def test_client_disconnect_frees_the_request(server):
    body = {"prompt": "x", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", server + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
            assert _gauge(server, "vllm:num_requests_running") == 1
    deadline = time.monotonic() + 10
    while _gauge(server, "vllm:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the engine kept running the abandoned request"
        time.sleep(0.05)
    assert _gauge(server, "vllm:num_requests_waiting") == 0


def test_metrics_after_traffic(server, client):
    client.completions.create(model="tiny", prompt="metrics", max_tokens=4, extra_body={"ignore_eos": True})
    fams = _metrics(server)
    ttft = fams["vllm:time_to_first_token_seconds"]
    assert next(s.value for s in ttft.samples if s.name.endswith("_count")) >= 1
    assert fams["twinfer:generation_tokens"].samples[0].value >= 4
    assert 0.0 <= fams["vllm:kv_cache_usage_perc"].samples[0].value <= 1.0


def test_twinfer_bench_against_the_server(server, tmp_path):
    out = tmp_path / "rec.jsonl"
    res = subprocess.run([sys.executable, "-m", "ui.cli", "bench", "--url", server, "--workload", "chat",
                          "--requests", "6", "--rate", "20", "--input-len", "48", "--output-len", "8", "--warmup", "1",
                          "--records", str(out), "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    m = json.loads(res.stdout)["metrics"]
    assert m["requests_finished"] == 6 and m["requests_dropped"] == 0
    assert m["ttft_s"]["mean"] > 0 and m["tpot_s"]["mean"] > 0 and m["output_throughput"] > 0
    assert m["output_tokens"] == 48
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(abs(r["prompt_tokens"] - 48) <= 4 for r in recs)  # calibrated words: within a word
