#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: the power cap as a step-time mechanism (benchmarks/gpu/power_probe.py):
# step shapes of the 5-layer DeepSeek-V3 FP8 engine run back to back for a few seconds each, device time per step
# against the SM clock and board power over the same seconds. Triton dense GEMMs (no DeepGEMM JIT on a fresh machine).
# Output: $OUT/power_probe.json, $OUT/power_probe.json.smi.csv, $OUT/log.txt, $OUT/env.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_power.sh        (~3 minutes with the install)
source scripts/device_env.sh
env_txt_triton
stage "power probe (benchmarks/gpu/power_probe.py)"
timeout ${T_POWER:-300} python3 -m benchmarks.gpu.power_probe --out "$OUT/power_probe.json" --seconds ${SECONDS_PER_SHAPE:-4} \
  || echo "power probe: exit $?"
stage done
