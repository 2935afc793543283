"""A replay forward priced from pieces measured on a grid of shapes, interpolated to the forward's own (issue 23).

``costmodels/replay_segments.py`` prices a forward from its pieces (embedding, each layer's step, the end with the
logits) measured at the forward's exact shapes. This module prices the same pieces at shapes that were *not*
measured: the replay bench (``benchmarks/gpu/replay_grid.py``) measures each kind of piece on a grid, in the same way
and the same timed rounds as the forwards, and a piece is read off the grid by its features:

- ``embed`` / ``end``: the rows the step runs (``rows0``);
- ``sliding``: a sliding layer's rows and its keys before them (``prior`` = context - first key, 0 .. window:
  the attention reads at most the window; linear in ``prior``);
- ``full`` / ``fullsel``: a full-attention layer's rows and its cached context (linear in context: attention work
  grows with it at fixed rows); ``fullsel`` selects its rows out of a longer replayed batch and puts them back.

A layer's attention runs its rows in tiles of ``row_tile`` (``executor.swa.ROW_TILE``): one row past a tile costs a
tile's launches and a step in device time (run_4e31ccf: a sliding layer at 2048 rows 56 kernels and 2.12 ms, at 2080
rows 74 kernels and 2.30 ms), so a layer piece is read only off grid points with as many tiles (1, 2, or 3 and more).
Device seconds are interpolated along rows in log-log space (as ``op_table.loglog_interp``), linearly between the two
grid contexts around the target; beyond the grid they follow the last two points' slope and the answer is flagged
``extrapolated``. Host seconds are the piece kind's, per tile class: the median over the grid's points of that kind
and tile class. A piece's host time is the launch of its kernels, whose number is set by its kind and tiles, not by
its rows or context; read off the grid by shape it picked up the grid's noise (run_d1473e5: the same piece at its own
shape and read off the grid differed by +16 to +26% in host time), and at a +190% throughput change 1% on one forward
moves the predicted change by ~3 pp. Per kind, the held-out grid predicts the chunked 16384/2048 workload's change
within 5 pp for 4 of 6 W (was 2), the prefix-hit workloads for 1 and 0 (was 1 and 0): ``python -m
benchmarks.gpu.replay_rescore benchmarks/gpu/issue23_h200/run_d1473e5/replay_bench.json.gz``. Where a grid point carries ``host_b2b_s`` (grids from
the bench after 2026-12-03: the piece's host seconds when issued right after its neighbour in the forward's order, not
alone after a synchronize; a forward issued its pieces 2-15% faster than the sum of its isolated pieces, run_d1473e5)
that is its host time (``ReplayGrid(b2b=False)``: the isolated one); older grids read as before. The kernel placement (``Segment.trace``) is the nearest grid point's. The queue
is ``replay_segments.segment_stream``. Nothing here reads a forward's measured time.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from costmodels.replay_segments import Segment, SegmentCost, segment_stream

KINDS = ("embed", "end", "sliding", "full", "fullsel")
TILED = ("sliding", "full", "fullsel")
MAX_TILE_CLASS = 3   # 1 tile, 2 tiles, 3 or more (a tile more among many moves little)
LINEAR_CTX = ("sliding", "full", "fullsel")


class GridError(ValueError):
    pass


def features(key: str, sliding: list[bool]) -> tuple[str, int, int]:
    """(kind, rows, ctx) of a bench piece key (``benchmarks.gpu.replay_segments.piece_key``): ``embed|rows0|rows``,
    ``end|rows0|rows``, ``layer{j}|rows0|all-or-run|num:context:kv_len:key_start``."""
    parts = key.split("|")
    if parts[0] in ("embed", "end"):
        return parts[0], int(parts[1]), 0
    if not parts[0].startswith("layer") or len(parts) != 4 or "," in parts[3]:
        raise GridError(f"piece {key!r}: one sequence's layer step expected")
    j = int(parts[0][5:])
    num, ctx, _kv, ks = (int(x) for x in parts[3].split(":"))
    if sliding[j]:
        return "sliding", num, ctx - ks
    return ("full" if parts[2] == "all" else "fullsel"), num, ctx


def step_features(sliding: list[bool], window: int, modes: tuple[str, ...], tokens: tuple[int, ...],
                  extra: list[int], n: int, c: int) -> list[tuple[str, int, int]]:
    """The pieces of one resumed chunk of ``n`` new tokens after ``c`` cached, from the policy's per-layer modes and
    W (``ResolvedReplay.modes`` / ``tokens``) and extra rows ``extra`` (``ResolvedReplay.extra_tokens(c)``): the executor's layout (``executor.swa_replay``'s
    ``resume_layout`` / ``_layer_view``), restated here on features (costmodels may not import the executor)."""
    if c == 0:
        extra, modes = [0] * len(sliding), tuple("none" for _ in sliding)
    rows0 = n + (int(extra[0]) if extra else 0)
    out = [("embed", rows0, 0)]
    for j, sl in enumerate(sliding):
        e = int(extra[j])
        if not sl:
            out.append(("full" if n + e == rows0 else "fullsel", n + e, c - e))
            continue
        if c == 0:
            out.append(("sliding", n, 0))
            continue
        mode = modes[j] if j < len(modes) else "persist"
        w = int(tokens[j]) if j < len(tokens) else 0
        k0 = max(0, c - window)
        k1 = {"persist": c, "replay": max(k0, c - min(w, c)), "recompute": k0}.get(mode, c)
        if mode == "recompute":
            k0 = k1 = 0
        start = min(k0 if k1 > k0 else c, c - e)
        out.append(("sliding", n + e, (c - e) - start))
    out.append(("end", rows0, 0))
    return out


@dataclass(frozen=True)
class Point:
    kind: str
    rows: int
    ctx: int
    host_s: float
    device_s: float
    trace: tuple[tuple[float, float], ...] = ()
    host_b2b_s: float | None = None   # host seconds issued back to back with its neighbours (None: not measured)


@dataclass(frozen=True)
class GridPiece:
    segment: Segment
    extrapolated: bool


def _interp_log(x: float, xs: list[float], ys: list[float]) -> tuple[float, bool]:
    """log-log interpolation of y(x) on sorted xs; beyond them the end pair's slope (flagged)."""
    if len(xs) == 1:
        return ys[0], x != xs[0]
    lx = math.log(x)
    i = bisect.bisect_left(xs, x)
    out = x < xs[0] or x > xs[-1]
    i = min(max(i, 1), len(xs) - 1)
    x0, x1 = math.log(xs[i - 1]), math.log(xs[i])
    y0, y1 = math.log(max(ys[i - 1], 1e-12)), math.log(max(ys[i], 1e-12))
    slope = (y1 - y0) / (x1 - x0)
    if out:   # beyond the grid: no faster than the work (slope <= 2: attention over rows x rows), never falling
        slope = min(max(slope, 0.0), 2.0)
        x0, y0 = (x0, y0) if x < xs[0] else (x1, y1)
    return math.exp(y0 + slope * (lx - x0)), out


