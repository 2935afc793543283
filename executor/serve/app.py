"""The FastAPI app: OpenAI's /v1/completions, /v1/chat/completions and /v1/models[/{id}] over an AsyncLLMEngine.

One HTTP request is one engine request. The app owns what the engine does not: tokenizing
(and the chat template), stop strings, OpenAI's response shapes, SSE streaming, request ids,
the API key, admission (``max_queue``, request body size), latency metrics, aborting the engine
request when a stop string matches or the client goes away, and draining on shutdown
(``app.state.drain``: refuse new requests, let in-flight ones finish for a grace period, then
abort the rest so that every stream still ends with a finish_reason and ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import itertools
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from executor.serve import protocol as P
from executor.serve.inputs import check_json_size, find_surrogate
from executor.serve.prom import ServeMetrics
from executor.serve.textstream import TextStream
from executor.serve.tokenizer import Tokenizer

REQUEST_ID_HEADER = "x-request-id"
DEFAULT_MAX_BODY_BYTES = 32 * 2**20   # a 128k-token prompt is ~1 MB of JSON; 32 MiB leaves room, bounds memory
DEFAULT_DRAIN_TIMEOUT_S = 5.0         # on shutdown: how long in-flight requests may still run before abort
ABORT_FLUSH_S = 2.0                   # after the abort: how long streams get to send their last chunk
DEFAULT_MAX_BODIES_BYTES = 256 * 2**20  # request bodies being read at once, all clients together (memory bound)
# what the API key guards (/health stays open for load balancers); the API docs too, they map the API
AUTH_PATHS = ("/v1", "/metrics", "/docs", "/redoc", "/openapi.json")
# a body or text past this many bytes/characters is parsed and tokenized in a worker thread: a ~30 MB prompt took
# ~1 s on the event loop, stalling every open stream for that second (a 64 KiB one takes ~2 ms, less than the hop)
OFF_LOOP_SIZE = 1 << 16


@dataclass
class _Delta:
    """What one engine output turned into: text to send, tokens it carried, and the end, if it is one."""

    text: str
    num_tokens: int
    finish_reason: str | None = None


@dataclass
class _Tally:
    """Per-request token counts for ``usage``."""

    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0

    def usage(self) -> P.UsageInfo:
        return P.UsageInfo.of(self.prompt_tokens, self.completion_tokens, self.cached_tokens)


@dataclass
class _State:
    engine: Any
    tokenizer: Tokenizer
    model_name: str
    api_key: str | None
    max_queue: int
    params_cls: Any
    metrics: ServeMetrics
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_bodies_bytes: int = DEFAULT_MAX_BODIES_BYTES
    retry_after_s: int = 1
    inflight: int = 0
    draining: bool = False
    body_bytes: int = 0   # bytes of request bodies being read right now (all connections)
    engine_ids: set = field(default_factory=set)
    background: set = field(default_factory=set)
    serial: Any = field(default_factory=itertools.count)

    def engine_id(self, resp_id: str) -> str:
        """A fresh engine request id. Never the client's X-Request-Id alone: a client that retries with
        the same id right after a disconnect must not meet its old request, whose abort the engine may
        not have applied yet."""
        return f"{resp_id}-{next(self.serial)}"

    def busy(self, what: str) -> P.APIError:
        """503 with Retry-After: a transient server-side limit, not the client's fault."""
        return P.APIError(what, status=503, type="service_unavailable", code="server_busy",
                          headers={"retry-after": str(self.retry_after_s)})

    def shutting_down(self) -> P.APIError:
        return P.APIError("server is shutting down; retry on another replica", status=503,
                          type="service_unavailable", code="shutting_down",
                          headers={"retry-after": str(self.retry_after_s)})

    def spawn(self, coro) -> None:
        """Run ``coro`` detached (an abort must not die with the cancelled request that asked for it)."""
        task = asyncio.ensure_future(_quietly(coro))
        self.background.add(task)
        task.add_done_callback(self.background.discard)


