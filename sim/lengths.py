"""Length distributions for workloads: token counts (and seconds, e.g. think time).

Every distribution samples floats, clips them to ``[min, max]`` and, for token counts,
rounds to the nearest integer (``sample``); ``sample_float`` skips the rounding for
durations. ``mean()`` is the mean of the clipped continuous distribution (rounding moves
it by less than half a token). A bare number in a config means ``fixed``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator

from twinfer.errors import TwinferError

# z-score of the 90th percentile of a standard normal (scipy.stats.norm.ppf(0.9))
_Z90 = 1.2815515655446004
_BIG = 1_000_000_000  # default upper clip: larger than any context length

# ints stay ints in a dumped config (a length of 1024, not 1024.0)
Num = Union[int, float]


def _phi(z: float) -> float:
    """Standard normal CDF (handles +-inf)."""
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _pdf(z: float) -> float:
    return 0.0 if math.isinf(z) else math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


class _Dist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def sample_float(self, rng: np.random.Generator, n: int) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer samples (int64), rounded to nearest."""
        return np.rint(self.sample_float(rng, n)).astype(np.int64)

    def mean(self) -> float:  # pragma: no cover
        raise NotImplementedError

    def support(self) -> tuple[float, float]:  # pragma: no cover
        """Smallest and largest value a sample can take."""
        raise NotImplementedError


class FixedLength(_Dist):
    """Always ``value``."""

    kind: Literal["fixed"] = "fixed"
    value: Num = Field(ge=0)

    def sample_float(self, rng, n):
        return np.full(n, float(self.value))

    def sample(self, rng, n):
        return np.full(n, int(round(self.value)), np.int64)

    def mean(self) -> float:
        return float(self.value)

    def support(self):
        return (float(self.value), float(self.value))


class UniformLength(_Dist):
    """Uniform on ``[min, max]`` (integers inclusive when both bounds are integers)."""

    kind: Literal["uniform"] = "uniform"
    min: Num = Field(ge=0)
    max: Num = Field(ge=0)

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g}) must be >= min ({self.min:g})")
        return self

    def sample_float(self, rng, n):
        return rng.uniform(self.min, self.max, n)

    def sample(self, rng, n):
        if float(self.min).is_integer() and float(self.max).is_integer():
            return rng.integers(int(self.min), int(self.max) + 1, n, dtype=np.int64)
        return super().sample(rng, n)

    def mean(self) -> float:
        return (self.min + self.max) / 2.0

    def support(self):
        return (float(self.min), float(self.max))


class LognormalLength(_Dist):
    """Lognormal, given either ``mean`` (of the unclipped distribution) and ``sigma``
    (std of log x), or ``median`` and ``p90``; clipped to ``[min, max]``."""

    kind: Literal["lognormal"] = "lognormal"
    mean_: Num | None = Field(None, gt=0, alias="mean")
    sigma: Num | None = Field(None, gt=0)
    median: Num | None = Field(None, gt=0)
    p90: Num | None = Field(None, gt=0)
    min: Num = Field(1, ge=0)
    max: Num = Field(_BIG, gt=0)

    # the field is ``mean`` in configs; ``mean()`` is the method every distribution has
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    @model_validator(mode="after")
    def _params(self):
        by_mean = self.mean_ is not None or self.sigma is not None
        by_median = self.median is not None or self.p90 is not None
        if by_mean == by_median or (by_mean and (self.mean_ is None or self.sigma is None)) or (
            by_median and (self.median is None or self.p90 is None)
        ):
            raise ValueError("give either mean and sigma, or median and p90")
        if by_median and self.p90 <= self.median:
            raise ValueError(f"p90 ({self.p90:g}) must be > median ({self.median:g})")
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g}) must be >= min ({self.min:g})")
        return self

    def mu_sigma(self) -> tuple[float, float]:
        """Parameters of the underlying normal of log x."""
        if self.mean_ is not None:
            # mean = exp(mu + sigma^2 / 2)
            return math.log(self.mean_) - self.sigma**2 / 2.0, float(self.sigma)
        return math.log(self.median), (math.log(self.p90) - math.log(self.median)) / _Z90

    def sample_float(self, rng, n):
        mu, s = self.mu_sigma()
        return np.clip(rng.lognormal(mu, s, n), self.min, self.max)

    def mean(self) -> float:
        # E[clip(X, a, b)] = a P(X<a) + b P(X>b) + E[X; a<X<b], closed form for a lognormal
        mu, s = self.mu_sigma()
        a, b = float(self.min), float(self.max)
        za = (math.log(a) - mu) / s if a > 0 else -math.inf
        zb = (math.log(b) - mu) / s
        mid = math.exp(mu + s * s / 2.0) * (_phi(zb - s) - _phi(za - s))
        # the closed form loses a few ulps when nearly all mass is clipped: keep it in [a, b]
        return min(max(a * _phi(za) + b * (1.0 - _phi(zb)) + mid, a), b)

    def support(self):
        return (float(self.min), float(self.max))



class _ClippedMean(_Dist):
    """A distribution with a ``mean`` field clipped to ``[min, max]`` (subclasses declare the three)."""

    # the field is ``mean`` in configs; ``mean()`` is the method every distribution has
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g}) must be >= min ({self.min:g})")
        return self


