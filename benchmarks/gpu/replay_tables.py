"""Op tables of the executor's replay forward, measured apart from any replay run (issue 23).

The replay bench (benchmarks/gpu/replay_bench.py) times ``executor.swa_replay.SWAReplay.run`` on a GQA model with
sliding layers; ``costmodels.replay_table`` prices the same chunks from what this module measures on the same
model, with the executor's own code at each shape:

- ``gemm``: the executor's bf16 ``Linear`` (``executor.layers.Linear``, i.e. ``F.linear``) per weight (N, K) over
  the rows M, cycling weight copies so one pass reads more than ``L2_SPILL_BYTES`` (every layer has its own weights);
- ``attention:window``: ``executor.swa.window_attention`` for one tile (rows <= ``ROW_TILE``) over ``keys`` keys,
  the first query at position keys - rows (swa.py's causal-and-window mask); ``attention:causal``:
  ``kernels.ops.attention_prefill`` as ``GQAAttention.forward`` calls it (the full layer);
- row-wise units over their size: ``rmsnorm`` (RMSNorm), ``rope_qk`` (``GQAAttention._rope`` of q and k),
  ``kv_write`` (``write_paged`` of k and v), ``kv_gather`` (``swa.gather_range`` of k and v, over keys),
  ``attn_out`` (the attention output placed in its buffer), ``residual`` (x + y), ``swiglu`` (the activation of
  ``MLP.forward``: ``kernels.ops.silu_mul``), ``embed``, a replay layer's ``row_select`` /
  ``row_clone`` / ``row_scatter`` (``SWAReplay.run``'s index_select and out-of-place index_copy), ``take_put`` (the
  new tokens' rows placed), ``logits`` (``compute_logits`` of the last row);
- host seconds per eager call of each unit (at its smallest shape, no sync: the device keeps up) and of one whole
  decoder layer call of each kind (a 1-token prefill): the eager forward's launch cost as it occurs;
- the eager launch gap: device seconds between queued kernels of an eager stream beyond a graph replay's, from a
  one-kernel op (x + y) timed back to back both ways where the device is the bottleneck, and each unit's kernels per
  call (the profiler's device activities): an eager call's device time is its graph time + kernels x gap.

Device seconds: a CUDA graph of R back-to-back calls, replayed (median of several) / R, so the launch is outside
it (falls back to back-to-back eager calls between two events, marked ``how: eager``, where capture fails). Grids:
generic ones (``origin: grid``) plus the exact shapes the bench's workloads run (``origin: workload``, derived
from the workload definitions by ``costmodels.replay_table.forward_calls``, not from any timing; ``both``: a generic
point a workload also runs); the bench prices with every point and with the generic ones only (grid and both).
On the CPU (``--cpu --tiny``) times are wall times and calls run synchronously (``sync``: unit walls and the
layers' glue add up). The JSON is rewritten after every section; a GEMM, attention or row section past its budget
measures only the workloads' shapes.

    python -m benchmarks.gpu.replay_tables --out FILE [--cpu --tiny]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

from costmodels.model_spec import ModelSpec
from costmodels.replay_table import FORMAT
from executor.forward_batch import SeqInput, build_forward_batch
from executor.kv_cache import KVCache
from executor.model_config import ExecModelConfig
from executor.swa import ROW_TILE, gather_range, window_attention
from executor.weights import build_model
from kernels import ops
from kernels import reference as ref

L2_SPILL_BYTES = 256 << 20     # several times the H200's 50 MB L2 (benchmarks/gpu/op_tables.py)
GRAPH_TARGET_S = 2e-3          # one graph replay lasts about this long
GEMM_PASSES = 3                # each GEMM point measured this many times (Tables.gemm)
# origins a section past its budget leaves out: the generic grid, and attention cells that only complete the
# rectangle around the workloads' cells ("fill"); "workload" / "both" (a grid point a workload runs) always run
OPTIONAL = ("grid", "fill")
# the forward of SWAReplay.run + compute_logits of the last row, as costmodels.replay_table reads it
RECIPE = {
    "start": [("embed", "step_rows")],
    "layer": [("rmsnorm", "rows"), ("gemm:q_proj", "rows"), ("gemm:k_proj", "rows"), ("gemm:v_proj", "rows"),
              ("rope_qk", "rows"), ("kv_write", "rows"), ("kv_gather", "keys"), ("attention", "calls"),
              ("attn_out", "rows"), ("gemm:o_proj", "rows"), ("residual", "rows"), ("rmsnorm", "rows"),
              ("gemm:gate_proj", "rows"), ("gemm:up_proj", "rows"), ("swiglu", "rows"), ("gemm:down_proj", "rows"),
              ("residual", "rows")],
    "tile_post": [("attn_out", "rows")],     # window_attention's out[a:b] = tile, rows > ROW_TILE
    "subset_pre": [("row_select", "rows")],
    "subset_post": [("row_clone", "step_rows"), ("row_scatter", "rows")],
    "end": [("rmsnorm", "step_rows"), ("take_put", "new"), ("logits", "one")],
}


def _replay_seconds(g) -> float:
    """Seconds of one replay of CUDA graph ``g`` (CUDA events, after a device sync)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def size_grid(top: int, tiny: bool) -> list[int]:
    """Rows/keys: 1, 16, 64, then four points per octave from 128 up to ``top``."""
    if tiny:
        return sorted({m for m in (1, 4, 8, 16, 32, 48, 64) if m < top} | {top})
    pts = {1, 16, 64}
    k = 0
    while 128 * 2 ** (k / 4) <= top * 1.0001:
        pts.add(int(round(128 * 2 ** (k / 4))))
        k += 1
    return sorted(pts | {top})


