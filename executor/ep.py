"""Expert-parallel token exchange: process groups, dispatch of tokens to the ranks holding their
experts, and combine of the expert outputs back to the tokens' home ranks.

Two exchange modes, one contract (``dispatch -> (rows, local slot ids, weights)``, then
``combine(rows) -> per-token sums``):

- ``dynamic``: counts first (one ``all_to_all_single`` of ``[ep]`` int64), then the payload
  with split sizes. Sends exactly the rows needed; the host reads the counts (a device sync).
- ``fixed``: every rank sends ``capacity`` rows to every rank (equal splits, padding rows
  marked with slot id -1): static shapes and no host sync, as CUDA graphs need. A token goes
  to a given rank at most once, so ``capacity`` = the largest token count of any rank never
  overflows; that maximum is all-reduced per call ("pad to the max") unless a static capacity
  (the graph's batch bucket) is set.

A token is sent once per destination *rank*, not once per expert (DeepEP's normal mode does
the same): the row carries, for each of its top-k choices, the destination's local slot id
(or -1 when that expert lives elsewhere) and the routing weight, packed next to the hidden
state in one byte payload so dispatch costs one collective (plus the counts). The receiving
rank sums its experts' weighted outputs per row, combine sends one partial row back per
(token, rank), and the home rank adds the partials. DeepEP (``deep_ep.Buffer``) implements
the same contract with NVLink kernels and is used when importable (CUDA only).

Backends: NCCL on GPUs, gloo on CPU (the CI path). With ``world == 1`` nothing is exchanged.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist

from kernels import reference as ref

Mode = Literal["dynamic", "fixed"]

# gloo's default 30-minute collective timeout would kill idle serving ranks waiting for work
LONG_TIMEOUT = datetime.timedelta(days=7)


# ----------------------------------------------------------------------------- groups

@dataclass
class EPGroup:
    """One rank's view of the expert-parallel group (all ranks of one instance)."""

    rank: int
    world: int
    device: torch.device
    backend: str = "gloo"               # gloo | nccl | none (world 1, no process group)
    group: object | None = None         # the torch ProcessGroup (None: default group)
    cpu_group: object | None = None     # gloo group for host-side control messages (== group on CPU)
    mode: Mode = "dynamic"
    capacity: int | None = None         # fixed mode: static rows per (src, dst) pair; None = all-reduced max
    dispatcher: str = "torch"           # torch | deepep (what ran; see make_dispatcher)
    stats: dict = field(default_factory=lambda: {"dispatch_rows": 0, "dispatch_bytes": 0, "combine_bytes": 0, "calls": 0})

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def all_reduce_max(self, value: int) -> int:
        """The largest ``value`` over ranks (attention-DP ranks pad to the max for fixed-size collectives)."""
        if not self.distributed:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.cpu_group)


def single(device: torch.device | str = "cpu", mode: Mode = "dynamic") -> EPGroup:
    """A world of one: EP code paths without a process group (EP width 1)."""
    return EPGroup(0, 1, torch.device(device), "none", mode=mode)


def default_backend(device: torch.device | str) -> str:
    """NCCL for CUDA tensors, gloo for CPU tensors."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for ``tcp://127.0.0.1:PORT`` rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world: int, init_method: str, device: torch.device | str = "cpu",
               backend: str | None = None, mode: Mode = "dynamic", capacity: int | None = None,
               timeout: datetime.timedelta = LONG_TIMEOUT) -> EPGroup:
    """Join the default process group as ``rank`` of ``world`` and return the EP view of it.

    ``init_method``: ``tcp://127.0.0.1:PORT`` or ``file:///tmp/dir/store``. On CUDA the rank
    uses ``cuda:<local rank>`` (all GPUs stay visible so NCCL can use NVLink peer access) and
    gets a second, gloo, group for host-side control messages.
    """
    device = torch.device(device)
    backend = backend or default_backend(device)
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    kw = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout, **kw)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    return EPGroup(rank, world, device, backend, None, cpu_group, mode=mode, capacity=capacity)


def init_from_env(device: str = "cuda", backend: str | None = None, mode: Mode = "dynamic") -> EPGroup:
    """torchrun-style start: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK) from the environment."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ["MASTER_PORT"]
    return init_group(rank, world, f"tcp://{addr}:{port}", device, backend, mode)


def shutdown() -> None:
    """Leave the process group (if joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- collectives

def exchange_counts(send_counts: torch.Tensor, g: EPGroup) -> torch.Tensor:
    """``recv[j]`` = rows rank j sends here, from every rank's ``send_counts [world]`` (int64)."""
    if not g.distributed:
        return send_counts.clone()
    recv = torch.empty_like(send_counts)
    dist.all_to_all_single(recv, send_counts, group=g.group)
    return recv


