"""The HTTP app over a fake engine (no torch): OpenAI client, streaming, stops, errors, aborts, metrics."""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

# the serve extra; skipped where it is not installed
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from executor.serve.app import create_app  # noqa: E402
from executor.serve.fake_engine import _TEXT, FakeEngine, FakeSamplingParams, FakeTokenOutput  # noqa: E402
from executor.serve.server import BackgroundServer  # noqa: E402
from executor.serve.tokenizer import ByteTokenizer  # noqa: E402

TEXT = _TEXT


def _serve(engine: FakeEngine, **kw) -> BackgroundServer:
    tok = ByteTokenizer(512, eos_token_id=engine.eos_token_id)
    app = create_app(engine, tok, served_model_name="fake", sampling_params_cls=FakeSamplingParams, **kw)
    srv = BackgroundServer(app).start()
    srv.app = app
    return srv


@pytest.fixture(scope="module")
def server():
    engine = FakeEngine(max_model_len=256, step_s=0.002)
    srv = _serve(engine)
    srv.engine = engine
    yield srv
    srv.stop()
    assert engine.shut_down


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _wait_idle(engine, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = engine.stats()
        if s.num_running == 0 and s.num_waiting == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine still busy: {engine.stats()}")


def test_completion_text_and_usage(server, client):
    r = client.completions.create(model="fake", prompt="hello", max_tokens=20)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == "fake"
    assert r.choices[0].text == TEXT[:20] and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (6, 20, 26)  # BOS + 5 bytes


def test_completion_stream_matches_whole_response(client):
    chunks = list(client.completions.create(model="fake", prompt=[1, 2, 3], max_tokens=70, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == TEXT.encode()[:70].decode("utf-8", errors="replace")
    assert "\ufffd" not in text  # the 2-byte umlauts arrive whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 70 and chunks[-1].usage.prompt_tokens == 3


def test_chat_whole_and_streamed(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="fake", messages=msgs, max_completion_tokens=9)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == TEXT[:9]
    assert r.usage.completion_tokens == 9
    assert r.usage.prompt_tokens == len(ByteTokenizer().encode_chat(msgs))
    chunks = list(client.chat.completions.create(model="fake", messages=msgs, max_tokens=9, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT[:9]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == r.usage.total_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_text_and_aborts_the_engine(server, client, stream):
    kw = dict(model="fake", prompt="x", max_tokens=100, stop=["fox", "zzz"])
    if stream:
        chunks = list(client.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(**kw)
        text, reason = r.choices[0].text, r.choices[0].finish_reason
    assert text == "The quick brown " and reason == "stop"
    _wait_idle(server.engine)


def test_stop_token_ids_go_to_the_engine(client):
    r = client.completions.create(model="fake", prompt="x", max_tokens=50, extra_body={"stop_token_ids": [ord(" ")]})
    # as in vLLM, a stop token's text stays in the output (special tokens print nothing anyway)
    assert r.choices[0].text == "The " and r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 4


def test_models_and_health(server):
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"] == "fake" and models["data"][0]["max_model_len"] == 256
    assert httpx.get(server.url + "/health").status_code == 200


def test_request_id_is_honoured_and_echoed(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"X-Request-Id": "abc123"})
    assert r.headers["x-request-id"] == "abc123" and r.json()["id"] == "cmpl-abc123"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.headers["x-request-id"] and r.json()["id"] == "cmpl-" + r.headers["x-request-id"]


def test_a_utf8_request_id_reads_as_sent_and_other_bytes_are_400(server):
    # the header was read as latin-1: `éx` came back as the id `cmpl-Ã©x` (the header itself echoed right)
    rid = "éx-€"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                   headers=[(b"X-Request-Id", rid.encode())])
    assert r.status_code == 200 and r.json()["id"] == "cmpl-" + rid
    assert (b"x-request-id", rid.encode()) in r.headers.raw   # the bytes sent, echoed
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                   headers=[(b"X-Request-Id", b"\xe9x")])
    err = _assert_openai_error(r, 400, None)
    assert err["code"] == "invalid_request_id" and "X-Request-Id" in err["message"]


def _assert_openai_error(r: httpx.Response, status: int, param: str | None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and err["message"]
    return err


def test_malformed_json_is_400(server):
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"})
    err = _assert_openai_error(r, 400, None)
    assert err["type"] == "invalid_request_error" and "JSON" in err["message"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_k": 0}, "top_k"),
    ("/v1/completions", {"prompt": [1, 9999]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 3}, "n"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
])
def test_bad_params_are_400(server, path, body, param):
    _assert_openai_error(httpx.post(server.url + path, json=body), 400, param)


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="fake", prompt="x", n=2)
    assert info.value.body["param"] == "n"


def test_prompt_over_the_context_limit_is_400(server):
    err = _assert_openai_error(httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 300}), 400, "prompt")
    assert "256" in err["message"] and err["code"] == "context_length_exceeded"
    err = _assert_openai_error(httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 200, "max_tokens": 100}),
                               400, "max_tokens")
    assert "256" in err["message"]


