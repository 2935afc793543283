"""Sliding-window resume policies on the executor, measured, next to the cost model's prediction (issue 23).

A GQA model of a few full-width layers (Llama-8B shapes, bf16, dummy weights; three sliding layers with
V4's 128-token window under one full-attention layer) runs prefill chunks that resume after ``c`` cached
tokens through ``executor.swa_replay.SWAReplay`` — the executor's forward for resumed chunks — under
each policy: full recompute (the baseline), bounded replay of W tokens for several W, persist.

Workloads:
- ``prefix_hit``: a request hits a cached prefix of ``c`` tokens and prefills ``n`` new ones (one chunk
  per step, as a prefix-hit-heavy workload resumes request after request);
- ``chunked``: a long prompt prefilled in chunks; every chunk after the first resumes.

Per policy: measured seconds (CUDA events around the forward and the last row's logits from an idle device, inputs
prepared beforehand by ``SWAReplay.prepare``; median of ``--reps``; ``measured_with_inputs_s`` times the host
preparation too; ``measured_host_s`` the host's issue seconds inside the window; ``measured_graph_s`` the same
forward captured in a CUDA graph). All of a workload's policies, with and without inputs and as graphs, are timed in
rotated rounds (``Timer.interleaved``): the lent H200's host speed drifts within seconds, and timing the policies one
after another put that drift between them. A host probe (the tables' decoder-layer host calls, on its own KV pages)
is sampled every round: ``probe_*`` prices with the host speed of the runs. Then predicted seconds (``costmodels.replay.chunk_cost`` / ``prefill_seconds`` on the same model
spec, H200, TP1 bf16), and the prefill throughput change against full recompute, measured and predicted
(``tput / tput_recompute - 1``), with their difference in percentage points. Also: whether the policy
gives the logits of a full recompute (``exact_for_new_tokens``) and the largest logit difference to the
persist run of the same step (bf16), and the window pages each policy keeps per resumed sequence.

Diagnostics: ``sync_warnings`` (the synchronising CUDA calls of one prepared forward and of one preparation,
torch's sync debug mode: none expected) and, last, ``profile`` (one eager forward of a few rows under the profiler:
kernels, busy and idle seconds, gaps).

The reported prediction (``segments_*`` keys, ``headline``; ``benchmarks/gpu/replay_segments.py``,
``costmodels/replay_segments.py``): every piece of every policy's forward (the embedding, each layer's step at its
exact shape, the end with the logits) measured in this process, in the same rounds as the forwards (host issue
seconds with the device kept busy, eager device seconds with the host ahead, the SM clock), and once under the
profiler (where each kernel is launched within the piece's host time); the forward is the queue of those kernels on
one stream fed by one host thread. Changes are compared from the medians of the rounds and paired round by round
(``segments_paired``: each round's forwards against the pieces sampled right after it); ``segments_clocked_paired``
also takes each piece's device time to the clock its forward ran at (a diagnostic: the H200 caps its clock under long
runs). The SM clock after every timed call is in ``measured_clocks_mhz``; the caching allocator's device
allocations during the rounds in ``allocator_during_rounds``.

The prediction at unmeasured shapes (``grid_*`` keys, in ``headline`` beside ``segments``;
``benchmarks/gpu/replay_grid.py``, ``costmodels/replay_grid.py``): the same kinds of pieces measured the same way in
the same rounds (every fourth on the prefix hits, every third on the chunked prompts), but on a grid of shapes that holds out every shape the workloads run (checked:
``grid_error`` otherwise), read off the grid by interpolation (log-log in rows, linear in context, extrapolation
flagged: ``grid_extrapolated``) and queued as ``segments`` is. Every workload's grid is written to
``replay_grid.json`` beside ``--out`` (per workload and pooled: what ``costmodels.replay_grid.load`` reads).

Table-based prediction (``table_*`` keys): before any replay run, the op tables of this executor model are
measured (``benchmarks/gpu/replay_tables.py``: the executor's bf16 Linear, its window/causal prefill attention
call, its row-wise ops and their eager host cost) or loaded (``--tables FILE``), and every chunk is priced from them
by ``costmodels.replay_table`` (the eager forward as a host/device queue). Nothing is fitted to the replay runs.
``table_*`` uses every measured point (the generic grids and the workloads' exact shapes), ``generic_*`` the
generic grids only (interpolated). ``predicted_*`` stays the analytic prediction (the first runs' figure).

Usage: python -m benchmarks.gpu.replay_bench [--out FILE] [--cpu --tiny] [--ws 32,128,384] [--tables FILE | --no-tables]
(JSON to ``--out``, default ``$OUT/replay_bench.json``; tables measured into ``replay_tables.json`` beside it unless
``--tables`` names a file to load). ``--cpu --tiny``: a toy model on the CPU, the smoke mode the CPU test runs (its
times are CPU wall times: nothing to compare with the H200 figures).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback

import torch

from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.model_spec import ModelSpec
from costmodels.replay import LayerReplay, ReplayPolicy, chunk_cost, prefill_seconds, prompt_chunks
from costmodels import replay_segments, replay_table
from costmodels.step import StepCostModel
from benchmarks.gpu.replay_segments import SegmentProbe, sm_clock_mhz
from benchmarks.gpu import replay_grid as grid_bench
from costmodels import replay_grid
from executor.forward_batch import SeqInput
from executor.replay import allocator_counts
from executor.kv_cache import KVCache
from executor.model_config import ExecModelConfig
from executor.swa import ROW_TILE
from executor.swa_replay import SWAReplay, exact_for_new_tokens, kept_blocks
from executor.weights import build_model
from kernels import ops

WINDOW = 128   # DeepSeek-V4's sliding window (config.json sliding_window)


def select_workloads(sh: dict, which: str) -> dict:
    """``shapes()`` with only the workloads ``which`` names: ``all``, ``prefix`` (every prefix hit), ``chunked``, or
    shapes ``C+N`` (prefix hit) / ``P/K`` (chunked prompt), comma-separated. ValueError on a name that matches none."""
    out = dict(sh, prefix_hit=[], chunked=[])
    for tok in [t.strip() for t in (which or "all").split(",") if t.strip()]:
        if tok in ("all", "prefix", "prefix_hit"):
            out["prefix_hit"] += [x for x in sh["prefix_hit"] if x not in out["prefix_hit"]]
        if tok in ("all", "chunked"):
            out["chunked"] += [x for x in sh["chunked"] if x not in out["chunked"]]
        if tok in ("all", "prefix", "prefix_hit", "chunked"):
            continue
        hit = [x for x in sh["prefix_hit"] if f"{x[0]}+{x[1]}" == tok] + [x for x in sh["chunked"] if f"{x[0]}/{x[1]}" == tok]
        if not hit:
            raise ValueError(f"{tok!r} is none of all, prefix, chunked, "
                             + ", ".join([f"{c}+{n}" for c, n in sh["prefix_hit"]] + [f"{p}/{k}" for p, k in sh["chunked"]]))
        for x in hit:
            key = "prefix_hit" if "+" in tok else "chunked"
            if x not in out[key]:
                out[key].append(x)
    if not out["prefix_hit"] and not out["chunked"]:
        raise ValueError("no workload selected")
    return out


def bench_spec(tiny: bool) -> ModelSpec:
    """Three sliding layers under one full-attention layer (the full layer has no window state: the replayed rows
    stop below it, so a recompute's rows meet only windowed attention). Full size: Llama-3.1-8B's layer shapes
    (config.json), 4 layers."""
    if tiny:
        return ModelSpec(name="replay-bench-tiny", family="llama", num_layers=4, hidden_size=64, vocab_size=256,
                         num_attention_heads=4, num_kv_heads=1, head_dim=16, intermediate_size=128, attention="gqa",
                         layer_kinds=["sliding", "sliding", "sliding", "full"], sliding_window=8, max_context=1024)
    return ModelSpec(name="replay-bench-llama8b-4l", family="llama", num_layers=4, hidden_size=4096, vocab_size=32000,
                     num_attention_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336, attention="gqa",
                     layer_kinds=["sliding", "sliding", "sliding", "full"], sliding_window=WINDOW, max_context=32768)


def shapes(tiny: bool) -> dict:
    if tiny:
        return {"prefix_hit": [(32, 8)], "chunked": [(48, 16)], "ws": [4, 8, 24], "page": 8}
    return {"prefix_hit": [(4096, 512), (8192, 2048)], "chunked": [(16384, 2048)], "ws": [32, 128, 384], "page": 64}


def policies(ws: list[int]) -> list[tuple[str, ReplayPolicy]]:
    out = [("recompute", ReplayPolicy(default=LayerReplay(mode="recompute")))]
    out += [(f"replay:{w}", ReplayPolicy(default=LayerReplay(mode="replay", tokens=w))) for w in ws]
    return out + [("persist", ReplayPolicy())]


def workload_calls(spec: ModelSpec, sh: dict, ws: list[int]) -> list:
    """Every eager call the workloads' chunks make under every policy (``costmodels.replay_table.forward_calls`` on
    the measured recipe): the shapes the tables measure exactly, besides their generic grids."""
    from benchmarks.gpu.replay_tables import RECIPE
    out = []
    for _, pol in policies(ws):
        res = pol.resolve(spec)
        parts = [(n, c) for c, n in sh["prefix_hit"]]
        for prompt, chunk in sh["chunked"]:
            parts += prompt_chunks(prompt, chunk)
        for n, c in parts:
            out += replay_table.forward_calls(RECIPE, ROW_TILE, spec, res, n, c)
    return out


class Predictors:
    """The table-based predictions next to the analytic one: every measured point (``table``), the generic grids
    only (``generic``), and every point with the host speed of a probe taken beside the runs (``probe``: the same
    layer calls the tables' host section times, sampled in every round of the timed runs)."""

    def __init__(self, doc: dict | None):
        self.tabs = {}
        if doc:
            self.tabs = {"table": replay_table.from_dict(doc), "generic": replay_table.from_dict(doc, ("grid", "both"))}

    def chunk(self, spec: ModelSpec, resolved, parts: list[tuple[int, int]], probe: dict | None = None) -> dict:
        """``{prefix}_predicted_s`` etc. of the chunks ``parts`` run back to back, per table set; errors recorded."""
        out = {}
        tabs = dict(self.tabs)
        if probe and "table" in tabs:
            tabs["probe"] = tabs["table"].with_host(probe)
        for name, tab in tabs.items():
            try:
                cost = replay_table.table_prefill_cost(tab, spec, resolved, parts)
                out[f"{name}_predicted_s"] = cost.seconds
                out[f"{name}_device_s"] = cost.device_s
                out[f"{name}_graph_s"] = cost.device_s - cost.gaps_s   # to set next to measured_graph_s
                out[f"{name}_host_s"] = cost.host_s
                out[f"{name}_sources"] = cost.sources
                if name == "table":
                    out["table_by_unit"] = {k: round(v, 9) for k, v in cost.by_unit.items()}
            except Exception as e:  # noqa: BLE001 - a table gap costs this prediction, not the run
                out[f"{name}_error"] = _err(e)
        return out


# ``segments`` first: the prediction the bench reports (the forward's pieces at their shapes, host and device measured
# in the same rounds as the forwards; costmodels/replay_segments.py); the table-based ones beside it
PREDICTIONS = ("segments", "grid", "table", "generic", "probe", "segments_b2b", "grid_iso")
MIN_ROUNDS = 7   # rounds kept even past the deadline (--budget-s)
HEADLINE = "segments"
HEADLINES = ("segments", "grid")   # the pieces at the workloads' own shapes, and read off the held-out grid


class Timer:
    """Device seconds of callables: CUDA events on a GPU, wall time on the CPU, Python's garbage collector held off
    while timing (a collection inside a window lands in it).

    ``interleaved`` times several callables round-robin (the order rotated every round) so that a drift of the
    host's speed during the runs (seen on the lent H200: the same host-bound forward at 5.2 and 7.8 ms minutes
    apart) lands on every policy alike, not on whichever ran during it. Each call also records the host's issue
    seconds (``perf_counter`` from the opening event to the call's return, before the closing event): near the
    window, the forward was host-bound; well below it, device-bound."""

    def __init__(self, device: torch.device, warm: int, reps: int):
        self.cuda, self.warm, self.reps = device.type == "cuda", warm, reps
        self.spread = (0.0, 0.0)
        self.deadline: float | None = None   # time.monotonic() past which rounds stop (after MIN_ROUNDS)

    def once(self, fn) -> tuple[float, float]:
        """(window seconds, host issue seconds) of one call from an idle device."""
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            t = time.perf_counter() - t0
            return t, t
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        t0 = time.perf_counter()
        fn()
        host = time.perf_counter() - t0
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3, host

    def __call__(self, fn) -> float:
        """Median seconds of ``fn`` (``spread``: its quartiles)."""
        st = self.interleaved({"fn": fn})["fn"]
        self.spread = tuple(st["quartiles_s"])
        return st["median_s"]

    def interleaved(self, fns: dict, probe=None, reps: int | None = None) -> dict[str, dict]:
        """name -> {median_s, quartiles_s, host_s (median issue seconds), samples}: ``warm`` rounds, then ``reps``
        rounds each calling every function once, the order rotated by one every round; ``probe.sample()`` after
        each round (the host's speed beside the runs; ``probe`` may be a list: each sampled, one that fails
        keeps its ``error`` and is not sampled again)."""
        names = list(fns)
        for _ in range(self.warm):
            for n in names:
                fns[n]()
        got: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        clocks: dict[str, list[float | None]] = {n: [] for n in names}
        gc.disable()
        try:
            for r in range(reps or self.reps):
                if r >= MIN_ROUNDS and self.deadline is not None and time.monotonic() > self.deadline:
                    break   # the call's time is running out: fewer rounds, every policy's the same number
                k = r % len(names)
                for n in names[k:] + names[:k]:
                    got[n].append(self.once(fns[n]))
                    clocks[n].append(sm_clock_mhz() if self.cuda else None)   # after the window closed
                for pr in [p for p in (probe if isinstance(probe, (list, tuple)) else [probe]) if p is not None]:
                    if getattr(pr, "error", None) is None:
                        try:
                            pr.sample()
                        except Exception as e:  # noqa: BLE001 - a probe's failure drops it, not the timing
                            pr.error = _err(e)
        finally:
            gc.enable()
        out = {}
        for n, xs in got.items():
            ts = [t for t, _ in xs]
            q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
            out[n] = {"median_s": statistics.median(ts), "quartiles_s": (q[0], q[2]),
                      "host_s": statistics.median(h for _, h in xs),
                      "samples": [(round(t, 7), round(h, 7)) for t, h in xs],
                      "clocks_mhz": clocks[n]}
        return out


class Bench:
    def __init__(self, spec: ModelSpec, device: torch.device, dtype: str, page: int, max_tokens: int, timer: Timer,
                 pred: Predictors | None = None, tiny: bool = False):
        self.spec, self.device, self.page, self.timer = spec, device, page, timer
        self.pred = pred or Predictors(None)
        self.profile_jobs: list = []  # (row, its forward): one eager forward under the profiler, last of all
        self.segment_jobs: list = []  # (SegmentProbe, workload record, tokens): its pieces traced after every workload
        self.chunked_reps: int | None = None   # rounds of the chunked prompts (None: the timer's)
        self.cfg = ExecModelConfig.build(spec)
        self.model = build_model(self.cfg, device, dtype, "dummy", seed=0, max_pos=max_tokens + 8)
        pages = -(-max_tokens // page)
        dt = self.model.model.embed_tokens.weight.dtype
        self.kv = KVCache(self.cfg, pages, page, device, dt)
        self.table = list(range(pages))
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, spec.vocab_size, (max_tokens,), generator=g).tolist()
        lay = ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
        self.ops = StepCostModel(spec, get_hardware("h200"), lay)
        self.probe_args = (self.model, self.cfg, device, page, dt, tiny)
        self.probe_error = self.segment_error = None
        self.tiny = tiny
        self.grid_every: int | None = None   # sample the grid every this many rounds (None: no grid)
        self.b2b = True   # also sample the pieces back to back in the forward's order (--no-b2b: off)
        self.lean = False   # time the eager forwards only (no "+inputs" variants, no CUDA graphs): more rounds

    def probe(self):
        """A fresh host probe (its own KV pages) for one workload's rounds; None (and the error kept) if it cannot
        be built: the runs go on without it."""
        from benchmarks.gpu.replay_tables import HostProbe
        try:
            return HostProbe(*self.probe_args)
        except Exception as e:  # noqa: BLE001 - a diagnostic must not cost the runs
            self.probe_error = _err(e)
            return None

    def capture(self, fn):
        """``fn`` captured once in a CUDA graph (the forward's device work without the eager launches, replayed in
        the same rounds as the eager runs: ``measured_graph_s``, next to the tables' ``table_graph_s``); the error's
        text where capture fails."""
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            return g
        except Exception as e:  # noqa: BLE001 - a diagnostic: its failure costs only itself
            torch.cuda.synchronize()
            return _err(e, 200)

    def prepare(self, swa: SWAReplay, n: int, c: int):
        """The host side of one resumed chunk (batch and per-layer views, on the device)."""
        return swa.prepare([SeqInput(self.tokens[c: c + n], c, self.table, False)], [self.tokens], self.kv)

    def chunk(self, swa: SWAReplay, n: int, c: int, prep=None) -> torch.Tensor:
        """One resumed chunk through the executor's forward (``prep``: inputs already prepared); the last row's
        logits (what a step samples)."""
        h = swa.run(self.model, prep or self.prepare(swa, n, c), self.kv)
        return self.model.compute_logits(h[-1:])

    def fill(self, upto: int) -> None:
        """Write the KV of the first ``upto`` tokens (the cached prefix every resume reads)."""
        with torch.inference_mode():
            for n, c in prompt_chunks(upto, 4096):
                self.chunk(SWAReplay(self.spec), n, c)

    def segments(self, forwards: dict):
        """The pieces of every policy's forward (``benchmarks.gpu.replay_segments``), measured in the same rounds
        (isolated, and back to back in each forward's order unless ``b2b`` is off); None (the error kept) if they
        cannot be built."""
        try:
            seg = SegmentProbe(self.model, self.kv, self.device, forwards)
            if not self.b2b:
                seg.chains = []
            return seg
        except Exception as e:  # noqa: BLE001 - the runs go on without it
            self.segment_error = _err(e)
            return None

    def grid(self, seg, every: int | None = None):
        """The grid probe for one workload's rounds (``benchmarks.gpu.replay_grid``), checked to hold out every piece
        the workload runs; None where off, (None, error) where it cannot be built or is not held out."""
        if self.grid_every is None:
            return None, None
        try:
            gp = grid_bench.GridProbe(self, self.tiny, every or self.grid_every)
            if not self.b2b:
                gp.chains = []
            if seg is not None:
                replay_grid.assert_held_out(gp.keys(), seg.plan, [k == "sliding" for k in self.spec.kinds()])
            return gp, None
        except Exception as e:  # noqa: BLE001 - the runs go on without it
            return None, _err(e)

    def timed(self, fns: dict, rows: dict, forwards: dict, reps: int | None = None, grid_every: int | None = None) -> dict:
        """Every policy's forward (prepared inputs) and its forward with the host preparation, interleaved; the
        figures written into ``rows`` (policy -> row); returns the host probe's layer-call seconds and the forwards'
        pieces (``forwards``: policy -> its prepared chunks) measured beside them, and writes the pieces' prediction
        (``segments_*``) into the rows."""
        probe = self.probe()
        seg = self.segments(forwards)
        grid, grid_error = self.grid(seg, grid_every)
        graphs = {name: self.capture(fns[name]) for name in rows} if self.timer.cuda and not self.lean else {}
        fns = fns | {name + "+graph": g.replay for name, g in graphs.items() if not isinstance(g, str)}
        t0 = time.time()
        alloc0 = _alloc_counts(self.timer.cuda)
        res = self.timer.interleaved(fns, [probe, seg, grid], reps)
        alloc = {k: v - alloc0.get(k, 0) for k, v in _alloc_counts(self.timer.cuda).items()}
        for name, row in rows.items():
            st = res[name]
            row.update({"measured_s": st["median_s"], "measured_quartiles_s": st["quartiles_s"],
                        "measured_host_s": st["host_s"], "measured_samples_s": st["samples"],
                        "measured_clocks_mhz": st["clocks_mhz"]})
            st_in = res.get(name + "+inputs")
            if st_in:
                row.update({"measured_with_inputs_s": st_in["median_s"], "measured_with_inputs_host_s": st_in["host_s"]})
            if name in graphs:
                gr = res.get(name + "+graph")
                row["measured_graph_s"] = gr["median_s"] if gr else graphs[name]
        del graphs
        got = probe.result() if probe is not None else {}
        if seg is not None and seg.error is None:
            try:
                seg.timeline()
            except Exception as e:  # noqa: BLE001 - a diagnostic
                seg.timeline_error = _err(e)
        pieces = self.piece_costs(seg, rows, traced=False)   # kernels placed evenly; traced at the end (main)
        return {"_seg": seg, "_grid": grid, "grid_error": grid.error if grid is not None else grid_error,
                "host_probe": {k: {int(r): v for r, v in by.items()} for k, by in got.items()} or None,
                "host_probe_error": probe.error if probe is not None else self.probe_error,
                "segments": pieces, "segment_error": seg.error if seg is not None else self.segment_error,
                "allocator_during_rounds": alloc,
                "timed_at": (round(t0, 3), round(time.time(), 3))}

    def piece_costs(self, seg, rows: dict, traced: bool = True) -> dict | None:
        """The measured pieces (``traced``: their kernels placed under the profiler now, which runs after every timed
        round: a profiler session can slow later eager launches) and each policy's forward priced from them
        (``costmodels.replay_segments``) into its row as ``segments_*``; the pieces' record, or None."""
        if seg is None or seg.error is not None:
            return None
        if traced:
            try:
                seg.trace()
            except Exception as e:  # noqa: BLE001 - without traces the pieces' kernels are spread evenly
                seg.trace_error = _err(e)
        doc = seg.result()
        doc["traced"] = bool(seg.traces)
        doc["timeline_error"] = getattr(seg, "timeline_error", None)
        doc["trace_error"] = getattr(seg, "trace_error", None)
        sync = not self.timer.cuda
        per_round = replay_segments.price_rounds(doc, sync)
        fwd_clocks = {name: row.get("measured_clocks_mhz") for name, row in rows.items()}
        clocked = replay_segments.price_rounds(doc, sync, fwd_clocks)
        for name, cost in replay_segments.price_policies(doc, sync).items():
            if name in rows:
                rows[name].update({"segments_predicted_s": cost.seconds, "segments_device_s": cost.device_s,
                                   "segments_graph_s": cost.device_s, "segments_host_s": cost.host_s,
                                   "segments_wait_s": cost.wait_s, "segments_round_s": per_round.get(name),
                                   "segments_clocked_round_s": clocked.get(name)})
        b2b = b2b_doc(doc)
        if b2b is not None:   # the same pieces with their host seconds issued back to back
            per_round_b2b = replay_segments.price_rounds(b2b, sync)
            for name, cost in replay_segments.price_policies(b2b, sync).items():
                if name in rows:
                    rows[name].update({"segments_b2b_predicted_s": cost.seconds, "segments_b2b_host_s": cost.host_s,
                                       "segments_b2b_round_s": per_round_b2b.get(name)})
        return doc

    def grid_costs(self, grid, head: dict, rows: dict) -> None:
        """Every policy's forward priced off the grid (``costmodels.replay_grid``: the pieces of the workload's plan
        at their features, interpolated; none of them measured) into its row as ``grid_*``; the grid's points into
        ``head["grid"]``."""
        seg = head.get("segments")
        if grid is None or grid.error is not None or not seg:
            if grid is not None and grid.error:
                head["grid_error"] = grid.error
            return
        try:
            pts = grid.points()
            g = replay_grid.ReplayGrid([replay_grid.point_from_dict(p) for p in pts], row_tile=grid.row_tile)
            sliding = [k == "sliding" for k in self.spec.kinds()]
            priced = replay_grid.price_plan(g, seg["plan"], sliding, sync=not self.timer.cuda)
        except Exception as e:  # noqa: BLE001 - a prediction's failure costs only itself
            head["grid_error"] = _err(e)
            return
        head["grid"] = {"points": pts, "every": grid.every, "traced": bool(grid.traces), "row_tile": grid.row_tile,
                        "rounds_at": list(grid.rounds_at), "host": "back to back" if g.b2b else "isolated"}
        for name, (cost, ext) in priced.items():
            if name in rows:
                rows[name].update({"grid_predicted_s": cost.seconds, "grid_device_s": cost.device_s,
                                   "grid_host_s": cost.host_s, "grid_wait_s": cost.wait_s,
                                   "grid_extrapolated": ext})
        if g.b2b:   # the grid's isolated host times beside (what grids before the back-to-back measure gave)
            iso = replay_grid.ReplayGrid(g.points, row_tile=grid.row_tile, b2b=False)
            for name, (cost, _) in replay_grid.price_plan(iso, seg["plan"], sliding, sync=not self.timer.cuda).items():
                if name in rows:
                    rows[name].update({"grid_iso_predicted_s": cost.seconds, "grid_iso_host_s": cost.host_s})

    @torch.inference_mode()
    def prefix_hit(self, pols, c: int, n: int) -> dict:
        swas = {name: SWAReplay(self.spec, pol) for name, pol in pols}
        logits, syncs = {}, {}
        for name, swa in swas.items():   # each policy's logits on a freshly written prefix (a replay rewrites some)
            self.fill(c + n)
            logits[name] = self.chunk(swa, n, c)
            prep = self.prepare(swa, n, c)   # outside the check: its host-to-device copies are the host's share
            syncs[name] = {"forward": sync_events(self.timer.cuda, lambda swa=swa, prep=prep: self.chunk(swa, n, c, prep)),
                           "prepare": sync_events(self.timer.cuda, lambda swa=swa: self.prepare(swa, n, c))}
        self.fill(c + n)
        preps = {name: self.prepare(swa, n, c) for name, swa in swas.items()}
        fns = {name: (lambda swa=swa, p=preps[name]: self.chunk(swa, n, c, p)) for name, swa in swas.items()}
        if not self.lean:
            fns |= {name + "+inputs": (lambda swa=swa: self.chunk(swa, n, c)) for name, swa in swas.items()}
        rows = {}
        for name, swa in swas.items():
            lay = swa.layout(c)
            rows[name] = {"policy": name, "predicted_s": chunk_cost(self.ops, swa.resolved, n, c).seconds,
                          "exact": exact_for_new_tokens(lay, swa.window, c),
                          "kept_window_pages": _window_pages(lay, c, self.page),
                          "layer_rows": [n + int(e) for e in swa.resolved.extra_tokens(c)],
                          "logit_max_abs_diff_vs_persist": float((logits[name] - logits["persist"]).abs().max()),
                          "sync_warnings": syncs[name]}
            self.profile_jobs.append((rows[name], fns[name]))
        # the grid one round in four here (31 rounds: 8 samples), one in three on the chunked prompts (21: 7)
        head = self.timed(fns, rows, {name: [p] for name, p in preps.items()},
                          grid_every=self.grid_every + 1 if self.grid_every else None)
        seg, grid = head.pop("_seg"), head.pop("_grid")
        for name, swa in swas.items():
            rows[name].update(self.pred.chunk(self.spec, swa.resolved, [(n, c)], head["host_probe"]))
        self.grid_costs(grid, head, rows)
        out = {"context": c, "new_tokens": n, **head, "rows": _changes(list(rows.values()), n)}
        self.segment_jobs.append((seg, out, n, grid))
        return out

    @torch.inference_mode()
    def chunked(self, pols, prompt: int, chunk: int) -> dict:
        parts = prompt_chunks(prompt, chunk)
        swas = {name: SWAReplay(self.spec, pol) for name, pol in pols}
        preps = {name: [self.prepare(swa, n, c) for n, c in parts] for name, swa in swas.items()}
        fns = {name: (lambda swa=swa, ps=preps[name]: [self.chunk(swa, n, c, p) for (n, c), p in zip(parts, ps)])
               for name, swa in swas.items()}
        # no "+inputs" variants here: a round of these long forwards costs seconds, and more rounds buy more than the
        # preparation's figure (the prefix hits measure it)
        rows = {}
        for name, swa in swas.items():
            rows[name] = {"policy": name, "predicted_s": prefill_seconds(self.ops, swa.resolved, prompt, chunk),
                          "exact": all(exact_for_new_tokens(swa.layout(c), swa.window, c) for _, c in parts[1:]),
                          "extra_layer_tokens": int(sum(swa.resolved.extra_tokens(c).sum() for _, c in parts))}
        head = self.timed(fns, rows, preps, self.chunked_reps)
        seg, grid = head.pop("_seg"), head.pop("_grid")
        for name, swa in swas.items():
            rows[name].update(self.pred.chunk(self.spec, swa.resolved, parts, head["host_probe"]))
        self.grid_costs(grid, head, rows)
        out = {"prompt": prompt, "chunk": chunk, "chunks": len(parts), **head,
               "rows": _changes(list(rows.values()), prompt)}
        self.segment_jobs.append((seg, out, prompt, grid))
        return out


def b2b_doc(doc: dict) -> dict | None:
    """A ``segments`` record with each piece's host seconds replaced by its back-to-back ones (``host_b2b_s``), and
    each round's by that round's back-to-back median; None where the record has none (runs before 2026-12-03)."""
    segs = doc.get("segments") or {}
    if not segs or not all("host_b2b_s" in s for s in segs.values()):
        return None
    rounds, b2b = doc.get("rounds") or {}, doc.get("b2b_rounds") or {}
    new_rounds = {}
    for k, xs in rounds.items():
        br = b2b.get(k) or []
        new_rounds[k] = [[statistics.median(h for h, _ in br[i]) if i < len(br) and br[i] else x[0], *x[1:]]
                         for i, x in enumerate(xs)]
    return doc | {"segments": {k: s | {"host_s": s["host_b2b_s"]} for k, s in segs.items()}, "rounds": new_rounds}


def _alloc_counts(cuda: bool) -> dict[str, int]:
    """The caching allocator's counts so far (``executor.replay.allocator_counts``; a ``cudaFree`` inside a timed
    forward synchronises the device: none expected once warm)."""
    return allocator_counts(torch.device("cuda")) if cuda else {}


def sync_events(cuda: bool, fn) -> list[str] | None:
    """The synchronising CUDA calls one call of ``fn`` makes (torch's sync debug mode, as warnings): a forward should
    make none (a sync inside it would put the host's later work after the device's earlier work). None on the CPU."""
    if not cuda:
        return None
    from benchmarks.gpu.eager_host import sync_messages
    torch.cuda.synchronize()
    try:
        msgs = sync_messages(fn)
    except Exception as e:  # noqa: BLE001 - a diagnostic
        return [f"(check failed: {type(e).__name__}: {e})"[:160]]
    torch.cuda.synchronize()
    return sorted({m[:160] for m in msgs})


def kernel_profile(fn) -> dict:
    """One eager call of ``fn`` under the profiler: its kernels' count, busy seconds, the span from the first
    kernel's start to the last one's end, the idle time between them (launch gaps and waits on the host), the
    median gap, the gaps over 5 us (the device waiting on the host), and busy seconds by kind of kernel (GEMM,
    attention, other). Set next to ``measured_graph_s`` and the tables' graph and gap terms."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    if not ev:
        return {"kernels": 0}
    gaps = [max(0.0, b[0] - a[1]) for a, b in zip(ev, ev[1:])]
    kinds: dict[str, float] = {}
    for a, b, name in ev:
        low = name.lower()
        k = ("gemm" if any(x in low for x in ("gemm", "nvjet", "cutlass", "xmma", "sm90_")) else
             "attention" if any(x in low for x in ("fmha", "attention", "flash")) else "other")
        kinds[k] = kinds.get(k, 0.0) + (b - a) * 1e-6
    busy = sum(b - a for a, b, _ in ev)
    # where the device waited longest: the gap and the kernels either side (what the host was issuing then)
    top = sorted(range(len(gaps)), key=lambda i: -gaps[i])[:12]
    waits = [(round(gaps[i], 1), ev[i][2][:60], ev[i + 1][2][:60], i + 1) for i in sorted(top) if gaps[i] > 5]
    return {"top_waits_us_before_after_index": waits, "kernels": len(ev), "busy_s": busy * 1e-6, "span_s": (ev[-1][1] - ev[0][0]) * 1e-6,
            "idle_s": sum(gaps) * 1e-6, "median_gap_s": statistics.median(gaps) * 1e-6 if gaps else 0.0,
            "gaps_over_5us": sum(g > 5 for g in gaps), "idle_over_5us_s": sum(g for g in gaps if g > 5) * 1e-6,
            "busy_by_kind_s": kinds}


def _window_pages(layout, c: int, page: int) -> int:
    """Window pages kept per resumed sequence, summed over the sliding layers."""
    return int(sum(b for lay, b in zip(layout, kept_blocks(layout, c, page)) if lay.sliding))


def _changes(rows: list[dict], tokens: int, preds: tuple[str, ...] = PREDICTIONS) -> list[dict]:
    """Throughput and its change against full recompute (the first row), measured and predicted (analytic:
    ``predicted_*``; from the tables: ``table_*``, ``generic_*`` where priced)."""
    base = rows[0]
    for r in rows:
        r["measured_tok_s"] = tokens / r["measured_s"]
        r["predicted_tok_s"] = tokens / r["predicted_s"]
        r["measured_change"] = base["measured_s"] / r["measured_s"] - 1
        r["predicted_change"] = base["predicted_s"] / r["predicted_s"] - 1
        r["diff_pp"] = 100 * (r["measured_change"] - r["predicted_change"])
        if r.get("measured_with_inputs_s") and base.get("measured_with_inputs_s"):
            r["measured_with_inputs_change"] = base["measured_with_inputs_s"] / r["measured_with_inputs_s"] - 1
        paired(r, base)
        for p in preds:
            if f"{p}_predicted_s" in r and f"{p}_predicted_s" in base:
                r[f"{p}_predicted_change"] = base[f"{p}_predicted_s"] / r[f"{p}_predicted_s"] - 1
                r[f"{p}_diff_pp"] = 100 * (r["measured_change"] - r[f"{p}_predicted_change"])
                r[f"{p}_abs_ratio"] = r["measured_s"] / r[f"{p}_predicted_s"]   # measured / predicted seconds
    return rows


def paired(r: dict, base: dict) -> None:
    """The change per timed round, measured (this round's forward against this round's recompute) and predicted from
    the pieces sampled right after that round (``segments_round_s``), and their medians over the rounds: the lent
    host's speed shifts between rounds (run_e570346: every host-bound forward 6 -> 8 ms from round 10 on), and a
    shift lands on both forwards of a round and on that round's pieces alike."""
    ms, mb = r.get("measured_samples_s"), base.get("measured_samples_s")
    if not ms or not mb or len(ms) != len(mb):
        return
    r["measured_change_paired"] = statistics.median(b[0] / m[0] - 1 for m, b in zip(ms, mb))
    for name in ("segments", "segments_clocked", "segments_b2b"):
        ps, pb = r.get(f"{name}_round_s"), base.get(f"{name}_round_s")
        if ps and pb and len(ps) == len(pb) == len(ms):
            r[f"{name}_change_paired"] = statistics.median(b / p - 1 for p, b in zip(ps, pb))
            r[f"{name}_paired_diff_pp"] = 100 * (r["measured_change_paired"] - r[f"{name}_change_paired"])


def summary(out: dict, preds: tuple[str, ...] = PREDICTIONS) -> dict:
    """Per workload and prediction: the replay W values (and persist) within 5 pp of the measured change."""
    res = {}
    for kind in ("prefix_hit", "chunked"):
        for w in out.get(kind, []):
            name = _name(kind, w)
            for p, key in ([("analytic", "diff_pp")] + [(p, f"{p}_diff_pp") for p in preds]
                           + [("segments_paired", "segments_paired_diff_pp"),
                              ("segments_clocked_paired", "segments_clocked_paired_diff_pp")]):
                rows = [r for r in w["rows"][1:] if key in r]
                if rows:
                    res.setdefault(name, {})[p] = {
                        "within_5pp": [r["policy"] for r in rows if abs(r[key]) <= 5],
                        "ws_within_5pp": sum(1 for r in rows if r["policy"].startswith("replay:") and abs(r[key]) <= 5),
                        "max_abs_pp": round(max(abs(r[key]) for r in rows), 2)}
    return res


def headline(out: dict) -> dict:
    """The bench's reported prediction (``HEADLINE``) per workload: W within 5 pp (the issue-23 target: at least 3),
    from the medians of the rounds' times and paired round by round (``paired``), and per policy
    (measured %, predicted %, pp) both ways; ``grid``: the same from the held-out grid (medians), where it ran."""
    res = {"prediction": HEADLINE}
    for kind in ("prefix_hit", "chunked"):
        for w in out.get(kind, []):
            name = _name(kind, w)
            got = {}
            for how, meas, pred, pp in (("medians", "measured_change", f"{HEADLINE}_predicted_change", f"{HEADLINE}_diff_pp"),
                                         ("paired", "measured_change_paired", f"{HEADLINE}_change_paired",
                                          f"{HEADLINE}_paired_diff_pp")):
                rows = [r for r in w["rows"][1:] if pp in r]
                got[how] = {"ws_within_5pp": sum(1 for r in rows if r["policy"].startswith("replay:") and abs(r[pp]) <= 5),
                            "rows": {r["policy"]: (round(100 * r[meas], 1), round(100 * r[pred], 1), round(r[pp], 1))
                                     for r in rows}}
            rows = [r for r in w["rows"][1:] if "grid_diff_pp" in r]
            if rows:   # the prediction at unmeasured shapes (medians: the grid is sampled every few rounds)
                got["grid"] = {"ws_within_5pp": sum(1 for r in rows if r["policy"].startswith("replay:")
                                                    and abs(r["grid_diff_pp"]) <= 5),
                               "rows": {r["policy"]: (round(100 * r["measured_change"], 1),
                                                      round(100 * r["grid_predicted_change"], 1),
                                                      round(r["grid_diff_pp"], 1)) for r in rows},
                               "extrapolated_pieces": {r["policy"]: r.get("grid_extrapolated") for r in w["rows"]}}
            res[name] = got
    return res


def cli_setup(a) -> tuple[torch.device, dict, list[int], ModelSpec] | None:
    """What both replay CLIs (this bench and replay_tables) start from: the device (``--cpu`` or CUDA), the bench's
    shapes (``--tiny``), the replay lengths ``--ws`` (comma-separated, each >= 1; default the bench's) and the model
    spec; the CPU runs one thread (toy shapes: threads only contend). None, with a message on stderr, on bad input."""
    if not a.cpu and not torch.cuda.is_available():
        print("no CUDA device: use --cpu --tiny for the smoke mode", file=sys.stderr)
        return None
    sh = shapes(a.tiny)
    try:
        ws = [int(x) for x in a.ws.split(",")] if a.ws else sh["ws"]
    except ValueError:
        print(f"--ws {a.ws!r}: expected comma-separated token counts", file=sys.stderr)
        return None
    if not ws or min(ws) < 1:
        print(f"--ws {a.ws!r}: token counts must be >= 1", file=sys.stderr)
        return None
    if a.cpu:
        torch.set_num_threads(1)
    return torch.device("cpu" if a.cpu else "cuda"), sh, ws, bench_spec(a.tiny)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "replay_bench.json"))
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (with --tiny: the smoke mode)")
    ap.add_argument("--tiny", action="store_true", help="a toy model and small shapes")
    ap.add_argument("--ws", default=None, help="replay lengths W, comma-separated")
    ap.add_argument("--reps", type=int, default=None, help="timed rounds of the prefix hits (default 31)")
    ap.add_argument("--chunked-reps", type=int, default=None, help="timed rounds of the chunked prompts (default 21)")
    ap.add_argument("--tables", default=None, help="op tables to load (benchmarks/gpu/replay_tables.py); "
                    "default: measure them first into replay_tables.json beside --out")
    ap.add_argument("--no-tables", action="store_true", help="the analytic prediction only")
    ap.add_argument("--no-grid", action="store_true", help="skip the held-out grid of pieces (``grid_*``)")
    ap.add_argument("--grid-every", type=int, default=3, help="sample the grid every this many timed rounds (the prefix "
                    "hits: one more)")
    ap.add_argument("--workloads", default="all", help="which workloads: all, prefix (the prefix hits), chunked, or a "
                    "comma-separated list of shapes (4096+512,8192+2048,16384/2048)")
    ap.add_argument("--no-b2b", action="store_true", help="skip the pieces' back-to-back samples")
    ap.add_argument("--lean", action="store_true", help="time the eager forwards only (no forwards with their input "
                    "preparation, no CUDA graphs): more rounds in the same wall")
    ap.add_argument("--budget-s", type=float, default=None, help="wall seconds this run may take: timed rounds stop "
                    "(after 7) 40 s before, leaving time for the traces and the profile")
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    setup = cli_setup(a)
    if setup is None:
        return 2
    device, sh, ws, spec = setup
    try:
        sh = select_workloads(sh, a.workloads)
    except ValueError as e:
        print(f"--workloads {a.workloads!r}: {e}", file=sys.stderr)
        return 2
    reps = a.reps or (1 if a.cpu else 31)
    need = max([c + n for c, n in sh["prefix_hit"]] + [p for p, _ in sh["chunked"]])
    if not a.no_grid:
        need = max(need, grid_bench.max_tokens(a.tiny))
    dtype = "fp32" if a.cpu else "bf16"
    tables, tables_from = _tables(a, spec, device, dtype, sh, ws, need)
    b = Bench(spec, device, dtype, sh["page"], need, Timer(device, 0 if a.cpu else 3, reps), Predictors(tables), a.tiny)
    b.chunked_reps = a.chunked_reps or (1 if a.cpu else 21)
    b.grid_every = None if a.no_grid else max(1, a.grid_every)
    b.b2b, b.lean = not a.no_b2b, a.lean
    pols = policies(ws)
    if device.type == "cuda":   # what is built so far leaves the collector's generations (timers hold it off)
        gc.collect()
        gc.freeze()
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "model": {"name": spec.name, "layers": spec.kinds(), "hidden": spec.hidden_size, "heads": spec.num_attention_heads,
                     "kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "window": spec.sliding_window},
           "predicted_on": "H200, TP1 bf16 (costmodels.replay.chunk_cost / prefill_seconds)", "reps": reps, "chunked_reps": b.chunked_reps,
           "workloads": a.workloads, "lean": a.lean, "b2b": b.b2b, "grid_every": b.grid_every, "budget_s": a.budget_s,
           "table_predicted_on": ("op tables of this executor model (costmodels.replay_table: eager host/device queue); "
                                  f"{tables_from}"),
           "tables": _tables_head(tables), "policies": [p for p, _ in pols], "prefix_hit": [], "chunked": [], "errors": []}
    cases = [("prefix_hit", lambda c=c, n=n: b.prefix_hit(pols, c, n)) for c, n in sh["prefix_hit"]]
    cases += [("chunked", lambda p=p, k=k: b.chunked(pols, p, k)) for p, k in sh["chunked"]]
    for i, (kind, run) in enumerate(cases):
        if a.budget_s:   # the rounds' time left, shared evenly by the workloads left (one that ends early leaves its)
            now = time.monotonic()
            b.timer.deadline = now + max(0.0, t_start + a.budget_s - 40 - now) / (len(cases) - i)
        try:
            out[kind].append(run())
        except Exception as e:  # noqa: BLE001 - one workload's failure must not lose the others
            traceback.print_exc()
            out["errors"].append(f"{kind}: {type(e).__name__}: {e}"[:300])
        out["summary"] = summary(out)
        _write(a.out, out)
    out["kernels"] = ops.reset_used()   # op -> implementation the forwards ran
    out["probe_error"] = b.probe_error
    _write(a.out, out)
    grid_traces: dict = {}
    with torch.inference_mode():   # after every timed round: the pieces' kernel placement under the profiler
        for seg, w, tokens, grid in b.segment_jobs:
            w["segments"] = b.piece_costs(seg, {r["policy"]: r for r in w["rows"]}) or w.get("segments")
            if grid is not None and grid.error is None:
                if not grid_traces:   # one profiler session for the grid: placement does not depend on the clock
                    try:
                        grid.trace()
                        grid_traces = grid.traces
                    except Exception as e:  # noqa: BLE001 - the kernels spread evenly instead
                        w["grid_trace_error"] = _err(e)
                grid.traces = grid_traces
                b.grid_costs(grid, w, {r["policy"]: r for r in w["rows"]})
            _changes(w["rows"], tokens)
            out["summary"] = summary(out)
            _write(a.out, out)
    b.segment_jobs.clear()
    out["headline"] = headline(out)
    _write(a.out, out)
    _write_grid(os.path.join(os.path.dirname(os.path.abspath(a.out)), "replay_grid.json"), out, spec)
    _print(out)
    if device.type == "cuda":
        for kind in ("prefix_hit", "chunked"):
            for w in out[kind]:
                print(kind, [(r["policy"], r.get("measured_host_s"), r.get("measured_graph_s"), r.get("table_graph_s"))
                             for r in w["rows"]])
        # last: a profiler session can leave hooks that slow later eager launches
        profiled = {"recompute", f"replay:{min(ws)}", "persist"}
        with torch.inference_mode():
            for row, fn in b.profile_jobs:
                if row["policy"] in profiled:
                    try:
                        row["profile"] = kernel_profile(fn)
                    except Exception as e:  # noqa: BLE001 - a diagnostic
                        row["profile"] = _err(e, 200)
                    _write(a.out, out)
                    print("profile", row["policy"], row["profile"])
    return 0


