#!/usr/bin/env bash
# One device call (nvidia-h200): sliding-window resume policies measured on the executor next to the cost
# model's prediction (issue 23). First the op tables of the bench model's executor kernels, measured apart from any
# replay run (benchmarks/gpu/replay_tables.py: bf16 Linear, window/causal prefill attention, row-wise ops, eager host
# costs of units and of whole layer calls over rows, launch gaps of x + y and of whole decoder layers), then the
# replay runs (benchmarks/gpu/replay_bench.py): prefix hits and long chunked prompts under full recompute, bounded
# replay W (REPLAY_WS, default 32,64,128,256,384) and persist, timed interleaved (eager, eager with inputs, CUDA graph,
# rounds rotated) with a host probe and every piece of the forwards (embedding, each layer step at its exact shape,
# the end with the logits: host issue and device seconds, kernel placement once under the profiler) measured in the
# same rounds, each next to the analytic, the table-based and the pieces' prediction (``segments``, the headline:
# costmodels/replay_segments.py), and the same kinds of piece measured on a grid of shapes that holds out every
# workload shape, in the same rounds (every 4th / 3rd), read off the grid by interpolation (``grid``: the prediction at
# unmeasured shapes, costmodels/replay_grid.py; the grid is written to replay_grid.json, which costmodels reads).
# The GPU's clocks and power and the CPU's clock are sampled in the background (the host's speed drifted between
# and within the earlier runs: gpu_clocks.csv, cpu_mhz.txt).
# Output (6 files): $OUT/replay_tables.json, $OUT/replay_bench.json (both rewritten as sections finish),
# $OUT/replay_grid.json (the grid per workload and pooled, with provenance), $OUT/log.txt,
# $OUT/rescore.txt, $OUT/samplers.tgz (env.txt, gpu_clocks.csv, cpu_mhz.txt). Run from the repo root with `.whl`
# carried:
#   bash scripts/device_replay.sh
# Wall: tables <= T_TABLES (65 s; each GEMM/attention/row section past 45 s measures only the workloads' shapes; the
# last run took 48 s), bench <= T_REPLAY (215 s; 139 s at 4e31ccf, the grid adds an estimated 30-40 s; rounds stop
# 40 s before the limit), re-score <= 30 s: about 5 minutes with a 60 s install (limits: 6 1/4).
#
# Choosing workloads and rounds (env; since 2026-12-03, every round's samples of each forward, piece and grid point are
# kept, and every piece is also timed back to back in its forward's order):
#   REPLAY_WORKLOADS  all (default) | prefix (the two prefix hits) | chunked | shapes, e.g. 4096+512,16384/2048
#   REPLAY_REPS / REPLAY_CHUNKED_REPS  timed rounds (the bench's --budget-s stops them 40 s before T_REPLAY, the time
#                     left shared evenly by the workloads left)
#   REPLAY_GRID_EVERY grid sample every N rounds (prefix hits N + 1); REPLAY_LEAN=1 eager forwards only (no +inputs,
#                     no CUDA graphs); REPLAY_B2B=0 no back-to-back samples
#   T_TABLES=0        skip the op tables: load REPLAY_TABLES (default run_d1473e5's, same model, H200) instead
# REPLAY_WORKLOADS=prefix presets REPS 400 (the deadline cuts them: about 90-130 rounds each), LEAN 1, T_TABLES 0,
# T_REPLAY 240, grid every 3 (4 on the prefix hits) unless set:
#   REPLAY_WORKLOADS=prefix bash scripts/device_replay.sh
# Wall of that call: install 60 s + bench <= 240 s + re-score <= 30 s: about 5 1/2 minutes (limit 600 s).
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  lscpu 2>/dev/null | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|CPU max MHz|CPU min MHz)" || true
  cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo "governor: n/a"
  echo "affinity: $(taskset -pc $$ 2>/dev/null)"
  date -u +%Y-%m-%dT%H:%M:%SZ; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/env.txt"
