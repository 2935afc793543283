"""Measured op tables: device time of one kernel library at a shape, looked up, never clamped silently.

The tables (``costmodels/data/op_tables/<gpu>/*.csv``, written by ``benchmarks/gpu/op_tables.py`` on the
GPU, provenance beside them) hold device microseconds per call measured inside CUDA graphs. A lookup
answers a time and says where it came from:

- ``measured``: the shape is on the grid, or between two grid points of the same shape family;
  times are interpolated piecewise-linearly in log(size)-log(time) space (a kernel's time is a power
  law locally: flat where it is launch/latency-bound, linear in M where it is compute-bound);
- ``extrapolated``: beyond the grid's largest size the time follows the roofline at the efficiency of
  the last measured point (the achieved TFLOP/s or TB/s stays, the work grows); below the smallest
  size the smallest point's time is kept (a kernel cannot get faster than its fixed cost);
- ``scaled``: a shape family that was not measured takes the nearest measured family's time at the
  same size, scaled by the ratio of the two shapes' rooflines on this GPU.

Every answer carries its ``source`` so output can name it. Arrays in, arrays out (numpy).
"""

from __future__ import annotations

import csv
import heapq
import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from costmodels.hardware import get_hardware

DATA = Path(__file__).parent / "data" / "op_tables"
MEASURED, EXTRAPOLATED, SCALED = "measured", "extrapolated", "scaled"
# the FP8 GEMM library a table prices by default: DeepGEMM, what a tuned serving engine runs on Hopper; a measured
# engine that ran another one names it (CalibrationProfile.op_table_libs)
DEFAULT_GEMM_LIBS = ("deepgemm", "triton")
GEMM_LIBS = {"fp8": DEFAULT_GEMM_LIBS, "bf16": ("cublas",)}   # per dtype, the libraries serving runs, preferred first
# An unmeasured GEMM shape takes the nearest measured shape's time times (roofline + L) / (roofline_near + L):
# a kernel has a fixed latency that does not shrink with its work. L was chosen leaving one of the 8 base
# DeepSeek-V3 shapes out at a time (8 us: mean |log error| 0.086 vs 0.205 without it) and then checked on the
# 273 TP-shard rows it never saw (M <= 128: median 1.07x, p10 0.88x, p90 1.35x; pure roofline scaling gave
# median 0.88x, p10 0.28x): benchmarks/op_table_check.py --held-out.
SCALE_LATENCY_S = 8e-6


@dataclass(frozen=True)
class Lookup:
    """Seconds per call for each queried size, and how each was obtained."""

    seconds: np.ndarray
    source: np.ndarray          # MEASURED / EXTRAPOLATED / SCALED per element
    detail: str                 # which table and family answered (printed in notes)

    @property
    def worst_source(self) -> str:
        """The least direct source among the answers (scaled > extrapolated > measured)."""
        for s in (SCALED, EXTRAPOLATED, MEASURED):
            if (self.source == s).any():
                return s
        return MEASURED


def loglog_interp(x: np.ndarray, xs: np.ndarray, ys: np.ndarray, work: np.ndarray, work_at: np.ndarray):
    """Times at sizes ``x`` from a grid ``xs -> ys`` (both ascending, positive).

    Inside the grid: piecewise linear in log-log. Above it: the last point's time scaled by the work
    ratio (``work`` at x over ``work_at`` at the last grid point: the roofline at fixed efficiency).
    Below it: the first point's time. Returns (times, extrapolated mask).
    """
    x = np.asarray(x, dtype=float)
    lx, lxs, lys = np.log(np.maximum(x, 1e-12)), np.log(xs), np.log(ys)
    t = np.exp(np.interp(lx, lxs, lys))
    above = x > xs[-1]
    if above.any():
        t = np.where(above, ys[-1] * work / work_at, t)
    return t, above | (x < xs[0])


def act_bytes(dtype: str) -> float:
    """Bytes per activation element a GEMM of ``dtype`` reads: BF16 for a BF16 GEMM, FP8 otherwise (also a table's
    weight bytes: FP8 and BF16 tables hold no block-scaled weights)."""
    return 2.0 if dtype == "bf16" else 1.0


def gemm_bytes(m, n: int, k: int, weight_bytes_per_elem: float = 1.0, act_bytes_per_elem: float = 1.0):
    """Bytes an ``M x N x K`` GEMM moves: its ``N x K`` weight, ``M x K`` activations in (FP8, or BF16 for a BF16
    GEMM) and ``M x N`` BF16 out."""
    return n * k * weight_bytes_per_elem + m * (k * act_bytes_per_elem + 2 * n)


@dataclass
class Series:
    """A time over one size (tokens per expert, rows), with the work that grows with it beyond the grid."""

    xs: np.ndarray
    ts: np.ndarray
    work: callable
    detail: str

    def time(self, x) -> Lookup:
        x = np.atleast_1d(np.asarray(x, dtype=float))
        t, extra = loglog_interp(x, self.xs, self.ts, self.work(x), self.work(self.xs[-1]))
        return Lookup(t, np.where(extra, EXTRAPOLATED, MEASURED).astype(object), self.detail)


@dataclass
class GemmTable:
    """Dense GEMM ``[M,K] x [K,N]`` device time per library and dtype, by (N, K) family over M."""

    lib: str
    dtype: str
    families: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # (n,k) -> (m, s)
    peak_flops: float = 0.0       # the measured GPU's dense peak for this dtype, flop/s (roofline of scaling)
    hbm_bw: float = 0.0           # its peak HBM bandwidth, bytes/s
    weight_bytes_per_elem: float = 1.0
    measured_on: str = ""         # the GPU the table was measured on
    source: str = ""              # where it was measured ("": the committed op tables)

    @property
    def act_bytes_per_elem(self) -> float:
        """Bytes per activation element in: BF16 for a BF16 GEMM, FP8 otherwise."""
        return act_bytes(self.dtype)

    @cached_property
    def floor_s(self) -> float:
        """The shortest time measured for any kernel: the launch-to-finish floor of one GEMM on that GPU (H200
        DeepGEMM: 4.7 us, 7168 x 256 at one row)."""
        return min(float(np.min(s)) for _, s in self.families.values())

    def _roofline(self, m, n, k):
        m = np.asarray(m, dtype=float)
        byts = gemm_bytes(m, n, k, self.weight_bytes_per_elem, self.act_bytes_per_elem)
        return np.maximum(2.0 * m * n * k / self.peak_flops, byts / self.hbm_bw)

    def nearest(self, n: int, k: int) -> tuple[int, int]:
        """The measured (N, K) family closest in log weight size and log K (K sets the inner loop)."""
        def dist(f):
            return abs(np.log(f[0] * f[1] / (n * k))) + abs(np.log(f[1] / k))
        return min(sorted(self.families), key=dist)

    def _family(self, n: int, k: int) -> tuple:
        """(family, its M grid, times, log M grid, log times, roofline at its last M) answering (n, k); memoised
        (a simulated step asks for the same few shapes thousands of times)."""
        memo = self.__dict__.setdefault("_family_memo", {})
        got = memo.get((n, k))
        if got is None:
            fam = (n, k) if (n, k) in self.families else self.nearest(n, k)
            ms, ts = self.families[fam]
            got = memo[(n, k)] = (fam, ms, ts, np.log(ms), np.log(ts), self._roofline(ms[-1], *fam))
        return got

    def seconds(self, m: np.ndarray, n: int, k: int) -> np.ndarray:
        """``time(m, n, k).seconds`` for a 1-d float array ``m`` (the same arithmetic, without sources and detail)."""
        fam, ms, ts, lxs, lys, work_at = self._family(n, k)
        t = np.exp(np.interp(np.log(np.maximum(m, 1e-12)), lxs, lys))   # loglog_interp's
        above = m > ms[-1]
        beyond, scaled = bool(above.any()), fam != (n, k)
        if not (beyond or scaled):   # on the measured family's grid: the roofline is not needed
            return t
        work = self._roofline(m, *fam)
        if beyond:
            t = np.where(above, ts[-1] * work / work_at, t)
        if scaled:
            lat = SCALE_LATENCY_S
            t = t * (self._roofline(m, n, k) + lat) / (work + lat)
        return t

    def time(self, m, n: int, k: int) -> Lookup:
        """Seconds of one ``M x N x K`` GEMM for each M in ``m``."""
        m = np.atleast_1d(np.asarray(m, dtype=float))
        fam = (n, k) if (n, k) in self.families else self.nearest(n, k)
        ms, ts = self.families[fam]
        work = self._roofline(m, *fam)
        t, extra = loglog_interp(m, ms, ts, work, self._roofline(ms[-1], *fam))
        src = np.where(extra, EXTRAPOLATED, MEASURED).astype(object)
        detail = f"{self.lib} {self.dtype} GEMM table, N x K {fam[0]}x{fam[1]}"
        if fam != (n, k):
            lat = SCALE_LATENCY_S
            t = t * (self._roofline(m, n, k) + lat) / (work + lat)
            src[:] = SCALED
            detail += f" scaled by roofline + {lat * 1e6:g} us latency to {n}x{k}"
        return Lookup(t, src, detail)


@dataclass
class GridTable:
    """A time over two sizes (e.g. MLA decode by batch x context), interpolated log-log in both."""

    lib: str
    name: str
    xs: np.ndarray               # first axis grid (ascending)
    ys: np.ndarray               # second axis grid (ascending)
    seconds: np.ndarray          # [len(xs), len(ys)]
    work: callable = None        # work(x, y) -> roofline-proportional work, for extrapolation

    def time(self, x, y) -> Lookup:
        x, y = np.broadcast_arrays(np.atleast_1d(np.asarray(x, float)), np.atleast_1d(np.asarray(y, float)))
        # along y for each measured x, then along x
        col = np.empty((len(self.xs), x.size))
        extra_y = np.zeros(x.size, bool)
        for i, xi in enumerate(self.xs):
            w = self.work(np.full(x.size, xi), y.ravel())
            wl = self.work(np.full(x.size, xi), np.full(x.size, self.ys[-1]))
            col[i], e = loglog_interp(y.ravel(), self.ys, self.seconds[i], w, wl)
            extra_y |= e
        t = np.empty(x.size)
        extra_x = np.zeros(x.size, bool)
        for j in range(x.size):
            w = self.work(x.ravel()[j], y.ravel()[j])
            wl = self.work(self.xs[-1], y.ravel()[j])
            tj, e = loglog_interp(np.array([x.ravel()[j]]), self.xs, col[:, j], np.array([w]), np.array([wl]))
            t[j], extra_x[j] = tj[0], e[0]
        src = np.where(extra_x | extra_y, EXTRAPOLATED, MEASURED).astype(object)
        return Lookup(t.reshape(x.shape), src.reshape(x.shape), f"{self.lib} {self.name} table")


