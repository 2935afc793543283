"""Piecewise CUDA graphs for prefill, mixed and MTP steps (vLLM v1's piecewise cudagraphs).

Why: an eager step pays the host issue of every op (the H200, 5-layer DeepSeek-V3 FP8 at ec5f1df: eager prefill of
64 tokens 13.6 ms, 512 tokens 17.1 ms, mixed steps 17-18 ms, against a b=1 decode graph of 3.3 ms;
benchmarks/gpu/issue18_h200/eager_ec5f1df). Decode-only steps replay whole-forward graphs (executor/cuda_graphs.py);
steps with prompt chunks cannot, because attention's work depends on each chunk's length and cached context. Here
everything but attention is captured, per padded token count, and attention runs eagerly between the replays.

The cut (L decoder layers, L+1 pieces; ``project``/``attend``/``output`` are executor/mla.py's split):

- piece 0: embedding, layer 0's input norm and ``project`` (q/kv projections, latent norms, RoPE, KV-cache write);
- piece i (1..L-1): layer i-1's ``output`` (o_proj), residual, post-attention norm, MLP/MoE, residual, then layer i's
  input norm and ``project``;
- piece L: layer L-1's ``output``, residual, norm, MLP/MoE, residual, the final norm.

Between piece i and i+1, ``attend`` of layer i runs eagerly over the step's real rows with the step's own decode
block tables, KV lengths and prefill spans.

Static buffers (one set, sized for the largest bucket, outside the graph pool): token ids / positions / KV slots
(``[3, max]`` int64), the residual stream ``x``, the queries ``q`` (``[.., h, dn+dr]``: q_nope then the rotated q_pe),
attention's output ``out`` and the final hidden states. A piece reads them and writes its results back into them
(a copy each: the graphs' own outputs then die with the capture, so buckets share one pool instead of each keeping
its outputs). Per-step values inside a piece are only the three index rows; the RoPE rows are gathered inside piece 0
(``ForwardBatch.rope_rows`` memo of the bucket's static batch) and MoE routing is computed on the device from the
hidden states (the Triton MoE sizes its grid by the no-sync upper bound ``pairs + E x (block_m - 1)`` of the padded
token count: static per bucket).

Padding rows (``T`` real tokens padded to bucket ``B``): token 0 at position 0, KV slot 0 of the null page (which
absorbs junk writes by design, executor/kv_cache.py). ``attend`` only reads and writes rows ``[:T]``; padding rows of
``out`` keep earlier finite values. Every op in a piece is row-independent (row-wise norms and FP8 quantisation,
GEMMs, per-token routing and expert GEMMs), so padding rows never touch real rows; they do cost expert work (vLLM
accepts the same). The real rows' values still differ from an unpadded eager forward's by the kernels' choices that
depend on the row count (tiles, the MoE's rows per block): on the H200, 544 tokens in the 640 bucket differed from
eager by 8.2e-2 (DeepSeek-V3) and 9.8e-2 (V3.2) in max |diff| / max |out| (bf16 activations, FP8 weights, 5 dummy
layers), and the same pieces run uncaptured with the same padding gave the captured output exactly
(benchmarks/gpu/issue18_h200/gc_ab_f0f3eec); a bucket the step fills matches eager exactly.

Buckets: :data:`DEFAULT_TOKEN_SIZES` capped by the step token budget (vLLM's 1, 2, 4, 8..512 list, then coarser up
to 4096: above a few thousand tokens the device time exceeds the host issue time and graphs buy little). Capture
runs at engine start, largest first, with one progress line per ~10 buckets; a bucket whose capture raises stays
eager (``failed``) and a failure of the largest stops the rest. Batches over the largest bucket run eagerly.

DSA models (DeepSeek-V3.2): the indexer's per-token part (its keys written to the cache, its queries and head weights)
runs in ``project``, inside the pieces, into two more static buffers; its top-k (which branches on the step's KV
lengths) runs in ``attend``, eagerly, with the sparse attention. Their decode-only steps come here too: the whole-forward
decode graphs do not take them (executor/cuda_graphs.py).

MTP drafting (models with MTP layers): each MTP layer's draft forward is two more pieces per bucket around its
attention (``mtp_piece``: the next tokens' embedding and the previous hidden states through enorm/hnorm/eh_proj and
the block's ``project``; then its ``output`` and MoE), reading ``mtp_in`` and writing ``mtp_out``; the main model's
forward of an MTP step (``decode_sq > 1``) is the ordinary pieces. ``ModelRunner._mtp_forward`` takes them.

Not covered (eager, ``unsupported_reason``): sliding-window layers and attention without the project/attend/output
split (GQA/Llama).

``capture=False`` runs the very same pieces eagerly through the static buffers with padding: the CPU tests check the
split and the padding that way (no CUDA graphs on CPU).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from unittest import mock

import torch

from executor.cuda_graphs import DEFAULT_CAPTURE_SIZES, bucket_for, capture_sizes
from executor.forward_batch import ForwardBatch

# vLLM's decode capture list up to 512 (executor/cuda_graphs.py), then steps of 128 to 1024, 256 to 2048, 512 to 4096
DEFAULT_TOKEN_SIZES: tuple[int, ...] = (DEFAULT_CAPTURE_SIZES + tuple(range(640, 1025, 128)) + tuple(range(1280, 2049, 256))
                                        + tuple(range(2560, 4097, 512)))

ENV = "TWINFER_PIECEWISE_GRAPHS"   # 0/off disables piecewise graphs (the engine arg wins when given)


def enabled_by_env(default: bool = True) -> bool:
    """``TWINFER_PIECEWISE_GRAPHS``: 1/on/true/yes or 0/off/false/no; unset or empty gives ``default``."""
    v = os.environ.get(ENV, "").strip().lower()
    if not v:
        return default
    if v in ("1", "on", "true", "yes"):
        return True
    if v in ("0", "off", "false", "no"):
        return False
    from twinfer.errors import TwinferError
    raise TwinferError(f"{ENV}={v!r}: expected 1/on/true/yes or 0/off/false/no")


def token_sizes(max_tokens: int, sizes: tuple[int, ...] = DEFAULT_TOKEN_SIZES) -> list[int]:
    """Buckets to capture: those below the step token budget, plus the budget itself when it lies inside the range."""
    return capture_sizes(max_tokens, sizes)


def unsupported_reason(model) -> str | None:
    """Why ``model``'s forward cannot be cut into pieces, or None."""
    if any(hasattr(m, "window") for m in model.modules()):
        return "sliding-window layers: per-sequence windowed attention (executor/swa.py)"
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        if not all(hasattr(attn, f) for f in ("project", "attend", "output")) or not hasattr(layer, "after_attention"):
            return f"layer {i}: attention {type(attn).__name__} has no project/attend/output split"
    return None