# background samplers (their own PIDs, stopped at the end): GPU clocks/power/throttle reasons, every core's MHz
REASONS=clocks_event_reasons.active   # the older name where the driver lacks the newer one
nvidia-smi --query-gpu=$REASONS --format=csv >/dev/null 2>&1 || REASONS=clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,temperature.gpu,$REASONS \
  --format=csv -lms 200 > "$OUT/gpu_clocks.csv" 2>&1 &
SMI_PID=$!
( while true; do echo "$(date +%s.%N | cut -c1-14) $(awk '/cpu MHz/ {printf "%d ", $4}' /proc/cpuinfo)"; sleep 0.25; done ) \
  > "$OUT/cpu_mhz.txt" 2>/dev/null &
MHZ_PID=$!
WS=${REPLAY_WS:-32,64,128,256,384}
WORKLOADS=${REPLAY_WORKLOADS:-all}
if [ "$WORKLOADS" = prefix ]; then   # the prefix hits only, with more rounds (header)
  : "${REPLAY_REPS:=400}" "${REPLAY_LEAN:=1}" "${T_TABLES:=0}" "${T_REPLAY:=240}"
fi
T_TABLES=${T_TABLES:-65}; T_REPLAY=${T_REPLAY:-215}
EXTRA=(--workloads "$WORKLOADS" --grid-every "${REPLAY_GRID_EVERY:-3}")
[ -n "${REPLAY_REPS:-}" ] && EXTRA+=(--reps "$REPLAY_REPS")
[ -n "${REPLAY_CHUNKED_REPS:-}" ] && EXTRA+=(--chunked-reps "$REPLAY_CHUNKED_REPS")
[ "${REPLAY_LEAN:-0}" = 1 ] && EXTRA+=(--lean)
[ "${REPLAY_B2B:-1}" = 0 ] && EXTRA+=(--no-b2b)
echo "replay: workloads $WORKLOADS, T_TABLES $T_TABLES, T_REPLAY $T_REPLAY, bench args ${EXTRA[*]}"
TABLES_FILE="$OUT/replay_tables.json"
if [ "$T_TABLES" = 0 ]; then
  TABLES_FILE=${REPLAY_TABLES:-benchmarks/gpu/issue23_h200/run_d1473e5/replay_tables.json}
  echo "replay tables: skipped (T_TABLES=0), loading $TABLES_FILE"
else
  stage "replay tables"
  timeout "$T_TABLES" python3 -m benchmarks.gpu.replay_tables --out "$OUT/replay_tables.json" --ws "$WS" \
    || echo "replay tables: exit $? (what finished is in replay_tables.json)"
fi
stage "replay bench"
if [ -f "$TABLES_FILE" ]; then TABLES=(--tables "$TABLES_FILE"); else TABLES=(--no-tables); fi
timeout "$T_REPLAY" python3 -m benchmarks.gpu.replay_bench --out "$OUT/replay_bench.json" --ws "$WS" "${TABLES[@]}" \
  "${EXTRA[@]}" --budget-s $(( T_REPLAY - 5 )) \
  || echo "replay bench: exit $?"
kill "$SMI_PID" "$MHZ_PID" 2>/dev/null
stage "rescore"
if [ -f "$TABLES_FILE" ] && [ -f "$OUT/replay_bench.json" ]; then
  timeout 30 python3 -m benchmarks.gpu.replay_rescore "$OUT/replay_bench.json" --tables "$TABLES_FILE" \
    | tee "$OUT/rescore.txt" || echo "rescore: exit $?"
fi
# at most 6 files back: the samplers' outputs and the environment in one archive
tar czf "$OUT/samplers.tgz" -C "$OUT" env.txt gpu_clocks.csv cpu_mhz.txt && rm -f "$OUT/env.txt" "$OUT/gpu_clocks.csv" "$OUT/cpu_mhz.txt"
stage done
