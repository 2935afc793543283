"""Hostile and careless clients (issue 20, items 2, 3, 5-8, 10, 11) and the server items of issue 19.

Fake engine, no torch: fast. Each test names the failure it keeps fixed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from executor.serve.fake_engine import FakeEngine  # noqa: E402
from executor.serve.guard import RateLimitedLog  # noqa: E402
from executor.serve.protocol import MAX_STOP_STRINGS  # noqa: E402
from test_reliability_serve import _counts, _error, _metrics, _read_stream, _serve, _wait  # noqa: E402


@pytest.fixture(scope="module")
def server():
    srv = _serve(FakeEngine(max_model_len=256, step_s=0.002), max_body_bytes=64 * 1024)
    yield srv
    srv.stop()


def _post(srv, body, path="/v1/completions", **kw):
    return httpx.post(srv.url + path, json=body, timeout=10, **kw)


def _addr(srv) -> tuple[str, int]:
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


# ----------------------------------------------------------------------------- 2: stop-string budget


def test_stop_strings_are_bounded_in_count_and_total_length(server):
    err = _error(_post(server, {"prompt": "x", "stop": ["ab"] * (MAX_STOP_STRINGS + 1)}), 400)
    assert err["param"] == "stop" and str(MAX_STOP_STRINGS) in err["message"]
    err = _error(_post(server, {"prompt": "x", "stop": ["a" * 20_000]}), 400)
    assert err["param"] == "stop"
    err = _error(_post(server, {"prompt": "x", "stop_token_ids": list(range(2000))}), 400)
    assert err["param"] == "stop_token_ids"
    assert _post(server, {"prompt": "x", "max_tokens": 2, "stop": ["zz"] * MAX_STOP_STRINGS}).status_code == 200


def test_a_body_of_tiny_values_is_refused_before_parsing():
    # 400 KB of one-character strings would be ~6 MB of Python objects; the value cap refuses it unparsed
    from executor.serve.inputs import max_json_values
    srv = _serve(FakeEngine(max_model_len=256), max_body_bytes=2**20)
    try:
        n = max_json_values(256) + 10
        body = b'{"prompt": "x", "stop": [' + b'"a",' * n + b'"a"]}'
        err = _error(httpx.post(srv.url + "/v1/completions", content=body,
                                headers={"content-type": "application/json"}), 400)
        assert err["code"] == "too_many_values"
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- 5: disconnects counted once


def test_a_non_streaming_client_that_leaves_is_one_abort_and_no_error():
    srv = _serve(FakeEngine(max_model_len=256, step_s=0.02))
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 200, "ignore_eos": True},
                       timeout=0.2)
        _wait(lambda: _counts(srv.url)[0].get("abort") == 1, what="the abort to be counted")
        time.sleep(0.2)
        done, rejected = _counts(srv.url)
        assert done == {"abort": 1.0} and rejected == {}, (done, rejected)
    finally:
        srv.stop()


def test_a_client_that_leaves_mid_upload_is_a_disconnect_not_an_internal_error():
    srv = _serve(FakeEngine())
    try:
        s = socket.create_connection(_addr(srv))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 1000\r\n\r\n{\"prompt\": ")
        time.sleep(0.2)
        s.close()
        _wait(lambda: _counts(srv.url)[1].get("client_disconnected") == 1, what="the disconnect to be counted")
        assert "internal_error" not in _counts(srv.url)[1]
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- 6: X-Request-Id reuse


class _StrictIdsEngine(FakeEngine):
    """Like the executor's engine: refuses a request id it still holds, and applies aborts at its next step
    (so right after a disconnect the old request is still there)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.live: set[str] = set()

    async def generate(self, request_id, prompt_token_ids, params):
        if request_id in self.live:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.live.add(request_id)
        try:
            async for out in super().generate(request_id, prompt_token_ids, params):
                yield out
        finally:
            loop = asyncio.get_running_loop()
            loop.call_later(self.step_s, self.live.discard, request_id)   # released one step later

    async def abort(self, request_id):
        await asyncio.sleep(self.step_s)
        await super().abort(request_id)


def test_reusing_an_x_request_id_right_after_a_disconnect_is_accepted():
    srv = _serve(_StrictIdsEngine(max_model_len=256, step_s=0.02))
    body = {"prompt": "x", "max_tokens": 100, "ignore_eos": True, "stream": True}
    try:
        with httpx.Client(timeout=10) as c:
            for _ in range(5):
                with c.stream("POST", srv.url + "/v1/completions", json=body, headers={"X-Request-Id": "same"}) as r:
                    next(r.iter_lines())
                r = c.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                           headers={"X-Request-Id": "same"})
                assert r.status_code == 200, r.text
                assert r.json()["id"] == "cmpl-same"
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- 7: slow clients


