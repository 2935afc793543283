"""A replay forward priced from measured segments: whole layer calls at their shapes, fed by one host thread.

The replay bench (``benchmarks/gpu/replay_segments.py``) cuts the executor's resumed-chunk forward
(``executor.swa_replay.SWAReplay.run`` and the last row's logits) into the pieces it runs one after another: the
embedding, each layer's step (the layer call on its rows, with a replay's row select and put-back) and the end (final
norm, the new tokens' rows, the logits). It measures every distinct piece at the exact shape a policy runs, in the
same process and the same timed rounds as the forwards it prices (the lent host's speed drifts between processes and
minutes, so host terms taken elsewhere do not transfer):

- ``host_s``: the host's issue seconds of one call (the device busy beforehand, so the host never waits on it);
- ``device_s``: the device seconds of the same call with every kernel already queued (the host ahead): the piece's
  device time as eager launches run it, launch gaps on the device included;
- ``trace``: once, under the profiler, each kernel's launch as a fraction of the piece's host time and its share of
  the piece's device time (the order the host issues work in and what the device does with it).

The forward is then the queue of those kernels, one stream fed by one host thread: kernel k of a piece that the host
starts at ``h`` is issued at ``h + f_k host_s`` and ends at ``F = max(F, h + f_k host_s) + s_k device_s``; the next
piece starts on the host at ``h + host_s``. Where the host issues short kernels slower than the device runs them (a
RoPE's 20 launches, an attention tile's mask) the device waits, even in a forward that is device-bound overall: the
trace places those waits, which a per-piece sum cannot. With every host time zero it is the sum of device times.
Nothing here reads a forward's measured time.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Segment:
    """One measured piece of the forward (module docstring)."""

    host_s: float
    device_s: float
    trace: tuple[tuple[float, float], ...] = field(default=())   # (launch fraction of host_s, share of device_s)

    def kernels(self, fallback: int = 32) -> tuple[tuple[float, float], ...]:
        """The trace, or without one ``fallback`` equal kernels issued evenly over the host time."""
        if self.trace:
            return self.trace
        return tuple(((k + 1) / fallback, 1.0 / fallback) for k in range(fallback))


@dataclass(frozen=True)
class SegmentCost:
    seconds: float    # the queue's end: the forward from an idle device
    host_s: float     # sum of the pieces' host seconds
    device_s: float   # sum of their device seconds (what the device would take with the host always ahead)

    @property
    def wait_s(self) -> float:
        """Seconds the device waits on the host."""
        return self.seconds - self.device_s


def segment_stream(segs: list[Segment], sync: bool = False) -> SegmentCost:
    """The pieces ``segs`` run back to back from an idle device (module docstring). ``sync``: pieces measured where
    calls run synchronously (the CPU), whose device time already holds the host's: their sum."""
    host = sum(s.host_s for s in segs)
    dev = sum(s.device_s for s in segs)
    if sync:
        return SegmentCost(dev, host, dev)
    h = f = 0.0
    for s in segs:
        for frac, share in s.kernels():
            f = max(f, h + frac * s.host_s) + share * s.device_s
        h += s.host_s
    return SegmentCost(f, host, dev)


def from_measured(doc: dict) -> tuple[dict[str, Segment], dict[str, list[str]]]:
    """(key -> Segment, policy -> its forward's segment keys in order) from the bench's ``segments`` record."""
    segs = {}
    for key, s in doc.get("segments", {}).items():
        trace = tuple((float(f), float(d)) for f, d in s.get("trace") or ())
        segs[key] = Segment(float(s["host_s"]), float(s["device_s"]), trace)
    return segs, {p: list(keys) for p, keys in doc.get("plan", {}).items()}


def price_policies(doc: dict, sync: bool = False) -> dict[str, SegmentCost]:
    """Every policy of a bench workload's ``segments`` record priced by ``segment_stream``."""
    segs, plan = from_measured(doc)
    return {p: segment_stream([segs[k] for k in keys], sync) for p, keys in plan.items() if all(k in segs for k in keys)}


def price_rounds(doc: dict, sync: bool = False, clocks: dict[str, list] | None = None) -> dict[str, list[float]]:
    """Every policy priced once per timed round from that round's samples of its pieces (``rounds``: key -> [(host,
    device[, SM MHz]), ...] in round order; the traces as in ``from_measured``): the prediction beside each round's
    forwards. ``clocks``: policy -> the SM clock after each round's forward; with it, each piece's device seconds
    are taken to the forward's clock (x piece MHz / forward MHz: kernel time at a fixed clock count of cycles; the
    H200 caps its clock under long runs), and a policy or round without both clocks is left out."""
    segs, plan = from_measured(doc)
    rounds = doc.get("rounds", {})
    out = {}
    for p, keys in plan.items():
        if not all(k in segs and rounds.get(k) for k in keys):
            continue
        n = min(len(rounds[k]) for k in keys)
        fwd = clocks.get(p) if clocks is not None else None
        if clocks is not None and (not fwd or len(fwd) < n):
            continue
        got = []
        for i in range(n):
            scale = {k: 1.0 for k in keys}
            if clocks is not None:
                mhz = [rounds[k][i][2] if len(rounds[k][i]) > 2 else None for k in keys]
                if not fwd[i] or not all(mhz):
                    got = []
                    break
                scale = {k: float(m) / float(fwd[i]) for k, m in zip(keys, mhz)}
            got.append(segment_stream([Segment(float(rounds[k][i][0]), float(rounds[k][i][1]) * scale[k], segs[k].trace)
                                       for k in keys], sync).seconds)
        if got:
            out[p] = got
    return out