@dataclass
class OpTables:
    """Every measured table of one GPU, with the provenance of the run that measured them."""

    gpu: str
    provenance: dict
    gemm: dict[tuple[str, str], GemmTable]            # (lib, dtype) -> table
    masked_grouped: dict[tuple[int, int, int], Series]  # (N, K, experts) -> time over tokens per expert
    mla_decode: dict[int, GridTable]                  # query heads per GPU (128 / TP) -> table over batch x context
    # (N, K, experts) -> time over mean pairs per expert of uniform random routing (prefill MoE's contiguous layout)
    contig_grouped: dict[tuple[int, int, int], Series] = field(default_factory=dict)
    # (op, streams n, hidden H, Sinkhorn iterations: the pre kernel's, else 0) -> time over tokens of one mHC kernel
    # around a block (DeepSeek-V4-class hyper-connections)
    mhc: dict[tuple[str, int, int, int], Series] = field(default_factory=dict)
    # (query heads, KV heads, head dim) per GPU -> FlashAttention-3 GQA decode over batch x context (one new token a
    # sequence) and prefill of one sequence's chunk over new tokens x cached ones (``gqa_attention_bf16.csv``)
    gqa_decode: dict[tuple[int, int, int], GridTable] = field(default_factory=dict)
    gqa_prefill: dict[tuple[int, int, int], "GqaChunks"] = field(default_factory=dict)
    # (query heads, KV heads, head dim) -> a chunk's marginal cost in a busy varlen call over new x cached tokens: K
    # and 2K like chunks in one call, (t(2K) - t(K)) / K (``gqa_multi_bf16.csv``); one-token chunks from the decode
    # grid's two largest batches
    gqa_busy: dict[tuple[int, int, int], "GqaChunks"] = field(default_factory=dict)

    def gemm_table(self, dtype: str, prefer: tuple[str, ...] | None = None) -> GemmTable | None:
        """The table of the first preferred library measured for ``dtype`` (the kernel serving would run; by default
        ``GEMM_LIBS[dtype]``)."""
        for lib in prefer if prefer is not None else GEMM_LIBS.get(dtype, ()):
            if (lib, dtype) in self.gemm:
                return self.gemm[(lib, dtype)]
        return None


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r.get("device_us") not in (None, "")]


def _gemm_tables(path: Path, peak: float, hbm_bw: float, gpu: str, dtype: str = "fp8") -> dict[tuple[str, str], GemmTable]:
    """The ``dense_gemm_<dtype>.csv`` tables of one GPU by library: ``peak`` its dense peak for ``dtype`` (flop/s),
    weights at one byte per element in FP8, two in BF16."""
    out: dict[tuple[str, str], GemmTable] = {}
    fams: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for r in _rows(path):
        fams.setdefault((r["lib"], int(r["n"]), int(r["k"])), []).append((float(r["m"]), float(r["device_us"]) * 1e-6))
    wb = act_bytes(dtype)
    for (lib, n, k), pts in sorted(fams.items()):
        tab = out.setdefault((lib, dtype), GemmTable(lib, dtype, peak_flops=peak, hbm_bw=hbm_bw, weight_bytes_per_elem=wb,
                                                     measured_on=gpu))
        by_m: dict[float, list[float]] = {}
        for m, t in pts:     # one shape measured under two names (V3's shared_down is o_proj's TP8 shard): the mean
            by_m.setdefault(m, []).append(t)
        ms = sorted(by_m)
        tab.families[(n, k)] = (np.array(ms), np.array([float(np.mean(by_m[m])) for m in ms]))
    return out


def table_from_points(points: list[dict], gpu: str) -> GemmTable | None:
    """A calibration's own FP8 GEMM table from its ``gemm`` points (``executor.calibrate.bench_gemm_shapes``: each of
    the model's GEMM shapes at every token bucket, device seconds, one library): None without any, or when they ran on
    more than one library."""
    pts = [p for p in points if p.get("op") == "gemm" and (p.get("device_s") or 0) > 0]
    libs = {p.get("backend") for p in pts}
    if not pts or len(libs) != 1:
        return None
    hw = get_hardware(gpu)
    tab = GemmTable(str(libs.pop()), "fp8", peak_flops=hw.tflops("fp8") * 1e12, hbm_bw=hw.hbm_bw, measured_on=hw.name,
                    source="the calibration's own GEMM shapes at its token buckets")
    fams: dict[tuple[int, int], dict[float, float]] = {}
    for p in pts:
        fams.setdefault((int(p["n"]), int(p["k"])), {})[float(p["m"])] = float(p["device_s"])
    for fam, by_m in sorted(fams.items()):
        if len(by_m) >= 2:
            ms = sorted(by_m)
            tab.families[fam] = (np.array(ms), np.array([by_m[m] for m in ms]))
    return tab if tab.families else None


def _mla_tables(path: Path, kv_entry_bytes: float = 576 * 2) -> dict[int, GridTable]:
    """Query heads -> FlashMLA decode time over batch x context (bf16 latent cache, 512 + 64 per token)."""
    by_heads: dict[int, dict[tuple[int, int], float]] = {}
    for r in _rows(path):
        heads = int(r["name"].removeprefix("mla_h"))
        by_heads.setdefault(heads, {})[(int(r["batch"]), int(r["context"]))] = float(r["device_us"]) * 1e-6
    out = {}
    for heads, pts in sorted(by_heads.items()):
        xs = np.array(sorted({p[0] for p in pts}), float)
        ys = np.array(sorted({p[1] for p in pts}), float)
        sec = np.array([[pts[(int(x), int(y))] for y in ys] for x in xs])
        out[heads] = GridTable("flashmla", f"MLA decode ({heads} heads, bf16 latent 512+64)", xs, ys, sec,
                               work=lambda b, c: np.asarray(b, float) * np.asarray(c, float) * kv_entry_bytes)
    return out


def gqa_work(hq: int, hkv: int, d_qk: int, d_v: int, new, cached) -> tuple:
    """(flops, bytes) of one GQA attention kernel over one sequence: ``new`` queries (the last of ``cached + new``
    keys, causal) at ``hq`` query heads over ``hkv`` KV heads, BF16 K/V read once, Q read and O written."""
    n, c = np.asarray(new, float), np.asarray(cached, float)
    pairs = n * c + n * (n + 1) / 2
    return 2.0 * hq * (d_qk + d_v) * pairs, (c + n) * hkv * (d_qk + d_v) * 2.0 + n * hq * (d_qk + d_v) * 2.0



def gqa_layout(name: str) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a ``gqa`` stage row's name, ``gqa_q<q>_kv<kv>_d<d>``."""
    q, kv, d = (int(v) for v in name.removeprefix("gqa_q").replace("_kv", " ").replace("_d", " ").split())
    return q, kv, d


def gqa_seqs(text: str) -> list[tuple[int, int, int]]:
    """(new, cached, count) terms of a varlen row's ``seqs`` (``new+cached x count`` joined by ``;``)."""
    out = []
    for term in text.split(";"):
        nc, cnt = term.split("x")
        n, c = (int(v) for v in nc.split("+"))
        out.append((n, c, int(cnt)))
    return out


def fa3_tile(d_qk: int, d_v: int, packed_rows: float | None = None) -> tuple[int, int]:
    """(query rows, keys) of one work tile of FlashAttention-3's Hopper forward kernel, causal, BF16
    (``tile_size_fwd_sm90`` of flash-attention's ``hopper/tile_size.h``): GQA packs a KV head's query heads into the
    rows; one MMA warpgroup (64 rows) where the longest sequence's packed rows (``packed_rows``) are 64 or fewer at head
    dim 64 or 128 (``use_one_mma_wg``), else two."""
    if packed_rows is not None and packed_rows <= 64 and d_qk in (64, 128):
        return (64, 192) if d_qk == 64 else (64, 128)
    if d_qk <= 64:
        return (64, 64) if d_v == 512 else (128, 96) if d_v == 256 else (192, 128)
    if d_qk <= 96:
        return 192, 144
    if d_qk <= 128:
        return 128, 128
    if d_qk <= 192:
        return 128, 128 if d_v <= 128 else 96
    return 128, 80


def fa3_splits_off(kv_heads: int, group: int, max_new: float, sms: int, block_m: int) -> bool:
    """Whether FlashAttention-3 runs a varlen call without splitting the keys (``num_splits_heuristic`` of its
    ``hopper/heuristics.h``, as ``get_num_splits`` calls it for a varlen batch: the longest sequence's query tiles over
    every KV head, ``max_seqlen_q`` x group / tile rows x KV heads, fill 80% of the SMs; a causal call then never
    splits). Then each query tile walks all of its sequence's keys on one SM."""
    return kv_heads * math.ceil(max_new * group / block_m) >= 0.8 * sms


@lru_cache(maxsize=4096)
def _fa3_wave_splits(mblocks: int, nblocks: int, sms: int) -> int:
    """The fewest splits whose waves of ``mblocks`` x splits tiles on ``sms`` SMs reach 85% of the best wave
    efficiency, at most 128, the SMs and the ``nblocks`` key tiles (``num_splits_heuristic``'s search)."""
    effs = [w / math.ceil(w) for w in (mblocks * s / sms for s in range(1, min(128, sms, nblocks) + 1))]
    best = max(effs)
    return next(s for s, e in enumerate(effs, 1) if e >= 0.85 * best)


