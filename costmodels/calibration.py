"""Achievable efficiencies (fractions of datasheet peaks), measured or analytic, interpolated over shape.

A ``CalibrationProfile`` is a JSON file with provenance (which GPU, which kernels, when).
Any table it holds (``tables``) overrides the analytic default of the same name, interpolated
in log space over its shape variable and clamped at the ends. Without a profile,
:meth:`CalibrationProfile.default` derives every number from the H200 measurements in the
hardware catalog (twinfer DOMAIN.md / KERNELS.md) and applies the same fractions to any other
GPU's datasheet ceilings — an assumption the cost model states in its output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator

from twinfer.config import load_model_file
from twinfer.errors import TwinferError

from costmodels.hardware import Hardware, get_hardware, list_hardware
from costmodels.power import PowerReference
from costmodels.op_table import DEFAULT_GEMM_LIBS
from costmodels.step_profile import StepProfile

TABLE_NAMES = ("gemm_mem", "gemm_compute", "attn_decode_mem", "attn_compute")


class EffTable(BaseModel):
    """Efficiency ``y`` (fraction of peak) at shape ``x``; interpolated in log(x), clamped outside."""

    model_config = ConfigDict(extra="forbid")
    x: list[float] = Field(..., min_length=1)
    y: list[float] = Field(..., min_length=1)
    x_is: str = ""

    @field_validator("y")
    @classmethod
    def _same_length(cls, y: list[float], info: ValidationInfo) -> list[float]:
        # a field validator, not a model one: model_post_init (which indexes y by x's order) runs first
        x = info.data.get("x")
        if x is not None and len(x) != len(y):
            raise ValueError(f"x has {len(x)} points but y has {len(y)}: give one efficiency per shape")
        if not all(math.isfinite(v) for v in list(x or []) + y):
            raise ValueError("x and y must be finite numbers")
        return y

    def model_post_init(self, _ctx) -> None:
        order = np.argsort(self.x)
        self._lx = np.log(np.maximum(np.asarray(self.x, dtype=float)[order], 1e-30))
        self._y = np.asarray(self.y, dtype=float)[order]

    def __call__(self, x):
        return np.interp(np.log(np.maximum(x, 1e-30)), self._lx, self._y)


class PrefillChunkTable(BaseModel):
    """Measured seconds of one layer's attention for one prefill chunk: ``new`` query tokens over ``cached``
    earlier tokens plus themselves (causal), at ``heads`` x (``d_qk``, ``d_v``) head dims. One point per
    (new, cached); the points form levels of equal ``cached``.

    Lookup: within a level, piecewise linear in log(new)-log(time); between two levels, linear in ``cached``
    (the keys each query reads grow linearly with it), and beyond the largest level on along the last two levels'
    slope (H200 run 14, FlashAttention-3, 8192 new tokens: 4.56 / 5.50 / 6.41 / 8.29 / 10.05 ms at 0 / 1k / 2k / 4k /
    6k cached, linear in cached; the rectangle ``new x (cached + new)`` at the last level's rate, the rule before,
    gave 12.7 ms at 10k where the slope gives 13.4: a causal kernel skips the masked triangle, so the work is not the
    rectangle), where both levels measured that many new tokens (else the rectangle from the last level). Beyond a level's largest ``new`` the time follows ``new x (cached + new)`` at the last measured point's
    rate (one level only: beyond it too); below the smallest ``new`` the smallest point's time is kept. All are
    flagged ``extrapolated`` (never clamped silently).
    """

    model_config = ConfigDict(extra="forbid")
    new: list[float] = Field(..., min_length=2)
    cached: list[float] = Field(..., min_length=2)
    seconds: list[float] = Field(..., min_length=2)
    heads: int = Field(..., gt=0)
    d_qk: int = Field(..., gt=0)
    d_v: int = Field(..., gt=0)
    x_is: str = ""

    @field_validator("seconds")
    @classmethod
    def _points(cls, sec: list[float], info: ValidationInfo) -> list[float]:
        new, cached = info.data.get("new"), info.data.get("cached")
        if new is None or cached is None:
            return sec
        if not len(new) == len(cached) == len(sec):
            raise ValueError(f"new, cached and seconds must have one entry per point (got {len(new)}, {len(cached)}, {len(sec)})")
        if not all(math.isfinite(v) for v in list(new) + list(cached) + list(sec)):
            raise ValueError("new, cached and seconds must be finite numbers")
        if min(new) <= 0 or min(sec) <= 0 or min(cached) < 0:
            raise ValueError("new and seconds must be > 0 and cached >= 0")
        return sec

    def model_post_init(self, _ctx) -> None:
        levels: dict[float, list[tuple[float, float]]] = {}
        for n, c, t in zip(self.new, self.cached, self.seconds):
            levels.setdefault(float(c), []).append((float(n), float(t)))
        self._levels = sorted((c, np.array(sorted(p))) for c, p in levels.items())
        self._cs = np.array([lv[0] for lv in self._levels])
        self._logs = [(np.log(pts[:, 0]), np.log(pts[:, 1])) for _, pts in self._levels]  # each level's log grids

    def _at_level(self, j: int, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, pts = self._levels[j]
        xs, ys = pts[:, 0], pts[:, 1]
        t = np.exp(np.interp(np.log(n), *self._logs[j]))
        above = n > xs[-1]
        t = np.where(above, ys[-1] * n * (c + n) / (xs[-1] * (c + xs[-1])), t)
        return t, above | (n < xs[0])

    def __call__(self, new, cached) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, extrapolated) for each (new, cached) pair."""
        n = np.maximum(np.asarray(new, dtype=float), 1.0)
        c = np.maximum(np.asarray(cached, dtype=float), 0.0)
        cs = self._cs
        lo = np.clip(np.searchsorted(cs, c, side="right") - 1, 0, len(cs) - 1)
        hi = np.minimum(lo + 1, len(cs) - 1)
        t = np.zeros_like(n)
        ext = (c > cs[-1]) | (c < cs[0])
        # weight of the upper level: linear in cached between the two levels
        w = np.where(hi != lo, (c - cs[lo]) / np.maximum(cs[hi] - cs[lo], 1e-30), 0.0)
        w = np.clip(w, 0.0, 1.0)
        for j in range(len(cs)):
            tj, ej = self._at_level(j, n)
            is_lo, is_hi = lo == j, (hi == j) & (hi != lo)
            t = t + np.where(is_lo, (1 - w) * tj, 0.0) + np.where(is_hi, w * tj, 0.0)
            ext = ext | ((is_lo | is_hi) & ej)
        top = c > cs[-1]
        if top.any():
            t_last, e_last = self._at_level(len(cs) - 1, n)
            rect = t_last * n * (c + n) / (n * (cs[-1] + n))
            if len(cs) >= 2:
                # on along the last two levels' slope in cached (each query reads c more keys), where both levels
                # measured this many new tokens; else (a level extrapolated in new) the rectangle from the last level
                t_prev, e_prev = self._at_level(len(cs) - 2, n)
                slope = np.maximum((t_last - t_prev) / (cs[-1] - cs[-2]), 0.0)
                beyond = np.where(e_last | e_prev, rect, t_last + (c - cs[-1]) * slope)
            else:
                beyond = rect
            t = np.where(top, beyond, t)
        return t, ext