def _tables(a, spec: ModelSpec, device: torch.device, dtype: str, sh: dict, ws: list[int], need: int):
    """(the op tables' dict or None, where they came from): loaded from ``--tables``, else measured now (before any
    replay run) into replay_tables.json beside ``--out``."""
    if a.no_tables:
        return None, "none (--no-tables)"
    if a.tables:
        try:
            with open(a.tables) as f:
                doc = json.load(f)
            replay_table.from_dict(doc)   # fail here, once, on a bad file
            return doc, f"loaded from {a.tables}"
        except (OSError, ValueError) as e:
            print(f"--tables {a.tables}: {e}; continuing with the analytic prediction only", file=sys.stderr)
            return None, f"none ({a.tables}: {e})"[:300]
    from benchmarks.gpu.replay_tables import measure
    path = os.path.join(os.path.dirname(os.path.abspath(a.out)), "replay_tables.json")
    doc = measure(spec, device, dtype, sh["page"], need, path, a.tiny, workload_calls(spec, sh, ws))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return doc, f"measured before the replay runs into {path}"


def _tables_head(doc: dict | None) -> dict | None:
    if not doc:
        return None
    pts = doc.get("points", [])
    return {k: doc.get(k) for k in ("gpu", "date", "host", "layer_host", "sections", "seconds", "method")} | {
        "points": len(pts), "workload_points": sum(1 for p in pts if p.get("origin") == "workload"),
        "eager_timed_points": sum(1 for p in pts if p.get("how") == "eager"), "errors": doc.get("errors", [])[:20]}


