"""Sliding-window resume policies on the executor, measured, next to the cost model's prediction (issue 23).

A GQA model of a few full-width layers (Llama-8B shapes, bf16, dummy weights; three sliding layers with
V4's 128-token window under one full-attention layer) runs prefill chunks that resume after ``c`` cached
tokens through ``executor.swa_replay.SWAReplay`` — the executor's forward for resumed chunks — under
each policy: full recompute (the baseline), bounded replay of W tokens for several W, persist.

Workloads:
- ``prefix_hit``: a request hits a cached prefix of ``c`` tokens and prefills ``n`` new ones (one chunk
  per step, as a prefix-hit-heavy workload resumes request after request);
- ``chunked``: a long prompt prefilled in chunks; every chunk after the first resumes.

Per policy: measured device seconds (CUDA events around the forward and the last row's logits, inputs prepared
beforehand by ``SWAReplay.prepare``: the host's share is the host model's, costmodels/host.py; median of
``--reps``; ``measured_with_inputs_s`` times the host preparation too), predicted seconds (``costmodels.replay.chunk_cost`` / ``prefill_seconds`` on the same model
spec, H200, TP1 bf16), and the prefill throughput change against full recompute, measured and predicted
(``tput / tput_recompute - 1``), with their difference in percentage points. Also: whether the policy
gives the logits of a full recompute (``exact_for_new_tokens``) and the largest logit difference to the
persist run of the same step (bf16), and the window pages each policy keeps per resumed sequence.

Usage: python -m benchmarks.gpu.replay_bench [--out FILE] [--cpu --tiny] [--ws 32,128,384]
(JSON to ``--out``, default ``$OUT/replay_bench.json``). ``--cpu --tiny``: a toy model on the CPU, the
smoke mode the CPU test runs (its times are CPU wall times: nothing to compare with the H200 figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.model_spec import ModelSpec
from costmodels.replay import LayerReplay, ReplayPolicy, chunk_cost, prefill_seconds, prompt_chunks
from costmodels.step import StepCostModel
from executor.forward_batch import SeqInput
from executor.kv_cache import KVCache
from executor.model_config import ExecModelConfig
from executor.swa_replay import SWAReplay, exact_for_new_tokens, kept_blocks
from executor.weights import build_model
from kernels import ops

WINDOW = 128   # DeepSeek-V4's sliding window (config.json sliding_window)


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


class Timer:
    """Device seconds of a callable: CUDA events on a GPU, wall time on the CPU."""

    def __init__(self, device: torch.device, warm: int, reps: int):
        self.cuda, self.warm, self.reps = device.type == "cuda", warm, reps

    def __call__(self, fn) -> float:
        for _ in range(self.warm):
            fn()
        times = []
        for _ in range(self.reps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


class Bench:
    def __init__(self, spec: ModelSpec, device: torch.device, dtype: str, page: int, max_tokens: int, timer: Timer):
        self.spec, self.device, self.page, self.timer = spec, device, page, timer
        self.cfg = ExecModelConfig.build(spec)
        self.model = build_model(self.cfg, device, dtype, "dummy", seed=0, max_pos=max_tokens + 8)
        pages = -(-max_tokens // page)
        self.kv = KVCache(self.cfg, pages, page, device, self.model.model.embed_tokens.weight.dtype)
        self.table = list(range(pages))
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, spec.vocab_size, (max_tokens,), generator=g).tolist()
        lay = ParallelLayout(tp=1, weight_dtype="bf16", kv_dtype="bf16")
        self.ops = StepCostModel(spec, get_hardware("h200"), lay)

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

    @torch.inference_mode()
    def prefix_hit(self, pols, c: int, n: int) -> dict:
        self.fill(c + n)
        rows, ref = [], None
        for name, pol in pols:
            swa = SWAReplay(self.spec, pol)
            prep = self.prepare(swa, n, c)
            t = self.timer(lambda: self.chunk(swa, n, c, prep))
            t_in = self.timer(lambda: self.chunk(swa, n, c))
            logits = self.chunk(swa, n, c)
            ref = logits if name == "persist" else ref
            lay = swa.layout(c)
            rows.append({"policy": name, "measured_s": t, "measured_with_inputs_s": t_in,
                         "predicted_s": chunk_cost(self.ops, swa.resolved, n, c).seconds,
                         "exact": exact_for_new_tokens(lay, swa.window, c), "kept_window_pages": _window_pages(lay, c, self.page),
                         "layer_rows": [n + int(e) for e in swa.resolved.extra_tokens(c)], "_logits": logits})
        for r in rows:
            r["logit_max_abs_diff_vs_persist"] = float((r.pop("_logits") - ref).abs().max())
        return {"context": c, "new_tokens": n, "rows": _changes(rows, n)}

    @torch.inference_mode()
    def chunked(self, pols, prompt: int, chunk: int) -> dict:
        rows = []
        parts = prompt_chunks(prompt, chunk)
        for name, pol in pols:
            swa = SWAReplay(self.spec, pol)
            preps = [self.prepare(swa, n, c) for n, c in parts]
            t = self.timer(lambda: [self.chunk(swa, n, c, p) for (n, c), p in zip(parts, preps)])
            t_in = self.timer(lambda: [self.chunk(swa, n, c) for n, c in parts])
            rows.append({"policy": name, "measured_s": t, "measured_with_inputs_s": t_in,
                         "predicted_s": prefill_seconds(self.ops, swa.resolved, prompt, chunk),
                         "exact": all(exact_for_new_tokens(swa.layout(c), swa.window, c) for _, c in parts[1:]),
                         "extra_layer_tokens": int(sum(swa.resolved.extra_tokens(c).sum() for _, c in parts))})
        return {"prompt": prompt, "chunk": chunk, "chunks": len(parts), "rows": _changes(rows, prompt)}


def _window_pages(layout, c: int, page: int) -> int:
    """Window pages kept per resumed sequence, summed over the sliding layers."""
    return int(sum(b for lay, b in zip(layout, kept_blocks(layout, c, page)) if lay.sliding))


def _changes(rows: list[dict], tokens: int) -> list[dict]:
    """Throughput and its change against full recompute (the first row), measured and predicted."""
    base = rows[0]
    for r in rows:
        r["measured_tok_s"] = tokens / r["measured_s"]
        r["predicted_tok_s"] = tokens / r["predicted_s"]
        r["measured_change"] = base["measured_s"] / r["measured_s"] - 1
        r["predicted_change"] = base["predicted_s"] / r["predicted_s"] - 1
        r["diff_pp"] = 100 * (r["measured_change"] - r["predicted_change"])
        r["measured_with_inputs_change"] = base["measured_with_inputs_s"] / r["measured_with_inputs_s"] - 1
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "replay_bench.json"))
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (with --tiny: the smoke mode)")
    ap.add_argument("--tiny", action="store_true", help="a toy model and small shapes")
    ap.add_argument("--ws", default=None, help="replay lengths W, comma-separated")
    ap.add_argument("--reps", type=int, default=None)
    a = ap.parse_args(argv)
    if not a.cpu and not torch.cuda.is_available():
        print("no CUDA device: use --cpu --tiny for the smoke mode", file=sys.stderr)
        return 2
    device = torch.device("cpu" if a.cpu else "cuda")
    sh = shapes(a.tiny)
    try:
        ws = [int(x) for x in a.ws.split(",")] if a.ws else sh["ws"]
    except ValueError:
        print(f"--ws {a.ws!r}: expected comma-separated token counts", file=sys.stderr)
        return 2
    if not ws or min(ws) < 1:
        print(f"--ws {a.ws!r}: token counts must be >= 1", file=sys.stderr)
        return 2
    spec = bench_spec(a.tiny)
    reps = a.reps or (1 if a.cpu else 5)
    if a.cpu:
        torch.set_num_threads(1)   # toy shapes: threads only contend
    need = max([c + n for c, n in sh["prefix_hit"]] + [p for p, _ in sh["chunked"]])
    b = Bench(spec, device, "fp32" if a.cpu else "bf16", sh["page"], need, Timer(device, 0 if a.cpu else 2, reps))
    pols = policies(ws)
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "model": {"name": spec.name, "layers": spec.kinds(), "hidden": spec.hidden_size, "heads": spec.num_attention_heads,
                     "kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "window": spec.sliding_window},
           "predicted_on": "H200, TP1 bf16 (costmodels.replay.chunk_cost / prefill_seconds)", "reps": reps,
           "policies": [p for p, _ in pols], "prefix_hit": [], "chunked": []}
    for c, n in sh["prefix_hit"]:
        out["prefix_hit"].append(b.prefix_hit(pols, c, n))
        _write(a.out, out)
    for prompt, chunk in sh["chunked"]:
        out["chunked"].append(b.chunked(pols, prompt, chunk))
        _write(a.out, out)
    out["kernels"] = ops.reset_used()   # op -> implementation the forwards ran
    _write(a.out, out)
    _print(out)
    return 0


def _write(path: str, out: dict) -> None:
    """Written after every workload, so a timeout keeps what ran."""
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def _print(out: dict) -> None:
    for kind in ("prefix_hit", "chunked"):
        for w in out[kind]:
            head = {k: v for k, v in w.items() if k != "rows"}
            print(kind, head)
            for r in w["rows"]:
                print(f"  {r['policy']:>12}  measured {r['measured_s'] * 1e3:9.3f} ms ({r['measured_change']:+8.1%})  "
                      f"predicted {r['predicted_s'] * 1e3:9.3f} ms ({r['predicted_change']:+8.1%})  diff {r['diff_pp']:+7.1f} pp"
                      f"  exact={r['exact']}")


if __name__ == "__main__":
    sys.exit(main())
