"""The replay forwards' pieces measured on a grid of shapes, beside the forwards (issue 23).

``costmodels/replay_grid.py`` prices a forward by reading its pieces (embedding, each layer's step, the end with the
logits) off a grid of measured shapes. ``GridProbe`` builds one piece per grid point through the executor's own
preparation (``Bench.prepare``: ``SWAReplay.prepare`` at a synthetic (new, context, policy)) and measures it exactly
as ``SegmentProbe`` measures a workload's pieces (host seconds with the device kept busy by a spin kernel, device
seconds between events with the host ahead), in the same timed rounds as the forwards (every ``every``-th round: the
grid is large and its medians settle in fewer samples), so the grid sees the forwards' clock and host state.

Grid (``GRID_*``): rows off every workload's shapes (the bench asserts that no grid point has a workload piece's
exact features: the grid's figure is then a prediction, ``costmodels.replay_grid.assert_held_out``):

- ``embed`` / ``end`` / ``sliding`` (prior 0) / ``full`` (context 0): a plain prefill of R rows (``GRID_ROWS``);
- ``sliding`` at prior = window: persist at context ``PRIOR_CTX``, R in ``GRID_ROWS_CTX``;
- ``full`` at context C: persist at (R, C); ``fullsel`` at C: full recompute at (R, C) (the full layer runs the R new
  rows of the R + C it is handed), R in ``GRID_ROWS_CTX``, C in ``GRID_CTX``, R + C <= ``MAX_TOKENS``.
"""

from __future__ import annotations

import torch

from benchmarks.gpu.replay_segments import SegmentProbe, piece_key
from costmodels import replay_grid
from costmodels.replay import LayerReplay, ReplayPolicy
from executor.swa import ROW_TILE
from executor.swa_replay import SWAReplay

# rows by tile class of executor.swa.ROW_TILE (2048): 1 tile, 2 tiles, 3 and more (costmodels.replay_grid reads a
# layer piece off points with as many tiles); none is a workload's (512 + W, 2048 + W, multiples of 2048, 4608, 10240)
GRID_ROWS = (384, 1024, 1664, 2040, 2056, 2240, 2560, 3072, 4000, 4160, 7168, 11264, 18432)
GRID_ROWS_CTX = (384, 1024, 1664, 2040, 2056, 2240, 2560, 3072)
GRID_CTX = (1536, 5120, 10240, 15360)
PRIOR_CTX = 1536
MAX_TOKENS = 18432
TINY = {"rows": (3, 7, 13), "rows_ctx": (3, 7), "ctx": (10, 21), "prior_ctx": 10, "max": 32}


def grid_steps(tiny: bool = False) -> list[tuple[str, int, int, tuple[str, ...]]]:
    """(policy, new, context, the kinds of piece taken from it) of every synthetic step the grid's pieces come from
    (only those kinds: a recompute at (R, C) also runs R + C-row embeddings and sliding layers, shapes that may be
    a workload's)."""
    rows, rows_ctx, ctxs, prior_ctx, cap = ((TINY["rows"], TINY["rows_ctx"], TINY["ctx"], TINY["prior_ctx"], TINY["max"])
                                            if tiny else (GRID_ROWS, GRID_ROWS_CTX, GRID_CTX, PRIOR_CTX, MAX_TOKENS))
    out = [("persist", r, 0, ("embed", "end", "sliding", "full")) for r in rows]
    out += [("persist", r, prior_ctx, ("sliding",)) for r in rows_ctx]
    for c in ctxs:
        out += [(pol, r, c, (kind,)) for r in rows_ctx if r + c <= cap
                for pol, kind in (("persist", "full"), ("recompute", "fullsel"))]
    return out


def max_tokens(tiny: bool = False) -> int:
    return TINY["max"] if tiny else MAX_TOKENS


