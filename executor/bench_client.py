"""Replay a workload against any OpenAI-compatible server and measure what its clients see.

Each request is a streamed POST /v1/completions with ``ignore_eos`` and ``max_tokens`` set to
the workload's output length, so the server generates exactly the tokens the workload asks
for (servers that honour ``ignore_eos``: twinfer, vLLM, SGLang). Per request we time the
first content chunk (TTFT), the gaps between chunks (ITL), the whole request (E2E) and
take token counts from the server's ``usage``. A request still running after ``timeout_s``
(the whole of it: connecting, waiting for the first token, every streamed one) is cut and
recorded as failed with a timeout error.

Prompts are synthetic: a text of common three-letter words, sized by a two-probe calibration
of the server's tokenizer (tokens per word and fixed overhead such as BOS), or, with
``prompt_mode="ids"``, a list of token ids (exact length; vLLM and twinfer accept it).
Requests that share KV blocks in the workload (``block_hashes``) share the same words for
those blocks, so the server's prefix cache sees the workload's reuse.

No torch here (and no sim import): the caller hands in plain ``BenchItem``s.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import httpx
import numpy as np

# Common English three-letter words: one token each (with their leading space) in GPT-2/
# LLaMA-3-style BPE vocabularies, four bytes each for a byte-level tokenizer.
WORDS = ("the and for are but not you all any can had her was one our out day get has him his how man new now "
         "old see two way who boy did its let put say she too use few big end far run own set top").split()


@dataclass
class BenchItem:
    """One request to replay: when (seconds from start), how long a prompt, how many output tokens."""

    index: int
    arrival_time: float
    prompt_len: int
    output_len: int
    block_hashes: tuple[int, ...] = ()


@dataclass
class UserLoop:
    """A closed loop: ``users`` clients, each sending its next request when its last one ends, then pausing.

    ``next_request(u, k)`` gives user ``u``'s ``k``-th request and the think time after it (seconds); the
    loop stops sending after ``num_requests`` requests in all or ``duration_s`` from the start, whichever
    comes first (one of them is required), and waits for what is in flight.
    """

    users: int
    next_request: Callable[[int, int], tuple[BenchItem, float]]
    num_requests: int | None = None
    duration_s: float | None = None

    def __post_init__(self):
        if self.users < 1:
            raise ValueError(f"users: must be >= 1 (got {self.users})")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("num_requests or duration_s: a closed loop needs at least one")


@dataclass
class RequestRecord:
    """What one request measured (times in seconds; ``start_s`` from the benchmark's start)."""

    index: int
    scheduled_s: float
    start_s: float = 0.0
    prompt_len: int = 0                 # the workload's target
    output_len: int = 0                 # the workload's target
    prompt_tokens: int | None = None    # the server's count (usage)
    output_tokens: int = 0              # the server's count (usage), else content chunks seen
    cached_tokens: int | None = None    # prompt tokens the server's prefix cache served, if it says
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    request_id: str | None = None
    success: bool = False
    error: str | None = None
    user: int | None = None             # the closed-loop user that sent it (UserLoop runs)


@dataclass
class BenchRun:
    """All records of one run plus what the summary needs to turn them into rates."""

    records: list[RequestRecord]
    duration_s: float
    model: str
    url: str
    prompt_mode: str
    tokens_per_word: float | None = None
    clipped: int = 0                    # requests shortened to fit the server's max_model_len
    max_in_flight: int | None = None    # most requests in flight at once (UserLoop runs)
    interrupted: bool = False           # cut by Ctrl-C: the records are the requests that completed before it


# ----------------------------------------------------------------------------- arrivals


def rescale_arrivals(items: Sequence[BenchItem], rate: float) -> list[BenchItem]:
    """Stretch arrival times so the mean rate is ``rate`` req/s; burstiness (the shape) is kept."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    span = max((it.arrival_time for it in items), default=0.0)
    n = len(items)
    if n < 2 or span <= 0:  # no shape to keep: evenly spaced at the rate
        return [BenchItem(**{**asdict(it), "arrival_time": i / rate}) for i, it in enumerate(items)]
    scale = (n - 1) / rate / span
    return [BenchItem(**{**asdict(it), "arrival_time": it.arrival_time * scale}) for it in items]


def ramp_time(t: float, ramp_s: float) -> float:
    """Map an arrival time so the rate rises linearly from 0 over ``ramp_s`` and is unchanged after.

    With rate r, arrivals by time u during the ramp are r*u^2/(2*ramp_s); matching the original
    count r*t gives u = sqrt(2*ramp_s*t) for t < ramp_s/2, and after it a shift of ramp_s/2.
    """
    if ramp_s <= 0:
        return t
    return math.sqrt(2.0 * ramp_s * t) if t < ramp_s / 2 else t + ramp_s / 2


def items_from_requests(requests: Iterable) -> list[BenchItem]:
    """BenchItems from workload requests (anything with arrival_time, prompt_len, output_len, block_hashes)."""
    return [BenchItem(i, float(r.arrival_time), int(r.prompt_len), int(r.output_len), tuple(r.block_hashes or ()))
            for i, r in enumerate(requests)]


def fit_context(items: Sequence[BenchItem], max_model_len: int) -> tuple[list[BenchItem], int]:
    """Clip prompts (then outputs) so prompt + output fits ``max_model_len``; returns the items and how many changed."""
    out, changed = [], 0
    for it in items:
        if it.prompt_len + it.output_len <= max_model_len:
            out.append(it)
            continue
        changed += 1
        output = min(it.output_len, max_model_len - 1)
        prompt = max(1, min(it.prompt_len, max_model_len - output))
        out.append(BenchItem(it.index, it.arrival_time, prompt, output, it.block_hashes))
    return out, changed


# ----------------------------------------------------------------------------- prompts


@dataclass
class Calibration:
    """Server tokens for a prompt of ``w`` words are about ``overhead + per_word * w``."""

    per_word: float = 1.0
    overhead: float = 0.0

    def words_for(self, tokens: int) -> int:
        """Words needed for about ``tokens`` prompt tokens (at least one)."""
        return max(1, int(round((tokens - self.overhead) / self.per_word)))


class PromptMaker:
    """Deterministic synthetic prompts: shared blocks share words, the rest is unique per request."""

    def __init__(self, mode: str = "text", *, seed: int = 0, block_size: int = 16,
                 calibration: Calibration | None = None, id_range: tuple[int, int] = (32, 127)):
        if mode not in ("text", "ids"):
            raise ValueError(f"prompt mode must be 'text' or 'ids', got {mode!r}")
        self.mode, self.seed, self.block_size = mode, seed, block_size
        self.cal = calibration or Calibration()
        self.id_range = id_range  # printable ASCII: valid ids in every vocab, visible bytes in a byte tokenizer

    def _units(self, key: tuple[int, ...], n: int) -> list[int]:
        """``n`` word (or id) indices drawn from a generator keyed on ``key``."""
        words32 = [w for k in (self.seed, *key) for w in (k & 0xFFFFFFFF, (k >> 32) & 0xFFFFFFFF)]
        rng = np.random.default_rng(words32)  # block hashes are 63-bit: keep all their bits
        hi = len(WORDS) if self.mode == "text" else self.id_range[1] - self.id_range[0]
        return rng.integers(0, hi, size=n).tolist()

    def prompt(self, item: BenchItem, salt: int = 0) -> str | list[int]:
        """The prompt for ``item``: text (mode "text") or token ids (mode "ids")."""
        units: list[int] = []
        per_block = self.block_size if self.mode == "ids" else self.cal.words_for(self.block_size + self.cal.overhead)
        target = item.prompt_len if self.mode == "ids" else self.cal.words_for(item.prompt_len)
        for h in item.block_hashes:
            if len(units) + per_block > target:
                break
            units += self._units((1, h, salt), per_block)  # a salt (warmup) keeps off the measured run's cache
        # the unique tail: keyed on the request index (and a salt for warmup copies)
        units += self._units((2, item.index, salt), max(0, target - len(units)))
        if self.mode == "ids":
            return [self.id_range[0] + u for u in units]
        return " ".join(WORDS[u] for u in units)


# ----------------------------------------------------------------------------- HTTP


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


CONNECT_TIMEOUT_S = 30.0   # a server that takes longer to accept a connection is down or overloaded


def make_client(timeout_s: float = 600.0) -> httpx.AsyncClient:
    """An HTTP client for many concurrent streams; ignores proxy env (targets are local servers).

    ``timeout_s`` bounds each read (and connecting, to at most ``CONNECT_TIMEOUT_S``); ``send_one`` bounds
    a whole streamed request on top, which a stream that keeps sending tokens would never hit per read."""
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
                             trust_env=False,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))


async def list_models(client: httpx.AsyncClient, base_url: str, api_key: str | None = None) -> list[dict]:
    """The entries of /v1/models (vLLM and twinfer add ``max_model_len`` to each)."""
    r = await client.get(f"{base_url}/v1/models", headers=_headers(api_key))
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    return data


def server_root(url: str) -> str:
    """The server's base URL: ``http://h:p``, also when given as ``http://h:p/v1`` (what `twinfer serve`
    and vLLM print) or with a trailing slash."""
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


async def server_info(base_url: str, model: str | None = None, api_key: str | None = None,
                      timeout_s: float = 30.0) -> tuple[str, int | None]:
    """The model to send (``model`` or the first listed) and its ``max_model_len`` if the server says."""
    async with make_client(timeout_s) as client:
        data = await list_models(client, server_root(base_url), api_key)
    entry = next((d for d in data if d.get("id") == model), None) if model else data[0]
    if entry is None:   # the server would answer every request 404
        raise LookupError(f"the server at {server_root(base_url)} serves {', '.join(str(d.get('id')) for d in data)}")
    return entry["id"], entry.get("max_model_len")


async def _prompt_tokens(client: httpx.AsyncClient, base_url: str, model: str, prompt: str, api_key: str | None) -> int:
    r = await client.post(f"{base_url}/v1/completions", headers=_headers(api_key),
                          json={"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0})
    r.raise_for_status()
    return int(r.json()["usage"]["prompt_tokens"])


async def calibrate(client: httpx.AsyncClient, base_url: str, model: str, api_key: str | None = None,
                    words: int = 64) -> Calibration:
    """Two probes (1 and 1+``words`` words) give the server's tokens per word and fixed overhead."""
    maker = PromptMaker("text", seed=12345)
    one = maker.prompt(BenchItem(0, 0.0, 1, 1))
    many = maker.prompt(BenchItem(1, 0.0, 1 + words, 1))
    p1 = await _prompt_tokens(client, base_url, model, one, api_key)
    p2 = await _prompt_tokens(client, base_url, model, many, api_key)
    per_word = max((p2 - p1) / words, 1e-3)
    return Calibration(per_word=per_word, overhead=max(p1 - per_word, 0.0))


