"""The device half of the pipelined (async-overlap) step: launch a plan without waiting for it, read it back later.

SGLang's overlap scheduler and vLLM's async scheduling run the host one step ahead of the
device: while the GPU runs step N, the CPU schedules step N+1 and builds its inputs. A decode
of step N+1 whose last token is step N's sample does not know that token yet, so its input
is a placeholder filled on the device from step N's sampled ids (an index copy queued behind
step N: nothing waits). ``launch`` queues the forward and the sampling and returns at once
(CUDA kernels are asynchronous); ``collect`` waits for that plan's samples only and reads them
back. On CPU every op completes when called, so the order is the same and nothing overlaps.

Only single-step plans without MTP drafts are pipelined (a decode's drafts depend on how many
of the previous step's were accepted); the engine runs other configurations synchronously.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from executor.forward_batch import SeqInput, build_forward_batch, to_device
from executor.model_runner import ModelRunner, step_record
from kernels import ops
from scheduler.plan import StepPlan
from scheduler.request import Request


@dataclass
class InFlight:
    """A launched plan: its sampled ids still on the device, and what the engine needs to reconcile them."""

    plan: StepPlan
    toks: torch.Tensor | None           # sampled ids (int64, device): decodes, then completed prompts
    rows: dict[str, int]                # request id -> its row in ``toks``
    record: dict                        # the runner's step record (times filled by ``collect``)
    launched_at: float                  # perf_counter at launch
    start_s: float = 0.0                # engine clock at launch
    host_toks: torch.Tensor | None = None   # pinned copy of ``toks`` (CUDA), valid once ``done`` fired
    done: object = None                 # torch.cuda.Event recorded after the copy (CUDA), else None
    ev_start: object = None             # torch.cuda.Event at launch (device time)
    firsts: list[Request] = field(default_factory=list)     # requests whose first token this plan samples
    finished: list[Request] = field(default_factory=list)   # retired by the speculative completion (length)


class PipelinedRunner:
    """``launch(plan, prev)`` / ``collect(inflight)`` over a ModelRunner's model, KV cache and CUDA graphs."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.cuda = runner.device.type == "cuda"

    @torch.inference_mode()
    def launch(self, plan: StepPlan, prev: InFlight | None) -> InFlight:
        """Build the plan's inputs (placeholders for tokens ``prev`` has not read back), queue its forward
        and sampling; return without waiting for the device."""
        run = self.runner
        t0 = time.perf_counter()
        ev0 = None
        if self.cuda:
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        ops.reset_used()
        for r in plan.preempted:
            if r.request_id in run.states:
                run.states[r.request_id].drafts = []
        seqs, dst, src = self._inputs(plan, prev)
        batch = build_forward_batch(seqs, run.page_size, run.kv.null_page, run.device)
        if dst:   # placeholders take step N's samples on the device, queued behind step N
            # both index lists in one pinned, non-blocking copy: a tensor made with device= copies from pageable
            # memory, which waits for step N on the device and so undoes the overlap
            idx = to_device(np.array([dst, src], dtype=np.int64), run.device)
            batch.input_ids.index_copy_(0, idx[0], prev.toks.index_select(0, idx[1]))
        h0 = time.perf_counter()
        hidden, graph_bs, piece_bs = run.forward(batch)
        h1 = time.perf_counter()
        rows, rids, at = [], [], {}
        for i, r in enumerate(plan.decodes):
            at[r.request_id] = len(rows)
            rows.append(i)
            rids.append(r.request_id)
        for c, span in zip(plan.prefills, batch.prefills):
            if c.is_last_chunk:
                at[c.request.request_id] = len(rows)
                rows.append(span.start + span.num - 1)
                rids.append(c.request.request_id)
        toks = run.sample_on_device(hidden, rows, rids) if rows else None
        f = InFlight(plan, toks, at, self._record(plan, seqs, batch.num_tokens, graph_bs, piece_bs), t0, ev_start=ev0)
        if self.cuda and toks is not None:
            f.host_toks = torch.empty(toks.shape, dtype=toks.dtype, pin_memory=True)
            f.host_toks.copy_(toks, non_blocking=True)
        if self.cuda:
            f.done = torch.cuda.Event(enable_timing=True)
            f.done.record()
        # the launch's host phases, as the synchronous runner names them (HOST_PHASES): the input build, the
        # forward's issue (``forward_host_s``), the sampler's issue and the read-back copy's; a wait inside any of
        # them (a copy or call that blocks on the device) shows there, not in the read-back
        t1 = time.perf_counter()
        f.record["forward_host_s"] = h1 - h0
        f.record["host_phases"] = {"inputs": h0 - t0, "sample": t1 - h1}
        return f

    def _inputs(self, plan: StepPlan, prev: InFlight | None) -> tuple[list[SeqInput], list[int], list[int]]:
        """The plan's sequences; a decode whose newest token is still on the device gets placeholder 0 at
        flat row ``dst[j]``, to be filled from ``prev.toks[src[j]]``."""
        run = self.runner
        seqs: list[SeqInput] = []
        dst: list[int] = []
        src: list[int] = []
        ctx = plan.decode_context_lens
        for i, r in enumerate(plan.decodes):
            if r.num_output_tokens > len(r.output_token_ids):   # counted speculatively, sampled by ``prev``
                if prev is None or r.request_id not in prev.rows:
                    raise RuntimeError(f"request {r.request_id}: a pending token that no step in flight samples")
                dst.append(i)
                src.append(prev.rows[r.request_id])
                last = 0
            else:
                last = run._last_token(r, [])
            seqs.append(SeqInput([last], int(ctx[i]), r.block_ids, True))
        for c in plan.prefills:
            toks = run.chunk_tokens(c.request, c.context_len, c.num_new_tokens)
            if len(toks) != c.num_new_tokens:   # recomputes start only after their tokens were read back
                raise RuntimeError(f"request {c.request.request_id}: prompt chunk needs tokens not read back yet")
            seqs.append(SeqInput(toks, c.context_len, c.request.block_ids, False))
        return seqs, dst, src

    @staticmethod
    def _record(plan: StepPlan, seqs: list[SeqInput], num_tokens: int, graph_bs: int, piece_bs: int) -> dict:
        """The runner's step record from host-side figures only: reading a device tensor here would wait for the
        device and undo the overlap (times filled by ``collect``)."""
        nd = len(plan.decodes)
        return step_record(plan.prefills, nd, 1, num_tokens, int(sum(s.context_len + 1 for s in seqs[:nd])), 0,
                           0.0, float("nan"), graph_bs, piece_bs)

    def collect(self, f: InFlight) -> list[int]:
        """Wait for ``f``'s samples (only: later launches keep the device busy) and return them, one id per row."""
        if f.done is not None:
            f.done.synchronize()
            if f.ev_start is not None:
                f.record["device_s"] = f.ev_start.elapsed_time(f.done) / 1e3
        self.runner.num_steps_run += 1
        if f.toks is None:
            return []
        return (f.host_toks if f.host_toks is not None else f.toks).tolist()
