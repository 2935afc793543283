#!/usr/bin/env bash
# One device call (nvidia-h200): sliding-window resume policies measured on the executor next to the cost
# model's prediction (issue 23, benchmarks/gpu/replay_bench.py): prefix hits and long chunked prompts under
# full recompute, bounded replay W (REPLAY_WS, default 32,128,384) and persist. Output: $OUT/replay_bench.json,
# $OUT/log.txt, $OUT/env.txt. Run from the repo root with `.whl` carried:  bash scripts/device_replay.sh
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/env.txt"
stage "replay bench"
timeout ${T_REPLAY:-200} python3 -m benchmarks.gpu.replay_bench --out "$OUT/replay_bench.json" --ws ${REPLAY_WS:-32,128,384}
stage done