def fa3_max_splits(kv_heads: int, group: int, max_new: float, max_keys: float, sms: int, block_m: int,
                   block_n: int) -> int:
    """The upper bound FlashAttention-3 sets on a varlen call's key splits (``get_num_splits``, batch taken as one):
    1 where the longest sequence's query tiles fill 80% of the SMs (``fa3_splits_off``) or its keys are 4 tiles or
    fewer; else the fewest splits whose waves reach 85% of the best wave efficiency."""
    nblocks = math.ceil(max_keys / block_n)
    if fa3_splits_off(kv_heads, group, max_new, sms, block_m) or nblocks <= 4:
        return 1
    return _fa3_wave_splits(kv_heads * math.ceil(max_new * group / block_m), nblocks, sms)


def fa3_key_walks(news, keys, kv_heads: int, group: int, sms: int, block_m: int, block_n: int) -> tuple[np.ndarray, np.ndarray]:
    """(the key tiles each sequence's longest query tile walks on one SM, the splits of its keys), per sequence in batch
    order, in a FlashAttention-3 varlen call over sequences of ``news`` new tokens and ``keys`` keys: its key tiles over
    the splits the call gives it (``prepare_varlen_num_blocks`` of ``hopper/flash_prepare_scheduler.cu``: the bound of
    ``fa3_max_splits``, per sequence at most its key tiles over the call's tiles a SM, 10% spare; unsplit above 992
    sequences)."""
    news, keys = np.asarray(news, float), np.asarray(keys, float)
    nb = np.ceil(keys / block_n)
    top = fa3_max_splits(kv_heads, group, float(news.max()), float(keys.max()), sms, block_m, block_n)
    if top == 1 or news.size > 992:
        return nb, np.ones(nb.size)
    total = float((np.ceil(news * group / block_m) * nb).sum())
    per_sm = math.ceil(total * 1.1 * kv_heads / sms)
    splits = np.clip(np.ceil(nb / per_sm), 1, top)
    return np.ceil(nb / splits), splits


def fa3_key_walk(news, keys, kv_heads: int, group: int, sms: int, block_m: int, block_n: int) -> int:
    """The most key tiles one query tile of a FlashAttention-3 varlen call walks on one SM (``fa3_key_walks``' largest)."""
    return int(fa3_key_walks(news, keys, kv_heads, group, sms, block_m, block_n)[0].max())


def _gqa_tables(path: Path) -> tuple[dict[tuple[int, int, int], GridTable], dict[tuple[int, int, int], "GqaChunks"]]:
    """The ``gqa`` stage's rows (``benchmarks/gpu/op_tables.py``): decode (one new token a sequence, the batch grid)
    as a batch x context GridTable per head layout; prefill (one sequence) as ``GqaChunks`` per layout."""
    dec: dict[tuple[int, int, int], dict[tuple[int, int], float]] = {}
    pre: dict[tuple[int, int, int], dict[tuple[int, int], float]] = {}
    for r in _rows(path):
        q, kv, d = gqa_layout(r["name"])
        b, n, ctx, t = int(r["batch"]), int(r["tokens"]), int(r["context"]), float(r["device_us"]) * 1e-6
        if n == 1:
            dec.setdefault((q, kv, d), {})[(b, ctx)] = t
        if b == 1:
            pre.setdefault((q, kv, d), {})[(n, ctx - n)] = t
    out_d = {}
    for key, pts in sorted(dec.items()):
        q, kv, d = key
        # the decode grid: the contexts measured at batches above one (the prefill grid's one-token rows, batch 1 over
        # its cached counts, are chunks, not grid points)
        ys = np.array(sorted({c for b, c in pts if b > 1}), float)
        xs = np.array(sorted({b for b, c in pts if c in set(ys.astype(int).tolist())}), float)
        sec = np.full((xs.size, ys.size), np.nan)
        for i, x in enumerate(xs):
            for j, y in enumerate(ys):
                if (int(x), int(y)) in pts:
                    sec[i, j] = pts[(int(x), int(y))]
                elif i and not np.isnan(sec[i - 1, j]):
                    # a cell the run skipped (its KV past the stage's 20 GB): the next smaller batch's time along the
                    # roofline (the kernel streams the batch's KV: memory-bound there)
                    sec[i, j] = sec[i - 1, j] * x / xs[i - 1]
        if np.isnan(sec).any():
            continue
        out_d[key] = GridTable("fa3", f"GQA decode ({q} query / {kv} KV heads of {d}, bf16)", xs, ys, sec,
                               work=lambda b, c, kv=kv, d=d: np.asarray(b, float) * np.asarray(c, float) * kv * d * 4.0)
    out_p = {}
    for key, pts in sorted(pre.items()):
        lines = {}
        for n in sorted({n for n, _ in pts}):
            cs = sorted(c for m, c in pts if m == n)
            if len(cs) >= 2:
                lines[n] = (cs, [pts[(n, c)] for c in cs])
        if len(lines) >= 2:
            out_p[key] = GqaChunks(*key, lines=lines)
    return out_d, out_p


def _gqa_busy(path: Path, dec: dict[tuple[int, int, int], GridTable]) -> dict[tuple[int, int, int], "GqaChunks"]:
    """The ``gqa_multi`` stage's rows as a chunk's marginal cost in a busy call: per layout and (new, cached), the
    calls of K and 2K like chunks, (t(2K) - t(K)) / K; the one-token line from the decode grid (``dec``): the batch
    256 call minus the batch 128 call, over 128, at each context."""
    pts: dict[tuple[int, int, int], dict[tuple[int, int], dict[int, float]]] = {}
    for r in _rows(path):
        (n, c, k), = gqa_seqs(r["seqs"])
        pts.setdefault(gqa_layout(r["name"]), {}).setdefault((n, c), {})[k] = float(r["device_us"]) * 1e-6
    out = {}
    for key, cells in sorted(pts.items()):
        marg = {}
        for (n, c), byk in cells.items():
            ks = sorted(byk)
            if len(ks) >= 2 and byk[ks[-1]] > byk[ks[0]]:
                marg[(n, c)] = (byk[ks[-1]] - byk[ks[0]]) / (ks[-1] - ks[0])
        lines = {}
        g = dec.get(key)
        if g is not None and g.xs.size >= 2:
            b0, b1 = g.xs[-2], g.xs[-1]
            ys = [int(y) for y in g.ys]
            lines[1] = ([y - 1 for y in ys], [max((g.seconds[-1, j] - g.seconds[-2, j]) / (b1 - b0), 1e-9)
                                             for j in range(len(ys))])
        for n in sorted({n for n, _ in marg}):
            cs = sorted(c for m, c in marg if m == n)
            if len(cs) >= 2:
                lines[n] = (cs, [marg[(n, c)] for c in cs])
        if len(lines) >= 2:
            out[key] = GqaChunks(*key, lines=lines, proportional=True)
    return out


