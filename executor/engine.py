"""LLMEngine: requests in, token deltas out, the shared Scheduler deciding every batch.

The engine owns the pieces and the loop body (vLLM v1's EngineCore, minus processes):
``add_request`` turns token ids into a scheduler ``Request`` (with chained block hashes
for the prefix cache), ``step`` asks the scheduler for a plan, runs it on the
model runner (the ``Backend`` of scheduler/backend.py), hands the result back to the scheduler and reports what each request gained.
Batching, chunking, preemption and prefix reuse are the scheduler's; the engine never
second-guesses them. ``AsyncLLMEngine`` (executor.async_engine) wraps this for serving.

``step`` is one of two loop bodies, chosen once at construction (vLLM v1's ``step`` /
``step_with_batch_queue``): ``step_sync`` (schedule, run, complete) or, with the scheduler's
``async_overlap`` on, ``step_overlapped``, which schedules and launches plan N+1 while the device
still runs plan N (executor/overlap.py; costmodels/host.py is the rule the simulator prices it by).
"""

from __future__ import annotations

import dataclasses
import hashlib
import gc
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from executor.kv_cache import KVCache
from executor.memory_room import check_room
from executor.model_config import ExecModelConfig, resolve_spec
from executor.model_runner import ModelRunner
from executor.overlap import InFlight, PipelinedRunner
from executor.sampling_params import SamplingParams
from executor.weights import DTYPES, build_model
from scheduler.backend import Backend
from scheduler.config import SchedulerConfig
from scheduler.plan import StepResult
from scheduler.request import Request
from scheduler.scheduler import Scheduler
from twinfer.config import validate
from twinfer.errors import TwinferError

__all__ = ["SamplingParams", "TokenOutput", "EngineStats", "LLMEngine", "AsyncLLMEngine", "block_hashes"]

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class TokenOutput:
    """What one request gained in one engine step."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass
class EngineStats:
    """Queue, KV and token counters (prefix-cache figures are in prompt tokens)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_used_blocks: int = 0
    kv_total_blocks: int = 0
    kv_held_blocks: int = 0      # held by queued/running requests; used - held = evictable prefix-cache blocks
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0


def block_hashes(token_ids, block_size: int) -> tuple[int, ...]:
    """Chained content hashes of the full blocks of ``token_ids`` (hash i covers tokens [0, (i+1)*bs)): blake2b of
    the previous block's digest and the block's ids as int64 bytes, one bytes view of the prompt sliced per block.
    ``token_ids``: a list of ints or an int64 array. A request's admission pays it once per prompt: per-block decimal
    strings took 0.6 ms for a 3072-token prompt, and in H200 matrix run 17 admissions made a summarize iteration's
    loop 1.6-3.3 ms where the calibration's loop points (no arrivals) measured 0.3-0.8; this takes ~0.1 ms."""
    n = len(token_ids) // block_size
    if n <= 0:
        return ()
    raw = np.ascontiguousarray(np.asarray(token_ids[: n * block_size], dtype=np.int64)).tobytes()
    step = 8 * block_size
    out, prev = [], b""
    for i in range(n):
        d = hashlib.blake2b(prev + raw[i * step:(i + 1) * step], digest_size=8).digest()
        out.append(int.from_bytes(d, "little") & (2**63 - 1))
        prev = d
    return tuple(out)


def overlap_off_reason(config: SchedulerConfig, decode_steps: int, async_overlap: bool | None) -> str | None:
    """Why the engine runs the synchronous loop, or None when it pipelines (async overlap)."""
    on = config.async_overlap if async_overlap is None else async_overlap
    if not on:
        return "async_overlap is off"
    if decode_steps > 1:
        return "multi-step decode (decode_steps > 1) already runs several steps per plan"
    if config.draft_len > 0:
        return "MTP drafts (draft_len > 0): a decode's next drafts depend on the previous step's acceptance"
    return None


