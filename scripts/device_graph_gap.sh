#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: CUDA-graph decode steps timed with the GPU idle (as the calibration grid
# times them) and held busy by a spin kernel (as a pipelined loop runs them), batches alternated per repeat
# (benchmarks/gpu/graph_launch_gap.py). Output: $OUT/graph_launch_gap.json, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_graph_gap.sh     (about 2 minutes with the install)
source scripts/device_env.sh
env_txt_triton
stage "graph decode steps, GPU idle vs held (benchmarks/gpu/graph_launch_gap.py)"
timeout ${T_BENCH:-200} python3 -m benchmarks.gpu.graph_launch_gap --out "$OUT/graph_launch_gap.json" \
  --batches ${BATCHES:-1,4,8,16,24,32,64} --repeats ${REPEATS:-30} || echo "graph launch gap: exit $? (finished batches are in the json)"
stage done