def test_the_default_max_tokens_fits_what_the_context_leaves(server):
    # 16 (OpenAI's default) past the context was a 400 naming max_tokens, a field the client never sent
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 250})   # BOS + 250: 5 tokens of room
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5 and r.json()["choices"][0]["finish_reason"] == "length"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 254})   # one token of room
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    # sent, the same 16 is the client's own: still the 400
    err = _assert_openai_error(httpx.post(server.url + "/v1/completions", json={"prompt": "x" * 250, "max_tokens": 16}),
                               400, "max_tokens")
    assert "you requested 267 tokens (251 in the prompt, 16 for the completion)" in err["message"]


def test_chat_budget_over_the_context_names_the_field_sent(server):
    # max_completion_tokens was blamed on max_tokens, a field the client never sent
    msgs = [{"role": "user", "content": "x"}]
    for field in ("max_completion_tokens", "max_tokens"):
        err = _assert_openai_error(httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, field: 300}),
                                   400, field)
        assert err["code"] == "context_length_exceeded"


def test_unknown_model_is_404(server):
    _assert_openai_error(httpx.post(server.url + "/v1/completions", json={"prompt": "x", "model": "gpt-9"}), 404, "model")


def test_client_disconnect_mid_stream_aborts(server):
    engine = server.engine
    body = {"prompt": "x", "max_tokens": 200, "stream": True}
    with httpx.Client(timeout=10) as c:
        with c.stream("POST", server.url + "/v1/completions", json=body, headers={"X-Request-Id": "gone"}) as r:
            lines = r.iter_lines()
            for _ in range(6):
                next(lines)
            assert engine.stats().num_running == 1
    _wait_idle(engine)
    assert any(a.startswith("cmpl-gone-") for a in engine.aborted)


def test_client_disconnect_before_a_whole_response_aborts(server):
    engine = server.engine
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 200},
                   headers={"X-Request-Id": "impatient"}, timeout=0.1)
    _wait_idle(engine)
    assert any(a.startswith("cmpl-impatient-") for a in engine.aborted)


def test_metrics_parse_with_vllm_and_twinfer_names(server, client):
    client.completions.create(model="fake", prompt="hello", max_tokens=5)
    text = httpx.get(server.url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for prefix in ("vllm", "twinfer"):
        for name in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
            assert fams[f"{prefix}:{name}"].type == "histogram"
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            assert fams[f"{prefix}:{name}"].type == "gauge"
        # the parser drops a counter's _total suffix from the family name
        for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens", "request_success"):
            assert fams[f"{prefix}:{name}"].type == "counter"
    ttft_count = next(s.value for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count"))
    assert ttft_count >= 1
    gen = next(s.value for s in fams["vllm:generation_tokens"].samples)
    assert gen >= 5
    ok = {s.labels["finished_reason"]: s.value for s in fams["vllm:request_success"].samples if s.name.endswith("_total")}
    assert ok.get("length", 0) >= 1


def test_api_key_guards_v1_only():
    engine = FakeEngine()
    srv = _serve(engine, api_key="sekret")
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0)
        assert ok.completions.create(model="fake", prompt="x", max_tokens=1).usage.completion_tokens == 1
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        srv.stop()


def test_max_queue_answers_429():
    engine = FakeEngine(step_s=0.01)
    srv = _serve(engine, max_queue=1)
    try:
        with httpx.Client(timeout=10) as c:
            with c.stream("POST", srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 50, "stream": True}) as r:
                lines = r.iter_lines()  # keep it: a dropped line iterator closes the stream
                next(lines)
                busy = c.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
                assert busy.status_code == 429 and busy.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_engine_refusal_is_400(server, monkeypatch, stream):
    from twinfer.errors import TwinferError

    async def refuse(request_id, prompt_token_ids, params):
        raise TwinferError("request refused: no KV blocks could ever hold it")
        yield  # an async generator, like the engine's

    monkeypatch.setattr(server.engine, "generate", refuse)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "stream": stream})
    if stream:  # the status line is already out: the error arrives as an event
        events = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert "refused" in events[0] and events[-1] == "data: [DONE]"
    else:
        assert _assert_openai_error(r, 400, None)["message"].startswith("request refused")


