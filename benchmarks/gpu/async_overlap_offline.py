"""Re-predict an async overlap bench (``benchmarks/gpu/async_overlap.py``'s JSON) with the simulator at HEAD on a
calibration profile: the same chat requests at the bench's three rates, overlap off and on, next to the measured
throughputs and gains and the bench's own host-rule prediction. No GPU.

    python3 benchmarks/gpu/async_overlap_offline.py benchmarks/gpu/issue23_h200/run_async_301c879/async_overlap.json \\
        benchmarks/gpu/issue16_h200/run21_reasoning_chat_longctx_4970618/calibration_deepseek-v3-5layers_fp8.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", help="async_overlap.json of a device run")
    ap.add_argument("profile", help="calibration profile JSON (the engine the bench ran, ideally)")
    a = ap.parse_args(argv)
    import async_overlap as ao

    from scheduler.config import SchedulerConfig
    from sim.validate import natural_rate

    d = json.loads(Path(a.bench).read_text())
    b = ao.parse(["--out", "/dev/null", "--requests", str(d["requests"]), "--max-num-seqs", str(d["max_num_seqs"])])
    bs = 64
    blocks = b.max_num_seqs * (-(-b.max_model_len // bs)) + 64
    base = SchedulerConfig(max_num_seqs=b.max_num_seqs, max_num_batched_tokens=max(8192, b.max_num_seqs),
                           max_model_len=b.max_model_len, block_size=bs)
    reqs, _ = ao.workload(b, 129280, bs)
    r0 = natural_rate(reqs)
    rows = []
    for lv in d["levels"]:
        scale = r0 / (lv["fraction_of_capacity"] * d["capacity_rps"])
        p = ao.predicted_by_simulator(a.profile, base, blocks, reqs, scale)
        m = lv["measured"]["tok_s_gain"]
        # several rounds (--rounds): the median tok/s of each loop; one round: its replays
        off = float(np.median(lv["measured"].get("tok_s_off") or [lv["off"]["output_tok_s"]]))
        on = float(np.median(lv["measured"].get("tok_s_on") or [lv["on"]["output_tok_s"]]))
        rows.append({"level": lv["level"], "measured": m, "simulator": p["tok_s_gain"], "sim_off": p["off"], "sim_on": p["on"],
                     "measured_off": off, "measured_on": on, "ci95": lv["measured"].get("ci95")})
        print(f"{lv['level']:16} measured tok/s off {off:7.1f} on {on:7.1f} "
              f"gain {m * 100:+5.1f}% | simulator off {p['off']:7.1f} on {p['on']:7.1f} gain {p['tok_s_gain'] * 100:+5.1f}% "
              f"| bench host rule {lv['predicted_host_rule']['tok_s_gain'] * 100:+5.1f}%")
    return rows


if __name__ == "__main__":
    main()