class _Done:
    """A finished collective (world 1, or one already waited on)."""

    def wait(self) -> bool:
        return True


def all_to_all_rows(x: torch.Tensor, send_counts: list[int] | None, recv_counts: list[int] | None,
                    g: EPGroup, async_op: bool = False):
    """Exchange the rows of ``x`` (sorted by destination rank): ``(received rows, work handle)``.

    With ``send_counts``/``recv_counts`` None the splits are equal (``x.shape[0] / world`` rows
    to each rank, the fixed-capacity layout).
    """
    if not g.distributed:
        return x.clone(), _Done()
    n_out = sum(recv_counts) if recv_counts is not None else x.shape[0]
    out = torch.empty((n_out, *x.shape[1:]), dtype=x.dtype, device=x.device)
    work = dist.all_to_all_single(out, x, recv_counts, send_counts, group=g.group, async_op=async_op)
    return out, (work if async_op else _Done())


# ----------------------------------------------------------------------------- row packing

def pack_rows(*parts: torch.Tensor) -> torch.Tensor:
    """Concatenate 2-D tensors of any dtypes row by row into one ``[N, bytes]`` uint8 tensor."""
    n = parts[0].shape[0]
    return torch.cat([p.contiguous().view(torch.uint8).reshape(n, p.shape[1] * p.element_size()) for p in parts], dim=1)


def unpack_rows(buf: torch.Tensor, specs: list[tuple[torch.dtype, int]]) -> list[torch.Tensor]:
    """Inverse of :func:`pack_rows` given ``(dtype, columns)`` per part."""
    out, col = [], 0
    for dtype, cols in specs:
        nb = cols * torch.tensor([], dtype=dtype).element_size()
        out.append(buf[:, col:col + nb].contiguous().view(dtype).reshape(buf.shape[0], cols))
        col += nb
    return out


# ----------------------------------------------------------------------------- dispatch / combine

@dataclass
class Handle:
    """What combine needs from dispatch: where each sent row came from and how it travelled."""

    num_tokens: int
    token_idx: torch.Tensor          # [N] source row of each sent row (grouped by destination rank)
    send_counts: list[int] | None    # dynamic mode
    recv_counts: list[int] | None
    dest_rank: torch.Tensor | None = None   # fixed mode: destination and position in its block
    dest_pos: torch.Tensor | None = None
    capacity: int = 0
    out_dtype: torch.dtype = torch.float32


@dataclass
class Received:
    """Rows a rank received: hidden states, local slot id per top-k choice (-1: not here), weights."""

    x: torch.Tensor        # [M, D]
    slot: torch.Tensor     # [M, k] int64
    weight: torch.Tensor   # [M, k] float32
    handle: Handle


class Pending:
    """A dispatch or combine in flight: ``wait()`` returns its result."""

    def __init__(self, work, finish):
        self._work, self._finish, self._done, self._value = work, finish, False, None

    def wait(self):
        if not self._done:
            self._work.wait()
            self._value, self._done = self._finish(), True
        return self._value