async def _quietly(coro) -> None:
    """Cleanup must not raise into nowhere ("Task exception was never retrieved")."""
    try:
        await coro
    except Exception:  # noqa: BLE001 - best-effort cleanup of a request that is already gone
        pass


def rejection_reason(err: P.APIError) -> str:
    """The metrics label of a refused request: its error code, else the parameter at fault, else the type."""
    if err.code:
        return err.code
    if err.param:
        return "invalid_" + err.param.split("[")[0].split(".")[0]
    return err.type


def _error(err: P.APIError, request_id: str | None = None) -> JSONResponse:
    headers = dict(err.headers)
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    return JSONResponse(err.body(), status_code=err.status, headers=headers or None)


def _key_ok(header: str | None, api_key: str) -> bool:
    """Constant-time check of an ``Authorization: Bearer <key>`` header."""
    expected = f"Bearer {api_key}".encode()
    return hmac.compare_digest((header or "").encode("latin-1", errors="replace"), expected)


class _RequestIdAndAuth:
    """Pure ASGI middleware (streaming-safe, unlike BaseHTTPMiddleware): X-Request-Id in/out, API key on
    /v1 and /metrics, and a 413 for a declared body over the limit before any of it is read."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, on_reject=None,
                 state: "_State | None" = None):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes
        self.on_reject = on_reject or (lambda reason: None)
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        # echoed as the bytes that came (`echo`, latin-1 round-trips them); read as UTF-8 for the response id, which
        # showed `éx` as `Ã©x`. Bytes that are not UTF-8 name no id a client could match: 400
        echo = headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        try:
            rid = echo.encode("latin-1").decode("utf-8")
        except UnicodeDecodeError:
            err = P.APIError("X-Request-Id header: not valid UTF-8 (send ASCII or UTF-8 text)",
                             code="invalid_request_id")
            self.on_reject(err.code)
            return await _error(err, echo)(scope, receive, send)
        scope.setdefault("state", {})["request_id"] = rid

        if self.api_key and scope["path"].startswith(AUTH_PATHS) and not _key_ok(headers.get("authorization"), self.api_key):
            err = P.APIError("invalid or missing API key (send 'Authorization: Bearer <key>')", status=401,
                             type="authentication_error", code="invalid_api_key",
                             headers={"www-authenticate": "Bearer"})
            self.on_reject(err.code)
            return await _error(err, echo)(scope, receive, send)
        declared = headers.get("content-length", "")
        err = None
        if declared.isdigit() and len(declared) < 20 and int(declared) > self.max_body_bytes:
            err = _too_large(self.max_body_bytes)
        elif self.state is not None and self.state.draining and scope["path"].startswith("/v1/"):
            err = self.state.shutting_down()  # answered before the body is read
        if err is not None:
            self.on_reject(err.code)
            return await _error(err, echo)(scope, receive, send)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                hdrs = [h for h in message.get("headers", []) if h[0].lower() != REQUEST_ID_HEADER.encode()]
                message = {**message, "headers": hdrs + [(REQUEST_ID_HEADER.encode(), echo.encode("latin-1"))]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def _too_large(limit: int) -> P.APIError:
    return P.APIError(f"request body is larger than {limit} bytes", status=413, code="request_too_large")


def create_app(engine: Any, tokenizer: Tokenizer, *, served_model_name: str, api_key: str | None = None,
               max_queue: int = 4096, sampling_params_cls: Any = None, manage_engine: bool = True,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
               retry_after_s: int = 1, max_bodies_bytes: int = DEFAULT_MAX_BODIES_BYTES) -> FastAPI:
    """Build the app. With ``manage_engine`` the app's lifespan starts and shuts down the engine.

    ``max_queue``: requests in flight before new ones get 429 (with ``Retry-After: retry_after_s``).
    ``max_body_bytes``: larger request bodies get 413; ``max_bodies_bytes``: bodies being read at once, all
    clients together, past which a new body gets 503 (memory). ``drain_timeout_s``: on shutdown
    (``app.state.drain``), how long in-flight requests may still finish before they are aborted.
    """
    if sampling_params_cls is None:  # the real engine's (a torch-free module)
        from executor.sampling_params import SamplingParams as sampling_params_cls
    st = _State(engine=engine, tokenizer=tokenizer, model_name=served_model_name, api_key=api_key,
                max_queue=max_queue, params_cls=sampling_params_cls,
                metrics=ServeMetrics(engine.stats, served_model_name, inflight=lambda: st.inflight,
                                     max_model_len=engine.max_model_len),
                max_body_bytes=max_body_bytes, max_bodies_bytes=max(max_bodies_bytes, max_body_bytes),
                retry_after_s=retry_after_s)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if manage_engine:
            await engine.start()
        try:
            yield
        finally:
            if manage_engine:
                await engine.shutdown()

    _observe_steps(engine, st.metrics)
    app = FastAPI(title="twinfer serve", lifespan=lifespan)
    app.state.serve = st
    app.state.drain = functools.partial(drain, st, drain_timeout_s)

    @app.exception_handler(P.APIError)
    async def _api_error(request: Request, err: P.APIError):
        if not (err.status == 499 and err.code is None):  # a client that left mid-run was counted as an abort
            st.metrics.request_rejected(rejection_reason(err))
        return _error(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        # unknown paths and wrong methods answer in OpenAI's error shape too
        typ = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        st.metrics.request_rejected(f"http_{err.status_code}")
        return _error(P.APIError(f"{request.method} {request.url.path}: {err.detail}", status=err.status_code, type=typ,
                                 headers=dict(err.headers or {})))

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception):
        st.metrics.request_rejected("internal_error")
        return _error(P.APIError(f"internal error: {type(err).__name__}: {err}", status=500, type="server_error"))

    @app.get("/health")
    async def health() -> Response:
        # 503 tells a load balancer to stop sending: draining for shutdown, or the engine loop died
        if st.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        dead = getattr(engine, "errored", None)
        if dead:
            return JSONResponse({"status": "engine failed", "error": repr(dead)}, status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        return {"id": st.model_name, "object": "model", "created": P.now_s(), "owned_by": "twinfer",
                "root": st.model_name, "max_model_len": engine.max_model_len}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")  # :path: model ids such as org/name hold a slash
    async def model(model_id: str) -> dict:
        if model_id != st.model_name:  # a path names a model: no empty default, unlike a request body's `model`
            raise _unknown_model(st, model_id)
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = P.parse_request(P.CompletionRequest, await _json_body(request, engine.max_model_len))
        _check_model(st, req.model)
        if isinstance(req.prompt, str):
            prompt_ids = await _off_loop(len(req.prompt), _encode, tokenizer, req.prompt)
        else:
            prompt_ids = list(req.prompt)
            _check_ids(st, prompt_ids)
        # OpenAI's default of 16 when the client sent none: only as much as the context leaves (as vLLM), since a
        # context-length 400 blaming max_tokens would name a field the client never sent
        return await _serve(st, request, req, prompt_ids, prefix="cmpl", chat=False,
                            max_tokens=req.max_tokens, prompt_param="prompt",
                            clamp_max_tokens="max_tokens" not in req.model_fields_set)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = P.parse_request(P.ChatCompletionRequest, await _json_body(request, engine.max_model_len))
        _check_model(st, req.model)
        messages = [{"role": m.role, "content": m.text, **({"name": m.name} if m.name else {})} for m in req.messages]
        try:
            prompt_ids = await _off_loop(sum(len(m["content"] or "") for m in messages), tokenizer.encode_chat, messages)
        except ValueError as err:  # the model's template refused the conversation
            raise P.APIError(str(err), param="messages") from None
        # an over-long budget is blamed on the field the client sent (max_completion_tokens wins when both are)
        budget_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        return await _serve(st, request, req, prompt_ids, prefix="chatcmpl", chat=True,
                            max_tokens=req.requested_max_tokens, prompt_param="messages", budget_param=budget_param)

    app.add_middleware(_RequestIdAndAuth, api_key=api_key, max_body_bytes=max_body_bytes,
                       on_reject=st.metrics.request_rejected, state=st)
    return app


def _observe_steps(engine: Any, metrics: ServeMetrics) -> None:
    """Hook the executor's per-step observer (LLMEngine.step_observer, behind AsyncLLMEngine.engine) for the
    iteration, preemption and request-phase metrics, with the engine's clock read in its own thread at the end
    of each step; engines without one (the fake) simply lack them."""
    inner = getattr(engine, "engine", engine)
    if not hasattr(inner, "step_observer"):
        return
    prev = inner.step_observer

    def observe(start_s, plan, result) -> None:
        if prev is not None:
            prev(start_s, plan, result)
        metrics.observe_step(start_s, plan, result, now=inner.now())

    inner.step_observer = observe


async def drain(st: _State, timeout_s: float, should_stop=lambda: False) -> int:
    """Shut the door: new requests get 503; in-flight ones get ``timeout_s`` to finish, then are aborted.

    An aborted stream still ends cleanly (a last chunk with finish_reason 'abort', then ``[DONE]``);
    returns how many requests had to be aborted. ``should_stop`` cuts the grace period short (a second
    Ctrl-C); the short wait after the aborts, for streams to send their last chunk, always runs.
    """
    st.draining = True
    loop = asyncio.get_running_loop()

    async def wait(seconds: float, stoppable: bool = True) -> None:
        end = loop.time() + seconds
        while st.inflight and loop.time() < end and not (stoppable and should_stop()):
            await asyncio.sleep(0.05)

    await wait(timeout_s)
    ids = sorted(st.engine_ids)
    for eid in ids:
        try:
            await st.engine.abort(eid)
        except Exception:  # noqa: BLE001 - one failed abort must not keep the others running
            pass
    # not cut short by a second signal: this is what lets each stream send its last chunk and [DONE]
    await wait(ABORT_FLUSH_S, stoppable=False)
    return len(ids)


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


async def _json_body(request: Request, max_model_len: int) -> Any:
    """The request's JSON, with its memory bounded: the body by ``max_body_bytes`` (and all bodies being read
    by ``max_bodies_bytes``), the parsed values by ``check_json_size``; lone surrogates refused."""
    st: _State = request.app.state.serve
    raw = await _read_body(st, request)
    check_json_size(raw, max_model_len)
    try:
        # Python's json accepts NaN and Infinity; JSON (and every sampling parameter) does not
        body = await _off_loop(len(raw), functools.partial(json.loads, parse_constant=_no_constants), raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise P.APIError(f"malformed JSON in request body: {err}"[:500], code="invalid_json") from None
    where = await _off_loop(len(raw), find_surrogate, body)
    if where is not None:  # JSON's "\ud800" escapes decode to text no encoder (or tokenizer) accepts
        raise P.APIError(f"{where or 'body'}: a lone UTF-16 surrogate is not valid text", param=where or None,
                         code="invalid_encoding")
    return body


async def _read_body(st: _State, request: Request) -> bytes:
    """The body, counted as it arrives (a chunked body has no Content-Length); a client that leaves mid-upload
    is a disconnect (499, never run), not a server error."""
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            st.body_bytes += len(chunk)
            if size > st.max_body_bytes:
                raise _too_large(st.max_body_bytes)
            if st.body_bytes > st.max_bodies_bytes:
                raise st.busy(f"server busy: {st.body_bytes} bytes of request bodies being read; retry later")
            chunks.append(chunk)
    except ClientDisconnect:
        raise P.APIError("client disconnected while sending the request", status=499,
                         type="client_closed_request", code="client_disconnected") from None
    finally:
        st.body_bytes -= size
    return b"".join(chunks)


async def _off_loop(size: int, fn, *args):
    """``fn(*args)``: in a worker thread where ``size`` (bytes or characters of input) is past ``OFF_LOOP_SIZE``, so
    the event loop keeps serving other requests' streams meanwhile; inline otherwise (the hop costs more)."""
    if size > OFF_LOOP_SIZE:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except UnicodeError as err:  # surrogates are refused earlier; any other text the tokenizer cannot take
        raise P.APIError(f"prompt: text the tokenizer cannot encode ({err})"[:300], param="prompt",
                         code="invalid_encoding") from None