class GridProbe(SegmentProbe):
    """One piece per grid point (module docstring), keyed by its features ``kind|rows|ctx``."""

    row_tile = ROW_TILE

    def __init__(self, bench, tiny: bool = False, every: int = 3):
        self.cuda = bench.device.type == "cuda"
        self.model, self.kv, self.forwards = bench.model, bench.kv, {}
        self.timelines, self.fns, self.plan, self.traces, self.error = {}, {}, {}, {}, None
        self.every, self.calls = max(1, int(every)), 0
        self.rounds_at: list[int] = []   # the timed round (0-based) after which each grid sample was taken
        self.chains: list[list] = []
        sliding = [k == "sliding" for k in bench.spec.kinds()]
        pols = {"persist": SWAReplay(bench.spec, ReplayPolicy()),
                "recompute": SWAReplay(bench.spec, ReplayPolicy(default=LayerReplay(mode="recompute")))}
        hidden = self.model.model.embed_tokens.weight.shape[1]
        dt = self.model.model.embed_tokens.weight.dtype
        g = torch.Generator(device=bench.device).manual_seed(1)
        xs: dict[int, torch.Tensor] = {}
        m, kv = self.model, self.kv
        for pol, n, c, kinds in grid_steps(tiny):
            prep = bench.prepare(pols[pol], n, c)
            r0 = int(prep.batch.input_ids.shape[0])
            if r0 not in xs:
                xs[r0] = torch.randn(r0, hidden, generator=g, device=bench.device).to(dt)
            x = xs[r0]
            pieces = [(piece_key("embed", prep), lambda p=prep: SWAReplay.embed(m, p)),
                      (piece_key("end", prep), lambda p=prep, x=x: m.compute_logits(SWAReplay.finish(m, p, x)[-1:]))]
            pieces += [(piece_key("layer", prep, j), lambda p=prep, j=j, x=x: SWAReplay.layer_step(m, p, kv, j, x))
                       for j in range(len(prep.views))]
            chain = []
            for key, fn in pieces:
                f = replay_grid.features(key, sliding)
                if f[0] in kinds:
                    k = "|".join(str(v) for v in f)
                    self.fns.setdefault(k, fn)
                    chain.append((k, fn))
                else:
                    chain.append((None, fn))
            # back to back: the step's pieces in the forward's order (embedding, layers, end), from the neighbour
            # before its first kept piece to its last kept one (the neighbours issued, not recorded)
            kept = [i for i, (k, _) in enumerate(chain) if k is not None]
            if kept:
                order = [chain[0]] + chain[2:] + [chain[1]]   # pieces were listed embed, end, layers...
                kept = [i for i, (k, _) in enumerate(order) if k is not None]
                self.chains.append(order[max(0, kept[0] - 1): kept[-1] + 1])
        self.samples = {k: [] for k in self.fns}
        self.b2b = {k: [] for k in self.fns}
        self.spin_rate = self._spin_rate() if self.cuda else 0.0
        if self.cuda:   # first calls at new shapes (library heuristics, kernel selection) outside the timed rounds
            with torch.inference_mode():
                for fn in self.fns.values():
                    fn()
            torch.cuda.synchronize()

    def keys(self) -> set[tuple[str, int, int]]:
        return {_feat(k) for k in self.fns}

    def sample(self) -> None:
        """Every ``every``-th call (the first included): one sample of every grid piece."""
        self.calls += 1
        if (self.calls - 1) % self.every == 0:
            self.rounds_at.append(self.calls - 1)
            super().sample()

    def points(self) -> list[dict]:
        """``replay_grid.json``'s points: features, median host and device seconds, quartiles, samples, trace; and
        every grid sample (``rounds``: [host, device] per sample, the timed round of each in the grid's ``rounds_at``;
        ``b2b_rounds``: per sample the back-to-back [host, device] of each time the piece was issued), with the
        back-to-back medians ``host_b2b_s`` / ``device_b2b_s`` where measured."""
        out = []
        res = self.result()
        for key, s in res["segments"].items():
            kind, rows, ctx = _feat(key)
            pt = {"kind": kind, "rows": rows, "ctx": ctx, **{k: s[k] for k in (
                "host_s", "device_s", "host_quartiles_s", "device_quartiles_s", "covered", "samples", "clock_mhz",
                "kernels", "trace")}}
            pt["rounds"] = [[x[0], x[1]] for x in res["rounds"].get(key, [])]
            if "host_b2b_s" in s:
                pt.update({k: s[k] for k in ("host_b2b_s", "device_b2b_s")})
                pt["b2b_rounds"] = res["b2b_rounds"].get(key, [])
            out.append(pt)
        return out


def _feat(key: str) -> tuple[str, int, int]:
    kind, rows, ctx = key.split("|")
    return kind, int(rows), int(ctx)
