#!/usr/bin/env bash
# One device call (nvidia-h200): async overlap on the executor (issue 23). DeepSeek-V3 cut to its first
# 5 layers, FP8, dummy weights (the twin's H200 model, scripts/device_twin.sh); a chat workload at low load,
# the knee and past saturation with SchedulerConfig.async_overlap off and on; measured tok/s and step-time
# gains next to the gain costmodels/host.py predicts for the same steps, and the simulator's own prediction
# on the committed H200 calibration profile (same requests, overlap off/on). JSON in $OUT/async_overlap.json.
# Run from the repo root, with `.whl` carried:  bash scripts/device_async.sh
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # DeepGEMM JITs per shape (3-8 s each); the runs use Triton

PROFILE=${PROFILE:-profiles/h200/calibration_deepseek-v3-5layers_fp8.json}   # the twin's committed H200 calibration

stage "async overlap: off vs on at three loads (benchmarks/gpu/async_overlap.py)"
timeout ${T_ASYNC:-280} python3 benchmarks/gpu/async_overlap.py --out "$OUT" --model deepseek-v3 --num-layers 5 --dtype fp8 \
  --requests ${REQS:-96} --max-input-len ${MAXIN:-512} --max-output-len ${MAXOUT:-64} --profile "$PROFILE" ${ASYNC_ARGS:-}
stage done
ls -la "$OUT"