class TorchDispatcher:
    """Dispatch/combine through ``torch.distributed.all_to_all_single`` (NCCL or gloo)."""

    name = "torch"

    def __init__(self, g: EPGroup, slot_rank: torch.Tensor, slot_offset: torch.Tensor, top_k: int):
        self.g, self.k = g, top_k
        self.slot_rank = slot_rank.to(g.device)       # [S] rank holding physical slot s
        self.slot_offset = slot_offset.to(g.device)   # [world] first slot id of each rank

    # -- routing arithmetic shared by both modes
    def _pairs(self, slots: torch.Tensor, weights: torch.Tensor):
        """Unique (token, destination rank) pairs, grouped by rank, with their per-choice metadata."""
        t, w = slots.shape[0], self.g.world
        dest = self.slot_rank[slots]                                          # [T, k]
        hit = torch.zeros(t, w, dtype=torch.bool, device=slots.device)
        hit.scatter_(1, dest, True)
        r_idx, t_idx = hit.t().nonzero(as_tuple=True)                         # sorted by rank, then token
        counts = hit.sum(0).to(torch.int64)                                   # [world]
        here = dest[t_idx] == r_idx[:, None]                                  # [N, k]
        local = slots[t_idx] - self.slot_offset[r_idx][:, None]
        meta = torch.cat((torch.where(here, local, -1).to(torch.float32),     # ids < 2^24: exact in float32
                          torch.where(here, weights[t_idx].float(), 0.0)), dim=1)
        return r_idx, t_idx, counts, meta

    def _unpack(self, buf: torch.Tensor, d: int, dtype: torch.dtype):
        x, meta = unpack_rows(buf, [(dtype, d), (torch.float32, 2 * self.k)])
        return x, meta[:, :self.k].round().to(torch.int64), meta[:, self.k:]

    def dispatch(self, x: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, async_op: bool = False):
        """Send each token to the ranks holding its chosen slots: a :class:`Received` (or a :class:`Pending` of one)."""
        p = self.dispatch_many([(x, slots, weights)])[0]
        return p if async_op else p.wait()

    def dispatch_many(self, batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[Pending]:
        """Dispatch several micro-batches: one counts exchange for all, then one async payload each (in order)."""
        g = self.g
        prepared = [self._pairs(s, w) + (x,) for x, s, w in batches]
        if g.mode == "fixed":
            caps = [g.capacity if g.capacity is not None else None for _ in batches]
            if g.capacity is None:   # pad to the largest batch of any rank: one all-reduce for all micro-batches
                m = torch.tensor([x.shape[0] for x, _, _ in batches], dtype=torch.int64, device=g.device)
                if g.distributed:
                    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=g.group)
                caps = m.tolist()
            return [self._send_fixed(*p, max(int(c), 1)) for p, c in zip(prepared, caps)]
        counts = torch.stack([p[2] for p in prepared], dim=1)   # [world, batches]
        recv = exchange_counts(counts.reshape(-1), g).view(g.world, len(batches))
        send_l, recv_l = counts.t().tolist(), recv.t().tolist()
        return [self._send_dynamic(*p, s, r) for p, s, r in zip(prepared, send_l, recv_l)]

    def _send_dynamic(self, r_idx, t_idx, counts, meta, x, send_l, recv_l) -> Pending:
        g, d = self.g, x.shape[1]
        buf = pack_rows(x[t_idx], meta)
        g.stats["calls"] += 1
        g.stats["dispatch_rows"] += int(t_idx.numel())
        g.stats["dispatch_bytes"] += (sum(send_l) - send_l[g.rank]) * buf.shape[1]
        recv, work = all_to_all_rows(buf, send_l, recv_l, g, async_op=True)
        h = Handle(x.shape[0], t_idx, send_l, recv_l, out_dtype=x.dtype)
        return Pending(work, lambda: Received(*self._unpack(recv, d, x.dtype), h))

    def _send_fixed(self, r_idx, t_idx, counts, meta, x, cap: int) -> Pending:
        g, d = self.g, x.shape[1]
        if x.shape[0] > cap:
            raise RuntimeError(f"EP fixed capacity {cap} < {x.shape[0]} local tokens: raise the capacity (batch bucket)")
        buf = pack_rows(x[t_idx], meta)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(t_idx.numel(), device=x.device) - starts[r_idx]
        pad_meta = torch.cat((torch.full((1, self.k), -1.0), torch.zeros(1, self.k)), 1).to(x.device)
        pad = pack_rows(torch.zeros(1, d, dtype=x.dtype, device=x.device), pad_meta)[0].repeat(g.world, cap, 1)
        pad[r_idx, pos] = buf
        g.stats["calls"] += 1
        g.stats["dispatch_rows"] += int(t_idx.numel())
        g.stats["dispatch_bytes"] += pad.numel() * (g.world - 1) // g.world
        recv, work = all_to_all_rows(pad.view(g.world * cap, -1), None, None, g, async_op=True)
        h = Handle(x.shape[0], t_idx, None, None, r_idx, pos, cap, x.dtype)
        return Pending(work, lambda: Received(*self._unpack(recv, d, x.dtype), h))

    def combine(self, y: torch.Tensor, h: Handle, async_op: bool = False):
        """Send expert outputs ``y`` (rows as received) home and sum them per token: ``[T, D]`` in float32/64."""
        g = self.g
        row_bytes = y.shape[1] * y.element_size() if y.dim() == 2 else 0
        if h.send_counts is None:      # fixed: equal splits back, then pick each sent row's block slot
            g.stats["combine_bytes"] = g.stats.get("combine_bytes", 0) + y.shape[0] * row_bytes * (g.world - 1) // g.world
            back, work = all_to_all_rows(y, None, None, g, async_op)

            def finish():
                rows = back.view(g.world, h.capacity, -1)[h.dest_rank, h.dest_pos]
                return _sum_rows(rows, h)
        else:
            g.stats["combine_bytes"] = g.stats.get("combine_bytes", 0) + (sum(h.recv_counts) - h.recv_counts[g.rank]) * row_bytes
            back, work = all_to_all_rows(y, h.recv_counts, h.send_counts, g, async_op)

            def finish():
                return _sum_rows(back, h)

        p = Pending(work, finish)
        return p if async_op else p.wait()