def test_in_flight_slots_are_released_however_streams_end(server):
    # streams that finish, stop early, or lose their client all give their slot back
    st = server.app.state.serve
    with httpx.Client(timeout=10) as c:
        with c.stream("POST", server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
        c.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True})
        c.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 30, "stop": ["q"], "stream": True})
    # a client that sends its request and hangs up at once, before any chunk
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "x", "max_tokens": 100, "stream": True}).encode()
    for _ in range(5):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.monotonic() + 5
    while st.inflight or st.engine_ids:
        assert time.monotonic() < deadline, (st.inflight, st.engine_ids)
        time.sleep(0.02)


def test_bench_client_takes_the_v1_url_serve_prints(server):
    """`twinfer serve` prints http://host:port/v1; `twinfer bench --url` must accept it as given."""
    import asyncio

    from executor.bench_client import server_info, server_root

    assert server_root("http://h:1/v1/") == server_root("http://h:1/") == "http://h:1"
    for url in (server.url, server.url + "/", server.url + "/v1", server.url + "/v1/"):
        model, max_len = asyncio.run(server_info(url))
        assert max_len is not None and model, url


class _MultiTokenEngine(FakeEngine):
    """The fake with the executor's hooks (``step_observer``, ``now``): each request gets ``_TEXT`` in outputs of
    many tokens (as multi-step decode or MTP hand them out), each step reported with the scheduler's Request on a
    scripted clock: scheduled 1 s after arrival, tokens at +2 s (9) and +5 s (16), the last 5 and a finish at +6 s.
    An abort applies a step later, as with async overlap (the step in flight still runs the request)."""

    def __init__(self):
        super().__init__()
        self.step_observer = None
        self.clock = 0.0
        self._reqs = {}

    def now(self) -> float:
        return self.clock

    async def abort(self, request_id: str) -> None:
        from scheduler.plan import StepPlan

        req = self._reqs.pop(request_id)
        self.clock += 1
        self.step_observer(self.clock, StepPlan(0, decodes=[req]), None)

    async def generate(self, request_id, prompt_token_ids, params):
        from scheduler.plan import StepPlan
        from scheduler.request import Request

        data, t0 = _TEXT.encode(), self.clock
        req = self._reqs[request_id] = Request(request_id, arrival_time=t0, prompt_len=len(prompt_token_ids),
                                               output_len=30)
        req.first_scheduled_time = t0 + 1
        for at, ids in ((2, data[:9]), (5, data[9:25]), (6, data[25:30])):
            self.clock = t0 + at
            req.first_token_time = req.first_token_time or self.clock
            last = at == 6
            if last:
                req.finish_time = self.clock
            self._stats.generation_tokens_total += len(ids)   # the engine counts every token it made
            self.step_observer(self.clock, StepPlan(0, decodes=[req]), None)
            yield FakeTokenOutput(request_id, list(ids), last, "length" if last else None, len(prompt_token_ids))


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_finish_is_observed_and_counts_only_kept_tokens(stream):
    # a stop string completed mid-output: the 6 tokens after it were neither counted in usage nor in
    # generation_tokens_total, and the request was missing from the queue/prefill/decode histograms
    srv = _serve(_MultiTokenEngine())
    try:
        body = {"prompt": "x", "max_tokens": 100, "stop": ["fox"], "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        r = httpx.post(srv.url + "/v1/completions", json=body)
        if stream:
            events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
            text = "".join(c["text"] for e in events for c in e["choices"])
            usage = events[-1]["usage"]
        else:
            text, usage = r.json()["choices"][0]["text"], r.json()["usage"]
        assert text == "The quick brown " and usage["completion_tokens"] == len("The quick brown fox")
        # a request the engine finishes is observed as before, once
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100}).json()["usage"][
            "completion_tokens"] == 30
        m = {(s.name, s.labels.get("finished_reason")): s.value
             for f in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text) for s in f.samples}
        assert m[("vllm:generation_tokens_total", None)] == 19 + 30          # the engine made 25 + 30
        assert m[("vllm:request_generation_tokens_sum", None)] == 19 + 30
        assert m[("vllm:request_success_total", "stop")] == m[("vllm:request_success_total", "length")] == 1
        # stop: queue 1, prefill 1, decode 5 - 2, inference 5 - 1; length: the same, to its finish at 6
        for phase, total in (("queue", 2.0), ("prefill", 2.0), ("decode", 3.0 + 4.0), ("inference", 4.0 + 5.0)):
            assert m[(f"vllm:request_{phase}_time_seconds_count", None)] == 2, phase
            assert m[(f"vllm:request_{phase}_time_seconds_sum", None)] == total, phase
    finally:
        srv.stop()


