"""The one SLO syntax, read the same way by the CLI (plan, bench, simulate), config files and the UI.

``ttft_p90=2s,tpot_p90=50ms[,e2e_p90=60s]``: each target names its latency (ttft, tpot, e2e),
the percentile it bounds (p50, p90 or p99, the same for all) and a unit (s, ms, us). Nothing
is implied: ``tpot=50`` once meant a 50-second TPOT, so a number without a unit, or a target
without a percentile, is refused with a message naming the field and what is allowed.

Goodput (a request counts when its own TTFT and TPOT meet the targets) uses the targets; the
verdict "meets the SLO" compares the run's percentile (the ``_pNN`` above) with them, on the steady window as the
planner judges a candidate.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from twinfer.errors import TwinferError

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# a run meets its SLO only if at least this share of the requests it judges finished (planner and simulate alike)
MIN_FINISHED = 0.99
KEYS = ("ttft", "tpot", "e2e")
PERCENTILES = (50, 90, 99)
EXAMPLE = "ttft_p90=2s,tpot_p90=50ms"
_ALLOWED = f"e.g. {EXAMPLE}: keys ttft, tpot, e2e, each with _p50, _p90 or _p99 and a unit s, ms or us"
_PART = re.compile(r"(?P<key>[a-z0-9]+?)(?:_p(?P<pct>[0-9]+))?\s*=\s*(?P<num>[-+0-9.]*(?:e[-+]?[0-9]+)?)\s*(?P<unit>[a-z]*)")


@dataclass(frozen=True)
class SLOSpec:
    """Latency targets in seconds and the percentile they bound."""

    ttft_s: float | None  # None only where a command asks for fewer targets (tune: TPOT alone)
    tpot_s: float | None
    percentile: int = 90
    e2e_s: float | None = None

    def text(self) -> str:
        """The canonical spelling, which ``parse_slo`` reads back to the same spec."""
        return ",".join(f"{k}_p{self.percentile}={_fmt(t)}" for k, t in zip(KEYS, (self.ttft_s, self.tpot_s, self.e2e_s)) if t is not None)

    def targets(self) -> dict:
        """The ``scheduler.metrics.SLO`` mapping (seconds)."""
        out = {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}
        if self.e2e_s is not None:
            out["e2e_s"] = self.e2e_s
        return out

    def meets(self, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None = None) -> bool:
        """Whether latencies at this spec's percentile meet every target (a missing figure does not)."""
        pairs = [(v, t) for v, t in ((ttft_s, self.ttft_s), (tpot_s, self.tpot_s), (e2e_s, self.e2e_s)) if t is not None]
        return all(v is not None and math.isfinite(v) and v <= t for v, t in pairs)


    def verdict(self, metrics) -> tuple[bool, str]:
        """(meets, one line) for a run's metrics (``scheduler.metrics.SimMetrics``: Stat fields with p50/p90/p99).

        Judged as ``twinfer plan`` judges a candidate (``planner.simulate.meets``): on the run's steady window where it
        has one, its percentiles and at least ``MIN_FINISHED`` of its requests finished; else on the whole run. Until
        2026-12-06 the verdict read the whole run's percentiles beside a plan judged on the steady window, and said
        "yes" to a run whose steady TPOT p90 was over its target."""
        p = self.percentile
        w = getattr(metrics, "steady", None)
        src, where = (w, "steady window") if w is not None else (metrics, "whole run")
        got = {k: getattr(getattr(src, f"{k}_s"), f"p{p}") for k in KEYS}
        ok = self.meets(got["ttft"], got["tpot"], got["e2e"])
        parts = [f"{k.upper()} p{p} {_fmt_or_dash(got[k])} (target {_fmt(t)})"
                 for k, t in (("ttft", self.ttft_s), ("tpot", self.tpot_s), ("e2e", self.e2e_s)) if t is not None]
        done = getattr(w, "finished_fraction", None) if w is not None else None
        if done is not None and done < MIN_FINISHED:
            ok = False
            parts.append(f"{100 * done:.1f}% of its requests finished (at least {100 * MIN_FINISHED:g}%)")
        return ok, f"meets the SLO {self.text()}: {'yes' if ok else 'no'} ({where}: {', '.join(parts)})"