def _sum_rows(rows: torch.Tensor, h: Handle) -> torch.Tensor:
    acc = ref._up(rows).dtype if rows.dtype != torch.float64 else torch.float64
    out = torch.zeros(h.num_tokens, rows.shape[1], dtype=acc, device=rows.device)
    return out.index_add_(0, h.token_idx, rows.to(acc))


class DeepEPDispatcher:
    """DeepEP's normal-mode NVLink dispatch/combine behind the same contract (CUDA, when importable).

    Needs every rank to hold the same number of slots (DeepEP maps expert ``e`` to rank
    ``e // (slots / world)``). Not exercised in CI (no GPU, no DeepEP wheel): a failure at
    construction falls back to :class:`TorchDispatcher` (see :func:`make_dispatcher`).
    """

    name = "deepep"

    def __init__(self, g: EPGroup, n_slots: int, top_k: int, hidden_bytes: int):
        from kernels import registry
        de = registry.library_module("deepep")
        self.de, self.g, self.k, self.n_slots = de, g, top_k, n_slots
        group = g.group if g.group is not None else dist.group.WORLD
        nvl = de.Buffer.get_dispatch_config(g.world).get_nvl_buffer_size_hint(hidden_bytes, g.world)
        nvl = max(nvl, de.Buffer.get_combine_config(g.world).get_nvl_buffer_size_hint(hidden_bytes, g.world))
        self.buffer = de.Buffer(group, nvl, 0)
        self.idx_dtype = getattr(de, "topk_idx_t", torch.int64)

    def dispatch(self, x: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor, async_op: bool = False):
        b = self.buffer
        idx = slots.to(self.idx_dtype)
        per_rank, per_rdma, per_expert, in_rank, _ = b.get_dispatch_layout(idx, self.n_slots)
        rx, rid, rw, _, handle, _ = b.dispatch(x, topk_idx=idx, topk_weights=weights.float(),
                                               num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
                                               is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        self.g.stats["calls"] += 1
        self.g.stats["dispatch_rows"] += int(rx.shape[0])
        r = Received(rx, rid.to(torch.int64), rw.float(), Handle(x.shape[0], torch.empty(0), None, None, out_dtype=x.dtype))
        r.handle.deepep = handle   # type: ignore[attr-defined]
        return _Ready(r) if async_op else r

    def dispatch_many(self, batches):
        return [_Ready(self.dispatch(x, s, w)) for x, s, w in batches]

    def combine(self, y: torch.Tensor, h: Handle, async_op: bool = False):
        out, _, _ = self.buffer.combine(y, h.deepep)   # type: ignore[attr-defined]
        out = ref._up(out)
        return _Ready(out) if async_op else out


class _Ready:
    def __init__(self, v):
        self.v = v

    def wait(self):
        return self.v


def make_dispatcher(g: EPGroup, slot_rank: torch.Tensor, slot_offset: torch.Tensor, top_k: int, hidden_bytes: int,
                    prefer: str | None = None):
    """DeepEP when importable on CUDA with equal slots per rank (and not overridden), else torch all-to-all.

    ``prefer`` (or ``TWINFER_KERNEL_ALL_TO_ALL``): ``torch`` or ``deepep``. Records the choice in ``g.dispatcher``.
    """
    from kernels import registry
    prefer = prefer or registry.override_for("all_to_all")
    n_slots = int(slot_rank.numel())
    equal = n_slots % max(g.world, 1) == 0 and bool(
        (slot_offset.cpu() == torch.arange(g.world) * (n_slots // max(g.world, 1))).all())
    if (prefer in (None, "deepep") and g.device.type == "cuda" and g.distributed and equal and g.mode == "dynamic"
            and registry.probe_library("deepep")[0]):
        try:
            d = DeepEPDispatcher(g, n_slots, top_k, hidden_bytes)
            g.dispatcher = d.name
            return d
        except Exception as err:   # a DeepEP build that does not fit this torch/driver: say so, use torch
            g.stats["deepep_error"] = f"{type(err).__name__}: {err}"[:300]
    g.dispatcher = "torch"
    return TorchDispatcher(g, slot_rank, slot_offset, top_k)
