"""`twinfer serve` on the real executor (tiny, dummy weights, CPU) under hostile input and shutdown.

One server subprocess for the module, started through the CLI; the last test stops it with
SIGTERM while streams are in flight. Needs torch (CPU is enough).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from executor.serve.launch import start_serve  # noqa: E402


def start_server(*extra: str, timeout_s: float = 240.0) -> tuple[subprocess.Popen, str]:
    """``twinfer serve --model tiny --load-format dummy --device cpu`` on a free port; (process, base URL)."""
    sp = start_serve(["--model", "tiny", "--load-format", "dummy", "--device", "cpu", "--port", "0", "--dtype", "fp32", *extra],
                     timeout_s=timeout_s)
    sp.proc.output = sp.output
    return sp.proc, sp.url


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = 60.0) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return -9
    return proc.returncode


def gauges(url: str) -> dict[str, float]:
    """twinfer:* gauges and counters of /metrics, by name (one model, labels summed)."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name.startswith("twinfer:") and not s.name.endswith("_created"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def read_sse(resp: httpx.Response) -> tuple[list[dict], bool]:
    """(JSON events, ended with [DONE]) of an SSE response read to its end."""
    events, done = [], False
    for line in resp.iter_lines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events, done


@pytest.fixture(scope="module")
def server():
    proc, url = start_server("--max-model-len", "512", "--drain-timeout", "1")
    yield proc, url
    stop_server(proc)


def _wait_idle(url: str, timeout_s: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        g = gauges(url)
        if g["twinfer:num_requests_running"] == 0 and g["twinfer:num_requests_waiting"] == 0 \
                and g["twinfer:kv_blocks_held"] == 0 and g["twinfer:http_requests_in_flight"] == 0:
            return g
        assert time.monotonic() < deadline, g
        time.sleep(0.1)


@pytest.mark.parametrize("param, value", [
    ("top_k", 10**30),        # overflowed the int64 tensor inside a step: killed the engine loop
    ("temperature", 1e-45),   # logits / T overflowed to inf: NaN probabilities in the sampler
    ("top_p", 1e-300),        # rounded to 0 in float32: no token left to sample
    ("seed", 2**64),          # torch.Generator takes 64 bits
])
def test_values_that_used_to_crash_the_engine_are_400(server, param, value):
    _, url = server
    r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, param: value}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert httpx.get(url + "/health").status_code == 200
    ok = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "temperature": 0.8, "top_p": 0.9},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_vllm_v1_metrics_come_from_the_real_engine(server):
    """Issue 19: the per-step families (queue/prefill/decode/inference time, iteration tokens, preemptions)
    come from the executor's step observer; they must be filled by a real request."""
    _, url = server
    r = httpx.post(url + "/v1/completions", json={"prompt": "hello there", "max_tokens": 4, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200
    samples = {s.name: s.value for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text)
               for s in fam.samples}
    for name in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_inference_time_seconds", "iteration_tokens_total", "inter_token_latency_seconds",
                 "request_prompt_tokens", "request_generation_tokens"):
        assert samples.get(f"vllm:{name}_count", 0) >= 1, name
    assert "vllm:num_preemptions_total" in samples
    assert samples["vllm:request_decode_time_seconds_sum"] > 0


def test_client_gone_mid_stream_frees_its_kv_blocks(server):
    _, url = server
    start = _wait_idle(url)
    prompt = list(range(300, 300 + 200))  # several full blocks: some enter the prefix cache
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", url + "/v1/completions",
                      json={"prompt": prompt, "max_tokens": 250, "stream": True, "ignore_eos": True}) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
            held = gauges(url)["twinfer:kv_blocks_held"]
            assert held >= 4  # 200 prompt tokens + output at 64 tokens a block
    end = _wait_idle(url)
    assert end["twinfer:request_success_total"] - start["twinfer:request_success_total"] == 1  # counted as an abort
    # blocks left used are prefix-cache blocks nobody holds: evictable, not leaked
    assert end["twinfer:kv_blocks_used"] == end["twinfer:kv_blocks_cached_unused"]


def test_sigterm_during_streams_ends_each_stream_cleanly_and_exits_0(server):
    proc, url = server
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []
    first_chunk = threading.Barrier(5, timeout=120)

    def client(i: int) -> None:
        try:
            with httpx.Client(timeout=120) as c:
                with c.stream("POST", url + "/v1/completions", json={
                        "prompt": f"stream {i}", "max_tokens": 400, "stream": True, "ignore_eos": True}) as r:
                    it = r.iter_lines()
                    line = next(it)
                    first_chunk.wait()
                    events, done = read_sse_rest(line, it)
                    results[i] = (events, done)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            first_chunk.abort()

    def read_sse_rest(first: str, it) -> tuple[list[dict], bool]:
        events, done = [json.loads(first[6:])], False
        for line in it:
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return events, done

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    first_chunk.wait()  # every stream has its first chunk
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    rc = proc.wait(timeout=60)
    took = time.monotonic() - t0
    assert not errors, errors
    assert rc == 0, "".join(proc.output[-20:])
    assert took < 45, took  # drain 1 s + abort flush + engine stop + interpreter exit
    for i, (events, done) in results.items():
        assert done, f"stream {i} was cut off without [DONE]"
        reasons = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
        assert reasons[-1] in ("abort", "length"), reasons[-3:]
    assert len(results) == 4
    with pytest.raises(httpx.ConnectError):  # the port is closed
        httpx.get(url + "/health", timeout=5)