async def send_one(client: httpx.AsyncClient, base_url: str, model: str, prompt: str | list[int], output_len: int,
                   rec: RequestRecord, t0: float, *, api_key: str | None = None, temperature: float = 0.0,
                   timeout_s: float | None = None) -> RequestRecord:
    """Stream one completion and fill ``rec`` with its timings and token counts; a request not over within
    ``timeout_s`` (all of it, streaming included) is cut there (closing the connection aborts it at the
    server) and recorded as failed."""
    payload = {"model": model, "prompt": prompt, "max_tokens": output_len, "ignore_eos": True, "stream": True,
               "stream_options": {"include_usage": True}, "temperature": temperature}
    start = time.perf_counter()
    rec.start_s = start - t0
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            chunks = await _stream(client, f"{base_url}/v1/completions", payload, api_key, rec, start)
        rec.e2e_s = time.perf_counter() - start
        if rec.output_tokens == 0:  # server sent no usage: count the token events
            rec.output_tokens = chunks
        if rec.ttft_s is None:
            raise RuntimeError("stream ended without any token")
        if rec.finish_reason == "abort":  # drained or dropped by the server: it ended cleanly but short
            raise RuntimeError(f"the server aborted the request after {rec.output_tokens} of {output_len} tokens")
        if rec.output_tokens > 1:
            rec.tpot_s = (rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1)
        rec.success = True
    except Exception as err:  # noqa: BLE001 - any failure is a failed request in the report
        rec.e2e_s = time.perf_counter() - start
        rec.success = False
        got = len(rec.itl_s) + (rec.ttft_s is not None)
        rec.error = (f"TimeoutError: not complete within the per-request timeout of {timeout_s:g} s "
                     f"({got} token chunks received)" if deadline.expired() else f"{type(err).__name__}: {err}")
    return rec