def _fmt_or_dash(seconds: float | None) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else _fmt(seconds, 3)


def _fmt(seconds: float, digits: int = 6) -> str:
    """Seconds in the largest unit that keeps a short number (2s, 50ms, 800us)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale or unit == "us":
            return f"{seconds / scale:.{digits}g}{unit}"
    raise AssertionError("unreachable")


def parse_slo(text: str, field: str = "--slo", required: tuple[str, ...] = ("ttft", "tpot")) -> SLOSpec:
    """'ttft_p90=2s,tpot_p90=50ms' -> SLOSpec; a one-line TwinferError naming ``field`` for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise TwinferError(f"{field}: expected an SLO, {_ALLOWED}")
    found: dict[str, float] = {}
    pcts: set[int] = set()
    for part in [p.strip() for p in text.lower().split(",") if p.strip()]:
        key, pct, seconds = _read_part(part, text, field)
        if key in found:
            raise TwinferError(f"{field} {text!r}: {key} is given twice")
        found[key] = seconds
        pcts.add(pct)
    for need in required:
        if need not in found:
            raise TwinferError(f"{field} {text!r}: {need} is required ({_ALLOWED})")
    if len(pcts) > 1:
        raise TwinferError(f"{field} {text!r}: give every target at the same percentile (got p{', p'.join(map(str, sorted(pcts)))})")
    return SLOSpec(ttft_s=found.get("ttft"), tpot_s=found.get("tpot"), percentile=pcts.pop(), e2e_s=found.get("e2e"))


def _read_part(part: str, text: str, field: str) -> tuple[str, int, float]:
    """One 'key_pNN=<number><unit>' -> (key, NN, seconds)."""
    m = _PART.fullmatch(part)
    if not m or m.group("key") not in KEYS:
        raise TwinferError(f"{field} {text!r}: cannot read {part!r}; {_ALLOWED}")
    key, pct, num, unit = m.group("key"), m.group("pct"), m.group("num"), m.group("unit")
    if pct is None:
        raise TwinferError(f"{field} {text!r}: {key} needs its percentile, e.g. {key}_p90={num}{unit or 's'} (p50, p90 or p99)")
    if not num:
        raise TwinferError(f"{field} {text!r}: {key}_p{pct} needs a number and a unit, e.g. {key}_p{pct}=2s")
    if int(pct) not in PERCENTILES:
        raise TwinferError(f"{field} {text!r}: {key}_p{pct}: the percentile must be p50, p90 or p99")
    if not unit:
        raise TwinferError(f"{field} {text!r}: {key}_p{pct}={num} needs a unit (s, ms or us), e.g. {key}_p{pct}={num}s or {key}_p{pct}={num}ms")
    if unit not in UNITS:
        raise TwinferError(f"{field} {text!r}: {key}_p{pct}: unknown unit {unit!r}; allowed: s, ms, us")
    try:
        value = float(num)
    except ValueError:
        raise TwinferError(f"{field} {text!r}: {key}_p{pct}: {num!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise TwinferError(f"{field} {text!r}: {key}_p{pct} must be a positive finite number")
    return key, int(pct), value * UNITS[unit]


def slo_in_mapping(data: dict, where: str, percentile_key: str | None = "slo_percentile") -> SLOSpec | None:
    """A config file's ``slo``: the string syntax is parsed in place into its structured form.

    ``slo: "ttft_p90=2s,tpot_p90=50ms"`` becomes ``slo: {ttft_s: 2, tpot_s: 0.05}`` (plus
    ``slo_percentile: 90`` where the file has that key). The structured form, whose keys carry
    their unit, is left as it is. Returns the parsed spec, or None when there was no string.
    """
    value = data.get("slo")
    if not isinstance(value, str):
        return None
    spec = parse_slo(value, f"{where}: slo")
    if percentile_key and data.get(percentile_key) not in (None, spec.percentile):
        raise TwinferError(f"{where}: slo {value!r} is at p{spec.percentile} but {percentile_key} is {data[percentile_key]!r}; give one")
    data["slo"] = spec.targets()
    if percentile_key:
        data[percentile_key] = spec.percentile
    return spec
