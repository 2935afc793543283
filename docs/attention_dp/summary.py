"""One line per `twinfer simulate --json` result on stdin: the figures docs/attention_dp.md compares."""

import json
import sys

d = json.load(sys.stdin)
m, st = d["metrics"], d["metrics"]["steady"]
print(f"{d['name']:24s} | {m['output_throughput_per_gpu']:5.0f} | {st['output_throughput_per_gpu']:5.0f} | "
      f"{m['ttft_s']['p50']:6.2f} | {m['ttft_s']['p90']:6.2f} | {m['tpot_s']['p50'] * 1e3:4.0f} | {m['tpot_s']['p90'] * 1e3:4.0f} | "
      f"{m['goodput_fraction']:4.2f} | {d['digest'][:8]}")