def _sorted_xy(xs: list[float], ys: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """A one-variable table's points as float arrays in ascending x."""
    order = np.argsort(xs)
    return np.asarray(xs, float)[order], np.asarray(ys, float)[order]


def _loglog(m: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Piecewise linear in log(x)-log(y) at ``m`` (> 0; ends held flat: the callers flag and replace them)."""
    return np.exp(np.interp(np.log(m), np.log(x), np.log(y)))


def _xy_points(xs: list[float] | None, sec: list[float], name: str, per: str, distinct: str) -> list[float]:
    """A one-variable table's checks (``name`` -> seconds): one time per point, finite and > 0, distinct x."""
    if xs is None:
        return sec
    if len(xs) != len(sec):
        raise ValueError(f"{name} has {len(xs)} points but seconds has {len(sec)}: give one time per {per}")
    if not all(math.isfinite(v) and v > 0 for v in list(xs) + list(sec)):
        raise ValueError(f"{name} and seconds must be finite numbers > 0")
    if len(set(xs)) != len(xs):
        raise ValueError(f"{distinct} must be distinct")
    return sec


class MoELayerTable(BaseModel):
    """Measured device seconds of one MoE layer's routed experts (routing applied, permutation, the grouped GEMMs and
    their activation, combine: the executor's ``ops.moe_experts`` call) at ``tokens`` tokens routed uniformly at
    random, timed inside a CUDA graph (``executor.calibrate.bench_ops``, ``device_s``), for one expert shape:
    ``experts`` routed experts of ``hidden`` x ``intermediate``, ``top_k`` per token, on one GPU.

    Lookup: piecewise linear in log(tokens)-log(time) between measured counts; beyond the largest, the last segment's
    slope (H200 run 12's table: 8.0 ms at 8192 tokens, where issue 18 measured the fused MoE layer at 8.13 ms), or, where
    it grows less, a reference model of the same layer (the cost model's roofline, ``reference``) at the last point's
    measured/reference ratio (the op tables' rule: a quick calibration's table ends at 64 tokens, where the slope is
    the experts touched still growing); below the smallest the smallest point's time is kept. Both flagged ``extrapolated`` (never
    clamped silently). ``weight_dtype``: the expert weights' dtype it timed (None: tables of runs 11-13, which timed
    the engine's FP8 experts and did not record it)."""

    model_config = ConfigDict(extra="forbid")
    tokens: list[float] = Field(..., min_length=2)
    seconds: list[float] = Field(..., min_length=2)
    experts: int = Field(..., gt=0)
    top_k: int = Field(..., gt=0)
    hidden: int = Field(..., gt=0)
    intermediate: int = Field(..., gt=0)
    weight_dtype: str | None = None
    touched: list[float] | None = Field(None, description="distinct experts each measured count's one random routing "
                                        "touched (None: tables before 2026-12-06, priced on the expected count)")
    x_is: str = ""

    @field_validator("seconds")
    @classmethod
    def _points(cls, sec: list[float], info: ValidationInfo) -> list[float]:
        return _xy_points(info.data.get("tokens"), sec, "tokens", "token count", "tokens")

    @field_validator("touched")
    @classmethod
    def _touched(cls, t: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if t is None:
            return None
        toks = info.data.get("tokens") or []
        if len(t) != len(toks) or not all(isinstance(v, (int, float)) and 0 < v <= info.data.get("experts", float("inf")) for v in t):
            raise ValueError(f"touched: one distinct-expert count in (0, experts] per token count ({len(toks)}), got {t!r}")
        return [float(v) for v in t]

    def model_post_init(self, _ctx) -> None:
        self._x, self._y = _sorted_xy(self.tokens, self.seconds)
        # each measured count's seconds per expert its routing touched: the draw's own count where recorded (one random
        # routing of 10-33 tokens touches up to 7% more or fewer experts than the expectation; H100 run 51's table per
        # expected expert zigzagged 14.7-16.6 us from 10 to 33 tokens, per touched expert it falls smoothly 15.9-15.2)
        if self.touched is not None:
            order = np.argsort(np.asarray(self.tokens, float))
            self._per = self._y / np.asarray(self.touched, float)[order]
        else:
            self._per = self._y / self.experts_touched(self._x)

    def matches(self, experts: int, top_k: int, hidden: int, intermediate: int, weight_dtype: str | None = None) -> bool:
        """Whether the table measured this expert shape and weight dtype (a table prices only the MoE it timed)."""
        if weight_dtype is not None and self.weight_dtype is not None and weight_dtype != self.weight_dtype:
            return False
        return (self.experts, self.top_k, self.hidden, self.intermediate) == (experts, top_k, hidden, intermediate)

    def experts_touched(self, tokens) -> np.ndarray:
        """Expected distinct experts ``tokens`` tokens route to, each choosing ``top_k`` of ``experts`` uniformly."""
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** np.asarray(tokens, float))

    def __call__(self, tokens, reference=None) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, extrapolated) for each token count (0 tokens: 0 seconds). ``reference``: seconds over tokens
        (vectorised) of a model of the same layer, which carries the time beyond the largest count."""
        n = np.asarray(tokens, float)
        pos = n > 0
        m = np.maximum(n, 1e-9)
        # between measured counts: the time per expert touched, log-log in tokens, times the experts the count
        # touches. A decode-sized batch reads one weight set per distinct expert its tokens route to, and that count
        # (uniform routing, as the table timed) bends from t*top_k to all experts well inside one table interval
        # (8 -> 64 tokens: 57 -> 222 of 256); interpolating the seconds themselves over that interval priced 20-32
        # tokens 12-14% short of the same rule through the experts (H200 run 17: graph forwards at batch 20-32 ran
        # 4-8% over their op times, at 64, a table point, on them)
        t = self.experts_touched(m) * _loglog(m, self._x, self._per)
        below = m < self._x[0]
        if below.any():
            t = np.where(below, self._y[0], t)
        above = m > self._x[-1]
        if above.any():
            x1, y1 = self._x[-1], self._y[-1]
            beyond = y1 + (m[above] - x1) * max((y1 - self._y[-2]) / (x1 - self._x[-2]), 0.0)
            if reference is not None:
                r = np.asarray(reference(np.array([x1, *m[above]])), float)
                beyond = np.minimum(beyond, y1 * r[1:] / max(r[0], 1e-30))
            t = t.copy()
            t[above] = beyond
        return np.where(pos, t, 0.0), pos & (above | (m < self._x[0]))


class SampleTable(BaseModel):
    """Measured seconds of the executor's sampler (``ops.sample``: temperature, top-k/top-p, one host generator per
    request, as serving and the step grid run it) over ``batch`` rows of ``vocab`` logits, with the logits GEMM before
    it where ``includes_logits``, timed eagerly (host and device: they run after the forward, serially in a step, so
    their launch is part of the step).

    Lookup: piecewise linear in batch between measured batches (the sampler's cost is affine in rows: a fixed launch
    and per-row work, including the per-request generators on the host); beyond the largest, the last segment's slope;
    below the smallest, the smallest point's time. Both flagged ``extrapolated``; 0 rows: 0 seconds. Timed at
    temperature 0.8: a step whose requests are all greedy runs an argmax instead (``ModelRunner.sample_on_device``),
    which the table over-prices."""

    model_config = ConfigDict(extra="forbid")
    batch: list[float] = Field(..., min_length=2)
    seconds: list[float] = Field(..., min_length=2)
    vocab: int = Field(..., gt=0)
    includes_logits: bool = Field(False, description="the times include the logits GEMM over the rows' hidden states "
                                  "(compute_logits then sample, as a step runs them; calibrations since the table)")
    device_seconds: list[float] | None = Field(None, description="the same calls' device work alone, per batch (launched "
                                                  "behind a spin kernel): what a pipelined loop cannot hide; None where "
                                                  "not measured (calibrations before 2026-12-03's run 25, CPU)")
    x_is: str = ""

    @field_validator("seconds")
    @classmethod
    def _points(cls, sec: list[float], info: ValidationInfo) -> list[float]:
        return _xy_points(info.data.get("batch"), sec, "batch", "batch", "batch sizes")

    @field_validator("device_seconds")
    @classmethod
    def _device_points(cls, sec: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if sec is None:
            return None
        sec = _xy_points(info.data.get("batch"), sec, "batch", "batch", "batch sizes")
        if any(d > t * 1.05 for d, t in zip(sec, info.data.get("seconds") or sec)):
            raise ValueError("device_seconds: each must be at most its eager seconds (the device work is part of them)")
        return sec

    def model_post_init(self, _ctx) -> None:
        self._x, self._y = _sorted_xy(self.batch, self.seconds)
        self._yd = _sorted_xy(self.batch, self.device_seconds)[1] if self.device_seconds is not None else None

    @staticmethod
    def _lookup(x: np.ndarray, y: np.ndarray, rows) -> tuple[np.ndarray, np.ndarray]:
        n = np.asarray(rows, float)
        slope = max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0)
        t = np.where(n > x[-1], y[-1] + (n - x[-1]) * slope, np.interp(n, x, y))
        return np.where(n > 0, t, 0.0), (n > 0) & ((n > x[-1]) | (n < x[0]))

    def __call__(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, extrapolated) for each row count."""
        return self._lookup(self._x, self._y, rows)

    def device(self, rows) -> np.ndarray | None:
        """The device work alone for each row count (never above the eager seconds), or None where not measured."""
        if self._yd is None:
            return None
        return np.minimum(self._lookup(self._x, self._yd, rows)[0], self(rows)[0])


