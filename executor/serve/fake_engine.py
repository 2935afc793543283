"""A torch-free stand-in with the AsyncLLMEngine interface, for app/bench tests and demos.

It batches like a real engine (every running request gets one token per step, at most
``max_running`` run at once, the rest wait) and produces a fixed byte text, so tests can
check streaming, stop strings, usage, aborts and metrics without loading a model.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, field_validator

_TEXT = "The quick brown fox jumps over the lazy dog. Zwölf Boxkämpfer jagen Viktor quer über den Sylter Deich. "


class FakeSamplingParams(BaseModel):
    """The engine's SamplingParams fields and bounds."""

    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False

    @field_validator("top_k")
    @classmethod
    def _k(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise ValueError("top_k must be -1 or >= 1")
        return v


@dataclass
class FakeTokenOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass
class FakeEngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_used_blocks: int = 0
    kv_total_blocks: int = 64
    kv_held_blocks: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: FakeSamplingParams
    queue: asyncio.Queue
    produced: int = 0
    out: list[int] = field(default_factory=list)


class FakeEngine:
    """Generates ``_TEXT``'s bytes (then EOS after ``eos_after`` tokens unless ignore_eos)."""

    def __init__(self, *, max_model_len: int = 256, step_s: float = 0.002, max_running: int = 8,
                 eos_after: int | None = None, eos_token_id: int = 257, block_size: int = 16):
        self.max_model_len, self.eos_token_id, self.vocab_size = max_model_len, eos_token_id, 512
        self.model_name = "fake"
        self.step_s, self.max_running, self.eos_after, self.block_size = step_s, max_running, eos_after, block_size
        self._waiting: list[_Req] = []
        self._running: list[_Req] = []
        self._stats = FakeEngineStats()
        self._task: asyncio.Task | None = None
        self.aborted: list[str] = []
        self.started = self.shut_down = False

    async def start(self) -> None:
        """Start the step loop on the running event loop."""
        self.started = True
        self._task = asyncio.create_task(self._loop())

    async def shutdown(self) -> None:
        """Stop the step loop."""
        self.shut_down = True
        if self._task:
            self._task.cancel()

    def stats(self) -> FakeEngineStats:
        """Current counts (a copy)."""
        s = self._stats
        s.num_running, s.num_waiting = len(self._running), len(self._waiting)
        s.kv_used_blocks = s.kv_held_blocks = sum(-(-(len(r.prompt) + r.produced) // self.block_size) for r in self._running)
        return FakeEngineStats(**vars(s))

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: FakeSamplingParams):
        """Yield one output per step until finished or aborted."""
        req = _Req(request_id, list(prompt_token_ids), params, asyncio.Queue())
        self._waiting.append(req)
        while True:
            out = await req.queue.get()
            yield out
            if out.finished:
                return

    async def abort(self, request_id: str) -> None:
        """Drop the request wherever it is; its stream ends with finish_reason 'abort'."""
        for lst in (self._waiting, self._running):
            for r in list(lst):
                if r.rid == request_id:
                    lst.remove(r)
                    self.aborted.append(request_id)
                    r.queue.put_nowait(FakeTokenOutput(request_id, [], True, "abort", len(r.prompt)))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            while self._waiting and len(self._running) < self.max_running:
                r = self._waiting.pop(0)
                self._running.append(r)
                self._stats.prompt_tokens_total += len(r.prompt)
                self._stats.prefix_cache_queries += len(r.prompt)
            for r in list(self._running):
                tok = self._next_token(r)
                r.produced += 1
                self._stats.generation_tokens_total += 1
                reason = None
                if tok == self.eos_token_id and not r.params.ignore_eos or tok in r.params.stop_token_ids:
                    reason = "stop"
                elif r.produced >= r.params.max_tokens or len(r.prompt) + r.produced >= self.max_model_len:
                    reason = "length"
                if reason:
                    self._running.remove(r)
                r.queue.put_nowait(FakeTokenOutput(r.rid, [tok], reason is not None, reason, len(r.prompt)))

    def _next_token(self, r: _Req) -> int:
        if self.eos_after is not None and r.produced >= self.eos_after and not r.params.ignore_eos:
            return self.eos_token_id
        data = _TEXT.encode("utf-8")
        return data[r.produced % len(data)]