def _write_grid(path: str, out: dict, spec: ModelSpec) -> None:
    """``replay_grid.json``: every workload's grid (measured in its rounds) and the pooled table
    (``costmodels.replay_grid.pooled``), with provenance; nothing written where no grid ran."""
    regimes = {}
    for kind in ("prefix_hit", "chunked"):
        for w in out.get(kind, []):
            if w.get("grid", {}).get("points"):
                regimes[_name(kind, w)] = w["grid"]["points"]
    if not regimes:
        return
    try:
        rev = os.popen("git rev-parse HEAD 2>/dev/null").read().strip() or None
    except OSError:
        rev = None
    doc = {"provenance": {"what": "replay forward pieces on a held-out grid of shapes (benchmarks/gpu/replay_grid.py)",
                          "device": out.get("device"), "torch": out.get("torch"), "commit": rev,
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "method": "host: spin-covered issue seconds; device: events with the host ahead; medians "
                                    "over every third timed round of the workload named by the regime"},
           "model": out.get("model"), "window": spec.sliding_window, "layers": spec.kinds(), "row_tile": ROW_TILE,
           "grid": {"rows": grid_bench.GRID_ROWS, "rows_ctx": grid_bench.GRID_ROWS_CTX, "ctx": grid_bench.GRID_CTX,
                    "prior_ctx": grid_bench.PRIOR_CTX},
           "regimes": regimes, "points": replay_grid.pooled(regimes)}
    _write(path, doc)