def attention_grids(window: int, tiny: bool) -> dict[str, tuple[list[int], list[int]]]:
    """kind -> (rows, keys before the first query) of the generic attention grid."""
    if tiny:
        return {"window": ([1, 4, 8, 16, 24], [0, 3, 7, 16]), "causal": ([1, 4, 8, 16, 24], [0, 8, 24, 48])}
    w = window - 1
    return {"window": ([16, 32, 64, 128, 256, 512, 1024, 1536, 2048], sorted({0, 32, 64, w, w + 1, 256, 384, 512})),
            "causal": ([16, 64, 128, 256, 512, 1024, 2048], [0, 128, 512, 1024, 2048, 4096, 8192, 14336])}


# ---------------------------------------------------------------------------------------------- timing
class Clock:
    """Device seconds of a list of calls (cycled) and host seconds of one call."""

    def __init__(self, device: torch.device, replays: int = 9):
        self.cuda, self.replays = device.type == "cuda", replays

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def device(self, fns) -> tuple[float, str]:
        """(seconds per call, how): a CUDA graph of back-to-back calls, else eager calls between two events."""
        for f in fns:      # warm-up: allocator, kernel choice, lazy imports
            f()
        if not self.cuda:
            times = []
            for _ in range(max(3, self.replays // 2)):
                t0 = time.perf_counter()
                fns[0]()
                times.append(time.perf_counter() - t0)
            return statistics.median(times), "wall"
        est = self._events(fns, 1)
        reps = int(min(200, max(3, GRAPH_TARGET_S / max(est, 1e-6))))
        try:
            return self._graph(fns, reps), "graph"
        except Exception:  # noqa: BLE001 - a call that cannot be captured is timed eagerly
            torch.cuda.synchronize()
            return self._events(fns, reps), "eager"

    def _events(self, fns, reps: int, replays: int | None = None) -> float:
        times = []
        for _ in range(replays or self.replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            for i in range(reps):
                fns[i % len(fns)]()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / reps)
        return statistics.median(times)

    def _graph(self, fns, reps: int) -> float:
        from benchmarks.gpu.op_tables import capture_graph
        g = capture_graph(fns, reps)
        g.replay()
        times = [_replay_seconds(g) / reps for _ in range(self.replays)]
        del g
        return statistics.median(times)

    def eager_and_graph(self, fn, lo: int, hi: int) -> tuple[float, float]:
        """(eager seconds per call, graph seconds per call) of ``fn``, the two timed in alternation (a drift of the
        clocks lands on both): eager as the slope between ``lo`` and ``hi`` back-to-back calls (the host's lead
        before the first kernel cancels), graph as a capture of ``hi`` calls replayed."""
        from benchmarks.gpu.op_tables import capture_graph
        fn()
        g = capture_graph([fn], hi)
        g.replay()
        eager, graph = [], []
        for _ in range(self.replays):
            t_lo, t_hi = self._events([fn], lo, 1) * lo, self._events([fn], hi, 1) * hi
            eager.append((t_hi - t_lo) / (hi - lo))
            graph.append(_replay_seconds(g) / hi)
        del g
        return statistics.median(eager), statistics.median(graph)

    def host(self, fn, calls: int = 20, batches: int = 5) -> float:
        """Host seconds to issue one eager call (no sync inside: small shapes, the device keeps up). On the CPU a call
        runs synchronously: its wall time (the same figure; the pricing adds only the layers' glue there)."""
        fn()
        self.sync()
        out = []
        gc.disable()   # a collection inside a batch is not the call's cost
        try:
            for _ in range(batches):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                out.append((time.perf_counter() - t0) / calls)
                self.sync()
        finally:
            gc.enable()
        return statistics.median(out)


# ---------------------------------------------------------------------------------------------- the units
class Units:
    """The executor's calls of each unit at a size, on the bench model's shapes (module docstring)."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: str, page: int, max_tokens: int, tiny: bool = False):
        self.spec, self.device, self.tiny = spec, device, tiny
        self.gemm_passes = 1 if tiny else GEMM_PASSES
        self.cfg = ExecModelConfig.build(spec)
        self.model = build_model(self.cfg, device, dtype, "dummy", seed=0, max_pos=max_tokens + 8)
        self.dt = self.model.model.embed_tokens.weight.dtype
        self.page = page
        pages = -(-max_tokens // page) + 1
        self.kv = KVCache(self.cfg, pages, page, device, self.dt)
        self.table = torch.arange(pages, device=device, dtype=torch.int32)
        self.max_tokens = max_tokens
        kinds = spec.kinds()
        self.layer_of = {k: kinds.index(k) for k in dict.fromkeys(kinds)}
        lay = self.model.model.layers[0]
        self.attn, self.mlp, self.norm = lay.self_attn, lay.mlp, lay.input_layernorm
        self.gemms = {name: getattr(self.attn if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else self.mlp, name)
                      for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
        self.g = torch.Generator(device=device).manual_seed(0)
        self.spill = device.type == "cuda"   # weight copies to spill the GPU's L2 (none on the CPU)

    def randn(self, *shape):
        return torch.randn(*shape, device=self.device, dtype=self.dt, generator=self.g)

    def shapes(self) -> dict[str, tuple[int, int]]:
        return {n: (lin.out_features, lin.in_features) for n, lin in self.gemms.items()}

    def gemm(self, lin, m: int, spill: bool = True):
        """Calls of ``lin`` at ``m`` rows over enough weight copies to spill L2 (``spill``)."""
        x = self.randn(m, lin.in_features)
        wbytes = lin.weight.numel() * lin.weight.element_size()
        ncop = int(min(16, max(1, math.ceil(L2_SPILL_BYTES / wbytes)))) if (spill and self.spill) else 1
        lins = [lin] + [copy.deepcopy(lin) for _ in range(ncop - 1)]
        return [lambda lin=lin_: lin(x) for lin_ in lins]

    def attention(self, kind: str, rows: int, before: int):
        """One attention call of ``rows`` queries over ``before + rows`` keys, the first query at position ``before``."""
        hq, hkv, d = self.spec.num_attention_heads, self.spec.num_kv_heads, self.spec.head_dim
        q, kk, vv = self.randn(rows, hq, d), self.randn(before + rows, hkv, d), self.randn(before + rows, hkv, d)
        scale = d ** -0.5
        if kind == "window":
            w = int(self.spec.sliding_window)
            return [lambda: window_attention(q, kk, vv, before, 0, w, scale)]
        pos = torch.arange(before, before + rows, device=self.device)
        return [lambda: ops.attention_prefill(q, kk, vv, pos, scale)]

    def row_unit(self, unit: str, m: int):
        """The calls of a row-wise unit at size ``m`` (rows; keys for kv_gather)."""
        s = self.spec
        h, hq, hkv, d, inter = s.hidden_size, s.num_attention_heads, s.num_kv_heads, s.head_dim, s.intermediate_size
        idx = torch.arange(m, device=self.device)
        if unit == "rmsnorm":
            x = self.randn(m, h)
            return lambda: self.norm(x)
        if unit == "rope_qk":
            q, k = self.randn(m, hq, d), self.randn(m, hkv, d)
            return lambda: (self.attn._rope(q, idx), self.attn._rope(k, idx))
        if unit == "kv_write":
            kc, vc = self.kv.k[0], self.kv.v[0]
            k, v = self.randn(m, hkv, d), self.randn(m, hkv, d)
            return lambda: (ref.write_paged(kc, idx, k), ref.write_paged(vc, idx, v))
        if unit == "kv_gather":
            kc, vc = self.kv.k[0], self.kv.v[0]
            return lambda: (gather_range(kc, self.table, 0, m), gather_range(vc, self.table, 0, m))
        if unit == "attn_out":
            o = self.randn(m, hq, d)

            def place():
                out = torch.empty(m, hq, d, dtype=self.dt, device=self.device)
                out[0:m] = o
                return out
            return place
        if unit == "residual":
            x, y = self.randn(m, h), self.randn(m, h)
            return lambda: x + y
        if unit == "swiglu":
            g, u = self.randn(m, inter), self.randn(m, inter)
            return lambda: ops.silu_mul(g, u)   # what MLP.forward runs (one Triton launch on CUDA since issue 18)
        if unit == "embed":
            ids = torch.randint(0, s.vocab_size, (m,), device=self.device, generator=self.g)
            return lambda: self.model.model.embed_tokens(ids)
        if unit == "row_select":
            x = self.randn(m, h)
            return lambda: x.index_select(0, idx)
        if unit == "row_clone":
            x = self.randn(m, h)
            return lambda: x.clone()
        if unit == "row_scatter":
            x, y = self.randn(m, h), self.randn(m, h)
            return lambda: x.index_copy_(0, idx, y)
        if unit == "take_put":
            x = self.randn(m, h)
            return lambda: x.new_zeros(m, h).index_copy(0, idx, x.index_select(0, idx))
        if unit == "logits":
            x = self.randn(m, h)
            return lambda: self.model.compute_logits(x[-1:])
        raise KeyError(unit)

    def layer_call(self, kind: str, rows: int = 1, context: int = 0):
        """One decoder layer of ``kind`` on a ``rows``-token prefill after ``context`` cached tokens (its host time;
        its eager and graph device times)."""
        return layer_call(self.model, self.kv, self.layer_of[kind], rows, context)


def layer_call(model, kv: KVCache, j: int, rows: int, context: int = 0):
    """A call of decoder layer ``j`` on a ``rows``-token prefill after ``context`` cached tokens, writing ``kv``'s
    first pages (the executor's layer as the forward calls it: its batch built by ``build_forward_batch``; a sliding
    layer reads its window's keys, a full one every key)."""
    pages = list(range(-(-(context + rows) // kv.page_size)))
    batch = build_forward_batch([SeqInput([1] * rows, context, pages, False)], kv.page_size, kv.null_page, kv.device)
    x = model.model.embed_tokens(batch.input_ids)
    layer = model.model.layers[j]
    return lambda: layer(x, batch, kv)


class HostProbe:
    """Host seconds of the decoder layer calls of the host section, taken again beside the replay runs (their own KV
    pages, so the runs' cached prefix is untouched): the CPU's speed at the time of the runs, which drifts."""

    def __init__(self, model, cfg, device: torch.device, page: int, dtype, tiny: bool):
        kinds = cfg.spec.kinds()
        self.rows = layer_host_rows(tiny)
        self.kv = KVCache(cfg, -(-max(self.rows) // page) + 1, page, device, dtype)
        self.calls = {(k, r): layer_call(model, self.kv, kinds.index(k), r) for k in dict.fromkeys(kinds) for r in self.rows}
        self.clock = Clock(device)
        self.samples: dict[tuple[str, int], list[float]] = {key: [] for key in self.calls}
        self.error: str | None = None

    def sample(self, calls: int = 10) -> None:
        """One host time per layer call (``calls`` eager calls, no sync inside)."""
        for key, fn in self.calls.items():
            self.samples[key].append(self.clock.host(fn, calls=calls, batches=1))

    def result(self) -> dict[str, dict[int, float]]:
        """kind -> {rows: median host seconds} (``costmodels.replay_table.ExecTables.with_host``'s input)."""
        out: dict[str, dict[int, float]] = {}
        for (k, r), ts in self.samples.items():
            if ts:
                out.setdefault(k, {})[r] = statistics.median(ts)
        return out


def layer_host_rows(tiny: bool) -> tuple[int, ...]:
    """Rows at which a layer call's host time is measured: host work per call should not grow with rows (the
    launches are the same); measuring it at the bench's chunk sizes says whether it does. Up to 512: there the
    device still keeps up with the host (a layer call's host ~1.5 ms, its device time below that)."""
    return (1, 4, 16) if tiny else (1, 64, 512)


# a layer call's host time at the bench's 2048-row chunks: the device takes longer than the host here, so a batch is 4
# calls (~320 launches, well inside the launch queue: the host is not held back by the device)
LAYER_HOST_BIG = 2048
# rows at which a decoder layer's eager device time is compared to its graph's: device-bound (the host runs ahead)
LAYER_GAP_ROWS = (2048, 4096)
LAYER_GAP_CALLS = (3, 9)      # back-to-back eager layer calls of the two windows whose difference is the slope
# (rows, cached context) of the whole-layer graph times (Tables.layer_graph): the bench's chunk sizes and recomputes
LAYER_GRAPH_CELLS = {"sliding": [(r, 4096) for r in (512, 1024, 2048, 4096, 8192)],
                     "full": [(r, ctx) for r in (512, 2048, 4096) for ctx in (0, 4096, 8192, 12288)]}


def first_workload(points: dict) -> list:
    """(key, origin) pairs, the workloads' shapes first (a section past its budget measures only those: origin
    ``workload``, or ``both`` for a generic grid point a workload also runs)."""
    return sorted(points.items(), key=lambda kv: (kv[1] in OPTIONAL, kv[0]))


def kernels_per_call(fn) -> int:
    """Device activities (kernels, memsets, copies) of one call, by the profiler; 0 where it cannot say."""
    from torch.profiler import ProfilerActivity, profile
    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001
        return 0


ROW_UNITS = ("rmsnorm", "rope_qk", "kv_write", "kv_gather", "attn_out", "residual", "swiglu", "embed", "row_select",
             "row_clone", "row_scatter", "take_put")


# ---------------------------------------------------------------------------------------------- measuring
class Tables:
    """Measures the sections, collecting points, and rewrites ``out`` after each."""

    def __init__(self, units: Units, clock: Clock, out: str | None, head: dict):
        self.u, self.clock, self.out = units, clock, out
        self.doc = {**head, "points": [], "host": {}, "layer_host": {}, "errors": [], "sections": {}, "skipped": {}}
        self.deadline = None    # past it, a section measures only the workloads' own shapes

    def write(self) -> None:
        if self.out:
            tmp = self.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.doc, f, indent=0)
            os.replace(tmp, self.out)

    def point(self, unit: str, fns, origin: str, **size) -> None:
        if origin in OPTIONAL and self.deadline is not None and time.time() > self.deadline:
            self.doc["skipped"][unit] = self.doc["skipped"].get(unit, 0) + 1
            return
        try:
            fns = fns()    # built here: a skipped point allocates nothing
            t, how = self.clock.device(fns if isinstance(fns, list) else [fns])
            self.doc["points"].append({"unit": unit, **size, "device_s": t, "how": how, "origin": origin,
                                       "t": round(time.time(), 3)})   # to read beside the sampled GPU clocks
        except Exception as e:  # noqa: BLE001 - one failed case must not stop the table
            self.doc["errors"].append(f"{unit} {size}: {type(e).__name__}: {e}"[:300])
        if self.clock.cuda and torch.cuda.memory_reserved() > (8 << 30):
            torch.cuda.empty_cache()

    def section(self, name: str, fn, budget_s: float | None = None) -> None:
        t0 = time.time()
        self.deadline = None if budget_s is None else t0 + budget_s
        try:
            with torch.inference_mode():
                fn()
            self.doc["sections"][name] = f"{time.time() - t0:.1f} s"
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self.doc["sections"][name] = f"failed after {time.time() - t0:.1f} s: {type(e).__name__}: {e}"[:300]
        print(f"replay tables: {name}: {self.doc['sections'][name]}", flush=True)
        self.write()

    # -- sections
    def host(self) -> None:
        """Host seconds of one eager call per unit (smallest shape) and of one layer call per kind."""
        u, c, host = self.u, self.clock, self.doc["host"]
        calls = {f"gemm:{name}": u.gemm(lin, 1, spill=False)[0] for name, lin in u.gemms.items()}
        calls |= {unit: u.row_unit(unit, 1) for unit in ROW_UNITS + ("logits",)}
        calls |= {f"attention:{kind}": u.attention(kind, 1, 0)[0] for kind in ("window", "causal")}
        for name, fn in calls.items():
            host[name] = c.host(fn)
        rows = self.doc.setdefault("layer_host_rows", {})
        for kind in u.layer_of:
            for r in layer_host_rows(u.tiny):
                rows.setdefault(kind, {})[r] = c.host(u.layer_call(kind, r))
            self.doc["layer_host"][kind] = rows[kind][1]
            if c.cuda:   # the bench's 2048-row chunks: the device is slower than the host there, so few calls a batch
                rows[kind][LAYER_HOST_BIG] = c.host(u.layer_call(kind, LAYER_HOST_BIG), calls=4)

    def layer_gap(self) -> None:
        """Eager minus graph device seconds of whole decoder layer calls (per kind, at rows where the device is the
        bottleneck): the launch gaps of the executor's own kernel mix. Eager: the slope of back-to-back calls between
        two events (``LAYER_GAP_CALLS``: the host's lead before the first kernel cancels), in alternation with a graph
        of the same calls (``Clock.eager_and_graph``).
        Divided by the layer's kernels (the kernels section counts them) in ``finish``."""
        u, c = self.u, self.clock
        if not c.cuda:
            return
        pts = self.doc.setdefault("layer_gap_points", [])
        for kind in u.layer_of:
            for r in LAYER_GAP_ROWS:
                try:
                    e, g = c.eager_and_graph(u.layer_call(kind, r), *LAYER_GAP_CALLS)
                    pts.append({"kind": kind, "rows": r, "graph_s": g, "eager_s": e, "how": "graph"})
                except Exception as ex:  # noqa: BLE001
                    self.doc["errors"].append(f"layer_gap {kind} {r}: {type(ex).__name__}: {ex}"[:300])

    def layer_graph(self) -> None:
        """Graph seconds of whole decoder layer calls over rows x cached context (``layer_points``): what the units
        of a layer add up to against the layer they make, at the replay chunks' sizes (``replay_rescore``'s layer
        check). Not read by the pricing."""
        u, c = self.u, self.clock
        if not c.cuda:
            return
        pts = self.doc.setdefault("layer_points", [])
        room = u.kv.num_blocks * u.kv.page_size
        for kind, cells in LAYER_GRAPH_CELLS.items():
            if kind not in u.layer_of:
                continue
            for r, ctx in cells:
                if r + ctx > room:
                    continue
                try:
                    t, how = c.device([u.layer_call(kind, r, ctx)])
                    pts.append({"kind": kind, "rows": r, "context": ctx, "graph_s": t, "how": how,
                                "t": round(time.time(), 3)})
                except Exception as ex:  # noqa: BLE001
                    self.doc["errors"].append(f"layer_graph {kind} {r}+{ctx}: {type(ex).__name__}: {ex}"[:300])
            self.write()

    def finish(self) -> None:
        """The per-kernel launch gap of whole layers: (eager - graph) / kernels per point, median (``layer_eager_gap_s``,
        preferred by ``costmodels.replay_table`` over the x + y figure); points whose graph was not captured or whose
        host time reaches the device time (not device-bound) are left out."""
        kern, gaps = self.doc.get("kernels", {}), []
        host = self.doc.get("layer_host_rows", {})
        for p in self.doc.get("layer_gap_points", []):
            k = kern.get(f"layer:{p['kind']}:{p['rows']}", 0)
            by = {int(r): t for r, t in host.get(p["kind"], {}).items()}
            h = by.get(int(p["rows"]), max(by.values(), default=0.0))   # the layer's host at these rows
            p["kernels"] = k
            if k and p["how"] == "graph" and h < 0.8 * p["graph_s"]:
                p["gap_per_kernel_s"] = (p["eager_s"] - p["graph_s"]) / k
                gaps.append(p["gap_per_kernel_s"])
        if gaps:
            self.doc["layer_eager_gap_s"] = max(0.0, statistics.median(gaps))

    def kernels(self) -> None:
        """Kernels per call of each unit (the profiler's device activities, at a middling shape). After the host and
        gap sections: a profiler session can leave CUPTI hooks that slow later eager launches (the tables after it
        are graph replays, which launch nothing from the host per kernel)."""
        u, c = self.u, self.clock
        if c.cuda:
            mid = {f"gemm:{name}": u.gemm(lin, 64, spill=False)[0] for name, lin in u.gemms.items()}
            mid |= {unit: u.row_unit(unit, 64) for unit in ROW_UNITS} | {"logits": u.row_unit("logits", 1)}
            mid |= {f"attention:{kind}": u.attention(kind, 64, int(u.spec.sliding_window))[0] for kind in ("window", "causal")}
            mid |= {f"layer:{kind}:{r}": u.layer_call(kind, r) for kind in u.layer_of for r in LAYER_GAP_ROWS}
            self.doc["kernels"] = {name: kernels_per_call(fn) for name, fn in mid.items()}

    def eager_gap(self) -> None:
        """Device seconds an eager launch adds between queued kernels over a graph replay: a one-kernel op (x + y) at
        sizes where the device, not the host, is the bottleneck, timed back to back eagerly and in a graph."""
        u, c, gaps = self.u, self.clock, []
        if not c.cuda:
            return
        for m in (2048, 4096, 8192):
            fn = u.row_unit("residual", m)
            g, how = c.device([fn])
            e, h = c._events([fn], 100), c.host(fn)
            self.doc.setdefault("eager_gap_points", []).append({"rows": m, "graph_s": g, "eager_s": e, "host_s": h, "how": how})
            if how == "graph" and h < 0.7 * g:
                gaps.append(e - g)
        if gaps:
            self.doc["eager_gap_s"] = max(0.0, statistics.median(gaps))

    def gemm(self, sizes: dict[str, set[int]]) -> None:
        """Every GEMM point ``GEMM_PASSES`` times, each pass in the other order (the first: the workloads' shapes
        first), seconds apart: on the 1aaf485 run one pass's points scattered by up to +-10% around a smooth curve
        (M = 2432 at 690 TFLOP/s, M = 2435 at 773, the 14336 x 4096 family; workload points 3-4% slower than the
        generic grid's curve through them), which the median of the passes evens out (``costmodels.replay_table``
        takes the median of the points at one size)."""
        fams = {}
        for name, lin in self.u.gemms.items():
            fams.setdefault((lin.out_features, lin.in_features), (name, lin))
        order = first_workload(sizes.get("gemm", {}))
        for p in range(self.u.gemm_passes):
            for fam, (name, lin) in fams.items():
                for m, origin in (order if p % 2 == 0 else order[::-1]):
                    self.point("gemm", lambda m=m, lin=lin: self.u.gemm(lin, m), origin, m=m, n=fam[0], k=fam[1],
                               name=name, rep=p)
                self.write()

    def rows(self, sizes: dict) -> None:
        self.point("logits", lambda: self.u.row_unit("logits", 1), "both", size=1)   # every chunk ends with it
        for unit in ROW_UNITS:
            for m, origin in first_workload(sizes.get(unit, {})):
                self.point(unit, lambda m=m, unit=unit: self.u.row_unit(unit, m), origin, size=m)
            self.write()

    def attention(self, cells: dict[str, dict[tuple[int, int], str]]) -> None:
        for kind, pts in cells.items():
            for (rows, before), origin in first_workload(pts):
                self.point(f"attention:{kind}", lambda r=rows, b=before, k=kind: self.u.attention(k, r, b), origin,
                           rows=rows, keys=rows + before)
            self.write()


def plan(spec: ModelSpec, tiny: bool, top: int, workload: list | None = None) -> tuple[dict, dict]:
    """(unit -> {size: origin}, attention kind -> {(rows, before): origin}): the generic grids (origin ``grid``), the
    workload's calls added (``workload``: ``costmodels.replay_table.Call`` lists; origin ``workload``, or ``both`` on a
    generic grid point) and the attention rectangles completed (``fill``: a cell off the generic grid outside the
    workloads' own rows x keys-before rectangle)."""
    grid = size_grid(top, tiny)
    sizes = {u: {m: "grid" for m in grid} for u in ("gemm",) + ROW_UNITS}
    att = {k: {(r, b): "grid" for r in rs for b in bs} for k, (rs, bs) in attention_grids(int(spec.sliding_window), tiny).items()}
    extra_rows: dict[str, set[int]] = {k: set() for k in att}
    extra_before: dict[str, set[int]] = {k: set() for k in att}
    for call in workload or []:
        if call.unit == "glue":
            continue
        if call.unit == "attention":
            extra_rows[call.kind].add(int(call.size))
            extra_before[call.kind].add(int(call.keys - call.size))
            continue
        key = "gemm" if call.unit.startswith("gemm:") else call.unit
        if key in sizes:
            m = int(call.keys if call.unit == "kv_gather" else call.size)
            sizes[key][m] = "both" if sizes[key].get(m) in ("grid", "both") else "workload"
    for kind, cells in att.items():
        rs = {r for r, _ in cells} | extra_rows[kind]
        bs = {b for _, b in cells} | extra_before[kind]
        for r in rs:
            for b in bs:
                used = r in extra_rows[kind] and b in extra_before[kind]   # inside the workloads' own rectangle
                on_grid = (r, b) in cells
                cells[(r, b)] = ("both" if used else "grid") if on_grid else ("workload" if used else "fill")
    return sizes, att


def measure(spec: ModelSpec, device: torch.device, dtype: str, page: int, max_tokens: int, out: str | None,
            tiny: bool, workload: list | None = None,
            sections: tuple[str, ...] = ("host", "eager_gap", "layer_gap", "kernels", "gemm", "attention", "rows",
                                         "layer_graph"),
            roofline_hw: str = "h200", section_budget_s: float | None = 45.0) -> dict:
    """Measure the tables of ``spec``'s executor model (``workload``: the calls whose shapes to add); returns the doc
    (also written to ``out`` after each section). A GEMM, attention or row section past ``section_budget_s`` measures
    only the workloads' own shapes (``skipped`` counts the generic points left out)."""
    t0 = time.time()
    top = max(max_tokens, 64 if tiny else 16384)
    units = Units(spec, device, dtype, page, top, tiny)
    clock = Clock(device)
    head = {"format": FORMAT, "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "device": device.type, "torch": torch.__version__, "dtype": dtype, "roofline_hw": roofline_hw,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": {"name": spec.name, "layers": list(spec.kinds()), "hidden": spec.hidden_size,
                      "heads": spec.num_attention_heads, "kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                      "window": int(spec.sliding_window or 0)},
            "row_tile": ROW_TILE, "recipe": RECIPE, "gemms": units.shapes(),
            "host_model": "eager: host seconds per call measured (no sync; units at 1-row shapes, layer calls at "
                          f"{layer_host_rows(tiny)} rows)" if device.type == "cuda" else
            "sync: CPU calls run synchronously, their wall time is their device time; the layers' glue adds up",
            "sync": device.type != "cuda",
            "method": "device = CUDA graph of R back-to-back calls replayed (median of 9) / R (eager events where capture "
                      f"fails); GEMM weights cycled over copies > {L2_SPILL_BYTES >> 20} MiB; host = perf_counter over 20 "
                      "eager calls without sync (median of 5)"}
    tab = Tables(units, clock, out, head)
    if device.type == "cuda":   # (not in a test process) the model and imports leave the collector's generations
        gc.collect()
        gc.freeze()
    sizes, att = plan(spec, tiny, top, workload)
    steps = {"host": tab.host, "eager_gap": tab.eager_gap, "gemm": lambda: tab.gemm(sizes), "rows": lambda: tab.rows(sizes),
             "kernels": tab.kernels, "layer_gap": tab.layer_gap, "layer_graph": tab.layer_graph,
             "attention": lambda: tab.attention(att)}
    for name in sections:
        tab.section(name, steps[name], section_budget_s if name in ("gemm", "attention", "rows") else None)
        tab.finish()   # after every section: a run cut short by its time limit keeps the layer gap once measured
    tab.doc["seconds"] = round(time.time() - t0, 1)
    tab.write()
    return tab.doc


def main(argv=None) -> int:
    from benchmarks.gpu.replay_bench import cli_setup, workload_calls   # the bench's model and workloads
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "replay_tables.json"))
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--ws", default=None, help="replay lengths W of the bench's workloads (their shapes join the grids)")
    ap.add_argument("--generic-only", action="store_true", help="measure the generic grids only")
    a = ap.parse_args(argv)
    setup = cli_setup(a)
    if setup is None:
        return 2
    device, sh, ws, spec = setup
    calls = None if a.generic_only else workload_calls(spec, sh, ws)
    need = max([c + n for c, n in sh["prefix_hit"]] + [p for p, _ in sh["chunked"]])
    doc = measure(spec, device, "fp32" if a.cpu else "bf16", sh["page"], need, a.out, a.tiny, calls)
    print(f"replay tables: {len(doc['points'])} points, {len(doc['errors'])} errors, {doc['seconds']} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
