#!/usr/bin/env bash
# One device call (nvidia-h200): sliding-window resume policies measured on the executor next to the cost
# model's prediction (issue 23). First the op tables of the bench model's executor kernels, measured apart from any
# replay run (benchmarks/gpu/replay_tables.py: bf16 Linear, window/causal prefill attention, row-wise ops, eager host
# and launch costs), then the replay runs (benchmarks/gpu/replay_bench.py): prefix hits and long chunked prompts
# under full recompute, bounded replay W (REPLAY_WS, default 32,64,128,256,384) and persist, each next to the analytic and
# the table-based prediction. Output: $OUT/replay_tables.json, $OUT/replay_bench.json (both rewritten as sections
# finish), $OUT/log.txt, $OUT/env.txt. Run from the repo root with `.whl` carried:  bash scripts/device_replay.sh
# Wall: tables <= T_TABLES (180 s; each GEMM/attention/row section past 45 s measures only the workloads' shapes),
# bench <= T_REPLAY (150 s): within 6 minutes with the install.
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/env.txt"
WS=${REPLAY_WS:-32,64,128,256,384}
stage "replay tables"
timeout ${T_TABLES:-180} python3 -m benchmarks.gpu.replay_tables --out "$OUT/replay_tables.json" --ws "$WS" \
  || echo "replay tables: exit $? (what finished is in replay_tables.json)"
stage "replay bench"
if [ -f "$OUT/replay_tables.json" ]; then TABLES=(--tables "$OUT/replay_tables.json"); else TABLES=(--no-tables); fi
timeout ${T_REPLAY:-150} python3 -m benchmarks.gpu.replay_bench --out "$OUT/replay_bench.json" --ws "$WS" "${TABLES[@]}" \
  || echo "replay bench: exit $?"
stage done