@dataclass
class GqaChunks:
    """FlashAttention-3 prefill of one sequence's chunk (``n`` new tokens over ``c`` cached, causal) at one head layout
    (``hq`` query over ``hkv`` KV heads of ``d``), measured at a few new-token counts, each over its own cached counts
    (``lines``: n -> (cached counts ascending, seconds); one-token chunks take the decode rows at batch one too).

    ``at`` answers a chunk of another layout or head dims at any (n, c): the measured time at (n, c) (log time linear
    in log keys along each measured new-token count, then linear in log new tokens), moved to the asked layout by the
    transfer rule's shape form: the roofline (``gqa_work`` at the calibration's efficiencies on the measured GPU) moves
    to the asked chunk's, the time over it (the kernel's latency, tile tails) stays; a time under its roofline keeps
    its fraction of it. Beyond a line's largest cache or the largest new-token count the edge's time scales with the
    roofline (``loglog_interp``'s rule, as the decode table's: ``beyond`` says where)."""

    hq: int
    hkv: int
    d: int
    lines: dict[int, tuple[list[int], list[float]]]
    # the times are work that grows with the heads and head dims (a chunk's marginal cost in a busy call: its tiles),
    # moved to another layout in proportion to the roofline, not as a roofline part plus a latency that stays
    proportional: bool = False

    def __post_init__(self):
        self.news = sorted(self.lines)
        self._ln = [math.log(v) for v in self.news]
        n = self.news[-1]
        cs, ts = self.lines[n]
        f, _ = gqa_work(self.hq, self.hkv, self.d, self.d, float(n), float(cs[0]))
        self._tile_rate = float(f) / ts[0]
        self._walk_rates: dict[int, float] = {}

    def _roof(self, n: float, c: float, peak: float, bw: float, me: float, ce: float) -> float:
        f, b = gqa_work(self.hq, self.hkv, self.d, self.d, n, c)
        return max(float(b) / (me * bw), float(f) / (ce * peak))

    def _line(self, nv: int, c: float, roof) -> float:
        cs, ts = self.lines[nv]
        if c >= cs[-1]:
            return ts[-1] * max(1.0, roof(nv, c) / roof(nv, cs[-1]))
        if c <= cs[0]:
            return ts[0]
        keys = [math.log(nv + v) for v in cs]
        k = math.log(nv + c)
        j = max(0, min(bisect_right(keys, k) - 1, len(keys) - 2))
        w = (k - keys[j]) / (keys[j + 1] - keys[j])
        return math.exp(math.log(ts[j]) + (math.log(ts[j + 1]) - math.log(ts[j])) * w)

    def floor_s(self) -> float:
        """The measured kernel's least time: one query over one key (its launch, prologue and epilogue)."""
        return self.lines[self.news[0]][1][0]

    def tile_rate(self) -> float:
        """FLOP/s the measured GPU reached over the longest measured chunk without a cache (its SMs all busy on full
        tiles): the rate a tile of keys runs at on the measured GPU, over its SM count."""
        return self._tile_rate

    def walk_rate(self, sms: int) -> float:
        """FLOP/s one SM of the measured GPU (``sms`` of them) runs a full key tile at: the longest measured chunk
        without a cache (its time less the kernel's least time) over the key tiles its busiest SM walked, FA3's tiles
        (``fa3_tile``: packed query rows x keys, each over the keys its causal rows reach) handed longest first to
        whichever SM frees (a list schedule: the tail of the chunk's waves is not the tiles' rate). Llama-3.1-70B TP8
        heads on the H100: 8,192 new tokens, 512 tiles of 1-64 key tiles, the busiest SM 127 key tiles: 1.49 us a
        128 x 128 tile where the chunk's causal FLOPs over its time say 1.58."""
        got = self._walk_rates.get(sms)
        if got is not None:
            return got
        n = self.news[-1]
        cs, ts = self.lines[n]
        g = max(1, round(self.hq / self.hkv))
        bm, bn = fa3_tile(self.d, self.d, n * g)
        c = float(cs[0])
        b = np.arange(math.ceil(n * g / bm))[::-1]
        walks = np.ceil((c + np.minimum(n, (b + 1) * bm / g)) / bn)
        free = [0.0] * max(1, int(sms))
        for k in np.tile(walks, self.hkv).tolist():
            heapq.heappush(free, heapq.heappop(free) + k)
        busiest = max(free)
        t = max(ts[0] - self.floor_s(), 1e-12)
        got = self._walk_rates[sms] = 2.0 * bm * bn * 2 * self.d * busiest / t
        return got

    def beyond(self, n: float, c: float) -> bool:
        """Whether (n, c) lies past the measured grid (the roofline's growth prices the excess)."""
        if n > self.news[-1]:
            return True
        hi = next((v for v in self.news if v >= n), self.news[-1])
        lo = max((v for v in self.news if v <= n), default=self.news[0])
        return c > min(self.lines[lo][0][-1], self.lines[hi][0][-1])

    def measured_at(self, n: float, c: float, peak: float, bw: float, me: float, ce: float) -> float:
        """Seconds of the measured layout's chunk of ``n`` new over ``c`` cached on the measured GPU (``peak``: its
        BF16 dense peak, ``bw``: its HBM bandwidth, ``me``/``ce``: the calibration's efficiencies)."""
        def roof(nv, cv):
            return self._roof(nv, cv, peak, bw, me, ce)
        if n >= self.news[-1]:
            last = self.news[-1]
            return self._line(last, c, roof) * max(1.0, roof(n, c) / roof(last, c))
        if n <= self.news[0]:
            return self._line(self.news[0], c, roof)
        x = math.log(n)
        i = bisect_right(self._ln, x) - 1
        w = (x - self._ln[i]) / (self._ln[i + 1] - self._ln[i])
        a, b = self._line(self.news[i], c, roof), self._line(self.news[i + 1], c, roof)
        return math.exp(math.log(a) + (math.log(b) - math.log(a)) * w)

    def at(self, n: float, c: float, hq: float, hkv: float, d_qk: float, d_v: float, peak: float, bw: float,
           mem_eff: float, compute_eff: float, peak_asked: float | None = None) -> float:
        """Seconds of a chunk of ``n`` new over ``c`` cached tokens at ``hq`` / ``hkv`` heads of ``d_qk`` / ``d_v`` on
        the measured GPU (``peak``: its attention math ceiling at the table's head dims, ``peak_asked`` at the asked
        ones where they differ, e.g. exponential-bound at a small head dim)."""
        t = self.measured_at(n, c, peak, bw, mem_eff, compute_eff)
        roof_m = self._roof(n, c, peak, bw, mem_eff, compute_eff)
        f, b = gqa_work(hq, hkv, d_qk, d_v, n, c)
        roof = max(float(b) / (mem_eff * bw), float(f) / (compute_eff * (peak_asked or peak)))
        if self.proportional or t < roof_m:
            return t * roof / max(roof_m, 1e-30)
        return roof + (t - roof_m)


def nearest_gqa_layout(have, hq: float, hkv: float, d: float) -> tuple[int, int, int] | None:
    """The measured head layout nearest ``hq`` query over ``hkv`` KV heads of ``d``: the bytes a cached token (KV heads
    x head dim: the kernel's independent units of work and its KV stream), then the query heads a KV head serves (its
    packing), then the head dim, all in log. (Held out on the H100, run gqa_heldout_65b14e3: taking the packing
    first priced 4 / 1 heads from the 32 / 8 table, its prefill chunks 66% short where the kernel's few tiles leave
    SMs idle.)"""
    if not have:
        return None
    g = max(hq, 1e-9) / max(hkv, 1e-9)
    return min(have, key=lambda k: (abs(math.log(k[1] * k[2] / max(hkv * d, 1e-9))), abs(math.log(k[0] / k[1] / g)),
                                    abs(math.log(k[2] / max(d, 1e-9))), k))


def _grouped_tables(path: Path, kind: str) -> dict[tuple[int, int, int], Series]:
    """(N, K, experts) -> device time of one grouped GEMM over rows per expert. ``masked``: every expert holds ``m`` rows;
    ``contiguous``: ``m`` pairs of uniform random routing over the experts (``m / groups`` per expert on average, each
    expert's run padded to the kernel's 128-row tile)."""
    fams: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for r in _rows(path):
        g = int(r["groups"])
        x = float(r["m"]) / (g if kind == "contiguous" else 1)
        fams.setdefault((int(r["n"]), int(r["k"]), g), []).append((x, float(r["device_us"]) * 1e-6))
    out = {}
    for (n, k, g), pts in sorted(fams.items()):
        pts.sort()
        out[(n, k, g)] = Series(np.array([p[0] for p in pts]), np.array([p[1] for p in pts]),
                                lambda m, g=g, n=n, k=k: g * gemm_bytes(np.asarray(m, float), n, k),
                                f"deepgemm {kind} grouped FP8 GEMM {g} experts x {n}x{k}")
    return out


MHC_OPS = ("mhc_prenorm_gemm", "mhc_pre", "mhc_post")   # before a block (projection, then Sinkhorn + weighted sum), after it
MHC_SPLITS = 16       # the projection's split-K partials the pre kernel sums (vLLM's mhc_pre default; the table's)
# the first Triton pre kernel (one program per token) as measured on the H100 (run mhc_61809e1): 31% of the HBM peak at
# 16,384 tokens, so not the kernel an engine's fused pre reaches; its rows keep only the Sinkhorn chain's measured cost
# per iteration (``MhcKernels.chain_s``)
MHC_CHAIN_OP = "mhc_pre_v1"
# the rewritten pre kernel (each token over 512-column programs, each running the token's chain; run
# mhc_pre_v2_0107b33): a second measurement of the chain, read by benchmarks.mhc_check and its test, priced nowhere
MHC_PRE_V2_OP = "mhc_pre_v2"


def mhc_bytes(op: str, tokens, n: int, h: int, splits: int = MHC_SPLITS):
    """Bytes one mHC kernel around a block moves at ``tokens`` tokens (``n`` streams of width ``h``, BF16): the
    projection reads the streams and its FP32 weight and writes its partials; the pre kernel reads the streams and the
    partials and writes the block's input; the post kernel reads the streams and the block's output and writes the
    streams."""
    t, nm, k = np.asarray(tokens, float), (2 + n) * n, n * h
    if op == "mhc_prenorm_gemm":
        return t * k * 2.0 + nm * k * 4.0 + splits * t * (nm + 1) * 4.0
    if op == "mhc_pre":
        return t * (k * 2.0 + h * 2.0) + splits * t * (nm + 1) * 4.0
    return t * (2 * k * 2.0 + h * 2.0)


def mhc_fallback_s(op: str, tokens, n: int, h: int, stream: float, launch: float, tf32_flops: float):
    """One mHC kernel without a table: its bytes at the streaming rate ``stream`` (the projection's TF32 math at
    ``tf32_flops`` where longer) plus one launch."""
    return np.maximum(mhc_flops(op, tokens, n, h) / tf32_flops, mhc_bytes(op, tokens, n, h) / stream) + launch


def mhc_flops(op: str, tokens, n: int, h: int):
    """The projection's math (TF32 tensor cores); the other two kernels' few CUDA-core flops per value are not a bound."""
    return 2.0 * np.asarray(tokens, float) * (2 + n) * n * n * h if op == "mhc_prenorm_gemm" else 0.0 * np.asarray(tokens, float)