def _interp_lin(x: float, xs: list[float], ys: list[float]) -> tuple[float, bool]:
    if len(xs) == 1:
        return ys[0], x != xs[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    slope, out = (ys[i] - ys[i - 1]) / (x1 - x0), x < xs[0] or x > xs[-1]
    if out:   # beyond the grid: from the nearer end, never falling
        slope = max(slope, 0.0)
        x0, y0 = (x0, ys[i - 1]) if x < xs[0] else (x1, ys[i])
        return max(0.0, y0 + slope * (x - x0)), out
    return ys[i - 1] + slope * (x - x0), out


class ReplayGrid:
    """Measured pieces on a grid (module docstring); ``points`` of any kinds in ``KINDS``."""

    def __init__(self, points: list[Point], window: int | None = None, meta: dict | None = None,
                 layers: list[str] | None = None, model: dict | None = None, row_tile: int | None = None,
                 b2b: bool = True):
        same: dict[tuple[str, int, int], list[Point]] = {}
        for p in points:   # one point per shape: the median of repeats
            same.setdefault((p.kind, p.rows, p.ctx), []).append(p)
        self.points = [ps[0] if len(ps) == 1 else
                       Point(*k, statistics.median(p.host_s for p in ps), statistics.median(p.device_s for p in ps),
                             ps[0].trace, _median_or_none([p.host_b2b_s for p in ps])) for k, ps in same.items()]
        # the host time a piece is priced with: back to back where measured (and wanted), else the isolated one
        self.b2b = bool(b2b) and any(p.host_b2b_s is not None for p in self.points)
        self.window, self.meta, self.layers, self.model = window, meta or {}, layers, model or {}
        self.row_tile = int(row_tile) if row_tile else None
        self.by: dict[str, dict[int, list[Point]]] = {}
        for p in self.points:
            if p.kind not in KINDS:
                raise GridError(f"grid point kind {p.kind!r}: expected one of {KINDS}")
            self.by.setdefault(p.kind, {}).setdefault(p.ctx, []).append(p)
        for by_ctx in self.by.values():
            for ps in by_ctx.values():
                ps.sort(key=lambda p: p.rows)
        hosts: dict[tuple[str, int], list[float]] = {}
        for p in self.points:
            hosts.setdefault((p.kind, self.tiles(p.kind, p.rows)), []).append(self.host_of(p))
        self.kind_host = {k: statistics.median(v) for k, v in hosts.items()}

    def host_of(self, p: Point) -> float:
        """A point's host seconds as this grid prices them (``b2b``: back to back where the point has it)."""
        return p.host_b2b_s if self.b2b and p.host_b2b_s is not None else p.host_s

    def tiles(self, kind: str, rows: int) -> int:
        """The tile class of a piece (0: untiled)."""
        if not self.row_tile or kind not in TILED:
            return 0
        return min(-(-int(rows) // self.row_tile), MAX_TILE_CLASS)

    def keys(self) -> set[tuple[str, int, int]]:
        return {(p.kind, p.rows, p.ctx) for p in self.points}

    def piece(self, kind: str, rows: int, ctx: int) -> GridPiece:
        """One piece's host and device seconds read off the grid, with the nearest point's kernel placement."""
        by_ctx = self.by.get(kind)
        if not by_ctx:
            raise GridError(f"replay grid has no {kind!r} points")
        ctxs = sorted(by_ctx)
        if ctx in by_ctx:   # on a grid context: that context's points alone
            use = [ctx]
        elif kind in LINEAR_CTX and len(ctxs) > 1:
            i = min(max(bisect.bisect_left(ctxs, ctx), 1), len(ctxs) - 1)
            use = [ctxs[i - 1], ctxs[i]]
        else:
            use = [min(ctxs, key=lambda x: abs(x - ctx))]
        ds, ext = [], len(use) == 1 and kind in LINEAR_CTX and ctx != use[0]
        cls = self.tiles(kind, rows)
        for cx in use:
            ps = [p for p in by_ctx[cx] if self.tiles(kind, p.rows) == cls]
            if not ps:   # no point with as many tiles at this context: all of them, flagged
                ps, ext = by_ctx[cx], True
            rs = [float(p.rows) for p in ps]
            d, e2 = _interp_log(float(rows), rs, [p.device_s for p in ps])
            ds.append(d)
            ext = ext or e2
        if len(use) == 2:
            d, e3 = _interp_lin(float(ctx), [float(x) for x in use], ds)
            ext = ext or e3
        else:
            d = ds[0]
        # the kind's host time (module docstring); a tile class the grid lacks takes the kind's nearest class
        h = self.kind_host.get((kind, cls))
        if h is None:
            h = self.kind_host[min((k for k in self.kind_host if k[0] == kind), key=lambda k: abs(k[1] - cls))]
        near = min((p for ps in by_ctx.values() for p in ps),
                   key=lambda p: (self.tiles(kind, p.rows) != cls, (math.log(p.rows / rows)) ** 2 + ((p.ctx - ctx) / 8192.0) ** 2))
        return GridPiece(Segment(h, d, near.trace), ext)

    def price(self, feats: list[tuple[str, int, int]], sync: bool = False) -> tuple[SegmentCost, int]:
        """(the pieces ``feats`` queued from an idle device, how many were extrapolated)."""
        got = [self.piece(*f) for f in feats]
        return segment_stream([g.segment for g in got], sync), sum(g.extrapolated for g in got)

    # ---------------------------------------------------------------- the simulator's / tune's view
    def matches(self, spec) -> bool:
        """Whether the grid was measured on this model's layers: the same layer kinds and window, and the same widths
        where the grid names them (a grid prices the model it was measured on, nothing else)."""
        if self.layers is not None and list(self.layers) != list(spec.kinds()):
            return False
        if self.window is not None and int(self.window) != int(spec.sliding_window or 0):
            return False
        names = {"hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_kv_heads", "head_dim": "head_dim"}
        return all(getattr(spec, a, None) == self.model[k] for k, a in names.items() if k in self.model)

    def check_model(self, spec) -> None:
        if not self.matches(spec):
            raise GridError(f"replay grid measured on {self.model.get('name') or self.layers}, not on {spec.name!r}")

    def step_seconds(self, spec, replay, n: int, c: int, extra: list[int] | None = None) -> SegmentCost:
        """One chunk of ``n`` new tokens after ``c`` under ``replay`` (a ``ResolvedReplay``); ``extra``: the per-layer
        extra rows to price instead of the policy's (``DepthCorrection``'s e_0 everywhere)."""
        sliding = [k == "sliding" for k in spec.kinds()]
        return self.price(_replay_features(sliding, replay, int(n), int(c), extra))[0]

    def chunk_seconds(self, sliding: list[bool], replay, parts: list[tuple[int, int]]) -> tuple[SegmentCost, int]:
        """The chunks ``parts`` ((new, context) each) of ``replay`` (a ``ResolvedReplay``) run back to back."""
        return self.price([f for n, c in parts for f in _replay_features(sliding, replay, int(n), int(c))])


def _replay_features(sliding: list[bool], replay, n: int, c: int, extra: list[int] | None = None) -> list[tuple[str, int, int]]:
    """``step_features`` of one chunk under ``replay`` (a ``ResolvedReplay``; no modes: every layer persists, no extra
    rows); ``extra``: per-layer extra rows to price instead of the policy's."""
    e = list(extra) if extra is not None else (
        [int(x) for x in replay.extra_tokens(c)] if replay.modes else [0] * len(sliding))
    return step_features(sliding, replay.window, tuple(replay.modes), tuple(replay.tokens), e, n, c)


def price_plan(grid: ReplayGrid, plan: dict[str, list[str]], sliding: list[bool],
               sync: bool = False) -> dict[str, tuple[SegmentCost, int]]:
    """Every policy of a bench workload (policy -> its pieces' keys in order) priced off the grid."""
    return {p: grid.price([features(k, sliding) for k in keys], sync) for p, keys in plan.items()}


def assert_held_out(grid_keys: set[tuple[str, int, int]], plan: dict[str, list[str]], sliding: list[bool]) -> None:
    """Raise unless no grid point has the exact features of a piece the workload's forwards run: the grid's
    figure is then a prediction at shapes it did not measure."""
    hit = sorted(grid_keys & {features(k, sliding) for keys in plan.values() for k in keys})
    if hit:
        raise GridError(f"replay grid measured the workload's own shapes {hit[:4]}: hold them out")


def _median_or_none(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def point_from_dict(d: dict) -> Point:
    try:
        b2b = d.get("host_b2b_s")
        return Point(str(d["kind"]), int(d["rows"]), int(d["ctx"]), float(d["host_s"]), float(d["device_s"]),
                     tuple((float(f), float(s)) for f, s in d.get("trace") or ()),
                     float(b2b) if b2b is not None else None)
    except (KeyError, TypeError, ValueError) as e:
        raise GridError(f"replay grid point {d!r}: needs kind, rows, ctx, host_s, device_s ({e})") from None


def pooled(regimes: dict[str, list[dict]]) -> list[dict]:
    """One point per (kind, rows, ctx): the median over regimes (the workloads whose rounds each grid was measured in)
    of host and device seconds, the first regime's trace."""
    acc: dict[tuple, list[dict]] = {}
    for pts in regimes.values():
        for p in pts:
            acc.setdefault((p["kind"], int(p["rows"]), int(p["ctx"])), []).append(p)
    out = []
    for k, ps in sorted(acc.items()):
        pt = {"kind": k[0], "rows": k[1], "ctx": k[2], "host_s": statistics.median(p["host_s"] for p in ps),
              "device_s": statistics.median(p["device_s"] for p in ps),
              "trace": next((p.get("trace") for p in ps if p.get("trace")), [])}
        b2b = _median_or_none([p.get("host_b2b_s") for p in ps])
        if b2b is not None:   # back to back (grids after 2026-12-03): the median over the regimes that have it
            pt["host_b2b_s"] = b2b
        out.append(pt)
    return out


def round_grids(d: dict, b2b: bool = True) -> list[tuple[int, "ReplayGrid"]]:
    """(timed round, the grid of that round's sample alone) for every sample of a workload's grid record (``points``
    with ``rounds``: [host, device] per sample, ``b2b_rounds``: per sample the back-to-back [host, device] of each
    issue; ``rounds_at``: the timed round of each sample): each forward round priced with the host and device state of
    its own round. [] for grids that kept medians only (before 2026-12-03)."""
    at = d.get("rounds_at") or []
    pts = d.get("points") or []
    if not at or not pts or not all(len(p.get("rounds") or []) == len(at) for p in pts):
        return []
    out = []
    for i, r in enumerate(at):
        got = []
        for p in pts:
            h, dev = p["rounds"][i][0], p["rounds"][i][1]
            br = p.get("b2b_rounds") or []
            hb = statistics.median(x[0] for x in br[i]) if len(br) == len(at) and br[i] else None
            got.append(Point(p["kind"], int(p["rows"]), int(p["ctx"]), float(h), float(dev),
                             tuple((float(f), float(s)) for f, s in p.get("trace") or ()), hb))
        out.append((int(r), ReplayGrid(got, d.get("window"), None, d.get("layers"), d.get("model"), d.get("row_tile"),
                                       b2b)))
    return out


def from_dict(d: dict, regime: str | None = None, b2b: bool = True) -> ReplayGrid:
    """A grid from ``replay_grid.json`` (``points``: pooled; ``regimes``: name -> points; ``regime`` picks one)."""
    if regime is not None:
        pts = (d.get("regimes") or {}).get(regime)
        if pts is None:
            raise GridError(f"replay grid: no regime {regime!r} (have {sorted(d.get('regimes') or {})})")
    else:
        pts = d.get("points")
    if not pts:
        raise GridError("replay grid: no points")
    return ReplayGrid([point_from_dict(p) for p in pts], d.get("window"), d.get("provenance"), d.get("layers"),
                      d.get("model"), d.get("row_tile"), b2b)


def for_profile(profile) -> ReplayGrid | None:
    """The grid a calibration profile carries (``replay_grid``: a ``replay_grid.json`` path or its dict), or None
    (then the replay cost stays analytic)."""
    got = getattr(profile, "replay_grid", None) if profile is not None else None
    if not got:
        return None
    return from_dict(got) if isinstance(got, dict) else load(got)


def read(path: str | Path) -> dict:
    """The JSON of a ``replay_grid.json`` (GridError when the file cannot be read or is not a JSON object)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise GridError(f"replay grid {path}: cannot read ({e})") from None
    if not isinstance(d, dict):
        raise GridError(f"replay grid {path}: a JSON object with points expected")
    return d


def load(path: str | Path, regime: str | None = None) -> ReplayGrid:
    return from_dict(read(path), regime)


def attach(profile, path: str | Path, spec):
    """``profile`` (a ``CalibrationProfile``) with the grid at ``path`` stored in it (``replay_grid``), after checking the
    file is a grid and was measured on ``spec``'s layers (GridError otherwise). The grid is stored whole, so the
    profile stays one self-contained file."""
    d = read(path)
    try:
        grid = from_dict(d)
    except GridError as e:
        raise GridError(f"{path}: {e}") from None
    if not grid.matches(spec):
        raise GridError(f"replay grid {path} was measured on {grid.model.get('name') or grid.layers} "
                        f"({grid.layers}, window {grid.window}), not on {spec.name!r} ({list(spec.kinds())}, "
                        f"window {spec.sliding_window})")
    return profile.model_copy(update={"replay_grid": d})
