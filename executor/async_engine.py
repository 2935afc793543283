"""AsyncLLMEngine: the LLMEngine driven by one asyncio task, streaming token deltas per request.

The loop task owns the engine: adds and aborts are queued and applied between steps, and
each ``step`` runs in a worker thread (torch releases the GIL) so the event loop keeps
serving HTTP while the device works. With the scheduler's ``async_overlap`` on, the engine's
``step`` is its pipelined loop body (``LLMEngine.step_overlapped``: step N+1 is scheduled and
launched before step N is read back), and this loop also hands step N's outputs to the request
streams while the next ``step`` runs, so output processing (and the HTTP layer's detokenising)
overlaps device work too; with it off, the three alternate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from executor.engine import EngineStats, LLMEngine, SamplingParams, TokenOutput


class AsyncLLMEngine:
    """``await start()``; ``async for out in generate(...)``; ``await abort(id)``; ``await shutdown()``."""

    def __init__(self, engine: LLMEngine, overlap: bool | None = None):
        self.engine = engine
        if overlap is None:   # the pipelined engine's setting; an EP front (no pipeline) the scheduler config's
            overlap = getattr(engine, "async_overlap", None)
            overlap = engine.scheduler.config.async_overlap if overlap is None else overlap
        self.overlap = overlap
        self._queues: dict[str, asyncio.Queue] = {}
        self._adds: list[tuple[str, list[int], SamplingParams]] = []
        self._aborts: list[str] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None

    @classmethod
    def from_args(cls, *args, **kwargs) -> "AsyncLLMEngine":
        """Same arguments as ``LLMEngine.from_args``."""
        return cls(LLMEngine.from_args(*args, **kwargs))

    # the attributes the HTTP layer reads
    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def eos_token_id(self) -> int | None:
        return self.engine.eos_token_id

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def errored(self) -> BaseException | None:
        """The error that ended the loop task, if it died (the server then reports 503)."""
        return self._error

    # ----------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start the loop task on the running event loop."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="twinfer-engine-loop")

    async def shutdown(self) -> None:
        """Stop the loop; open streams end with finish_reason 'abort'."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        for rid, q in list(self._queues.items()):
            q.put_nowait(TokenOutput(rid, [], True, "abort"))
        self._queues.clear()

    # ----------------------------------------------------------------- requests
    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenOutput]:
        """Queue a request and yield its token deltas until it finishes (validation errors raise here)."""
        if self._task is None:
            await self.start()
        if self._error is not None:
            raise RuntimeError(f"engine loop died: {self._error!r}")
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._validate(prompt_token_ids)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = q
        self._adds.append((request_id, list(prompt_token_ids), params))
        self._wake.set()
        try:
            while True:
                out = await q.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finished:
                    return
        finally:
            if self._queues.pop(request_id, None) is not None:   # consumer left early: free the request
                self._aborts.append(request_id)
                self._wake.set()

    def _validate(self, ids: list[int]) -> None:
        e = self.engine
        if not ids:
            raise ValueError("prompt_token_ids is empty")
        if len(ids) >= e.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; max_model_len is {e.max_model_len}")
        if any(not 0 <= t < e.vocab_size for t in ids):
            raise ValueError(f"token ids must be in [0, {e.vocab_size})")

    async def abort(self, request_id: str) -> None:
        """Drop a request; its stream ends with finish_reason 'abort'."""
        self._aborts.append(request_id)
        if self._wake is not None:
            self._wake.set()

    # ----------------------------------------------------------------- the loop
    def _apply_queued(self) -> None:
        e = self.engine
        adds, self._adds = self._adds, []
        for rid, ids, params in adds:
            try:
                e.add_request(rid, ids, params)
            except Exception as err:  # refused: end that stream with the error
                q = self._queues.get(rid)
                if q is not None:
                    q.put_nowait(err)
        aborts, self._aborts = self._aborts, []
        for rid in aborts:
            e.abort(rid)

    def _dispatch(self, outs: list[TokenOutput]) -> None:
        for o in outs:
            q = self._queues.get(o.request_id)
            if q is not None:
                q.put_nowait(o)
                if o.finished:
                    self._queues.pop(o.request_id, None)

    async def _loop(self) -> None:
        e = self.engine
        pending: list[TokenOutput] = []
        try:
            while True:
                self._apply_queued()
                if not e.has_unfinished():
                    self._dispatch(pending)
                    pending = []
                    self._wake.clear()
                    if not (self._adds or self._aborts):
                        await self._wake.wait()
                    continue
                # submitted to the thread pool right away, so the dispatch below really overlaps it
                fut = asyncio.get_running_loop().run_in_executor(None, e.step)
                if self.overlap:
                    self._dispatch(pending)       # hand out step N while step N+1 runs
                    pending = await fut
                else:
                    pending = await fut
                    self._dispatch(pending)
                    pending = []
                await asyncio.sleep(0)            # let HTTP handlers run between steps
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # surface to every open stream instead of hanging them
            self._error = err
            for q in self._queues.values():
                q.put_nowait(RuntimeError(f"engine step failed: {err!r}"))
            raise