def _mhc_tables(path: Path) -> dict[tuple[str, int, int, int], Series]:
    """(op, n, H, Sinkhorn iterations of the pre kernel, else 0) -> device time over tokens of the mHC kernels (``benchmarks/gpu/op_tables.py`` stage ``mhc``); the
    projection at each token count takes its fastest split (what a tuned engine picks)."""
    pts: dict[tuple[str, int, int, int], dict[float, float]] = {}
    for r in _rows(path):
        n, k = int(r["groups"]), int(r["k"])
        pre = r["op"] in ("mhc_pre", MHC_CHAIN_OP, MHC_PRE_V2_OP)
        key = (r["op"], n, k // n, int(float(r["context"])) if pre else 0)
        t = float(r["device_us"]) * 1e-6
        by = pts.setdefault(key, {})
        by[float(r["m"])] = min(t, by.get(float(r["m"]), math.inf))
    out = {}
    for (op, n, h, it), by in sorted(pts.items()):
        xs = sorted(by)
        out[(op, n, h, it)] = Series(np.array(xs), np.array([by[x] for x in xs]),
                                 lambda t, op=op, n=n, h=h: mhc_bytes(op, t, n, h), f"mHC {op} table ({n} x {h})")
    return out


def measured_gpus() -> list[str]:
    """The GPUs with a folder of measured op tables (``costmodels/data/op_tables/<gpu>``), sorted."""
    return sorted(p.name.upper() for p in DATA.iterdir() if (p / "provenance.json").is_file())


def same_kind(hw) -> list[str]:
    """Measured GPUs whose catalog entry has the FP8 peak and HBM bandwidth of ``hw`` (a ``Hardware``; one die and
    memory: H100 and H800), ``hw`` itself first when it was measured: the tables that price its local kernels as
    measured, not transferred."""
    same = []
    for g in measured_gpus():
        other = get_hardware(g)
        # (a GPU without FP8 tensor cores, fp8_tflops unset, is no measured GPU's kind)
        if other.fp8_tflops == hw.fp8_tflops and other.bf16_tflops == hw.bf16_tflops and other.hbm_bw == hw.hbm_bw:
            same.append(g)
    return sorted(same, key=lambda g: g.lower() != hw.name.lower())


def nearest(hw) -> list[str]:
    """Measured GPUs nearest ``hw`` first (a ``Hardware``): by how far a time moves between them, the distance in log
    HBM bandwidth plus log dense FP8 peak (else BF16 where either has no FP8); ties by name. A table taken from the
    nearest GPU that holds a shape moves least (``transferred``), and a GPU whose datasheet differs a little from a
    measured one prices as that one does, not as a farther one."""
    def dtype(other) -> str:
        return "fp8" if hw.has_fp8 and other.has_fp8 else "bf16"

    def dist(g: str) -> float:
        other = get_hardware(g)
        d = dtype(other)
        return abs(math.log(hw.hbm_bw / other.hbm_bw)) + abs(math.log(hw.tflops(d) / other.tflops(d)))
    return sorted(measured_gpus(), key=lambda g: (dist(g), g))


@lru_cache(maxsize=None)
def load(gpu: str) -> OpTables | None:
    """The measured tables of ``gpu`` (case-insensitive folder name), or None when none were measured."""
    folder = DATA / gpu.lower()
    if not (folder / "provenance.json").is_file():
        return None
    hw = get_hardware(gpu)
    prov = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
    gemm = {}
    for dt in ("fp8", "bf16"):   # DeepGEMM / Triton FP8 (the weights' GEMMs), cuBLAS BF16 (routers, heads, BF16 layouts)
        if (folder / f"dense_gemm_{dt}.csv").is_file():
            gemm.update(_gemm_tables(folder / f"dense_gemm_{dt}.csv", hw.tflops(dt) * 1e12, hw.hbm_bw, hw.name, dt))
    masked = _grouped_tables(folder / "grouped_gemm_masked_fp8.csv", "masked") \
        if (folder / "grouped_gemm_masked_fp8.csv").is_file() else {}
    contig = _grouped_tables(folder / "grouped_gemm_contig_fp8.csv", "contiguous") \
        if (folder / "grouped_gemm_contig_fp8.csv").is_file() else {}
    mla = _mla_tables(folder / "mla_decode_bf16.csv") if (folder / "mla_decode_bf16.csv").is_file() else {}
    mhc = _mhc_tables(folder / "mhc.csv") if (folder / "mhc.csv").is_file() else {}
    gdec, gpre = _gqa_tables(folder / "gqa_attention_bf16.csv") if (folder / "gqa_attention_bf16.csv").is_file() else ({}, {})
    gbusy = _gqa_busy(folder / "gqa_multi_bf16.csv", gdec) if (folder / "gqa_multi_bf16.csv").is_file() else {}
    return OpTables(gpu=hw.name, provenance=prov, gemm=gemm, masked_grouped=masked, mla_decode=mla,
                    contig_grouped=contig, mhc=mhc, gqa_decode=gdec, gqa_prefill=gpre,
                    gqa_busy=gbusy)


# --------------------------------------------------------------------------- the cost model's use of the tables
SWIGLU_FFNS = ("dense_ffn", "shared_expert")   # one Linear k=h, n=3I in params.py; the engine runs gate_up + down


def kernel_gemms(name: str, k: int, n: int, divisor: float, hidden: int) -> list[tuple[int, int]]:
    """The (N, K) GEMMs one rank launches for a weight ``k x n`` split ``divisor`` ways.

    SwiGLU FFNs are one Linear of 3I columns in the parameter list but two kernels (gate_up 2I x h,
    down h x I). Under tensor parallelism the projections back to the hidden size (o_proj, down) are
    row-parallel (split K); every other split weight is column-parallel (split N).
    """
    d = max(divisor, 1.0)
    if name in SWIGLU_FFNS and n % 3 == 0:
        inter = n // 3
        return [(max(1, round(2 * inter / d)), k), (k, max(1, round(inter / d)))]
    if d > 1 and n == hidden:
        return [(n, max(1, round(k / d)))]
    return [(max(1, round(n / d)), k)]


def transferred(t, flops, byts, peak_measured: float, peak: float, bw_measured: float, bw: float, mem_eff: float,
                compute_eff: float, excess_ratio: float | None = None):
    """A kernel's measured seconds ``t`` (dense peak ``peak_measured``, HBM ``bw_measured`` where it was measured) on
    another GPU (``peak``, ``bw``): the roofline moves, the kernel's time over it stays.

        roof = max(bytes / (mem_eff * bw), flops / (compute_eff * peak))            (each GPU's own)
        t'   = roof' + (t - roof) * excess_ratio                                    where t >= roof
        t'   = t * roof' / roof                                                     where the kernel beats it

    The time over the roofline (launch, prologue, pipeline fill, a tail of tiles) is latency the SMs run: it scales
    with their throughput (``excess_ratio``, default the peak ratio ``peak_measured / peak``; 1 for kernels without
    tensor cores, whose dependent steps take the same time on any clock the catalog lists). A kernel faster than the
    calibration's efficiencies keeps its own fraction of the roofline. Held out on the H100's own tables of the same
    kernels and harness (H200 -> H100; ``tests/test_op_table.py::test_the_transfer_rule_held_out_on_the_h100s_own_tables``,
    ``docs/costmodel.md``): DeepGEMM's masked grouped FP8 GEMMs (48 shapes) mean |error| 2.7%, -9.5 .. +6.9% (up to 64
    rows an expert, what decode runs, -1.5 .. +4.1%); its dense FP8 GEMMs (104) 5.7%, -13 .. +19%; FlashMLA decode (24)
    -16 .. +3%. Scaling the whole time by the peak ratio instead (the rule until 2026-12-07) kept a bandwidth-bound
    kernel's time on a GPU with less bandwidth while it ran under 86% of that GPU's ceiling: 17-22% short on the H100."""
    ratio = peak_measured / peak if excess_ratio is None else excess_ratio
    roof_m = np.maximum(byts / (mem_eff * bw_measured), flops / (compute_eff * peak_measured))
    roof = np.maximum(byts / (mem_eff * bw), flops / (compute_eff * peak))
    over = t - roof_m
    return np.where(over >= 0, roof + over * ratio, t * roof / np.maximum(roof_m, 1e-30))


def transferred_one(t: float, flops: float, byts: float, peak_measured: float, peak: float, bw_measured: float,
                    bw: float, mem_eff: float, compute_eff: float) -> float:
    """``transferred`` for one time in plain Python (a simulated step's few lookups)."""
    roof_m = max(byts / (mem_eff * bw_measured), flops / (compute_eff * peak_measured))
    roof = max(byts / (mem_eff * bw), flops / (compute_eff * peak))
    return roof + (t - roof_m) * peak_measured / peak if t >= roof_m else t * roof / max(roof_m, 1e-30)


@dataclass
class TableGemms:
    """Dense-GEMM times of a step's weight rows from a measured table, on this or another GPU.

    ``shapes[r]`` are row r's kernels (``kernel_gemms``); rows not covered (``covers``: a measured profile's own
    BF16 heads and routers, as its fit took them) are left to the analytic model. On another GPU a measured time
    transfers by ``transferred``: the kernel's roofline at the calibration's efficiencies
    (``max(bytes / (mem_eff * bw), flops / (compute_eff * peak))``) moves to the target's, and its time over that
    roofline (launch, pipeline fill, tile tails) scales with the tensor-core throughput (SMs x clock, which the dense
    peak is proportional to). A GPU of the same die with less HBM (H800/H100 vs H200) pays the bandwidth share of a
    small-M GEMM and keeps its latency.

    A row whose dtype has a measured table of its own (``own``: BF16 routers, heads and layouts from the cuBLAS BF16
    table) is priced from that table the same way. A row in another dtype without one (``rows``: FP4 weights), on
    the measured GPU too, starts from the table's kernel at its shape here (``t8``, as above) and keeps the floor of one
    GEMM (``GemmTable.floor_s``, scaled like the fixed part). The time above that floor scales by the FP8 kernel's
    roofline shares here: its streaming share with the bytes the row moves (weights at their bytes per element, BF16
    activations in for a BF16 row), its math share with the achievable math rate (``compute_eff x peak``, FP8 over the
    row's dtype); bounded below by this GPU's streaming ceiling at the row's bytes:

        t = max(floor + (t8 - floor) * max(bytes_row / bytes_fp8 * s_bw,  rate_fp8 / rate_row * s_math),  bytes_row / (mem_eff * bw_target))

    with ``s_bw, s_math`` each roofline term over the larger of the two (one of them is 1). So fewer weight bytes or
    a faster rate never slow a GEMM under this rule (FP4 <= FP8 at every shape), a bandwidth-bound one gains in proportion
    to its bytes, a compute-bound one to its rate (FP4 on Hopper runs at the FP8 rate: none), one at the floor
    gains nothing. What it assumes: the time above the floor is streaming or math as the roofline splits it (true of
    the decode GEMMs that dominate a step; a small GEMM held up by a long K loop, 11.6 us for 512 x 7168 on the H200,
    is then priced up to 40% short in FP4 and 60% long in BF16).
    """

    table: GemmTable
    shapes: list[list[tuple[int, int]]]
    covers: np.ndarray                 # bool per row
    target_flops: float                # this GPU's dense peak for the table's dtype, flop/s
    target_bw: float                   # this GPU's peak HBM bandwidth, bytes/s
    mem_eff: float = 0.856             # streaming fraction of peak HBM bandwidth (calibration)
    compute_eff: float = 0.662         # FP8 GEMM fraction of the dense peak (calibration)
    # rows in another dtype than the table's: row -> (dense peak of its dtype here flop/s, weight bytes per element,
    # activation bytes per element in, compute efficiency of its dtype); absent rows are the table's dtype
    rows: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)
    # rows whose dtype has a measured table of its own (BF16 routers, heads and layouts: cuBLAS): row -> (that table,
    # this GPU's dense peak of its dtype flop/s, the compute efficiency of its dtype); priced from it as FP8 rows are
    # from ``table``, transferred to this GPU the same way
    own: dict[int, tuple[GemmTable, float, float]] = field(default_factory=dict)

    @classmethod
    def on(cls, table: GemmTable, hw, shapes: list[list[tuple[int, int]]], covers: np.ndarray, dtypes: list[str],
           weight_bytes: np.ndarray, mem_eff: float, compute_eff: dict[str, float],
           own_tables: dict[str, GemmTable] | None = None) -> "TableGemms":
        """``table`` priced on GPU ``hw`` (a ``costmodels.hardware.Hardware``) for rows whose weights are in ``dtypes``
        at ``weight_bytes`` per element (block scales included): a row whose dtype has a table in ``own_tables``
        (``{"bf16": cuBLAS table}``) is priced from that one; each other row not in the table's dtype gets its own
        peak, bytes (BF16 activations in for a BF16 row) and the compute efficiency of the math it runs
        (``Hardware.math_dtype``: FP4 without FP4 tensor cores runs FP8's). ``compute_eff``: the calibration's per
        dtype."""
        fp8 = compute_eff.get("fp8", 0.662)
        own_tables = own_tables or {}
        own = {r: (own_tables[d], hw.tflops(d) * 1e12, compute_eff.get(hw.math_dtype(d), fp8))
               for r, d in enumerate(dtypes) if covers[r] and d != table.dtype and d in own_tables}
        rows = {r: (hw.tflops(d) * 1e12, float(weight_bytes[r]), act_bytes(d),
                    compute_eff.get(hw.math_dtype(d), fp8))
                for r, d in enumerate(dtypes) if covers[r] and d != table.dtype and r not in own}
        return cls(table, shapes, covers, hw.tflops("fp8") * 1e12, hw.hbm_bw, mem_eff, fp8, rows, own)

    def _measured_here(self, tab: GemmTable, peak: float) -> bool:
        """Whether ``tab`` was measured on this GPU (``peak``: this GPU's dense peak of its dtype), else transferred."""
        return tab.peak_flops == peak and tab.hbm_bw == self.target_bw

    @property
    def same_gpu(self) -> bool:
        return self._measured_here(self.table, self.target_flops)

    def own_here(self, row: int) -> bool:
        """Whether row ``row``'s own-dtype table was measured on this GPU (else transferred to it)."""
        t, peak, _ = self.own[row]
        return self._measured_here(t, peak)

    def table_of(self, row: int) -> GemmTable:
        """The measured table row ``row`` is priced from (its dtype's own, or the FP8 one)."""
        own = self.own.get(row)
        return own[0] if own is not None else self.table

    def seconds(self, row: int, m: np.ndarray) -> np.ndarray:
        """Seconds of row ``row``'s kernels at ``m`` rows each (any shape of array)."""
        flat = np.asarray(m, dtype=float).ravel()
        pos = flat > 0
        every = bool(pos.all())
        acc = None   # the kernels' times summed in order (a table step prices thousands of rows: no zero-filled copies)
        other = self.rows.get(row)
        own = self.own.get(row)
        tab, peak, ceff = own if own is not None else (self.table, self.target_flops, self.compute_eff)
        here = self._measured_here(tab, peak)
        if every or pos.any():
            mp = flat if every else flat[pos]
            for n, k in self.shapes[row]:
                t = tab.seconds(mp, n, k)
                if other is not None or not here:
                    b8 = gemm_bytes(mp, n, k, tab.weight_bytes_per_elem, tab.act_bytes_per_elem)
                    flops = 2.0 * mp * n * k
                    if not here:   # the table's kernel on this GPU
                        t = transferred(t, flops, b8, tab.peak_flops, peak, tab.hbm_bw, self.target_bw, self.mem_eff, ceff)
                    if other is not None:
                        t = self._other_dtype(t, b8, flops, n, k, mp, other)
                acc = t if acc is None else acc + t
        if acc is not None and every:
            return acc.reshape(np.shape(m))
        total = np.zeros(flat.size)
        if acc is not None:
            total[pos] = acc
        return total.reshape(np.shape(m))

    def _other_dtype(self, t8, b8, flops, n: int, k: int, mp, other: tuple[float, float, float, float]):
        """A row in another dtype from the table's kernel at its shape here (``t8``, moving ``b8`` bytes): the class
        docstring's rule."""
        peak, wb, ab, ceff = other
        floor = self.table.floor_s * self.table.peak_flops / self.target_flops
        byts = n * k * wb + mp * (k * ab + 2.0 * n)
        t_bw, t_c = b8 / self.target_bw, flops / self.target_flops   # the FP8 kernel's roofline here
        top = np.maximum(t_bw, t_c)
        scale = np.maximum((byts / b8) * (t_bw / top), (self.compute_eff * self.target_flops) / (ceff * peak) * (t_c / top))
        return np.maximum(floor + np.maximum(t8 - floor, 0.0) * scale, byts / (self.mem_eff * self.target_bw))