class NormalLength(_ClippedMean):
    """Normal(``mean``, ``std``) clipped to ``[min, max]``."""

    kind: Literal["normal"] = "normal"
    mean_: Num = Field(alias="mean")
    std: Num = Field(ge=0)
    min: Num = Field(1, ge=0)
    max: Num = Field(_BIG, gt=0)

    def sample_float(self, rng, n):
        return np.clip(rng.normal(self.mean_, self.std, n), self.min, self.max)

    def mean(self) -> float:
        m, s, a, b = self.mean_, self.std, float(self.min), float(self.max)
        if s == 0:
            return min(max(m, a), b)
        al, be = (a - m) / s, (b - m) / s
        return min(max(a * _phi(al) + b * (1 - _phi(be)) + m * (_phi(be) - _phi(al)) + s * (_pdf(al) - _pdf(be)), a), b)

    def support(self):
        return (float(self.min), float(self.max))



class ExponentialLength(_ClippedMean):
    """Exponential with ``mean``, clipped to ``[min, max]``: memoryless gaps, e.g. the think time of a
    closed-loop user (a Poisson stream of turns per user)."""

    kind: Literal["exponential"] = "exponential"
    mean_: Num = Field(gt=0, alias="mean")
    min: Num = Field(0, ge=0)
    max: Num = Field(_BIG, gt=0)

    def sample_float(self, rng, n):
        return np.clip(rng.exponential(float(self.mean_), n), self.min, self.max)

    def mean(self) -> float:
        # E[clip(X, a, b)] = integral over [0, inf) of P(clip > x) = a + m (exp(-a/m) - exp(-b/m))
        m, a, b = float(self.mean_), float(self.min), float(self.max)
        return min(max(a + m * (math.exp(-a / m) - math.exp(-b / m)), a), b)

    def support(self):
        return (float(self.min), float(self.max))


class EmpiricalLength(_Dist):
    """Draw from observed ``values`` (optionally ``weights``), or from a CSV column.

    A relative ``csv_path`` is read relative to the working directory.
    """

    kind: Literal["empirical"] = "empirical"
    values: list[Num] | None = None
    weights: list[Num] | None = None
    csv_path: str | None = None
    column: str | None = Field(None, description="CSV header of the values (default: first column)")
    weight_column: str | None = None

    _vals: np.ndarray = PrivateAttr(default=None)
    _cum: np.ndarray = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self):
        if (self.values is None) == (self.csv_path is None):
            raise ValueError("give exactly one of values or csv_path")
        if self.values is not None:
            if self.column or self.weight_column:
                raise ValueError("column and weight_column only apply with csv_path")
            vals = np.asarray(self.values, float)
            w = None if self.weights is None else np.asarray(self.weights, float)
        else:
            if self.weights is not None:
                raise ValueError("with csv_path, give weights as weight_column")
            vals, w = _read_csv(self.csv_path, self.column, self.weight_column)
        if vals.size == 0:
            raise ValueError("values must not be empty")
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ValueError("values must be finite and >= 0")
        if w is None:
            w = np.ones_like(vals)
        if w.shape != vals.shape:
            raise ValueError(f"weights has {w.size} entries but values has {vals.size}")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError("weights must be finite, >= 0 and not all zero")
        self._vals = vals
        cum = np.cumsum(w)
        self._cum = cum / cum[-1]
        return self

    def sample_float(self, rng, n):
        # inverse-CDF lookup: O(n log m), no per-call normalisation of the weights
        idx = np.searchsorted(self._cum, rng.random(n), side="right")
        return self._vals[np.minimum(idx, self._vals.size - 1)]

    def mean(self) -> float:
        p = np.diff(self._cum, prepend=0.0)
        return float(np.dot(p, self._vals))

    def support(self):
        return (float(self._vals.min()), float(self._vals.max()))


def _read_csv(path: str, column: str | None, weight_column: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Read a value column (and optional weight column) from a CSV file with a header."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"csv_path {path!r}: no such file")
    vals: list[float] = []
    ws: list[float] = []
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        col = column or (header[0] if header else None)
        for name in (col, weight_column):
            if name is not None and name not in header:
                raise ValueError(f"{path}: no column {name!r}; columns: {', '.join(header)}")
        if col is None:
            raise ValueError(f"{path}: empty file")
        for row in reader:
            line = reader.line_num
            try:
                vals.append(float(row[col]))
                if weight_column:
                    ws.append(float(row[weight_column]))
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: {col}: not a number") from None
    return np.asarray(vals, float), (np.asarray(ws, float) if weight_column else None)


def _number_means_fixed(v: object) -> object:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return {"kind": "fixed", "value": v}
    return v


LengthDist = Annotated[
    Union[FixedLength, UniformLength, LognormalLength, NormalLength, ExponentialLength, EmpiricalLength],
    Field(discriminator="kind"),
    BeforeValidator(_number_means_fixed),
]


def check_support(dist: _Dist, field: str, lo: float) -> None:
    """Raise if ``dist`` can produce values below ``lo`` (names the field)."""
    if dist.support()[0] < lo:
        raise TwinferError(f"{field}: values must be >= {lo:g}; this distribution can give {dist.support()[0]:g}")
