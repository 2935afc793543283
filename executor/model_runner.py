"""Runs a StepPlan on the model: inputs, forward, sampling, MTP drafting and verification, timing.

One step: decodes (last token + pending MTP drafts each) and, in the plan's first step,
the prefill chunks are flattened into one batch; the forward writes their KV into the
pages the scheduler assigned; the target samples every decode position and the last
position of each completed prompt. A decode keeps ``1 + accepted`` tokens, where
``accepted`` is the longest prefix of its drafts matching the target's own samples (so
the output is exactly what the target alone would produce). The MTP head then proposes
the next drafts from the target's hidden states. ``num_steps > 1`` plans run back to back,
stopping early when a request hits a stop token.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from costmodels.step_profile import HOST_PHASES
from executor.forward_batch import ForwardBatch, SeqInput, build_forward_batch, to_device
from executor.kv_cache import KVCache
from executor.model_base import CausalLM
from executor.request_state import RequestState
from executor.sampling_params import SamplingParams
from kernels import ops
from scheduler.plan import StepPlan, StepResult
from scheduler.request import Request


class StepTimer:
    """Wall time of a step (synchronised) and, on CUDA, two event-timed spans: the step's (``device_s``: from the
    step's start to its end on the stream, so it includes any host gap while the GPU waits for the step's next launch)
    and its forward's (``forward_s``: the model's kernels or graph replay alone, the inputs already built), and the
    host seconds the forward call took to return (``forward_host_s``: issuing its launches, plus any wait inside it for
    the device; with the GPU held busy beforehand, as ``executor.calibrate.measure_steps`` does, the issue alone)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.ev0, self.ev1, self.f0, self.f1 = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        self.forward_marked = False
        self.h0 = self.h1 = 0.0

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.forward_marked = False
        if self.cuda:
            self.ev0.record()

    def forward_start(self) -> None:
        if self.cuda:
            self.f0.record()
        self.h0 = time.perf_counter()

    def forward_stop(self) -> None:
        self.h1 = time.perf_counter()
        if self.cuda:
            self.f1.record()
            self.forward_marked = True

    @property
    def forward_host_s(self) -> float:
        """Host seconds between ``forward_start`` and ``forward_stop`` of the last step (0 when not marked)."""
        return max(self.h1 - self.h0, 0.0)

    def stop(self) -> tuple[float, float, float]:
        """(wall seconds, device seconds or nan, forward seconds or nan)."""
        dev = fwd = float("nan")
        if self.cuda:
            self.ev1.record()
            self.ev1.synchronize()
            dev = self.ev0.elapsed_time(self.ev1) / 1e3
            if self.forward_marked:
                fwd = self.f0.elapsed_time(self.f1) / 1e3
        return time.perf_counter() - self.t0, dev, fwd


def accepted_prefix(drafts: list[int], samples: list[int]) -> int:
    """Number of leading drafts equal to the target's samples at the same positions."""
    a = 0
    while a < len(drafts) and drafts[a] == samples[a]:
        a += 1
    return a


def step_record(prefills: list, nd: int, sq: int, num_tokens: int, decode_context_tokens: int, accepted_drafts: int,
                wall: float, dev: float, graph_bs: int, piecewise_bs: int, fwd: float = float("nan"),
                fwd_host: float = float("nan"), phases: dict[str, float] | None = None) -> dict:
    """One executed step's record (``ModelRunner.step_records``, the step log's row): its batch, times, the kernel
    implementations used since the last record, the CUDA graph it replayed (``graph_bs`` 0: none) and the token bucket
    of the piecewise graphs it replayed (``piecewise_bs`` 0: none; executor/piecewise_graphs.py); ``host_phases``:
    seconds per :data:`HOST_PHASES` entry where the runner timed them ({} otherwise)."""
    return {
        "num_decodes": nd, "decode_sq": sq if nd else 0,
        "num_prefills": len(prefills), "prefill_tokens": int(sum(c.num_new_tokens for c in prefills)),
        "num_tokens": num_tokens,
        "decode_context_tokens": decode_context_tokens,
        "prefill_context_tokens": int(sum(c.context_len for c in prefills)),
        "accepted_drafts": accepted_drafts,
        "wall_s": wall, "device_s": dev, "forward_s": fwd, "forward_host_s": fwd_host, "backends": ops.reset_used(),
        "cuda_graph": graph_bs > 0, "graph_bs": graph_bs, "piecewise_bs": piecewise_bs,
        "host_phases": phases or {},
    }