def test_slow_headers_get_408_and_a_closed_socket():
    srv = _serve(FakeEngine(), read_timeout_s=0.5)
    try:
        s = socket.create_connection(_addr(srv))
        s.settimeout(5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")   # headers never finish
        data = s.recv(4096)
        assert data.startswith(b"HTTP/1.1 408"), data
        assert b'"code": "timeout"' in data
        s.close()
        assert _post(srv, {"prompt": "x", "max_tokens": 2}).status_code == 200   # others are served meanwhile
    finally:
        srv.stop()


def test_a_trickled_body_is_cut_off_and_counted_as_a_disconnect():
    srv = _serve(FakeEngine(), read_timeout_s=0.5)
    try:
        s = socket.create_connection(_addr(srv))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 100\r\n\r\n{")
        t0 = time.monotonic()
        s.settimeout(5)
        for ch in b'"prompt"':   # one byte at a time, slower than the deadline allows
            try:
                s.sendall(bytes([ch]))
            except OSError:
                break
            time.sleep(0.1)
        while True:
            try:
                if not s.recv(4096):
                    break
            except OSError:
                break
        assert time.monotonic() - t0 < 4
        _wait(lambda: _counts(srv.url)[1].get("client_disconnected") == 1, what="the cut-off to be counted")
    finally:
        srv.stop()


def test_keep_alive_connections_also_get_the_read_deadline():
    srv = _serve(FakeEngine(), read_timeout_s=0.5)
    try:
        s = socket.create_connection(_addr(srv))
        s.settimeout(5)
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /health HTTP/1.1\r\n")   # the next request on the same connection stalls
        assert s.recv(4096).startswith(b"HTTP/1.1 408")
        s.close()
    finally:
        srv.stop()


def test_connections_past_the_cap_get_503_and_are_closed():
    srv = _serve(FakeEngine(), max_connections=4, read_timeout_s=30)
    held = []
    try:
        for _ in range(4):
            held.append(socket.create_connection(_addr(srv)))
            held[-1].sendall(b"GET /health HTTP/1.1\r\n")   # hold them, headers unfinished
        time.sleep(0.2)
        extra = socket.create_connection(_addr(srv))
        extra.settimeout(5)
        data = extra.recv(4096)
        assert data.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in data.lower(), data
        extra.close()
        for s in held:
            s.close()
        _wait(lambda: _post(srv, {"prompt": "x", "max_tokens": 2}).status_code == 200, what="service to resume")
    finally:
        srv.stop()


def test_headers_arriving_past_16_kib_are_refused():
    """h11 bounds headers still incomplete at 16 KiB (a whole head arriving in one read is parsed: so the
    bound on header memory is 16 KiB plus one read)."""
    srv = _serve(FakeEngine())
    try:
        s = socket.create_connection(_addr(srv))
        s.settimeout(5)
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        for _ in range(3):
            s.sendall(b"x-big: " + b"a" * 8000 + b"\r\n")
            time.sleep(0.05)
        data = s.recv(4096)
        assert data.startswith(b"HTTP/1.1 400") or data == b"", data
        s.close()
    finally:
        srv.stop()


def test_repeated_warnings_are_rate_limited():
    now = [0.0]
    f = RateLimitedLog(burst=3, window_s=10.0, clock=lambda: now[0])

    def rec(msg="Invalid HTTP request received."):
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, None, None)

    passed = [f.filter(rec()) for _ in range(100)]
    assert sum(passed) == 3
    assert f.filter(rec("another message"))   # other messages have their own budget
    now[0] = 11.0
    r = rec()
    assert f.filter(r) and "97 similar messages dropped" in r.getMessage()


# ----------------------------------------------------------------------------- 8: encodings


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "stop": ["\\udfff"]}', "stop[0]"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages[0].content"),
], ids=["completions-prompt", "stop", "chat"])
def test_lone_surrogates_are_400_naming_the_field(server, path, body, param):
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    err = _error(r, 400)
    assert err["param"] == param and err["code"] == "invalid_encoding"


def test_invalid_utf8_body_is_400(server):
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "\xc3\x28"}',
                   headers={"content-type": "application/json"})
    assert _error(r, 400)["code"] == "invalid_json"


# ----------------------------------------------------------------------------- 10: strict types, param set


@pytest.mark.parametrize("field, value", [
    ("max_tokens", True), ("stream", "yes"), ("stream", 1), ("seed", False), ("top_k", True), ("n", True),
    ("temperature", True), ("prompt", [1, True]), ("ignore_eos", "true"), ("stop", 3), ("max_tokens", "5"),
    ("max_tokens", 2.0),
])
def test_wrong_types_are_400_with_param_and_bools_are_not_ints(server, field, value):
    body = {"prompt": "x", "max_tokens": 2, field: value}
    err = _error(_post(server, body), 400)
    assert err["param"] == field, err