async def _stream(client: httpx.AsyncClient, url: str, payload: dict, api_key: str | None, rec: RequestRecord,
                  start: float) -> int:
    """POST ``payload`` and read its SSE stream into ``rec`` (times from ``start``); the token events seen."""
    last = None
    chunks = 0
    async with client.stream("POST", url, json=payload, headers=_headers(api_key)) as r:
        if r.status_code != 200:
            body = (await r.aread()).decode("utf-8", "replace")
            raise RuntimeError(f"HTTP {r.status_code}: {body[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            msg = json.loads(data)
            if "error" in msg:
                raise RuntimeError(f"stream error: {msg['error']}")
            rec.request_id = rec.request_id or msg.get("id")
            if msg.get("usage"):
                rec.prompt_tokens = msg["usage"].get("prompt_tokens")
                rec.output_tokens = msg["usage"].get("completion_tokens") or 0
                details = msg["usage"].get("prompt_tokens_details") or {}
                rec.cached_tokens = details.get("cached_tokens")
            choices = msg.get("choices") or []
            if not choices:
                continue
            # every chunk with a choice is a token event (servers send one per step)
            now = time.perf_counter()
            if last is None:
                rec.ttft_s = now - start
            else:
                rec.itl_s.append(now - last)
            last = now
            chunks += 1
            rec.finish_reason = choices[0].get("finish_reason") or rec.finish_reason
    return chunks


# ----------------------------------------------------------------------------- the run


async def run_benchmark(base_url: str, items: Sequence[BenchItem], *, model: str | None = None,
                        concurrency: int | None = None, closed_loop: bool = False, warmup: int = 0,
                        ramp_s: float = 0.0, api_key: str | None = None, prompt_mode: str = "text",
                        block_size: int = 16, seed: int = 0, temperature: float = 0.0, timeout_s: float = 600.0,
                        max_model_len: int | None = None, users: UserLoop | None = None,
                        on_record: Callable[[RequestRecord], None] | None = None) -> BenchRun:
    """Replay ``items``; open loop at their arrival times, or ``closed_loop`` with ``concurrency`` in flight;
    or, with ``users`` (``items`` then unused), run that closed loop of users.

    With ``max_model_len`` (the server's), requests that would not fit are clipped first; text
    prompts keep a margin for the calibration's rounding (a word or two, and 1%).
    """
    if closed_loop and not concurrency:
        raise ValueError("a closed loop needs a concurrency")
    if users is not None and not items:  # shapes for the warmup: the users' first requests
        items = [users.next_request(u, 0)[0] for u in range(min(users.users, max(warmup, 1)))]
    base_url = server_root(base_url)
    async with make_client(timeout_s) as client:
        model = model or (await list_models(client, base_url, api_key))[0]["id"]
        cal = await calibrate(client, base_url, model, api_key) if prompt_mode == "text" else None
        maker = PromptMaker(prompt_mode, seed=seed, block_size=block_size, calibration=cal)
        clipped = 0
        limit = max_model_len - (0 if cal is None else math.ceil(2 * cal.per_word) + 2 + max_model_len // 100) \
            if max_model_len else None
        if limit:
            items, clipped = fit_context(items, limit)

        async def fire(item: BenchItem, rec: RequestRecord, t0: float, salt: int = 0) -> RequestRecord:
            return await send_one(client, base_url, model, maker.prompt(item, salt), item.output_len, rec, t0,
                                  api_key=api_key, temperature=temperature, timeout_s=timeout_s)

        if warmup:  # same shapes as the first requests, different words: warms kernels, not the prefix cache
            sem_w = asyncio.Semaphore(concurrency or warmup)

            async def warm(it: BenchItem) -> None:
                async with sem_w:
                    await fire(it, RequestRecord(it.index, 0.0), time.perf_counter(), salt=1 + it.index)

            await asyncio.gather(*(warm(items[i % len(items)]) for i in range(warmup)))

        records = [RequestRecord(it.index, 0.0 if closed_loop else ramp_time(it.arrival_time, ramp_s),
                                 prompt_len=it.prompt_len, output_len=it.output_len) for it in items]
        t0 = time.perf_counter()

        async def done(coro) -> None:
            rec = await coro
            if on_record:
                on_record(rec)

        most = None
        if users is not None:
            records = []
            loop = _Users(users, records, t0, limit)
            await loop.run(ramp_s, lambda it, rec: done(fire(it, rec, t0)))
            clipped, most = loop.clipped, loop.max_in_flight
        elif closed_loop:
            await _closed_loop(items, records, concurrency, ramp_s, lambda it, rec: done(fire(it, rec, t0)))
        else:
            await _open_loop(items, records, concurrency, t0, lambda it, rec: done(fire(it, rec, t0)))
        duration = time.perf_counter() - t0
    return BenchRun(records=records, duration_s=duration, model=model, url=base_url, prompt_mode=prompt_mode,
                    tokens_per_word=cal.per_word if cal else None, clipped=clipped, max_in_flight=most)


async def _open_loop(items, records, concurrency, t0, launch) -> None:
    """Send each request at its scheduled time (capped at ``concurrency`` in flight, if set)."""
    sem = asyncio.Semaphore(concurrency) if concurrency else None

    async def one(it, rec):
        if sem is None:
            return await launch(it, rec)
        async with sem:
            await launch(it, rec)

    tasks = []
    for it, rec in sorted(zip(items, records), key=lambda p: p[1].scheduled_s):
        delay = t0 + rec.scheduled_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(it, rec)))
    await asyncio.gather(*tasks)