def sample_table(points: list[dict]) -> SampleTable | None:
    """The ``sample`` table from a calibration's ``sample`` points (every CUDA calibration has them); None with fewer
    than two batch sizes."""
    pts = {float(p["batch"]): p for p in points if p.get("op") == "sample" and (p.get("time_s") or 0) > 0}
    if len(pts) < 2:
        return None
    b = sorted(pts)
    p0 = pts[b[0]]
    logits = all(bool(pts[x].get("with_logits")) for x in b)
    dev = [float(pts[x]["device_s"]) for x in b] if all((pts[x].get("device_s") or 0) > 0 for x in b) else None
    if dev is not None:   # a device time timed a little above the eager one is noise: held at the eager seconds
        dev = [min(d, float(pts[x]["time_s"])) for d, x in zip(dev, b)]
    return SampleTable(batch=b, seconds=[float(pts[x]["time_s"]) for x in b], vocab=int(p0["vocab"]), includes_logits=logits,
                       device_seconds=dev,
                       x_is=f"seconds of the executor's {'logits GEMM and ' if logits else ''}sampler over rows "
                            f"(measured eagerly: {'compute_logits, ' if logits else ''}ops.sample, {p0.get('backend', '?')})")


class KvExpandTable(BaseModel):
    """Measured device seconds of one MLA layer building a prefill chunk's keys and values (the executor's
    ``MLAAttention.prefill_expand``: the sequence's cached latents gathered from the pages and up-projected by
    ``kv_b_proj``, BF16) over ``keys`` keys (the chunk's cached context plus its new tokens), for ``heads`` heads of
    ``d_nope`` + ``d_v`` from latent rank ``rank``; launch hidden behind a spin kernel (``device_s``) where every point
    has it, else eager seconds.

    Lookup: piecewise linear in log(keys)-log(time) between measured counts; beyond the largest, the last segment's
    slope (a gather and a GEMM over the keys: linear there); below the smallest, the smallest point's time. Both
    flagged ``extrapolated``; 0 keys: 0 seconds."""

    model_config = ConfigDict(extra="forbid")
    keys: list[float] = Field(..., min_length=2)
    seconds: list[float] = Field(..., min_length=2)
    heads: int = Field(..., gt=0)
    d_nope: int = Field(..., gt=0)
    d_v: int = Field(..., gt=0)
    rank: int = Field(..., gt=0)
    x_is: str = ""

    @field_validator("seconds")
    @classmethod
    def _points(cls, sec: list[float], info: ValidationInfo) -> list[float]:
        return _xy_points(info.data.get("keys"), sec, "keys", "key count", "key counts")

    def model_post_init(self, _ctx) -> None:
        self._x, self._y = _sorted_xy(self.keys, self.seconds)

    def matches(self, heads: int, d_nope: int, d_v: int, rank: int) -> bool:
        """Whether the table timed this MLA shape (a table prices only the layer it measured)."""
        return (self.heads, self.d_nope, self.d_v, self.rank) == (heads, d_nope, d_v, rank)

    def __call__(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, extrapolated) for each key count."""
        n = np.asarray(keys, float)
        x, y = self._x, self._y
        m = np.maximum(n, 1e-9)
        t = _loglog(m, x, y)
        above = m > x[-1]
        t = np.where(above, y[-1] + (m - x[-1]) * max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0), t)
        return np.where(n > 0, t, 0.0), (n > 0) & (above | (m < x[0]))


def kv_expand_table(points: list[dict]) -> KvExpandTable | None:
    """The ``kv_expand`` table from a calibration's ``kv_expand`` points (device seconds where every point timed them,
    else eager); None with fewer than two key counts."""
    pts = {float(p["keys"]): p for p in points if p.get("op") == "kv_expand" and (p.get("time_s") or 0) > 0}
    if len(pts) < 2:
        return None
    k = sorted(pts)
    dev = all((pts[x].get("device_s") or 0) > 0 for x in k)
    p0 = pts[k[0]]
    return KvExpandTable(keys=k, seconds=[float(pts[x]["device_s" if dev else "time_s"]) for x in k], heads=int(p0["heads"]),
                         d_nope=int(p0["d_nope"]), d_v=int(p0["d_v"]), rank=int(p0["rank"]),
                         x_is=f"{'device' if dev else 'eager'} seconds of one MLA layer's prefill key/value expansion over "
                              "keys (measured: executor MLAAttention.prefill_expand, gather + kv_b_proj BF16)")


def _table_kind(v) -> str:
    """Which table a stored ``tables`` entry is, by the fields it carries (an error then names only that kind's
    fields, not every kind's)."""
    keys = v.keys() if isinstance(v, dict) else vars(v).keys() if hasattr(v, "__dict__") else ()
    if "tokens" in keys:
        return "moe_layer"
    if "keys" in keys and "rank" in keys:
        return "kv_expand"
    if "batch" in keys:
        return "sample"
    if "new" in keys or "cached" in keys:
        return "prefill_chunk"
    return "efficiency"


AnyTable = Annotated[Union[Annotated[EffTable, Tag("efficiency")], Annotated[PrefillChunkTable, Tag("prefill_chunk")],
                           Annotated[MoELayerTable, Tag("moe_layer")], Annotated[SampleTable, Tag("sample")],
                           Annotated[KvExpandTable, Tag("kv_expand")]],
                   Discriminator(_table_kind)]


def moe_layer_table(points: list[dict], model: str | None = None, weight_dtype: str | None = None) -> MoELayerTable | None:
    """The ``moe_layer`` table from a calibration's ``moe_experts`` points that timed their device time (``device_s``,
    on CUDA since 056fca2); None with fewer than two such token counts. The expert shape and weight dtype come from the
    points, or, for points that do not record them (runs 11-13), from the catalog model ``model`` and the dtype
    ``weight_dtype`` the calibration measured (None where the catalog does not know the model)."""
    pts = {}
    for p in points:
        if p.get("op") == "moe_experts" and (p.get("device_s") or 0) > 0:
            pts[float(p["tokens"])] = p
    if len(pts) < 2:
        return None
    p0 = next(iter(pts.values()))
    hidden, inter = p0.get("hidden"), p0.get("intermediate")
    if (hidden is None or inter is None) and model is not None:
        from costmodels.catalog import get_model
        try:
            spec = get_model(model)
        except Exception:  # noqa: BLE001 - a model outside the catalog: its shape is unknown here, no table
            return None
        if spec.moe:
            hidden, inter = spec.hidden_size, spec.moe.moe_intermediate_size
    if hidden is None or inter is None:
        return None
    toks = sorted(pts)
    touched = [pts[t].get("touched") for t in toks]
    return MoELayerTable(tokens=toks, seconds=[float(pts[t]["device_s"]) for t in toks], experts=int(p0["experts"]),
                         top_k=int(p0["top_k"]), hidden=int(hidden), intermediate=int(inter),
                         touched=touched if all(isinstance(v, (int, float)) and v > 0 for v in touched) else None,
                         weight_dtype=p0.get("weight_dtype") or weight_dtype,
                         x_is="device seconds of one MoE layer's routed experts over tokens, uniform routing (measured: "
                              "executor ops.moe_experts inside a CUDA graph)")


def _device_or_eager(points: list[dict]) -> tuple[list[float], bool]:
    """Each point's device seconds (``device_s``) where every point has them, else each one's eager ``time_s``; and
    which it was. One table never mixes the two."""
    device = all((p.get("device_s") or 0) > 0 for p in points)
    return [float(p["device_s"] if device else p["time_s"]) for p in points], device


def eff_table(pairs, x_is: str, cap: float | None = 1.0) -> EffTable | None:
    """An efficiency table from (x, efficiency) measurements: the best efficiency at each distinct x (different shapes can
    share an x, e.g. batch x context reading the same KV bytes; the fastest is the kernel's capability), capped at ``cap``."""
    best: dict[float, float] = {}
    for x, y in pairs:
        best[x] = max(best.get(x, 0.0), y if cap is None else min(cap, y))
    if len(best) < 2:
        return None
    xs = sorted(best)
    return EffTable(x=xs, y=[best[x] for x in xs], x_is=x_is)


def linear_tables(points: list[dict], hw_name: str) -> dict[str, EffTable]:
    """``gemm_mem`` over bytes and ``gemm_compute`` over rows from a calibration's ``linear`` points (the executor's
    Linear, K = hidden, N = 2 x hidden); {} with fewer than two. Seconds are the GEMM's device work (``device_s``: a
    CUDA graph of the call replayed back to back, recorded on CUDA since the calibration timed every token bucket) where
    every point has one: the steps run their GEMMs inside decode graphs and piecewise pieces, and their launch is the
    host terms'. Otherwise the eager host-clocked ``time_s`` (earlier calibrations), which carries each call's launch."""
    lin = [p for p in points if p.get("op") == "linear" and (p.get("time_s") or 0) > 0]
    if not lin:
        return {}
    secs, device = _device_or_eager(lin)
    how = ", device seconds in a CUDA graph" if device else ""   # eager: the text earlier profiles carry
    hw = get_hardware(hw_name)
    base = CalibrationProfile.default(hw)
    dtype = lin[0]["dtype"] if lin[0]["dtype"] in ("fp8", "bf16") else "bf16"
    peak = hw.tflops(dtype) * 1e12
    scale = max(base.gemm_compute_eff.values()) / base.gemm_compute_eff.get(dtype, 0.6)  # StepCostModel multiplies by top / max
    out = {"gemm_mem": eff_table([(p["bytes"], p["bytes"] / t / hw.hbm_bw) for p, t in zip(lin, secs)],
                                 f"bytes a GEMM moves (measured: executor Linear{how})"),
           "gemm_compute": eff_table([(p["m"], min(1.0, p["flops"] / t / peak) * scale) for p, t in zip(lin, secs)],
                                     f"GEMM rows M (measured: executor Linear{how})", cap=None)}
    return {k: v for k, v in out.items() if v is not None}


def prefill_chunk_table(points: list[dict]) -> PrefillChunkTable | None:
    """The ``attn_prefill_chunk`` table from a calibration's ``attn_prefill_chunk`` points; None with fewer than two
    distinct shapes or two cached levels. Seconds are each chunk's device time (``device_s``: its launch hidden behind a
    spin kernel, recorded on CUDA since b53416a) where every point has one, as a device-bound step runs the chunk with
    the host ahead (its launch is the per-chunk host term's); otherwise the eager host-clocked ``time_s`` (runs <= 13),
    which carries the launch of each call."""
    chunk = [p for p in points if p.get("op") == "attn_prefill_chunk" and (p.get("time_s") or 0) > 0]
    if len({(p["new"], p["cached"]) for p in chunk}) < 2 or len({p["cached"] for p in chunk}) < 2:
        return None
    secs, device = _device_or_eager(chunk)
    p0 = chunk[0]
    return PrefillChunkTable(
        new=[float(p["new"]) for p in chunk], cached=[float(p["cached"]) for p in chunk], seconds=secs,
        heads=int(p0["heads"]), d_qk=int(p0["d_qk"]), d_v=int(p0["d_v"]),
        x_is=("device seconds (launch hidden behind a spin kernel)" if device else "eager seconds (host clock, launch included)")
        + " of one layer's prefill-chunk attention over new x cached tokens (measured: executor MLA prefill_attend, "
          f"{p0.get('backend', '?')})")


def fp4_reference() -> tuple[float, str]:
    """FP4 GEMM compute efficiency for a GPU without its own FP4 measurement, and where it comes from: the first
    catalog GPU whose ``measured`` block gives a large FP4 GEMM (the B300's published NVFP4 figure), as a fraction of
    that GPU's dense FP4 peak."""
    for hw in list_hardware():
        m = hw.measured
        if m is not None and m.fp4_matmul_tflops and hw.fp4_tflops:
            return m.fp4_matmul_tflops / hw.fp4_tflops, f"{hw.name} FP4 GEMM {m.fp4_matmul_tflops:g} of {hw.fp4_tflops:g} TFLOP/s"
    raise TwinferError("hardware catalog: no GPU's measured block gives fp4_matmul_tflops (the FP4 GEMM efficiency's source)")


class CalibrationProfile(BaseModel):
    """Efficiencies of one GPU kind's kernels. Analytic forms (used when a table is absent):

    - GEMM weight/activation streaming: ``mem_eff * W / (W + gemm_mem_half_bytes)`` of peak HBM
      bandwidth (W: bytes the GEMM reads) — small GEMMs cannot keep HBM busy.
    - GEMM math: ``gemm_compute_eff[dtype] * M / (M + gemm_compute_half_m)`` of the dtype's peak.
    - attention: decode KV streaming from the ``attn_decode_mem`` table; math at ``attn_compute_eff``.
    - communication: ``comm_eff`` of link bandwidth plus a fixed latency per collective (all-to-all:
      ``alltoall_eff`` when a measurement set it).
    - every kernel: ``launch_overhead_s``.
    """

    model_config = ConfigDict(extra="forbid")

    measured_on: str = Field("H200", description="GPU the numbers come from")
    source: str = ""
    created: str = ""
    notes: list[str] = Field(default_factory=list)
    mem_eff: float = Field(..., gt=0, le=1)
    gemm_mem_half_bytes: float = Field(..., ge=0)
    gemm_compute_eff: dict[Literal["bf16", "fp8", "fp4"], Annotated[float, Field(gt=0, le=1)]] = Field(
        ..., description="fraction of each dtype's dense peak a large GEMM reaches, in (0, 1] as the other efficiencies: "
        "bf16 and fp8 required; fp4 optional (absent: FP4 GEMMs run at fp8's fraction)")
    gemm_compute_half_m: float = Field(64.0, ge=0)
    attn_compute_eff: float = Field(..., gt=0, le=1)
    comm_eff: float = Field(0.8, gt=0, le=1)
    alltoall_eff: float | None = Field(None, gt=0, le=1, description="all-to-all's own fraction of scale-up bandwidth "
                                       "(measured by benchmarks/ep_bench.py); None: comm_eff")
    allreduce_latency_s: float = Field(10e-6, ge=0)
    alltoall_latency_s: float = Field(20e-6, ge=0)
    alltoall_scaleout_latency_s: float = Field(40e-6, ge=0)
    p2p_latency_s: float = Field(10e-6, ge=0)
    # DeepEP internode normal kernels (costmodels.comm.internode_normal_time); docs/ep.md, tests/test_deepep_published.py
    deepep_rdma_eff: float = Field(0.87, gt=0, le=1, description="fraction of the NIC rate DeepEP's internode normal "
                                   "kernels reach on the wire: DeepEP README (V1 table, H800 + CX7 400 Gb/s), EP32 dispatch "
                                   "58 GB/s over 3.61 nodes a token reaches = 43.5 GB/s to its 2.71 remote nodes, / 50 GB/s")
    deepep_nvl_eff: float = Field(0.765, gt=0, le=1, description="fraction of the scale-up rate DeepEP's NVLink forwarding "
                                  "reaches, counting every row a rank receives: DeepEP README intranode EP8 dispatch 153 GB/s "
                                  "of the H800's 200 GB/s per direction")
    deepep_normal_sms: int = Field(24, ge=0, le=1024, description="SMs DeepEP's normal (prefill) kernels hold while they "
                                   "run beside compute: DeepEP README Buffer.set_num_sms(24) and tests/test_internode.py "
                                   "num_sms = 24 (the DeepSeek-V3 report dedicates 20 SMs in training)")
    deepep_ll_sms: int = Field(0, ge=0, le=1024, description="SMs DeepEP's low-latency (decode) kernels hold under "
                               "two-micro-batch overlap: 0, DeepEP README: with the receiving hook the RDMA traffic runs in "
                               "the background without costing any SMs")
    launch_overhead_s: float = Field(3e-6, ge=0)
    op_tables: str | None = Field(None, description="GPU whose measured op tables (costmodels/data/op_tables/<gpu>) price "
                                  "dense FP8 GEMMs (scaled by datasheet rooflines on other NVIDIA GPUs); None: the GEMM ramp")
    op_table_libs: dict[Literal["fp8_gemm"], Literal["deepgemm", "triton"]] = Field(
        default_factory=dict, description="kernel library whose op-table rows price an op, as the measured engine ran it "
        "(twinfer calibrate records the registry's choice); absent: DeepGEMM, what a tuned serving engine runs")
    tables: dict[str, AnyTable] = Field(
        default_factory=dict, description="efficiency tables over one shape variable (EffTable); ``attn_prefill_chunk``: "
        "seconds of one prefill chunk's attention over new x cached tokens (PrefillChunkTable); ``moe_layer``: device "
        "seconds of one MoE layer's routed experts over tokens (MoELayerTable); ``sample``: seconds of the executor's "
        "sampler over rows (SampleTable); ``kv_expand``: device seconds of one MLA layer building a prefill chunk's "
        "keys and values from its cached latents, over keys (KvExpandTable)")
    # measured profiles (twinfer calibrate): where the numbers come from, the op micro-benchmarks
    # behind ``tables``, and the measured step model of one engine (costmodels.step_profile)
    provenance: dict = Field(default_factory=dict, description="GPU, driver, torch, kernel backends, date, command")
    op_points: list[dict] = Field(default_factory=list, description="op micro-benchmark measurements behind the tables")
    step: StepProfile | None = Field(None, description="measured step-time model of one engine on this device")
    power_ref: PowerReference | None = Field(None, description="the board's reference loops under its power limit "
                                             "(costmodels.power; twinfer calibrate on a GPU since 2026-12-05)")
    replay_grid: dict | None = Field(None, description="a replay_grid.json (benchmarks/gpu/replay_grid.py) measured on one "
                                     "model, read by costmodels.replay_grid.for_profile; None: replay priced analytically")

    @field_validator("gemm_compute_eff")
    @classmethod
    def _gemm_dtypes(cls, v: dict[str, float]) -> dict[str, float]:
        """The dtypes the cost model looks up: bf16 (BF16 and TF32 GEMMs) and fp8 (FP8, and FP4 without its own)."""
        missing = [d for d in ("bf16", "fp8") if d not in v]
        if missing:
            raise ValueError(f"{' and '.join(missing)} missing; give the fraction of the dense peak a "
                             "large GEMM reaches for bf16 and fp8 (fp4 optional: absent, FP4 runs at fp8's), each in (0, 1]")
        return v

    @field_validator("step", mode="before")
    @classmethod
    def _step_rev(cls, v):
        """A stored step model written before revisions existed was fitted with revision 0 of the step model."""
        if isinstance(v, dict) and "model_rev" not in v:
            return {**v, "model_rev": 0}
        return v

    @staticmethod
    def measured_libs(op_points: list[dict], dtype: str) -> dict[str, str]:
        """``op_table_libs`` from a calibration's op benchmarks: the backend its FP8 Linear ran ({} for another dtype
        or library, or without a Linear measurement)."""
        lib = next((p.get("backend") for p in op_points if p.get("op") == "linear"), None)
        return {"fp8_gemm": lib} if dtype == "fp8" and lib in ("deepgemm", "triton") else {}

    def gemm_libs(self) -> tuple[str, ...]:
        """Libraries whose FP8 GEMM table prices dense GEMMs, in order: the engine's own first (``op_table_libs``)."""
        own = self.op_table_libs.get("fp8_gemm")
        return (own,) + tuple(x for x in DEFAULT_GEMM_LIBS if x != own) if own else DEFAULT_GEMM_LIBS

    # --- lookups (vectorised over numpy arrays) ---
    @property
    def a2a_eff(self) -> float:
        """Fraction of scale-up bandwidth an all-to-all achieves."""
        return self.alltoall_eff if self.alltoall_eff is not None else self.comm_eff

    def gemm_mem(self, weight_bytes):
        """Fraction of peak HBM bandwidth a GEMM reading ``weight_bytes`` achieves."""
        if "gemm_mem" in self.tables:
            return self.tables["gemm_mem"](weight_bytes)
        w = np.asarray(weight_bytes, dtype=float)
        return self.mem_eff * w / (w + self.gemm_mem_half_bytes + 1e-30)

    def gemm_compute(self, m, dtype: str):
        """Fraction of the dtype's peak a GEMM with ``m`` rows achieves."""
        top = self.gemm_compute_eff.get(dtype, self.gemm_compute_eff["fp8"])   # fp4 without its own: fp8's (_gemm_dtypes)
        if "gemm_compute" in self.tables:
            return self.tables["gemm_compute"](m) * top / max(self.gemm_compute_eff.values())
        m = np.asarray(m, dtype=float)
        return top * m / (m + self.gemm_compute_half_m + 1e-30)

    def attn_mem(self, kv_bytes):
        """Fraction of peak HBM bandwidth attention achieves reading ``kv_bytes`` of KV in one kernel."""
        if "attn_decode_mem" in self.tables:
            return self.tables["attn_decode_mem"](kv_bytes)
        return self.gemm_mem(kv_bytes)

    def expert_mem(self, byts):
        """Fraction of peak HBM bandwidth one MoE layer's routed experts achieve moving ``byts`` (touched expert
        weights): the measured grouped-GEMM table when the profile has one, else the GEMM ramp."""
        if "expert_mem" in self.tables:
            return self.tables["expert_mem"](byts)
        return self.gemm_mem(byts)

    def attn_prefill_compute(self, tokens):
        """Fraction of the BF16 peak a causal prefill attention kernel of ``tokens`` keys achieves (measured table,
        else the flat ``attn_compute_eff``)."""
        if "attn_prefill_compute" in self.tables:
            return self.tables["attn_prefill_compute"](tokens)
        return np.full(np.shape(tokens), self.attn_compute_eff, dtype=float)

    def attn_compute(self, tokens=None):
        if "attn_compute" in self.tables and tokens is not None:
            return self.tables["attn_compute"](tokens)
        return self.attn_compute_eff

    def calibration_host_probe_s(self) -> float | None:
        """The calibration's host probe (median of those it recorded), None before them: ``host_probe_reference``."""
        return host_probe_reference(self.provenance)

    def at_host_speed(self, ratio: float) -> "CalibrationProfile":
        """This profile with its step model's host terms on a host ``ratio`` times as slow (``StepProfile.
        at_host_speed``); the device terms and tables as measured. Itself at 1 or without a step model."""
        if self.step is None or float(ratio) == 1.0:
            return self
        return self.model_copy(update={"step": self.step.at_host_speed(ratio)})

    # --- files ---
    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.model_dump(), indent=1) + "\n", encoding="utf-8")

    @staticmethod
    def load(path: str | Path) -> "CalibrationProfile":
        return load_model_file(CalibrationProfile, path)

    @staticmethod
    def default(hw: Hardware | None = None) -> "CalibrationProfile":
        """Analytic defaults fitted to the H200 measurements (the catalog's ``measured`` block)."""
        ref = get_hardware("H200")
        m = ref.measured
        bw = ref.hbm_bw
        mem_eff = m.copy_tbps * 1e12 / bw                      # 4.11 / 4.8 = 0.856
        # Two measured memory-bound GEMMs fix the half-saturation size of the bandwidth ramp:
        #   BF16 64x7168x2048 in 38 us (DOMAIN.md) and DeepGEMM masked grouped FP8, 8 experts
        #   x 4096x7168 in 91 us (KERNELS.md). Each gives W_half = W * (mem_eff / eff - 1).
        sg = m.small_gemm
        w1 = 2.0 * (sg["m"] * sg["k"] + sg["k"] * sg["n"] + sg["m"] * sg["n"])
        e1 = w1 / (sg["time_us"] * 1e-6) / bw
        gg = m.deepgemm_masked_grouped
        w2 = 1.0 * gg["experts"] * gg["n"] * gg["k"]
        e2 = w2 / (gg["time_us"] * 1e-6) / bw
        half = float(np.sqrt(w1 * (mem_eff / e1 - 1) * w2 * (mem_eff / e2 - 1)))  # geometric mean of the two fits
        ceff = {
            "bf16": m.bf16_matmul_tflops / ref.bf16_tflops,                      # 741 / 989
            "fp8": max(m.fp8_matmul_tflops, m.deepgemm_fp8_tflops or 0) / ref.fp8_tflops,  # 1310 / 1979
        }
        # FP4 has its own efficiency (not the FP8 fraction of its higher peak): the catalog's published FP4 GEMM
        ceff["fp4"], fp4_src = fp4_reference()
        # FlashMLA decode on the H200 (KERNELS.md): KV bytes read -> achieved TB/s; the 8 GB point is
        # FlashMLA's published ~3000 GB/s on H800 (~0.9 of 3.35 TB/s), derated to 0.8: an assumption.
        pts = sorted((p["kv_bytes"], p["tbps"] * 1e12 / bw) for p in m.flashmla_decode)
        pts.append((8e9, 0.8))
        attn_table = EffTable(x=[p[0] for p in pts], y=[p[1] for p in pts], x_is="KV bytes read by one decode attention kernel")
        notes = [
            f"HBM streaming {mem_eff:.3f} of peak (H200 copy 4.11 TB/s)",
            f"GEMM bandwidth ramp half-saturation {half / 1e6:.0f} MB (fit to two measured small GEMMs)",
            f"GEMM compute bf16 {ceff['bf16']:.3f}, fp8 {ceff['fp8']:.3f} of peak (H200 8192^3 matmuls); fp4 {ceff['fp4']:.3f} "
            f"({fp4_src})",
            "attention math 0.586 of BF16 peak: FlashMLA README, 580 TFLOPS compute-bound on H800 (989 peak)",
            "comm efficiency 0.8 and collective latencies (all-reduce 10 us, all-to-all 20 us in / 40 us across scale-up) are assumptions",
            "kernel launch overhead 3 us per kernel under CUDA graphs: assumption",
        ]
        if hw is not None and hw.name.lower() != "h200":
            notes.append(f"efficiencies measured on H200, applied to {hw.name} datasheet ceilings (scaled by datasheet ratios)")
        return CalibrationProfile(
            measured_on="H200", source=m.source, created="analytic defaults", notes=notes,
            mem_eff=mem_eff, gemm_mem_half_bytes=half, gemm_compute_eff=ceff, gemm_compute_half_m=64.0,
            attn_compute_eff=580.0 / 989.0, tables={"attn_decode_mem": attn_table}, op_tables="H200",
        )