class PieceBuffers:
    """The static tensors every piece reads and writes, sized for ``max_tokens`` rows."""

    def __init__(self, model, kv, max_tokens: int, device: torch.device, mtp: bool = True):
        attn = model.model.layers[0].self_attn
        hidden = model.model.embed_tokens.weight.shape[1]
        dtype = model.model.embed_tokens.weight.dtype
        self.h, self.dn, self.dr, self.dv = attn.h, attn.dn, attn.dr, attn.dv
        self.page_size = kv.page_size
        self.index = torch.zeros(3, max_tokens, dtype=torch.int64, device=device)   # token ids, positions, KV slots
        # what padding rows hold: token 0, position 0, slot 0 of the null page
        self.pad = torch.zeros(3, max_tokens, dtype=torch.int64, device=device)
        self.pad[2].fill_(kv.null_page * kv.page_size)
        self.x = torch.zeros(max_tokens, hidden, dtype=dtype, device=device)
        self.q = torch.zeros(max_tokens, self.h, self.dn + self.dr, dtype=dtype, device=device)
        self.out = torch.zeros(max_tokens, self.h, self.dv, dtype=dtype, device=device)
        self.hidden = torch.zeros(max_tokens, hidden, dtype=dtype, device=device)
        # MTP drafting (models with MTP layers): the previous hidden states in, the MTP block's output out (its own
        # buffer: the main forward's ``hidden`` stays readable while the draft runs)
        self.mtp_in = self.mtp_out = None
        if mtp and getattr(model, "num_mtp", 0):
            self.mtp_in = torch.zeros(max_tokens, hidden, dtype=dtype, device=device)
            self.mtp_out = torch.zeros(max_tokens, hidden, dtype=dtype, device=device)
        # DSA: the indexer's queries and head weights, written by ``project`` in a piece, read by the eager top-k
        ix = attn.indexer
        self.idx_q = self.idx_w = None
        if ix is not None:
            self.idx_q = torch.zeros(max_tokens, ix.n_heads, ix.head_dim, dtype=dtype, device=device)
            self.idx_w = torch.zeros(max_tokens, ix.n_heads, dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                                     device=device)
        self.batches: dict[int, ForwardBatch] = {}
        self.mtp_batches: dict[int, ForwardBatch] = {}   # the MTP pieces' own (their RoPE rows gathered in their graph)

    def fill(self, batch: ForwardBatch | None, size: int) -> None:
        """Rows ``[:T]`` from ``batch`` (device-to-device, no sync), rows ``[T:size]`` padding."""
        t = batch.num_tokens if batch is not None else 0
        if t > size:
            raise ValueError(f"batch of {t} tokens does not fit the piece bucket of {size}")
        if t:
            self.index[0, :t].copy_(batch.input_ids, non_blocking=True)
            self.index[1, :t].copy_(batch.positions, non_blocking=True)
            self.index[2, :t].copy_(batch.slot_mapping, non_blocking=True)
        if size > t:
            self.index[:, t:size].copy_(self.pad[:, t:size], non_blocking=True)

    def batch(self, size: int, fresh: bool = False, mtp: bool = False) -> ForwardBatch:
        """The static ForwardBatch of bucket ``size`` (views of fixed addresses; what ``project`` reads: positions,
        slots, and the RoPE rows it memoises). One object per bucket, kept: its memo holds the RoPE rows piece 0's
        graph writes and the later pieces' graphs read. ``fresh``: a new one with an empty memo (uncaptured runs).
        ``mtp``: the MTP pieces' kept batch (a draft chain step replays them without the main pieces, at its own
        positions, so they gather their own RoPE rows)."""
        kept = self.mtp_batches if mtp else self.batches
        b = None if fresh else kept.get(size)
        if b is None:
            empty = self.index.new_zeros(0)
            b = ForwardBatch(
                input_ids=self.index[0, :size], positions=self.index[1, :size], slot_mapping=self.index[2, :size],
                page_size=self.page_size, num_decodes=0, decode_sq=1,
                decode_block_table=empty.view(0, 0).to(torch.int32), decode_seq_lens=empty.to(torch.int32), prefills=[])
            if not fresh:
                kept[size] = b
        return b


