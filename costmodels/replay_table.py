"""Replay chunks priced from measured tables of the executor's own kernels: the eager forward as a host/device queue.

``benchmarks/gpu/replay_tables.py`` times, on the GPU and apart from any replay run, what the executor's replay
forward (``executor.swa_replay.SWAReplay.run`` over the GQA and sliding layers of ``executor/swa.py``) launches
for one model:

- its bf16 ``Linear`` per weight shape (N, K) over the rows M (an ``op_table.GemmTable`` of dtype bf16);
- its prefill attention call by (rows, keys) per kind: ``window`` (swa.py's tile with its causal-and-window mask)
  and ``causal`` (the full layers' call), an ``op_table.GridTable`` over rows x (keys - rows + 1);
- its row-wise ops (RMSNorm, RoPE of q and k, the paged KV write and gather, the SwiGLU activation, residual adds,
  the embedding, a replay layer's row selection, the logits of the last row) over their size (``op_table.Series``);
- the host seconds of one eager call of each (a 1-row call: the device waits on the host), and of one whole
  decoder layer call; the layer's host time not spent in its ops' own calls (Python between them) is its ``glue``;
- the eager launch gap: what a queued eager kernel adds on the device over a graph replay's (per kernel), and each
  unit's kernels per call.

Device times are CUDA-graph replays of back-to-back calls (the launch is not in them); an eager call adds its
kernels x the launch gap (the device-side cost of launching kernels one by one, which the graph removes). The
eager forward is then priced as what it is, one stream fed by one host thread: the host has issued op i after
``H_i = h_1 + .. + h_i`` seconds, the device runs it once it is issued and op i-1 is done,
``F_i = max(F_{i-1}, H_i) + d_i``, and the chunk takes ``F_last`` (a CUDA-event window opened on an idle device, as the replay bench's). Long chunks are
device-bound (the host runs ahead: the sum of device times); short ones wait on the host where its issue rate is
slower than the kernels. Zero host times give the sum of device times. Tables measured where calls run
synchronously (``sync``, the CPU smoke mode) add device times and the layers' glue instead.

Which ops a layer runs, at which size, is the measured file's ``recipe`` (written by the measuring side, which
knows the executor); sizes come from the replay rule (``ResolvedReplay``) as the executor applies it: layer j runs
``n + e_j`` rows starting at ``c - e_j`` and reads keys from ``first_key`` (``executor.swa_replay.resume_layout``'s
key start, a kept window bounds it) to ``c + n``; a sliding layer's attention is cut into tiles of ``row_tile`` rows
(``executor.swa.ROW_TILE``), each over the keys its window reaches; a full layer is one call over every key.
A lookup is ``measured`` on or between grid points, ``extrapolated`` beyond the grid (``op_table``'s rules) and
``scaled`` for a GEMM shape that was not measured; a priced chunk counts its lookups by source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from costmodels.hardware import get_hardware
from costmodels.op_table import MEASURED, GemmTable, GridTable, Lookup, Series

FORMAT = "twinfer-replay-tables/1"
# the size each recipe entry is looked up at: this layer's rows, the rows entering layer 0, the new tokens, one row,
# the keys the layer gathers; "calls" is the attention entry (its calls per the layer's kind and tiling)
AXES = ("rows", "step_rows", "new", "one", "keys", "calls")
# recipe lists: start (once, before layer 0), layer (every layer), tile_post (after each tile of a tiled attention),
# subset_pre / subset_post (around a layer that runs fewer rows than the step: a replay's lower rows drop out), end


class TableError(ValueError):
    """A table file that cannot price what was asked (missing unit, other model, bad format)."""


@dataclass
class ExecTables:
    """Measured device and host seconds of one executor model's ops (module docstring)."""

    model: dict                                  # name, hidden, layers (kinds), window, ... of the measured model
    recipe: dict[str, list[tuple[str, str]]]     # layer / subset_pre / subset_post / start / end -> [(unit, axis)]
    gemm: GemmTable                              # bf16 Linear, families (N, K) over M
    gemm_shapes: dict[str, tuple[int, int]]      # unit "gemm:NAME" -> (N, K)
    attention: dict[str, GridTable]              # kind (window / causal) -> rows x (keys - rows + 1)
    rows: dict[str, Series]                      # row-wise unit -> seconds over its size
    host: dict[str, float] = field(default_factory=dict)        # unit -> host seconds per eager call
    layer_host: dict[str, float] = field(default_factory=dict)  # layer kind -> host seconds of one eager layer call
    row_tile: int = 1 << 30
    provenance: dict = field(default_factory=dict)
    kernels: dict[str, int] = field(default_factory=dict)    # unit -> device activities per call (profiler)
    eager_gap: float = 0.0                                   # device seconds an eager launch adds per kernel
    sync: bool = False       # measured where calls run synchronously (the CPU): device times hold the host's share
    # layer kind -> {rows: host seconds of one eager layer call at that many rows} (tables after 1aaf485)
    layer_host_rows: dict[str, dict[int, float]] = field(default_factory=dict)
    gap_source: str = "none"  # which measurement eager_gap comes from: "layer" (decoder layers), "add" (x + y), "none"
    glue_mode: str = "spread"  # "spread": a layer's glue between its calls; "lump": all before its first (1aaf485)
    split: bool = True         # a call's kernels issued one by one over its host time; False: all at its end (1aaf485)

    # ------------------------------------------------------------------ lookups
    def device(self, unit: str, size: float, keys: float = 0.0, kind: str = "") -> Lookup:
        """Device seconds of one call of ``unit`` at ``size`` (attention: ``size`` rows over ``keys`` keys of ``kind``)."""
        if unit == "attention":
            tab = self.attention.get(kind)
            if tab is None:
                raise TableError(f"replay tables: no attention table of kind {kind!r} (have {sorted(self.attention)})")
            return tab.time(size, keys - size + 1)
        if unit.startswith("gemm:"):
            if unit not in self.gemm_shapes or not self.gemm.families:
                raise TableError(f"replay tables: recipe GEMM {unit!r} has no shape (have {sorted(self.gemm_shapes)})")
            return self.gemm.time(size, *self.gemm_shapes[unit])
        s = self.rows.get(unit)
        if s is None:
            raise TableError(f"replay tables: no measured unit {unit!r} (have {sorted(self.rows)})")
        return s.time(size)

    def host_of(self, unit: str, kind: str = "") -> float:
        return float(self.host.get(f"attention:{kind}" if unit == "attention" else unit, 0.0))

    def kernels_of(self, unit: str, kind: str = "") -> int:
        """Kernels one call of ``unit`` launches (the profiler's count; 1 where not counted or not ``split``)."""
        if not self.split:
            return 1
        return max(1, int(self.kernels.get(f"attention:{kind}" if unit == "attention" else unit, 1)))

    def gap_of(self, unit: str, kind: str = "") -> float:
        """Device seconds an eager call of ``unit`` spends in launch gaps: its kernels x the per-kernel gap."""
        return self.eager_gap * self.kernels.get(f"attention:{kind}" if unit == "attention" else unit, 0)

    def layer_host_at(self, kind: str, rows: float) -> float | None:
        """Host seconds of one eager layer call of ``kind`` at ``rows`` rows: log-log between the measured row
        counts, the nearest one outside them (host work does not extrapolate); the 1-row figure where no row
        series was measured; None where neither was."""
        by = self.layer_host_rows.get(kind)
        if not by:
            return self.layer_host.get(kind)
        xs = np.array(sorted(by), float)
        ts = np.array([by[int(x)] for x in xs], float)
        r = float(np.clip(max(rows, 1.0), xs[0], xs[-1]))
        return float(np.exp(np.interp(np.log(r), np.log(xs), np.log(np.maximum(ts, 1e-12)))))

    def glue(self, kind: str, rows: float = 1.0) -> float:
        """Host seconds of a layer call outside its ops' own calls (Python between them) at ``rows``, never negative."""
        total = self.layer_host_at(kind, rows)
        if total is None:
            return 0.0
        akind = attention_kind(kind)
        return max(0.0, total - sum(self.host_of(u, akind) for u, _ in self.recipe.get("layer", [])))

    def with_host(self, layer_host_rows: dict[str, dict[int, float]]) -> "ExecTables":
        """These tables with the host speed of another moment (a probe taken beside the runs, ``layer_host_rows`` of
        the same layer calls): the probe's layer calls replace the tables' at the rows it measured, the tables' other
        rows and every unit's host seconds scale by the probe's smallest layer call over the tables' (the same CPU
        running the same Python: one speed ratio per layer kind, their mean for the units)."""
        probe = {k: {int(x): float(t) for x, t in by.items()} for k, by in layer_host_rows.items() if by}  # JSON keys
        ratio = {k: by[min(by)] / self.layer_host_at(k, min(by)) for k, by in probe.items() if self.layer_host_at(k, min(by))}
        r = float(np.mean(list(ratio.values()))) if ratio else 1.0
        rows = {k: {x: t * ratio.get(k, r) for x, t in by.items()} for k, by in self.layer_host_rows.items()}
        for k, by in probe.items():
            rows[k] = {**rows.get(k, {}), **by}
        lh = {k: by[min(by)] for k, by in probe.items()}
        return replace(self, host={u: h * r for u, h in self.host.items()}, layer_host={**self.layer_host, **lh},
                       layer_host_rows=rows)

    def check_model(self, spec) -> None:
        """The tables speak for the model they were measured on: same layer kinds, widths and window."""
        m = self.model
        want = {"layers": list(spec.kinds()), "hidden": spec.hidden_size, "heads": spec.num_attention_heads,
                "kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "window": int(spec.sliding_window or 0)}
        bad = [f"{k} {m.get(k)!r} vs {v!r}" for k, v in want.items() if k in m and m[k] != v]
        if bad:
            raise TableError(f"replay tables measured on {m.get('name')!r} cannot price {spec.name!r}: " + "; ".join(bad))


# ---------------------------------------------------------------------------------------------- the forward's ops
def attention_kind(layer_kind: str) -> str:
    """The attention table a layer kind's calls are looked up in."""
    return "window" if layer_kind == "sliding" else "causal"


@dataclass(frozen=True)
class Op:
    """One eager call of the forward: unit, kind (attention), size, keys, device and host seconds, lookup source."""

    unit: str
    size: float
    keys: float
    device_s: float
    host_s: float
    source: str
    layer: int = -1
    gap_s: float = 0.0       # of device_s: the eager launch gaps (kernels x gap)
    kernels: int = 1         # launches of the call: issued one by one over its host time (eager_stream)


def first_key(modes: tuple[str, ...], tokens: tuple[int, ...], window: int, sliding: list[bool], j: int,
              c: int, e: int) -> int:
    """First key position layer ``j`` reads on a resume after ``c`` tokens carrying ``e`` extra rows (the executor's
    rule, ``executor.swa_replay.resume_layout`` then ``SlidingWindowAttention.forward``): a full layer reads from 0; a
    sliding one from ``first row - window + 1``, bounded below by what its policy kept (replay W keeps
    ``[c - window, c - W)``, persist ``[c - window, c)``, recompute nothing) and by the rows it recomputes."""
    if not sliding[j]:
        return 0
    lo = max(0, c - e - window + 1)
    if c == 0:
        return lo
    mode, w = modes[j], tokens[j]
    k0 = max(0, c - window)
    k1 = {"persist": c, "replay": max(k0, c - min(w, c)), "recompute": k0}.get(mode, c)
    if mode == "recompute":
        k0 = k1 = 0
    start = min(k0 if k1 > k0 else c, c - e)
    return max(lo, start)


def attention_calls(sliding: bool, rows: int, first: int, lo: int, kv_len: int, window: int, tile: int) -> list[tuple[int, int]]:
    """(rows, keys) of each attention call a layer makes: a full layer one call over every key; a sliding one tiles of
    ``tile`` rows (``executor.swa.window_attention``), each from the first key its window reaches."""
    if not sliding or rows <= tile:
        return [(rows, kv_len - lo)]
    out = []
    for a in range(0, rows, tile):
        b = min(rows, a + tile)
        out.append((b - a, (first + b) - max(lo, first + a - window + 1)))
    return out


@dataclass(frozen=True)
class Call:
    """One eager call of the forward, before pricing: unit, size (rows), keys (attention, KV gather), attention kind."""

    unit: str
    size: float
    keys: float = 0.0
    kind: str = ""
    layer: int = -1
    layer_kind: str = ""


def forward_calls(recipe: dict, row_tile: int, spec, replay, n: int, c: int) -> list[Call]:
    """The eager calls of one resumed chunk (``n`` new tokens after ``c`` cached, under ``replay``, a ResolvedReplay)
    in the executor's order, per ``recipe``; each layer starts with its ``glue`` (the host's time between calls)."""
    kinds = list(spec.kinds())
    sliding = [k == "sliding" for k in kinds]
    window = int(replay.window or spec.sliding_window or 0)
    e = replay.extra_tokens(c) if (c and replay.modes) else np.zeros(len(kinds), np.int64)
    r0 = n + int(e[0]) if len(e) else n
    out: list[Call] = []

    def add(items, rows, keys=0.0, layer=-1, lkind=""):
        for unit, axis in items:
            if unit == "attention" or axis == "calls":
                raise TableError("replay tables: 'attention' (axis 'calls') belongs in the recipe's 'layer' list only")
            size = {"rows": rows, "step_rows": r0, "new": n, "one": 1, "keys": keys}.get(axis)
            if size is None:
                raise TableError(f"replay tables: recipe axis {axis!r} (allowed: {', '.join(AXES)})")
            out.append(Call(unit, float(size), float(keys) if axis == "keys" else 0.0, "", layer, lkind))

    add(recipe.get("start", []), r0)
    for j, kind in enumerate(kinds):
        ej = int(e[j])
        rows, first, kv_len = n + ej, c - ej, c + n
        lo = first_key(replay.modes, replay.tokens, window, sliding, j, c, ej) if replay.modes else \
            (max(0, first - window + 1) if sliding[j] else 0)
        subset = rows < r0
        out.append(Call("glue", float(rows), 0.0, attention_kind(kind), j, kind))
        if subset:
            add(recipe.get("subset_pre", []), rows, layer=j, lkind=kind)
        for unit, axis in recipe.get("layer", []):
            if unit == "attention":
                tiles = attention_calls(sliding[j], rows, first, lo, kv_len, window, row_tile)
                for r, k in tiles:
                    out.append(Call("attention", float(r), float(k), attention_kind(kind), j, kind))
                    if len(tiles) > 1:   # a tiled call places each tile's output in the layer's buffer
                        add(recipe.get("tile_post", []), r, layer=j, lkind=kind)
            else:
                add([(unit, axis)], rows, kv_len - lo, j, kind)
        if subset:
            add(recipe.get("subset_post", []), rows, layer=j, lkind=kind)
    add(recipe.get("end", []), r0)
    return out


def forward_ops(tables: ExecTables, spec, replay, n: int, c: int) -> list[Op]:
    """``forward_calls`` priced from the tables (device seconds looked up, host seconds per call measured), each
    layer's glue placed as ``tables.glue_mode`` says (``spread_glue``)."""
    ops = []
    for call in forward_calls(tables.recipe, tables.row_tile, spec, replay, n, c):
        if call.unit == "glue":
            ops.append(Op("glue", call.size, 0.0, 0.0, tables.glue(call.layer_kind, call.size), MEASURED, call.layer))
            continue
        lk = tables.device(call.unit, call.size, call.keys, call.kind)
        unit = f"attention:{call.kind}" if call.unit == "attention" else call.unit
        host = 0.0 if tables.sync else tables.host_of(call.unit, call.kind)
        gap = tables.gap_of(call.unit, call.kind)
        ops.append(Op(unit, call.size, call.keys, float(lk.seconds[0]) + gap, host, str(lk.source[0]), call.layer, gap,
                      tables.kernels_of(call.unit, call.kind)))
    return ops if (tables.glue_mode == "lump" or tables.sync) else spread_glue(ops)


def spread_glue(ops: list[Op]) -> list[Op]:
    """Each layer's glue (the Python between its calls: module calls, views, the output buffer) shared out over the
    host times of that layer's calls, where it runs, instead of before the first of them: with it all up front the
    device would wait for a whole layer's glue before the layer's first kernel, which it does not."""
    out: list[Op] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if op.unit != "glue":
            out.append(op)
            i += 1
            continue
        j = i + 1
        while j < len(ops) and ops[j].layer == op.layer and ops[j].unit != "glue":
            j += 1
        mine = ops[i + 1: j]
        share = op.host_s / len(mine) if mine else 0.0
        out += [replace(o, host_s=o.host_s + share) for o in mine] if mine else [op]
        i = j
    return out


# ---------------------------------------------------------------------------------------------- pricing
@dataclass(frozen=True)
class TableCost:
    """A chunk (or a chunked prompt) priced from the tables."""

    seconds: float           # the eager stream: F_last of the host/device queue
    device_s: float          # sum of the device times, eager launch gaps included
    host_s: float            # sum of the host issue times
    by_unit: dict[str, float]
    sources: dict[str, int]  # lookups per source (measured / extrapolated / scaled)
    ops: int
    gaps_s: float = 0.0      # of device_s, the eager launch gaps: device_s - gaps_s is a CUDA graph of the same calls

    @property
    def worst_source(self) -> str:
        for s in ("scaled", "extrapolated"):
            if self.sources.get(s):
                return s
        return MEASURED


def eager_stream(ops: list[Op]) -> float:
    """Seconds from an idle device to the last op's end: F_i = max(F_{i-1}, H_i) + d_i (module docstring), over the
    kernels of each op: a call of k kernels issues them one by one over its host time (k equal shares of its host
    and device seconds), so where the device keeps up it runs a call's first kernels while the host still issues its
    last ones (a 20-kernel RoPE issued over 270 us does not end 20 kernels after its host time)."""
    h = f = 0.0
    for op in ops:
        k = max(1, op.kernels)
        dh, dd = op.host_s / k, op.device_s / k
        for _ in range(k):
            h += dh
            f = max(f, h) + dd
    return f


def price(ops: list[Op], sync: bool = False) -> TableCost:
    """The ops' cost: the eager queue, or (``sync``: calls that run synchronously) device and host times added."""
    by: dict[str, float] = {}
    src: dict[str, int] = {}
    for op in ops:
        key = "gemm" if op.unit.startswith("gemm:") else op.unit
        by[key] = by.get(key, 0.0) + op.device_s
        if op.unit != "glue":
            src[op.source] = src.get(op.source, 0) + 1
    dev, host = float(sum(o.device_s for o in ops)), float(sum(o.host_s for o in ops))
    return TableCost(dev + host if sync else eager_stream(ops), dev, host, by, src, len(ops),
                     float(sum(o.gap_s for o in ops)))


def table_chunk_cost(tables: ExecTables, spec, replay, n: int, c: int) -> TableCost:
    """One resumed chunk of ``n`` new tokens after ``c`` cached under ``replay`` (a ResolvedReplay), from the tables."""
    tables.check_model(spec)
    return price(forward_ops(tables, spec, replay, int(n), int(c)), tables.sync)


def table_prefill_cost(tables: ExecTables, spec, replay, parts: list[tuple[int, int]]) -> TableCost:
    """The chunks ``parts`` ((new, context) each) run back to back in one eager stream (no sync between them)."""
    tables.check_model(spec)
    ops: list[Op] = []
    for n, c in parts:
        ops += forward_ops(tables, spec, replay, int(n), int(c))
    return price(ops, tables.sync)


# ---------------------------------------------------------------------------------------------- loading
def _series(points: list[tuple[float, float]], unit: str, work) -> Series:
    by: dict[float, list[float]] = {}
    for x, t in points:
        by.setdefault(float(x), []).append(float(t))
    xs = sorted(by)
    return Series(np.array(xs), np.array([float(np.median(by[x])) for x in xs]), work, f"executor {unit} table")


def _grid(points: dict[tuple[float, float], float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The largest full rectangle of (x, y) -> t: drop the row or column missing most cells until none is missing."""
    xs, ys = sorted({p[0] for p in points}), sorted({p[1] for p in points})
    while xs and ys:
        miss_x = {x: sum((x, y) not in points for y in ys) for x in xs}
        miss_y = {y: sum((x, y) not in points for x in xs) for y in ys}
        wx, wy = max(miss_x, key=miss_x.get), max(miss_y, key=miss_y.get)
        if not miss_x[wx]:
            break
        if miss_x[wx] / len(ys) >= miss_y[wy] / len(xs):
            xs.remove(wx)
        else:
            ys.remove(wy)
    return np.array(xs, float), np.array(ys, float), np.array([[points[(x, y)] for y in ys] for x in xs], float)


def from_dict(d: dict, origins: tuple[str, ...] | None = None, glue_mode: str = "spread",
              gap_from: str = "layer", split: bool = True) -> ExecTables:
    """Tables from the measured file's dict (``origins``: keep only points of these origins, e.g. ('grid',)).

    ``glue_mode``: ``spread`` (the model) or ``lump`` (the first table model's, to re-score old runs side by side);
    ``split``: a call's kernels issued one by one over its host time (the model), or all at its end (the first).
    ``gap_from``: the eager launch gap per kernel from whole decoder layers (``layer_eager_gap_s``: eager minus
    graph of the executor's own layers, the kernel mix the forward runs) where measured, else from one x + y kernel
    (``eager_gap_s``); ``add`` takes the x + y figure even where both are there."""
    if d.get("format") != FORMAT:
        raise TableError(f"replay tables: format {d.get('format')!r}, expected {FORMAT!r}")
    if glue_mode not in ("spread", "lump") or gap_from not in ("layer", "add"):
        raise TableError(f"replay tables: glue_mode {glue_mode!r} (spread, lump), gap_from {gap_from!r} (layer, add)")
    gap, gap_source = float(d.get("eager_gap_s", 0.0)), ("add" if "eager_gap_s" in d else "none")
    if gap_from == "layer" and d.get("layer_eager_gap_s") is not None:
        gap, gap_source = float(d["layer_eager_gap_s"]), "layer"
    hw = get_hardware(d.get("roofline_hw", "h200"))
    pts = [p for p in d.get("points", []) if p.get("device_s") and (origins is None or p.get("origin", "grid") in origins)]
    gemm = GemmTable("executor", "bf16", peak_flops=hw.bf16_tflops * 1e12, hbm_bw=hw.hbm_bw, weight_bytes_per_elem=2.0,
                     measured_on=str(d.get("gpu", "")))
    fam: dict[tuple[int, int], list[tuple[float, float]]] = {}
    att: dict[str, dict[tuple[float, float], float]] = {}
    rows: dict[str, list[tuple[float, float]]] = {}
    for p in pts:
        u = p["unit"]
        if u == "gemm":
            fam.setdefault((int(p["n"]), int(p["k"])), []).append((float(p["m"]), float(p["device_s"])))
        elif u.startswith("attention:"):
            r, k = float(p["rows"]), float(p["keys"])
            att.setdefault(u.split(":", 1)[1], {})[(r, k - r + 1)] = float(p["device_s"])
        else:
            rows.setdefault(u, []).append((float(p["size"]), float(p["device_s"])))
    for key, ps in fam.items():
        s = _series(ps, "gemm", None)
        gemm.families[key] = (s.xs, s.ts)
    attention = {}
    for kind, cells in att.items():
        xs, ys, sec = _grid(cells)
        if xs.size and ys.size:
            attention[kind] = GridTable("executor", f"{kind} prefill attention (rows x keys - rows + 1)", xs, ys, sec,
                                        work=lambda r, y: np.asarray(r, float) * (np.asarray(r, float) + np.asarray(y, float)))
    series = {u: _series(ps, u, lambda m: np.asarray(m, float)) for u, ps in rows.items()}
    recipe = {k: [tuple(x) for x in v] for k, v in d.get("recipe", {}).items()}
    shapes = {f"gemm:{k}": (int(v[0]), int(v[1])) for k, v in d.get("gemms", {}).items()}
    return ExecTables(d.get("model", {}), recipe, gemm, shapes, attention, series,
                      {k: float(v) for k, v in d.get("host", {}).items()},
                      {k: float(v) for k, v in d.get("layer_host", {}).items()},
                      int(d.get("row_tile", 1 << 30)), {k: d.get(k) for k in ("gpu", "device", "torch", "method", "date")},
                      {k: int(v) for k, v in d.get("kernels", {}).items()}, gap, bool(d.get("sync", False)),
                      {k: {int(r): float(t) for r, t in by.items()} for k, by in d.get("layer_host_rows", {}).items()},
                      gap_source, glue_mode, split)


def load(path: str | Path, origins: tuple[str, ...] | None = None, **how) -> ExecTables:
    """The tables written by ``benchmarks/gpu/replay_tables.py`` at ``path`` (``how``: ``from_dict``'s options)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TableError(f"replay tables {path}: cannot read ({e})") from None
    return from_dict(d, origins, **how)