def _check_model(st: _State, model: str | None) -> None:
    if model not in (None, "", st.model_name):
        raise _unknown_model(st, model)


def _unknown_model(st: _State, model: str) -> P.APIError:
    """OpenAI's 404 for a model id the server does not serve."""
    return P.APIError(f"the model `{model}` does not exist; this server serves `{st.model_name}`",
                      param="model", code="model_not_found", status=404)


def _check_ids(st: _State, ids: list[int]) -> None:
    vocab = getattr(st.engine, "vocab_size", None) or st.tokenizer.vocab_size
    bad = next((t for t in ids if t >= vocab), None)
    if bad is not None:
        raise P.APIError(f"prompt token id {bad} is out of range: the vocabulary has {vocab} ids", param="prompt")


def _budget(st: _State, prompt_len: int, max_tokens: int | None, prompt_param: str,
            budget_param: str = "max_tokens", clamp: bool = False) -> int:
    """The completion's token budget; prompts that leave no room get OpenAI's context-length error.
    ``clamp``: ``max_tokens`` is the server's default, not the client's: cut to the room left instead."""
    limit = st.engine.max_model_len
    if prompt_len >= limit:
        raise P.APIError(f"This model's maximum context length is {limit} tokens. However, your prompt has "
                         f"{prompt_len} tokens, leaving no room for the completion. Please shorten the prompt.",
                         param=prompt_param, code="context_length_exceeded")
    if max_tokens is None:
        return limit - prompt_len
    if clamp:
        return min(max_tokens, limit - prompt_len)   # >= 1: the prompt is shorter than the limit
    if prompt_len + max_tokens > limit:
        raise P.APIError(f"This model's maximum context length is {limit} tokens. However, you requested "
                         f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the "
                         f"completion). Please reduce the length of the prompt or completion.",
                         param=budget_param, code="context_length_exceeded")
    return max_tokens


