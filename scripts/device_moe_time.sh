#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: one MoE layer's routed experts on the calibration's engine (5-layer
# DeepSeek-V3 FP8, dummy weights, Triton FP8 GEMMs as the matrix runs), eager wall vs device time inside a CUDA graph,
# by token count (benchmarks/gpu/moe_device_time.py, which runs executor.calibrate.bench_ops as a calibration does);
# first the GPU test of the graph timer. Output: $OUT/moe_device_time.json, $OUT/log.txt, $OUT/env.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_moe_time.sh   (~2 minutes)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}
stage "gpu test: the calibration's CUDA-graph device timer"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py -k graph_device_time 2>&1 | tail -5
stage "MoE layer: eager vs device time (benchmarks/gpu/moe_device_time.py)"
timeout ${T_BENCH:-200} python3 -m benchmarks.gpu.moe_device_time "$OUT/moe_device_time.json" || echo "moe bench: exit $?"
stage done
