#!/usr/bin/env bash
# One device call (nvidia-h200), issue 16: decode steps' runner host phases measured three ways (one plan back to back
# as the calibration grid does, every batch's plan in turn, and the engine loop's steady decode steps), rounds
# interleaved so that a drift of the host's speed shows between rounds, not between ways
# (benchmarks/gpu/decode_grid_modes.py). Output: $OUT/decode_grid_modes.json, $OUT/env.txt, $OUT/log.txt.
# Run from the repo root with `.whl` carried:  bash scripts/device_decode_modes.sh     (<= 4 minutes with the install)
source scripts/device_env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  date -u +%Y-%m-%dT%H:%M:%SZ; } | tee "$OUT/env.txt"
export TWINFER_KERNEL_FP8_GEMM=${TWINFER_KERNEL_FP8_GEMM:-triton}   # the matrix runs' engine
echo "TWINFER_KERNEL_FP8_GEMM=$TWINFER_KERNEL_FP8_GEMM" | tee -a "$OUT/env.txt"
stage "decode host phases three ways (benchmarks/gpu/decode_grid_modes.py)"
timeout ${T_BENCH:-300} python3 -m benchmarks.gpu.decode_grid_modes --out "$OUT/decode_grid_modes.json" \
  --batches ${BATCHES:-1,4,16,64} --rounds ${ROUNDS:-4} || echo "decode grid modes: exit $? (finished rounds are in the json)"
stage done
