"""CUDA graphs for decode-only steps (vLLM's ``cudagraph_capture_sizes`` idea, ``enforce_eager`` to disable).

A decode step of a few-layer MoE model is launch-bound (docs/twin.md: ~20-30 ms for 5
DeepSeek-V3 layers, drifting with host speed). Capturing the model forward once per padded
batch size and replaying it removes the per-kernel Python/launch overhead.

What is captured: ``model(batch, kv)`` (embedding .. final norm) for decode-only batches with
one query per sequence (``decode_sq == 1``: no MTP drafts) and no prefill chunks. Inputs live
in static buffers sized for the largest captured batch: token ids, positions, slot mapping,
block tables padded to the most pages a sequence can have (``max_model_len``), KV lengths.
A batch of ``n`` decodes replays the graph of the smallest captured size ``>= n``; padding rows
read one token of the null page and write their KV into the null page (which absorbs junk
writes by design, see kv_cache), so real rows are unaffected. Logits and sampling stay eager.

Not taken here: DSA models (indexer: see ``unsupported_reason``; their decode steps replay the piecewise graphs,
executor/piecewise_graphs.py, with attention and the top-k eager between pieces), prefill/mixed steps, MTP steps (``decode_sq > 1``), batches larger than the
largest graph, and any size whose capture raised (the reason is kept in ``failed``).

Graph safety of the decode path (checked on the H200 run): no ``.item()``/``nonzero``/Python
branching on tensor values: MoE expert counts and the Triton grouped GEMM's expert alignment
count with ``scatter_add`` (``torch.bincount`` on CUDA reads the max back to the host); the
Triton MLA decode sizes its splits from the block-table *width* (static here). The torch
reference MoE (``unique``/``nonzero`` per expert) is replaced under capture by a dense masked
variant over all experts (``executor.moe.moe_experts_dense``): static shapes, exact, slow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.forward_batch import ForwardBatch

# vLLM's default capture list: 1, 2, 4, then every 8 up to 256 and every 16 up to 512. Powers of two alone padded a
# batch of 33 to 64 rows (~1.8x the GEMM/expert work of the real batch on the H200 profile); a step of 8 pads at most 7 rows.
DEFAULT_CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4) + tuple(range(8, 257, 8)) + tuple(range(272, 513, 16))


def capture_sizes(max_num_seqs: int, sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES) -> list[int]:
    """Sizes to capture: those below ``max_num_seqs`` plus ``max_num_seqs`` itself when it lies inside the range."""
    sizes = sorted({int(s) for s in sizes if s >= 1})
    if not sizes:
        return []
    out = [s for s in sizes if s < max_num_seqs]
    if max_num_seqs <= sizes[-1]:
        out.append(max_num_seqs)
    return out


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """Smallest captured size ``>= n``, or None (eager) when ``n`` exceeds them all or is 0."""
    if n <= 0:
        return None
    for s in sizes:
        if s >= n:
            return s
    return None


def graphs_supported(device: torch.device) -> bool:
    """CUDA graphs need a CUDA device and a CUDA build of torch."""
    return device.type == "cuda" and torch.cuda.is_available()


def unsupported_reason(model) -> str | None:
    """Why ``model``'s decode forward cannot be captured, or None.

    DSA models (DeepSeek-V3.2, ``tiny``): the indexer's top-k branches on the step's KV lengths and scores
    keys over the batch's own block-table width (a whole-forward graph would fix it at ``max_model_len``:
    the indexer's work at the longest context on every step), so their decode steps replay the piecewise
    graphs instead, the top-k and attention eager between the pieces.
    """
    if any(getattr(m, "indexer", None) is not None for m in model.modules()):
        return ("DSA indexer: top-k over the step's own KV lengths (decode steps replay the piecewise graphs, "
                "top-k and attention eager)")
    if any(hasattr(m, "window") for m in model.modules()):
        return "sliding-window layers: per-sequence windowed decode (executor/swa.py, not capturable)"
    return None


def is_graphable(batch: ForwardBatch) -> bool:
    """Decode-only, one query per sequence (no MTP drafts), no prefill chunks."""
    return batch.num_decodes > 0 and not batch.prefills and batch.decode_sq == 1


@dataclass
class StaticInputs:
    """Preallocated decode inputs for up to ``max_bs`` sequences of up to ``max_pages`` pages."""

    input_ids: torch.Tensor     # [max_bs] int64
    positions: torch.Tensor     # [max_bs] int64
    slot_mapping: torch.Tensor  # [max_bs] int64
    block_table: torch.Tensor   # [max_bs, max_pages] int32
    seq_lens: torch.Tensor      # [max_bs] int32

    @classmethod
    def allocate(cls, max_bs: int, max_pages: int, device: torch.device) -> "StaticInputs":
        z = lambda *s, dt: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
        return cls(z(max_bs, dt=torch.int64), z(max_bs, dt=torch.int64), z(max_bs, dt=torch.int64),
                   z(max_bs, max_pages, dt=torch.int32), z(max_bs, dt=torch.int32))

    def fill(self, batch: ForwardBatch | None, size: int, null_page: int, page_size: int) -> None:
        """Copy ``batch``'s decodes into rows ``[:n]`` and pad rows ``[n:size]`` (no host sync, no realloc).

        Padding: token 0 at position 0, KV slot 0 of the null page, a block table of null pages,
        KV length 1 (a length of 0 would make attention's softmax empty: NaN in padding rows).
        """
        n = batch.num_decodes if batch is not None else 0
        if n > size:
            raise ValueError(f"batch of {n} decodes does not fit the graph of size {size}")
        w = int(batch.decode_block_table.shape[1]) if n else 0
        if w > self.block_table.shape[1]:
            raise ValueError(f"block table of {w} pages exceeds the static {self.block_table.shape[1]}")
        if n:
            self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
            self.positions[:n].copy_(batch.positions, non_blocking=True)
            self.slot_mapping[:n].copy_(batch.slot_mapping, non_blocking=True)
            self.block_table[:n, :w].copy_(batch.decode_block_table, non_blocking=True)
            self.seq_lens[:n].copy_(batch.decode_seq_lens, non_blocking=True)
        self.block_table[:n, w:].fill_(null_page)
        if size > n:
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.slot_mapping[n:size].fill_(null_page * page_size)
            self.block_table[n:size].fill_(null_page)
            self.seq_lens[n:size].fill_(1)

    def batch(self, size: int, page_size: int) -> ForwardBatch:
        """A ForwardBatch of views over the first ``size`` rows (the graph's fixed addresses)."""
        return ForwardBatch(
            input_ids=self.input_ids[:size], positions=self.positions[:size], slot_mapping=self.slot_mapping[:size],
            page_size=page_size, num_decodes=size, decode_sq=1,
            decode_block_table=self.block_table[:size], decode_seq_lens=self.seq_lens[:size], prefills=[])


class DecodeGraphs:
    """Captured decode forwards, one per padded batch size, sharing one memory pool."""

    def __init__(self, model, kv, device: torch.device, sizes: list[int], max_pages: int):
        self.model, self.kv, self.device = model, kv, device
        self.sizes = sorted(sizes)
        self.page_size, self.null_page = kv.page_size, kv.null_page
        self.max_pages = max_pages
        self.static = StaticInputs.allocate(max(self.sizes) if self.sizes else 1, max_pages, device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.backends: dict[int, dict[str, str]] = {}   # kernels chosen at capture (ops.used is empty on replay)
        self.failed: dict[int, str] = {}
        self.capture_s = 0.0
        self.pool = None

    @property
    def captured(self) -> list[int]:
        return sorted(self.graphs)

    def capture(self) -> None:
        """Capture every size (largest first, so smaller graphs reuse the pool)."""
        import time

        from executor import moe as moe_mod
        from kernels import ops
        t0 = time.perf_counter()
        moe_mod.GRAPH_SAFE = True
        try:
            with torch.inference_mode():
                for size in sorted(self.sizes, reverse=True):
                    try:
                        self._capture_one(size, ops)
                    except Exception as e:  # noqa: BLE001 - an uncapturable size stays eager
                        self.failed[size] = f"{type(e).__name__}: {e}"[:300]
                        self.graphs.pop(size, None)
                        torch.cuda.synchronize(self.device)
        finally:
            moe_mod.GRAPH_SAFE = False
            ops.reset_used()
        self.capture_s = time.perf_counter() - t0

    def _capture_one(self, size: int, ops) -> None:
        self.static.fill(None, size, self.null_page, self.page_size)
        b = self.static.batch(size, self.page_size)
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):
            for _ in range(2):   # JIT (Triton specialisations, cuBLAS heuristics) outside the capture
                ops.reset_used()
                self.model(b, self.kv)
        torch.cuda.current_stream(self.device).wait_stream(s)
        torch.cuda.synchronize(self.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model(b, self.kv)
        if self.pool is None:
            self.pool = g.pool()
        self.backends[size] = ops.reset_used()
        self.graphs[size], self.outputs[size] = g, out

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, int] | None:
        """(hidden ``[n, hidden]``, graph size) by replay, or None when the batch must run eagerly."""
        if not is_graphable(batch):
            return None
        size = bucket_for(batch.num_decodes, self.captured)
        if size is None or batch.decode_block_table.shape[1] > self.max_pages:
            return None
        self.static.fill(batch, size, self.null_page, self.page_size)
        self.graphs[size].replay()
        from kernels import ops
        ops.used.update(self.backends.get(size, {}))
        return self.outputs[size][: batch.num_decodes], size