def _shape(kind: str, w: dict) -> str:
    """A workload's shape: ``context+new`` of a prefix hit, ``prompt/chunk`` of a chunked prompt."""
    return f"{w['context']}+{w['new_tokens']}" if kind == "prefix_hit" else f"{w['prompt']}/{w['chunk']}"


def _name(kind: str, w: dict) -> str:
    return f"{kind} {_shape(kind, w)}"


def _err(e: Exception, limit: int = 300) -> str:
    """An exception as the bench records it: its type and message, cut to ``limit`` characters."""
    return f"{type(e).__name__}: {e}"[:limit]


def _write(path: str, out: dict) -> None:
    """Written after every workload, so a timeout keeps what ran; compact (every round's samples are kept)."""
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))


def _print(out: dict) -> None:
    for kind in ("prefix_hit", "chunked"):
        for w in out[kind]:
            head = {k: v for k, v in w.items() if k not in ("rows", "segments", "grid")}
            print(kind, head)
            for r in w["rows"]:
                line = (f"  {r['policy']:>12}  measured {r['measured_s'] * 1e3:9.3f} ms ({r['measured_change']:+8.1%})  "
                        f"analytic {r['predicted_s'] * 1e3:8.3f} ms ({r['predicted_change']:+8.1%}, {r['diff_pp']:+7.1f} pp)")
                for p in PREDICTIONS:
                    if f"{p}_predicted_change" in r:
                        line += (f"  {p} {r[f'{p}_predicted_s'] * 1e3:8.3f} ms ({r[f'{p}_predicted_change']:+8.1%}, "
                                 f"{r[f'{p}_diff_pp']:+6.1f} pp)")
                    elif f"{p}_error" in r:
                        line += f"  {p}: {r[f'{p}_error'][:60]}"
                print(line + f"  exact={r['exact']}")
    for name, preds in out.get("summary", {}).items():
        print(name, {p: (v["ws_within_5pp"], v["max_abs_pp"]) for p, v in preds.items()}, "(W within 5 pp, max |pp|)")
    for name, h in out.get("headline", {}).items():
        for how, v in (h.items() if name != "prediction" else []):
            print(f"headline ({'grid' if how == 'grid' else out['headline']['prediction']}, {how}) {name}: {v['ws_within_5pp']} W within 5 pp; "
                  "policy: (measured %, predicted %, pp) " + str(v["rows"]))


if __name__ == "__main__":
    sys.exit(main())