def host_probe_reference(provenance: dict | None, key: str = "host_probe_s") -> float | None:
    """The median of a calibration's host probes (``provenance.host_probe_s``: start, after the grid, end; ``key``
    ``issue_probe_s``: the issue probe's, ``executor/host_probe.py``), the reference serving's probes are read
    against; None in profiles from before they were recorded."""
    got = (provenance or {}).get(key)
    vals = [float(v) for v in (got.values() if isinstance(got, dict) else ()) if isinstance(v, (int, float)) and v > 0]
    return float(np.median(vals)) if vals else None


# the host probes of one calibration agree within this on a quiet host (H100 runs 47, 49, 50: 0.6-5%); past it the
# host's speed moved while the grid was timed (runs 48, 51, 52: 94%, 232%, 90% apart, e.g. 146 / 357 / 486 us), and
# serving's decode steps before a prompt-bearing step ran 7-18% off the model (MAPE) where the quiet hosts' ran 1.5-4%
HOST_PROBE_SPREAD = 0.25


def host_speed_note(probes: dict[str, float], limit: float = HOST_PROBE_SPREAD) -> str | None:
    """A warning when a calibration's host probes (``provenance.host_probe_s``: the same host work timed at its start,
    after the grid and at its end) disagree by more than ``limit`` (slowest over fastest less 1): the host terms were
    fitted on a host whose speed moved. None where they agree, fewer than two were timed, or ``probes`` is not a
    mapping of seconds (a profile from before they were recorded)."""
    if not isinstance(probes, dict):
        return None
    vals = {str(k): float(v) for k, v in probes.items() if isinstance(v, (int, float)) and v > 0}
    if len(vals) < 2:
        return None
    lo, hi = min(vals.values()), max(vals.values())
    if hi / lo - 1.0 <= limit:
        return None
    return (f"the host's speed moved during calibration: the host probe read "
            + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in vals.items())
            + f" ({(hi / lo - 1) * 100:.0f}% apart, > {limit * 100:.0f}%); the host terms were fitted on a moving host and "
              "host-bound steps will be off by as much: calibrate again on a quiet host")