def _sampling_params(st: _State, req: P._SamplingRequest, max_tokens: int) -> Any:
    try:
        return st.params_cls(**req.sampling_kwargs(max_tokens))
    except ValidationError as err:  # the engine's own bounds, should they be tighter than ours
        e = err.errors()[0]
        param = ".".join(str(p) for p in e.get("loc", ())) or None
        msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
        raise P.APIError(f"{param}: {msg}", param=param) from None


async def _serve(st: _State, request: Request, req: P._SamplingRequest, prompt_ids: list[int], *, prefix: str,
                 chat: bool, max_tokens: int | None, prompt_param: str, budget_param: str = "max_tokens",
                 clamp_max_tokens: bool = False):
    """Admit, run and answer one request (streamed or whole)."""
    budget = _budget(st, len(prompt_ids), max_tokens, prompt_param, budget_param, clamp_max_tokens)
    params = _sampling_params(st, req, budget)
    retry = {"retry-after": str(st.retry_after_s)}
    if st.draining:
        raise st.shutting_down()
    dead = getattr(st.engine, "errored", None)
    if dead:
        raise P.APIError(f"the engine failed and cannot take requests: {dead!r}", status=503,
                         type="service_unavailable", code="engine_failed")
    if st.inflight >= st.max_queue:
        raise P.APIError(f"server busy: {st.inflight} requests in flight (max_queue={st.max_queue}); retry later",
                         status=429, type="rate_limit_exceeded", code="rate_limit_exceeded", headers=retry)
    resp_id = P.new_id(prefix, request.scope.get("state", {}).get("request_id"))
    engine_id = st.engine_id(resp_id)
    st.engine_ids.add(engine_id)
    st.inflight += 1
    tally = _Tally(prompt_tokens=len(prompt_ids))
    deltas = _run(st, engine_id, prompt_ids, params, req.stop or [], tally)
    created = P.now_s()
    if req.stream:
        fmt = _chat_chunks if chat else _completion_chunks
        events = fmt(st, resp_id, created, deltas, tally, req.include_usage)

        def release() -> None:
            st.inflight -= 1
            st.engine_ids.discard(engine_id)
            st.spawn(events.aclose())  # on a client disconnect: unwinds to _run, which aborts the engine request

        return _TrackedStream(_sse(events, st.metrics.request_rejected), release, media_type="text/event-stream")
    try:
        text, reason = await _collect_unless_disconnected(request, deltas)
    finally:
        st.inflight -= 1
        st.engine_ids.discard(engine_id)
    if chat:
        return P.ChatCompletionResponse(id=resp_id, created=created, model=st.model_name, usage=tally.usage(),
                                        choices=[P.ChatChoice(message=P.ChatMessageOut(content=text),
                                                              finish_reason=reason)])
    return P.CompletionResponse(id=resp_id, created=created, model=st.model_name, usage=tally.usage(),
                                choices=[P.CompletionChoice(text=text, finish_reason=reason)])


