"""Serve under bad input, overload, vanishing clients and shutdown (fake engine, no torch: fast).

Every request must end one of three ways: done, rejected with an OpenAI-style error that says
why, or aborted by its own client (or by shutdown) with its stream still ending cleanly.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from executor.serve.app import create_app  # noqa: E402
from executor.serve.fake_engine import FakeEngine, FakeSamplingParams  # noqa: E402
from executor.serve.server import BackgroundServer  # noqa: E402
from executor.serve.tokenizer import ByteTokenizer  # noqa: E402


def _serve(engine: FakeEngine, read_timeout_s: float = 30.0, max_connections: int | None = None, **kw) -> BackgroundServer:
    tok = ByteTokenizer(512, eos_token_id=engine.eos_token_id)
    kw.setdefault("sampling_params_cls", FakeSamplingParams)
    app = create_app(engine, tok, served_model_name="fake", **kw)
    srv = BackgroundServer(app, read_timeout_s=read_timeout_s, max_connections=max_connections).start()
    srv.app, srv.engine = app, engine
    return srv


@pytest.fixture(scope="module")
def server():
    srv = _serve(FakeEngine(max_model_len=256, step_s=0.002), max_body_bytes=64 * 1024)
    yield srv
    srv.stop()


def _metrics(url: str, headers: dict | None = None) -> dict[tuple, float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = httpx.get(url + "/metrics", headers=headers).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))] = s.value
    return out


def _counts(url: str, headers: dict | None = None) -> tuple[dict, dict]:
    """(finished by reason, rejected by reason) from the twinfer counters."""
    m = _metrics(url, headers)
    done = {dict(k[1])["finished_reason"]: v for k, v in m.items() if k[0] == "twinfer:request_success_total"}
    rej = {dict(k[1])["reason"]: v for k, v in m.items() if k[0] == "twinfer:request_rejected_total"}
    return done, rej


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def _wait(cond, timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("body, code", [
    (b"", "invalid_json"),
    (b"\xff\xfe not utf-8", "invalid_json"),
    (b'{"prompt": "x", "temperature": NaN}', "invalid_json"),
    (b'{"prompt": "x", "top_p": Infinity}', "invalid_json"),
    (b'{"prompt": "x", "max_tokens": -Infinity}', "invalid_json"),
    (b"[" * 20_000 + b"]" * 20_000, "invalid_json"),  # deep nesting: RecursionError in json, not a 500
    (b"[1, 2, 3]", None),
    (b'"just a string"', None),
    (b"null", None),
], ids=["empty", "not-utf8", "nan", "infinity", "minus-infinity", "deep-nesting", "array", "string", "null"])
def test_garbage_bodies_are_400(server, body, code):
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    err = _error(r, 400)
    assert err["type"] == "invalid_request_error" and err["code"] == code


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": 2**40}, "top_k"),
    ({"prompt": "x", "seed": 2**64}, "seed"),
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": [], "max_tokens": 1}, "prompt"),
    ({"prompt": [[1], [2]]}, "prompt"),
    ({"prompt": {"a": 1}}, "prompt"),
    ({}, "prompt"),
])
def test_invalid_parameters_name_the_parameter(server, body, param):
    err = _error(httpx.post(server.url + "/v1/completions", json=body), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_unknown_route_and_wrong_method_answer_in_openai_shape(server):
    assert _error(httpx.get(server.url + "/v1/nope"), 404)["type"] == "not_found_error"
    assert _error(httpx.get(server.url + "/v1/completions"), 405)["type"] == "invalid_request_error"


def test_oversized_bodies_are_413_declared_or_chunked(server):
    big = json.dumps({"prompt": "x" * 100_000}).encode()
    err = _error(httpx.post(server.url + "/v1/completions", content=big, headers={"content-type": "application/json"}), 413)
    assert err["code"] == "request_too_large" and "65536" in err["message"]

    def chunks():  # no Content-Length: the app counts as it reads
        yield b'{"prompt": "'
        for _ in range(100):
            yield b"y" * 1000
        yield b'"}'

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert _error(r, 413)["code"] == "request_too_large"


# ----------------------------------------------------------------------------- overload


def test_full_queue_answers_429_with_retry_after():
    srv = _serve(FakeEngine(step_s=0.01), max_queue=2, retry_after_s=3)
    try:
        with httpx.Client(timeout=10) as c:
            streams = [c.stream("POST", srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 60, "stream": True})
                       for _ in range(2)]
            opened = [s.__enter__() for s in streams]
            lines = [r.iter_lines() for r in opened]
            for it in lines:
                next(it)
            busy = c.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
            err = _error(busy, 429)
            assert busy.headers["retry-after"] == "3" and err["code"] == "rate_limit_exceeded"
            for s in streams:
                s.__exit__(None, None, None)
        _wait(lambda: srv.app.state.serve.inflight == 0, what="slots released")
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert ok.status_code == 200  # the queue drains and admission resumes
        _, rej = _counts(srv.url)
        assert rej.get("rate_limit_exceeded") == 1
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- auth


def test_api_key_guards_api_and_metrics_not_health():
    srv = _serve(FakeEngine(), api_key="s3cret")
    try:
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(srv.url + path)
            assert _error(r, 401)["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
            assert httpx.get(srv.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert httpx.get(srv.url + path, headers={"Authorization": "s3cret"}).status_code == 401
            assert httpx.get(srv.url + path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200
        _, rej = _counts(srv.url, {"Authorization": "Bearer s3cret"})
        assert rej["invalid_api_key"] == 6
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- vanishing clients


def test_clients_that_vanish_free_their_slots_and_kv(server):
    st, engine = server.app.state.serve, server.engine
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "hello", "max_tokens": 200, "stream": True}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    before_done, _ = _counts(server.url)
    # mid-stream, before the first byte, and half-way through sending the body
    with httpx.Client(timeout=10) as c:
        with c.stream("POST", server.url + "/v1/completions", content=body, headers={"content-type": "application/json"}) as r:
            it = r.iter_lines()
            for _ in range(5):
                next(it)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head + body)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head + body[:10])
    _wait(lambda: st.inflight == 0 and not st.engine_ids, what="slots released")
    _wait(lambda: engine.stats().num_running == 0 and engine.stats().kv_held_blocks == 0, what="engine idle")
    done, _ = _counts(server.url)
    assert done.get("abort", 0) - before_done.get("abort", 0) == 2  # the half-sent one never reached the engine


# ----------------------------------------------------------------------------- health and shutdown


class _DeadEngine(FakeEngine):
    errored = RuntimeError("engine step failed: CUDA error")


def test_health_and_admission_report_a_dead_engine():
    srv = _serve(_DeadEngine())
    try:
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and "CUDA error" in r.json()["error"]
        err = _error(httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}), 503)
        assert err["code"] == "engine_failed"
    finally:
        srv.stop()


def _read_stream(resp: httpx.Response) -> tuple[list[dict], bool]:
    """(JSON events, whether it ended with [DONE]) of an SSE response read to its end."""
    events, done = [], False
    for line in resp.iter_lines():
        if line.startswith("data: "):
            if line == "data: [DONE]":
                done = True
            else:
                events.append(json.loads(line[6:]))
    return events, done


def test_shutdown_finishes_short_streams_and_aborts_long_ones_cleanly():
    srv = _serve(FakeEngine(max_model_len=100_000, step_s=0.01, max_running=16), drain_timeout_s=1.0)
    st = srv.app.state.serve
    results: dict[str, tuple] = {}

    def stream(name: str, max_tokens: int) -> None:
        with httpx.Client(timeout=20) as c:
            with c.stream("POST", srv.url + "/v1/completions",
                          json={"prompt": "x", "max_tokens": max_tokens, "stream": True}) as r:
                results[name] = _read_stream(r)

    threads = [threading.Thread(target=stream, args=(f"short{i}", 40)) for i in range(3)]
    threads += [threading.Thread(target=stream, args=(f"long{i}", 5000)) for i in range(3)]
    with httpx.Client(timeout=10) as idle:
        assert idle.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 200
        for t in threads:
            t.start()
        _wait(lambda: st.inflight == 6, what="six streams in flight")
        t0 = time.monotonic()
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        _wait(lambda: st.draining, what="draining")
        # a kept-alive connection may still ask while the server drains: 503, with Retry-After
        late = idle.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert _error(late, 503)["code"] == "shutting_down" and late.headers["retry-after"]
        for t in threads:
            t.join(timeout=20)
        stopper.join(timeout=20)
    assert time.monotonic() - t0 < 8
    for name, (events, done) in results.items():
        assert done, name  # every stream ends with [DONE], none is cut off
        reasons = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
        assert reasons[-1] == ("length" if name.startswith("short") else "abort"), (name, reasons[-3:])
    assert len(results) == 6 and st.inflight == 0 and srv.engine.shut_down


def test_every_request_is_accounted_for(server):
    """Sent = finished (stop/length/abort) + rejected, as the server itself counts them."""
    done0, rej0 = _counts(server.url)
    sent = 0
    with httpx.Client(timeout=10) as c:
        for body in ({"prompt": "a", "max_tokens": 3}, {"prompt": "b", "max_tokens": 2, "stream": True},
                     {"prompt": "x" * 300}, {"prompt": "x", "n": 5}, {"prompt": "x", "model": "other"}):
            c.post(server.url + "/v1/completions", json=body)
            sent += 1
        c.post(server.url + "/v1/completions", content=b"{oops", headers={"content-type": "application/json"})
        c.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        sent += 2
        with c.stream("POST", server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100, "stream": True}) as r:
            next(r.iter_lines())
        sent += 1
    _wait(lambda: server.app.state.serve.inflight == 0, what="idle")
    done, rej = _counts(server.url)
    delta = sum(done.values()) - sum(done0.values()) + sum(rej.values()) - sum(rej0.values())
    assert delta == sent
    assert done.get("abort", 0) - done0.get("abort", 0) == 1
    assert rej.get("context_length_exceeded", 0) - rej0.get("context_length_exceeded", 0) == 1
    assert rej.get("invalid_json", 0) - rej0.get("invalid_json", 0) == 1
    assert rej.get("model_not_found", 0) - rej0.get("model_not_found", 0) == 1