async def _closed_loop(items, records, concurrency, ramp_s, launch) -> None:
    """``concurrency`` workers each send their next request when the previous one finishes."""
    queue = list(zip(items, records))
    queue.reverse()

    async def worker(k: int) -> None:
        if ramp_s > 0:  # workers join one by one over the ramp
            await asyncio.sleep(ramp_s * k / concurrency)
        while queue:
            it, rec = queue.pop()
            await launch(it, rec)

    await asyncio.gather(*(worker(k) for k in range(concurrency)))


class _Users:
    """The clients of a UserLoop: each sends, awaits the whole response, thinks, and sends its next request."""

    def __init__(self, spec: UserLoop, records: list[RequestRecord], t0: float, limit: int | None):
        self.spec, self.records, self.t0, self.limit = spec, records, t0, limit
        self.in_flight = self.max_in_flight = self.clipped = 0

    def _may_send(self) -> bool:
        s = self.spec
        if s.num_requests is not None and len(self.records) >= s.num_requests:
            return False
        return s.duration_s is None or time.perf_counter() - self.t0 < s.duration_s

    async def run(self, ramp_s: float, launch) -> None:
        await asyncio.gather(*(self._user(u, ramp_s, launch) for u in range(self.spec.users)))

    async def _user(self, u: int, ramp_s: float, launch) -> None:
        if ramp_s > 0:  # users join one by one over the ramp
            await asyncio.sleep(ramp_s * u / self.spec.users)
        k = 0
        while self._may_send():
            it, think = self.spec.next_request(u, k)
            if self.limit:
                (it,), changed = fit_context([it], self.limit)
                self.clipped += changed
            rec = RequestRecord(it.index, time.perf_counter() - self.t0, prompt_len=it.prompt_len,
                                output_len=it.output_len, user=u)
            self.records.append(rec)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await launch(it, rec)
            finally:
                self.in_flight -= 1
            if think > 0:
                await asyncio.sleep(think)
            k += 1


