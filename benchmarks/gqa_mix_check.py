"""FlashAttention-3 varlen calls over a step's mix of sequences, as measured, beside what the cost model prices.

The ``gqa_mix`` stage of ``benchmarks/gpu/op_tables.py`` times one FA3 varlen call (vLLM's FA backend's call) over
several prefill chunks, decodes beside chunks, and decodes at mixed contexts, at 8 query / 1 KV heads of 128
(Llama-3.1-70B at TP8) and 32 / 8 (Llama-3.1-8B unsharded). No cost-model table reads these rows: the cost model
prices each mix from the one-sequence tables (``gqa_attention_bf16.csv``) by its composition rule (chunks' roofline
parts add, the time over the roofline is paid once, a mixed step's decodes share the call:
``StepOps.gqa_chunks_seconds``, ``gqa_decode_over``). Prints per mix the measured time a layer, the price, the error,
and the price of the parts as separate kernels.

    python -m benchmarks.gqa_mix_check [RUN_DIR] [--gpu H200] [--json]

``gqa_order`` rows (runs ``issue16_h200/gqa_order_75f371c`` on an H200, ``issue16_h100/gqa_order_24c871d`` on an H100)
are the multi-sequence mixes with their sequences in reverse order, timed in the same run as the forward ones: FA3
hands tiles out in batch order, so the call is fastest with its longest key walk first (up to 36% faster) and slowest
with it last (up to 47% slower); the cost model prices each call in its order (``StepOps.gqa_chain_floor``'s
``work``). ``gqa_walk`` rows (run ``issue16_h100/gqa_walk_d62ff6a``): one decode over 20,000 keys behind and in front
of K prompts.

Two committed sets: ``gqa_mix`` (run gqa_mix_d535dec, 42 mixes) and ``gqa_mix2`` (run gqa_multi_fbc8572, 39 mixes
measured after the first set informed the rule, at 16 / 2 heads too, a layout no table holds).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from costmodels.batch import BatchShape
from costmodels.catalog import get_model
from costmodels.hardware import get_hardware
from costmodels.layout import ParallelLayout
from costmodels.op_table import gqa_layout, gqa_seqs
from costmodels.step import StepCostModel

RUN = Path(__file__).resolve().parent / "gpu" / "issue16_h100" / "gqa_mix_d535dec"
# the second set of mixes (gqa_mix2), measured later, with a head layout no table holds (16 / 2)
RUN2 = Path(__file__).resolve().parent / "gpu" / "issue16_h100" / "gqa_multi_fbc8572"
# the model and TP whose layers have each measured head layout a GPU, and its layer count
MODELS = {(8, 1): ("llama-3.1-70b", 8, 80), (32, 8): ("llama-3.1-8b", 1, 32), (16, 2): ("llama-3.1-70b", 4, 80)}


def parse_seqs(text: str) -> list[tuple[int, int]]:
    """``new+cached x count`` terms joined by ``;`` -> one (new, cached) per sequence."""
    return [(n, c) for n, c, cnt in gqa_seqs(text) for _ in range(cnt)]


def price_us(sm: StepCostModel, layers: int, seqs: list[tuple[int, int]]) -> float:
    """Microseconds of one layer's attention over ``seqs`` (one-token sequences as decodes) in one step."""
    b = BatchShape.from_lists([n for n, _ in seqs], [c for _, c in seqs], [n == 1 for n, _ in seqs])
    return sm.step(b).breakdown["attention"] / layers * 1e6


def check(run: Path = RUN, gpu: str = "H100", op: str = "gqa_mix") -> list[dict]:
    hw = get_hardware(gpu)
    cms = {k: (StepCostModel(get_model(m), hw, ParallelLayout(tp=tp)), n) for k, (m, tp, n) in MODELS.items()}
    out = []
    with open(run / "op_tables.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["op"] != op or not r["device_us"]:
                continue
            q, kv, _ = gqa_layout(r["name"])
            sm, layers = cms[(q, kv)]
            seqs = parse_seqs(r["seqs"])
            meas = float(r["device_us"])
            t = price_us(sm, layers, seqs)
            # the parts as separate kernels: each chunk alone, the decodes of one context together
            groups: dict[tuple[int, int], int] = {}
            for s in seqs:
                groups[s] = groups.get(s, 0) + 1
            apart = sum(price_us(sm, layers, [s] * (cnt if s[0] == 1 else 1)) * (1 if s[0] == 1 else cnt)
                        for s, cnt in groups.items())
            out.append({"layout": f"{q}/{kv}", "seqs": r["seqs"], "measured_us": meas, "priced_us": t,
                        "err": t / meas - 1.0, "apart_us": apart})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=None, help="a run folder (default: both committed sets)")
    ap.add_argument("--gpu", default="H100", help="the GPU the run measured on (its tables are the H100's: another GPU "
                    "prices the mixes from them moved there)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.run:
        rows = [dict(r, set=op) for op in ("gqa_mix", "gqa_mix2", "gqa_order", "gqa_walk")
                for r in check(Path(args.run), args.gpu, op)]
    else:
        rows = [dict(r, set="gqa_mix") for r in check()] + [dict(r, set="gqa_mix2") for r in check(RUN2, op="gqa_mix2")]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'layout':6} {'mix (new+cached x count)':42} {'measured':>9} {'priced':>9} {'error':>7} {'apart':>9}  (us a layer)")
    for r in rows:
        print(f"{r['layout']:6} {r['seqs']:42} {r['measured_us']:9.1f} {r['priced_us']:9.1f} {r['err']:+7.1%} "
              f"{r['apart_us']:9.1f}")
    for name in dict.fromkeys(r.get("set", "") for r in rows):
        sel = [r for r in rows if r.get("set", "") == name]
        errs = [abs(r["err"]) for r in sel]
        print(f"{name or 'run'}: {len(sel)} mixes: mean abs error {sum(errs) / len(errs):.1%}, worst "
              f"{min(r['err'] for r in sel):+.1%} / {max(r['err'] for r in sel):+.1%}")


if __name__ == "__main__":
    main()