@pytest.mark.parametrize("path, body, param, says", [
    # vLLM's rules: top_logprobs asks for logprobs; stream_options describe a stream
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs",
     "`logprobs` must be set to true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2, "logprobs": False},
     "top_logprobs", "`logprobs` must be set to true"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2, "logprobs": True},
     "logprobs", "not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": -1}, "top_logprobs",
     "greater than or equal to 0"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
     "only be defined when `stream=True`"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": False,
                              "stream_options": {"include_usage": False}}, "stream_options", "`stream=True`"),
    ("/v1/completions", {"prompt": "x", "stream": "yes", "stream_options": {"include_usage": True}}, "stream", "bool"),
])
def test_options_without_what_they_qualify_are_400(server, path, body, param, says):
    err = _assert_openai_error(httpx.post(server.url + path, json=body), 400, param)
    assert says in err["message"], err


def test_neutral_top_logprobs_and_stream_options_are_accepted(server):
    msgs = [{"role": "user", "content": "x"}]
    for extra in ({"top_logprobs": 0}, {"top_logprobs": None}, {"stream_options": None}, {"stream_options": {}}):
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, **extra})
        assert r.status_code == 200, (extra, r.text)


def test_retrieve_model_by_id(server):
    listed = httpx.get(server.url + "/v1/models").json()["data"][0]
    got = httpx.get(server.url + "/v1/models/fake").json()
    assert {k: v for k, v in got.items() if k != "created"} == {k: v for k, v in listed.items() if k != "created"}
    assert set(got) == set(listed) and got["object"] == "model"
    for missing in ("gpt-9", "fake/x", "org/fake"):
        err = _assert_openai_error(httpx.get(server.url + "/v1/models/" + missing), 404, "model")
        assert f"`{missing}`" in err["message"] and err["code"] == "model_not_found"


def test_retrieve_model_whose_id_has_a_slash():
    from fastapi.testclient import TestClient

    app = create_app(FakeEngine(), ByteTokenizer(512), served_model_name="org/model",
                     sampling_params_cls=FakeSamplingParams)
    with TestClient(app) as c:
        assert c.get("/v1/models/org/model").json()["id"] == "org/model"
        assert c.get("/v1/models/org").status_code == 404


def test_a_large_prompt_is_parsed_and_tokenized_off_the_event_loop():
    """A ~30 MB prompt took ~1 s to tokenize on the event loop, stalling every open stream for that second. Past
    OFF_LOOP_SIZE the body's JSON and the prompt's tokens are made in a worker thread; small ones stay inline."""
    import threading

    from executor.serve.app import OFF_LOOP_SIZE

    class Recording(ByteTokenizer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.threads: list[int] = []

        def encode(self, text, add_special_tokens=True):
            self.threads.append(threading.get_ident())
            return super().encode(text, add_special_tokens)[:8]   # a short prompt for the engine either way

    engine = FakeEngine(max_model_len=256, step_s=0.001)
    tok = Recording(512, eos_token_id=engine.eos_token_id)
    srv = BackgroundServer(create_app(engine, tok, served_model_name="fake", sampling_params_cls=FakeSamplingParams)).start()
    try:
        for n in (100, OFF_LOOP_SIZE + 1):
            r = httpx.post(f"{srv.url}/v1/completions", json={"model": "fake", "prompt": "a" * n, "max_tokens": 2}, timeout=30)
            assert r.status_code == 200, r.text
            r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=30,
                           json={"model": "fake", "messages": [{"role": "user", "content": "b" * n}], "max_tokens": 2})
            assert r.status_code == 200, r.text
        # the small prompts' encodes ran on the event loop's thread, the large ones' elsewhere
        small, big = tok.threads[:2], tok.threads[2:]
        assert len(big) == 2 and len(set(small)) == 1 and not set(big) & set(small), tok.threads
    finally:
        srv.stop()


def test_bench_against_a_model_the_server_does_not_serve_names_it(server):
    """The server would answer every request 404 (bench crashed with an internal error on the first probe): `bench
    --model` not in /v1/models is refused naming the flag and what the server serves."""
    import asyncio
    import subprocess
    import sys

    from executor.bench_client import server_info

    with pytest.raises(LookupError, match="serves "):
        asyncio.run(server_info(server.url, "nosuchmodel"))
    r = subprocess.run([sys.executable, "-m", "ui.cli", "bench", "--url", server.url, "-n", "2", "--model", "nosuchmodel",
                        "--input-len", "8", "--output-len", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--model nosuchmodel: the server at" in r.stderr and "internal error" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "ui.cli", "bench", "--url", server.url, "-n", "2", "--ramp-s", "inf"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--ramp-s inf: allowed: 0 up to 86,400 seconds" in r.stderr, r.stderr