# ----------------------------------------------------------------------------- output


def write_records(path: str | Path, run: BenchRun) -> None:
    """One JSON object per request, in workload order."""
    with open(path, "w", encoding="utf-8") as f:
        for rec in sorted(run.records, key=lambda r: r.index):
            f.write(json.dumps(asdict(rec)) + "\n")


def _stats(values: Iterable[float]) -> dict[str, float | None]:
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if a.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize(run: BenchRun) -> dict:
    """Counts, throughputs and latency percentiles (seconds) of a run, computed with numpy."""
    ok = [r for r in run.records if r.success]
    dur = max(run.duration_s, 1e-9)
    in_tok = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    out_tok = sum(r.output_tokens for r in ok)
    out = {
        "num_requests": len(run.records),
        "completed": len(ok),
        "failed": len(run.records) - len(ok),
        "duration_s": run.duration_s,
        "input_tokens": in_tok,
        "output_tokens": out_tok,
        "request_throughput": len(ok) / dur,
        "input_throughput": in_tok / dur,
        "output_throughput": out_tok / dur,
        "total_token_throughput": (in_tok + out_tok) / dur,
    }
    for name, vals in (("ttft", (r.ttft_s for r in ok)), ("tpot", (r.tpot_s for r in ok)),
                       ("itl", (x for r in ok for x in r.itl_s)), ("e2e", (r.e2e_s for r in ok))):
        for stat, v in _stats(vals).items():
            out[f"{name}_{stat}_s"] = v
    return out
