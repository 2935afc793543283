"""The pieces of the replay forwards measured beside them, in the bench's own process (issue 23).

``costmodels/replay_segments.py`` prices a resumed-chunk forward from its pieces (embedding, each layer's step, the
end with the logits). ``SegmentProbe`` builds every distinct piece the policies of one workload run, at the exact
shapes of their prepared steps, and measures them in the timed rounds of the forwards (``Timer.interleaved`` calls
``sample`` after every round): the host's speed on the lent VM moves between processes and minutes by more than the
5 pp target, so the host terms must be taken where and when the forwards run. Per piece and round:

- host seconds of one call, issued while the device still runs a spin kernel (``torch.cuda._sleep``) long enough to
  cover it, so the host never waits on the device;
- device seconds of the same call between two events around it: every kernel is queued when the spin ends, so this
  is the piece's eager device time with the host ahead.

- back to back (``sample_b2b``, every round after the isolated samples): each policy's forward issued piece after piece
  in its own order, one spin covering the whole forward's host time, the host clock read and an event recorded after
  each piece: the piece's host seconds when issued right after its neighbour (a forward issued its pieces 2-15% faster
  than the same pieces timed one by one after a synchronize, run_d1473e5) and its device seconds between the events.
  Kept beside the isolated samples (``b2b_rounds``, ``host_b2b_s``); the isolated ones stay the default.

``trace`` then runs every piece once under the profiler: each kernel's launch (the end of its launch call) as a
fraction of the piece's host time, and its share of the device time (correlated launch and kernel records of the
exported trace). On the CPU (the smoke mode) a call's wall time is both its host and device time.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import tempfile
import time

import torch

from executor.swa_replay import SWAReplay

_CLOCK = []   # [a reader of the SM clock] where NVML answers quickly, [None] where not (checked once)


def _clock_reader():
    """NVML's SM clock of the current device: one handle, then one query per read (``torch.cuda.clock_rate`` calls
    ``nvmlInit`` and looks the device up on every call); None where it fails or a read costs over 2 ms."""
    try:
        import pynvml
        handle = torch.cuda._get_pynvml_handler(torch.cuda.current_device())

        def read():
            return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # noqa: BLE001 - older torch or no pynvml: the public call
        read = torch.cuda.clock_rate
    try:
        read()   # the first read may initialise NVML: time the second
        t0 = time.perf_counter()
        read()
        return read if time.perf_counter() - t0 < 2e-3 else None
    except Exception:  # noqa: BLE001 - no NVML bindings, no GPU: no clock diagnostic
        return None


def sm_clock_mhz() -> float | None:
    """The GPU's SM clock now (NVML), read outside any timed window: the lent H200 runs at 1980 MHz in short bursts
    and 1550-1850 MHz under its 700 W cap in long ones (run_e570346's gpu_clocks.csv), which moves device times by
    up to 15%. None without NVML or a GPU."""
    if not _CLOCK:
        _CLOCK.append(_clock_reader() if torch.cuda.is_available() else None)
    try:
        return float(_CLOCK[0]()) if _CLOCK[0] else None
    except Exception:  # noqa: BLE001
        return None


SPIN_MARGIN_S = 300e-6    # spin beyond 1.5x the piece's last host time (the first call: a guess, then measured)
FIRST_HOST_S = 3e-3


def piece_key(kind: str, prep, j: int = -1) -> str:
    """What a piece's cost depends on: rows in, rows the layer runs, and each prefill's rows / context / keys."""
    rows0 = int(prep.batch.input_ids.shape[0])
    if kind != "layer":
        return f"{kind}|{rows0}|{prep.rows}"
    idx, view = prep.views[j]
    spans = ",".join(f"{p.num}:{p.context_len}:{p.kv_len}:{p.key_start}" for p in view.prefills)
    return f"layer{j}|{rows0}|{'all' if idx is None else int(idx.shape[0])}|{spans}"


class SegmentProbe:
    """Every distinct piece of one workload's forwards (module docstring); ``forwards``: policy -> its prepared
    chunks in order (``SWAReplay.prepare``'s ``PreparedStep``)."""

    def __init__(self, model, kv, device: torch.device, forwards: dict[str, list]):
        self.cuda = device.type == "cuda"
        self.model, self.kv, self.forwards = model, kv, forwards
        self.timelines: dict[str, dict] = {}
        self.fns: dict[str, callable] = {}
        self.plan: dict[str, list[str]] = {}
        hidden = model.model.embed_tokens.weight.shape[1]
        dt = model.model.embed_tokens.weight.dtype
        xs: dict[int, torch.Tensor] = {}
        g = torch.Generator(device=device).manual_seed(0)
        for name, preps in forwards.items():
            keys = []
            for prep in preps:
                r0 = int(prep.batch.input_ids.shape[0])
                if r0 not in xs:   # the hidden states a layer step reads (values do not change its time)
                    xs[r0] = torch.randn(r0, hidden, generator=g, device=device).to(dt)
                x = xs[r0]
                keys.append(self._add(piece_key("embed", prep), lambda p=prep: SWAReplay.embed(model, p)))
                for j in range(len(prep.views)):
                    keys.append(self._add(piece_key("layer", prep, j),
                                          lambda p=prep, j=j, x=x: SWAReplay.layer_step(model, p, kv, j, x)))
                keys.append(self._add(piece_key("end", prep),
                                      lambda p=prep, x=x: model.compute_logits(SWAReplay.finish(model, p, x)[-1:])))
            self.plan[name] = keys
        self.samples: dict[str, list[tuple[float, float, bool, float | None]]] = {k: [] for k in self.fns}
        # back to back: chains of (key or None: a neighbour issued but not recorded, fn) in the forward's order
        self.chains: list[list[tuple[str | None, callable]]] = [[(k, self.fns[k]) for k in keys]
                                                                for keys in self.plan.values()]
        self.b2b: dict[str, list[list]] = {k: [] for k in self.fns}   # key -> per round [(host, device), ...]
        self.traces: dict[str, dict] = {}
        self.error: str | None = None
        self.spin_rate = self._spin_rate() if self.cuda else 0.0

    def _add(self, key: str, fn) -> str:
        self.fns.setdefault(key, fn)
        return key

    # ------------------------------------------------------------------ timing
    def _spin_rate(self) -> float:
        """Spin-kernel cycles per second (``torch.cuda._sleep`` counts GPU clock cycles)."""
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        a.record()
        torch.cuda._sleep(20_000_000)
        b.record()
        b.synchronize()
        return 20_000_000 / max(a.elapsed_time(b) / 1e3, 1e-6)

    def once(self, fn, host_guess: float) -> tuple[float, float, bool, float | None]:
        """(host seconds, device seconds, whether the spin covered the host, SM clock MHz just after) of one call."""
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
            return t, t, True, None
        s0, a, b = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        s0.record()
        torch.cuda._sleep(int((1.5 * host_guess + SPIN_MARGIN_S) * self.spin_rate))
        a.record()
        t0 = time.perf_counter()
        fn()
        host = time.perf_counter() - t0
        b.record()
        b.synchronize()
        return host, a.elapsed_time(b) / 1e3, s0.elapsed_time(a) / 1e3 > host, sm_clock_mhz()

    def sample(self) -> None:
        """One (host, device) sample of every piece (called after every round of the timed forwards), isolated, then
        back to back (``sample_b2b``)."""
        for key, fn in self.fns.items():
            xs = self.samples[key]
            guess = max((x[0] for x in xs[-3:]), default=FIRST_HOST_S)
            xs.append(self.once(fn, guess))
        self.sample_b2b()

    def chain_once(self, chain: list, host_guess: float) -> list[tuple[float, float]]:
        """(host seconds, device seconds) of each piece of ``chain`` issued back to back after one spin that covers
        them all (on the CPU: wall seconds, both)."""
        if not self.cuda:
            out, t = [], time.perf_counter()
            for _, fn in chain:
                fn()
                t1 = time.perf_counter()
                out.append((t1 - t, t1 - t))
                t = t1
            return out
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(len(chain) + 1)]
        torch.cuda.synchronize()
        torch.cuda._sleep(int((1.5 * host_guess + SPIN_MARGIN_S) * self.spin_rate))
        evs[0].record()
        ts = [time.perf_counter()]
        for (_, fn), ev in zip(chain, evs[1:]):
            fn()
            ts.append(time.perf_counter())
            ev.record()
        evs[-1].synchronize()
        return [(ts[i + 1] - ts[i], evs[i].elapsed_time(evs[i + 1]) / 1e3) for i in range(len(chain))]

    def sample_b2b(self) -> None:
        """One back-to-back sample of every chain (module docstring); each recorded piece's (host, device) appended to
        this round's list of its key (a piece in several chains: several per round)."""
        got: dict[str, list] = {}
        for chain in self.chains:
            guess = sum(max((x[0] for x in self.samples[k][-3:]), default=FIRST_HOST_S) if k in self.samples
                        else FIRST_HOST_S for k, _ in chain)
            for (key, _), hd in zip(chain, self.chain_once(chain, guess)):
                if key is not None:
                    got.setdefault(key, []).append((round(hd[0], 8), round(hd[1], 8)))
        for key, xs in got.items():
            self.b2b.setdefault(key, []).append(xs)

    # ------------------------------------------------------------------ the pieces inside the forwards
    def timeline(self, reps: int = 5) -> None:
        """Each policy's forward run piece by piece as ``SWAReplay.run`` does, with the host clock read and an event
        recorded after each piece: where the host is when it has issued each piece, and when the device finishes it
        (medians of ``reps``; a diagnostic set next to the isolated pieces: the model assumes a piece issues as fast
        inside the forward as alone, and the device waits show up where a piece's device end lags its host end)."""
        m, kv = self.model, self.kv
        for name, preps in self.forwards.items():
            runs = []
            for _ in range(reps):
                marks: list = []
                if self.cuda:
                    torch.cuda.synchronize()
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                t0 = time.perf_counter()

                def mark():
                    ev = None
                    if self.cuda:
                        ev = torch.cuda.Event(enable_timing=True)
                        ev.record()
                    marks.append((time.perf_counter() - t0, ev))
                for prep in preps:
                    x = SWAReplay.embed(m, prep)
                    mark()
                    for j in range(len(prep.views)):
                        x = SWAReplay.layer_step(m, prep, kv, j, x)
                        mark()
                    m.compute_logits(SWAReplay.finish(m, prep, x)[-1:])
                    mark()
                if self.cuda:
                    marks[-1][1].synchronize()
                runs.append(([h for h, _ in marks], [start.elapsed_time(ev) / 1e3 if ev is not None else h
                                                     for h, ev in marks] if self.cuda else [h for h, _ in marks]))
            n = len(runs[0][0])
            self.timelines[name] = {"host_end_s": [statistics.median(r[0][i] for r in runs) for i in range(n)],
                                    "device_end_s": [statistics.median(r[1][i] for r in runs) for i in range(n)]}

    # ------------------------------------------------------------------ kernel placement
    def trace(self) -> None:
        """Each piece once under the profiler: its kernels' launch fractions and device shares (``self.traces``)."""
        if not self.cuda:
            return
        from torch.profiler import ProfilerActivity, profile, record_function
        keys = list(self.fns)
        for fn in self.fns.values():
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i, key in enumerate(keys):
                with record_function(f"twinfer_piece_{i}"):
                    self.fns[key]()
                torch.cuda.synchronize()
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
        finally:
            os.remove(path)
        self.traces = parse_trace(events, {f"twinfer_piece_{i}": k for i, k in enumerate(keys)})

    # ------------------------------------------------------------------ result
    def result(self) -> dict:
        """``{"segments": key -> {host_s, device_s (medians), quartiles, covered, kernels, trace}, "plan": policy ->
        keys}``: ``costmodels.replay_segments.from_measured``'s input."""
        segs = {}
        for key, xs in self.samples.items():
            if not xs:
                continue
            hs, ds = [x[0] for x in xs], [x[1] for x in xs]
            clk = [x[3] for x in xs if x[3]]
            tr = self.traces.get(key, {})
            segs[key] = {"host_s": statistics.median(hs), "device_s": statistics.median(ds),
                         "host_quartiles_s": _quartiles(hs), "device_quartiles_s": _quartiles(ds),
                         "covered": sum(x[2] for x in xs) / len(xs), "samples": len(xs),
                         "clock_mhz": statistics.median(clk) if clk else None,
                         "kernels": len(tr.get("trace", [])), "profiled_host_s": tr.get("host_s"),
                         "profiled_device_s": tr.get("device_s"), "unmatched_launches": tr.get("unmatched"),
                         "trace": tr.get("trace", [])}
            bh = [h for r in self.b2b.get(key, []) for h, _ in r]
            if bh:   # back to back: medians over every sample of every round
                segs[key].update({"host_b2b_s": statistics.median(bh), "host_b2b_quartiles_s": _quartiles(bh),
                                  "device_b2b_s": statistics.median(d for r in self.b2b[key] for _, d in r)})
        rounds = {k: [(round(x[0], 8), round(x[1], 8), x[3]) for x in xs] for k, xs in self.samples.items() if xs}
        b2b = {k: xs for k, xs in self.b2b.items() if xs}
        return {"segments": segs, "plan": self.plan, "rounds": rounds, "b2b_rounds": b2b, "timeline": self.timelines}


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0])
    q = statistics.quantiles(xs, n=4)
    return (q[0], q[2])


DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def parse_trace(events: list[dict], pieces: dict[str, str]) -> dict[str, dict]:
    """key -> {trace: [(launch fraction, device share), ...] in device order, host_s, device_s, unmatched} from a
    chrome trace: the launches inside each piece's annotation, joined to their device records by correlation id."""
    dev = {}
    for e in events:
        if e.get("cat") in DEVICE_CATS and "correlation" in e.get("args", {}):
            dev[e["args"]["correlation"]] = e
    launches = sorted((e for e in events if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})),
                      key=lambda e: float(e["ts"]))
    starts = [float(e["ts"]) for e in launches]
    out = {}
    for e in events:
        key = pieces.get(e.get("name", ""))
        if key is None or e.get("cat") != "user_annotation":
            continue
        t0, dur = float(e["ts"]), max(float(e.get("dur", 0.0)), 1e-9)
        mine = launches[bisect.bisect_left(starts, t0): bisect.bisect_right(starts, t0 + dur)]
        pairs = [(min(1.0, (float(r["ts"]) + float(r.get("dur", 0.0)) - t0) / dur), dev[r["args"]["correlation"]])
                 for r in mine if r["args"]["correlation"] in dev]
        pairs.sort(key=lambda p: float(p[1]["ts"]))
        total = sum(float(d.get("dur", 0.0)) for _, d in pairs)
        trace = [(round(f, 5), round(float(d.get("dur", 0.0)) / total, 6)) for f, d in pairs] if total > 0 else []
        out[key] = {"trace": trace, "host_s": dur * 1e-6, "device_s": total * 1e-6,
                    "unmatched": sum(1 for r in mine if r["args"]["correlation"] not in dev and "aunch" in r.get("name", ""))}
    return out