class PiecewiseGraphs:
    """The L+1 pieces of a forward, captured per token bucket in one pool (or run eagerly with ``capture=False``);
    with ``mtp`` (and MTP layers in the model) also two pieces per MTP layer for its draft forward."""

    def __init__(self, model, kv, device: torch.device, sizes: list[int], capture: bool = True, log=None, mtp: bool = True):
        self.model, self.kv, self.device = model, kv, device
        self.layers = list(model.model.layers)
        self.sizes = sorted(sizes)
        self.use_graphs = capture
        self.log = log if log is not None else (lambda s: print(s, file=sys.stderr, flush=True))
        self.buf = PieceBuffers(model, kv, max(self.sizes) if self.sizes else 1, device, mtp)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.mtp_graphs: dict[int, list[list[torch.cuda.CUDAGraph]]] = {}   # bucket -> per MTP layer, its two pieces
        self.backends: dict[int, dict[str, str]] = {}   # kernels chosen at capture (ops.used is empty on replay)
        self.failed: dict[int, str] = {}
        self.capture_s = 0.0
        self.mem_bytes = 0        # device memory the capture added (reserved by the caching allocator)
        self.pool = None

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    @property
    def captured(self) -> list[int]:
        return sorted(self.graphs) if self.use_graphs else list(self.sizes)

    # ----------------------------------------------------------------- the pieces
    def piece(self, k: int, size: int, b: ForwardBatch | None = None) -> None:
        """Piece ``k`` over the first ``size`` rows of the static buffers (the function that is captured); ``b``: the
        static batch whose memo carries the RoPE rows from piece 0 to the others (default: the bucket's kept one)."""
        buf, b = self.buf, b if b is not None else self.buf.batch(size)
        if k == 0:
            x = self.model.model.embed_tokens(b.input_ids)
        else:
            prev = self.layers[k - 1]
            x = prev.after_attention(buf.x[:size], prev.self_attn.output(buf.out[:size]))
        if k == len(self.layers):
            buf.hidden[:size].copy_(self.model.model.norm(x))
            return
        buf.x[:size].copy_(x)
        self._project(self.layers[k], x, size, b)

    def _project(self, layer, x: torch.Tensor, size: int, b: ForwardBatch) -> None:
        """``layer``'s input norm and ``project`` over ``x`` into the static ``q`` (and the indexer's buffers)."""
        buf = self.buf
        q_nope, q_pe, idx = layer.self_attn.project(layer.input_layernorm(x), b, self.kv, indexer_queries=True)
        buf.q[:size, :, : buf.dn].copy_(q_nope)
        buf.q[:size, :, buf.dn:].copy_(q_pe)
        if idx is not None:
            buf.idx_q[:size].copy_(idx[0])
            buf.idx_w[:size].copy_(idx[1])

    def attend(self, attn, batch: ForwardBatch) -> None:
        """``attn``'s attention (a decoder layer's or an MTP block's) over the real rows, eagerly, into ``out[:T]``."""
        t, buf = batch.num_tokens, self.buf
        idx = (buf.idx_q[:t], buf.idx_w[:t]) if buf.idx_q is not None else None
        attn.attend(buf.q[:t, :, : buf.dn], buf.q[:t, :, buf.dn:], batch, self.kv, idx, out=buf.out[:t], q=buf.q[:t])

    @property
    def num_mtp(self) -> int:
        return int(getattr(self.model, "num_mtp", 0)) if self.buf.mtp_in is not None else 0

    def mtp_piece(self, j: int, part: int, size: int, b: ForwardBatch | None = None) -> None:
        """MTP layer ``j``'s draft forward in two pieces around its attention (``mtp_forward``'s split): part 0 the
        next tokens' embedding and the previous hidden states (``mtp_in``) through enorm/hnorm/eh_proj, then the block's
        input norm and ``project``; part 1 its ``output``, residual, norm, MLP/MoE, residual into ``mtp_out``."""
        buf, m = self.buf, self.model.mtp[j]
        if part == 0:
            b = b if b is not None else buf.batch(size, mtp=True)
            e = m.enorm(self.model.model.embed_tokens(b.input_ids))
            x = m.eh_proj(torch.cat((e, m.hnorm(buf.mtp_in[:size])), dim=-1))
            buf.x[:size].copy_(x)
            self._project(m.block, x, size, b)
        else:
            blk = m.block
            buf.mtp_out[:size].copy_(blk.after_attention(buf.x[:size], blk.self_attn.output(buf.out[:size])))

    # ----------------------------------------------------------------- capture
    def capture(self) -> None:
        """Capture every bucket's pieces (largest first, so smaller buckets reuse the pool), with progress lines."""
        from executor import moe as moe_mod
        from kernels import ops
        if not self.use_graphs or not self.sizes:
            return
        t0 = time.perf_counter()
        torch.cuda.empty_cache()   # what the capture adds is then the pools' memory (the warm-ups' cache is emptied too)
        mem0 = torch.cuda.memory_reserved(self.device)
        order = sorted(self.sizes, reverse=True)
        per = self.num_pieces + 2 * self.num_mtp
        mtp = f" (+ {2 * self.num_mtp} MTP draft pieces)" if self.num_mtp else ""
        self.log(f"piecewise CUDA graphs: {self.num_pieces} pieces{mtp} x {len(order)} token buckets "
                 f"({order[-1]}..{order[0]}) = {per * len(order)} graphs")
        moe_mod.GRAPH_SAFE = True
        try:
            with torch.inference_mode():
                for n, size in enumerate(order):
                    try:
                        self._capture_one(size, ops)
                    except Exception as e:  # noqa: BLE001 - an uncapturable bucket stays eager
                        self.failed[size] = f"{type(e).__name__}: {e}"[:300]
                        self.graphs.pop(size, None)
                        self.mtp_graphs.pop(size, None)
                        torch.cuda.synchronize(self.device)
                        if n == 0:   # the largest failed: the others would too (and each try costs a warm-up)
                            self.failed.update({s: "not tried: the largest bucket failed" for s in order[1:]})
                            break
                    if (n + 1) % 10 == 0 or n + 1 == len(order):
                        self.log(f"  {n + 1}/{len(order)} buckets, {time.perf_counter() - t0:.1f} s")
        finally:
            moe_mod.GRAPH_SAFE = False
            ops.reset_used()
        self.capture_s = time.perf_counter() - t0
        torch.cuda.empty_cache()
        self.mem_bytes = torch.cuda.memory_reserved(self.device) - mem0
        self.log(f"piecewise CUDA graphs: {len(self.graphs)} buckets captured in {self.capture_s:.1f} s, "
                 f"+{self.mem_bytes / 2**20:.0f} MiB" + (f"; {len(self.failed)} failed: {next(iter(self.failed.values()))}"
                                                          if self.failed else ""))

    def _capture_one(self, size: int, ops) -> None:
        self.buf.fill(None, size)
        b = self.buf.batch(size)
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            for _ in range(2):   # JIT (Triton specialisations, cuBLAS heuristics) outside the capture
                warm = self.buf.batch(size, fresh=True)
                for k in range(self.num_pieces):
                    self.piece(k, size, warm)
                for j in range(self.num_mtp):
                    self.mtp_piece(j, 0, size, self.buf.batch(size, fresh=True))
                    self.mtp_piece(j, 1, size)
        torch.cuda.current_stream(self.device).wait_stream(s)
        torch.cuda.synchronize(self.device)
        ops.reset_used()
        b.memo.clear()   # piece 0's capture gathers the RoPE rows (later pieces' captures read them from the memo)
        graphs = []
        for k in range(self.num_pieces):
            graphs.append(self._capture_piece(lambda: self.piece(k, size)))  # noqa: B023 - called at once
        self.buf.batch(size, mtp=True).memo.clear()
        mtp = [[self._capture_piece(lambda: self.mtp_piece(j, part, size)) for part in (0, 1)]  # noqa: B023
               for j in range(self.num_mtp)]
        self.backends[size] = ops.reset_used()
        self.graphs[size] = graphs
        if mtp:
            self.mtp_graphs[size] = mtp

    def _capture_piece(self, fn) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph()
        with contextlib.ExitStack() as stack:
            if self.pool is not None:   # torch.cuda.graph empties the allocator's cache per capture: once is enough (as vLLM)
                stack.enter_context(mock.patch("torch.cuda.empty_cache", lambda: None))
            stack.enter_context(torch.cuda.graph(g, pool=self.pool))
            fn()
        if self.pool is None:
            self.pool = g.pool()
        return g

    # ----------------------------------------------------------------- a step
    def run(self, batch: ForwardBatch, host_s: dict[str, float] | None = None) -> tuple[torch.Tensor, int] | None:
        """(final hidden ``[T, hidden]``, bucket) through the pieces, or None when the batch must run eagerly.
        ``host_s``: when given, host seconds (no sync) are added to its "fill", "pieces" and "attend" keys."""
        t = batch.num_tokens
        size = bucket_for(t, self.captured)
        if size is None:
            return None
        clock = _HostClock(host_s)
        self.buf.fill(batch, size)
        clock.lap("fill")
        if self.use_graphs:
            graphs = self.graphs[size]
            run_piece = lambda k: graphs[k].replay()  # noqa: E731
        else:   # uncaptured: a fresh static batch, so piece 0 gathers this step's RoPE rows (and graphs' memos stay)
            b = self.buf.batch(size, fresh=True)
            run_piece = lambda k: self.piece(k, size, b)  # noqa: E731
        for k in range(len(self.layers)):
            run_piece(k)
            clock.lap("pieces")
            self.attend(self.layers[k].self_attn, batch)
            clock.lap("attend")
        run_piece(len(self.layers))
        clock.lap("pieces")
        if self.use_graphs:
            from kernels import ops
            ops.used.update(self.backends.get(size, {}))
        return self.buf.hidden[:t], size

    def run_mtp(self, j: int, batch: ForwardBatch, prev_hidden: torch.Tensor) -> torch.Tensor | None:
        """MTP layer ``j`` over ``batch`` (its input ids the next tokens) from ``prev_hidden`` ``[T, hidden]``: the
        layer's pre-norm hidden states ``[T, hidden]`` (a view of ``mtp_out``: read or copy it before the next call),
        as ``model.mtp_forward``; None when the batch must run eagerly (no bucket, or no MTP pieces)."""
        t = batch.num_tokens
        size = bucket_for(t, self.captured)
        if size is None or j >= self.num_mtp or (self.use_graphs and size not in self.mtp_graphs):
            return None
        self.buf.fill(batch, size)
        self.buf.mtp_in[:t].copy_(prev_hidden)
        if self.use_graphs:
            first, last = self.mtp_graphs[size][j]
            first.replay()
            self.attend(self.model.mtp[j].block.self_attn, batch)
            last.replay()
        else:
            self.mtp_piece(j, 0, size, self.buf.batch(size, fresh=True))
            self.attend(self.model.mtp[j].block.self_attn, batch)
            self.mtp_piece(j, 1, size)
        return self.buf.mtp_out[:t]


class _HostClock:
    """Host seconds between laps, summed per key into ``acc`` (a no-op when ``acc`` is None)."""

    def __init__(self, acc: dict[str, float] | None):
        self.acc = acc
        self.t = time.perf_counter() if acc is not None else 0.0

    def lap(self, key: str) -> None:
        if self.acc is not None:
            now = time.perf_counter()
            self.acc[key] = self.acc.get(key, 0.0) + now - self.t
            self.t = now