def _default_kv_blocks(cfg: ExecModelConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                       max_model_len: int, max_num_seqs: int, fraction: float) -> int:
    """Blocks for every running request at full length, capped by memory (GPU: a fraction of free)."""
    per_block = KVCache.bytes_per_block(cfg, block_size, dtype)
    per_seq = -(-max_model_len // block_size)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        n = int(free * fraction // per_block)
    else:
        n = (1 << 30) // per_block   # CPU: at most 1 GiB of KV
    return max(min(n, per_seq * max_num_seqs), per_seq + 1)


def freeze_gc_heap() -> None:
    """Collect, then move every object alive after start-up (weights' Python wrappers, graphs, tables) into the
    garbage collector's permanent generation, as vLLM's engine core does once it is up: a full collection then no
    longer walks the start-up heap, and the serving loop's occasional generation-2 collection stays short instead of
    pausing a step for milliseconds."""
    gc.collect()
    gc.freeze()


class LLMEngine:
    """The engine: ``add_request`` / ``abort`` / ``step`` / ``generate`` (step: synchronous or pipelined, chosen once)."""

    def __init__(self, cfg: ExecModelConfig, runner: ModelRunner, scheduler: Scheduler, max_model_len: int,
                 eos_token_id: int | None, model_name: str, decode_steps: int = 1, step_log=None,
                 async_overlap: bool | None = None):
        """``async_overlap``: pipeline the loop (``step_overlapped``); None: the scheduler config's ``async_overlap``."""
        self.cfg, self.runner, self.scheduler = cfg, runner, scheduler
        self.backend: Backend = runner   # the seam (scheduler/backend.py): the runner executes plans
        self.step_log = step_log         # callable(dict) per executed step, or None
        self.max_model_len, self.eos_token_id, self.model_name = max_model_len, eos_token_id, model_name
        self.vocab_size = cfg.spec.vocab_size
        self.block_size = scheduler.block_size
        self.decode_steps = decode_steps
        self._reqs: dict[str, Request] = {}
        self._pending: list[TokenOutput] = []
        self._t0 = time.perf_counter()
        self._last_now = 0.0
        self._skipped = 0.0          # idle time jumped over by advance_clock (offline replay)
        self.step_observer = None    # callable(start_s, plan, result) after every executed plan
        self.context_limit = ""      # what set max_model_len below the asked context, for errors (from_args: the KV pool)
        # where that plan's share of the wall clock began (engine clock): its tokens came its durations later. The
        # synchronous loop's start_s; the pipelined loop's start_s is the plan's launch, before the plan ahead of it
        # was read back, so a collector that puts tokens at start + durations reads this (executor/replay.py)
        self.share_start_s = 0.0
        # schedule_s / complete_s: the synchronous loop's of its last plan; the pipelined loop's of what its last call
        # launched (the plan after the one it read back)
        self.last_phases: dict[str, float] = {}
        self._prompt_tokens = 0
        self._gen_tokens = 0
        self._gen_counter = 0
        self.overlap_off_reason = overlap_off_reason(scheduler.config, decode_steps, async_overlap)
        self.pipeline = PipelinedRunner(runner) if self.overlap_off_reason is None else None
        self._in_flight: InFlight | None = None   # the plan launched and not read back (pipelined loop)
        self._last_read = 0.0                     # perf_counter at the last read-back
        # synchronous loop: perf_counter at the end of the last step while requests remained (None: idle since)
        self._busy_since: float | None = None
        self.step = self.step_overlapped if self.pipeline is not None else self.step_sync

    @property
    def async_overlap(self) -> bool:
        """True when ``step`` is the pipelined loop body."""
        return self.pipeline is not None

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_args(cls, model: str, load_format: str = "dummy", device: str = "cpu", dtype: str = "bf16", seed: int = 0,
                  max_model_len: int | None = None, num_kv_blocks: int | None = None,
                  scheduler_config: SchedulerConfig | dict | None = None,
                  routing_skew: float = 0.0, decode_steps: int = 1, eos_token_id: int | None = None,
                  kv_memory_fraction: float = 0.7, step_log=None, kernel_overrides: dict[str, str] | None = None,
                  num_layers: int | None = None, model_transform=None, cuda_graphs: bool | None = None,
                  enforce_eager: bool = False, async_overlap: bool | None = None,
                  piecewise_graphs: bool | None = None) -> "LLMEngine":
        """Build model, KV cache, scheduler and runner from names and options.

        ``model``: a catalog name (``tiny``, ...) or an HF checkpoint folder (config.json +
        safetensors). ``scheduler_config``: a SchedulerConfig or its dict (a plan file's ``scheduler``
        section: plan files are read in ``ui/serve_plan.py``). ``routing_skew``: Zipf-like expert skew for dummy weights.
        ``decode_steps``: most decode steps one plan may cover (multi-step decode).
        ``num_layers``: keep only the first n layers (a full-width model that fits one GPU, for benchmarks).
        ``model_transform``: callable(model) -> model applied before the KV cache is sized (EP sharding).
        ``cuda_graphs``: capture decode-only forwards as CUDA graphs per padded batch size (default: on for
        cuda without ``model_transform``, off elsewhere; executor/cuda_graphs.py); ``enforce_eager=True`` disables them (vLLM's name).
        ``piecewise_graphs``: with ``cuda_graphs``, also capture everything but attention per token bucket for prefill,
        mixed and MTP steps (executor/piecewise_graphs.py); None: env ``TWINFER_PIECEWISE_GRAPHS`` (default on).
        ``async_overlap``: pipelined loop (None: the scheduler config's; EP ranks, which step in lockstep, run synchronously).
        """
        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):   # cuda:N: one EP rank's GPU
            raise TwinferError(f"device {device!r}: expected 'cpu' or 'cuda'")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise TwinferError("device 'cuda' requested but torch sees no CUDA GPU (use --device cpu)")
        if dtype not in DTYPES:
            raise TwinferError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        if kernel_overrides:
            from kernels import ops, registry
            registry.configure(kernel_overrides)
            ops.clear_choices()
        hf_dir = model if os.path.isdir(model) else None
        spec = resolve_spec(model)
        if num_layers is not None:
            if not 1 <= num_layers <= spec.num_layers:
                raise TwinferError(f"num_layers={num_layers}: the model has 1..{spec.num_layers}")
            kinds = spec.layer_kinds[:num_layers] if spec.layer_kinds else []
            spec = spec.model_copy(update={"num_layers": num_layers, "layer_kinds": kinds})
        if scheduler_config is None:
            scheduler_config = SchedulerConfig()
        elif isinstance(scheduler_config, dict):
            scheduler_config = validate(SchedulerConfig, scheduler_config, "scheduler_config")
        if spec.mtp_layers and scheduler_config.draft_len == 0:
            # no drafts, no MTP layers: vLLM and SGLang load them only to draft (the simulator's memory_fit mtp=False)
            spec = spec.model_copy(update={"mtp_layers": 0})
        cfg = ExecModelConfig.build(spec, hf_dir)
        if max_model_len is not None and max_model_len > spec.max_context:
            # as vLLM refuses a max_model_len past the model's max_position_embeddings: it was capped without a word,
            # while calibrate and validate refused the same value
            raise TwinferError(f"max_model_len: {max_model_len:,} is past {spec.name}'s context of {spec.max_context:,} "
                               f"tokens (max_position_embeddings); give at most {spec.max_context:,}")
        mml = min(max_model_len or scheduler_config.max_model_len or spec.max_context, spec.max_context)
        sched_cfg = scheduler_config.model_copy(update={"max_model_len": mml})
        dev = torch.device(device)
        if device.startswith("cuda"):
            dev = torch.device("cuda", dev.index or 0)
            torch.cuda.set_device(dev)
        torch_dtype = DTYPES[dtype]
        net = build_model(cfg, dev, dtype, load_format, seed, routing_skew, max_pos=mml + sched_cfg.draft_len + 8)
        if model_transform is not None:
            net = model_transform(net)
        if num_kv_blocks is None:
            num_kv_blocks = _default_kv_blocks(cfg, sched_cfg.block_size, torch_dtype, dev, mml,
                                               sched_cfg.max_num_seqs, kv_memory_fraction)
        check_room((num_kv_blocks + 1) * KVCache.bytes_per_block(cfg, sched_cfg.block_size, torch_dtype), dev,
                   f"num_kv_blocks={num_kv_blocks} (blocks of {sched_cfg.block_size} tokens) on the CPU: the KV cache needs",
                   "give fewer blocks (--num-kv-blocks) or a smaller --max-model-len / --max-num-seqs where they size it")
        kv = KVCache(cfg, num_kv_blocks, sched_cfg.block_size, dev, torch_dtype)
        if eos_token_id is None:
            eos_token_id = cfg.eos_token_id
        if eos_token_id is None and load_format == "dummy":
            # dummy weights have no tokenizer: follow serve's byte tokenizer (EOS 257) when the vocab has room
            eos_token_id = 257 if spec.vocab_size > 257 else spec.vocab_size - 1
        runner = ModelRunner(net, kv, dev, eos_token_id, seed)
        if cuda_graphs is None:   # EP ranks (model_transform) run collectives in the forward: eager unless asked
            cuda_graphs = dev.type == "cuda" and model_transform is None
        graphs_on = bool(cuda_graphs) and not enforce_eager and dev.type == "cuda"
        if graphs_on and piecewise_graphs is None:
            from executor.piecewise_graphs import enabled_by_env
            piecewise_graphs = enabled_by_env()
        if dev.type == "cuda":   # compile vendor/Triton kernels per shape now, not inside timed steps or capture
            from executor.cuda_graphs import capture_sizes
            from executor.piecewise_graphs import token_sizes, unsupported_reason
            from kernels.warmup import eager_gemm_rows, jit_warmup, token_counts
            budget = sched_cfg.max_num_batched_tokens
            pw_buckets = graphs_on and piecewise_graphs and unsupported_reason(net) is None   # the buckets it will capture
            steps = token_sizes(budget) if pw_buckets else ()
            # the dense GEMMs also at every row count a step runs outside the captured sizes (multiples of 64)
            jit_warmup(net, dev, token_counts(capture_sizes(sched_cfg.max_num_seqs), budget, steps),
                       gemm_counts=eager_gemm_rows(budget, steps))
        if graphs_on:
            runner.enable_cuda_graphs(sched_cfg.max_num_seqs, mml + sched_cfg.draft_len + 1)
            if piecewise_graphs:
                runner.enable_piecewise_graphs(sched_cfg.max_num_batched_tokens, mtp=sched_cfg.draft_len > 0)
        sched = Scheduler(sched_cfg, num_kv_blocks)
        if sched.max_request_tokens < mml:
            # a --num-kv-blocks too small for the context: the context is what the KV holds, so that clients (serve's
            # /v1/models and context-length check) are told the limit instead of having requests refused past it
            if sched.max_request_tokens < 2:
                raise TwinferError(f"num_kv_blocks={num_kv_blocks} of {sched_cfg.block_size} tokens cannot hold one "
                                   f"request (a prompt token, an output token and {sched_cfg.draft_len} draft slots)")
            mml = sched.max_request_tokens
            sched = Scheduler(sched_cfg.model_copy(update={"max_model_len": mml}), num_kv_blocks)
            limit = f"the KV pool's (num_kv_blocks={num_kv_blocks} of {sched_cfg.block_size} tokens)"
        else:
            limit = ""
        name = Path(model).name if hf_dir else model
        if model_transform is not None:
            async_overlap = False
        engine = cls(cfg, runner, sched, mml, eos_token_id, name, decode_steps, step_log, async_overlap)
        engine.context_limit = limit
        return engine

    # ----------------------------------------------------------------- requests
    def now(self) -> float:
        """Seconds since the engine started (monotonic; the scheduler's clock)."""
        self._last_now = max(self._last_now, time.perf_counter() - self._t0 + self._skipped)
        return self._last_now

    def restart_clock(self) -> None:
        """Start the clock at 0 again (an idle engine, before an offline replay whose arrival times count from 0: the
        build and JIT warm-up before it must not count as queueing)."""
        if self.has_unfinished():
            raise RuntimeError("restart_clock on an engine with requests in flight")
        self._t0, self._last_now, self._skipped = time.perf_counter(), 0.0, 0.0

    def advance_clock(self, t: float) -> None:
        """Jump the clock forward to ``t`` when idle (offline replay skips gaps between arrivals)."""
        now = self.now()
        if t > now:
            self._skipped += t - now
            self._last_now = t

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> Request:
        """Queue a request (returned: the scheduler's object); raises TwinferError if it can never be served."""
        params = params or SamplingParams()
        if request_id in self._reqs:
            raise TwinferError(f"request id {request_id!r} is already in use")
        ids = list(prompt_token_ids)
        n = len(ids)
        if n == 0:
            raise TwinferError("prompt_token_ids is empty")
        if n >= self.max_model_len:
            raise TwinferError(f"prompt has {n} tokens; max_model_len is {self.max_model_len}"
                               + (f", {self.context_limit}" if self.context_limit else "")
                               + " (prompt + at least one output token)")
        try:   # one conversion: the range check and the block hashes read it (no per-token Python loop)
            arr = np.asarray(ids)
        except (ValueError, TypeError):   # ragged nesting
            arr = None
        if arr is None or arr.ndim != 1 or arr.dtype.kind not in "iub":
            bad = next((t for t in ids if not isinstance(t, (int, np.integer))), None)
            if bad is None:   # integers all, one beyond int64
                bad = max(ids, key=lambda t: abs(int(t)))
            raise TwinferError(f"prompt_token_ids: expected a flat list of integer token ids in [0, {self.vocab_size}), "
                               f"got {bad!r}")
        out_of_range = (arr < 0) | (arr >= self.vocab_size)
        if out_of_range.any():
            raise TwinferError(f"token id {ids[int(out_of_range.argmax())]} outside the vocabulary [0, {self.vocab_size})")
        out_len = min(params.max_tokens, self.max_model_len - n)
        req = Request(request_id=request_id, arrival_time=self.now() if arrival_time is None else arrival_time,
                      prompt_len=n, output_len=out_len,
                      block_hashes=block_hashes(arr, self.block_size) if self.scheduler.config.enable_prefix_caching else (),
                      prompt_token_ids=ids)
        self.runner.add_request(request_id, params)
        if not self.scheduler.add_request(req):
            self.runner.remove_request(request_id)
            raise TwinferError(f"request {request_id!r} refused: {req.drop_reason}")
        self._reqs[request_id] = req
        self._prompt_tokens += n
        return req

    def abort(self, request_id: str) -> bool:
        """Drop a request; its final output (finish_reason 'abort') comes with the next ``step``."""
        req = self._reqs.pop(request_id, None)
        if req is None:
            return False
        self.scheduler.abort(request_id)
        self.runner.remove_request(request_id)
        self._pending.append(TokenOutput(request_id, [], True, "abort", req.prompt_len, req.num_cached_tokens))
        return True

    def has_unfinished(self) -> bool:
        return bool(self._reqs) or bool(self._pending) or self._in_flight is not None

    # ----------------------------------------------------------------- the loop body
    def step_sync(self) -> list[TokenOutput]:
        """Schedule, execute and complete one plan; the token deltas it produced."""
        entered = time.perf_counter()
        outs, self._pending = self._pending, []
        if not self._reqs:
            self._busy_since = None
            return outs
        plan = self.scheduler.schedule(self.now(), max_steps=self.decode_steps)
        if plan.is_empty:
            return outs
        reqs = list(plan.decodes) + [c.request for c in plan.prefills]
        before = {r.request_id: len(r.output_token_ids) for r in reqs}
        scheduled = time.perf_counter()
        result = self.backend.execute(plan)
        executed = time.perf_counter()
        if self.step_log is not None:
            for rec in self.runner.step_records:
                self.step_log(rec)
        finished = {r.request_id for r in self.scheduler.complete(plan, result, self.now())}
        done_at = time.perf_counter()
        # where the loop's own time went this iteration (host seconds): scheduling the plan, and completing it
        self.last_phases = {"schedule_s": scheduled - entered, "complete_s": done_at - executed}
        if self.step_observer is not None:
            start, plan_, share = self._wall_share(entered, done_at, plan, result)
            self.share_start_s = start
            self.step_observer(start, plan_, share)
        for r in reqs:
            rid = r.request_id
            new = r.output_token_ids[before[rid]:]
            done = rid in finished
            if not new and not done:
                continue
            self._emit(outs, r, new, ("stop" if rid in result.finished_early else "length") if done else None)
        self._busy_since = done_at if self._reqs else None
        return outs

    def _wall_share(self, entered: float, done_at: float, plan, result: StepResult) -> tuple[float, object, StepResult]:
        """(start, plan, result) for the step observer, with the plan's share of the wall clock (``perf_counter``
        seconds up to ``done_at``, when the scheduler completed it) as its duration, as the pipelined loop reports it
        (``_read_back``): from where the share of the step before ended while the engine stayed busy (the token
        emission and the caller's arrival handling between two steps are the loop's), else from ``entered`` (this
        call); what the runner did not time goes to the plan's first step. A client sees tokens this far apart (the
        ITL), and the simulator prices a step as this whole iteration (runner + measured loop overhead)."""
        since = self._busy_since if self._busy_since is not None else entered
        d = np.array(result.step_durations, float)
        d[0] += max(0.0, done_at - since - float(d.sum()))
        share = dataclasses.replace(result, step_durations=d)
        return done_at - float(d.sum()) - self._t0 + self._skipped, plan, share

    def _emit(self, outs: list[TokenOutput], req: Request, new: list[int], reason: str | None) -> None:
        """Report ``req``'s new tokens in ``outs``; with a finish ``reason``, retire it (engine and runner)."""
        rid, fin = req.request_id, reason is not None
        self._gen_tokens += len(new)
        outs.append(TokenOutput(rid, list(new), fin, reason, req.prompt_len, req.num_cached_tokens))
        if fin:
            self._reqs.pop(rid, None)
            self.runner.remove_request(rid)

    def step_overlapped(self) -> list[TokenOutput]:
        """The pipelined loop body (async overlap): launch plan N+1, then read plan N back; N's token deltas.

        1. schedule and launch the next plan against the scheduler's speculative state (each request of the
           plan in flight counted as having its one token) while the device still runs the plan in flight;
        2. read that plan back: its tokens fill the placeholders, late stops finish (a request the new plan
           also runs wastes that one speculative step, its token there is dropped).
        With nothing in flight, the first plan and the one behind it are launched, so each call returns one
        plan's outputs (the first step starts cold, as ``costmodels.host.wall_time`` prices it)."""
        if self._in_flight is None and getattr(self.runner, "swa", None) is not None:
            # sliding-window replay rebuilds its batch from host token ids: no placeholders there yet
            self.pipeline, self.step = None, self.step_sync
            self.overlap_off_reason = "sliding-window replay (runner.swa) runs the synchronous loop"
            return self.step_sync()
        outs, self._pending = self._pending, []
        # this call's scheduling and (speculative) completion of what it launches: the host work between the last
        # read-back and the next launch, beside the admissions the replay times (a diagnostic, executor/replay.py)
        self.last_phases = {"schedule_s": 0.0, "complete_s": 0.0}
        nxt = self._launch_next(self._in_flight)
        if self._in_flight is None and nxt is not None:
            self._in_flight, nxt = nxt, self._launch_next(nxt)
        prev, self._in_flight = self._in_flight, nxt
        if prev is not None:
            outs += self._read_back(prev)
        return outs

    def _launch_next(self, prev: InFlight | None) -> InFlight | None:
        """Schedule a plan, launch it behind ``prev`` and complete it in the scheduler at once, speculatively:
        one (placeholder) token per decode and per completed prompt; finishes by length retire now, exactly."""
        if not self._reqs:
            return None
        t0 = time.perf_counter()
        plan = self.scheduler.schedule(self.now(), max_steps=1)
        ph = self.last_phases
        ph["schedule_s"] = ph.get("schedule_s", 0.0) + (time.perf_counter() - t0)
        if plan.is_empty:
            return None
        start = self.now()
        f = self.pipeline.launch(plan, prev)
        f.start_s = start
        f.firsts = [c.request for c in plan.prefills if c.is_last_chunk and c.request.first_token_time is None]
        t1 = time.perf_counter()
        f.finished = self.scheduler.complete(plan, StepResult(np.zeros(1)), self.now())
        ph["complete_s"] = ph.get("complete_s", 0.0) + (time.perf_counter() - t1)
        for r in f.firsts:     # the token times are set when the tokens exist (read-back): observers of the plan
            r.first_token_time = None   # read back before this one must not see them early
        for r in f.finished:
            r.finish_time = None
        return f

    def _read_back(self, f: InFlight) -> list[TokenOutput]:
        """Wait for ``f``'s samples; append them, finish late stops, fix the times the speculative completion
        set early (first token, finish: now, when the token exists), and report the deltas."""
        toks = self.pipeline.collect(f)
        now, t = self.now(), time.perf_counter()
        f.record["wall_s"] = wall = t - max(f.launched_at, self._last_read)   # this step's share of the wall clock
        self._last_read = t
        self.runner.step_records = [f.record]
        if self.step_log is not None:
            self.step_log(f.record)
        sampled, stopped = {}, set()
        for rid, row in f.rows.items():
            req = self._reqs.get(rid)
            if req is None:   # aborted, or stopped in the plan before (this was its speculative step)
                continue
            sampled[rid] = [toks[row]]
            req.output_token_ids.append(toks[row])
            if toks[row] in self.runner._state(rid).stop_ids:
                stopped.add(rid)
        for r in f.firsts:
            r.first_token_time = now
        done = {r.request_id for r in f.finished if r.request_id in sampled}
        for rid in stopped - done:   # (None: the next plan's speculative completion already retired it by length)
            req = self._reqs[rid]
            if self.scheduler.finish_late(rid, len(req.output_token_ids), now) is None:
                req.num_output_tokens = len(req.output_token_ids)
        for rid in done | stopped:
            self._reqs[rid].finish_time = now
        if self.step_observer is not None:
            self.share_start_s = now - wall
            self.step_observer(f.start_s, f.plan, StepResult(np.array([wall]), None, sampled, stopped))
        outs = []
        for rid, new in sampled.items():
            fin = rid in done or rid in stopped
            self._emit(outs, self._reqs[rid], new, ("stop" if rid in stopped else "length") if fin else None)
        return outs

    def warmup(self, batch_sizes: tuple[int, ...] = (1, 2, 17, 64), prompt_lens: tuple[int, ...] = (1, 17, 130)) -> float:
        """Run throwaway requests through a private scheduler (same config, same KV pages) so
        JIT work (Triton specialisations, vendor JIT, cuBLAS heuristics) happens before anything
        is timed. The engine's own scheduler, prefix cache and counters are untouched. Seconds spent."""
        t0 = time.perf_counter()
        cfg = self.scheduler.config
        sched = Scheduler(cfg, self.scheduler.blocks.num_blocks)
        params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
        n_id = 0
        for n in batch_sizes:
            n = min(n, cfg.max_num_seqs)
            rids = []
            for i in range(n):
                plen = min(prompt_lens[i % len(prompt_lens)], self.max_model_len - 4)
                rid = f"__warmup{n_id}"
                n_id += 1
                ids = [(7 * j + n_id) % self.vocab_size for j in range(plen)]
                req = Request(request_id=rid, arrival_time=0.0, prompt_len=plen, output_len=3, prompt_token_ids=ids)
                self.runner.add_request(rid, params)
                if sched.add_request(req):
                    rids.append(rid)
            while sched.has_work:
                plan = sched.schedule(0.0)
                if plan.is_empty:
                    break
                sched.complete(plan, self.backend.execute(plan), 0.0)
            for rid in rids:
                self.runner.remove_request(rid)
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize()
        freeze_gc_heap()
        return time.perf_counter() - t0

    def stats(self) -> EngineStats:
        """Current counters."""
        s = self.scheduler.stats()
        return EngineStats(num_running=s.num_running, num_waiting=s.num_waiting, kv_used_blocks=s.kv_used_blocks,
                           kv_total_blocks=s.kv_total_blocks, kv_held_blocks=s.kv_held_blocks,
                           prefix_cache_queries=s.prefix_query_tokens,
                           prefix_cache_hits=s.prefix_hit_tokens, prompt_tokens_total=self._prompt_tokens,
                           generation_tokens_total=self._gen_tokens)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None) -> list[list[int]]:
        """Offline: run all prompts to completion; generated token ids per prompt, in order."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise TwinferError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        self._gen_counter += 1
        ids = [f"gen{self._gen_counter}-{i}" for i in range(len(prompts))]
        for rid, p, sp in zip(ids, prompts, plist):
            self.add_request(rid, p, sp)
        got: dict[str, list[int]] = {rid: [] for rid in ids}
        left = set(ids)
        while left:
            for o in self.step():
                if o.request_id in got:
                    got[o.request_id].extend(o.new_token_ids)
                    if o.finished:
                        left.discard(o.request_id)
        return [got[rid] for rid in ids]