# The grouped layouts an engine runs (as SGLang's DeepGEMM MoE beside DeepEP's two modes): the masked one in decode
# steps (every expert's rows in an [E, max_m] buffer, what low-latency dispatch delivers), the contiguous one in steps
# with a prefill (rows sorted by expert, each expert's run padded to a 128-row tile, what normal dispatch delivers).
TILE_ROWS = 128   # DeepGEMM's M block of the grouped layouts on SM90 (get_mk_alignment_for_contiguous_layout)
# Rows per expert up to which the masked table at the mean answers: within one 128-row tile the spread of routing's
# counts does not change the tiles a kernel runs (Poisson at a mean of 64 passes 128 with probability ~1e-10)
MASKED_MAX_ROWS = 64.0


def _poisson_cdf(k: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """P(X <= k) for X ~ Poisson(lam), elementwise (scipy's regularised upper incomplete gamma: Q(k + 1, lam))."""
    from scipy.special import gammaincc
    return gammaincc(np.asarray(k, float) + 1.0, np.asarray(lam, float))


@dataclass
class MeasuredOn:
    """The GPU a kernel table was measured on and the one it prices (``same_gpu``: the table's own times; else each
    time transfers by ``transferred``)."""

    measured_on: str
    peak_measured: float          # the measured GPU's dense peak of the kernel's dtype, flop/s
    bw_measured: float
    target_flops: float
    target_bw: float
    mem_eff: float = 0.856
    compute_eff: float = 0.662

    @property
    def same_gpu(self) -> bool:
        return self.peak_measured == self.target_flops and self.bw_measured == self.target_bw


@dataclass(kw_only=True)
class ExpertGemms(MeasuredOn):
    """The routed experts' two grouped FP8 GEMMs of one MoE layer (gate_up, then down) at the layout's own expert
    shapes, from the measured grouped tables: per expert, over mean rows per expert, at the measured expert counts.

    - Decode steps run the masked layout: the masked table at the mean up to ``MASKED_MAX_ROWS`` rows an expert; above
      it routing's spread over row tiles (each expert's count Poisson at the mean, ``ceil(c / 128)`` tiles, priced at
      its tiles' rows: the padding is computed).
    - Steps with a prefill run the contiguous layout: its table where it measured this shape (timed at uniform random
      routing's counts, the spread in it; per expert held outside its measured expert counts); else the masked table
      as above, short by the contiguous kernel's own cost (15-31% on the H100) and said so.
    - Between measured expert counts the per-expert time is interpolated in log-log; outside them it is held. Beyond a
      curve's largest rows the time follows the roofline at its last point's efficiency; below its first it is held.
    - On another GPU the measured time transfers as the dense tables' (``TableGemms``): the fixed part by the FP8 peak
      ratio, never under this GPU's streaming and math ceilings."""

    shapes: list[tuple[int, int]]                                      # (N, K) per GEMM, one GPU's shard
    masked: list[dict[int, tuple[np.ndarray, np.ndarray]]]             # per shape: experts -> (rows, s/expert)
    contig: list[dict[int, tuple[np.ndarray, np.ndarray]]]             # the same from the contiguous table

    @classmethod
    def on(cls, tables: OpTables, hw, shapes: list[tuple[int, int]], mem_eff: float,
           compute_eff: float) -> "ExpertGemms | None":
        """The tables of ``tables`` for ``shapes`` on GPU ``hw``; None unless the masked table measured every shape."""
        masked, contig = [], []
        for n, k in shapes:
            per = lambda src: {g: (ser.xs, ser.ts / g) for (fn, fk, g), ser in src.items() if (fn, fk) == (n, k)}  # noqa: E731
            masked.append(per(tables.masked_grouped))
            contig.append(per(tables.contig_grouped))
            if not masked[-1]:
                return None
        hw_m = get_hardware(tables.gpu)
        return cls(tables.gpu, hw_m.tflops("fp8") * 1e12, hw_m.hbm_bw, hw.tflops("fp8") * 1e12, hw.hbm_bw, mem_eff,
                   compute_eff, shapes=list(shapes), masked=masked, contig=contig)

    @property
    def contig_experts(self) -> list[int]:
        """The expert counts at which every shape's contiguous layout was measured ([]: none, the masked table prices
        the contiguous layout too)."""
        return sorted(set.intersection(*(set(c) for c in self.contig))) if all(self.contig) else []

    def _at(self, i: int, curve: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> np.ndarray:
        n, k = self.shapes[i]
        xs, ts = curve
        work = lambda m: np.maximum(2.0 * m * n * k / self.peak_measured,   # noqa: E731 - the roofline per expert
                                    gemm_bytes(m, n, k) / self.bw_measured)
        return loglog_interp(rows, xs, ts, work(rows), work(xs[-1]))[0]

    def _masked_spread(self, i: int, g: int, rows: np.ndarray) -> np.ndarray:
        """Seconds per expert from the masked curve at ``g`` experts: at the mean within one tile, above it each
        expert's Poisson count over ``ceil(c / 128)`` tiles priced at its tiles' rows."""
        cur = self.masked[i][g]
        out = self._at(i, cur, rows)
        many = rows > MASKED_MAX_ROWS
        if not many.any():
            return out
        lam = rows[many]
        jmax = int(np.ceil((lam.max() + 10.0 * np.sqrt(lam.max()) + 10.0) / TILE_ROWS)) + 1
        edges = np.arange(1, jmax + 1) * TILE_ROWS                       # P(c <= 128 j), j = 1..jmax
        cdf = _poisson_cdf(edges[None, :], lam[:, None])
        p = np.diff(np.concatenate([np.zeros((lam.size, 1)), cdf], axis=1), axis=1)
        p[:, -1] += 1.0 - cdf[:, -1]
        # an expert of j >= 2 tiles costs the table at 128 j rows whatever the mean: one lookup per tile count
        out[many] = p[:, 0] * self._at(i, cur, np.minimum(lam, float(TILE_ROWS))) + \
            p[:, 1:] @ self._at(i, cur, edges[1:].astype(float))
        return out

    def _per_expert(self, i: int, rows: np.ndarray, experts: np.ndarray, contiguous: bool) -> np.ndarray:
        """Seconds per expert at ``experts`` experts: log-log between the measured counts, held outside them. The
        contiguous layout (``contiguous``) reads the contiguous curves where this shape has any (only them), else the
        masked ones with routing's spread."""
        con = contiguous and bool(self.contig[i])
        gs = sorted(self.contig[i] if con else self.masked[i])
        at = np.stack([self._at(i, self.contig[i][g], rows) if con else self._masked_spread(i, g, rows) for g in gs])
        if len(gs) == 1:
            return at[0]
        lg = np.log(np.asarray(gs, float))
        x = np.clip(np.log(np.maximum(experts, 1.0)), lg[0], lg[-1])
        hi = np.clip(np.searchsorted(lg, x, side="right"), 1, len(gs) - 1)
        lo = hi - 1
        w = (x - lg[lo]) / (lg[hi] - lg[lo])
        cols = np.arange(rows.size)
        return np.exp((1 - w) * np.log(at[lo, cols]) + w * np.log(at[hi, cols]))

    def seconds(self, rows, experts, contiguous: bool = False) -> np.ndarray:
        """Seconds of the layer's grouped GEMMs with ``experts`` experts holding ``rows`` rows each on average, in the
        masked layout (decode) or the contiguous one (``contiguous``: a step with prefill); 0 where rows or experts
        are 0."""
        rows, experts = np.broadcast_arrays(np.asarray(rows, float), np.asarray(experts, float))
        shape = rows.shape
        r, e = rows.ravel(), experts.ravel()
        on = (r > 0) & (e > 0)
        out = np.zeros(r.size)
        if not on.any():
            return out.reshape(shape)
        r, e = np.maximum(r[on], 1e-9), e[on]
        total = np.zeros(r.size)
        for i, (n, k) in enumerate(self.shapes):
            t = self._per_expert(i, r, e, bool(contiguous)) * e
            if not self.same_gpu:
                t = transferred(t, 2.0 * e * r * n * k, e * gemm_bytes(r, n, k), self.peak_measured, self.target_flops,
                                self.bw_measured, self.target_bw, self.mem_eff, self.compute_eff)
            total += t
        out[on] = total
        return out.reshape(shape)


@dataclass(kw_only=True)
class MhcKernels(MeasuredOn):
    """The three mHC kernels around one block (``MHC_OPS``) at ``n`` streams of width ``h``, from a table measured at
    ``n_m`` streams of width ``h_m`` over tokens (log-log between its points; held below the first, along the bytes
    beyond the last).

    - Another shape: each kernel streams its bytes, so it takes the measured kernel's time at the token count that
      moves the same bytes at the measured shape (``equal_tokens``); the projection never under this GPU's TF32 math
      ceiling for its own shape's flops.
    - Another GPU: the part of a measured time that the measured GPU's streaming ceiling accounts for moves by the
      bandwidth ratio. The rest is the projection's GEMM tail, scaled by the BF16 peak ratio as the GEMM tables are, and
      for the pre and post kernels a launch and dependent steps, kept as measured (the model's launch is the same on
      every GPU; these kernels use no tensor cores). Never under this GPU's streaming ceiling."""

    series: dict[str, Series]
    n: int
    h: int
    n_m: int                      # the measured shape's streams and width
    h_m: int
    tf32_rate: float              # this GPU's TF32 tensor-core peak, flop/s (``Hardware.tf32_rate``)
    chain_s: float = 0.0          # measured seconds of one Sinkhorn iteration on the chain (MHC_CHAIN_OP rows)

    @staticmethod
    def shapes(tables: OpTables) -> list[tuple[int, int]]:
        """The (streams, width) shapes whose projection and post kernel ``tables`` measured."""
        have = {(n, h) for (op, n, h, _) in tables.mhc}
        return sorted(s for s in have if all(((op, *s, 0) in tables.mhc) for op in MHC_OPS if op != "mhc_pre"))

    @classmethod
    def on(cls, tables: OpTables, hw, n: int, h: int, iters: int, mem_eff: float,
           compute_eff: float) -> "MhcKernels | None":
        """``tables``' mHC kernels for ``n`` streams of width ``h`` on GPU ``hw``: at that shape where measured, else
        at the measured shape nearest in bytes a token (None: no shape measured). The pre kernel: at ``iters`` Sinkhorn
        iterations or at two counts (then linear in the iterations between or beyond them, never cheaper than the
        fewer: each iteration is a step of the chain every token's program runs); else not in ``series`` (priced by
        its bytes, ``StepOps._mhc_rows``), with ``chain_s`` from ``MHC_CHAIN_OP`` rows where they measured a pre kernel
        at two iteration counts: the difference per iteration at the fewest tokens, where the chain is the kernel's
        critical path (taken for any ``n``: the n x n mixing matrix of one token is a warp's work up to n = 8)."""
        shapes = cls.shapes(tables)
        if not shapes:
            return None
        per_token = float(mhc_bytes("mhc_post", 1.0, n, h))
        n_m, h_m = (n, h) if (n, h) in shapes else \
            min(shapes, key=lambda s: (abs(math.log(float(mhc_bytes("mhc_post", 1.0, *s)) / per_token)), s))
        got = {op: tables.mhc[(op, n_m, h_m, 0)] for op in MHC_OPS if op != "mhc_pre"}
        chain = {it: ser for (op, fn, fh, it), ser in tables.mhc.items() if (op, fn, fh) == (MHC_CHAIN_OP, n_m, h_m)}
        chain_s = 0.0
        if len(chain) >= 2:
            a, b = min(chain), max(chain)
            chain_s = max(0.0, float(chain[b].ts[0] - chain[a].ts[0]) / (b - a))
        pre = {it: ser for (op, fn, fh, it), ser in tables.mhc.items() if (op, fn, fh) == ("mhc_pre", n_m, h_m)}
        if iters in pre:
            got["mhc_pre"] = pre[iters]
        elif len(pre) >= 2:
            its = sorted(pre)
            hi = next((i for i in its if i > iters), its[-1])
            lo = max((i for i in its if i < hi), default=its[0])
            a, b = pre[lo], pre[hi]
            xs = np.union1d(a.xs, b.xs)
            ta, tb = a.time(xs).seconds, b.time(xs).seconds
            ts = np.maximum(ta + (iters - lo) * np.maximum(tb - ta, 0.0) / (hi - lo), np.minimum(ta, tb))
            got["mhc_pre"] = Series(xs, ts, a.work, f"{a.detail} at {iters} Sinkhorn iterations, linear between the "
                                                    f"measured {lo} and {hi}")
        hw_m = get_hardware(tables.gpu)
        return cls(tables.gpu, hw_m.tflops("bf16") * 1e12, hw_m.hbm_bw, hw.tflops("bf16") * 1e12, hw.hbm_bw, mem_eff,
                   compute_eff, series=got, n=n, h=h, n_m=n_m, h_m=h_m, tf32_rate=hw.tf32_rate, chain_s=chain_s)

    @property
    def same_shape(self) -> bool:
        return (self.n, self.h) == (self.n_m, self.h_m)

    def equal_tokens(self, op: str, tokens) -> np.ndarray:
        """The token counts at which ``op`` moves at the measured shape the bytes it moves here at ``tokens`` (the
        bytes are affine in the tokens)."""
        t = np.asarray(tokens, float)
        return t if self.same_shape else self._tokens_moving(op, mhc_bytes(op, t, self.n, self.h))

    def _tokens_moving(self, op: str, byts) -> np.ndarray:
        """The token counts at which ``op`` moves ``byts`` at the measured shape."""
        a0 = float(mhc_bytes(op, 0.0, self.n_m, self.h_m))
        return (byts - a0) / (float(mhc_bytes(op, 1.0, self.n_m, self.h_m)) - a0)

    def seconds(self, op: str, tokens) -> np.ndarray:
        """Seconds of one ``op`` kernel (one of ``series``) at each of ``tokens`` (0 where there are none)."""
        t = np.asarray(tokens, float)
        ser = self.series[op]
        byts = mhc_bytes(op, t, self.n, self.h)
        x = np.maximum(t if self.same_shape else self._tokens_moving(op, byts), 1e-9).ravel()
        out = loglog_interp(x, ser.xs, ser.ts, ser.work(x), ser.work(ser.xs[-1]))[0].reshape(t.shape)  # no sources: hot path
        gemm = op == "mhc_prenorm_gemm"
        if not self.same_gpu:
            # the share of the measured time the bytes it measured account for (below the table's first point: that
            # point's bytes, as its time is held)
            # its roofline is the bytes it measured (below the table's first point: that point's, as its time is held);
            # the projection's math is bounded below on its own (TF32, after this)
            moved = ser.work(np.maximum(x, ser.xs[0])).reshape(t.shape)
            out = np.maximum(transferred(out, 0.0, moved, self.peak_measured, self.target_flops, self.bw_measured,
                                         self.target_bw, self.mem_eff, self.compute_eff, None if gemm else 1.0),
                             byts / (self.mem_eff * self.target_bw))
        if gemm and not (self.same_gpu and self.same_shape):
            out = np.maximum(out, mhc_flops(op, t, self.n, self.h) / (self.compute_eff * self.tf32_rate))
        return np.where(t > 0, out, 0.0)


MLA_ENTRY_DIMS = (576, 512)   # FlashMLA's measured latent: q/k 512 + 64 rope, v 512 (DeepSeek-V3/R1, Kimi K2)
MLA_LATENT_BYTES = MLA_ENTRY_DIMS[0] * 2   # one cached token's BF16 latent, what the table's kernel reads per token


@dataclass
class TableMLA:
    """MLA decode attention of one layer from the measured FlashMLA table (one kernel reads the decode batch).

    FlashMLA splits the whole batch's KV over the SMs, so its time follows the batch and its total KV: a
    step's decodes are looked up at (batch, mean context). ``heads`` query heads per GPU that were not
    measured take the next measured count's time (scaled by the head ratio only above the largest). Lookups are bilinear in
    log(batch)-log(context)-log(time) (``GridTable.time``'s arithmetic; beyond the largest batch or context
    the time grows with the KV read). On another GPU the kernel is read at the context whose roofline on the
    measured GPU (``bytes / (mem_eff * bw)`` and ``flops / (attn_eff * bf16_peak)``) is this GPU's roofline at the
    step's context (the work grows with the context, so that context is the step's times the ratio of the two
    rooflines), and its time over that roofline scales by the BF16 peak ratio. Where the measured time is its
    roofline plus a fixed latency this is ``transferred``'s move; where the measured kernel is flat in context (a
    latency-bound decode: Llama-3.1-8B, 128 decodes at 64-512 keys, 94 us a layer on the H100 at any of them), it
    stays flat here, where moving the roofline under a flat time made a faster GPU's decode faster at longer
    contexts (H200: 2.88 ms at 64 keys, 2.09 at 512).

    ``at`` answers one point in plain Python (a simulated step calls it a few times), ``many`` an array.
    """

    table: GridTable
    heads: float                  # query heads per GPU asked for
    table_heads: int              # the measured count that answers
    peak_ratio: float             # measured GPU's BF16 peak / target's (1: the measured GPU)
    target_bw: float
    target_flops: float           # target BF16 dense peak, flop/s
    mem_eff: float = 0.856
    compute_eff: float = 0.586
    same_gpu: bool = True
    measured_on: str = ""
    bw_measured: float = 0.0      # the measured GPU's HBM bandwidth, bytes/s (0: the target's)
    token_bytes: float = MLA_LATENT_BYTES   # bytes the measured kernel reads a cached token (streaming lookups)
    kernel: str = "FlashMLA"      # the measured kernel, for notes
    layout: str = ""              # its head layout in words (a GQA table's), for notes
    # a GQA table read for another head layout: KV heads are the kernel's independent units of work, so a layout with
    # r times the table's KV bytes a token reads as r times the batch at the same context (``StepOps.stream_time``);
    # 0: the FlashMLA stream, read at the context that reads the same bytes
    kv_units: float = 0.0

    def __post_init__(self):
        self._lx = [float(v) for v in np.log(self.table.xs)]
        self._ly = [float(v) for v in np.log(self.table.ys)]
        self._lt = [[float(v) for v in row] for row in np.log(self.table.seconds)]
        # FlashMLA pads query heads to its tile: 16, 32 and 64 heads measured within ~10% of each other, so only
        # a count beyond the largest measured one scales (by the head ratio); others take the nearest count's time
        self._scale = max(1.0, self.heads / self.table_heads)
        self._nlx, self._nly, self._nlt = np.array(self._lx), np.array(self._ly), np.array(self._lt)

    @staticmethod
    def _cell(grid: list[float], v: float) -> tuple[int, float, float]:
        """(segment, weight of its upper end, log excess beyond the grid's last point) of ``v`` on ``grid``."""
        lo, hi = grid[0], grid[-1]
        c = lo if v < lo else (hi if v > hi else v)
        i = bisect_right(grid, c) - 1
        if i > len(grid) - 2:
            i = len(grid) - 2
        return i, (c - grid[i]) / (grid[i + 1] - grid[i]), (v - hi if v > hi else 0.0)

    def _one(self, batch: float, context: float) -> float:
        """The measured time at ``batch`` requests of mean ``context`` (bilinear in the logs; beyond the grid growing
        with the KV read)."""
        i, wx, ex = self._cell(self._lx, math.log(batch))
        j, wy, ey = self._cell(self._ly, math.log(context))
        lt, lt1 = self._lt[i], self._lt[i + 1]
        a = lt[j] + (lt[j + 1] - lt[j]) * wy
        b = lt1[j] + (lt1[j + 1] - lt1[j]) * wy
        return math.exp(a + (b - a) * wx + ex + ey) * self._scale

    def at(self, batch: float, context: float, flops: float, byts: float) -> float:
        """Seconds of one layer's decode attention: ``batch`` requests at mean ``context`` (``flops``, ``byts``: its work).
        On another GPU: the measured kernel at the context whose roofline there is this GPU's roofline here, its time
        over that roofline scaled by the BF16 peak ratio (``_roofs``)."""
        if self.same_gpu:
            return self._one(batch, context)
        roof, k = self._roofs(flops, byts)
        t = self._one(batch, context * k if k > 0.0 else context)
        return roof + (t - roof) * self.peak_ratio if t >= roof else t

    def _roofs(self, flops, byts):
        """(this GPU's roofline, its ratio to the measured GPU's at the same work) of a decode's ``flops`` / ``byts``;
        the ratio 0 where there is no work (the context then stays: the time scales by the peak ratio alone, as
        ``transferred`` moves it)."""
        bw_m = self.bw_measured or self.target_bw
        roof_m = np.maximum(byts / (self.mem_eff * bw_m), flops / (self.compute_eff * self.peak_ratio * self.target_flops))
        roof = np.maximum(byts / (self.mem_eff * self.target_bw), flops / (self.compute_eff * self.target_flops))
        k = np.where(roof_m > 0, roof / np.maximum(roof_m, 1e-30), 0.0)
        return (float(roof), float(k)) if np.ndim(k) == 0 else (roof, k)

    def many(self, batch, context, flops, byts) -> np.ndarray:
        """``at`` for arrays (broadcast)."""
        batch, context, flops, byts = np.broadcast_arrays(*(np.asarray(v, float) for v in (batch, context, flops, byts)))

        def cell(grid, v):
            c = np.clip(v, grid[0], grid[-1])
            i = np.minimum(np.searchsorted(grid, c, side="right") - 1, len(grid) - 2)
            return i, (c - grid[i]) / (grid[i + 1] - grid[i]), np.where(v > grid[-1], v - grid[-1], 0.0)

        def look(ctx):
            i, wx, ex = cell(self._nlx, np.log(batch))
            j, wy, ey = cell(self._nly, np.log(ctx))
            lt = self._nlt
            a = lt[i, j] + (lt[i, j + 1] - lt[i, j]) * wy
            b = lt[i + 1, j] + (lt[i + 1, j + 1] - lt[i + 1, j]) * wy
            return np.exp(a + (b - a) * wx + ex + ey) * self._scale

        if self.same_gpu:
            return look(context)
        roof, k = self._roofs(flops, byts)
        t = look(np.where(k > 0, context * k, context))
        return np.where(t >= roof, roof + (t - roof) * self.peak_ratio, t)


def gqa_decode_table(tables: OpTables | None, hq: float, hkv: float, d: float, target_bf16_flops: float,
                     target_bw: float, mem_eff: float, compute_eff: float) -> TableMLA | None:
    """The FlashAttention-3 GQA decode table of the measured head layout nearest ``hq`` query over ``hkv`` KV heads of
    ``d`` a GPU (``nearest_gqa_layout``), as a streaming table (``StepOps.stream_time`` looks it up at the context that
    reads a step's bytes), or None where none was measured."""
    if tables is None or not tables.gqa_decode:
        return None
    q, kv, dm = nearest_gqa_layout(list(tables.gqa_decode), hq, hkv, d)
    measured = get_hardware(tables.gpu)
    peak = measured.bf16_tflops * 1e12
    same = peak == target_bf16_flops and measured.hbm_bw == target_bw
    return TableMLA(tables.gqa_decode[(q, kv, dm)], q, q, peak / target_bf16_flops, target_bw, target_bf16_flops,
                    mem_eff, compute_eff, same, measured.name, measured.hbm_bw, token_bytes=kv * dm * 4.0,
                    kernel="FlashAttention-3", layout=f"{q} query / {kv} KV heads of {dm}",
                    kv_units=max(hkv * d, 1e-9) / (kv * dm))


def mla_decode_table(tables: OpTables | None, heads: float, target_bf16_flops: float, target_bw: float,
                     mem_eff: float, compute_eff: float) -> TableMLA | None:
    """The FlashMLA decode table for ``heads`` query heads per GPU, or None when none was measured."""
    if tables is None or not tables.mla_decode or heads <= 0:
        return None
    # the smallest measured count at or above ``heads`` (FlashMLA pads heads to its tile), else the largest
    near = min((h for h in tables.mla_decode if h >= heads), default=max(tables.mla_decode))
    measured = get_hardware(tables.gpu)
    peak = measured.bf16_tflops * 1e12
    same = peak == target_bf16_flops and measured.hbm_bw == target_bw
    return TableMLA(tables.mla_decode[near], heads, near, peak / target_bf16_flops, target_bw, target_bf16_flops,
                    mem_eff, compute_eff, same, measured.name, measured.hbm_bw)