async def _run(st: _State, engine_id: str, prompt_ids: list[int], params: Any, stop: list[str],
               tally: _Tally) -> AsyncIterator[_Delta]:
    """Drive one engine request; yields text deltas, ends on finish, stop string, or cancellation.

    Only kept tokens count (usage, metrics): none of an output past the one that completed a stop string."""
    text = TextStream(st.tokenizer.decoder(prompt_ids), stop)
    t_start = time.perf_counter()
    t_last: float | None = None
    reason = "abort"  # what a request that never finished (cancelled, client gone) counts as
    done = False
    refused = False   # the engine refused it: counted as a rejection (400), not as a finished request
    outputs = st.engine.generate(engine_id, prompt_ids, params)
    checked = _refusals_as_400(outputs)
    st.metrics.request_started(engine_id)
    try:
        async for out in checked:
            now = time.perf_counter()
            kept = text.tokens
            delta = text.add(out.new_token_ids)
            n = text.tokens - kept
            if n:
                if t_last is None:
                    st.metrics.observe_ttft(now - t_start)
                    if n > 1:
                        st.metrics.observe_token_gap(0.0, n - 1)
                else:
                    st.metrics.observe_token_gap(now - t_last, n)
                t_last = now
            tally.completion_tokens += n
            st.metrics.tokens_generated(n)
            tally.cached_tokens = out.num_cached_tokens or tally.cached_tokens
            if out.num_prompt_tokens:
                tally.prompt_tokens = out.num_prompt_tokens
            if text.stopped or out.finished:
                delta += text.finish()
                reason = "stop" if text.stopped else (out.finish_reason or "stop")
                done = True
                if not out.finished:  # a stop string: the engine would go on generating, and never sees a finish
                    st.metrics.request_ended(engine_id, finished=True)
                    await st.engine.abort(engine_id)
                yield _Delta(delta, n, reason)
                return
            yield _Delta(delta, n)
    except P.APIError:
        refused = True
        raise
    finally:
        if not done:  # cancelled or errored mid-way: free the engine's slot and KV
            st.spawn(st.engine.abort(engine_id))
        st.spawn(_close(checked, outputs))
        ran = done and reason != "abort"
        st.metrics.request_ended(engine_id, finished=ran)
        if not refused:
            st.metrics.request_finished(time.perf_counter() - t_start, reason,
                                        tally.prompt_tokens if ran else None, tally.completion_tokens if ran else None)