class ModelRunner:
    """Owns the model, the paged KV cache and per-request sampling state."""

    def __init__(self, model: CausalLM, kv: KVCache, device: torch.device, eos_token_id: int | None, seed: int = 0):
        self.model, self.kv, self.device = model, kv, device
        self.page_size = kv.page_size
        self.eos_token_id, self.seed = eos_token_id, seed
        self.states: dict[str, RequestState] = {}
        self.timer = StepTimer(device)
        self.step_records: list[dict] = []   # one per executed step of the last plan
        self.num_steps_run = 0
        self.graphs = None   # executor.cuda_graphs.DecodeGraphs once enable_cuda_graphs ran
        self.graphs_off_reason: str | None = None
        self.piecewise = None   # executor.piecewise_graphs.PiecewiseGraphs once enable_piecewise_graphs ran
        self.piecewise_off_reason: str | None = None
        self.swa = None      # executor.swa_replay.SWAReplay: sliding-window layers' policy on resume (None: plain forward)

    # ----------------------------------------------------------------- CUDA graphs
    def enable_cuda_graphs(self, max_num_seqs: int, max_model_len: int, sizes: tuple[int, ...] | None = None) -> bool:
        """Capture decode forwards for padded batch sizes up to ``max_num_seqs`` (CUDA only; False otherwise)."""
        from executor import cuda_graphs as cg
        if not cg.graphs_supported(self.device):
            self.graphs_off_reason = "not a CUDA device"
            return False
        self.graphs_off_reason = cg.unsupported_reason(self.model)
        if self.graphs_off_reason is not None:
            return False
        bs = cg.capture_sizes(max_num_seqs, sizes or cg.DEFAULT_CAPTURE_SIZES)
        if not bs:
            return False
        max_pages = -(-(max_model_len + 1) // self.page_size)
        self.graphs = cg.DecodeGraphs(self.model, self.kv, self.device, bs, max_pages)
        self.graphs.capture()
        return bool(self.graphs.captured)

    def enable_piecewise_graphs(self, max_tokens: int, sizes: tuple[int, ...] | None = None, capture: bool = True,
                                log=None, mtp: bool = True) -> bool:
        """Capture the forward's pieces (all but attention) per token bucket up to ``max_tokens``, for steps the decode
        graphs do not take (prompt chunks, MTP). ``capture=False`` runs the same pieces eagerly through the static
        buffers (any device: how the CPU tests check them). ``mtp``: also the MTP layers' draft forwards (engines
        that draft: ``draft_len > 0``). False when nothing is set up (reason kept)."""
        from executor import cuda_graphs as cg
        from executor import piecewise_graphs as pg
        if capture and not cg.graphs_supported(self.device):
            self.piecewise_off_reason = "not a CUDA device"
            return False
        self.piecewise_off_reason = pg.unsupported_reason(self.model)
        if self.piecewise_off_reason is not None:
            return False
        buckets = pg.token_sizes(max_tokens, sizes or pg.DEFAULT_TOKEN_SIZES)
        if not buckets:
            self.piecewise_off_reason = "no token bucket under the step budget"
            return False
        self.piecewise = pg.PiecewiseGraphs(self.model, self.kv, self.device, buckets, capture=capture, log=log, mtp=mtp)
        self.piecewise.capture()
        return bool(self.piecewise.captured)

    def forward(self, batch: ForwardBatch, eager=None) -> tuple[torch.Tensor, int, int]:
        """(final hidden states, decode-graph size, piecewise bucket): a whole-forward decode graph when one fits,
        else the piecewise graphs when the token count fits a bucket, else eager (sizes 0 when not used). ``eager``:
        a forward of its own to fall back on (sliding-window replay: its rows differ, so no pieces either)."""
        replayed = self.graphs.run(batch) if self.graphs is not None else None
        if replayed is not None:
            return replayed[0], replayed[1], 0
        if eager is not None:
            return eager(), 0, 0
        pieced = self.piecewise.run(batch) if self.piecewise is not None else None
        if pieced is not None:
            return pieced[0], 0, pieced[1]
        return self.model(batch, self.kv), 0, 0

    # ----------------------------------------------------------------- requests
    def add_request(self, request_id: str, params: SamplingParams) -> None:
        self.states[request_id] = RequestState.create(request_id, params, self.eos_token_id, self.seed, self.device)

    def remove_request(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def _state(self, request_id: str) -> RequestState:
        st = self.states.get(request_id)
        if st is None:  # a request added straight to the scheduler: greedy, EOS stops
            st = self.states[request_id] = RequestState.create(
                request_id, SamplingParams(temperature=0.0, max_tokens=1), self.eos_token_id, self.seed, self.device)
        return st

    @staticmethod
    def _last_token(req: Request, produced: list[int]) -> int:
        """The newest known token (no list concatenation: this runs per decode per step)."""
        if produced:
            return produced[-1]
        if req.output_token_ids:
            return req.output_token_ids[-1]
        return req.prompt_token_ids[-1]

    @staticmethod
    def _tokens(req: Request) -> list[int]:
        if req.prompt_token_ids is None:
            raise ValueError(f"request {req.request_id} has no prompt_token_ids: the executor needs real tokens")
        return req.prompt_token_ids + req.output_token_ids

    @classmethod
    def chunk_tokens(cls, req: Request, start: int, n: int) -> list[int]:
        """Tokens ``start .. start + n`` of ``req``'s prompt and outputs: a slice of the prompt when they lie in it
        (a prompt step's launch pays this per chunk; joining a 12k-token prompt to its outputs first costs ~50 us)."""
        p = req.prompt_token_ids
        if p is not None and start + n <= len(p):
            return p[start: start + n]
        return cls._tokens(req)[start: start + n]

    # ----------------------------------------------------------------- sampling
    def _rows(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """``hidden[rows]`` without a blocking copy of the index: a slice when the rows run contiguously (decodes
        of one query each, then the last row of a prompt), else an index built on the host and copied once."""
        if rows and all(b - a == 1 for a, b in zip(rows, rows[1:])):
            return hidden[rows[0]: rows[-1] + 1]
        return hidden.index_select(0, to_device(np.asarray(rows, dtype=np.int64), hidden.device))

    def sample_on_device(self, hidden: torch.Tensor, rows: list[int], rids: list[str]) -> torch.Tensor:
        """The sampled token id of each row, left on the device (int64; the pipelined step reads it back later)."""
        logits = self.model.compute_logits(self._rows(hidden, rows))
        sts = [self._state(r) for r in rids]
        if all(s.params.temperature == 0 for s in sts):
            return logits.argmax(-1)
        # the knobs stay on the host: the sampler reads them there and copies them once, pinned (read back from the
        # device they made the host wait for this step's forward, which undid the pipelined loop's overlap)
        host = torch.tensor([[s.params.temperature for s in sts], [s.params.top_k for s in sts], [s.params.top_p for s in sts]],
                            dtype=torch.float64)
        return ops.sample(logits, host[0].float(), host[1].long(), host[2].float(), [s.generator for s in sts]).to(torch.int64)

    # ----------------------------------------------------------------- the plan
    @torch.inference_mode()
    def execute(self, plan: StepPlan, stop_at: float | None = None) -> StepResult:
        """Run ``plan`` (``num_steps`` steps back to back, fewer if a request stops early); the
        ``Backend`` of scheduler/backend.py. ``stop_at`` (``time.perf_counter()`` seconds): stop
        after the first step that ends at/after it."""
        for r in plan.preempted:
            if r.request_id in self.states:
                self.states[r.request_id].drafts = []
        decodes, nd, k = plan.decodes, len(plan.decodes), plan.draft_len
        sq = 1 + k
        ctx = [int(c) for c in plan.decode_context_lens]
        produced: dict[str, list[int]] = {r.request_id: [] for r in decodes}
        remaining = [r.output_len - r.num_output_tokens for r in decodes]
        sampled: dict[str, list[int]] = {}
        finished_early: set[str] = set()
        durations, counts = [], []
        self.step_records = []
        for step in range(plan.num_steps):
            self.timer.start()
            ops.reset_used()
            seqs: list[SeqInput] = []
            for i, r in enumerate(decodes):
                last = self._last_token(r, produced[r.request_id])
                drafts = (self._state(r.request_id).drafts + [last] * k)[:k]
                seqs.append(SeqInput([last] + drafts, ctx[i], r.block_ids, True))
            prefills = plan.prefills if step == 0 else []
            for c in prefills:
                toks = self.chunk_tokens(c.request, c.context_len, c.num_new_tokens)
                seqs.append(SeqInput(toks, c.context_len, c.request.block_ids, False))
            batch = build_forward_batch(seqs, self.page_size, self.kv.null_page, self.device)
            eager = None
            if self.swa is not None:   # resumed chunks carry the policy's extra rows (executor/swa_replay.py)
                eager = lambda: self.swa.forward(self.model, seqs, [self._tokens(c.request) for c in prefills],  # noqa: E731,B023
                                                 self.kv, [getattr(c, "replayed", 0) for c in prefills])
            self.timer.forward_start()
            hidden, graph_bs, piece_bs = self.forward(batch, eager)
            self.timer.forward_stop()

            rows, rids = [], []
            for i, r in enumerate(decodes):
                rows.extend(range(i * sq, (i + 1) * sq))
                rids.extend([r.request_id] * sq)
            for c, span in zip(prefills, batch.prefills):
                if c.is_last_chunk:
                    rows.append(span.start + span.num - 1)
                    rids.append(c.request.request_id)
            dev_toks = self.sample_on_device(hidden, rows, rids) if rows else None
            t_sampled = time.perf_counter()
            toks = dev_toks.tolist() if rows else []
            t_read = time.perf_counter()

            step_count = np.zeros(nd, np.int64)
            accepted = [0] * nd
            for i, r in enumerate(decodes):
                y = toks[i * sq:(i + 1) * sq]
                a = accepted_prefix(seqs[i].token_ids[1:], y)
                new = y[: min(a + 1, max(remaining[i], 0))]
                stops = self._state(r.request_id).stop_ids
                for j, t in enumerate(new):
                    if t in stops:
                        new = new[: j + 1]
                        finished_early.add(r.request_id)
                        break
                accepted[i] = a
                produced[r.request_id].extend(new)
                remaining[i] -= len(new)
                ctx[i] += len(new)
                step_count[i] = len(new)
            pos = nd * sq
            for c in prefills:
                if c.is_last_chunk:
                    t = toks[pos]
                    pos += 1
                    sampled[c.request.request_id] = [t]
                    if t in self._state(c.request.request_id).stop_ids:
                        finished_early.add(c.request.request_id)

            if k > 0 and self.model.num_mtp > 0:
                self._propose(batch, hidden, seqs, decodes, prefills, toks, accepted, k)

            t_post = time.perf_counter()
            wall, dev, fwd = self.timer.stop()
            durations.append(wall)
            counts.append(step_count)
            tm = self.timer
            phases = dict(zip(HOST_PHASES, (tm.h0 - tm.t0, t_sampled - tm.h1, t_read - t_sampled, t_post - t_read)))
            self.step_records.append(step_record(prefills, nd, sq, batch.num_tokens,
                                                 batch.decode_context_tokens, int(sum(accepted)),
                                                 wall, dev, graph_bs, piece_bs, fwd, tm.forward_host_s, phases))
            self.num_steps_run += 1
            if finished_early or any(x <= 0 for x in remaining):
                break
            if stop_at is not None and time.perf_counter() >= stop_at:
                break
        for r in decodes:
            sampled[r.request_id] = produced[r.request_id]
        dec = np.stack(counts) if nd else np.zeros((len(durations), 0), np.int64)
        return StepResult(np.asarray(durations), dec, sampled, finished_early)

    # ----------------------------------------------------------------- MTP
    def _mtp_forward(self, j: int, batch: ForwardBatch, prev_hidden: torch.Tensor) -> torch.Tensor:
        """MTP layer ``j``'s draft forward: through the piecewise graphs when the token count fits a bucket (its
        embedding, projections and MoE replayed, attention eager), else eagerly (``model.mtp_forward``)."""
        if self.piecewise is not None:
            h = self.piecewise.run_mtp(j, batch, prev_hidden)
            if h is not None:
                return h
        return self.model.mtp_forward(j, batch, prev_hidden, self.kv)

    def _propose(self, batch: ForwardBatch, hidden: torch.Tensor, seqs: list[SeqInput], decodes: list[Request],
                 prefills: list, toks: list[int], accepted: list[int], k: int) -> None:
        """Run the MTP layer over the batch (filling its KV) and chain it ``k`` times to draft tokens."""
        nd, sq = len(decodes), 1 + k
        nxt: list[int] = []
        anchors: list[tuple[str, int, list[int], int]] = []   # (request id, row, block table, position)
        for i, r in enumerate(decodes):
            nxt.extend(toks[i * sq:(i + 1) * sq])   # next token of each position = the target's sample there
            row = i * sq + accepted[i]
            anchors.append((r.request_id, row, r.block_ids, seqs[i].context_len + accepted[i]))
        pos = nd * sq
        for c, s, span in zip(prefills, seqs[nd:], batch.prefills):
            end = c.context_len + c.num_new_tokens
            follow = toks[pos] if c.is_last_chunk else self.chunk_tokens(c.request, end, 1)[0]
            if c.is_last_chunk:
                pos += 1
                anchors.append((c.request.request_id, span.start + span.num - 1, c.request.block_ids, end - 1))
            nxt.extend(s.token_ids[1:] + [follow])
        mtp_batch = dataclasses.replace(batch, input_ids=to_device(np.asarray(nxt, dtype=np.int64), self.device))
        h = self._mtp_forward(0, mtp_batch, hidden)
        if not anchors:
            return
        rows = [a[1] for a in anchors]
        h = self._rows(h, rows)
        draft = self.model.mtp_logits(0, h).argmax(-1)
        drafts = [draft.tolist()]
        for j in range(1, k):
            layer = min(j, self.model.num_mtp - 1)
            chain = [SeqInput([d], p + j, bt, True) for (_, _, bt, p), d in zip(anchors, drafts[-1])]
            cb = build_forward_batch(chain, self.page_size, self.kv.null_page, self.device)
            h = self._mtp_forward(layer, cb, h)
            drafts.append(self.model.mtp_logits(layer, h).argmax(-1).tolist())
        for n, (rid, _, _, _) in enumerate(anchors):
            if rid in self.states:
                self.states[rid].drafts = [d[n] for d in drafts]

