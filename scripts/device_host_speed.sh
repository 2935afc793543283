#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: how fast the host runs the engine's host work on each CPU and over time,
# with the GPU idle and held busy (benchmarks/gpu/host_speed_probe.py). Output: $OUT/host_speed.json, env.txt, log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_host_speed.sh     (about 2 minutes with the install)
source scripts/device_env.sh
env_txt_triton
stage "host speed per CPU and over time (benchmarks/gpu/host_speed_probe.py)"
timeout ${T_BENCH:-150} python3 -m benchmarks.gpu.host_speed_probe --out "$OUT/host_speed.json" --rounds ${ROUNDS:-8} \
  --repeats ${REPEATS:-60} --busy-s ${BUSY_S:-60} || echo "host speed probe: exit $?"
stage done