async def _close(*gens) -> None:
    """Close async generators outermost first (closing one does not close what it iterates)."""
    for g in gens:
        await g.aclose()


async def _refusals_as_400(outputs: AsyncIterator) -> AsyncIterator:
    """The engine refuses requests it can never serve with ValueError (TwinferError is one): the client's 400."""
    try:
        async for out in outputs:
            yield out
    except ValueError as err:
        raise P.APIError(str(err)) from None


async def _collect_unless_disconnected(request: Request, deltas: AsyncIterator[_Delta]) -> tuple[str, str | None]:
    """Gather a whole response; if the client disconnects first, cancel it (which aborts the engine request)."""

    async def collect():
        parts, reason = [], None
        async for d in deltas:
            parts.append(d.text)
            reason = d.finish_reason
        return "".join(parts), reason

    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    if work.done() and not work.cancelled():
        return work.result()   # finished (even if the client left in the same instant): an answer
    # the client left: let the cancellation unwind (it aborts the engine request) before answering;
    # cancel() only asks, so the task is not done yet and has no result to read
    await asyncio.gather(work, return_exceptions=True)
    await deltas.aclose()
    raise P.APIError("client disconnected", status=499, type="client_closed_request")


class _TrackedStream(StreamingResponse):
    """A streaming response that releases its request's slot however it ends.

    A generator's ``finally`` is not enough: a client that disconnects before the first chunk
    makes Starlette cancel the response before the body generator ever starts.
    """

    def __init__(self, content, release, **kw):
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _sse(events: AsyncIterator[str], on_reject=lambda reason: None) -> AsyncIterator[str]:
    """Frame events, end with [DONE]; errors after the stream started become an error event."""
    try:
        async for ev in events:
            yield ev
        yield P.SSE_DONE
    except P.APIError as err:
        on_reject(rejection_reason(err))
        yield P.sse(err.body())
        yield P.SSE_DONE
    except Exception as err:  # noqa: BLE001 - the stream has started: an error event is all that can be sent
        on_reject("internal_error")
        yield P.sse(P.APIError(f"internal error: {type(err).__name__}: {err}", status=500, type="server_error").body())
        yield P.SSE_DONE