def test_stream_options_type_is_named(server):
    err = _error(_post(server, {"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}), 400)
    assert err["param"] == "stream_options.include_usage"


# ----------------------------------------------------------------------------- 11: docs behind the key


def test_api_docs_need_the_key_when_one_is_set():
    srv = _serve(FakeEngine(), api_key="sekret")
    try:
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
            assert httpx.get(srv.url + path).status_code == 401, path
        assert httpx.get(srv.url + "/openapi.json", headers={"Authorization": "Bearer sekret"}).status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- issue 19: refused fields


@pytest.mark.parametrize("field, value", [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
    ("response_format", {"type": "json_object"}), ("logit_bias", {"50": 10}), ("repetition_penalty", 1.2),
    ("repetition_penalty", True), ("min_tokens", 5), ("guided_json", {"type": "object"}), ("guided_regex", "a+"),
    ("guided_choice", ["a"]), ("functions", [{"name": "f"}]),
])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unimplemented_answer_changing_fields_are_refused(server, path, field, value):
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    err = _error(_post(server, {**body, "max_tokens": 2, field: value}, path), 400)
    assert err["param"] == field and err["code"] == "unsupported_parameter"


@pytest.mark.parametrize("field, value", [
    ("tools", []), ("response_format", {"type": "text"}), ("logit_bias", {}), ("repetition_penalty", 1.0),
    ("min_tokens", 0), ("guided_json", None), ("tool_choice", "none"),
])
def test_their_neutral_values_are_accepted(server, field, value):
    assert _post(server, {"prompt": "x", "max_tokens": 2, field: value}).status_code == 200


# ----------------------------------------------------------------------------- 3 + issue 19: draining


def test_draining_answers_503_with_retry_after_and_a_second_signal_still_ends_streams_cleanly():
    """A long drain (60 s) with streams running: a new request gets 503 + Retry-After (the listener stays
    open); a second signal cuts the drain short, and every stream still ends with abort and [DONE]."""
    srv = _serve(FakeEngine(max_model_len=4096, step_s=0.01), drain_timeout_s=60)
    body = {"prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    results: list[tuple[list[dict], bool]] = []

    def stream() -> None:
        with httpx.Client(timeout=30) as c, c.stream("POST", srv.url + "/v1/completions", json=body) as r:
            results.append(_read_stream(r))

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    _wait(lambda: srv.engine.stats().num_running == 4, what="four streams running")
    server = srv._server
    server.handle_exit(signal.SIGINT, None)          # first signal: drain
    _wait(lambda: srv.app.state.serve.draining, what="the drain to start")
    r = _post(srv, {"prompt": "x", "max_tokens": 2})
    err = _error(r, 503)
    assert err["code"] == "shutting_down" and r.headers["retry-after"] == "1"
    assert httpx.get(srv.url + "/health").status_code == 503
    t0 = time.monotonic()
    server.handle_exit(signal.SIGINT, None)          # second signal: hurry, but cleanly
    for t in threads:
        t.join(timeout=20)
    assert time.monotonic() - t0 < 10
    assert len(results) == 4
    for chunks, done in results:
        assert done, "a stream ended without [DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    srv._thread.join(timeout=20)
    assert not srv._thread.is_alive()
    assert srv.engine.shut_down                      # the lifespan still stopped the engine
    srv._sock.close()


# ----------------------------------------------------------------------------- issue 19: vLLM v1 metrics


def test_vllm_v1_request_metrics_are_exported(server):
    assert _post(server, {"prompt": "hello", "max_tokens": 5, "ignore_eos": True}).status_code == 200
    m = _metrics(server.url)
    names = {k[0] for k in m}
    for name in ("inter_token_latency_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert f"vllm:{name}_count" in names, name
    assert m[("vllm:request_generation_tokens_sum", ())] >= 5


def test_step_metrics_from_the_executor_observer():
    """iteration_tokens, num_preemptions and the queue/prefill/decode times come from the executor's
    step observer; the fake engine has none, so drive the metrics object with the seam's types."""
    from executor.serve.prom import ServeMetrics
    from prometheus_client import generate_latest
    from scheduler.plan import ScheduledChunk, StepPlan
    from scheduler.request import Request

    class _Stats:
        num_running = num_waiting = kv_used_blocks = kv_total_blocks = prefix_cache_queries = 0
        prefix_cache_hits = prompt_tokens_total = generation_tokens_total = 0

    metrics = ServeMetrics(lambda: _Stats(), "m", max_model_len=1024)
    done = Request(request_id="a", arrival_time=1.0, prompt_len=10, output_len=3)
    done.first_scheduled_time, done.first_token_time, done.finish_time = 1.5, 2.0, 3.0
    other = Request(request_id="b", arrival_time=1.0, prompt_len=10, output_len=3)
    plan = StepPlan(0, prefills=[ScheduledChunk(other, 10, 0, True)], decodes=[done], preempted=[other])
    metrics.request_started("a")   # the phases are the app's requests', observed once, when the app ends them
    metrics.observe_step(0.0, plan, None, now=9.0)   # a finished request keeps its own finish_time
    metrics.request_ended("a", finished=True)
    text = generate_latest(metrics.registry).decode()
    assert 'vllm:num_preemptions_total{model_name="m"} 1.0' in text
    assert 'vllm:iteration_tokens_total_sum{model_name="m"} 11.0' in text
    for phase, value in (("queue", 0.5), ("prefill", 0.5), ("decode", 1.0), ("inference", 1.5)):
        assert f'vllm:request_{phase}_time_seconds_sum{{model_name="m"}} {value}' in text, phase