async def _completion_chunks(st: _State, rid: str, created: int, deltas: AsyncIterator[_Delta], tally: _Tally,
                             include_usage: bool) -> AsyncIterator[str]:
    try:
        async for d in deltas:
            # one chunk per engine output, even with no printable text yet, so that token timing
            # is visible to clients (vLLM does the same)
            yield P.sse(P.CompletionChunk(id=rid, created=created, model=st.model_name,
                                          choices=[P.CompletionChoice(text=d.text, finish_reason=d.finish_reason)]))
    finally:
        await deltas.aclose()
    if include_usage:
        yield P.sse(P.CompletionChunk(id=rid, created=created, model=st.model_name, choices=[], usage=tally.usage()))


async def _chat_chunks(st: _State, rid: str, created: int, deltas: AsyncIterator[_Delta], tally: _Tally,
                       include_usage: bool) -> AsyncIterator[str]:
    def chunk(delta: P.DeltaMessage, reason: str | None = None) -> str:
        return P.sse(P.ChatCompletionChunk(id=rid, created=created, model=st.model_name,
                                           choices=[P.ChatStreamChoice(delta=delta, finish_reason=reason)]))

    yield chunk(P.DeltaMessage(role="assistant", content=""))
    try:
        async for d in deltas:
            if d.finish_reason is None:
                yield chunk(P.DeltaMessage(content=d.text))
            else:  # OpenAI ends with the last text, then an empty delta that carries finish_reason
                if d.text:
                    yield chunk(P.DeltaMessage(content=d.text))
                yield chunk(P.DeltaMessage(), d.finish_reason)
    finally:
        await deltas.aclose()
    if include_usage:
        yield P.sse(P.ChatCompletionChunk(id=rid, created=created, model=st.model_name, choices=[], usage=tally.usage()))
